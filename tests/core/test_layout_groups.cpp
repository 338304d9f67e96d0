// Host tests of the hybrid-model layout (no GPU): the pages a sliding-window layer keeps a sequence, against the
// model's formula and a brute-force simulation of every step start; page groups (full attention first, then each
// window in ascending order) with every per-group and per-layer field against the independent model and by hand;
// latent layers (K alone); every new validation rule, each naming its field, value and limit before anything is
// allocated; the budget questions of one group (maxPagesForBudget) and of several (splitBudget); and the unchanged
// single-group layout.

#include "kvcache/core/data_type.h"
#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/layout_expectations.h"
#include "support/layout_model.h"

namespace kvcache::rt
{
namespace
{

constexpr int64_t kPAGE_ID_LIMIT = kMAX_NUM_PAGES; // 1073741823

//! A K-and-V layer of `heads` x `dim` values a token and half; `window` 0 is full attention.
KVLayerConfig kvLayer(int32_t heads, int32_t dim, int32_t window = 0)
{
    return KVLayerConfig{heads, dim, window, KVLayerKind::kKV};
}

//! A latent layer of `dim` values a token (one head, K only); `window` 0 is full attention.
KVLayerConfig latentLayer(int32_t dim, int32_t window = 0)
{
    return KVLayerConfig{1, dim, window, KVLayerKind::kLATENT};
}

//! Pages of `tokens` tokens, counted one page at a time.
int64_t pagesFor(int64_t tokens, int64_t tokensPerPage)
{
    int64_t pages = 0;
    while (pages * tokensPerPage < tokens)
    {
        ++pages;
    }
    return pages;
}

// ---------------------------------------------------------------------------------------------------------------
// The pages a sliding window keeps

//! A full layer and a layer of window `window`: group 1 is the window's.
KVCacheConfig fullAndWindow(int32_t sequence, int32_t pageSize, int32_t window, int32_t step)
{
    return test::ConfigBuilder({kvLayer(2, 4), kvLayer(1, 8, window)})
        .maxSequenceLength(sequence)
        .tokensPerPage(pageSize)
        .maxTokensPerStep(step)
        .build();
}

//! Returns `values` without those outside [lo, hi], sorted and without repeats.
std::vector<int32_t> within(std::vector<int64_t> const& values, int64_t lo, int64_t hi)
{
    std::vector<int32_t> kept;
    for (int64_t const value : values)
    {
        if (value >= lo && value <= hi)
        {
            kept.push_back(static_cast<int32_t>(value));
        }
    }
    std::sort(kept.begin(), kept.end());
    kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
    return kept;
}

TEST(RingPages, SweepMatchesTheModelAndBoundsTheSimulation)
{
    int64_t checked = 0;
    int64_t exact = 0;     // library == simulation
    int64_t slack = 0;     // library == simulation + 1
    int64_t belowFull = 0; // a ring shorter than a full-length slot
    for (int32_t const sequence : {1, 2, 3, 7, 64, 100, 127, 128, 129, 333, 1000, 1024, 2049, 8192})
    {
        for (int32_t shift = 0; shift <= 10; ++shift)
        {
            int32_t const pageSize = int32_t{1} << shift;
            int64_t const fullPages = pagesFor(sequence, pageSize);
            int64_t const s = sequence;
            int64_t const p = pageSize;
            for (int32_t const window : within({1, 2, 3, p - 1, p, p + 1, 2 * p + 5, s / 2, s - 1, s, s + 1, 3 * s}, 1,
                     std::numeric_limits<int32_t>::max()))
            {
                for (int32_t const step : within({0, 1, 2, p - 1, p, s / 3, s - 1, s}, 0, s))
                {
                    std::string const where = "S " + std::to_string(sequence) + ", P " + std::to_string(pageSize)
                        + ", W " + std::to_string(window) + ", C " + std::to_string(step);
                    KVCacheConfig const config = fullAndWindow(sequence, pageSize, window, step);
                    KVCacheLayout const layout = computeLayout(config);
                    test::LayoutModel const model = test::modelLayout(config);
                    ASSERT_EQ(layout.groups.size(), 2U) << where;
                    int64_t const pages = layout.groups[1].pagesPerSequence;
                    ASSERT_EQ(pages, model.groups[1].pagesPerSequence) << where;
                    ASSERT_EQ(layout.groups[0].pagesPerSequence, fullPages) << where;
                    int64_t const stepTokens = step == 0 ? sequence : step;
                    ASSERT_EQ(layout.maxTokensPerStep, stepTokens) << where;
                    int64_t const simulated = test::residentPagesBySimulation(window, stepTokens, sequence, pageSize);
                    ASSERT_LE(simulated, pages) << where;
                    ASSERT_LE(pages, simulated + 1) << where;
                    ASSERT_LE(pages, fullPages) << where;
                    ++checked;
                    exact += pages == simulated ? 1 : 0;
                    slack += pages == simulated + 1 ? 1 : 0;
                    belowFull += pages < fullPages ? 1 : 0;
                }
            }
        }
    }
    // The sweep reaches both ends of the bound and many rings shorter than a full slot.
    EXPECT_GT(checked, 8000);
    EXPECT_GT(exact, 5000);
    EXPECT_GT(slack, 400);
    EXPECT_GT(belowFull, 1500);
}

TEST(RingPages, DefaultStepIsTheWholeSequence)
{
    // maxTokensPerStep 0 resolves to maxSequenceLength: the same pages as a step of S tokens, which is a full slot.
    for (int32_t const window : {1, 100, 5000})
    {
        KVCacheLayout const byDefault = computeLayout(fullAndWindow(1000, 64, window, 0));
        KVCacheLayout const wholePrompt = computeLayout(fullAndWindow(1000, 64, window, 1000));
        EXPECT_EQ(byDefault.maxTokensPerStep, 1000);
        EXPECT_EQ(byDefault.groups[1].pagesPerSequence, wholePrompt.groups[1].pagesPerSequence);
        EXPECT_EQ(byDefault.groups[1].pagesPerSequence, 16) << "window " << window; // ceil(1000 / 64)
    }
}

//! One window-page case worked out by hand: the library's pages and the simulation's.
struct WindowCase
{
    int32_t sequence;
    int32_t pageSize;
    int32_t window;
    int32_t step;
    int64_t pages;
    int64_t simulated;
};

TEST(RingPages, EdgeCasesByHand)
{
    std::vector<WindowCase> const cases{
        // W 1, C 1: min(64, ceil(1 / 128) + 1) = 2; a step touches one token, one page.
        {8192, 128, 1, 1, 2, 1},
        // W 1, C 8192: min(64, ceil(8192 / 128) + 1 = 65) = 64, a full-length cache.
        {8192, 128, 1, 8192, 64, 64},
        // W = S: min(16, ceil(1000 / 64) + 1 = 17) = 16; W > S caps the same way.
        {1000, 64, 1000, 1, 16, 16},
        {1000, 64, 4000, 1, 16, 16},
        // P 1: W - 1 + C = 12 tokens, ceil(12 / 1) + 1 = 13 pages; one-token pages never split a span, so 12 suffice.
        {100, 1, 10, 3, 13, 12},
        // P 1, W 1, C 1: 2 pages for the one token a step touches.
        {100, 1, 1, 1, 2, 1},
        // W 129, C 128: 256 tokens, ceil(256 / 128) + 1 = 3; starting mid-page they do cover 3 pages.
        {8192, 128, 129, 128, 3, 3},
        // W 2, C 128: 129 tokens, ceil(129 / 128) + 1 = 3; 129 tokens never cover more than 2 pages of 128.
        {8192, 128, 2, 128, 3, 2},
        // S shorter than a page: everything fits in the one page a full slot has.
        {5, 1024, 3, 2, 1, 1},
    };
    for (WindowCase const& c : cases)
    {
        SCOPED_TRACE("S " + std::to_string(c.sequence) + ", P " + std::to_string(c.pageSize) + ", W "
            + std::to_string(c.window) + ", C " + std::to_string(c.step));
        KVCacheLayout const layout = computeLayout(fullAndWindow(c.sequence, c.pageSize, c.window, c.step));
        EXPECT_EQ(layout.groups.at(1).pagesPerSequence, c.pages);
        EXPECT_EQ(layout.groups.at(1).slotTokens, c.pages * c.pageSize);
        EXPECT_EQ(test::residentPagesBySimulation(c.window, c.step, c.sequence, c.pageSize), c.simulated);
    }
}

TEST(RingPages, AWindowAsLongAsTheSequenceIsStillItsOwnGroup)
{
    // Window 1000 of S 1000 keeps 16 pages like full attention, but its page ids are a separate space.
    KVCacheLayout const layout = computeLayout(fullAndWindow(1000, 64, 1000, 1));
    ASSERT_EQ(layout.groups.size(), 2U);
    EXPECT_EQ(layout.groups[0].slidingWindow, 0);
    EXPECT_EQ(layout.groups[1].slidingWindow, 1000);
    EXPECT_EQ(layout.groups[1].pagesPerSequence, layout.groups[0].pagesPerSequence);
    EXPECT_EQ(layout.layers[1].group, 1);
}

// ---------------------------------------------------------------------------------------------------------------
// Page groups against the model

//! Expects every field of `config`'s layout to match the model (the whole cache, each group, each layer), and the
//! rules that tie the fields together to hold; returns the layout.
KVCacheLayout expectGroupsMatchModel(KVCacheConfig const& config)
{
    KVCacheLayout const layout = computeLayout(config);
    test::expectLayoutMatchesModel(layout, test::modelLayout(config));
    int64_t const e = test::elementBytesByHand(config.kvCacheType);
    int64_t const pageSize = config.tokensPerPage;
    EXPECT_EQ(layout.maxBatchSize, config.maxBatchSize);
    EXPECT_EQ(layout.dataType, config.kvCacheType);
    EXPECT_EQ(layout.tokensPerPage, config.tokensPerPage);
    EXPECT_EQ(layout.elementBytes, e);
    EXPECT_EQ(
        layout.maxTokensPerStep, config.maxTokensPerStep == 0 ? config.maxSequenceLength : config.maxTokensPerStep);

    // Groups: windows strictly ascending, each with an ascending, non-empty layer list; sizes add up.
    int64_t groupBytes = 0;
    int64_t groupBytesPerPage = 0;
    int64_t largestCapacity = 0;
    for (size_t g = 0; g < layout.groups.size(); ++g)
    {
        KVPageGroupLayout const& group = layout.groups[g];
        EXPECT_TRUE(g == 0 || group.slidingWindow > layout.groups[g - 1].slidingWindow) << "group " << g;
        EXPECT_FALSE(group.layers.empty()) << "group " << g;
        EXPECT_TRUE(
            std::adjacent_find(group.layers.begin(), group.layers.end(), std::greater_equal<>()) == group.layers.end())
            << "group " << g;
        EXPECT_EQ(group.minPages, int64_t{config.maxBatchSize} * group.pagesPerSequence) << "group " << g;
        EXPECT_EQ(group.cacheBytes, group.numPages * group.bytesPerPage) << "group " << g;
        groupBytes += group.cacheBytes;
        groupBytesPerPage += group.bytesPerPage;
        largestCapacity = std::max<int64_t>(largestCapacity, group.slotTokens);
    }
    EXPECT_EQ(layout.cacheBytes, groupBytes);
    EXPECT_EQ(layout.bytesPerPage, groupBytesPerPage);
    if (!layout.groups.empty())
    {
        EXPECT_EQ(layout.capPadded, largestCapacity);
        EXPECT_EQ(layout.pagesPerSlot, layout.groups[0].pagesPerSequence);
        EXPECT_EQ(layout.minPages, layout.groups[0].minPages);
        EXPECT_EQ(layout.numPages, layout.groups[0].numPages);
    }
    // Group 0 is full attention exactly when some layer is, and then capPadded is a full slot.
    bool const anyFull = std::any_of(config.layerConfigs.begin(), config.layerConfigs.end(),
        [](KVLayerConfig const& layer) { return layer.slidingWindow == 0; });
    if (!layout.groups.empty())
    {
        EXPECT_EQ(layout.groups[0].slidingWindow == 0, anyFull);
    }
    if (anyFull)
    {
        EXPECT_EQ(layout.capPadded, pagesFor(config.maxSequenceLength, pageSize) * pageSize);
    }

    // Layers: their kind as asked, their group's window, slotTokens and pages, K alone when latent.
    for (size_t i = 0; i < std::min(layout.layers.size(), config.layerConfigs.size()); ++i)
    {
        KVLayerLayout const& layer = layout.layers[i];
        KVLayerConfig const& asked = config.layerConfigs[i];
        KVPageGroupLayout const& group = layout.groups.at(static_cast<size_t>(layer.group));
        std::string const where = "layer " + std::to_string(i);
        EXPECT_EQ(layer.kind, asked.kind) << where;
        EXPECT_EQ(layer.numHalves, asked.kind == KVLayerKind::kLATENT ? 1 : 2) << where;
        EXPECT_EQ(layer.layerBytes, layer.numHalves * layer.halfElems * e) << where;
        EXPECT_EQ(group.slidingWindow, asked.slidingWindow) << where;
        EXPECT_EQ(layer.slotTokens, group.slotTokens) << where;
        EXPECT_EQ(layer.numPages, group.numPages) << where;
        EXPECT_EQ(layer.halfElems, group.numPages * layer.pageElems) << where;
        EXPECT_EQ(std::count(group.layers.begin(), group.layers.end(), static_cast<int32_t>(i)), 1) << where;
    }
    return layout;
}

//! The KV cache element types.
constexpr std::array<DataType, 7> kCACHE_TYPES{DataType::kFLOAT, DataType::kHALF, DataType::kBF16, DataType::kFP8_E4M3,
    DataType::kFP8_E5M2, DataType::kINT8, DataType::kUINT8};

//! A random hybrid config: up to 8 layers, each full attention (unless `windowsOnly`) or one of three windows, a
//! quarter of them latent; a random step (0 a quarter of the time); page counts left to the caller.
KVCacheConfig randomHybridConfig(std::mt19937& rng, bool windowsOnly)
{
    auto const pick = [&rng](int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); };
    int32_t const pageSize = int32_t{1} << (pick(0, 2) == 0 ? pick(0, 10) : pick(3, 7));
    int32_t const sequence = pick(1, 3000);
    std::array<int32_t, 3> const windows{pick(1, 2 * sequence), pick(1, sequence), pick(1, std::max(1, sequence / 8))};
    std::vector<KVLayerConfig> layers(static_cast<size_t>(pick(1, 8)));
    for (KVLayerConfig& layer : layers)
    {
        int32_t const choice = pick(windowsOnly ? 1 : 0, 3);
        int32_t const window = choice == 0 ? 0 : windows[static_cast<size_t>(choice - 1)];
        layer = pick(0, 3) == 0 ? latentLayer(pick(1, 600), window) : kvLayer(pick(1, 16), pick(1, 256), window);
    }
    return test::ConfigBuilder(layers)
        .maxBatchSize(pick(1, 16))
        .maxSequenceLength(sequence)
        .tokensPerPage(pageSize)
        .dataType(kCACHE_TYPES[static_cast<size_t>(pick(0, static_cast<int32_t>(kCACHE_TYPES.size()) - 1))])
        .maxTokensPerStep(pick(0, 3) == 0 ? 0 : pick(1, sequence))
        .build();
}

TEST(PageGroups, RandomHybridConfigsMatchTheModel)
{
    std::mt19937 rng(31337U);
    int32_t threeOrMoreGroups = 0;
    int32_t windowsOnly = 0;
    int32_t retained = 0;
    int32_t latentWindowed = 0;
    for (int32_t trial = 0; trial < 300; ++trial)
    {
        KVCacheConfig config = randomHybridConfig(rng, trial % 4 == 3);
        // Page counts: a third each the minimum, per-group counts (0 or above the minimum), the scalar count.
        std::vector<test::ModelGroup> const groups = test::modelLayout(config).groups;
        int32_t const mode = trial % 3;
        for (test::ModelGroup const& group : groups)
        {
            bool const keepMinimum = mode == 0 || std::uniform_int_distribution<int32_t>(0, 2)(rng) == 0;
            auto const extra = static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, group.minPages)(rng));
            int32_t const pages = keepMinimum ? 0 : static_cast<int32_t>(group.minPages) + extra;
            if (mode == 1)
            {
                config.numPagesPerGroup.push_back(pages);
            }
            else if (mode == 2 && groups.size() == 1)
            {
                config.numPages = pages;
            }
            else
            {
                continue;
            }
            retained += pages > group.minPages ? 1 : 0;
        }
        SCOPED_TRACE("trial " + std::to_string(trial) + ": S " + std::to_string(config.maxSequenceLength) + ", P "
            + std::to_string(config.tokensPerPage) + ", C " + std::to_string(config.maxTokensPerStep));
        KVCacheLayout const layout = expectGroupsMatchModel(config);
        threeOrMoreGroups += layout.groups.size() >= 3 ? 1 : 0;
        windowsOnly += layout.groups.at(0).slidingWindow > 0 ? 1 : 0;
        latentWindowed +=
            std::any_of(layout.layers.begin(), layout.layers.end(),
                [](KVLayerLayout const& layer) { return layer.numHalves == 1 && layer.slidingWindow > 0; })
            ? 1
            : 0;
    }
    EXPECT_GT(threeOrMoreGroups, 50);
    EXPECT_GT(windowsOnly, 50);
    EXPECT_GT(retained, 50);
    EXPECT_GT(latentWindowed, 50);
}

