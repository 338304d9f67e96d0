#pragma once

#include "device/block_shape.h"
#include "memory/cache/layer_table.h"

#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/page_ops.h"

#include <cstdint>

namespace kvcache::rt::detail
{

// Wide blocks copy long lists fastest; short lists finish sooner in narrow blocks, which start and exit cheaply and
// spread a few pages over every multiprocessor. Narrow blocks also serve layers of mixed page sizes, where the grid
// holds idle blocks and a wide one would hold half a multiprocessor while it starts and exits (docs/benchmarks.md).
using WideShape = BlockShape<1024, 2>;
using NarrowShape = BlockShape<256, 8>;

//! CUDA's limit on a grid's y and z dimensions, which bounds the list positions of one launch.
constexpr int64_t kMAX_GRID_YZ = kMAX_DEVICE_PAGE_OPS_PER_LAUNCH;

//! One call's targeted group, layers and halves, checked against the cache on the host.
struct PageOpPlan
{
    LayerTableEntry const* table; //!< the group's first entry
    int32_t firstLayer;
    int32_t halfBits;  //!< 1 when both halves are targeted (grid z = layer slot * 2 + half), else 0
    int32_t firstHalf; //!< 0 for K, 1 for V
    int32_t numPages;  //!< the id range: [0, numPages), the group's
    uint32_t pattern;  //!< resets: the 4-byte fill pattern
    int32_t* errorCount;
    int64_t maxPageBytes;  //!< the largest page of the targeted layers
    int64_t bytesPerEntry; //!< bytes one list entry writes: its page in every targeted layer and existing half
    uint32_t gridZ;        //!< targeted layer halves
    bool samePageBytes;    //!< every targeted layer has the same page size: no block of the grid is idle
    //! The group's first scale entry (its layers' scale pools), or nullptr when the cache keeps none: then the grid
    //! covers the data entries only, exactly as for an unscaled cache.
    LayerTableEntry const* scaleTable;
    int64_t maxScalePageBytes; //!< the largest scale page of the targeted layers
};

//! Checks `target` against `cache` and the current device against the cache's; throws InvalidArgumentError naming
//! `what` and the field. The plan's numPages is the range list ids must be checked against. bytesPerEntry counts
//! data and scale pages.
PageOpPlan planPageOp(
    char const* what, KVCacheManager const& cache, PageOpTarget const& target, uint32_t pattern, int32_t* errorCount);

//! Throws InvalidArgumentError naming `what` unless the current device is the one `cache` lives on.
void checkCacheDevice(char const* what, KVCacheManager const& cache);

//! Returns true when a grid of `wideBlocks` wide blocks with no idle block runs faster in wide blocks than in narrow.
bool wideBlocksPay(int64_t wideBlocks);

//! Returns true when a copy of `entries` entries of `bytesPerEntry` bytes each reads its sources at L2 priority
//! evict_last: it writes more than the L2 of the GPUs kvcache targets holds (40 MiB and up), where the hint keeps
//! write-backs in order.
bool keepsSourcesInL2(int64_t bytesPerEntry, int64_t entries);

//! Returns true when a list of `listSize` entries runs in wide blocks.
bool usesWideBlocks(PageOpPlan const& plan, int32_t listSize);

//! Returns true when a copy of `listSize` entries of `plan` reads its sources at L2 priority evict_last.
bool keepsSourcesInL2(PageOpPlan const& plan, int32_t listSize);

//! Returns the chunks of `pageBytes` for blocks whose chunks are `chunkBytes`.
constexpr int64_t chunksPerPage(int64_t pageBytes, int64_t chunkBytes)
{
    return (pageBytes + chunkBytes - 1) / chunkBytes;
}

} // namespace kvcache::rt::detail
