#pragma once

// The host tier's SM path: a kernel that moves whole slots between the cache's pages and mapped pinned memory.

#include "layer_table.h"

#include "kvcache/host_tier.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvcache::rt::detail
{

//! Bytes one block moves per work item: 1024 threads, two 16-byte vectors each, both loads issued before the stores.
//! A transfer runs one such block on each of at most kHOST_TIER_MAX_SMS multiprocessors; measured on an H200, this
//! moved as much as 64 blocks of 256 threads and slowed a many-wave compute kernel less (2.5% against 6.2%).
constexpr int64_t kHOST_TIER_KERNEL_CHUNK_BYTES = 32 * 1024;
constexpr int32_t kHOST_TIER_KERNEL_THREADS = 1024;

//! Everything the kernel needs besides its list, passed by value (graph-safe: chunk addresses never change).
struct HostTierKernelParams
{
    LayerTableEntry const* table; //!< the group's layers in the cache's device table
    int64_t const* layerOffsets;  //!< device: bytes from a slot's start to each layer's K page
    int32_t numLayers;
    int32_t numPages;      //!< the group's page-id range
    int32_t chunksPerHalf; //!< work items per layer half: the largest page in kHOST_TIER_KERNEL_CHUNK_BYTES pieces
    int32_t numSlots;      //!< the slot-id range: capacity at the call
    uint32_t slotsPerChunk;
    int64_t slotBytes;
    int32_t* errorCount;
    char* chunks[kHOST_TIER_MAX_CHUNKS]; //!< device addresses of the pinned chunks (null: not pinned at the call)
};

//! Moves the host list `entries[0, count)` (validated) in launches of kMAX_INLINE_PAGE_OPS entries carried as kernel
//! parameters, each with at most `maxGrid` blocks.
void launchHostTierKernel(HostTierKernelParams const& params, bool toHost, HostTierEntry const* entries, int32_t count,
    int32_t maxGrid, cudaStream_t stream);

//! Returns the work items of one list entry; a launch covers fewer than 2^32 items (the host checks before launching).
int64_t hostTierItemsPerEntry(HostTierKernelParams const& params);

//! Moves a device list of `capacity` entries (`*deviceCount` of them read) in one launch of at most `maxGrid` blocks.
void launchHostTierKernelDevice(HostTierKernelParams const& params, bool toHost, HostTierEntry const* entries,
    int32_t capacity, int32_t const* deviceCount, int32_t maxGrid, cudaStream_t stream);

} // namespace kvcache::rt::detail
