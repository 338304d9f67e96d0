#pragma once

// A host tier's host states: pinned host copies of state slots, packed as the state slot anatomy says, their free
// list, and the transfers between them and a cache's state slots, tracked like host pages.

#include "core/cuda_owners.h"
#include "core/layout/page_anatomy.h"
#include "tiers/host_tier/host_pages/host_page_pool.h"
#include "tiers/host_tier/transfer_tracker.h"

#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/tiers/host_tier.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace kvcache::rt::detail
{

//! Throws InvalidArgumentError naming HostTierOptions::numHostStates, its value and the limit when it is outside
//! [0, INT32_MAX] or above 0 for `layout` without state layers; nothing is allocated. For HostTier's constructor.
void checkNumHostStates(KVCacheLayout const& layout, int64_t numHostStates);

//! The host states of one tier. Not thread-safe.
class HostStates
{
public:
    //! Pins `numHostStates` (checked by checkNumHostStates) host states of `layout`'s state slots for `device`.
    //! Throws OutOfMemoryError when they cannot be pinned.
    HostStates(KVCacheLayout const& layout, int32_t device, int64_t numHostStates);

    int64_t numHostStates() const noexcept
    {
        return mNumHostStates;
    }
    int64_t bytesPerState() const noexcept
    {
        return mAnatomy.bytesPerSlot;
    }
    std::vector<int32_t> allocate(int32_t count);
    void release(int32_t const* hostStates, int32_t count);
    int64_t numFree() const noexcept;
    //! Returns host state `hostState`'s address after waiting for its transfers; throws OutOfRangeError.
    void* data(int32_t hostState);
    bool isBusy(int32_t hostState) const;
    void synchronize(int32_t const* hostStates, int64_t count);
    //! Validates, then enqueues the copies of `entries` on `stream` (to the host when `toHost`) and records their
    //! event; throws as HostTier::offloadStates, before enqueuing anything.
    void transfer(
        bool toHost, KVCacheManager const& cache, HostStateEntry const* entries, int32_t count, cudaStream_t stream);
    //! Returns the event recorded after the latest state transfer (nullptr before the first).
    cudaEvent_t lastEvent() const noexcept;

private:
    void checkHostState(char const* what, int64_t hostState) const;
    void validate(char const* what, KVCacheManager const& cache, HostStateEntry const* entries, int32_t count) const;

    StateSlotAnatomy mAnatomy;
    int32_t mNumStateSlots;
    int32_t mDevice;
    int64_t mNumHostStates;
    // Destroyed the other way: transfers waited for, then the memory freed.
    PinnedHostBuffer mMemory;
    std::optional<HostPagePool> mPool;
    std::optional<TransferTracker> mTracker;
};

} // namespace kvcache::rt::detail
