// GPU tests of KVCacheManager: view geometry, data written through one view and read through the others, device
// memory accounting, out-of-memory cleanup, index checks, moves and several managers on several streams.

#include "gpu_test_support.h"

#include "kvcache/detail/layer_table.h"
#include "kvcache/errors.h"
#include "kvcache/kv_cache_manager.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace
{

using kvcache::rt::DataType;
using kvcache::rt::DeviceType;
using kvcache::rt::KVCacheManager;
using kvcache::rt::KVLayerConfig;
using kvcache::rt::Tensor;

static_assert(std::is_nothrow_destructible_v<KVCacheManager>, "the destructor must be noexcept");
static_assert(std::is_nothrow_default_constructible_v<KVCacheManager>);
static_assert(std::is_nothrow_move_constructible_v<KVCacheManager>);
static_assert(std::is_nothrow_move_assignable_v<KVCacheManager>);
static_assert(!std::is_copy_constructible_v<KVCacheManager>);
static_assert(!std::is_copy_assignable_v<KVCacheManager>);

//! Byte every buffer is filled with before a kernel writes it.
constexpr int kPOISON_BYTE = 0xA5;
constexpr int64_t kMIB = int64_t{1} << 20;
constexpr int kBLOCK_SIZE = 256;
//! Most a stream-ordered allocation is assumed to be rounded up by the pool.
constexpr int64_t kALLOCATION_GRANULARITY = 2 * kMIB;

//! The heterogeneous model most tests use: (numKVHeads, headDim) per layer.
std::vector<KVLayerConfig> const kHETEROGENEOUS_LAYERS = {{8, 128}, {2, 64}, {4, 256}, {1, 80}};

//! Float16 elements, moved as raw 16-bit patterns.
struct HalfType
{
    static constexpr DataType kTYPE = DataType::kHALF;
    using Bits = uint16_t;
};

//! Bfloat16 elements, moved as raw 16-bit patterns.
struct Bf16Type
{
    static constexpr DataType kTYPE = DataType::kBF16;
    using Bits = uint16_t;
};

//! FP8 e4m3 elements, moved as raw bytes.
struct Fp8E4M3Type
{
    static constexpr DataType kTYPE = DataType::kFP8_E4M3;
    using Bits = uint8_t;
};

using KVDataTypes = ::testing::Types<HalfType, Bf16Type, Fp8E4M3Type>;

//! Names typed-test instances after their data type.
struct DataTypeNames
{
    template <typename T>
    static std::string GetName(int)
    {
        return std::string(kvcache::rt::dataTypeName(T::kTYPE));
    }
};

//! Element size written out by hand, independent of the library's dataTypeSize().
int64_t elementBytesOf(DataType type)
{
    switch (type)
    {
    case DataType::kHALF:
    case DataType::kBF16: return 2;
    case DataType::kFP8_E4M3: return 1;
    default: return 0;
    }
}

//! One layer of the test's own model of the layout.
struct ModelLayer
{
    int64_t heads = 0;
    int64_t headDim = 0;
    int64_t pageElems = 0;
    int64_t halfElems = 0;
    int64_t layerBytes = 0;
};

//! The test's own model of the layout maths, from the formulas of the design document.
struct ModelLayout
{
    int64_t batch = 0;
    int64_t tokensPerPage = 0;
    int64_t capPadded = 0;
    int64_t pagesPerSlot = 0;
    int64_t minPages = 0;
    int64_t numPages = 0;
    int64_t elementBytes = 0;
    std::vector<ModelLayer> layers;
    int64_t cacheBytes = 0;
};

ModelLayout modelLayout(KVCacheManager::Config const& config)
{
    ModelLayout model;
    model.batch = config.maxBatchSize;
    model.tokensPerPage = config.tokensPerPage;
    model.capPadded =
        (int64_t{config.maxSequenceLength} + model.tokensPerPage - 1) / model.tokensPerPage * model.tokensPerPage;
    model.pagesPerSlot = model.capPadded / model.tokensPerPage;
    model.minPages = model.batch * model.pagesPerSlot;
    model.numPages = config.numPages != 0 ? config.numPages : model.minPages;
    model.elementBytes = elementBytesOf(config.kvCacheType);
    for (KVLayerConfig const& layer : config.layerConfigs)
    {
        ModelLayer ml;
        ml.heads = layer.numKVHeads;
        ml.headDim = layer.headDim;
        ml.pageElems = model.tokensPerPage * ml.heads * ml.headDim;
        ml.halfElems = model.numPages * ml.pageElems;
        ml.layerBytes = 2 * ml.halfElems * model.elementBytes;
        model.cacheBytes += ml.layerBytes;
        model.layers.push_back(ml);
    }
    return model;
}

KVCacheManager::Config makeConfig(std::vector<KVLayerConfig> const& layers, int32_t maxBatchSize,
    int32_t maxSequenceLength, int32_t tokensPerPage, DataType type, int32_t numPages = 0, cudaMemPool_t pool = nullptr)
{
    KVCacheManager::Config config;
    config.numAttentionLayers = static_cast<int32_t>(layers.size());
    config.maxBatchSize = maxBatchSize;
    config.maxSequenceLength = maxSequenceLength;
    config.layerConfigs = layers;
    config.kvCacheType = type;
    config.numPages = numPages;
    config.tokensPerPage = tokensPerPage;
    config.memPool = pool;
    return config;
}

//! A stream created with cudaStreamCreate, synchronised and destroyed at scope exit.
class Stream
{
public:
    Stream()
    {
        mStatus = cudaStreamCreate(&mStream);
    }
    ~Stream()
    {
        if (mStream != nullptr)
        {
            EXPECT_EQ(cudaStreamSynchronize(mStream), cudaSuccess);
            EXPECT_EQ(cudaStreamDestroy(mStream), cudaSuccess);
        }
    }
    Stream(Stream const&) = delete;
    Stream& operator=(Stream const&) = delete;

    cudaError_t status() const
    {
        return mStatus;
    }
    cudaStream_t get() const
    {
        return mStream;
    }

private:
    cudaStream_t mStream{nullptr};
    cudaError_t mStatus{cudaSuccess};
};

//! A memory pool of its own on the current device, so that its used-memory counter sees only one test's memory.
class DedicatedPool
{
public:
    DedicatedPool()
    {
        int device = 0;
        mStatus = cudaGetDevice(&device);
        if (mStatus != cudaSuccess)
        {
            return;
        }
        cudaMemPoolProps props{};
        props.allocType = cudaMemAllocationTypePinned;
        props.handleTypes = cudaMemHandleTypeNone;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = device;
        mStatus = cudaMemPoolCreate(&mPool, &props);
    }
    ~DedicatedPool()
    {
        if (mPool != nullptr)
        {
            EXPECT_EQ(cudaMemPoolDestroy(mPool), cudaSuccess);
        }
    }
    DedicatedPool(DedicatedPool const&) = delete;
    DedicatedPool& operator=(DedicatedPool const&) = delete;

    cudaError_t status() const
    {
        return mStatus;
    }
    cudaMemPool_t get() const
    {
        return mPool;
    }

private:
    cudaMemPool_t mPool{nullptr};
    cudaError_t mStatus{cudaSuccess};
};

//! Device memory from cudaMalloc, freed at scope exit.
class DeviceBuffer
{
public:
    explicit DeviceBuffer(std::size_t bytes)
    {
        mStatus = cudaMalloc(&mData, bytes);
    }
    ~DeviceBuffer()
    {
        if (mData != nullptr)
        {
            EXPECT_EQ(cudaFree(mData), cudaSuccess);
        }
    }
    DeviceBuffer(DeviceBuffer const&) = delete;
    DeviceBuffer& operator=(DeviceBuffer const&) = delete;

    cudaError_t status() const
    {
        return mStatus;
    }
    template <typename T>
    T* as() const
    {
        return static_cast<T*>(mData);
    }

private:
    void* mData{nullptr};
    cudaError_t mStatus{cudaSuccess};
};

cudaError_t getPoolUsed(cudaMemPool_t pool, std::uint64_t& used)
{
    return cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
}

cudaError_t getPoolUsedHigh(cudaMemPool_t pool, std::uint64_t& used)
{
    return cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used);
}

