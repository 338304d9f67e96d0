// The page anatomy of every quantization, on the host (no GPU): which entries a page holds and where each sits in a
// packed page (a host page, a file's page record) against the tests' layout model, page bytes against numbers worked
// out by hand, the layer table built from it, and the geometry identity: equality, the first difference, the
// fingerprint.

#include "core/layout/page_anatomy.h"
#include "memory/cache/layer_table.h"

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/core/page_geometry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/layout_model.h"
#include "support/scaled_configs.h"

namespace kvcache::test
{
namespace
{

std::vector<int64_t> offsetsOf(rt::detail::PageAnatomy const& anatomy)
{
    std::vector<int64_t> offsets;
    for (rt::detail::PageEntry const& entry : anatomy.entries)
    {
        offsets.push_back(entry.offset);
    }
    return offsets;
}

TEST(PageAnatomyTest, EntriesAreEveryLayersDataThenEveryLayersScalesOfEveryFormatAndGroup)
{
    for (ScaledFormat const format : kEVERY_FORMAT)
    {
        SCOPED_TRACE(nameOf(format));
        rt::KVCacheConfig const config = scaledConfig(format);
        rt::KVCacheLayout const layout = rt::computeLayout(config);
        LayoutModel const model = modelLayout(config);
        bool const scaled = format.quantization == rt::KVQuantization::kFP8_PER_TOKEN_HEAD
            || format.quantization == rt::KVQuantization::kNVFP4;
        for (int32_t group = 0; group < 3; ++group)
        {
            SCOPED_TRACE("group " + std::to_string(group));
            ModelGroup const& modelGroup = model.groups[static_cast<size_t>(group)];
            // From the model: K then V data pages of each layer in order, then, with scales, K then V scale pages.
            std::vector<int64_t> offsets;
            int64_t offset = 0;
            int64_t largest = 0;
            int64_t halves = 0;
            for (bool const scales : {false, true})
            {
                if (scales && !scaled)
                {
                    continue;
                }
                for (int32_t const layer : modelGroup.layers)
                {
                    ModelLayer const& m = model.layers[static_cast<size_t>(layer)];
                    int64_t const pageBytes = scales ? m.scalePageBytes : m.pageBytes;
                    offsets.push_back(offset);
                    offset += m.numHalves * pageBytes;
                    halves += m.numHalves;
                    largest = std::max(largest, pageBytes);
                }
            }
            rt::detail::PageAnatomy const anatomy = rt::detail::pageAnatomy(layout, group);
            EXPECT_EQ(offsetsOf(anatomy), offsets);
            EXPECT_EQ(anatomy.largestHalfBytes, largest);
            EXPECT_EQ(anatomy.bytesPerPage, offset);
            EXPECT_EQ(anatomy.halves, halves);
            // Exact bytes: a packed page is the group's page, data and scales, with nothing between or after.
            EXPECT_EQ(anatomy.bytesPerPage, modelGroup.bytesPerPage);
            EXPECT_EQ(anatomy.bytesPerPage, layout.groups[static_cast<size_t>(group)].bytesPerPage);
            EXPECT_EQ(anatomy.bytesPerPage, rt::pageGeometry(layout, group).bytesPerPage);
            // One entry per table entry, in the table's order: the kernels walk the table with these offsets.
            EXPECT_EQ(static_cast<int64_t>(anatomy.entries.size()), rt::detail::groupTableEntries(layout, group));
        }
    }
}

TEST(PageAnatomyTest, PageBytesOfEachFormatMatchNumbersWorkedOutByHand)
{
    // One KV layer of 8 heads of 128 and one latent layer of 576 values, 16 tokens a page.
    struct Case
    {
        ScaledFormat format;
        int64_t kvBytes;     // K and V of the KV layer: data, then scales
        int64_t latentBytes; // the latent layer's one half
        int64_t kvScaleBytes;
        int64_t latentScaleBytes;
    };
    std::vector<Case> const cases{
        // 2 * 16 * 8 * 128 * 2 = 65536; 16 * 576 * 2 = 18432.
        {kEVERY_FORMAT[0], 65536, 18432, 0, 0},
        // One byte a value: 32768 and 9216.
        {kEVERY_FORMAT[1], 32768, 9216, 0, 0},
        {kEVERY_FORMAT[2], 32768, 9216, 0, 0},
        // A float32 a token and head: 2 * 16 * 8 * 4 = 1024 and 16 * 1 * 4 = 64.
        {kEVERY_FORMAT[3], 32768, 9216, 1024, 64},
        // Two values a byte: 16384 and 4608; an FP8 block scale a 16 values: 2 * 16 * 8 * 8 = 2048, 16 * 36 = 576.
        {kEVERY_FORMAT[4], 16384, 4608, 2048, 576},
    };
    for (Case const& c : cases)
    {
        SCOPED_TRACE(nameOf(c.format));
        rt::KVCacheLayout const layout =
            rt::computeLayout(ConfigBuilder({{8, 128}, {1, 576, 0, rt::KVLayerKind::kLATENT}})
                                  .tokensPerPage(16)
                                  .dataType(c.format.storage)
                                  .quantization(c.format.quantization));
        rt::detail::PageAnatomy const anatomy = rt::detail::pageAnatomy(layout, 0);
        int64_t const dataBytes = c.kvBytes + c.latentBytes;
        EXPECT_EQ(anatomy.bytesPerPage, dataBytes + c.kvScaleBytes + c.latentScaleBytes);
        std::vector<int64_t> expected{0, c.kvBytes};
        if (c.kvScaleBytes > 0)
        {
            expected.push_back(dataBytes);
            expected.push_back(dataBytes + c.kvScaleBytes);
        }
        EXPECT_EQ(offsetsOf(anatomy), expected);
    }
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [] {
            rt::detail::pageAnatomy(rt::computeLayout(ConfigBuilder({{1, 16}})), 1);
        },
        {"group is 1", "[0, 1)"}));
}

