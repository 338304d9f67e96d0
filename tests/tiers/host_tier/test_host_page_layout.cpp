// Host pages of every quantization, on the host (no GPU): where each layer's data and scale pages sit in a host page
// (the host tier kernel's entry offsets) against the tests' layout model, host page bytes against the formulas and
// numbers worked out by hand, and the page geometry that records the quantization.

#include "memory/cache/layer_table.h"
#include "tiers/host_tier/host_page_layout.h"

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

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::ConfigBuilder;
using kvcache::test::kEVERY_FORMAT;
using kvcache::test::nameOf;
using kvcache::test::ScaledFormat;
using kvcache::test::throwsNaming;

TEST(HostPageLayoutTest, EntriesAreEveryLayersDataThenEveryLayersScalesOfEveryFormatAndGroup)
{
    for (ScaledFormat const format : kEVERY_FORMAT)
    {
        SCOPED_TRACE(nameOf(format));
        rt::KVCacheConfig const config = kvcache::test::scaledConfig(format);
        rt::KVCacheLayout const layout = rt::computeLayout(config);
        kvcache::test::LayoutModel const model = kvcache::test::modelLayout(config);
        bool const scaled = format.quantization == rt::KVQuantization::kFP8_PER_TOKEN_HEAD
            || format.quantization == rt::KVQuantization::kNVFP4;
        for (int32_t group = 0; group < 3; ++group)
        {
            SCOPED_TRACE("group " + std::to_string(group));
            kvcache::test::ModelGroup const& modelGroup = model.groups[static_cast<size_t>(group)];
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
                    kvcache::test::ModelLayer const& m = model.layers[static_cast<size_t>(layer)];
                    int64_t const pageBytes = scales ? m.scalePageBytes : m.pageBytes;
                    offsets.push_back(offset);
                    offset += m.numHalves * pageBytes;
                    halves += m.numHalves;
                    largest = std::max(largest, pageBytes);
                }
            }
            rt::detail::HostPageLayout const hostPage = rt::detail::hostPageLayout(layout, group);
            EXPECT_EQ(hostPage.entryOffsets, offsets);
            EXPECT_EQ(hostPage.largestPageBytes, largest);
            EXPECT_EQ(hostPage.hostPageBytes, offset);
            EXPECT_EQ(hostPage.pageHalves, halves);
            // Exact bytes: the host page is the group's page, data and scales, with nothing between or after.
            EXPECT_EQ(hostPage.hostPageBytes, modelGroup.bytesPerPage);
            EXPECT_EQ(hostPage.hostPageBytes, layout.groups[static_cast<size_t>(group)].bytesPerPage);
            EXPECT_EQ(hostPage.hostPageBytes, rt::pageGeometry(layout, group).bytesPerPage);
            // One offset a table entry, in the table's order: the kernel walks the table with them.
            EXPECT_EQ(static_cast<int64_t>(hostPage.entryOffsets.size()), rt::detail::groupTableEntries(layout, group));
        }
    }
}

TEST(HostPageLayoutTest, HostPageBytesOfEachFormatMatchNumbersWorkedOutByHand)
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
        rt::detail::HostPageLayout const hostPage = rt::detail::hostPageLayout(layout, 0);
        int64_t const dataBytes = c.kvBytes + c.latentBytes;
        EXPECT_EQ(hostPage.hostPageBytes, dataBytes + c.kvScaleBytes + c.latentScaleBytes);
        std::vector<int64_t> expected{0, c.kvBytes};
        if (c.kvScaleBytes > 0)
        {
            expected.push_back(dataBytes);
            expected.push_back(dataBytes + c.kvScaleBytes);
        }
        EXPECT_EQ(hostPage.entryOffsets, expected);
    }
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [] {
            rt::detail::hostPageLayout(rt::computeLayout(ConfigBuilder({{1, 16}})), 1);
        },
        {"group is 1", "[0, 1)"}));
}

TEST(HostPageLayoutTest, PageGeometriesRecordTheQuantizationAndTellEqualBytesApart)
{
    auto const geometryOf = [](ScaledFormat format)
    { return rt::pageGeometry(rt::computeLayout(kvcache::test::scaledConfig(format)), 0); };
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

} // namespace
