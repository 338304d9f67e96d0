#pragma once

// Values written through one of a manager's views on the device and read back through the others on the host: the
// element values, the kernel that writes them and the host-side checks. Shared by the manager's view, lifetime and
// LayerRef tests, so that each checks data the same way.

#include "kvcache/core/tensor.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/layer_ref.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/cuda_raii.h"
#include "support/gpu_test.h"
#include "support/layout_expectations.h"
#include "support/layout_model.h"

namespace kvcache::test
{

//! Byte every buffer is filled with before a kernel writes it.
inline constexpr int kPOISON_BYTE = 0xA5;
inline constexpr int kBLOCK_SIZE = 256;

//! Returns the signed distance in bytes from `from` to `to`.
__host__ __device__ inline int64_t byteDistance(void const* from, void const* to)
{
    return static_cast<int64_t>(reinterpret_cast<uintptr_t>(to) - reinterpret_cast<uintptr_t>(from));
}

//! Returns a grid of kBLOCK_SIZE blocks for a grid-stride loop over `total` elements.
inline unsigned int gridFor(int64_t total)
{
    return static_cast<unsigned int>(std::min<int64_t>((total + kBLOCK_SIZE - 1) / kBLOCK_SIZE, 2048));
}

__host__ __device__ inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

//! Returns an element of a buffer filled with kPOISON_BYTE.
template <typename Bits>
__host__ __device__ inline Bits poisonBits()
{
    return static_cast<Bits>(0xA5A5A5A5u);
}

//! The value element (kv, a, b, c, d) of a layer holds, `salt` naming the layer and the writer: K values have the top
//! bit clear and V values set, so K and V never agree; no value is zero or the poison pattern, so an element nobody
//! wrote is always caught.
template <typename Bits>
__host__ __device__ inline Bits elementValue(uint64_t salt, int64_t kv, int64_t a, int64_t b, int64_t c, int64_t d)
{
    uint64_t x = mix64(salt + 1);
    x = mix64(x ^ static_cast<uint64_t>(a));
    x = mix64(x ^ static_cast<uint64_t>(b));
    x = mix64(x ^ static_cast<uint64_t>(c));
    x = mix64(x ^ static_cast<uint64_t>(d));
    uint64_t const topBit = uint64_t{1} << (8 * sizeof(Bits) - 1);
    uint64_t value = (x & (topBit - 1)) | (kv != 0 ? topBit : 0);
    if (value == 0 || static_cast<Bits>(value) == poisonBits<Bits>())
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

//! Where token s of slot b lives: through `view`'s slot strides when `pageTable` is null, else at token s % P of page
//! pageTable[b * pagesPerSlot + s / P] through `view`'s pool strides, as a paged attention kernel finds it.
struct SlotAddressing
{
    ViewMap view;
    int32_t const* pageTable = nullptr;
    int64_t tokensPerPage = 0;
    int64_t pagesPerSlot = 0;
};

__host__ __device__ inline int64_t slotElementCount(SlotExtents const& ext)
{
    return 2 * ext.batch * ext.capPadded * ext.heads * ext.headDim;
}

//! Returns the element offset of slot element (kv, b, s, h, d) under `at`.
__device__ inline int64_t slotElementOffset(SlotAddressing const& at, int64_t const (&idx)[5])
{
    ViewMap const& v = at.view;
    if (at.pageTable == nullptr)
    {
        return v.start + idx[0] * v.stride[0] + idx[1] * v.stride[1] + idx[2] * v.stride[2] + idx[3] * v.stride[3]
            + idx[4] * v.stride[4];
    }
    int64_t const page = at.pageTable[idx[1] * at.pagesPerSlot + idx[2] / at.tokensPerPage];
    int64_t const token = idx[2] % at.tokensPerPage;
    return v.start + idx[0] * v.stride[0] + page * v.stride[1] + token * v.stride[2] + idx[3] * v.stride[3]
        + idx[4] * v.stride[4];
}

//! Writes every slot element (kv, b, s, h, d) where `at` puts it; offsets outside the buffer are counted, not written.
template <typename Bits>
__global__ void writeSlotsKernel(
    Bits* buffer, int64_t bufferElems, SlotAddressing at, SlotExtents ext, uint64_t salt, unsigned long long* badWrites)
{
    int64_t const total = slotElementCount(ext);
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x)
    {
        int64_t idx[5];
        int64_t rest = i;
        idx[4] = rest % ext.headDim;
        rest /= ext.headDim;
        idx[3] = rest % ext.heads;
        rest /= ext.heads;
        idx[2] = rest % ext.capPadded;
        rest /= ext.capPadded;
        idx[1] = rest % ext.batch;
        idx[0] = rest / ext.batch;
        int64_t const elem = slotElementOffset(at, idx);
        if (elem < 0 || elem >= bufferElems)
        {
            atomicAdd(badWrites, 1ull);
            continue;
        }
        buffer[elem] = elementValue<Bits>(salt, idx[0], idx[1], idx[2], idx[3], idx[4]);
    }
}

//! Checks a view's pointer (as a byte offset from `base`), shape, strides, type and device against expectations.
inline ::testing::AssertionResult viewIs(rt::Tensor const& view, void const* base, int64_t byteOffset,
    std::vector<int64_t> const& shape, std::vector<int64_t> const& stride, rt::DataType type)
{
    auto const rank = static_cast<int32_t>(shape.size());
    if (view.getShape().getNumDims() != rank || view.getStride().getNumDims() != rank)
    {
        return ::testing::AssertionFailure() << "rank " << view.getShape().getNumDims() << " (strides "
                                             << view.getStride().getNumDims() << "), expected " << rank;
    }
    for (int32_t dim = 0; dim < rank; ++dim)
    {
        if (view.getShape()[dim] != shape[static_cast<size_t>(dim)])
        {
            return ::testing::AssertionFailure() << "extent " << dim << " is " << view.getShape()[dim] << ", expected "
                                                 << shape[static_cast<size_t>(dim)];
        }
        if (view.getStride()[dim] != stride[static_cast<size_t>(dim)])
        {
            return ::testing::AssertionFailure() << "stride " << dim << " is " << view.getStride()[dim] << ", expected "
                                                 << stride[static_cast<size_t>(dim)];
        }
    }
    int64_t const distance = byteDistance(base, view.rawPointer());
    if (distance != byteOffset)
    {
        return ::testing::AssertionFailure()
            << "pointer is " << distance << " bytes from the layer start, expected " << byteOffset;
    }
    if (view.getDataType() != type)
    {
        return ::testing::AssertionFailure() << "data type " << rt::dataTypeName(view.getDataType());
    }
    if (view.getDeviceType() != rt::DeviceType::kGPU)
    {
        return ::testing::AssertionFailure() << "device type is not kGPU";
    }
    return ::testing::AssertionSuccess();
}

//! Maps `view` onto a buffer starting at `base` whose elements are `elementBytes` wide.
inline ::testing::AssertionResult mapView(
    rt::Tensor const& view, void const* base, int64_t elementBytes, int32_t rank, ViewMap& map)
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
        if (inside && buffer[static_cast<size_t>(elem)] == expected)
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
                out << "read 0x" << std::hex << uint64_t{buffer[static_cast<size_t>(elem)]};
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

//! Returns `count` elements at `device` after the work queued on `stream`.
template <typename Bits>
std::vector<Bits> downloadElements(void const* device, int64_t count, cudaStream_t stream)
{
    std::vector<uint8_t> const bytes = downloadBytes(device, count * static_cast<int64_t>(sizeof(Bits)), stream);
    std::vector<Bits> elements(static_cast<size_t>(count));
    std::memcpy(elements.data(), bytes.data(), bytes.size());
    return elements;
}

//! Expects the counter of out-of-buffer writes to be zero.
inline void expectNoBadWrites(unsigned long long const* counter, cudaStream_t stream)
{
    unsigned long long bad = 0;
    KVCACHE_TEST_CUDA(cudaMemcpyAsync(&bad, counter, sizeof(bad), cudaMemcpyDeviceToHost, stream));
    KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(bad, 0u) << "writes computed offsets outside the layer's buffer";
}

//! Fills every layer's whole buffer (the model's size, from kPoolPtr) with kPOISON_BYTE, ordered on `stream`.
inline void poisonLayers(rt::KVCacheManager const& manager, LayoutModel const& model, cudaStream_t stream)
{
    ASSERT_EQ(manager.numLayers(), static_cast<int32_t>(model.layers.size()));
    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        KVCACHE_TEST_CUDA(cudaMemsetAsync(manager.kPoolPtr(layer), kPOISON_BYTE,
            static_cast<size_t>(model.layers[static_cast<size_t>(layer)].layerBytes), stream));
    }
}