TEST(PageAnatomyTest, PageGeometriesRecordTheQuantizationAndTellEqualBytesApart)
{
    auto const geometryOf = [](ScaledFormat format)
    { return rt::pageGeometry(rt::computeLayout(scaledConfig(format)), 0); };
    for (ScaledFormat const format : kEVERY_FORMAT)
    {
        EXPECT_EQ(geometryOf(format).quantization, format.quantization) << nameOf(format);
    }
    // Unscaled FP8 and per-tensor FP8 pages hold the same bytes; their values read differently.
    rt::PageGeometry const plain = geometryOf(kEVERY_FORMAT[1]);
    rt::PageGeometry const perTensor = geometryOf(kEVERY_FORMAT[2]);
    EXPECT_EQ(plain.bytesPerPage, perTensor.bytesPerPage);
    EXPECT_FALSE(plain == perTensor);
    EXPECT_TRUE(plain != perTensor);
    rt::PageGeometry relabelled = plain;
    relabelled.quantization = rt::KVQuantization::kFP8_PER_TENSOR;
    EXPECT_EQ(relabelled, perTensor);
}

TEST(PageAnatomyTest, LayerTableEntriesPointAtEachLayersPoolsInTheAnatomysOrder)
{
    // Two groups (full attention: a KV and a latent layer; a window: one KV layer), NVFP4: every layer has a data and a
    // scale pool. Bases are distinct made-up addresses; the table is built on the host only.
    rt::KVCacheLayout const layout =
        rt::computeLayout(ConfigBuilder({{8, 128}, {1, 576, 0, rt::KVLayerKind::kLATENT}, {2, 64, 32}})
                              .tokensPerPage(16)
                              .dataType(rt::DataType::kUINT8)
                              .quantization(rt::KVQuantization::kNVFP4));
    std::vector<char*> dataBases;
    std::vector<char*> scaleBases;
    static char pools[6][1];
    for (size_t layer = 0; layer < 3; ++layer)
    {
        dataBases.push_back(pools[layer]);
        scaleBases.push_back(pools[3 + layer]);
    }
    std::vector<rt::detail::LayerTableEntry> const table = rt::detail::layerTableEntries(layout, dataBases, scaleBases);
    // Group 0: layer 0 data, layer 1 data, layer 0 scales, layer 1 scales; group 1: layer 2 data, layer 2 scales.
    struct Expected
    {
        char* base;
        int64_t pageBytes;
        bool hasV;
    };
    // 16 tokens x heads x headDim / 2 bytes of values; 16 x heads x headDim / 16 bytes of block scales.
    std::vector<Expected> const expected{{pools[0], 16 * 8 * 64, true}, {pools[1], 16 * 288, false},
        {pools[3], 16 * 8 * 8, true}, {pools[4], 16 * 36, false}, {pools[2], 16 * 2 * 32, true},
        {pools[5], 16 * 2 * 4, true}};
    ASSERT_EQ(table.size(), expected.size());
    for (size_t i = 0; i < table.size(); ++i)
    {
        SCOPED_TRACE("entry " + std::to_string(i));
        EXPECT_EQ(table[i].kBase, expected[i].base);
        EXPECT_EQ(table[i].pageBytes(), expected[i].pageBytes);
        EXPECT_EQ(table[i].hasV(), expected[i].hasV);
        // Page 5's V half of a group of 10 pages: 15 pages of this entry's size after the K pool's start.
        EXPECT_EQ(table[i].halfAddress(1, 10, 5), expected[i].base + 15 * expected[i].pageBytes);
    }
}

