#pragma once

// The host tier's copy-engine path. A short transfer moves straight between the pages and the host pages, one
// descriptor a page half of a layer (enqueueDirect). A longer one is staged: a kernel gathers the listed pages into
// whole host pages in a device staging half (or scatters them from it) and the copy engine moves host pages, one
// descriptor each (cudaMemcpyBatchAsync), in parts, so that the kernel's work on one part overlaps the copy of another
// (enqueue).

#include "core/cuda_owners.h"
#include "core/layout/page_anatomy.h"
#include "memory/cache/layer_table.h"
#include "tiers/host_tier/host_tier_kernels.h"

#include "kvcache/tiers/host_tier.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace kvcache::rt::detail
{

class PinnedChunks;

//! Device staging memory in two halves (offloads, onboards), each of numStagingHostPages() host pages.
class StagedCopy
{
public:
    //! Sizes each half to `stagingBytes / 2` in whole host pages (from 1 to min(numHostPages,
    //! kMAX_INLINE_PAGE_OPS)) and allocates both on `device`. Throws OutOfMemoryError naming the host
    //! pages, the bytes and `device` when they do not fit, CudaError for other failures.
    StagedCopy(
        int64_t hostPageBytes, int64_t stagingBytes, int64_t numHostPages, int32_t device, int32_t multiprocessors);

    //! Returns the host pages each half holds.
    int32_t numStagingHostPages() const noexcept
    {
        return mNumStagingHostPages;
    }
    //! Enqueues the transfer of `entries[0, count)` (validated) on `stream`, numStagingHostPages() at a time through
    //! the half of its direction: `cacheParams` addresses the cache's pages (HostTier's kernel parameters), `chunks`
    //! the host pages. A batch of 16 host pages or more moves in parts of 1, 8, 64... (an onboard's the other way
    //! round): the kernels of all parts but the one moved first (offload) or last (onboard) run on a stream of this
    //! object, ordered by events, while the copy engine moves another part on `stream`; everything is ordered before
    //! `stream`'s later work. Throws CudaError.
    void enqueue(bool toHost, HostTierKernelParams const& cacheParams, PinnedChunks const& chunks,
        HostTierEntry const* entries, int32_t count, cudaStream_t stream);
    //! Whether a transfer of `count` host pages of `pageHalves` page halves each (PageAnatomy::halves) on `stream`
    //! moves straight (enqueueDirect): not on a stream that takes no batch calls (the legacy default stream), not from
    //! 16 host pages (enqueue's parts move those as fast), not with more than 1024 descriptors (more in one call move
    //! slower).
    static bool movesDirect(int32_t count, int64_t pageHalves, cudaStream_t stream);
    //! Enqueues the transfer of `entries[0, count)` (validated, movesDirect) on `stream` straight between the pages
    //! and the host pages, without staging: one descriptor a page half of a table entry, in one cudaMemcpyBatchAsync
    //! call. `table` is a host copy of the group's table entries (KVCacheManagerInternal::hostLayerTable), `anatomy`
    //! the group's page entries in the same order (where each entry's K page sits in a host page), `numPages` the
    //! group's pages. Throws CudaError.
    static void enqueueDirect(bool toHost, std::vector<LayerTableEntry> const& table, PageAnatomy const& anatomy,
        int32_t numPages, PinnedChunks const& chunks, HostTierEntry const* entries, int32_t count, cudaStream_t stream);

private:
    int64_t mHostPageBytes = 0;
    int32_t mNumStagingHostPages = 0;
    int32_t mMultiprocessors = 0;
    DeviceBuffer mStaging{};       //!< 2 * numStagingHostPages() host pages: offloads, then onboards
    CudaStream mSide{};            //!< the kernels of the parts the copy engine does not wait for
    std::vector<CudaEvent> mParts; //!< one a part of a batch: where one stream waits for the other
};

} // namespace kvcache::rt::detail
