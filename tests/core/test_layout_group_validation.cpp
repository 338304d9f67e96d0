// Validation of hybrid configs (no GPU): every rule rejects with InvalidConfigError naming its field, value and limit,
// before anything is allocated.
// The layers, configs and model check they share are tests/support/group_layouts.h.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/group_layouts.h"

namespace kvcache::rt
{
namespace
{

using namespace group_layouts;

//! Expects computeLayout, KVCacheManager::validate and the KVCacheManager constructor to reject `config` with
//! InvalidConfigError whose message holds every word of `words`. The constructor validates before it asks for a
//! device, so on a machine without a GPU any other outcome would surface as a CudaError.
void expectRejectedNaming(KVCacheConfig const& config, std::vector<std::string> const& words)
{
    EXPECT_TRUE(test::throwsNaming<InvalidConfigError>([&] { static_cast<void>(computeLayout(config)); }, words));
    EXPECT_TRUE(
        test::throwsNaming<InvalidConfigError>([&] { static_cast<void>(KVCacheManager::validate(config)); }, words));
    EXPECT_TRUE(test::throwsNaming<InvalidConfigError>([&] { KVCacheManager const manager(config, nullptr); }, words));
}

//! Two groups: full attention (layers 0 and 2: KV 4 x 32, latent 48) and window 64 (layer 1: KV 2 x 16); fp16, 2
//! slots of 1000 tokens in pages of 32, steps of 16. Group 0 needs 2 x ceil(1000 / 32) = 64 pages, group 1 2 x
//! (ceil((63 + 16) / 32) + 1) = 8.
test::ConfigBuilder twoGroupModel()
{
    return test::ConfigBuilder({kvLayer(4, 32), kvLayer(2, 16, 64), latentLayer(48)})
        .maxBatchSize(2)
        .maxSequenceLength(1000)
        .tokensPerPage(32)
        .maxTokensPerStep(16);
}

TEST(GroupValidation, TheBaseModelIsValid)
{
    KVCacheLayout const layout = expectGroupsMatchModel(twoGroupModel());
    ASSERT_EQ(layout.groups.size(), 2U);
    EXPECT_EQ(layout.groups[0].minPages, 64);
    EXPECT_EQ(layout.groups[1].minPages, 8);
}

TEST(GroupValidation, RejectsNegativeSlidingWindow)
{
    KVCacheConfig config = twoGroupModel();
    config.layerConfigs[1].slidingWindow = -5;
    expectRejectedNaming(config, {"layerConfigs[1].slidingWindow", "is -5", ">= 0"});
    config.layerConfigs[1].slidingWindow = std::numeric_limits<int32_t>::min();
    expectRejectedNaming(config, {"layerConfigs[1].slidingWindow", "is -2147483648", ">= 0"});
}

TEST(GroupValidation, RejectsKindOutsideTheEnumeration)
{
    KVCacheConfig config = twoGroupModel();
    config.layerConfigs[0].kind = static_cast<KVLayerKind>(7);
    expectRejectedNaming(config, {"layerConfigs[0].kind", "is 7", "kKV (0)", "kLATENT (1)"});
    config.layerConfigs[0].kind = static_cast<KVLayerKind>(-1);
    expectRejectedNaming(config, {"layerConfigs[0].kind", "is -1", "kKV (0)", "kLATENT (1)"});
}

TEST(GroupValidation, RejectsLatentLayerOfSeveralHeads)
{
    KVCacheConfig config = twoGroupModel();
    config.layerConfigs[2].numKVHeads = 2;
    expectRejectedNaming(config, {"layerConfigs[2].numKVHeads", "is 2", "kLATENT", "must be 1"});
    config.layerConfigs[2].numKVHeads = 8;
    expectRejectedNaming(config, {"layerConfigs[2].numKVHeads", "is 8", "must be 1"});
    // Zero heads break the older rule first, which names the same field.
    config.layerConfigs[2].numKVHeads = 0;
    expectRejectedNaming(config, {"layerConfigs[2].numKVHeads", "is 0", "> 0"});
}

TEST(GroupValidation, RejectsStepOutsideTheSequence)
{
    for (int32_t const step : {-1, -1000, 1001, std::numeric_limits<int32_t>::max()})
    {
        SCOPED_TRACE("maxTokensPerStep " + std::to_string(step));
        expectRejectedNaming(twoGroupModel().maxTokensPerStep(step).build(),
            {"maxTokensPerStep", "is " + std::to_string(step), "[0, maxSequenceLength = 1000]"});
    }
    EXPECT_EQ(computeLayout(twoGroupModel().maxTokensPerStep(1000).build()).maxTokensPerStep, 1000);
    EXPECT_EQ(computeLayout(twoGroupModel().maxTokensPerStep(0).build()).maxTokensPerStep, 1000);
}

TEST(GroupValidation, RejectsScalarPageCountWithSeveralGroups)
{
    expectRejectedNaming(
        twoGroupModel().numPages(64).build(), {"numPages", "is 64", "must be 0", "2 page groups", "numPagesPerGroup"});
    expectRejectedNaming(twoGroupModel().numPages(-3).build(), {"numPages", "is -3", "must be 0", "2 page groups"});
}

TEST(GroupValidation, RejectsPerGroupCountsOfTheWrongLength)
{
    expectRejectedNaming(
        twoGroupModel().numPagesPerGroup({64}).build(), {"numPagesPerGroup", "has 1 entries", "page group (2)"});
    expectRejectedNaming(
        twoGroupModel().numPagesPerGroup({64, 8, 8}).build(), {"numPagesPerGroup", "has 3 entries", "page group (2)"});
}

TEST(GroupValidation, RejectsPerGroupCountsWithoutLayers)
{
    // No layers, no page groups: a per-group count has nothing to size.
    KVCacheConfig config = test::ConfigBuilder({}).maxBatchSize(3).maxSequenceLength(100).tokensPerPage(16).build();
    config.numPagesPerGroup = {50};
    expectRejectedNaming(config, {"numPagesPerGroup", "1 entries", "no layers"});
}

TEST(GroupValidation, RejectsPerGroupCountBelowItsMinimum)
{
    expectRejectedNaming(
        twoGroupModel().numPagesPerGroup({64, 7}).build(), {"numPagesPerGroup[1]", "is 7", "minimum 8"});
    expectRejectedNaming(
        twoGroupModel().numPagesPerGroup({63, 8}).build(), {"numPagesPerGroup[0]", "is 63", "minimum 64"});
    expectRejectedNaming(twoGroupModel().numPagesPerGroup({1, 0}).build(), {"numPagesPerGroup[0]", "is 1", "64"});
    // Exactly the minimum, or 0 for it, is accepted.
    KVCacheLayout const exact = expectGroupsMatchModel(twoGroupModel().numPagesPerGroup({64, 8}));
    EXPECT_EQ(exact.groups[1].numPages, 8);
    KVCacheLayout const zeros = expectGroupsMatchModel(twoGroupModel().numPagesPerGroup({0, 9}));
    EXPECT_EQ(zeros.groups[0].numPages, 64);
    EXPECT_EQ(zeros.groups[1].numPages, 9);
}

TEST(GroupValidation, RejectsPerGroupCountOutsideThePageIdRange)
{
    std::string const range = "[0, " + std::to_string(kPAGE_ID_LIMIT) + "]";
    expectRejectedNaming(twoGroupModel().numPagesPerGroup({kMAX_NUM_PAGES + 1, 0}).build(),
        {"numPagesPerGroup[0]", "is 1073741824", range});
    expectRejectedNaming(twoGroupModel().numPagesPerGroup({0, std::numeric_limits<int32_t>::max()}).build(),
        {"numPagesPerGroup[1]", "is 2147483647", range});
    expectRejectedNaming(twoGroupModel().numPagesPerGroup({0, -1}).build(), {"numPagesPerGroup[1]", "is -1", range});
    expectRejectedNaming(twoGroupModel().numPagesPerGroup({-64, 8}).build(), {"numPagesPerGroup[0]", "is -64", range});
    // The largest count is accepted in every group.
    KVCacheLayout const largest = computeLayout(twoGroupModel().numPagesPerGroup({kMAX_NUM_PAGES, kMAX_NUM_PAGES}));
    EXPECT_EQ(largest.groups[0].numPages, kPAGE_ID_LIMIT);
    EXPECT_EQ(largest.groups[1].numPages, kPAGE_ID_LIMIT);
}

TEST(GroupValidation, RejectsScalarAndPerGroupCountsTogether)
{
    // One group, so numPages alone would be valid and so would numPagesPerGroup alone.
    test::ConfigBuilder const oneGroup = test::ConfigBuilder({kvLayer(4, 32)}).maxBatchSize(2).maxSequenceLength(1000);
    EXPECT_EQ(computeLayout(test::ConfigBuilder(oneGroup).numPages(20).build()).numPages, 20);
    EXPECT_EQ(computeLayout(test::ConfigBuilder(oneGroup).numPagesPerGroup({20}).build()).numPages, 20);
    expectRejectedNaming(test::ConfigBuilder(oneGroup).numPages(20).numPagesPerGroup({20}).build(),
        {"numPages", "is 20", "numPagesPerGroup", "only one"});
}

TEST(GroupValidation, RejectsWindowGroupWhoseMinimumOverflowsPageIds)
{
    // One-token pages and steps: window 1 keeps min(4096, 1 + 1) = 2 pages, window 2048 min(4096, 2048 + 1) = 2049.
    // 2^20 slots: group 1 needs 1048576 x 2049 = 2148532224 pages, over 1073741823 (group 0, 2097152, fits).
    test::ConfigBuilder builder({kvLayer(1, 1, 1), kvLayer(1, 1, 2048)});
    builder.maxBatchSize(1 << 20).maxSequenceLength(4096).tokensPerPage(1).dataType(DataType::kINT8);
    expectRejectedNaming(builder.maxTokensPerStep(1).build(),
        {"page group 1", "sliding window 2048", "1048576", "2049", "2148532224", "1073741823"});
    // Window 1023 keeps 1024 pages, 2^20 x 1024 = 1073741824 in all: one too many. Window 1022 keeps 1023: they fit.
    KVCacheConfig edge = builder.build();
    edge.layerConfigs[1].slidingWindow = 1023;
    expectRejectedNaming(edge, {"page group 1", "sliding window 1023", "1024", "1073741824", "1073741823"});
    edge.layerConfigs[1].slidingWindow = 1022;
    EXPECT_EQ(computeLayout(edge).groups.at(1).minPages, 1072693248);
}

} // namespace
} // namespace kvcache::rt