TEST(PageAnatomyTest, GeometryDifferenceNamesTheFirstFieldThatDiffersWithBothValues)
{
    rt::PageGeometry const base = rt::pageGeometry(
        rt::computeLayout(ConfigBuilder({{8, 128}, {4, 64}}).tokensPerPage(16).dataType(rt::DataType::kHALF)), 0);
    EXPECT_EQ(rt::pageGeometryDifference(base, base), "");
    rt::PageGeometry other = base;
    other.layers[1].headDim = 32;
    EXPECT_EQ(rt::pageGeometryDifference(base, other, "the cache", "the tier"),
        "layers[1].headDim is 64 in the cache and 32 in the tier");
    // An earlier field is named first.
    other.tokensPerPage = 32;
    EXPECT_EQ(rt::pageGeometryDifference(base, other, "a", "b"), "tokensPerPage is 16 in a and 32 in b");
    other = base;
    other.quantization = rt::KVQuantization::kFP8_PER_TENSOR;
    EXPECT_EQ(rt::pageGeometryDifference(base, other, "a", "b"), "quantization is none in a and fp8_per_tensor in b");
    other = base;
    other.layers.pop_back();
    EXPECT_EQ(rt::pageGeometryDifference(base, other, "a", "b"), "the number of layers is 2 in a and 1 in b");
    other = base;
    other.bytesPerPage += 1;
    EXPECT_EQ(rt::pageGeometryDifference(base, other, "a", "b"), "bytesPerPage is 81920 in a and 81921 in b");
}

TEST(PageAnatomyTest, FingerprintIsTheDocumentedHashAndChangesWithEveryField)
{
    rt::PageGeometry const base = rt::pageGeometry(
        rt::computeLayout(ConfigBuilder({{2, 64}}).tokensPerPage(16).dataType(rt::DataType::kHALF)), 0);
    // FNV-1a over the documented little-endian encoding, computed here byte by byte.
    std::vector<uint8_t> bytes;
    auto const put = [&](uint64_t value, int32_t size)
    {
        for (int32_t i = 0; i < size; ++i)
        {
            bytes.push_back(static_cast<uint8_t>(value >> (8 * i)));
        }
    };
    put(static_cast<uint32_t>(rt::DataType::kHALF), 4);
    put(0, 4);  // kNONE
    put(16, 4); // tokensPerPage
    put(0, 4);  // slidingWindow
    put(1, 4);  // layers
    put(0, 4);  // kKV
    put(2, 4);
    put(64, 4);
    put(2 * 16 * 2 * 64 * 2, 8); // bytesPerPage
    uint64_t hash = 14695981039346656037ull;
    for (uint8_t const byte : bytes)
    {
        hash = (hash ^ byte) * 1099511628211ull;
    }
    EXPECT_EQ(rt::pageGeometryFingerprint(base), hash);
    std::vector<rt::PageGeometry> changed(7, base);
    changed[0].dataType = rt::DataType::kBF16;
    changed[1].quantization = rt::KVQuantization::kFP8_PER_TENSOR;
    changed[2].tokensPerPage = 32;
    changed[3].slidingWindow = 128;
    changed[4].layers[0].numKVHeads = 4;
    changed[5].layers[0].headDim = 128;
    changed[6].bytesPerPage += 2;
    for (rt::PageGeometry const& geometry : changed)
    {
        EXPECT_NE(rt::pageGeometryFingerprint(geometry), hash) << rt::pageGeometryDifference(base, geometry);
    }
}