//! One group's fields worked out by hand: window, pagesPerSequence, slotTokens, minPages, numPages, bytesPerPage,
//! cacheBytes, layers.
using GroupByHand = std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t, int64_t, int64_t, std::vector<int32_t>>;

//! One layer's fields worked out by hand: group, numHalves, slotTokens, numPages, pageElems, halfElems, layerBytes.
using LayerByHand = std::tuple<int32_t, int32_t, int32_t, int32_t, int64_t, int64_t, int64_t>;

void expectGroupsByHand(KVCacheLayout const& layout, std::vector<GroupByHand> const& groups)
{
    std::vector<GroupByHand> actual;
    for (KVPageGroupLayout const& g : layout.groups)
    {
        actual.emplace_back(g.slidingWindow, g.pagesPerSequence, g.slotTokens, g.minPages, g.numPages, g.bytesPerPage,
            g.cacheBytes, g.layers);
    }
    EXPECT_EQ(actual, groups);
}

void expectLayerByHand(KVCacheLayout const& layout, int32_t index, LayerByHand const& hand)
{
    KVLayerLayout const& l = layout.layers.at(static_cast<size_t>(index));
    EXPECT_EQ(LayerByHand(l.group, l.numHalves, l.slotTokens, l.numPages, l.pageElems, l.halfElems, l.layerBytes), hand)
        << "layer " << index;
}

