// Page groups (no GPU): full attention first, then each window in ascending order, with every per-group and
// per-layer field against the independent model, at random and by hand; and latent layers (K alone).
// The layers, configs and model check they share are tests/support/group_layouts.h.

#include "kvcache/core/data_type.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "support/group_layouts.h"

namespace kvcache::rt
{
namespace
{

using namespace group_layouts;

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

} // namespace
} // namespace kvcache::rt
