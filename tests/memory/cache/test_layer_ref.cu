// GPU tests of KVCacheManager::layerRef for every data type and several page sizes: its fields against the views
// and the independent layout model, and a kernel that takes it by value and writes every element through its accessors,
// read back through the pool view's bytes at the offsets the model gives.

#include "kvcache/core/tensor.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/layer_ref.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/data_types.h"
#include "support/gpu_test.h"
#include "support/layout_model.h"
#include "support/view_round_trip.cuh"

namespace kvcache::test
{
namespace
{

template <typename T>
using LayerRefTest = TypedGpuTest<T>;

TYPED_TEST_SUITE(LayerRefTest, AllKVCacheDataTypes, DataTypeNames);

//! Heterogeneous layers, odd head sizes among them, so that no stride is a power of two by accident.
std::vector<rt::KVLayerConfig> const kLAYERS = {{4, 64}, {1, 7}, {3, 33}, {2, 128}};

//! A page size and how many pages beyond the minimum the cache keeps.
struct PageCase
{
    int32_t tokensPerPage;
    int32_t retainedPages;
};

constexpr PageCase kPAGE_CASES[] = {{1, 3}, {16, 0}, {16, 5}, {64, 2}, {128, 7}};

std::string describe(PageCase const& pageCase)
{
    return "tokensPerPage " + std::to_string(pageCase.tokensPerPage) + ", " + std::to_string(pageCase.retainedPages)
        + " retained pages";
}

//! Returns the config of `pageCase`: 2 slots of 100 tokens, which is not a whole number of pages unless pages hold
//! one token.
rt::KVCacheConfig configFor(PageCase const& pageCase, rt::DataType type)
{
    ConfigBuilder builder(kLAYERS);
    builder.maxBatchSize(2).maxSequenceLength(100).tokensPerPage(pageCase.tokensPerPage).dataType(type);
    int64_t const minPages = modelLayout(builder.build()).minPages;
    return builder.numPages(static_cast<int32_t>(minPages + pageCase.retainedPages)).build();
}

TYPED_TEST(LayerRefTest, FieldsMatchTheViewsAndTheModel)
{
    for (PageCase const& pageCase : kPAGE_CASES)
    {
        SCOPED_TRACE(describe(pageCase));
        rt::KVCacheConfig const config = configFor(pageCase, TypeParam::value);
        LayoutModel const model = modelLayout(config);
        CudaStream stream;
        rt::KVCacheManager manager(config, stream.get());
        ASSERT_EQ(manager.numLayers(), static_cast<int32_t>(model.layers.size()));
        ASSERT_EQ(manager.numPages(), model.numPages);
        ASSERT_EQ(model.numPages, model.minPages + pageCase.retainedPages);
        for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
        {
            SCOPED_TRACE("layer " + std::to_string(layer));
            ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
            rt::LayerRef const ref = manager.layerRef(layer);
            rt::Tensor const& pool = manager.getCombinedKVCachePoolView(layer);
            std::pair<rt::Tensor, rt::Tensor> const separate = manager.getSeparateKVCache(layer);

            // Pointers: the same as the views', V one half of the model's layer after K.
            EXPECT_EQ(ref.kPool, manager.kPoolPtr(layer));
            EXPECT_EQ(ref.vPool, manager.vPoolPtr(layer));
            EXPECT_EQ(ref.kPool, pool.rawPointer());
            EXPECT_EQ(ref.kPool, separate.first.rawPointer());
            EXPECT_EQ(ref.vPool, separate.second.rawPointer());
            EXPECT_EQ(byteDistance(ref.kPool, ref.vPool), ml.halfBytes);

            // Strides and extents: the pool view's [2, numPages, tokensPerPage, H, D].
            ASSERT_EQ(pool.getStride().getNumDims(), 5);
            ASSERT_EQ(pool.getShape().getNumDims(), 5);
            EXPECT_EQ(byteDistance(ref.kPool, ref.vPool), pool.getStride()[0] * model.elementBytes);
            EXPECT_EQ(ref.pageStride, pool.getStride()[1]);
            EXPECT_EQ(ref.tokenStride, pool.getStride()[2]);
            EXPECT_EQ(ref.headStride, pool.getStride()[3]);
            EXPECT_EQ(pool.getStride()[4], 1) << "LayerRef's accessors take the head's elements as dense";
            EXPECT_EQ(ref.numPages, pool.getShape()[1]);
            EXPECT_EQ(ref.tokensPerPage, pool.getShape()[2]);
            EXPECT_EQ(ref.numKVHeads, pool.getShape()[3]);
            EXPECT_EQ(ref.headDim, pool.getShape()[4]);

            // Values: the model's.
            EXPECT_TRUE(sameLayerRef(ref, model.layerRef(layer, manager.kPoolPtr(layer))));
        }
    }
}

//! One layer's pools as the model sizes them, and where its bytes are: the kernel loops over these, not over the
//! LayerRef's own fields, so that a wrong field cannot shrink what is written or let a write leave the layer.
struct ModelPool
{
    int64_t numPages;
    int64_t tokensPerPage;
    int64_t numKVHeads;
    int64_t headDim;
    char const* layerStart;
    int64_t layerBytes;
};

//! How the kernel reaches an element: through k<T>() / v<T>() or through kAddress() / vAddress().
enum class Accessor
{
    kTYPED,
    kADDRESS,
};

//! Writes elementValue(salt, kv, page, token, head, dim) to every element of both pools through `ref`, taken by value
//! as a paged attention kernel takes it; writes that would land outside the layer are counted in `outside` instead.
template <typename Bits, Accessor ACCESSOR>
__global__ void writeThroughLayerRefKernel(rt::LayerRef ref, ModelPool pool, uint64_t salt, unsigned long long* outside)
{
    int64_t const total = 2 * pool.numPages * pool.tokensPerPage * pool.numKVHeads * pool.headDim;
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x)
    {
        int64_t rest = i;
        int64_t const dim = rest % pool.headDim;
        rest /= pool.headDim;
        auto const head = static_cast<int32_t>(rest % pool.numKVHeads);
        rest /= pool.numKVHeads;
        auto const token = static_cast<int32_t>(rest % pool.tokensPerPage);
        rest /= pool.tokensPerPage;
        auto const page = static_cast<int32_t>(rest % pool.numPages);
        int64_t const kv = rest / pool.numPages;
        Bits* heads = nullptr;
        if constexpr (ACCESSOR == Accessor::kTYPED)
        {
            heads = kv == 0 ? ref.k<Bits>(page, token, head) : ref.v<Bits>(page, token, head);
        }
        else
        {
            heads = static_cast<Bits*>(kv == 0 ? ref.kAddress(page, token, head) : ref.vAddress(page, token, head));
        }
        Bits* const target = heads + dim;
        int64_t const byte = byteDistance(pool.layerStart, target);
        if (byte < 0 || byte + static_cast<int64_t>(sizeof(Bits)) > pool.layerBytes)
        {
            atomicAdd(outside, 1ull);
            continue;
        }
        *target = elementValue<Bits>(salt, kv, page, token, head, dim);
    }
}

//! Poisons every layer, writes every element of every layer through its LayerRef with `ACCESSOR` (salt saltBase +
//! layer), then reads each layer back through its pool view's bytes and checks every element at the model's offset.
template <typename Bits, Accessor ACCESSOR>
void writeThroughLayerRefsAndCheck(
    rt::KVCacheManager& manager, LayoutModel const& model, uint64_t saltBase, cudaStream_t stream)
{
    ASSERT_EQ(model.elementBytes, static_cast<int64_t>(sizeof(Bits)));
    DeviceArray<unsigned long long> outside(1);
    outside.fillBytes(0, stream);
    ASSERT_NO_FATAL_FAILURE(poisonLayers(manager, model, stream));
    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
        ModelPool const pool{model.numPages, model.tokensPerPage, ml.numKVHeads, ml.headDim,
            static_cast<char const*>(manager.getCombinedKVCachePoolView(layer).rawPointer()), ml.layerBytes};
        writeThroughLayerRefKernel<Bits, ACCESSOR><<<gridFor(2 * ml.halfElems), kBLOCK_SIZE, 0, stream>>>(
            manager.layerRef(layer), pool, saltBase + static_cast<uint64_t>(layer), outside.get());
        KVCACHE_TEST_CUDA(cudaGetLastError());
    }
    ASSERT_NO_FATAL_FAILURE(expectNoBadWrites(outside.get(), stream));

    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        SCOPED_TRACE("layer " + std::to_string(layer));
        ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
        uint64_t const salt = saltBase + static_cast<uint64_t>(layer);
        std::vector<Bits> const host =
            downloadElements<Bits>(manager.getCombinedKVCachePoolView(layer).rawPointer(), 2 * ml.halfElems, stream);
        MismatchLog log;
        for (int64_t kv = 0; kv < 2; ++kv)
        {
            for (int64_t page = 0; page < model.numPages; ++page)
            {
                for (int64_t token = 0; token < model.tokensPerPage; ++token)
                {
                    for (int64_t head = 0; head < ml.numKVHeads; ++head)
                    {
                        for (int64_t dim = 0; dim < ml.headDim; ++dim)
                        {
                            int64_t const byte = model.poolByteOffset(layer, kv, page, token, head, dim);
                            log.check(host, byte / model.elementBytes,
                                elementValue<Bits>(salt, kv, page, token, head, dim),
                                kv == 0 ? "K through LayerRef" : "V through LayerRef", {kv, page, token, head, dim});
                        }
                    }
                }
            }
        }
        EXPECT_EQ(log.count(), 0) << "first: " << log.first();
    }
}

//! Runs writeThroughLayerRefsAndCheck on a cache of `type` for every page case.
template <typename Bits, Accessor ACCESSOR>
void writeEveryPageCase(rt::DataType type, uint64_t saltBase)
{
    for (PageCase const& pageCase : kPAGE_CASES)
    {
        SCOPED_TRACE(describe(pageCase));
        rt::KVCacheConfig const config = configFor(pageCase, type);
        CudaStream stream;
        rt::KVCacheManager manager(config, stream.get());
        writeThroughLayerRefsAndCheck<Bits, ACCESSOR>(manager, modelLayout(config), saltBase, stream.get());
    }
}

TYPED_TEST(LayerRefTest, KernelWritesThroughTypedAccessorsLandWhereTheModelSays)
{
    writeEveryPageCase<typename TypeParam::Bits, Accessor::kTYPED>(TypeParam::value, 0x100);
}

TYPED_TEST(LayerRefTest, KernelWritesThroughAddressAccessorsLandWhereTheModelSays)
{
    writeEveryPageCase<typename TypeParam::Bits, Accessor::kADDRESS>(TypeParam::value, 0x200);
}

} // namespace
} // namespace kvcache::test