//! gpt-oss-like: 24 bf16 layers of 8 x 64, window 128 on even layers and full attention on odd ones; 8 slots of 8192
//! tokens in pages of 128, prefill chunks of 2048.
KVCacheConfig gptOssLike()
{
    std::vector<KVLayerConfig> layers;
    for (int32_t i = 0; i < 24; ++i)
    {
        layers.push_back(kvLayer(8, 64, i % 2 == 0 ? 128 : 0));
    }
    return test::ConfigBuilder(layers)
        .maxBatchSize(8)
        .maxSequenceLength(8192)
        .tokensPerPage(128)
        .dataType(DataType::kBF16)
        .maxTokensPerStep(2048)
        .build();
}

std::vector<int32_t> everyOtherLayer(int32_t first)
{
    std::vector<int32_t> layers;
    for (int32_t i = first; i < 24; i += 2)
    {
        layers.push_back(i);
    }
    return layers;
}

TEST(PageGroups, GptOssLikeByHand)
{
    // A page of one half: 128 tokens x 8 x 64 = 65536 values, 131072 bytes; K and V of one page id: 262144 bytes.
    // Group 0 (full, the 12 odd layers): 8192 / 128 = 64 pages a slot, 8 x 64 = 512 pages, 12 x 262144 = 3145728
    // bytes a page id; a layer holds 2 x 512 x 65536 x 2 = 134217728 bytes, the group 12 x 134217728 = 1610612736.
    // Group 1 (window 128, the 12 even layers): 127 + 2048 = 2175 tokens, min(64, ceil(2175 / 128) + 1 = 18) = 18
    // pages (a ring of 2304 tokens), 8 x 18 = 144 pages; a layer holds 2 x 144 x 65536 x 2 = 37748736 bytes, the
    // group 12 x 37748736 = 452984832.
    KVCacheConfig const config = gptOssLike();
    KVCacheLayout const layout = expectGroupsMatchModel(config);
    expectGroupsByHand(layout,
        {{0, 64, 8192, 512, 512, 3145728, 1610612736, everyOtherLayer(1)},
            {128, 18, 2304, 144, 144, 3145728, 452984832, everyOtherLayer(0)}});
    expectLayerByHand(layout, 0, {1, 2, 2304, 144, 65536, 9437184, 37748736});
    expectLayerByHand(layout, 1, {0, 2, 8192, 512, 65536, 33554432, 134217728});
    expectLayerByHand(layout, 23, {0, 2, 8192, 512, 65536, 33554432, 134217728});
    EXPECT_EQ(layout.capPadded, 8192);
    EXPECT_EQ(layout.pagesPerSlot, 64);
    EXPECT_EQ(layout.minPages, 512);
    EXPECT_EQ(layout.numPages, 512);
    EXPECT_EQ(layout.maxTokensPerStep, 2048);
    EXPECT_EQ(layout.cacheBytes, 2063597568); // 1610612736 + 452984832
    EXPECT_EQ(layout.bytesPerPage, 6291456);  // 2 x 3145728

    // Without a step bound a whole prompt may arrive at once: min(64, ceil((127 + 8192) / 128) + 1 = 66) = 64 pages.
    KVCacheConfig unbounded = config;
    unbounded.maxTokensPerStep = 0;
    KVCacheLayout const full = expectGroupsMatchModel(unbounded);
    EXPECT_EQ(full.maxTokensPerStep, 8192);
    EXPECT_EQ(full.groups.at(1).pagesPerSequence, 64);
    EXPECT_EQ(full.cacheBytes, 2 * int64_t{1610612736});
}