// A state slot: two state layers of 4 slots (3 sequences + 1 checkpoint). Layer 0: conv [8, 3] bfloat16 = 48 bytes a
// slot, 192 in all, so recurrent [2, 4, 4] float32 = 128 bytes a slot starts at 256 (the next multiple of 256);
// layer 1: one float32 tensor [5] = 20 bytes a slot. Packed: 0, 48, 48 + 128 = 176; 196 bytes.
TEST(StateSlotAnatomy, PacksEveryStateTensorInLayoutOrder)
{
    rt::KVCacheConfig const config =
        ConfigBuilder({rt::KVLayerConfig{2, 64}})
            .maxBatchSize(3)
            .maxSequenceLength(64)
            .tokensPerPage(16)
            .stateLayers({rt::StateLayerConfig{{rt::StateTensorConfig{"conv", {8, 3}, rt::DataType::kBF16},
                              rt::StateTensorConfig{"recurrent", {2, 4, 4}, rt::DataType::kFLOAT}}},
                rt::StateLayerConfig{{rt::StateTensorConfig{"ssm", {5}, rt::DataType::kFLOAT}}}})
            .numCheckpointSlots(1)
            .build();
    rt::KVCacheLayout const layout = rt::computeLayout(config);
    rt::detail::StateSlotAnatomy const anatomy = rt::detail::stateSlotAnatomy(layout);
    ASSERT_EQ(anatomy.entries.size(), 3U);
    struct Expected
    {
        int32_t layer, tensor;
        int64_t bytes, layerOffset, offset;
    };
    Expected const expected[] = {{0, 0, 48, 0, 0}, {0, 1, 128, 256, 48}, {1, 0, 20, 0, 176}};
    for (size_t i = 0; i < 3; ++i)
    {
        SCOPED_TRACE(i);
        rt::detail::StateSlotEntry const& entry = anatomy.entries[i];
        EXPECT_EQ(entry.stateLayer, expected[i].layer);
        EXPECT_EQ(entry.tensor, expected[i].tensor);
        EXPECT_EQ(entry.bytes, expected[i].bytes);
        EXPECT_EQ(entry.layerOffset, expected[i].layerOffset);
        EXPECT_EQ(entry.offset, expected[i].offset);
    }
    EXPECT_EQ(anatomy.bytesPerSlot, 196);
    EXPECT_EQ(anatomy.bytesPerSlot, layout.stateBytesPerSlot);
}

TEST(StateSlotAnatomy, IsEmptyWithoutStateLayers)
{
    rt::KVCacheLayout const layout = rt::computeLayout(
        ConfigBuilder({rt::KVLayerConfig{2, 64}}).maxBatchSize(2).maxSequenceLength(64).tokensPerPage(16).build());
    rt::detail::StateSlotAnatomy const anatomy = rt::detail::stateSlotAnatomy(layout);
    EXPECT_TRUE(anatomy.entries.empty());
    EXPECT_EQ(anatomy.bytesPerSlot, 0);
}

} // namespace
} // namespace kvcache::test
