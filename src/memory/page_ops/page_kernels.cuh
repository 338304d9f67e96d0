#pragma once

// The page kernels: one block moves (or fills) one chunk of one page of one half of one layer.

#include "device/cache_hints.cuh"
#include "device/page_lists.cuh"
#include "device/page_mover.cuh"
#include "memory/cache/layer_table.h"
#include "memory/page_ops/page_op_plan.h"

#include "kvcache/memory/page_ops.h"

#include <cstdint>
#include <type_traits>

namespace kvcache::rt::detail
{

//! What every page kernel needs besides its list: the plan's device-side fields.
struct PageOpParams
{
    LayerTableEntry const* table;
    //! The scale entries beside `table` (nullptr for a cache without scale pools): blocks x >= dataChunks move scale
    //! pages, chunk x - dataChunks, in the same launch as the data pages.
    LayerTableEntry const* scaleTable;
    int32_t dataChunks;
    int32_t firstLayer;
    int32_t halfBits;
    int32_t firstHalf;
    int32_t numPages;
    bool keepSourcesInL2; //!< copies: read sources at L2 priority evict_last (see CacheGlobalAccess)
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

static_assert(kMAX_INLINE_PAGE_OPS <= kMAX_GRID_YZ, "a host list's part must fit one launch's grid");

__device__ __forceinline__ bool isValidPage(int32_t id, int32_t numPages)
{
    return id >= 0 && id < numPages;
}

//! Grid: x = chunk of a page (the data page's chunks, then the scale page's), y = position in the launch's part of the
//! list, z = targeted layer * (1 + halfBits) + half. Blocks run in that order, so the chunks of a few pages of one
//! layer half are in flight together, and a scale page's few blocks run among the data pages' many rather than in a
//! launch of their own after them, where they would add a second launch's start to a quantized cache's copy. No index
//! needs a division, which would cost time on a single-pair copy.
template <typename Shape, typename Op, typename List>
__global__ void __launch_bounds__(Shape::kTHREADS) pageOpKernel(PageOpParams params, List list)
{
    bool const scalePart = static_cast<int32_t>(blockIdx.x) >= params.dataChunks;
    int32_t const chunk = static_cast<int32_t>(blockIdx.x) - (scalePart ? params.dataChunks : 0);
    int32_t const layerSlot = static_cast<int32_t>(blockIdx.z >> params.halfBits);
    int32_t const half = params.firstHalf + static_cast<int32_t>(blockIdx.z & params.halfBits);
    int64_t const chunkStart = chunk * Shape::kCHUNK_BYTES;
    // Every value a block depends on is loaded before one combined branch, so the loads travel together; checked one
    // by one behind early exits, they became dependent round trips ahead of the first page load. Reading an entry
    // before comparing its position with the list's length stays inside the list: the grid keeps positions below its
    // capacity.
    LayerTableEntry const layer =
        loadLayer((scalePart ? params.scaleTable : params.table) + params.firstLayer + layerSlot);
    auto const position = static_cast<int32_t>(blockIdx.y);
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
    int64_t const pageBytes = layer.pageBytes();
    bool const halfExists = (half == 0) | layer.hasV();
    if (!(listed & !unused & valid & halfExists & (chunkStart < pageBytes)))
    {
        bool const reportsErrors =
            blockIdx.x == 0 && blockIdx.z == 0 && threadIdx.x == 0 && params.errorCount != nullptr;
        if (listed && !unused && !valid && reportsErrors)
        {
            atomicAdd(params.errorCount, 1);
        }
        return;
    }
    int64_t const bytes = min(Shape::kCHUNK_BYTES, pageBytes - chunkStart);
    // Pools start 256-byte aligned, so every page and chunk is 16-byte aligned when pages are whole vectors.
    bool const vectorised = pageBytes % kVECTOR_BYTES == 0;
    char* const halfBase = layer.halfAddress(half, params.numPages, 0) + chunkStart;
    auto const thread = static_cast<int32_t>(threadIdx.x);
    if constexpr (std::is_same_v<Op, CopyOp>)
    {
        moveChunk<Shape>(halfBase + readPage * pageBytes, halfBase + writePage * pageBytes, bytes, vectorised,
            CacheGlobalAccess{params.keepSourcesInL2}, thread);
    }
    else
    {
        fillChunk<Shape, CacheGlobalAccess>(
            halfBase + writePage * pageBytes, chunkStart, bytes, vectorised, params.pattern, thread);
    }
}

} // namespace kvcache::rt::detail