TEST(PageGroups, DeepSeekLikeLatentLayersByHand)
{
    // 61 fp16 latent layers of 576 values a token (kv_lora_rank 512 + rope 64), K only; 4 slots of 4096 tokens in
    // pages of 64: 64 pages a slot, 256 pages. A page: 64 x 576 = 36864 values, 73728 bytes; a layer holds 256 x
    // 36864 = 9437184 values, 18874368 bytes; a page id costs 61 x 73728 = 4497408 bytes, the cache 61 x 18874368 =
    // 1151336448.
    std::vector<KVLayerConfig> const layers(61, latentLayer(576));
    KVCacheConfig const config =
        test::ConfigBuilder(layers).maxBatchSize(4).maxSequenceLength(4096).tokensPerPage(64).build();
    KVCacheLayout const layout = expectGroupsMatchModel(config);
    std::vector<int32_t> all(61);
    for (int32_t i = 0; i < 61; ++i)
    {
        all[static_cast<size_t>(i)] = i;
    }
    expectGroupsByHand(layout, {{0, 64, 4096, 256, 256, 4497408, 1151336448, all}});
    expectLayerByHand(layout, 60, {0, 1, 4096, 256, 36864, 9437184, 18874368});
    EXPECT_EQ(layout.cacheBytes, 1151336448);
    EXPECT_EQ(layout.bytesPerPage, 4497408);
}

