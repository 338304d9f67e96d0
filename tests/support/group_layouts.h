#pragma once

// What the tests of page groups (tests/core/test_layout_*.cpp) share: layers and configs made by hand or at random, and
// expectGroupsMatchModel, which checks every field of a layout against the independent model
// (tests/support/layout_model.h) and the rules that tie the fields together.

#include "kvcache/core/data_type.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/layout_expectations.h"
#include "support/layout_model.h"

// Inside the library's namespace, as the tests that use it are, so that the helpers name its types as they do.
namespace kvcache::rt::group_layouts
{

inline constexpr int64_t kPAGE_ID_LIMIT = kMAX_NUM_PAGES; // 1073741823

//! A K-and-V layer of `heads` x `dim` values a token and half; `window` 0 is full attention.
inline KVLayerConfig kvLayer(int32_t heads, int32_t dim, int32_t window = 0)
{
    return KVLayerConfig{heads, dim, window, KVLayerKind::kKV};
}

//! A latent layer of `dim` values a token (one head, K only); `window` 0 is full attention.
inline KVLayerConfig latentLayer(int32_t dim, int32_t window = 0)
{
    return KVLayerConfig{1, dim, window, KVLayerKind::kLATENT};
}

//! Pages of `tokens` tokens, counted one page at a time.
inline int64_t pagesFor(int64_t tokens, int64_t tokensPerPage)
{
    int64_t pages = 0;
    while (pages * tokensPerPage < tokens)
    {
        ++pages;
    }
    return pages;
}

//! Expects every field of `config`'s layout to match the model (the whole cache, each group, each layer), and the
//! rules that tie the fields together to hold; returns the layout.
inline KVCacheLayout expectGroupsMatchModel(KVCacheConfig const& config)
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
inline constexpr std::array<DataType, 7> kCACHE_TYPES{DataType::kFLOAT, DataType::kHALF, DataType::kBF16,
    DataType::kFP8_E4M3, DataType::kFP8_E5M2, DataType::kINT8, DataType::kUINT8};

//! A random hybrid config: up to 8 layers, each full attention (unless `windowsOnly`) or one of three windows, a
//! quarter of them latent; a random step (0 a quarter of the time); page counts left to the caller.
inline KVCacheConfig randomHybridConfig(std::mt19937& rng, bool windowsOnly)
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

//! gpt-oss-like: 24 bf16 layers of 8 x 64, window 128 on even layers and full attention on odd ones; 8 slots of 8192
//! tokens in pages of 128, prefill chunks of 2048.
inline KVCacheConfig gptOssLike()
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

//! Full, latent and windowed layers of two windows, fp32, 2 slots of 300 tokens in pages of 16, steps of 8 tokens.
inline KVCacheConfig mixedModel()
{
    return test::ConfigBuilder({kvLayer(2, 64), latentLayer(96, 32), kvLayer(4, 16, 32), kvLayer(1, 32, 8)})
        .maxBatchSize(2)
        .maxSequenceLength(300)
        .tokensPerPage(16)
        .dataType(DataType::kFLOAT)
        .maxTokensPerStep(8)
        .build();
}

} // namespace kvcache::rt::group_layouts
