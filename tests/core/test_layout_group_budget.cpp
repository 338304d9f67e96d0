// The budget questions of page groups (no GPU): maxPagesForBudget for one group, splitBudget for several.
// The layers, configs and model check they share are tests/support/group_layouts.h.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/error_matchers.h"
#include "support/group_layouts.h"

namespace kvcache::rt
{
namespace
{

using namespace group_layouts;

TEST(GroupBudget, MaxPagesForBudgetServesAnyOneGroup)
{
    // DeepSeek-like: 61 latent fp16 layers of 576 values, 73728 bytes a page and layer, 4497408 a page id.
    // 1 GiB / 4497408 = 238.7: 238 pages.
    std::vector<KVLayerConfig> const latentLayers(61, latentLayer(576));
    KVCacheConfig const latentOnly =
        test::ConfigBuilder(latentLayers).maxBatchSize(4).maxSequenceLength(4096).tokensPerPage(64).build();
    EXPECT_EQ(maxPagesForBudget(latentOnly, int64_t{1} << 30), 238);
    EXPECT_EQ(maxPagesForBudget(latentOnly, 238 * int64_t{4497408}), 238);
    EXPECT_EQ(maxPagesForBudget(latentOnly, 238 * int64_t{4497408} - 1), 237);

    // One window only: 2 layers of 2 x 32 fp16 in pages of 32, 2 halves x 4096 bytes each, 16384 bytes a page id.
    std::vector<KVLayerConfig> const windowLayers(2, kvLayer(2, 32, 64));
    KVCacheConfig const windowOnly =
        test::ConfigBuilder(windowLayers).maxSequenceLength(1000).tokensPerPage(32).maxTokensPerStep(16).build();
    EXPECT_EQ(test::modelLayout(windowOnly).bytesPerPage, 16384);
    EXPECT_EQ(maxPagesForBudget(windowOnly, 16384 * 100 + 16383), 100);
    EXPECT_EQ(maxPagesForBudget(windowOnly, 0), 0);

    // Full attention: the step bound changes nothing.
    KVCacheConfig const full = test::ConfigBuilder({kvLayer(8, 128)}).maxSequenceLength(500).maxTokensPerStep(7);
    EXPECT_EQ(maxPagesForBudget(full, 524288 * 9 + 5), 9); // 2 x 128 x 8 x 128 x 2 = 524288 bytes a page id
}

TEST(GroupBudget, MaxPagesForBudgetRefusesSeveralGroups)
{
    for (int64_t const budget : {int64_t{0}, int64_t{1} << 40})
    {
        EXPECT_TRUE(
            test::throwsNaming<InvalidConfigError>([&] { static_cast<void>(maxPagesForBudget(gptOssLike(), budget)); },
                {"maxPagesForBudget", "2 page groups", "splitBudget"}));
    }
    EXPECT_TRUE(test::throwsNaming<InvalidConfigError>(
        [] { static_cast<void>(maxPagesForBudget(mixedModel(), 1000000)); }, {"3 page groups", "splitBudget"}));
}

TEST(GroupBudget, SplitGptOssLikeByHand)
{
    // A sequence takes 64 full pages and 18 window pages, 3145728 bytes each: 82 x 3145728 = 257949696 bytes.
    // 10 GiB = 10737418240 bytes hold floor(41.6) = 41 sequences: 10575937536 bytes; 42 would take 10833887232.
    int64_t const budget = int64_t{10} << 30;
    BudgetSplit const split = splitBudget(gptOssLike(), budget);
    EXPECT_EQ(split.sequences, 41);
    EXPECT_EQ(split.numPagesPerGroup, (std::vector<int64_t>{2624, 738})); // 41 x 64, 41 x 18
    EXPECT_EQ(split.bytes, 10575937536);
    // Both are above the minima (512, 144): the config they make takes exactly those bytes.
    KVCacheConfig sized = gptOssLike();
    sized.numPagesPerGroup = {2624, 738};
    KVCacheLayout const layout = expectGroupsMatchModel(sized);
    EXPECT_EQ(layout.groups[0].cacheBytes, 8254390272); // 12 x 2 x 2624 x 65536 x 2
    EXPECT_EQ(layout.groups[1].cacheBytes, 2321547264); // 12 x 2 x 738 x 65536 x 2
    EXPECT_EQ(layout.cacheBytes, 10575937536);
    // One byte short of 41 sequences leaves 40.
    EXPECT_EQ(splitBudget(gptOssLike(), 41 * int64_t{257949696} - 1).sequences, 40);
    EXPECT_EQ(splitBudget(gptOssLike(), 41 * int64_t{257949696}).sequences, 41);
}

TEST(GroupBudget, SplitIgnoresTheConfigsPageCounts)
{
    // Page counts that computeLayout would reject do not change the question.
    KVCacheConfig asked = gptOssLike();
    asked.numPagesPerGroup = {1};
    BudgetSplit const split = splitBudget(asked, int64_t{10} << 30);
    EXPECT_EQ(split.sequences, 41);
    asked.numPagesPerGroup.clear();
    asked.numPages = 7;
    EXPECT_EQ(splitBudget(asked, int64_t{10} << 30).numPagesPerGroup, split.numPagesPerGroup);
}

TEST(GroupBudget, SplitIsCappedByThePageIdLimit)
{
    // int8, one value a token, pages of one token, 4-token sequences, steps of 1: full attention keeps 4 pages, window
    // 1 keeps 2; a page id costs 2 bytes in each group, a sequence 4 x 2 + 2 x 2 = 12 bytes. The full group caps the
    // sequences at floor(1073741823 / 4) = 268435455.
    KVCacheConfig const config = test::ConfigBuilder({kvLayer(1, 1), kvLayer(1, 1, 1)})
                                     .maxSequenceLength(4)
                                     .tokensPerPage(1)
                                     .dataType(DataType::kINT8)
                                     .maxTokensPerStep(1)
                                     .build();
    for (int64_t const budget : {std::numeric_limits<int64_t>::max(), int64_t{1} << 40, 12 * int64_t{268435455}})
    {
        SCOPED_TRACE("budget " + std::to_string(budget));
        BudgetSplit const split = splitBudget(config, budget);
        EXPECT_EQ(split.sequences, 268435455);
        EXPECT_EQ(split.numPagesPerGroup, (std::vector<int64_t>{1073741820, 536870910}));
        EXPECT_EQ(split.bytes, 3221225460); // 268435455 x 12
    }
    EXPECT_EQ(splitBudget(config, 12 * int64_t{268435455} - 1).sequences, 268435454);
    // The capped split is a valid config.
    KVCacheConfig sized = config;
    sized.numPagesPerGroup = {1073741820, 536870910};
    EXPECT_EQ(computeLayout(sized).cacheBytes, 3221225460);
}

TEST(GroupBudget, SplitOfZeroAndNegativeBudgets)
{
    BudgetSplit const none = splitBudget(gptOssLike(), 0);
    EXPECT_EQ(none.sequences, 0);
    EXPECT_EQ(none.numPagesPerGroup, (std::vector<int64_t>{0, 0}));
    EXPECT_EQ(none.bytes, 0);
    EXPECT_EQ(splitBudget(gptOssLike(), 257949695).sequences, 0);
    for (int64_t const budget : {int64_t{-1}, int64_t{-257949696}, std::numeric_limits<int64_t>::min()})
    {
        SCOPED_TRACE("budget " + std::to_string(budget));
        auto const call = [budget] { static_cast<void>(splitBudget(gptOssLike(), budget)); };
        EXPECT_TRUE(
            test::throwsNaming<InvalidArgumentError>(call, {"splitBudget", "budgetBytes", std::to_string(budget)}));
        // An argument error, not a config error.
        EXPECT_FALSE(test::throwsNaming<InvalidConfigError>(call));
    }
}

TEST(GroupBudget, SplitOfAnInvalidConfigThrows)
{
    KVCacheConfig config = gptOssLike();
    config.layerConfigs[3].slidingWindow = -1;
    EXPECT_TRUE(test::throwsNaming<InvalidConfigError>(
        [&] { static_cast<void>(splitBudget(config, int64_t{1} << 30)); }, {"layerConfigs[3].slidingWindow"}));
}

TEST(GroupBudget, RandomSplitsFitAndOneMoreSequenceDoesNot)
{
    std::mt19937 rng(4242U);
    int32_t validated = 0;
    for (int32_t trial = 0; trial < 200; ++trial)
    {
        KVCacheConfig const config = randomHybridConfig(rng, trial % 5 == 4);
        test::LayoutModel const model = test::modelLayout(config);
        int64_t bytesPerSequence = 0;
        int64_t cap = std::numeric_limits<int64_t>::max();
        for (test::ModelGroup const& group : model.groups)
        {
            bytesPerSequence += group.pagesPerSequence * group.bytesPerPage;
            cap = std::min(cap, kPAGE_ID_LIMIT / group.pagesPerSequence);
        }
        // Between no sequence and three batches' worth, plus part of a sequence.
        int64_t const wanted = std::uniform_int_distribution<int64_t>(0, 3 * int64_t{config.maxBatchSize})(rng);
        int64_t const budget =
            wanted * bytesPerSequence + std::uniform_int_distribution<int64_t>(0, bytesPerSequence - 1)(rng);
        SCOPED_TRACE("trial " + std::to_string(trial) + ": budget " + std::to_string(budget) + ", bytes a sequence "
            + std::to_string(bytesPerSequence));
        BudgetSplit const split = splitBudget(config, budget);
        int64_t const sequences = std::min(cap, budget / bytesPerSequence);
        ASSERT_EQ(split.sequences, sequences);
        ASSERT_EQ(split.numPagesPerGroup.size(), model.groups.size());
        for (size_t g = 0; g < model.groups.size(); ++g)
        {
            EXPECT_EQ(split.numPagesPerGroup[g], sequences * model.groups[g].pagesPerSequence);
        }
        EXPECT_EQ(split.bytes, sequences * bytesPerSequence);
        EXPECT_LE(split.bytes, budget);
        EXPECT_GT(split.bytes + bytesPerSequence, budget);
        if (sequences < config.maxBatchSize)
        {
            continue; // below every group's minimum: not a config of its own
        }
        KVCacheConfig sized = config;
        sized.numPagesPerGroup.clear();
        for (int64_t const pages : split.numPagesPerGroup)
        {
            sized.numPagesPerGroup.push_back(static_cast<int32_t>(pages));
        }
        KVCacheLayout const layout = expectGroupsMatchModel(sized);
        EXPECT_EQ(layout.cacheBytes, split.bytes);
        EXPECT_LE(layout.cacheBytes, budget);
        for (size_t g = 0; g < model.groups.size(); ++g)
        {
            sized.numPagesPerGroup[g] += static_cast<int32_t>(model.groups[g].pagesPerSequence);
        }
        EXPECT_GT(computeLayout(sized).cacheBytes, budget);
        ++validated;
    }
    EXPECT_GT(validated, 80);
}

} // namespace
} // namespace kvcache::rt