//! Full, latent and windowed layers of two windows, fp32, 2 slots of 300 tokens in pages of 16, steps of 8 tokens.
KVCacheConfig mixedModel()
{
    return test::ConfigBuilder({kvLayer(2, 64), latentLayer(96, 32), kvLayer(4, 16, 32), kvLayer(1, 32, 8)})
        .maxBatchSize(2)
        .maxSequenceLength(300)
        .tokensPerPage(16)
        .dataType(DataType::kFLOAT)
        .maxTokensPerStep(8)
        .build();
}

TEST(PageGroups, MixedKindsAndWindowsByHand)
{
    // Full: ceil(300 / 16) = 19 pages (304 tokens), 38 pages. Window 8: 7 + 8 = 15 tokens, ceil(15 / 16) + 1 = 2 pages
    // (32 tokens), 4 pages. Window 32: 31 + 8 = 39 tokens, ceil(39 / 16) + 1 = 4 pages (64 tokens), 8 pages.
    // Groups in ascending window: 0 full {0}, 1 window 8 {3}, 2 window 32 {1, 2}.
    // Layer 0 (KV 2 x 64): page 16 x 128 = 2048 values, 8192 bytes; 38 pages: 77824 values, 2 x 77824 x 4 = 622592.
    // Layer 1 (latent 96): page 1536 values, 6144 bytes; 8 pages: 12288 values, 1 x 12288 x 4 = 49152.
    // Layer 2 (KV 4 x 16): page 1024 values, 4096 bytes; 8 pages: 8192 values, 2 x 8192 x 4 = 65536.
    // Layer 3 (KV 1 x 32): page 512 values, 2048 bytes; 4 pages: 2048 values, 2 x 2048 x 4 = 16384.
    // A page id: group 0 2 x 8192 = 16384; group 1 2 x 2048 = 4096; group 2 6144 + 2 x 4096 = 14336.
    KVCacheLayout const layout = expectGroupsMatchModel(mixedModel());
    expectGroupsByHand(layout,
        {{0, 19, 304, 38, 38, 16384, 622592, {0}}, {8, 2, 32, 4, 4, 4096, 16384, {3}},
            {32, 4, 64, 8, 8, 14336, 114688, {1, 2}}});
    expectLayerByHand(layout, 0, {0, 2, 304, 38, 2048, 77824, 622592});
    expectLayerByHand(layout, 1, {2, 1, 64, 8, 1536, 12288, 49152});
    expectLayerByHand(layout, 2, {2, 2, 64, 8, 1024, 8192, 65536});
    expectLayerByHand(layout, 3, {1, 2, 32, 4, 512, 2048, 16384});
    EXPECT_EQ(layout.capPadded, 304);
    EXPECT_EQ(layout.cacheBytes, 753664);  // 622592 + 16384 + 114688
    EXPECT_EQ(layout.bytesPerPage, 34816); // 16384 + 4096 + 14336

    // Per-group pages {40, 0 (the minimum 4), 9}: 40 x 16384 + 4 x 4096 + 9 x 14336 = 800768 bytes.
    KVCacheConfig retained = mixedModel();
    retained.numPagesPerGroup = {40, 0, 9};
    KVCacheLayout const more = expectGroupsMatchModel(retained);
    expectGroupsByHand(more,
        {{0, 19, 304, 38, 40, 16384, 655360, {0}}, {8, 2, 32, 4, 4, 4096, 16384, {3}},
            {32, 4, 64, 8, 9, 14336, 129024, {1, 2}}});
    expectLayerByHand(more, 1, {2, 1, 64, 9, 1536, 13824, 55296});
    EXPECT_EQ(more.numPages, 40);
    EXPECT_EQ(more.minPages, 38);
    EXPECT_EQ(more.cacheBytes, 800768);
}