int64_t byteDistance(void const* from, void const* to)
{
    return static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(to) - reinterpret_cast<std::uintptr_t>(from));
}

//! Calls `call` and returns success with `message` set when it throws `Exception`.
template <typename Exception, typename Call>
::testing::AssertionResult throwsWithMessage(Call&& call, std::string& message)
{
    try
    {
        call();
    }
    catch (Exception const& error)
    {
        message = error.what();
        return ::testing::AssertionSuccess();
    }
    catch (std::exception const& other)
    {
        return ::testing::AssertionFailure() << "threw another exception: " << other.what();
    }
    return ::testing::AssertionFailure() << "did not throw";
}

bool contains(std::string const& text, std::string const& part)
{
    return text.find(part) != std::string::npos;
}

//! Checks a view's pointer (as a byte offset from `base`), shape, strides, type and device against expectations.
::testing::AssertionResult viewIs(Tensor const& view, void const* base, int64_t byteOffset,
    std::vector<int64_t> const& shape, std::vector<int64_t> const& stride, DataType type)
{
    auto const rank = static_cast<int32_t>(shape.size());
    if (view.getShape().getNumDims() != rank || view.getStride().getNumDims() != rank)
    {
        return ::testing::AssertionFailure() << "rank " << view.getShape().getNumDims() << " (strides "
                                             << view.getStride().getNumDims() << "), expected " << rank;
    }
    for (int32_t dim = 0; dim < rank; ++dim)
    {
        if (view.getShape()[dim] != shape[dim])
        {
            return ::testing::AssertionFailure()
                << "extent " << dim << " is " << view.getShape()[dim] << ", expected " << shape[dim];
        }
        if (view.getStride()[dim] != stride[dim])
        {
            return ::testing::AssertionFailure()
                << "stride " << dim << " is " << view.getStride()[dim] << ", expected " << stride[dim];
        }
    }
    if (byteDistance(base, view.rawPointer()) != byteOffset)
    {
        return ::testing::AssertionFailure() << "pointer is " << byteDistance(base, view.rawPointer())
                                             << " bytes from the layer start, expected " << byteOffset;
    }
    if (view.getDataType() != type)
    {
        return ::testing::AssertionFailure() << "data type " << kvcache::rt::dataTypeName(view.getDataType());
    }
    if (view.getDeviceType() != DeviceType::kGPU)
    {
        return ::testing::AssertionFailure() << "device type is not kGPU";
    }
    return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------------------------
// Element values and the kernels that write them.

__host__ __device__ inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

template <typename Bits>
__host__ __device__ inline Bits poisonBits()
{
    return static_cast<Bits>(0xA5A5A5A5u);
}

//! The value element (kv, b, s, h, d) of a layer holds: K values have the top bit clear and V values set, so K and V
//! never agree, and no value equals the poison pattern, so an element nobody wrote is always caught.
template <typename Bits>
__host__ __device__ inline Bits elementValue(uint64_t salt, int64_t kv, int64_t b, int64_t s, int64_t h, int64_t d)
{
    uint64_t x = mix64(salt + 1);
    x = mix64(x ^ static_cast<uint64_t>(b));
    x = mix64(x ^ static_cast<uint64_t>(s));
    x = mix64(x ^ static_cast<uint64_t>(h));
    x = mix64(x ^ static_cast<uint64_t>(d));
    uint64_t const topBit = uint64_t{1} << (8 * sizeof(Bits) - 1);
    uint64_t value = (x & (topBit - 1)) | (kv != 0 ? topBit : 0);
    if (static_cast<Bits>(value) == poisonBits<Bits>())
    {
        value ^= 1;
    }
    return static_cast<Bits>(value);
}

//! A view as kernels and host checks use it: element offset of element (0, ..., 0) from the buffer start, strides.
struct ViewMap
{
    int64_t start = 0;
    int64_t stride[5] = {};
};

//! The logical extents of a layer's slot space: [2, batch, capPadded, heads, headDim].
struct SlotExtents
{
    int64_t batch;
    int64_t capPadded;
    int64_t heads;
    int64_t headDim;
};

__host__ __device__ inline int64_t slotElementCount(SlotExtents const& ext)
{
    return 2 * ext.batch * ext.capPadded * ext.heads * ext.headDim;
}

//! Splits a linear index over [2, batch, capPadded, heads, headDim] into (kv, b, s, h, d).
__host__ __device__ inline void splitSlotIndex(int64_t i, SlotExtents const& ext, int64_t (&idx)[5])
{
    idx[4] = i % ext.headDim;
    i /= ext.headDim;
    idx[3] = i % ext.heads;
    i /= ext.heads;
    idx[2] = i % ext.capPadded;
    i /= ext.capPadded;
    idx[1] = i % ext.batch;
    idx[0] = i / ext.batch;
}

//! Writes every element (kv, b, s, h, d) through a slot view; offsets outside the buffer are counted, not written.
template <typename Bits>
__global__ void writeSlotViewKernel(
    Bits* buffer, int64_t bufferElems, ViewMap view, SlotExtents ext, uint64_t salt, unsigned long long* badWrites)
{
    int64_t const total = slotElementCount(ext);
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x)
    {
        int64_t idx[5];
        splitSlotIndex(i, ext, idx);
        int64_t const elem = view.start + idx[0] * view.stride[0] + idx[1] * view.stride[1] + idx[2] * view.stride[2]
            + idx[3] * view.stride[3] + idx[4] * view.stride[4];
        if (elem < 0 || elem >= bufferElems)
        {
            atomicAdd(badWrites, 1ull);
            continue;
        }
        buffer[elem] = elementValue<Bits>(salt, idx[0], idx[1], idx[2], idx[3], idx[4]);
    }
}

