// GPU tests of KVCacheManager's views: shapes, strides and pointers, retained pages, data written through one view
// and read through the others, and paged writes through a page table.

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/data_types.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/layout_model.h"
#include "support/view_round_trip.cuh"

namespace kvcache::test
{
namespace
{

template <typename T>
class KVCacheManagerViewsTest : public TypedGpuTest<T>
{
};

TYPED_TEST_SUITE(KVCacheManagerViewsTest, AllKVCacheDataTypes, DataTypeNames);

//! The heterogeneous model most tests use: (numKVHeads, headDim) per layer.
std::vector<rt::KVLayerConfig> const kHETEROGENEOUS_LAYERS = {{8, 128}, {2, 64}, {4, 256}, {1, 80}};
constexpr int32_t kSEQUENCE_LENGTH = 1000;

//! Returns a builder of kHETEROGENEOUS_LAYERS with `maxBatchSize` slots of kSEQUENCE_LENGTH tokens.
ConfigBuilder heterogeneousConfig(int32_t maxBatchSize)
{
    ConfigBuilder builder(kHETEROGENEOUS_LAYERS);
    builder.maxBatchSize(maxBatchSize).maxSequenceLength(kSEQUENCE_LENGTH);
    return builder;
}

//! A page size and what 1000 tokens round up to in it, worked out by hand.
struct PageCase
{
    int32_t tokensPerPage;
    int64_t capPadded;
    int64_t pagesPerSlot;
};

// 1000 tokens: 63 pages of 16 (1008 tokens), 16 pages of 64 (1024), 8 pages of 128 (1024).
constexpr PageCase kPAGE_CASES[] = {{16, 1008, 63}, {64, 1024, 16}, {128, 1024, 8}};

//! What one layer's views should be, worked out by the test.
struct ExpectedViews
{
    int64_t batch;
    int64_t capPadded;
    int64_t numPages;
    int64_t tokensPerPage;
    int64_t elementBytes;
    rt::DataType type;
};

//! Checks the pointers, byte size, pool view and separate K and V views of `layer` (which has the heads and head size
//! of kHETEROGENEOUS_LAYERS[layer]); returns the layer's start.
void const* expectPoolAndSeparateViews(rt::KVCacheManager& manager, int32_t layer, ExpectedViews const& x)
{
    int64_t const h = kHETEROGENEOUS_LAYERS[static_cast<size_t>(layer)].numKVHeads;
    int64_t const d = kHETEROGENEOUS_LAYERS[static_cast<size_t>(layer)].headDim;
    int64_t const cap = x.capPadded;
    int64_t const halfBytes = x.numPages * x.tokensPerPage * h * d * x.elementBytes;
    void const* base = manager.kPoolPtr(layer);
    EXPECT_NE(base, nullptr);
    EXPECT_EQ(byteDistance(base, manager.vPoolPtr(layer)), halfBytes);
    EXPECT_EQ(manager.layout().layers.at(static_cast<size_t>(layer)).layerBytes, 2 * halfBytes);
    EXPECT_TRUE(viewIs(manager.getCombinedKVCachePoolView(layer), base, 0, {2, x.numPages, x.tokensPerPage, h, d},
        {x.numPages * x.tokensPerPage * h * d, x.tokensPerPage * h * d, h * d, d, 1}, x.type))
        << "pool view";
    std::pair<rt::Tensor, rt::Tensor> const separate = manager.getSeparateKVCache(layer);
    EXPECT_TRUE(viewIs(separate.first, base, 0, {x.batch, cap, h, d}, {cap * h * d, h * d, d, 1}, x.type))
        << "separate K view";
    EXPECT_TRUE(viewIs(separate.second, base, halfBytes, {x.batch, cap, h, d}, {cap * h * d, h * d, d, 1}, x.type))
        << "separate V view";
    return base;
}

// ---------------------------------------------------------------------------------------------------------------
// Geometry of the views.

TYPED_TEST(KVCacheManagerViewsTest, ViewShapesStridesAndPointers)
{
    constexpr rt::DataType kTYPE = TypeParam::value;
    int64_t const e = elementBytesByHand(kTYPE);
    int32_t const batch = 3;
    for (PageCase const& pageCase : kPAGE_CASES)
    {
        SCOPED_TRACE("tokensPerPage " + std::to_string(pageCase.tokensPerPage));
        CudaStream stream;
        rt::KVCacheManager manager(
            heterogeneousConfig(batch).tokensPerPage(pageCase.tokensPerPage).dataType(kTYPE).build(), stream.get());

        int64_t const tokensPerPage = pageCase.tokensPerPage;
        int64_t const cap = pageCase.capPadded;
        int64_t const numPages = batch * pageCase.pagesPerSlot;
        ASSERT_EQ(manager.numLayers(), 4);
        EXPECT_FALSE(manager.isUniform());
        EXPECT_EQ(manager.maxCapPadded(), cap);
        EXPECT_EQ(manager.tokensPerPage(), tokensPerPage);
        EXPECT_EQ(manager.minPages(), numPages);
        EXPECT_EQ(manager.numPages(), numPages);
        EXPECT_EQ(manager.getConfig().kvCacheType, kTYPE);

        std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
        int64_t cacheBytes = 0;
        for (int32_t layer = 0; layer < 4; ++layer)
        {
            SCOPED_TRACE("layer " + std::to_string(layer));
            int64_t const h = kHETEROGENEOUS_LAYERS[static_cast<size_t>(layer)].numKVHeads;
            int64_t const d = kHETEROGENEOUS_LAYERS[static_cast<size_t>(layer)].headDim;
            int64_t const layerBytes = 2 * numPages * tokensPerPage * h * d * e;
            cacheBytes += layerBytes;

            EXPECT_EQ(manager.getLayerConfig(layer).numKVHeads, h);
            EXPECT_EQ(manager.getLayerConfig(layer).headDim, d);
            void const* base =
                expectPoolAndSeparateViews(manager, layer, {batch, cap, numPages, tokensPerPage, e, kTYPE});
            ASSERT_NE(base, nullptr);
            EXPECT_TRUE(viewIs(manager.getCombinedKVCache(layer), base, 0, {2, batch, cap, h, d},
                {batch * cap * h * d, cap * h * d, h * d, d, 1}, kTYPE))
                << "slot view";

            auto const start = reinterpret_cast<uintptr_t>(base);
            ranges.emplace_back(start, start + static_cast<uintptr_t>(layerBytes));
        }
        EXPECT_EQ(manager.layout().cacheBytes, cacheBytes);

        std::sort(ranges.begin(), ranges.end());
        for (size_t i = 1; i < ranges.size(); ++i)
        {
            EXPECT_LE(ranges[i - 1].second, ranges[i].first) << "two layers' buffers overlap";
        }
    }
}

TYPED_TEST(KVCacheManagerViewsTest, RetainedPagesRefuseSlotViewAndKeepOtherViews)
{
    constexpr rt::DataType kTYPE = TypeParam::value;
    int64_t const e = elementBytesByHand(kTYPE);
    int32_t const batch = 3;
    int32_t const tokensPerPage = 64;
    int64_t const cap = 1024;    // 1000 tokens in 16 pages of 64
    int64_t const minPages = 48; // 3 slots of 16 pages
    int32_t const numPages = 55; // 7 retained pages
    CudaStream stream;
    ConfigBuilder builder = heterogeneousConfig(batch);
    builder.tokensPerPage(tokensPerPage).dataType(kTYPE).numPages(numPages);
    rt::KVCacheManager manager(builder.build(), stream.get());
    EXPECT_EQ(manager.minPages(), minPages);
    ASSERT_EQ(manager.numPages(), numPages);
    EXPECT_EQ(manager.maxCapPadded(), cap);
    ASSERT_EQ(manager.numLayers(), 4);

    for (int32_t layer = 0; layer < 4; ++layer)
    {
        SCOPED_TRACE("layer " + std::to_string(layer));
        EXPECT_TRUE(throwsNaming<rt::InvalidConfigError>([&] { static_cast<void>(manager.getCombinedKVCache(layer)); },
            {"getCombinedKVCachePoolView", "getSeparateKVCache", "kPoolPtr", "vPoolPtr"}));
        expectPoolAndSeparateViews(manager, layer, {batch, cap, numPages, tokensPerPage, e, kTYPE});
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Data written through one view and read through the others.

TYPED_TEST(KVCacheManagerViewsTest, SlotViewWritesReadBackThroughPoolAndSeparateViews)
{
    using Bits = typename TypeParam::Bits;
    CudaStream stream;
    DeviceArray<unsigned long long> badWrites(1);
    rt::KVCacheConfig const config = heterogeneousConfig(2).tokensPerPage(64).dataType(TypeParam::value).build();
    LayoutModel const model = modelLayout(config);
    rt::KVCacheManager manager(config, stream.get());

    ASSERT_NO_FATAL_FAILURE(poisonAndWriteSlots<Bits>(manager, model, 0, stream.get(), badWrites.get()));
    ASSERT_NO_FATAL_FAILURE(expectNoBadWrites(badWrites.get(), stream.get()));
    verifySlotWrite<Bits>(manager, model, 0, stream.get());
}

TYPED_TEST(KVCacheManagerViewsTest, PagedWritesReadBackThroughPageTable)
{
    using Bits = typename TypeParam::Bits;
    int64_t const e = sizeof(Bits);
    CudaStream stream;
    DeviceArray<unsigned long long> badWrites(1);
    // 2 slots of 16 pages use 32 of 35 pages; 3 stay unowned and must keep their poison.
    ConfigBuilder builder = heterogeneousConfig(2);
    rt::KVCacheConfig const config = builder.tokensPerPage(64).dataType(TypeParam::value).numPages(35).build();
    LayoutModel const model = modelLayout(config);
    rt::KVCacheManager manager(config, stream.get());
    ASSERT_EQ(manager.numPages(), 35);
    ASSERT_EQ(manager.numLayers(), 4);

    std::vector<int32_t> permutation(static_cast<size_t>(model.numPages));
    std::iota(permutation.begin(), permutation.end(), 0);
    std::mt19937 random(20240611u);
    std::shuffle(permutation.begin(), permutation.end(), random);
    std::vector<int32_t> const pageTable(permutation.begin(), permutation.begin() + model.minPages);
    std::vector<int32_t> const unowned(permutation.begin() + model.minPages, permutation.end());
    bool identity = true;
    for (size_t i = 0; i < pageTable.size(); ++i)
    {
        identity = identity && pageTable[i] == static_cast<int32_t>(i);
    }
    ASSERT_FALSE(identity);

    DeviceArray<int32_t> const devicePageTable(pageTable, stream.get());
    ASSERT_NO_FATAL_FAILURE(
        poisonAndWriteSlots<Bits>(manager, model, 0, stream.get(), badWrites.get(), devicePageTable.get()));
    ASSERT_NO_FATAL_FAILURE(expectNoBadWrites(badWrites.get(), stream.get()));

    int64_t const tokensPerPage = model.tokensPerPage;
    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        SCOPED_TRACE("layer " + std::to_string(layer));
        ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
        void const* base = manager.kPoolPtr(layer);
        std::vector<Bits> const host = downloadElements<Bits>(base, 2 * ml.halfElems, stream.get());
        ViewMap pool;
        ASSERT_TRUE(mapView(manager.getCombinedKVCachePoolView(layer), base, e, 5, pool));
        int64_t const halfStart[2] = {
            byteDistance(base, manager.kPoolPtr(layer)) / e, byteDistance(base, manager.vPoolPtr(layer)) / e};

        // Through the page table and the pool view's strides, and through kPoolPtr / vPoolPtr with the layout
        // formula ((page * P + t) * H + h) * D + d.
        MismatchLog poolLog;
        MismatchLog formulaLog;
        for (int64_t kv = 0; kv < 2; ++kv)
        {
            for (int64_t b = 0; b < model.maxBatchSize; ++b)
            {
                for (int64_t s = 0; s < model.capPadded; ++s)
                {
                    int64_t const page = pageTable[static_cast<size_t>(b * model.pagesPerSlot + s / tokensPerPage)];
                    int64_t const t = s % tokensPerPage;
                    for (int64_t h = 0; h < ml.numKVHeads; ++h)
                    {
                        for (int64_t d = 0; d < ml.headDim; ++d)
                        {
                            Bits const expected = elementValue<Bits>(static_cast<uint64_t>(layer), kv, b, s, h, d);
                            int64_t const viewElem = pool.start + kv * pool.stride[0] + page * pool.stride[1]
                                + t * pool.stride[2] + h * pool.stride[3] + d * pool.stride[4];
                            poolLog.check(host, viewElem, expected, "pool view via page table", {kv, page, t, h, d});
                            int64_t const formulaElem =
                                halfStart[kv] + ((page * tokensPerPage + t) * ml.numKVHeads + h) * ml.headDim + d;
                            formulaLog.check(
                                host, formulaElem, expected, "pool pointer + layout formula", {kv, page, t, h, d});
                        }
                    }
                }
            }
        }
        EXPECT_EQ(poolLog.count(), 0) << "first: " << poolLog.first();
        EXPECT_EQ(formulaLog.count(), 0) << "first: " << formulaLog.first();

        MismatchLog unownedLog;
        for (int64_t kv = 0; kv < 2; ++kv)
        {
            for (int32_t page : unowned)
            {
                for (int64_t elem = 0; elem < ml.pageElems; ++elem)
                {
                    unownedLog.check(host, halfStart[kv] + page * ml.pageElems + elem, poisonBits<Bits>(),
                        "unowned page keeps poison", {kv, page, elem, 0, 0});
                }
            }
        }
        EXPECT_EQ(unownedLog.count(), 0) << "first: " << unownedLog.first();
        EXPECT_EQ(std::count(host.begin(), host.end(), poisonBits<Bits>()),
            static_cast<std::ptrdiff_t>(2 * static_cast<int64_t>(unowned.size()) * ml.pageElems))
            << "poisoned elements should be exactly those of the unowned pages";
    }
}

} // namespace
} // namespace kvcache::test