TEST(PageGroups, OnlyWindowedLayersHaveNoFullGroup)
{
    // fp16, 3 slots of 1000 tokens in pages of 32, steps of 16. Window 16: 15 + 16 = 31 tokens, ceil(31 / 32) + 1 = 2
    // pages (64 tokens); window 64: 63 + 16 = 79 tokens, ceil(79 / 32) + 1 = 4 pages (128 tokens). The smallest window
    // is group 0 and capPadded is the longest ring, not the 1024 tokens of a full slot.
    KVCacheConfig const config = test::ConfigBuilder({kvLayer(2, 32, 64), kvLayer(2, 32, 16), latentLayer(40, 64)})
                                     .maxBatchSize(3)
                                     .maxSequenceLength(1000)
                                     .tokensPerPage(32)
                                     .maxTokensPerStep(16)
                                     .build();
    KVCacheLayout const layout = expectGroupsMatchModel(config);
    // A page of layer 0 or 1: 32 x 64 = 2048 values, 4096 bytes; of layer 2: 32 x 40 = 1280 values, 2560 bytes.
    expectGroupsByHand(
        layout, {{16, 2, 64, 6, 6, 8192, 6 * 8192, {1}}, {64, 4, 128, 12, 12, 10752, 12 * 10752, {0, 2}}});
    EXPECT_EQ(layout.capPadded, 128);
    EXPECT_EQ(layout.pagesPerSlot, 2);
    EXPECT_EQ(layout.minPages, 6);
    EXPECT_EQ(layout.numPages, 6);
}