//! Writes every element (kv, b, s, h, d) through the pool view, token s of slot b living at token s % P of page
//! pageTable[b * pagesPerSlot + s / P], as a paged attention kernel would.
template <typename Bits>
__global__ void writePagedKernel(Bits* buffer, int64_t bufferElems, ViewMap pool, SlotExtents ext,
    int64_t tokensPerPage, int64_t pagesPerSlot, int32_t const* pageTable, uint64_t salt, unsigned long long* badWrites)
{
    int64_t const total = slotElementCount(ext);
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x)
    {
        int64_t idx[5];
        splitSlotIndex(i, ext, idx);
        int64_t const page = pageTable[idx[1] * pagesPerSlot + idx[2] / tokensPerPage];
        int64_t const token = idx[2] % tokensPerPage;
        int64_t const elem = pool.start + idx[0] * pool.stride[0] + page * pool.stride[1] + token * pool.stride[2]
            + idx[3] * pool.stride[3] + idx[4] * pool.stride[4];
        if (elem < 0 || elem >= bufferElems)
        {
            atomicAdd(badWrites, 1ull);
            continue;
        }
        buffer[elem] = elementValue<Bits>(salt, idx[0], idx[1], idx[2], idx[3], idx[4]);
    }
}

unsigned int gridFor(int64_t total)
{
    return static_cast<unsigned int>(std::min<int64_t>((total + kBLOCK_SIZE - 1) / kBLOCK_SIZE, 2048));
}

// ---------------------------------------------------------------------------------------------------------------
// Host-side reading of copied buffers.

//! Maps `view` onto a buffer starting at `base` whose elements are `elementBytes` wide.
::testing::AssertionResult mapView(
    Tensor const& view, void const* base, int64_t elementBytes, int32_t rank, ViewMap& map)
{
    if (view.getShape().getNumDims() != rank || view.getStride().getNumDims() != rank)
    {
        return ::testing::AssertionFailure()
            << "view has rank " << view.getShape().getNumDims() << ", expected " << rank;
    }
    int64_t const bytes = byteDistance(base, view.rawPointer());
    if (bytes % elementBytes != 0)
    {
        return ::testing::AssertionFailure() << "view starts " << bytes << " bytes into the buffer, not on an element";
    }
    map = ViewMap{};
    map.start = bytes / elementBytes;
    for (int32_t dim = 0; dim < rank; ++dim)
    {
        map.stride[dim] = view.getStride()[dim];
    }
    return ::testing::AssertionSuccess();
}

//! Counts mismatching elements and keeps a description of the first.
class MismatchLog
{
public:
    template <typename Bits>
    void check(std::vector<Bits> const& buffer, int64_t elem, Bits expected, char const* what,
        std::array<int64_t, 5> const& idx)
    {
        bool const inside = elem >= 0 && elem < static_cast<int64_t>(buffer.size());
        if (inside && buffer[elem] == expected)
        {
            return;
        }
        if (mCount == 0)
        {
            std::ostringstream out;
            out << what << " (" << idx[0] << ", " << idx[1] << ", " << idx[2] << ", " << idx[3] << ", " << idx[4]
                << ") at element " << elem << ": ";
            if (inside)
            {
                out << "read 0x" << std::hex << uint64_t{buffer[elem]};
            }
            else
            {
                out << "outside the " << buffer.size() << "-element buffer";
            }
            out << ", expected 0x" << std::hex << uint64_t{expected};
            mFirst = out.str();
        }
        ++mCount;
    }
    int64_t count() const
    {
        return mCount;
    }
    std::string const& first() const
    {
        return mFirst;
    }

private:
    int64_t mCount{0};
    std::string mFirst;
};

template <typename Bits>
void copyToHost(void const* base, int64_t elems, cudaStream_t stream, std::vector<Bits>& host)
{
    host.assign(static_cast<std::size_t>(elems), Bits{0});
    KVCACHE_TEST_CUDA(cudaMemcpyAsync(
        host.data(), base, static_cast<std::size_t>(elems) * sizeof(Bits), cudaMemcpyDeviceToHost, stream));
    KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream));
}

void expectNoBadWrites(unsigned long long const* counter, cudaStream_t stream)
{
    unsigned long long bad = 0;
    KVCACHE_TEST_CUDA(cudaMemcpyAsync(&bad, counter, sizeof(bad), cudaMemcpyDeviceToHost, stream));
    KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(bad, 0u) << "writes through the view computed offsets outside the layer's buffer";
}

//! Poisons every layer's whole buffer, then writes every element through its slot view with salt saltBase + layer.
template <typename Bits>
void poisonAndWriteSlotViews(KVCacheManager& manager, ModelLayout const& model, uint64_t saltBase, cudaStream_t stream,
    unsigned long long* badWrites)
{
    KVCACHE_TEST_CUDA(cudaMemsetAsync(badWrites, 0, sizeof(unsigned long long), stream));
    ASSERT_EQ(manager.numLayers(), static_cast<int32_t>(model.layers.size()));
    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        ModelLayer const& ml = model.layers[layer];
        auto* const base = static_cast<Bits*>(manager.kPoolPtr(layer));
        int64_t const bufferElems = 2 * ml.halfElems;
        KVCACHE_TEST_CUDA(
            cudaMemsetAsync(base, kPOISON_BYTE, static_cast<std::size_t>(bufferElems) * sizeof(Bits), stream));
        ViewMap slot;
        ASSERT_TRUE(mapView(manager.getCombinedKVCache(layer), base, sizeof(Bits), 5, slot)) << "layer " << layer;
        SlotExtents const ext{model.batch, model.capPadded, ml.heads, ml.headDim};
        writeSlotViewKernel<Bits><<<gridFor(slotElementCount(ext)), kBLOCK_SIZE, 0, stream>>>(
            base, bufferElems, slot, ext, saltBase + static_cast<uint64_t>(layer), badWrites);
        KVCACHE_TEST_CUDA(cudaGetLastError());
    }
}

