// The layer table of a quantized cache, built on the host (no GPU): per page group, its layers' data entries, then,
// with scale pools, their scale entries in the same order (docs/layout.md, "How every page operation carries
// scales"), checked against the tests' layout model; and which quantizations keep scale pools.

#include "core/layout/scale_support.h"
#include "memory/cache/layer_table.h"

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/layout_model.h"

namespace kvcache::rt
{
namespace
{

using detail::LayerTableEntry;

constexpr KVLayerKind kLATENT = KVLayerKind::kLATENT;

//! Layers in three page groups (full attention; windows 16 and 48), latent ones among them, every headDim a multiple
//! of 16, stored as `format` needs.
KVCacheConfig groupedConfig(KVQuantization quantization)
{
    DataType const storage = quantization == KVQuantization::kNVFP4 ? DataType::kUINT8
        : quantization == KVQuantization::kNONE                     ? DataType::kHALF
                                                                    : DataType::kFP8_E4M3;
    KVCacheConfig config = test::ConfigBuilder(
        {{2, 16}, {1, 32, 16}, {1, 48, 0, kLATENT}, {1, 64, 16, kLATENT}, {3, 16, 48}, {1, 32}, {1, 16, 48, kLATENT}})
                               .maxBatchSize(2)
                               .maxSequenceLength(200)
                               .tokensPerPage(16)
                               .dataType(storage)
                               .quantization(quantization)
                               .build();
    config.maxTokensPerStep = 8;
    config.numPagesPerGroup = {40, 12, 24};
    return config;
}

//! Distinct fake bases, never dereferenced: data of layer i at 0x1000 * (i + 1), scales at 0x100000 * (i + 1).
std::vector<char*> fakeBases(size_t layers, uintptr_t step)
{
    std::vector<char*> bases;
    for (size_t i = 0; i < layers; ++i)
    {
        bases.push_back(reinterpret_cast<char*>(step * (i + 1)));
    }
    return bases;
}

TEST(LayerTableScales, ScaledGroupsListDataEntriesThenScaleEntriesInLayerOrder)
{
    for (KVQuantization const quantization : {KVQuantization::kFP8_PER_TOKEN_HEAD, KVQuantization::kNVFP4})
    {
        SCOPED_TRACE(std::string(kvQuantizationName(quantization)));
        KVCacheConfig const config = groupedConfig(quantization);
        KVCacheLayout const layout = computeLayout(config);
        test::LayoutModel const model = test::modelLayout(config);
        std::vector<char*> const data = fakeBases(model.layers.size(), 0x1000);
        std::vector<char*> const scales = fakeBases(model.layers.size(), 0x100000);
        std::vector<LayerTableEntry> const entries = detail::layerTableEntries(layout, data, scales);
        ASSERT_EQ(entries.size(), 2 * model.layers.size());

        size_t position = 0;
        for (size_t g = 0; g < model.groups.size(); ++g)
        {
            std::vector<int32_t> const& layers = model.groups[g].layers;
            EXPECT_EQ(
                detail::groupTableEntries(layout, static_cast<int32_t>(g)), static_cast<int64_t>(2 * layers.size()));
            for (int32_t const layer : layers) // the data entries, as an unscaled cache has them
            {
                test::ModelLayer const& m = model.layers[static_cast<size_t>(layer)];
                LayerTableEntry const& entry = entries[position++];
                EXPECT_EQ(entry.kBase, data[static_cast<size_t>(layer)]) << "layer " << layer;
                EXPECT_EQ(entry.pageBytesAndV, m.pageBytes * 2 + (m.numHalves == 2 ? 1 : 0)) << "layer " << layer;
            }
            for (int32_t const layer : layers) // then the scale entries: a latent layer has no V scales
            {
                test::ModelLayer const& m = model.layers[static_cast<size_t>(layer)];
                ASSERT_GT(m.scalePageBytes, 0);
                LayerTableEntry const& entry = entries[position++];
                EXPECT_EQ(entry.kBase, scales[static_cast<size_t>(layer)]) << "scales of layer " << layer;
                EXPECT_EQ(entry.pageBytesAndV, m.scalePageBytes * 2 + (m.numHalves == 2 ? 1 : 0))
                    << "scales of layer " << layer;
            }
        }
    }
}

TEST(LayerTableScales, CachesWithoutScalePoolsKeepOneEntryALayer)
{
    for (KVQuantization const quantization : {KVQuantization::kNONE, KVQuantization::kFP8_PER_TENSOR})
    {
        SCOPED_TRACE(std::string(kvQuantizationName(quantization)));
        KVCacheConfig const config = groupedConfig(quantization);
        KVCacheLayout const layout = computeLayout(config);
        test::LayoutModel const model = test::modelLayout(config);
        std::vector<char*> const data = fakeBases(model.layers.size(), 0x1000);
        std::vector<LayerTableEntry> const entries = detail::layerTableEntries(layout, data, {});
        ASSERT_EQ(entries.size(), model.layers.size());
        size_t position = 0;
        for (size_t g = 0; g < model.groups.size(); ++g)
        {
            EXPECT_EQ(detail::groupTableEntries(layout, static_cast<int32_t>(g)),
                static_cast<int64_t>(model.groups[g].layers.size()));
            for (int32_t const layer : model.groups[g].layers)
            {
                test::ModelLayer const& m = model.layers[static_cast<size_t>(layer)];
                EXPECT_EQ(entries[position].kBase, data[static_cast<size_t>(layer)]);
                EXPECT_EQ(entries[position].pageBytesAndV, m.pageBytes * 2 + (m.numHalves == 2 ? 1 : 0));
                ++position;
            }
        }
    }
}

TEST(ScaleSupport, OnlyPerTokenHeadAndNvfp4KeepScalePools)
{
    EXPECT_FALSE(detail::keepsScalePools(KVQuantization::kNONE));
    EXPECT_FALSE(detail::keepsScalePools(KVQuantization::kFP8_PER_TENSOR));
    EXPECT_TRUE(detail::keepsScalePools(KVQuantization::kFP8_PER_TOKEN_HEAD));
    EXPECT_TRUE(detail::keepsScalePools(KVQuantization::kNVFP4));
}

} // namespace
} // namespace kvcache::rt
