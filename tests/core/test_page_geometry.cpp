// PageGeometry: what a page of one group is, built from layouts that differ in one field each; equality sees every
// field and nothing else (the pool size is not part of a page).

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/core/page_geometry.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::ConfigBuilder;
using kvcache::test::throwsNaming;

//! Two KV layers of full attention, float16, 16 tokens a page.
ConfigBuilder baseConfig()
{
    return ConfigBuilder({{2, 64, 0, rt::KVLayerKind::kKV}, {4, 32, 0, rt::KVLayerKind::kKV}})
        .tokensPerPage(16)
        .maxSequenceLength(256)
        .dataType(rt::DataType::kHALF);
}

rt::PageGeometry geometryOf(rt::KVCacheConfig const& config, int32_t group = 0)
{
    return rt::pageGeometry(rt::computeLayout(config), group);
}

TEST(PageGeometryTest, BuiltFromALayoutMatchesTheFormulas)
{
    rt::PageGeometry const geometry = geometryOf(baseConfig());
    EXPECT_EQ(geometry.dataType, rt::DataType::kHALF);
    EXPECT_EQ(geometry.tokensPerPage, 16);
    EXPECT_EQ(geometry.slidingWindow, 0);
    ASSERT_EQ(geometry.layers.size(), 2u);
    EXPECT_EQ(geometry.layers[0], (rt::PageLayerGeometry{rt::KVLayerKind::kKV, 2, 64}));
    EXPECT_EQ(geometry.layers[1], (rt::PageLayerGeometry{rt::KVLayerKind::kKV, 4, 32}));
    // K and V, 16 tokens, 2 bytes: 2 * 16 * 2 * 64 * 2 = 8192 and 2 * 16 * 4 * 32 * 2 = 8192.
    EXPECT_EQ(geometry.bytesPerPage, 8192 + 8192);
}

TEST(PageGeometryTest, EqualLayoutsGiveEqualGeometriesWhateverTheirPoolSize)
{
    rt::PageGeometry const a = geometryOf(baseConfig());
    rt::PageGeometry const b = geometryOf(baseConfig().maxBatchSize(3).numPages(100));
    EXPECT_TRUE(a == b);
    EXPECT_FALSE(a != b);
}

TEST(PageGeometryTest, LayoutsThatDifferInOneFieldGiveUnequalGeometries)
{
    rt::PageGeometry const base = geometryOf(baseConfig());
    struct Case
    {
        std::string field;
        rt::KVCacheConfig config;
    };
    std::vector<Case> const cases = {
        {"dataType", baseConfig().dataType(rt::DataType::kBF16)},
        {"tokensPerPage", baseConfig().tokensPerPage(32)},
        {"numKVHeads",
            ConfigBuilder({{2, 64, 0, rt::KVLayerKind::kKV}, {8, 32, 0, rt::KVLayerKind::kKV}})
                .tokensPerPage(16)
                .maxSequenceLength(256)},
        {"headDim",
            ConfigBuilder({{2, 128, 0, rt::KVLayerKind::kKV}, {4, 32, 0, rt::KVLayerKind::kKV}})
                .tokensPerPage(16)
                .maxSequenceLength(256)},
        {"kind",
            ConfigBuilder({{2, 64, 0, rt::KVLayerKind::kKV}, {1, 256, 0, rt::KVLayerKind::kLATENT}})
                .tokensPerPage(16)
                .maxSequenceLength(256)},
        {"layer count", ConfigBuilder({{2, 64, 0, rt::KVLayerKind::kKV}}).tokensPerPage(16).maxSequenceLength(256)},
        {"slidingWindow",
            ConfigBuilder({{2, 64, 64, rt::KVLayerKind::kKV}, {4, 32, 64, rt::KVLayerKind::kKV}})
                .tokensPerPage(16)
                .maxSequenceLength(256)},
    };
    for (Case const& c : cases)
    {
        rt::PageGeometry const other = geometryOf(c.config);
        EXPECT_TRUE(base != other) << c.field;
        EXPECT_FALSE(base == other) << c.field;
    }
}

TEST(PageGeometryTest, EqualityLooksAtEveryField)
{
    rt::PageGeometry const base = geometryOf(baseConfig());
    std::vector<rt::PageGeometry> changed(7, base);
    changed[0].dataType = rt::DataType::kBF16;
    changed[1].tokensPerPage = 17;
    changed[2].slidingWindow = 64;
    changed[3].layers[1].numKVHeads = 5;
    changed[4].layers[0].headDim = 65;
    changed[5].layers[1].kind = rt::KVLayerKind::kLATENT;
    changed[6].bytesPerPage += 1;
    for (size_t i = 0; i < changed.size(); ++i)
    {
        EXPECT_NE(base, changed[i]) << "change " << i;
        EXPECT_EQ(changed[i], changed[i]) << "change " << i;
    }
    rt::PageGeometry swapped = base;
    std::swap(swapped.layers[0], swapped.layers[1]);
    EXPECT_NE(base, swapped) << "layer order";
}

TEST(PageGeometryTest, EachGroupOfAHybridLayoutHasItsOwnGeometry)
{
    // Full attention (group 0) and a 64-token window (group 1): the window and the layers differ.
    rt::KVCacheConfig const config =
        ConfigBuilder({{2, 64, 0, rt::KVLayerKind::kKV}, {4, 32, 64, rt::KVLayerKind::kKV}})
            .tokensPerPage(16)
            .maxSequenceLength(256);
    rt::PageGeometry const full = geometryOf(config, 0);
    rt::PageGeometry const windowed = geometryOf(config, 1);
    EXPECT_EQ(full.slidingWindow, 0);
    EXPECT_EQ(windowed.slidingWindow, 64);
    ASSERT_EQ(windowed.layers.size(), 1u);
    EXPECT_EQ(windowed.layers[0], (rt::PageLayerGeometry{rt::KVLayerKind::kKV, 4, 32}));
    EXPECT_EQ(windowed.bytesPerPage, 2 * 16 * 4 * 32 * 2);
    EXPECT_NE(full, windowed);
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] { rt::pageGeometry(rt::computeLayout(config), 2); }, {"group", "2", "[0, 2)"}));
    EXPECT_TRUE(
        throwsNaming<rt::OutOfRangeError>([&] { rt::pageGeometry(rt::computeLayout(config), -1); }, {"group", "-1"}));
}

} // namespace
