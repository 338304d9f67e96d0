// Host tests of the hybrid-model layout: sliding-window page counts against a brute-force simulation, page groups,
// latent layers and every field against the independent model, hand-worked models, each new validation rule, and
// the budget split across groups. No GPU.

#include "kvcache/errors.h"
#include "kvcache/kv_cache_config.h"
#include "kvcache/kv_cache_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/layout_expectations.h"
#include "support/layout_model.h"

namespace kvcache::rt
{
namespace
{

using test::ConfigBuilder;
using test::modelLayout;
using test::throwsNaming;

KVLayerConfig windowed(int32_t heads, int32_t dim, int32_t window)
{
    return KVLayerConfig{heads, dim, window, KVLayerKind::kKV};
}

KVLayerConfig latent(int32_t dim, int32_t window = 0)
{
    return KVLayerConfig{1, dim, window, KVLayerKind::kLATENT};
}

//! Every field of `layout` against the model of `config`.
void expectMatchesModel(KVCacheConfig const& config, KVCacheLayout const& layout)
{
    EXPECT_EQ(
        layout.maxTokensPerStep, config.maxTokensPerStep == 0 ? config.maxSequenceLength : config.maxTokensPerStep);
    test::expectLayoutMatchesModel(layout, modelLayout(config));
}

TEST(WindowPages, FormulaBoundsTheSimulatedResidentPagesByAtMostOnePage)
{
    for (int32_t const tokensPerPage : {1, 2, 16, 64, 128})
    {
        for (int32_t const maxSequenceLength : {1, 7, 100, 1000})
        {
            for (int32_t const window : {1, 2, 5, 16, 63, 128, 999, 1000, 4096})
            {
                for (int32_t const step : {0, 1, 3, 64, 500, maxSequenceLength})
                {
                    if (step > maxSequenceLength)
                    {
                        continue;
                    }
                    KVCacheConfig const config = ConfigBuilder({windowed(2, 8, window)})
                                                     .maxSequenceLength(maxSequenceLength)
                                                     .tokensPerPage(tokensPerPage)
                                                     .maxTokensPerStep(step)
                                                     .build();
                    SCOPED_TRACE("P " + std::to_string(tokensPerPage) + ", S " + std::to_string(maxSequenceLength)
                        + ", W " + std::to_string(window) + ", C " + std::to_string(step));
                    KVCacheLayout const layout = computeLayout(config);
                    ASSERT_EQ(layout.groups.size(), 1U);
                    int64_t const pages = layout.groups[0].pagesPerSequence;
                    int64_t const resident = test::residentPagesBySimulation(
                        window, step == 0 ? maxSequenceLength : step, maxSequenceLength, tokensPerPage);
                    EXPECT_EQ(pages, modelLayout(config).groups[0].pagesPerSequence);
                    EXPECT_GE(pages, resident) << "the ring would not hold what one step needs";
                    EXPECT_LE(pages, resident + 1);
                }
            }
        }
    }
}

TEST(WindowPages, AWindowAsLongAsTheSequenceOrADefaultStepKeepsFullLengthCaches)
{
    // C = 0 means a whole prompt may arrive in one step, so the window saves nothing.
    KVCacheLayout const byDefault = computeLayout(ConfigBuilder({windowed(8, 64, 128)}).maxSequenceLength(8192));
    EXPECT_EQ(byDefault.groups[0].pagesPerSequence, 64);
    KVCacheLayout const longWindow =
        computeLayout(ConfigBuilder({windowed(8, 64, 9000)}).maxSequenceLength(8192).maxTokensPerStep(16));
    EXPECT_EQ(longWindow.groups[0].pagesPerSequence, 64);
}

TEST(Groups, GptOssLikeModelByHand)
{
    // 24 layers of 8 x 64 bfloat16, window 128 on even layers; batch 8, S 8192, P 128, C 2048.
    // Full layers: 64 pages a sequence, 512 pages, a page 128 * 8 * 64 * 2 = 131072 bytes a half, a layer
    // 2 * 512 * 131072 = 134217728 bytes. Windowed layers: min(64, ceil((127 + 2048) / 128) + 1) = min(64, 17 + 1) = 18
    // pages a sequence, 144 pages, a layer 2 * 144 * 131072 = 37748736 bytes. Total 12 * (134217728 + 37748736).
    std::vector<KVLayerConfig> layers;
    for (int32_t i = 0; i < 24; ++i)
    {
        layers.push_back(windowed(8, 64, i % 2 == 0 ? 128 : 0));
    }
    KVCacheConfig const config = ConfigBuilder(layers)
                                     .maxBatchSize(8)
                                     .maxSequenceLength(8192)
                                     .dataType(DataType::kBF16)
                                     .maxTokensPerStep(2048)
                                     .build();
    KVCacheLayout const layout = computeLayout(config);
    ASSERT_EQ(layout.groups.size(), 2U);
    EXPECT_EQ(layout.groups[0].slidingWindow, 0);
    EXPECT_EQ(layout.groups[0].pagesPerSequence, 64);
    EXPECT_EQ(layout.groups[0].numPages, 512);
    EXPECT_EQ(layout.groups[1].slidingWindow, 128);
    EXPECT_EQ(layout.groups[1].pagesPerSequence, 18);
    EXPECT_EQ(layout.groups[1].capacity, 2304);
    EXPECT_EQ(layout.groups[1].numPages, 144);
    EXPECT_EQ(layout.groups[1].layers, (std::vector<int32_t>{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22}));
    EXPECT_EQ(layout.layers[1].layerBytes, 134217728);
    EXPECT_EQ(layout.layers[0].layerBytes, 37748736);
    EXPECT_EQ(layout.cacheBytes, int64_t{2063597568});
    EXPECT_EQ(layout.capPadded, 8192);
    EXPECT_EQ(layout.numPages, 512) << "the seed's numPages is group 0's";
    expectMatchesModel(config, layout);
}

TEST(Groups, DeepSeekLikeLatentLayersByHand)
{
    // 61 latent layers of 1 x 576 (kv_lora_rank 512 + qk_rope_head_dim 64) bfloat16, batch 8, S 8192, P 128: one half
    // of 512 pages of 128 * 576 * 2 = 147456 bytes, 75497472 bytes a layer, 4605345792 in all (K only).
    KVCacheConfig const config = ConfigBuilder(std::vector<KVLayerConfig>(61, latent(576)))
                                     .maxBatchSize(8)
                                     .maxSequenceLength(8192)
                                     .dataType(DataType::kBF16)
                                     .build();
    KVCacheLayout const layout = computeLayout(config);
    ASSERT_EQ(layout.groups.size(), 1U);
    EXPECT_EQ(layout.layers[0].numHalves, 1);
    EXPECT_EQ(layout.layers[0].layerBytes, 75497472);
    EXPECT_EQ(layout.cacheBytes, int64_t{4605345792});
    EXPECT_EQ(layout.bytesPerPage, 61 * 147456);
    expectMatchesModel(config, layout);
}

TEST(Groups, FullAttentionAndLatentLayersShareGroupZeroAndWindowsFollowInAscendingOrder)
{
    KVCacheConfig const config = ConfigBuilder(
        {windowed(2, 16, 300), latent(40), windowed(4, 8, 0), windowed(1, 32, 20), latent(24, 20), windowed(2, 8, 300)})
                                     .maxBatchSize(3)
                                     .maxSequenceLength(1000)
                                     .tokensPerPage(16)
                                     .maxTokensPerStep(8)
                                     .numPagesPerGroup({0, 70, 0})
                                     .build();
    KVCacheLayout const layout = computeLayout(config);
    ASSERT_EQ(layout.groups.size(), 3U);
    EXPECT_EQ(layout.groups[0].layers, (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(layout.groups[1].layers, (std::vector<int32_t>{3, 4}));
    EXPECT_EQ(layout.groups[2].layers, (std::vector<int32_t>{0, 5}));
    EXPECT_EQ(layout.groups[1].slidingWindow, 20);
    EXPECT_EQ(layout.groups[1].numPages, 70);
    expectMatchesModel(config, layout);
}

TEST(Groups, OnlyWindowedLayersMakeTheSmallestWindowGroupZero)
{
    KVCacheConfig const config = ConfigBuilder({windowed(8, 128, 4096), windowed(8, 128, 512)})
                                     .maxBatchSize(2)
                                     .maxSequenceLength(32768)
                                     .maxTokensPerStep(1024)
                                     .build();
    KVCacheLayout const layout = computeLayout(config);
    ASSERT_EQ(layout.groups.size(), 2U);
    EXPECT_EQ(layout.groups[0].slidingWindow, 512);
    EXPECT_EQ(layout.capPadded, layout.groups[1].capacity) << "capPadded is the largest capacity";
    EXPECT_LT(layout.capPadded, 32768);
    expectMatchesModel(config, layout);
}

TEST(Groups, RandomHybridConfigsMatchTheModel)
{
    std::mt19937 rng(20261130);
    auto pick = [&rng](int32_t low, int32_t high) { return std::uniform_int_distribution<int32_t>(low, high)(rng); };
    for (int32_t trial = 0; trial < 300; ++trial)
    {
        std::vector<int32_t> const windows = {0, pick(1, 50), pick(1, 400), pick(1, 3000)};
        std::vector<KVLayerConfig> layers;
        for (int32_t i = pick(1, 8); i > 0; --i)
        {
            int32_t const window = windows[static_cast<size_t>(pick(0, 3))];
            layers.push_back(pick(0, 3) == 0 ? latent(pick(1, 80), window) : windowed(pick(1, 8), pick(1, 96), window));
        }
        int32_t const maxSequenceLength = pick(1, 3000);
        KVCacheConfig config = ConfigBuilder(layers)
                                   .maxBatchSize(pick(1, 9))
                                   .maxSequenceLength(maxSequenceLength)
                                   .tokensPerPage(1 << pick(0, 8))
                                   .dataType(pick(0, 1) == 0 ? DataType::kHALF : DataType::kFP8_E4M3)
                                   .maxTokensPerStep(pick(0, maxSequenceLength))
                                   .build();
        test::LayoutModel const minimal = modelLayout(config);
        for (test::ModelGroup const& group : minimal.groups)
        {
            config.numPagesPerGroup.push_back(pick(0, 1) == 0 ? 0 : static_cast<int32_t>(group.minPages + pick(0, 9)));
        }
        SCOPED_TRACE("trial " + std::to_string(trial));
        expectMatchesModel(config, computeLayout(config));
    }
}

TEST(Groups, OneGroupKeepsTheSeedFields)
{
    KVCacheConfig const config =
        ConfigBuilder({{8, 128}, {2, 64}}).maxBatchSize(3).maxSequenceLength(200).tokensPerPage(64).numPages(20);
    KVCacheLayout const layout = computeLayout(config);
    ASSERT_EQ(layout.groups.size(), 1U);
    EXPECT_EQ(layout.groups[0].numPages, layout.numPages);
    EXPECT_EQ(layout.groups[0].minPages, layout.minPages);
    EXPECT_EQ(layout.groups[0].capacity, layout.capPadded);
    EXPECT_EQ(layout.groups[0].bytesPerPage, layout.bytesPerPage);
    EXPECT_EQ(layout.groups[0].cacheBytes, layout.cacheBytes);
    EXPECT_EQ(layout.numPages, 20);
    expectMatchesModel(config, layout);
}

//! `config` with one field changed must be rejected, naming every word.
void expectRejected(KVCacheConfig const& config, std::vector<std::string> const& words)
{
    EXPECT_TRUE(throwsNaming<InvalidConfigError>([&] { computeLayout(config); }, words));
}

ConfigBuilder twoGroups()
{
    return ConfigBuilder({windowed(2, 16, 0), windowed(2, 16, 64)})
        .maxBatchSize(2)
        .maxSequenceLength(512)
        .tokensPerPage(32);
}

TEST(HybridValidation, EachRuleNamesTheFieldTheValueAndTheLimit)
{
    expectRejected(ConfigBuilder({windowed(2, 16, -5)}), {"layerConfigs[0].slidingWindow", "-5", ">= 0"});
    expectRejected(ConfigBuilder({{2, 16}, {1, 8, 0, static_cast<KVLayerKind>(7)}}), {"layerConfigs[1].kind", "7"});
    expectRejected(
        ConfigBuilder({{1, 8}, {2, 576, 0, KVLayerKind::kLATENT}}), {"layerConfigs[1].numKVHeads", "2", "1"});
    expectRejected(
        ConfigBuilder({{1, 8}}).maxSequenceLength(100).maxTokensPerStep(-1), {"maxTokensPerStep", "-1", "100"});
    expectRejected(
        ConfigBuilder({{1, 8}}).maxSequenceLength(100).maxTokensPerStep(101), {"maxTokensPerStep", "101", "100"});
    // Two groups: full attention keeps 16 pages a sequence; window 64 with C = 32: min(16, ceil(95 / 32) + 1) = 4.
    ConfigBuilder const base = twoGroups().maxTokensPerStep(32);
    test::LayoutModel const model = modelLayout(base.build());
    ASSERT_EQ(model.groups.size(), 2U);
    int64_t const windowMinimum = model.groups[1].minPages;
    expectRejected(ConfigBuilder(base).numPages(64), {"numPages", "64", "numPagesPerGroup"});
    expectRejected(ConfigBuilder(base).numPagesPerGroup({0}), {"numPagesPerGroup", "1", "2"});
    expectRejected(ConfigBuilder(base).numPagesPerGroup({0, static_cast<int32_t>(windowMinimum - 1)}),
        {"numPagesPerGroup[1]", std::to_string(windowMinimum - 1), std::to_string(windowMinimum)});
    expectRejected(ConfigBuilder(base).numPagesPerGroup({-3, 0}), {"numPagesPerGroup[0]", "-3"});
    expectRejected(ConfigBuilder(base).numPagesPerGroup({kMAX_NUM_PAGES + 1, 0}),
        {"numPagesPerGroup[0]", std::to_string(kMAX_NUM_PAGES + 1), std::to_string(kMAX_NUM_PAGES)});
    expectRejected(ConfigBuilder({{1, 8}}).numPages(2).numPagesPerGroup({2}), {"numPages", "numPagesPerGroup"});
    expectRejected(ConfigBuilder({windowed(1, 8, 4)}).maxBatchSize(1 << 30).maxSequenceLength(64).maxTokensPerStep(1),
        {"maxBatchSize", std::to_string(kMAX_NUM_PAGES)});
}

TEST(Budget, SplitGivesEveryGroupTheSameSequencesAndTheMostThatFit)
{
    KVCacheConfig config = twoGroups().maxTokensPerStep(32).build();
    test::LayoutModel const model = modelLayout(config);
    int64_t perSequence = 0;
    for (test::ModelGroup const& group : model.groups)
    {
        perSequence += group.pagesPerSequence * group.bytesPerPage;
    }
    int64_t const budget = 37 * perSequence + perSequence / 2;
    BudgetSplit const split = splitBudget(config, budget);
    EXPECT_EQ(split.sequences, 37);
    ASSERT_EQ(split.numPagesPerGroup.size(), 2U);
    EXPECT_EQ(split.numPagesPerGroup[0], 37 * model.groups[0].pagesPerSequence);
    EXPECT_EQ(split.numPagesPerGroup[1], 37 * model.groups[1].pagesPerSequence);
    EXPECT_EQ(split.bytes, 37 * perSequence);
    // The split is a valid config whose cache is exactly split.bytes; one sequence more would not fit.
    config.numPagesPerGroup = {
        static_cast<int32_t>(split.numPagesPerGroup[0]), static_cast<int32_t>(split.numPagesPerGroup[1])};
    EXPECT_EQ(computeLayout(config).cacheBytes, split.bytes);
    EXPECT_GT(split.bytes + perSequence, budget);

    EXPECT_EQ(splitBudget(config, 0).sequences, 0);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { splitBudget(config, -1); }, {"budgetBytes", "-1"}));
    EXPECT_TRUE(
        throwsNaming<InvalidConfigError>([&] { maxPagesForBudget(config, budget); }, {"page groups", "splitBudget"}));
}

TEST(Budget, SplitIsCappedByThePageIdLimit)
{
    KVCacheConfig const config = twoGroups().maxTokensPerStep(32).build();
    BudgetSplit const split = splitBudget(config, INT64_MAX);
    int64_t const fullPages = modelLayout(config).groups[0].pagesPerSequence;
    EXPECT_EQ(split.sequences, kMAX_NUM_PAGES / fullPages);
    EXPECT_LE(split.numPagesPerGroup[0], kMAX_NUM_PAGES);
}

TEST(Budget, MaxPagesForBudgetStillServesOneGroupOfAnyKind)
{
    for (KVCacheConfig const& config : {ConfigBuilder({latent(576), latent(576)}).build(),
             ConfigBuilder({windowed(4, 32, 100), windowed(2, 16, 100)}).maxSequenceLength(4096).build()})
    {
        int64_t const bytesPerPage = modelLayout(config).bytesPerPage;
        EXPECT_EQ(maxPagesForBudget(config, 1000 * bytesPerPage + 1), 1000);
    }
}

} // namespace
} // namespace kvcache::rt
