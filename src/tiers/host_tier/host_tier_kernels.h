#pragma once

// The host tier's kernels: whole host pages between the cache's pages and mapped pinned memory (the kernel path) or
// device staging host pages (the copy-engine path's gather and scatter). A host page holds every table entry of the
// group (data pages, then scale pages: core/layout/page_anatomy.h), so scales move with data in the same
// launches.

#include "device/block_shape.h"
#include "memory/cache/layer_table.h"

#include "kvcache/tiers/host_tier.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvcache::rt::detail
{

//! Vectors of 16 bytes each lane of a warp keeps in flight: a warp moves a work item (4 KiB) with one load per vector
//! and lane, all issued before its stores.
constexpr int32_t kHOST_TIER_WARP_VECTORS = 8;
//! Bytes of one work item, which one warp moves. A warp, not a block: a quantized cache's page halves are a few KiB of
//! data or less than one of scales, and a block that took one at a time kept a few KiB in flight and waited on each
//! (docs/benchmarks.md).
constexpr int64_t kHOST_TIER_KERNEL_CHUNK_BYTES = int64_t{kWARP_THREADS} * kHOST_TIER_WARP_VECTORS * kVECTOR_BYTES;
//! The kernel path's block: one on each of at most kHOST_TIER_MAX_SMS multiprocessors. It moves data as fast as a
//! 1024-thread block, and a small block leaves room beside it: a persistent compute kernel of 1024-thread blocks
//! launched while a transfer runs keeps one block a multiprocessor instead of doubling up on some, which would about
//! double its time (docs/benchmarks.md).
constexpr int32_t kHOST_TIER_MAPPED_THREADS = 256;
//! The copy-engine path's gather and scatter block (device memory only, on every multiprocessor, for a short time):
//! small, so that a short list's few work items spread over many multiprocessors.
constexpr int32_t kHOST_TIER_STAGING_THREADS = 256;
//! The kernel path moves at most this many bytes a launch (whole host pages, at least one). Its blocks hold their
//! multiprocessors until the launch ends; between launches, compute blocks waiting for room are placed first. So
//! bounded launches keep a long transfer from holding back a compute kernel that fills the GPU, and 16 MiB launches
//! cost the transfer little of its speed, where smaller ones cost more (docs/benchmarks.md).
constexpr int64_t kHOST_TIER_KERNEL_LAUNCH_BYTES = int64_t{16} << 20;
//! A device list takes at most this many launches: positions past the count still cost a launch each (a graph
//! replays them all), so a long list gets longer launches instead of more of them.
constexpr int32_t kHOST_TIER_DEVICE_LIST_MAX_LAUNCHES = 16;

//! Everything the kernel needs besides its list, passed by value (graph-safe: chunk addresses never change).
struct HostTierKernelParams
{
    //! The group's entries in the cache's device table: its layers' data entries, then (with scale pools) their
    //! scale entries.
    LayerTableEntry const* table;
    int64_t const* entryOffsets; //!< device: bytes from a host page's start to each entry's K page (PageAnatomy)
    int32_t numEntries;          //!< entries of `table` a host page holds: every one of the group's
    int32_t numPages;            //!< the group's page-id range
    int32_t chunksPerHalf; //!< work items per entry half: the largest page in kHOST_TIER_KERNEL_CHUNK_BYTES pieces
    int32_t numHostPages;  //!< host page ids [0, numHostPages): those pinned at the call
    uint32_t hostPagesPerChunk;
    int64_t hostPageBytes;
    int32_t* errorCount;
    char* chunks[kHOST_TIER_MAX_CHUNKS]; //!< device addresses of the pinned chunks (null: not pinned at the call)
};

//! The kernel path: moves the host list `entries[0, count)` (validated) in launches of
//! hostTierEntriesPerLaunch(params.hostPageBytes) entries carried as kernel parameters, each of at most `maxGrid`
//! blocks.
void launchHostTierKernel(HostTierKernelParams const& params, bool toHost, HostTierEntry const* entries, int32_t count,
    int32_t maxGrid, cudaStream_t stream);

//! The kernel path for a device list of `capacity` entries (`*deviceCount` of them read), in launches of
//! hostTierEntriesPerLaunch(params.hostPageBytes) list positions (more where that would take over
//! kHOST_TIER_DEVICE_LIST_MAX_LAUNCHES launches), each of at most `maxGrid` blocks; launches past the count end at
//! once.
void launchHostTierKernelDevice(HostTierKernelParams const& params, bool toHost, HostTierEntry const* entries,
    int32_t capacity, int32_t const* deviceCount, int32_t maxGrid, cudaStream_t stream);

//! The copy-engine path's gather (toHost) or scatter between the cache and the staging host pages `params` describes,
//! in launches of kMAX_INLINE_PAGE_OPS entries of `grid` blocks.
void launchStagingKernel(HostTierKernelParams const& params, bool toHost, HostTierEntry const* entries, int32_t count,
    int32_t grid, cudaStream_t stream);

//! Returns the work items of one list entry; a launch covers fewer than 2^32 items (the host checks before launching).
int64_t hostTierItemsPerEntry(HostTierKernelParams const& params);

//! Returns the kernel path's entries a launch: kHOST_TIER_KERNEL_LAUNCH_BYTES in whole host pages, from 1 to
//! kMAX_INLINE_PAGE_OPS.
int32_t hostTierEntriesPerLaunch(int64_t hostPageBytes);

} // namespace kvcache::rt::detail