//! Poisons every layer's whole buffer, then writes every element through its slot view with salt saltBase + layer,
//! or, given a device page table, through its pool view at the pages the table names.
template <typename Bits>
void poisonAndWriteSlots(rt::KVCacheManager& manager, LayoutModel const& model, uint64_t saltBase, cudaStream_t stream,
    unsigned long long* badWrites, int32_t const* pageTable = nullptr)
{
    KVCACHE_TEST_CUDA(cudaMemsetAsync(badWrites, 0, sizeof(unsigned long long), stream));
    ASSERT_NO_FATAL_FAILURE(poisonLayers(manager, model, stream));
    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
        auto* const base = static_cast<Bits*>(manager.kPoolPtr(layer));
        SlotAddressing at;
        at.pageTable = pageTable;
        at.tokensPerPage = model.tokensPerPage;
        at.pagesPerSlot = model.pagesPerSlot;
        rt::Tensor const& view =
            pageTable == nullptr ? manager.getCombinedKVCache(layer) : manager.getCombinedKVCachePoolView(layer);
        ASSERT_TRUE(mapView(view, base, sizeof(Bits), 5, at.view)) << "layer " << layer;
        SlotExtents const ext{model.maxBatchSize, model.capPadded, ml.numKVHeads, ml.headDim};
        writeSlotsKernel<Bits><<<gridFor(slotElementCount(ext)), kBLOCK_SIZE, 0, stream>>>(
            base, 2 * ml.halfElems, at, ext, saltBase + static_cast<uint64_t>(layer), badWrites);
        KVCACHE_TEST_CUDA(cudaGetLastError());
    }
}