//! Reads back what poisonAndWriteSlotViews wrote, through the pool view (identity page table) and the separate K
//! and V views of every layer, and checks that no poison is left anywhere in the buffers.
template <typename Bits>
void verifySlotWrite(KVCacheManager& manager, ModelLayout const& model, uint64_t saltBase, cudaStream_t stream)
{
    int64_t const elementBytes = sizeof(Bits);
    int64_t const tokensPerPage = model.tokensPerPage;
    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        SCOPED_TRACE("layer " + std::to_string(layer));
        ModelLayer const& ml = model.layers[layer];
        uint64_t const salt = saltBase + static_cast<uint64_t>(layer);
        void const* base = manager.kPoolPtr(layer);
        std::vector<Bits> host;
        ASSERT_NO_FATAL_FAILURE(copyToHost(base, 2 * ml.halfElems, stream, host));

        ViewMap pool;
        ViewMap kView;
        ViewMap vView;
        ASSERT_TRUE(mapView(manager.getCombinedKVCachePoolView(layer), base, elementBytes, 5, pool));
        std::pair<Tensor, Tensor> const separate = manager.getSeparateKVCache(layer);
        ASSERT_TRUE(mapView(separate.first, base, elementBytes, 4, kView));
        ASSERT_TRUE(mapView(separate.second, base, elementBytes, 4, vView));

        MismatchLog poolLog;
        for (int64_t kv = 0; kv < 2; ++kv)
        {
            for (int64_t page = 0; page < model.numPages; ++page)
            {
                int64_t const b = page / model.pagesPerSlot;
                for (int64_t t = 0; t < tokensPerPage; ++t)
                {
                    int64_t const s = (page % model.pagesPerSlot) * tokensPerPage + t;
                    for (int64_t h = 0; h < ml.heads; ++h)
                    {
                        for (int64_t d = 0; d < ml.headDim; ++d)
                        {
                            int64_t const elem = pool.start + kv * pool.stride[0] + page * pool.stride[1]
                                + t * pool.stride[2] + h * pool.stride[3] + d * pool.stride[4];
                            poolLog.check(
                                host, elem, elementValue<Bits>(salt, kv, b, s, h, d), "pool view", {kv, page, t, h, d});
                        }
                    }
                }
            }
        }
        EXPECT_EQ(poolLog.count(), 0) << "first: " << poolLog.first();

        MismatchLog separateLog;
        for (int64_t kv = 0; kv < 2; ++kv)
        {
            ViewMap const& view = kv == 0 ? kView : vView;
            for (int64_t b = 0; b < model.batch; ++b)
            {
                for (int64_t s = 0; s < model.capPadded; ++s)
                {
                    for (int64_t h = 0; h < ml.heads; ++h)
                    {
                        for (int64_t d = 0; d < ml.headDim; ++d)
                        {
                            int64_t const elem = view.start + b * view.stride[0] + s * view.stride[1]
                                + h * view.stride[2] + d * view.stride[3];
                            separateLog.check(host, elem, elementValue<Bits>(salt, kv, b, s, h, d),
                                kv == 0 ? "separate K view" : "separate V view", {kv, b, s, h, d});
                        }
                    }
                }
            }
        }
        EXPECT_EQ(separateLog.count(), 0) << "first: " << separateLog.first();

        EXPECT_EQ(std::count(host.begin(), host.end(), poisonBits<Bits>()), 0)
            << "elements the slot view never reached";
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Fixtures.

class KVCacheManagerGpuTest : public kvcache::test::GpuTest
{
};

class KVCacheManagerDeathTest : public kvcache::test::GpuTest
{
};

template <typename T>
class KVCacheManagerTypedTest : public kvcache::test::TypedGpuTest<T>
{
};

TYPED_TEST_SUITE(KVCacheManagerTypedTest, KVDataTypes, DataTypeNames);

// ---------------------------------------------------------------------------------------------------------------
// Geometry of the views.

//! A page size and what 1000 tokens round up to in it, worked out by hand.
struct PageCase
{
    int32_t tokensPerPage;
    int64_t capPadded;
    int64_t pagesPerSlot;
};

// 1000 tokens: 63 pages of 16 (1008 tokens), 16 pages of 64 (1024), 8 pages of 128 (1024).
constexpr PageCase kPAGE_CASES[] = {{16, 1008, 63}, {64, 1024, 16}, {128, 1024, 8}};
constexpr int32_t kSEQUENCE_LENGTH = 1000;

TYPED_TEST(KVCacheManagerTypedTest, ViewShapesStridesAndPointers)
{
    using Bits = typename TypeParam::Bits;
    constexpr DataType kTYPE = TypeParam::kTYPE;
    int64_t const e = sizeof(Bits);
    int64_t const batch = 3;
    for (PageCase const& pageCase : kPAGE_CASES)
    {
        SCOPED_TRACE("tokensPerPage " + std::to_string(pageCase.tokensPerPage));
        Stream stream;
        KVCACHE_TEST_CUDA(stream.status());
        KVCacheManager manager(
            makeConfig(kHETEROGENEOUS_LAYERS, batch, kSEQUENCE_LENGTH, pageCase.tokensPerPage, kTYPE), stream.get());

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

        std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
        int64_t cacheBytes = 0;
        for (int32_t layer = 0; layer < 4; ++layer)
        {
            SCOPED_TRACE("layer " + std::to_string(layer));
            int64_t const h = kHETEROGENEOUS_LAYERS[layer].numKVHeads;
            int64_t const d = kHETEROGENEOUS_LAYERS[layer].headDim;
            int64_t const halfBytes = numPages * tokensPerPage * h * d * e;
            int64_t const layerBytes = 2 * halfBytes;
            cacheBytes += layerBytes;

            EXPECT_EQ(manager.getLayerConfig(layer).numKVHeads, h);
            EXPECT_EQ(manager.getLayerConfig(layer).headDim, d);
            EXPECT_EQ(manager.getLayout().layers.at(layer).layerBytes, layerBytes);

            void const* base = manager.kPoolPtr(layer);
            ASSERT_NE(base, nullptr);
            EXPECT_EQ(byteDistance(base, manager.vPoolPtr(layer)), halfBytes);
            EXPECT_TRUE(viewIs(manager.getCombinedKVCache(layer), base, 0, {2, batch, cap, h, d},
                {batch * cap * h * d, cap * h * d, h * d, d, 1}, kTYPE))
                << "slot view";
            EXPECT_TRUE(viewIs(manager.getCombinedKVCachePoolView(layer), base, 0, {2, numPages, tokensPerPage, h, d},
                {numPages * tokensPerPage * h * d, tokensPerPage * h * d, h * d, d, 1}, kTYPE))
                << "pool view";
            std::pair<Tensor, Tensor> const separate = manager.getSeparateKVCache(layer);
            EXPECT_TRUE(viewIs(separate.first, base, 0, {batch, cap, h, d}, {cap * h * d, h * d, d, 1}, kTYPE))
                << "separate K view";
            EXPECT_TRUE(viewIs(separate.second, base, halfBytes, {batch, cap, h, d}, {cap * h * d, h * d, d, 1}, kTYPE))
                << "separate V view";

            auto const start = reinterpret_cast<std::uintptr_t>(base);
            ranges.emplace_back(start, start + static_cast<std::uintptr_t>(layerBytes));
        }
        EXPECT_EQ(manager.getLayout().cacheBytes, cacheBytes);

        std::sort(ranges.begin(), ranges.end());
        for (std::size_t i = 1; i < ranges.size(); ++i)
        {
            EXPECT_LE(ranges[i - 1].second, ranges[i].first) << "two layers' buffers overlap";
        }
    }
}

TYPED_TEST(KVCacheManagerTypedTest, RetainedPagesRefuseSlotViewAndKeepOtherViews)
{
    using Bits = typename TypeParam::Bits;
    constexpr DataType kTYPE = TypeParam::kTYPE;
    int64_t const e = sizeof(Bits);
    int64_t const batch = 3;
    int64_t const tokensPerPage = 64;
    int64_t const cap = 1024;    // 1000 tokens in 16 pages of 64
    int64_t const minPages = 48; // 3 slots of 16 pages
    int64_t const numPages = 55; // 7 retained pages
    Stream stream;
    KVCACHE_TEST_CUDA(stream.status());
    KVCacheManager manager(
        makeConfig(kHETEROGENEOUS_LAYERS, batch, kSEQUENCE_LENGTH, tokensPerPage, kTYPE, numPages), stream.get());
    EXPECT_EQ(manager.minPages(), minPages);
    ASSERT_EQ(manager.numPages(), numPages);
    EXPECT_EQ(manager.maxCapPadded(), cap);
    ASSERT_EQ(manager.numLayers(), 4);

    for (int32_t layer = 0; layer < 4; ++layer)
    {
        SCOPED_TRACE("layer " + std::to_string(layer));
        std::string message;
        ASSERT_TRUE(throwsWithMessage<kvcache::rt::InvalidConfigError>(
            [&] { static_cast<void>(manager.getCombinedKVCache(layer)); }, message));
        for (char const* name : {"getCombinedKVCachePoolView", "getSeparateKVCache", "kPoolPtr", "vPoolPtr"})
        {
            EXPECT_TRUE(contains(message, name)) << "message does not name " << name << ": " << message;
        }

        int64_t const h = kHETEROGENEOUS_LAYERS[layer].numKVHeads;
        int64_t const d = kHETEROGENEOUS_LAYERS[layer].headDim;
        int64_t const halfBytes = numPages * tokensPerPage * h * d * e;
        void const* base = manager.kPoolPtr(layer);
        ASSERT_NE(base, nullptr);
        EXPECT_EQ(byteDistance(base, manager.vPoolPtr(layer)), halfBytes);
        EXPECT_EQ(manager.getLayout().layers.at(layer).layerBytes, 2 * halfBytes);
        EXPECT_TRUE(viewIs(manager.getCombinedKVCachePoolView(layer), base, 0, {2, numPages, tokensPerPage, h, d},
            {numPages * tokensPerPage * h * d, tokensPerPage * h * d, h * d, d, 1}, kTYPE))
            << "pool view";
        std::pair<Tensor, Tensor> const separate = manager.getSeparateKVCache(layer);
        EXPECT_TRUE(viewIs(separate.first, base, 0, {batch, cap, h, d}, {cap * h * d, h * d, d, 1}, kTYPE))
            << "separate K view";
        EXPECT_TRUE(viewIs(separate.second, base, halfBytes, {batch, cap, h, d}, {cap * h * d, h * d, d, 1}, kTYPE))
            << "separate V view";
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Data written through one view and read through the others.

TYPED_TEST(KVCacheManagerTypedTest, SlotViewWritesReadBackThroughPoolAndSeparateViews)
{
    using Bits = typename TypeParam::Bits;
    Stream stream;
    KVCACHE_TEST_CUDA(stream.status());
    DeviceBuffer badWrites(sizeof(unsigned long long));
    KVCACHE_TEST_CUDA(badWrites.status());
    KVCacheManager::Config const config = makeConfig(kHETEROGENEOUS_LAYERS, 2, kSEQUENCE_LENGTH, 64, TypeParam::kTYPE);
    ModelLayout const model = modelLayout(config);
    KVCacheManager manager(config, stream.get());

    ASSERT_NO_FATAL_FAILURE(
        poisonAndWriteSlotViews<Bits>(manager, model, 0, stream.get(), badWrites.as<unsigned long long>()));
    ASSERT_NO_FATAL_FAILURE(expectNoBadWrites(badWrites.as<unsigned long long>(), stream.get()));
    verifySlotWrite<Bits>(manager, model, 0, stream.get());
}

TYPED_TEST(KVCacheManagerTypedTest, PagedWritesReadBackThroughPageTable)
{
    using Bits = typename TypeParam::Bits;
    int64_t const e = sizeof(Bits);
    Stream stream;
    KVCACHE_TEST_CUDA(stream.status());
    DeviceBuffer badWrites(sizeof(unsigned long long));
    KVCACHE_TEST_CUDA(badWrites.status());
    // 2 slots of 16 pages use 32 of 35 pages; 3 stay unowned and must keep their poison.
    KVCacheManager::Config const config =
        makeConfig(kHETEROGENEOUS_LAYERS, 2, kSEQUENCE_LENGTH, 64, TypeParam::kTYPE, 35);
    ModelLayout const model = modelLayout(config);
    KVCacheManager manager(config, stream.get());
    ASSERT_EQ(manager.numPages(), 35);
    ASSERT_EQ(manager.numLayers(), 4);

    std::vector<int32_t> permutation(static_cast<std::size_t>(model.numPages));
    for (std::size_t i = 0; i < permutation.size(); ++i)
    {
        permutation[i] = static_cast<int32_t>(i);
    }
    std::mt19937 random(20240611u);
    std::shuffle(permutation.begin(), permutation.end(), random);
    std::vector<int32_t> const pageTable(permutation.begin(), permutation.begin() + model.minPages);
    std::vector<int32_t> const unowned(permutation.begin() + model.minPages, permutation.end());
    bool identity = true;
    for (std::size_t i = 0; i < pageTable.size(); ++i)
    {
        identity = identity && pageTable[i] == static_cast<int32_t>(i);
    }
    ASSERT_FALSE(identity);

    DeviceBuffer devicePageTable(pageTable.size() * sizeof(int32_t));
    KVCACHE_TEST_CUDA(devicePageTable.status());
    KVCACHE_TEST_CUDA(cudaMemcpyAsync(devicePageTable.as<int32_t>(), pageTable.data(),
        pageTable.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream.get()));
    KVCACHE_TEST_CUDA(cudaMemsetAsync(badWrites.as<unsigned long long>(), 0, sizeof(unsigned long long), stream.get()));
    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        ModelLayer const& ml = model.layers[layer];
        auto* const base = static_cast<Bits*>(manager.kPoolPtr(layer));
        int64_t const bufferElems = 2 * ml.halfElems;
        KVCACHE_TEST_CUDA(
            cudaMemsetAsync(base, kPOISON_BYTE, static_cast<std::size_t>(bufferElems) * sizeof(Bits), stream.get()));
        ViewMap pool;
        ASSERT_TRUE(mapView(manager.getCombinedKVCachePoolView(layer), base, e, 5, pool));
        SlotExtents const ext{model.batch, model.capPadded, ml.heads, ml.headDim};
        writePagedKernel<Bits><<<gridFor(slotElementCount(ext)), kBLOCK_SIZE, 0, stream.get()>>>(base, bufferElems,
            pool, ext, model.tokensPerPage, model.pagesPerSlot, devicePageTable.as<int32_t>(),
            static_cast<uint64_t>(layer), badWrites.as<unsigned long long>());
        KVCACHE_TEST_CUDA(cudaGetLastError());
    }
    ASSERT_NO_FATAL_FAILURE(expectNoBadWrites(badWrites.as<unsigned long long>(), stream.get()));

    int64_t const tokensPerPage = model.tokensPerPage;
    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        SCOPED_TRACE("layer " + std::to_string(layer));
        ModelLayer const& ml = model.layers[layer];
        void const* base = manager.kPoolPtr(layer);
        std::vector<Bits> host;
        ASSERT_NO_FATAL_FAILURE(copyToHost(base, 2 * ml.halfElems, stream.get(), host));
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
            for (int64_t b = 0; b < model.batch; ++b)
            {
                for (int64_t s = 0; s < model.capPadded; ++s)
                {
                    int64_t const page =
                        pageTable[static_cast<std::size_t>(b * model.pagesPerSlot + s / tokensPerPage)];
                    int64_t const t = s % tokensPerPage;
                    for (int64_t h = 0; h < ml.heads; ++h)
                    {
                        for (int64_t d = 0; d < ml.headDim; ++d)
                        {
                            Bits const expected = elementValue<Bits>(static_cast<uint64_t>(layer), kv, b, s, h, d);
                            int64_t const viewElem = pool.start + kv * pool.stride[0] + page * pool.stride[1]
                                + t * pool.stride[2] + h * pool.stride[3] + d * pool.stride[4];
                            poolLog.check(host, viewElem, expected, "pool view via page table", {kv, page, t, h, d});
                            int64_t const formulaElem =
                                halfStart[kv] + ((page * tokensPerPage + t) * ml.heads + h) * ml.headDim + d;
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

// ---------------------------------------------------------------------------------------------------------------
// Device memory.

TEST_F(KVCacheManagerGpuTest, DeviceMemoryMatchesLayout)
{
    DedicatedPool pool;
    KVCACHE_TEST_CUDA(pool.status());
    Stream stream;
    KVCACHE_TEST_CUDA(stream.status());
    std::uint64_t usedBefore = 0;
    KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), usedBefore));

    // 4 slots of 1024 tokens in float16: 16 MiB, 2 MiB, 16 MiB and 1.25 MiB, worked out by hand.
    int64_t const expectedCacheBytes = 16 * kMIB + 2 * kMIB + 16 * kMIB + 5 * kMIB / 4;
    KVCacheManager::Config const config =
        makeConfig(kHETEROGENEOUS_LAYERS, 4, kSEQUENCE_LENGTH, 128, DataType::kHALF, 0, pool.get());
    {
        KVCacheManager manager(config, stream.get());
        KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream.get()));
        EXPECT_EQ(manager.getLayout().cacheBytes, expectedCacheBytes);
        EXPECT_EQ(modelLayout(config).cacheBytes, expectedCacheBytes);

        std::uint64_t usedDuring = 0;
        KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), usedDuring));
        auto const taken = static_cast<int64_t>(usedDuring - usedBefore);
        int64_t const tableBytes =
            manager.numLayers() * static_cast<int64_t>(sizeof(kvcache::rt::detail::LayerTableEntry));
        EXPECT_GE(taken, expectedCacheBytes) << "the pool holds less than the layout needs";
        EXPECT_LE(taken, expectedCacheBytes + tableBytes + (manager.numLayers() + 1) * kALLOCATION_GRANULARITY)
            << "the pool holds more than the layout, the layer table and allocation rounding explain";
    }
    KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream.get()));
    std::uint64_t usedAfter = 0;
    KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), usedAfter));
    EXPECT_EQ(usedAfter, usedBefore) << "memory not returned after destruction";
}

