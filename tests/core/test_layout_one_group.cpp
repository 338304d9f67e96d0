// The single-group layout (no GPU): full-attention KV models keep one group equal to the scalar fields, as before
// hybrid models.
// The layers, configs and model check they share are tests/support/group_layouts.h.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
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

TEST(OneGroupLayout, FullAttentionKVModelsHaveOneGroupEqualToTheScalarFields)
{
    std::mt19937 rng(808U);
    auto const pick = [&rng](int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); };
    for (int32_t trial = 0; trial < 100; ++trial)
    {
        std::vector<KVLayerConfig> layers(static_cast<size_t>(pick(1, 6)));
        for (KVLayerConfig& layer : layers)
        {
            layer = kvLayer(pick(1, 16), pick(1, 256));
        }
        int32_t const sequence = pick(1, 4000);
        int32_t const batch = pick(1, 8);
        int32_t const pageSize = int32_t{1} << pick(0, 10);
        int64_t const minPages = batch * pagesFor(sequence, pageSize);
        int32_t const pages = pick(0, 1) == 0 ? 0 : static_cast<int32_t>(minPages) + pick(0, 50);
        KVCacheConfig const config = test::ConfigBuilder(layers)
                                         .maxBatchSize(batch)
                                         .maxSequenceLength(sequence)
                                         .tokensPerPage(pageSize)
                                         .numPages(pages)
                                         .build();
        SCOPED_TRACE("trial " + std::to_string(trial));
        KVCacheLayout const layout = expectGroupsMatchModel(config);
        ASSERT_EQ(layout.groups.size(), 1U);
        KVPageGroupLayout const& group = layout.groups[0];
        EXPECT_EQ(group.slidingWindow, 0);
        EXPECT_EQ(group.pagesPerSequence, layout.pagesPerSlot);
        EXPECT_EQ(group.slotTokens, layout.capPadded);
        EXPECT_EQ(group.minPages, layout.minPages);
        EXPECT_EQ(group.minPages, minPages);
        EXPECT_EQ(group.numPages, layout.numPages);
        EXPECT_EQ(group.numPages, pages == 0 ? minPages : pages);
        EXPECT_EQ(group.bytesPerPage, layout.bytesPerPage);
        EXPECT_EQ(group.cacheBytes, layout.cacheBytes);
        EXPECT_EQ(group.layers.size(), layers.size());
        for (KVLayerLayout const& layer : layout.layers)
        {
            EXPECT_EQ(layer.group, 0);
            EXPECT_EQ(layer.numHalves, 2);
            EXPECT_EQ(layer.slotTokens, layout.capPadded);
            EXPECT_EQ(layer.numPages, layout.numPages);
        }
        // A step bound changes nothing without windows, and numPagesPerGroup {n} means numPages n.
        KVCacheConfig bounded = config;
        bounded.maxTokensPerStep = 1;
        bounded.numPages = 0;
        bounded.numPagesPerGroup = {pages};
        KVCacheLayout const same = computeLayout(bounded);
        EXPECT_EQ(same.maxTokensPerStep, 1);
        EXPECT_EQ(same.capPadded, layout.capPadded);
        EXPECT_EQ(same.numPages, layout.numPages);
        EXPECT_EQ(same.cacheBytes, layout.cacheBytes);
    }
}

TEST(OneGroupLayout, ScalarPageCountErrorsStillNameNumPages)
{
    // One group without numPagesPerGroup: 2 slots of ceil(1000 / 128) = 8 pages, 16 at least.
    KVCacheConfig const config =
        test::ConfigBuilder({kvLayer(4, 32)}).maxBatchSize(2).maxSequenceLength(1000).numPages(15);
    std::string message;
    EXPECT_TRUE(test::throwsNaming<InvalidConfigError>(
        [&] { static_cast<void>(computeLayout(config)); }, {"numPages is 15", "minimum 16"}, &message));
    EXPECT_EQ(message.find("numPagesPerGroup"), std::string::npos) << message;
}

TEST(OneGroupLayout, NoLayersMeansNoGroups)
{
    KVCacheConfig const config =
        test::ConfigBuilder(std::vector<KVLayerConfig>{}).maxBatchSize(3).maxSequenceLength(100).tokensPerPage(16);
    KVCacheLayout const layout = expectGroupsMatchModel(config);
    EXPECT_TRUE(layout.groups.empty());
    EXPECT_EQ(layout.capPadded, 112);
    EXPECT_EQ(layout.pagesPerSlot, 7);
    EXPECT_EQ(layout.minPages, 21);
}

} // namespace
} // namespace kvcache::rt