//! Reads back what poisonAndWriteSlots wrote through the slot views, through the pool view (identity page table) and
//! the separate K and V views of every layer, and checks that no poison is left anywhere in the buffers.
template <typename Bits>
void verifySlotWrite(rt::KVCacheManager& manager, LayoutModel const& model, uint64_t saltBase, cudaStream_t stream)
{
    int64_t const elementBytes = sizeof(Bits);
    int64_t const tokensPerPage = model.tokensPerPage;
    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        SCOPED_TRACE("layer " + std::to_string(layer));
        ModelLayer const& ml = model.layers[static_cast<size_t>(layer)];
        uint64_t const salt = saltBase + static_cast<uint64_t>(layer);
        void const* base = manager.kPoolPtr(layer);
        std::vector<Bits> const host = downloadElements<Bits>(base, 2 * ml.halfElems, stream);

        ViewMap pool;
        ViewMap kView;
        ViewMap vView;
        ASSERT_TRUE(mapView(manager.getCombinedKVCachePoolView(layer), base, elementBytes, 5, pool));
        std::pair<rt::Tensor, rt::Tensor> const separate = manager.getSeparateKVCache(layer);
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
                    for (int64_t h = 0; h < ml.numKVHeads; ++h)
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
            for (int64_t b = 0; b < model.maxBatchSize; ++b)
            {
                for (int64_t s = 0; s < model.capPadded; ++s)
                {
                    for (int64_t h = 0; h < ml.numKVHeads; ++h)
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

} // namespace kvcache::test