TEST_F(KVCacheManagerGpuTest, OutOfMemoryFreesPartialAllocation)
{
    DedicatedPool pool;
    KVCACHE_TEST_CUDA(pool.status());
    Stream stream;
    KVCACHE_TEST_CUDA(stream.status());
    std::size_t freeBefore = 0;
    std::size_t totalMemory = 0;
    KVCACHE_TEST_CUDA(cudaMemGetInfo(&freeBefore, &totalMemory));
    std::uint64_t usedBefore = 0;
    KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), usedBefore));

    // Layer 0 takes 4 KiB per page and fits; layer 1 takes 16 MiB per page, twice the GPU's memory in all.
    int64_t const bytesPerPageOfLayer1 = 2 * 128 * 128 * 256 * 2;
    int64_t const numPages = (2 * static_cast<int64_t>(totalMemory) + bytesPerPageOfLayer1 - 1) / bytesPerPageOfLayer1;
    ASSERT_LE(numPages, kvcache::rt::kMAX_NUM_PAGES);
    int64_t const layer0Bytes = numPages * 2 * 128 * 1 * 8 * 2;
    int64_t const layer1Bytes = numPages * bytesPerPageOfLayer1;
    KVCacheManager::Config const config =
        makeConfig({{1, 8}, {128, 256}}, 1, 128, 128, DataType::kHALF, static_cast<int32_t>(numPages), pool.get());

    std::string message;
    EXPECT_TRUE(throwsWithMessage<kvcache::rt::OutOfMemoryError>(
        [&] { KVCacheManager manager(config, stream.get()); }, message));
    EXPECT_TRUE(std::regex_search(message, std::regex("layer[^0-9]{0,16}1([^0-9]|$)", std::regex::icase)))
        << "message does not name layer 1: " << message;
    EXPECT_TRUE(contains(message, std::to_string(layer1Bytes)))
        << "message does not name the " << layer1Bytes << " bytes asked for: " << message;
    EXPECT_TRUE(std::regex_search(message, std::regex("free", std::regex::icase)))
        << "message does not name the free memory: " << message;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failed allocation left a CUDA error behind";

    KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream.get()));
    std::uint64_t usedHigh = 0;
    KVCACHE_TEST_CUDA(getPoolUsedHigh(pool.get(), usedHigh));
    EXPECT_GE(static_cast<int64_t>(usedHigh - usedBefore), layer0Bytes)
        << "layer 0 was never allocated, so freeing a partial allocation was not exercised";
    std::uint64_t usedAfter = 0;
    KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), usedAfter));
    EXPECT_EQ(usedAfter, usedBefore) << "layer 0 was not freed";

    KVCACHE_TEST_CUDA(cudaMemPoolTrimTo(pool.get(), 0));
    std::size_t freeAfter = 0;
    KVCACHE_TEST_CUDA(cudaMemGetInfo(&freeAfter, &totalMemory));
    EXPECT_GE(static_cast<int64_t>(freeAfter) + 8 * kMIB, static_cast<int64_t>(freeBefore))
        << "device memory was not given back";
}

