// Page copies and resets of quantized caches with scale pools (FP8 per token-head, NVFP4), checked byte for byte
// against the host model: data and scales move together in every targeted layer half of windowed and latent layers
// (a latent layer has no V scales), untouched pages and scale pages stay as they were, device lists count a bad id
// once; the scale views, LayerRef's scale fields, allocatedBytes and the host-held layer scales. Host tiers and
// sequence files carry scales too (test_host_tier_contract.cu), and so does page transfer
// (test_page_transfer_scales.cu).

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_write.h"
#include "kvcache/memory/page_ops.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/cuda_raii.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/layout_expectations.h"
#include "support/layout_model.h"
#include "support/page_op_reference.h"
#include "support/scaled_configs.h"

namespace kvcache::rt
{
namespace
{

using test::CacheUnderTest;
using test::ConfigBuilder;
using test::DeviceArray;
using test::kSCALED_FORMATS;
using test::nameOf;
using test::scaledConfig;
using test::ScaledFormat;
using test::throwsNaming;

constexpr KVLayerKind kLATENT = KVLayerKind::kLATENT;
constexpr uint32_t kPATTERN = 0xDEADBEEFU;

//! Targets of one group of scaledConfig(): a KV layer at position 0, a latent one at position 1 (its missing V half
//! included), and in group 0 a KV layer at position 2.
std::vector<PageOpTarget> targetsOfGroup(int32_t group)
{
    std::vector<PageOpTarget> targets{
        {0, -1, KVHalf::kBOTH, group},
        {0, -1, KVHalf::kK, group},
        {0, -1, KVHalf::kV, group},
        {1, 1, KVHalf::kBOTH, group},
        {1, 1, KVHalf::kV, group},
        {0, 1, KVHalf::kBOTH, group},
    };
    if (group == 0)
    {
        targets.push_back({2, 1, KVHalf::kV, 0});
    }
    return targets;
}

//! Runs `check` on a fresh cache of each scaled format, made with `seed`; stops at the first fatal failure, as an
//! ASSERT in a loop of the test's own would.
template <typename Check>
void forEachScaledCache(uint64_t seed, Check&& check)
{
    for (ScaledFormat const format : kSCALED_FORMATS)
    {
        SCOPED_TRACE(nameOf(format));
        CacheUnderTest cut(scaledConfig(format), seed);
        check(cut);
        if (::testing::Test::HasFatalFailure())
        {
            return;
        }
    }
}

using ScaledPageOpsTest = test::GpuTest;

TEST_F(ScaledPageOpsTest, HostListCopiesMoveDataAndScalesOfEveryTargetedHalf)
{
    forEachScaledCache(31,
        [&](CacheUnderTest& cut)
        {
            ASSERT_TRUE(cut.reference().hasScales()) << "the model must hold scales, or nothing below checks them";
            for (int32_t group = 0; group < 3; ++group)
            {
                for (PageOpTarget const& target : targetsOfGroup(group))
                {
                    SCOPED_TRACE(test::describe(target));
                    std::vector<PageCopy> const pairs = cut.randomPairs(5, group);
                    copyPages(cut.cache(), pairs, cut.stream(), target);
                    cut.reference().copy(pairs, target);
                    ASSERT_TRUE(cut.matchesReference());
                }
            }
        });
}

TEST_F(ScaledPageOpsTest, HostListResetsFillDataAndScalePagesFromTheirOwnFirstByte)
{
    forEachScaledCache(47,
        [&](CacheUnderTest& cut)
        {
            for (int32_t group = 0; group < 3; ++group)
            {
                for (PageOpTarget const& target : targetsOfGroup(group))
                {
                    SCOPED_TRACE(test::describe(target));
                    for (uint32_t const pattern : {kPATTERN, 0U})
                    {
                        std::vector<int32_t> const pages = cut.randomPages(4, group);
                        resetPages(cut.cache(), pages, cut.stream(), pattern, target);
                        cut.reference().reset(pages, pattern, target);
                        ASSERT_TRUE(cut.matchesReference()) << "pattern " << pattern;
                    }
                }
            }
        });
}

TEST_F(ScaledPageOpsTest, LongHostListsCarryScalesInEveryLaunch)
{
    // More than one launch's inline list (kMAX_INLINE_PAGE_OPS), so both passes run once per part.
    for (ScaledFormat const format : kSCALED_FORMATS)
    {
        SCOPED_TRACE(nameOf(format));
        KVCacheConfig const config = test::pagePoolConfig({{2, 32}, {1, 16}}, 16, 700)
                                         .dataType(format.storage)
                                         .quantization(format.quantization);
        CacheUnderTest cut(config, 5);
        std::vector<PageCopy> const pairs = cut.randomPairs(kMAX_INLINE_PAGE_OPS + 40);
        copyPages(cut.cache(), pairs, cut.stream());
        cut.reference().copy(pairs);
        ASSERT_TRUE(cut.matchesReference());
        std::vector<int32_t> const pages = cut.randomPages(kMAX_INLINE_PAGE_OPS + 3);
        resetPages(cut.cache(), pages, cut.stream(), kPATTERN);
        cut.reference().reset(pages, kPATTERN);
        ASSERT_TRUE(cut.matchesReference());
    }
}

TEST_F(ScaledPageOpsTest, DeviceListsCarryScalesAndCountEachBadIdOnce)
{
    forEachScaledCache(59,
        [&](CacheUnderTest& cut)
        {
            for (int32_t group = 0; group < 3; ++group)
            {
                SCOPED_TRACE("group " + std::to_string(group));
                int32_t const numPages = cut.numPages(group);
                std::vector<PageCopy> pairs = cut.randomPairs(8, group);
                pairs[1].src = numPages;               // bad: counted once, not once a pass or a layer half
                pairs[4].dst = -7;                     // bad
                pairs[6].src = kUNUSED_PAGE_ENTRY;     // skipped, not counted
                constexpr int32_t kEARLIER_ERRORS = 3; // the counter accumulates
                DeviceArray<PageCopy> deviceList(pairs, cut.stream());
                DeviceArray<int32_t> count(std::vector<int32_t>{7}, cut.stream()); // the last pair is past the count
                DeviceArray<int32_t> errors(std::vector<int32_t>{kEARLIER_ERRORS}, cut.stream());
                PageOpTarget const target{0, -1, KVHalf::kBOTH, group};
                copyPagesDevice(cut.cache(), deviceList.get(), 8, count.get(), cut.stream(), target, errors.get());
                cut.reference().copy(test::firstEntries(pairs, 7), target);
                ASSERT_TRUE(cut.matchesReference());
                EXPECT_EQ(errors.download(cut.stream())[0], kEARLIER_ERRORS + 2);

                std::vector<int32_t> pages = cut.randomPages(6, group);
                pages[2] = numPages + 1;
                pages[3] = kUNUSED_PAGE_ENTRY;
                DeviceArray<int32_t> devicePages(pages, cut.stream());
                DeviceArray<int32_t> resetErrors(std::vector<int32_t>{0}, cut.stream());
                resetPagesDevice(
                    cut.cache(), devicePages.get(), 6, nullptr, cut.stream(), kPATTERN, target, resetErrors.get());
                cut.reference().reset(pages, kPATTERN, target);
                ASSERT_TRUE(cut.matchesReference());
                EXPECT_EQ(resetErrors.download(cut.stream())[0], 1);
            }
        });
}

TEST_F(ScaledPageOpsTest, ScaleViewsLayerRefsAndBytesFollowTheModel)
{
    for (ScaledFormat const format : kSCALED_FORMATS)
    {
        SCOPED_TRACE(nameOf(format));
        KVCacheConfig const config = scaledConfig(format);
        test::LayoutModel const model = test::modelLayout(config);
        test::CudaStream stream;
        KVCacheManager cache(config, stream.get());
        bool const tokenHead = format.quantization == KVQuantization::kFP8_PER_TOKEN_HEAD;
        int64_t tableEntries = 0;
        for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
        {
            SCOPED_TRACE("layer " + std::to_string(layer));
            test::ModelLayer const& m = model.layers[static_cast<size_t>(layer)];
            Tensor const scales = cache.scalePoolView(layer);
            Coords expected{m.numHalves, m.numPages, model.tokensPerPage, m.numKVHeads};
            if (!tokenHead)
            {
                expected = Coords{m.numHalves, m.numPages, model.tokensPerPage, m.numKVHeads, m.headDim / 16};
            }
            EXPECT_EQ(scales.getShape(), expected);
            EXPECT_EQ(scales.getDataType(), tokenHead ? DataType::kFLOAT : DataType::kFP8_E4M3);
            EXPECT_EQ(scales.sizeBytes(), m.scaleBytes);
            EXPECT_EQ(cache.getCombinedKVCachePoolView(layer).getShape()[4], m.storedDim);
            EXPECT_EQ(cache.getCombinedKVCachePoolView(layer).sizeBytes(), m.layerBytes);
            LayerRef const ref = cache.layerRef(layer);
            LayerRef const byModel = model.layerRef(layer, cache.kPoolPtr(layer), scales.rawPointer());
            EXPECT_TRUE(test::sameLayerRef(ref, byModel));
            EXPECT_EQ(ref.scaleOffset(1, 2, 0) * ref.scaleElementBytes,
                (model.tokensPerPage + 2) * m.numKVHeads * (m.scalePageBytes / (model.tokensPerPage * m.numKVHeads)));
            tableEntries += 2;
        }
        EXPECT_EQ(cache.allocatedBytes(), model.cacheBytes + 16 * tableEntries);
        EXPECT_EQ(cache.allocatedBytes(), cache.layout().cacheBytes + 16 * tableEntries);
    }
}

TEST_F(ScaledPageOpsTest, HostHeldLayerScalesAreKeptCheckedAndLeftAloneOnRefusal)
{
    test::CudaStream stream;
    KVCacheManager perTensor(test::pagePoolConfig({{1, 16}, {1, 16, 0, kLATENT}}, 16, 8)
                                 .dataType(DataType::kFP8_E4M3)
                                 .quantization(KVQuantization::kFP8_PER_TENSOR),
        stream.get());
    EXPECT_EQ(perTensor.layerScales(0).k, 1.0F);
    EXPECT_EQ(perTensor.layerScales(0).v, 1.0F);
    perTensor.setLayerScales(0, {0.5F, 0.25F});
    perTensor.setLayerScales(1, {0.0F, 2.0F}); // 0 is allowed per tensor: values store as zeros
    EXPECT_EQ(perTensor.layerScales(0).k, 0.5F);
    EXPECT_EQ(perTensor.layerScales(0).v, 0.25F);
    EXPECT_EQ(perTensor.layerScales(1).k, 0.0F);
    for (float const bad : {-1.0F, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    {
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&] {
                perTensor.setLayerScales(0, {0.75F, bad});
            },
            {"LayerScales.v", "layer 0", ">= 0"}));
        EXPECT_EQ(perTensor.layerScales(0).k, 0.5F) << "a refused call changes nothing";
        EXPECT_EQ(perTensor.layerScales(0).v, 0.25F);
    }
    EXPECT_THROW(perTensor.layerScales(2), OutOfRangeError);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { perTensor.scalePoolView(0); }, {"KVCacheConfig.quantization", "fp8_per_tensor", "scale pools"}));
    EXPECT_EQ(perTensor.layerRef(0).kScalePool, nullptr);
    EXPECT_EQ(perTensor.allocatedBytes(), perTensor.layout().cacheBytes + 16 * 2);

    KVCacheManager nvfp4(
        test::pagePoolConfig({{1, 32}}, 16, 8).dataType(DataType::kUINT8).quantization(KVQuantization::kNVFP4),
        stream.get());
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] {
            nvfp4.setLayerScales(0, {0.0F, 1.0F});
        },
        {"LayerScales.k", "nvfp4", "> 0"}));
    nvfp4.setLayerScales(0, {0.125F, 3.0F});
    EXPECT_EQ(nvfp4.layerScales(0).v, 3.0F);
    // A latent layer's v is unused: a sequence file's 0 is taken back, its k is still checked.
    KVCacheManager latent(test::pagePoolConfig({{1, 32}, {1, 32, 0, kLATENT}}, 16, 8)
                              .dataType(DataType::kUINT8)
                              .quantization(KVQuantization::kNVFP4),
        stream.get());
    latent.setLayerScales(1, {0.5F, 0.0F});
    EXPECT_EQ(latent.layerScales(1).k, 0.5F);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] {
            latent.setLayerScales(0, {0.5F, 0.0F});
        },
        {"LayerScales.v", "layer 0", "> 0"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] {
            latent.setLayerScales(1, {0.0F, 0.0F});
        },
        {"LayerScales.k", "layer 1", "> 0"}));

    KVCacheManager tokenHead(test::pagePoolConfig({{1, 16}}, 16, 8)
                                 .dataType(DataType::kFP8_E4M3)
                                 .quantization(KVQuantization::kFP8_PER_TOKEN_HEAD),
        stream.get());
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { tokenHead.layerScales(0); }, {"KVCacheConfig.quantization", "fp8_per_token_head", "host-held"}));
}

} // namespace
} // namespace kvcache::rt
