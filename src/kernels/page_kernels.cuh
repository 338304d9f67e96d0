#pragma once

// The page kernels: one block moves (or fills) one chunk of one page of one half of one layer.

#include "kernels/cache_hints.cuh"
#include "memory/layer_table.h"
#include "memory/page_op_plan.h"

#include "kvcache/memory/page_ops.h"

#include <cstdint>
#include <type_traits>

namespace kvcache::rt::detail
{

//! What every page kernel needs besides its list: the plan's device-side fields and where the launch starts.
struct PageOpParams
{
    LayerTableEntry const* table;
    int32_t firstLayer;
    int32_t halfBits;
    int32_t firstHalf;
    int32_t numPages;
    int32_t firstPosition; //!< list position of grid row y = 0: a grid has at most kMAX_GRID_YZ rows
    bool keepSourcesInL2;  //!< copies: read sources at L2 priority evict_last (see copyChunk)
    uint32_t pattern;
    int32_t* errorCount;
};

struct CopyOp
{
    using Item = PageCopy;
};

struct ResetOp
{
    using Item = int32_t;
};

//! A list that travels as kernel parameters (host lists, graph-safe by value).
template <typename Item, int32_t N>
struct InlineList
{
    static_assert(N <= kMAX_GRID_YZ);

    Item items[N];
    int32_t count;

    __device__ int32_t size() const
    {
        return count;
    }
    __device__ Item operator[](int32_t i) const
    {
        return items[i];
    }
};

//! A list in device memory whose length a graph replay may change through `count`.
template <typename Item>
struct DeviceList
{
    Item const* items;
    int32_t const* count;
    int32_t capacity;