TEST_F(KVCacheManagerGpuTest, ZeroLayersAllocatesNothing)
{
    DedicatedPool pool;
    KVCACHE_TEST_CUDA(pool.status());
    Stream stream;
    KVCACHE_TEST_CUDA(stream.status());
    {
        KVCacheManager manager(makeConfig({}, 2, 100, 64, DataType::kHALF, 0, pool.get()), stream.get());
        EXPECT_EQ(manager.numLayers(), 0);
        EXPECT_TRUE(manager.isUniform());
        EXPECT_EQ(manager.layerTable(), nullptr);
        EXPECT_EQ(manager.getLayout().cacheBytes, 0);
        EXPECT_TRUE(manager.getLayout().layers.empty());
        EXPECT_THROW(static_cast<void>(manager.getCombinedKVCache(0)), std::out_of_range);
        KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream.get()));
    }
    KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream.get()));
    std::uint64_t usedHigh = 0;
    KVCACHE_TEST_CUDA(getPoolUsedHigh(pool.get(), usedHigh));
    EXPECT_EQ(usedHigh, 0u) << "a manager with no layers allocated from the pool";
}

// ---------------------------------------------------------------------------------------------------------------
// Index checks.

TEST_F(KVCacheManagerGpuTest, OutOfRangeLayerThrows)
{
    Stream stream;
    KVCACHE_TEST_CUDA(stream.status());
    KVCacheManager manager(makeConfig({{2, 64}, {1, 32}, {4, 16}}, 1, 64, 64, DataType::kHALF), stream.get());
    ASSERT_EQ(manager.numLayers(), 3);
    for (int32_t index : {-1, 3})
    {
        std::string message;
        EXPECT_TRUE(throwsWithMessage<std::out_of_range>(
            [&] { static_cast<void>(manager.getCombinedKVCache(index)); }, message))
            << "index " << index;
        EXPECT_TRUE(contains(message, std::to_string(index))) << "message does not name " << index << ": " << message;
        EXPECT_TRUE(contains(message, "3")) << "message does not name the layer count: " << message;
    }
    EXPECT_NO_THROW(static_cast<void>(manager.getCombinedKVCache(2)));
}