// ---------------------------------------------------------------------------------------------------------------
// Latent layers

TEST(LatentLayout, HoldOneHalfOfAKVLayerOfTheSameShape)
{
    for (int32_t const window : {0, 20})
    {
        SCOPED_TRACE("window " + std::to_string(window));
        // bf16, 2 slots of 100 tokens in pages of 8, steps of 4: the same shape as a latent layer and as a KV layer.
        test::ConfigBuilder builder({latentLayer(576, window), kvLayer(1, 576, window)});
        KVCacheConfig const config = builder.maxBatchSize(2)
                                         .maxSequenceLength(100)
                                         .tokensPerPage(8)
                                         .dataType(DataType::kBF16)
                                         .maxTokensPerStep(4);
        KVCacheLayout const layout = expectGroupsMatchModel(config);
        KVLayerLayout const& latent = layout.layers[0];
        KVLayerLayout const& kv = layout.layers[1];
        EXPECT_EQ(latent.kind, KVLayerKind::kLATENT);
        EXPECT_EQ(latent.numHalves, 1);
        EXPECT_EQ(kv.numHalves, 2);
        EXPECT_EQ(latent.halfElems, kv.halfElems);
        EXPECT_EQ(latent.layerBytes, latent.halfElems * 2);
        EXPECT_EQ(2 * latent.layerBytes, kv.layerBytes);
        // One group: a page id costs one latent half and two KV halves.
        ASSERT_EQ(layout.groups.size(), 1U);
        EXPECT_EQ(layout.groups[0].bytesPerPage, 3 * latent.pageBytes);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Validation: InvalidConfigError naming the field, the value and the limit, before anything is allocated

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

// ---------------------------------------------------------------------------------------------------------------
// Budget

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

// ---------------------------------------------------------------------------------------------------------------
// One group: the layout before hybrid models

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