    __device__ int32_t size() const
    {
        return count == nullptr ? capacity : min(max(loadWord(count), 0), capacity);
    }
    //! `i` must be below capacity (the grid guarantees it), so the read stays inside the caller's list.
    __device__ Item operator[](int32_t i) const
    {
        if constexpr (std::is_same_v<Item, PageCopy>)
        {
            return PageCopy{loadWord(&items[i].src), loadWord(&items[i].dst)};
        }
        else
        {
            return loadWord(&items[i]);
        }
    }
};

__device__ __forceinline__ bool isValidPage(int32_t id, int32_t numPages)
{
    return id >= 0 && id < numPages;
}

//! Copies one chunk of `bytes` bytes. `vectorised`: source and destination are 16-byte aligned and so is `bytes`.
//!
//! With `keepSources`, a whole chunk's sources are read at L2 priority evict_last and set back to normal once the
//! stores are issued. While a large copy runs, the L2 then evicts written (dirty) lines ahead of read-once source
//! lines, so writes reach memory nearly in the order they were made (docs/benchmarks.md has the measurements).
//! Setting the priority back leaves no evict_last lines to crowd later kernels' data out of the L2. Each line the
//! chunk read is set back by the thread that read its first bytes in this chunk, so a line shared with a neighbouring
//! chunk is set back by both, each after its own read: whichever comes last leaves it normal.
template <typename Shape>
__device__ void copyChunk(
    char const* __restrict__ src, char* __restrict__ dst, int64_t bytes, bool vectorised, bool keepSources)
{
    constexpr int32_t THREADS = Shape::kTHREADS;
    if (vectorised && bytes == Shape::kCHUNK_BYTES)
    {
        auto const* from = reinterpret_cast<int4 const*>(src) + threadIdx.x;
        auto* to = reinterpret_cast<int4*>(dst) + threadIdx.x;
        int4 staged[Shape::kVECTORS];
        if (keepSources)
        {
            uint64_t const keep = evictLastPolicy();
#pragma unroll
            for (int32_t k = 0; k < Shape::kVECTORS; ++k)
            {
                staged[k] = loadWithPolicy(from + k * THREADS, keep);
            }
        }
        else
        {
#pragma unroll
            for (int32_t k = 0; k < Shape::kVECTORS; ++k)
            {
                staged[k] = __ldcg(from + k * THREADS);
            }
        }
#pragma unroll
        for (int32_t k = 0; k < Shape::kVECTORS; ++k)
        {
            __stcg(to + k * THREADS, staged[k]);
        }
        if (keepSources)
        {
#pragma unroll
            for (int32_t k = 0; k < Shape::kVECTORS; ++k)
            {
                bool const startsLine = reinterpret_cast<uintptr_t>(from + k * THREADS) % kL2_LINE_BYTES == 0;
                bool const startsChunk = k == 0 && threadIdx.x == 0;
                if (startsLine || startsChunk)
                {
                    releaseL2Line(from + k * THREADS);
                }
            }
        }
    }
    else if (vectorised)
    {
        auto const* from = reinterpret_cast<int4 const*>(src);
        auto* to = reinterpret_cast<int4*>(dst);
        for (int64_t i = threadIdx.x; i < bytes / kVECTOR_BYTES; i += THREADS)
        {
            __stcg(to + i, __ldcg(from + i));
        }
    }
    else
    {
        for (int64_t i = threadIdx.x; i < bytes; i += THREADS)
        {
            dst[i] = src[i];
        }
    }
}

//! Fills one chunk that starts `offset` bytes into its page with the 4-byte `pattern`.
template <typename Shape>
__device__ void fillChunk(char* dst, int64_t offset, int64_t bytes, bool vectorised, uint32_t pattern)
{
    constexpr int32_t THREADS = Shape::kTHREADS;
    if (vectorised)
    {
        auto const word = static_cast<int>(pattern);
        int4 const value = make_int4(word, word, word, word);
        auto* to = reinterpret_cast<int4*>(dst);
        for (int64_t i = threadIdx.x; i < bytes / kVECTOR_BYTES; i += THREADS)
        {
            __stcg(to + i, value);
        }
    }
    else
    {
        for (int64_t i = threadIdx.x; i < bytes; i += THREADS)
        {
            dst[i] = static_cast<char>(pattern >> (8 * ((offset + i) % 4)));
        }
    }
}

//! Grid: x = chunk of a page, y = list position - firstPosition, z = targeted layer * (1 + halfBits) + half. Blocks
//! run in that order, so the chunks of a few pages of one layer half are in flight together. No index needs a
//! division, which would cost measurable time on a single-pair copy.
template <typename Shape, typename Op, typename List>
__global__ void __launch_bounds__(Shape::kTHREADS) pageOpKernel(PageOpParams params, List list)
{
    auto const chunk = static_cast<int32_t>(blockIdx.x);
    int32_t const layerSlot = static_cast<int32_t>(blockIdx.z >> params.halfBits);
    int32_t const half = params.firstHalf + static_cast<int32_t>(blockIdx.z & params.halfBits);
    int64_t const chunkStart = chunk * Shape::kCHUNK_BYTES;
    // Every value a block depends on is loaded before one combined branch, so the loads travel together; checked one
    // by one behind early exits, they became dependent round trips ahead of the first page load. Reading an entry
    // before comparing its position with the list's length stays inside the list: the grid keeps positions below its
    // capacity.
    LayerTableEntry const layer = loadLayer(params.table + params.firstLayer + layerSlot);
    int32_t const position = params.firstPosition + static_cast<int32_t>(blockIdx.y);
    auto const item = list[position];
    bool const listed = position < list.size();
    bool unused = false;
    bool valid = false;
    int32_t readPage = 0;
    int32_t writePage = 0;
    if constexpr (std::is_same_v<Op, CopyOp>)
    {
        unused = (item.src == kUNUSED_PAGE_ENTRY) | (item.dst == kUNUSED_PAGE_ENTRY);
        valid = isValidPage(item.src, params.numPages) & isValidPage(item.dst, params.numPages);
        readPage = item.src;
        writePage = item.dst;
    }
    else
    {
        unused = item == kUNUSED_PAGE_ENTRY;
        valid = isValidPage(item, params.numPages);
        writePage = item;
    }
    int64_t const pageBytes = layer.pageBytesAndV >> 1;
    bool const halfExists = (half == 0) | ((layer.pageBytesAndV & 1) != 0);
    if (!(listed & !unused & valid & halfExists & (chunkStart < pageBytes)))
    {
        bool const reportsErrors = chunk == 0 && blockIdx.z == 0 && threadIdx.x == 0 && params.errorCount != nullptr;
        if (listed && !unused && !valid && reportsErrors)
        {
            atomicAdd(params.errorCount, 1);
        }
        return;
    }
    int64_t const bytes = min(Shape::kCHUNK_BYTES, pageBytes - chunkStart);
    // Pools start 256-byte aligned, so every page and chunk is 16-byte aligned when pages are whole vectors.
    bool const vectorised = pageBytes % kVECTOR_BYTES == 0;
    char* const halfBase = layer.kBase + int64_t{half} * params.numPages * pageBytes + chunkStart;
    if constexpr (std::is_same_v<Op, CopyOp>)
    {
        copyChunk<Shape>(halfBase + readPage * pageBytes, halfBase + writePage * pageBytes, bytes, vectorised,
            params.keepSourcesInL2);
    }
    else
    {
        fillChunk<Shape>(halfBase + writePage * pageBytes, chunkStart, bytes, vectorised, params.pattern);
    }
}

} // namespace kvcache::rt::detail