TEST_F(KVCacheManagerDeathTest, NoexceptAccessorsAbortOnBadIndex)
{
    Stream stream;
    KVCACHE_TEST_CUDA(stream.status());
    KVCacheManager manager(makeConfig({{2, 64}, {1, 32}, {4, 16}}, 1, 64, 64, DataType::kHALF), stream.get());
    ASSERT_EQ(manager.numLayers(), 3);
    // The message must carry the bad index and the layer count (3), in either order.
    std::string const minusOne = "(^|[^0-9-])-1([^0-9]|$)";
    std::string const three = "(^|[^0-9])3([^0-9]|$)";
    std::string const minusOneAndCount = minusOne + ".*" + three + "|" + three + ".*" + minusOne;
    std::string const threeAndCount = "(^|[^0-9])3[^0-9](.*[^0-9])?3([^0-9]|$)";
    EXPECT_DEATH(static_cast<void>(manager.getCombinedKVCachePoolView(-1)), minusOneAndCount);
    EXPECT_DEATH(static_cast<void>(manager.getCombinedKVCachePoolView(3)), threeAndCount);
    EXPECT_DEATH(static_cast<void>(manager.getSeparateKVCache(3)), threeAndCount);
    EXPECT_DEATH(static_cast<void>(manager.kPoolPtr(-1)), minusOneAndCount);
    EXPECT_DEATH(static_cast<void>(manager.vPoolPtr(3)), threeAndCount);
    EXPECT_DEATH(static_cast<void>(manager.getLayerConfig(-1)), minusOneAndCount);
}

// ---------------------------------------------------------------------------------------------------------------
// Moves.

TEST_F(KVCacheManagerGpuTest, MoveConstructionTakesMemoryAndEmptiesSource)
{
    DedicatedPool pool;
    KVCACHE_TEST_CUDA(pool.status());
    Stream stream;
    KVCACHE_TEST_CUDA(stream.status());
    DeviceBuffer badWrites(sizeof(unsigned long long));
    KVCACHE_TEST_CUDA(badWrites.status());
    KVCacheManager::Config const config = makeConfig({{4, 64}, {2, 32}}, 2, 200, 32, DataType::kHALF, 0, pool.get());
    ModelLayout const model = modelLayout(config);
    {
        KVCacheManager source(config, stream.get());
        ASSERT_NO_FATAL_FAILURE(
            poisonAndWriteSlotViews<uint16_t>(source, model, 7, stream.get(), badWrites.as<unsigned long long>()));
        ASSERT_NO_FATAL_FAILURE(expectNoBadWrites(badWrites.as<unsigned long long>(), stream.get()));
        std::vector<void*> const kPointers = {source.kPoolPtr(0), source.kPoolPtr(1)};
        std::vector<void*> const vPointers = {source.vPoolPtr(0), source.vPoolPtr(1)};
        auto const* const table = source.layerTable();
        std::uint64_t usedBefore = 0;
        KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), usedBefore));

        KVCacheManager target(std::move(source));
        KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream.get()));
        ASSERT_EQ(target.numLayers(), 2);
        EXPECT_EQ(target.stream(), stream.get());
        EXPECT_EQ(target.layerTable(), table);
        for (int32_t layer = 0; layer < 2; ++layer)
        {
            EXPECT_EQ(target.kPoolPtr(layer), kPointers[layer]);
            EXPECT_EQ(target.vPoolPtr(layer), vPointers[layer]);
            EXPECT_EQ(target.getCombinedKVCachePoolView(layer).rawPointer(), kPointers[layer]);
            EXPECT_EQ(target.getCombinedKVCache(layer).rawPointer(), kPointers[layer]);
        }
        EXPECT_EQ(source.numLayers(), 0);
        EXPECT_EQ(source.layerTable(), nullptr);
        std::uint64_t usedAfterMove = 0;
        KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), usedAfterMove));
        EXPECT_EQ(usedAfterMove, usedBefore) << "moving allocated or freed memory";
        verifySlotWrite<uint16_t>(target, model, 7, stream.get());
    }
    KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream.get()));
    std::uint64_t usedAtEnd = 0;
    KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), usedAtEnd));
    EXPECT_EQ(usedAtEnd, 0u) << "memory freed twice or never";
}

TEST_F(KVCacheManagerGpuTest, MoveAssignmentFreesTargetMemory)
{
    DedicatedPool pool;
    KVCACHE_TEST_CUDA(pool.status());
    Stream stream;
    KVCACHE_TEST_CUDA(stream.status());
    DeviceBuffer badWrites(sizeof(unsigned long long));
    KVCACHE_TEST_CUDA(badWrites.status());
    KVCacheManager::Config const sourceConfig =
        makeConfig({{4, 64}, {2, 32}}, 2, 200, 32, DataType::kBF16, 0, pool.get());
    KVCacheManager::Config const targetConfig = makeConfig({{8, 128}}, 4, 512, 128, DataType::kHALF, 0, pool.get());
    ModelLayout const model = modelLayout(sourceConfig);
    {
        KVCacheManager source(sourceConfig, stream.get());
        KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream.get()));
        std::uint64_t usedBySource = 0;
        KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), usedBySource));
        KVCacheManager target(targetConfig, stream.get());
        KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream.get()));
        std::uint64_t usedByBoth = 0;
        KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), usedByBoth));
        ASSERT_GE(static_cast<int64_t>(usedByBoth - usedBySource), modelLayout(targetConfig).cacheBytes);

        ASSERT_NO_FATAL_FAILURE(
            poisonAndWriteSlotViews<uint16_t>(source, model, 11, stream.get(), badWrites.as<unsigned long long>()));
        ASSERT_NO_FATAL_FAILURE(expectNoBadWrites(badWrites.as<unsigned long long>(), stream.get()));
        void* const sourceK0 = source.kPoolPtr(0);
        auto const* const sourceTable = source.layerTable();

        target = std::move(source);
        KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream.get()));
        std::uint64_t usedAfterAssign = 0;
        KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), usedAfterAssign));
        EXPECT_EQ(usedAfterAssign, usedBySource) << "the target's own memory was not freed";
        ASSERT_EQ(target.numLayers(), 2);
        EXPECT_EQ(target.kPoolPtr(0), sourceK0);
        EXPECT_EQ(target.layerTable(), sourceTable);
        EXPECT_EQ(target.getConfig().kvCacheType, DataType::kBF16);
        EXPECT_EQ(source.numLayers(), 0);
        EXPECT_EQ(source.layerTable(), nullptr);
        verifySlotWrite<uint16_t>(target, model, 11, stream.get());

        // Self-move may keep the memory or give it up, but never half of each.
        KVCacheManager& alias = target;
        target = std::move(alias);
        KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream.get()));
        std::uint64_t usedAfterSelfMove = 0;
        KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), usedAfterSelfMove));
        if (target.numLayers() == 2)
        {
            EXPECT_EQ(target.kPoolPtr(0), sourceK0);
            EXPECT_EQ(usedAfterSelfMove, usedBySource);
            verifySlotWrite<uint16_t>(target, model, 11, stream.get());
        }
        else
        {
            EXPECT_EQ(target.numLayers(), 0);
            EXPECT_EQ(usedAfterSelfMove, 0u);
        }

        // Moving into the emptied source works too.
        bool const kept = target.numLayers() == 2;
        source = std::move(target);
        EXPECT_EQ(target.numLayers(), 0);
        if (kept)
        {
            ASSERT_EQ(source.numLayers(), 2);
            EXPECT_EQ(source.kPoolPtr(0), sourceK0);
        }
    }
    KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream.get()));
    std::uint64_t usedAtEnd = 0;
    KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), usedAtEnd));
    EXPECT_EQ(usedAtEnd, 0u) << "memory freed twice or never";
}

// ---------------------------------------------------------------------------------------------------------------
// Several managers.

TEST_F(KVCacheManagerGpuTest, SeveralManagersOnSeveralStreams)
{
    DedicatedPool pool;
    KVCACHE_TEST_CUDA(pool.status());
    std::array<Stream, 3> streams;
    for (Stream const& stream : streams)
    {
        KVCACHE_TEST_CUDA(stream.status());
    }
    DeviceBuffer badWrites(3 * sizeof(unsigned long long));
    KVCACHE_TEST_CUDA(badWrites.status());
    std::array<KVCacheManager::Config, 3> const configs = {
        makeConfig({{4, 64}, {2, 128}}, 2, 300, 32, DataType::kHALF, 0, pool.get()),
        makeConfig({{2, 64}, {2, 64}, {2, 64}}, 3, 130, 128, DataType::kBF16, 0, pool.get()),
        makeConfig({{8, 32}}, 1, 1000, 256, DataType::kFP8_E4M3, 0, pool.get()),
    };
    std::array<ModelLayout, 3> const models = {
        modelLayout(configs[0]), modelLayout(configs[1]), modelLayout(configs[2])};
    std::array<uint64_t, 3> const salts = {100, 200, 300};

    std::array<std::optional<KVCacheManager>, 3> managers;
    std::array<std::uint64_t, 3> usedBy = {};
    std::uint64_t usedSoFar = 0;
    KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), usedSoFar));
    for (std::size_t i = 0; i < 3; ++i)
    {
        managers[i].emplace(configs[i], streams[i].get());
        KVCACHE_TEST_CUDA(cudaStreamSynchronize(streams[i].get()));
        std::uint64_t used = 0;
        KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), used));
        usedBy[i] = used - usedSoFar;
        usedSoFar = used;
        EXPECT_GE(static_cast<int64_t>(usedBy[i]), models[i].cacheBytes) << "manager " << i;
        EXPECT_EQ(managers[i]->stream(), streams[i].get());
    }

    unsigned long long* const counters = badWrites.as<unsigned long long>();
    ASSERT_NO_FATAL_FAILURE(
        poisonAndWriteSlotViews<uint16_t>(*managers[0], models[0], salts[0], streams[0].get(), counters));
    ASSERT_NO_FATAL_FAILURE(
        poisonAndWriteSlotViews<uint16_t>(*managers[1], models[1], salts[1], streams[1].get(), counters + 1));
    ASSERT_NO_FATAL_FAILURE(
        poisonAndWriteSlotViews<uint8_t>(*managers[2], models[2], salts[2], streams[2].get(), counters + 2));
    for (std::size_t i = 0; i < 3; ++i)
    {
        ASSERT_NO_FATAL_FAILURE(expectNoBadWrites(counters + i, streams[i].get()));
    }
    {
        SCOPED_TRACE("manager 0");
        verifySlotWrite<uint16_t>(*managers[0], models[0], salts[0], streams[0].get());
    }
    {
        SCOPED_TRACE("manager 1");
        verifySlotWrite<uint16_t>(*managers[1], models[1], salts[1], streams[1].get());
    }
    {
        SCOPED_TRACE("manager 2");
        verifySlotWrite<uint8_t>(*managers[2], models[2], salts[2], streams[2].get());
    }

    std::uint64_t expectedUsed = usedSoFar;
    for (std::size_t i : {std::size_t{1}, std::size_t{2}, std::size_t{0}})
    {
        managers[i].reset();
        KVCACHE_TEST_CUDA(cudaStreamSynchronize(streams[i].get()));
        expectedUsed -= usedBy[i];
        std::uint64_t used = 0;
        KVCACHE_TEST_CUDA(getPoolUsed(pool.get(), used));
        EXPECT_EQ(used, expectedUsed) << "after destroying manager " << i;
    }
}

} // namespace
