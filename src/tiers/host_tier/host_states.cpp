#include "tiers/host_tier/host_states.h"

#include "core/scoped_device.h"
#include "memory/page_ops/page_list_validation.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <limits>

namespace kvcache::rt::detail
{
namespace
{

constexpr HostPoolNames kSTATE_NAMES{
    "allocateHostStates", "releaseHostStates", "host state", "host states", "hostStates"};

//! Returns the pinned bytes of `numHostStates` host states of `bytesPerState` each (none for 0); throws
//! InvalidArgumentError when they leave int64.
int64_t hostStatesBytes(int64_t numHostStates, int64_t bytesPerState)
{
    int64_t bytes = 0;
    if (__builtin_mul_overflow(numHostStates, bytesPerState, &bytes))
    {
        throw InvalidArgumentError(fmt::format("HostTier: numHostStates is {}; {} host states of {} bytes overflow "
                                               "64-bit sizes (limit {})",
            numHostStates, numHostStates, bytesPerState, std::numeric_limits<int64_t>::max()));
    }
    return bytes;
}

} // namespace

void checkNumHostStates(KVCacheLayout const& layout, int64_t numHostStates)
{
    if (numHostStates < 0 || numHostStates > std::numeric_limits<int32_t>::max())
    {
        throw InvalidArgumentError(fmt::format("HostTier: HostTierOptions.numHostStates is {}; it must be in [0, {}]",
            numHostStates, std::numeric_limits<int32_t>::max()));
    }
    if (numHostStates > 0 && layout.stateLayers.empty())
    {
        throw InvalidArgumentError(fmt::format("HostTier: HostTierOptions.numHostStates is {}; the cache has no state "
                                               "layers (stateLayerConfigs is empty), so it must be 0",
            numHostStates));
    }
    hostStatesBytes(numHostStates, layout.stateBytesPerSlot);
}

HostStates::HostStates(KVCacheLayout const& layout, int32_t device, int64_t numHostStates)
    : mAnatomy(stateSlotAnatomy(layout))
    , mNumStateSlots(layout.numStateSlots)
    , mDevice(device)
    , mNumHostStates(numHostStates)
{
    if (numHostStates == 0)
    {
        return;
    }
    ScopedDevice const scoped(device);
    // Portable: the copies run on whichever device the cache is on; the tier checks it is its own.
    mMemory = PinnedHostBuffer(hostStatesBytes(numHostStates, mAnatomy.bytesPerSlot), cudaHostAllocPortable);
    mPool.emplace(numHostStates, kSTATE_NAMES);
    mTracker.emplace(numHostStates, mNumStateSlots);
}

std::vector<int32_t> HostStates::allocate(int32_t count)
{
    if (mPool)
    {
        return mPool->allocate(count, mNumHostStates);
    }
    if (count < 0)
    {
        throw InvalidArgumentError(fmt::format("allocateHostStates: count is {}; it must be >= 0", count));
    }
    if (count > 0)
    {
        throw OutOfMemoryError(fmt::format("allocateHostStates: count is {}; the tier has 0 free host states "
                                           "(HostTierOptions.numHostStates is 0)",
            count));
    }
    return {};
}

void HostStates::release(int32_t const* hostStates, int32_t count)
{
    if (mPool)
    {
        mPool->release(hostStates, count, mNumHostStates);
        return;
    }
    if (count < 0 || (hostStates == nullptr && count > 0))
    {
        throw InvalidArgumentError(fmt::format("releaseHostStates: count is {} with a {} list; it must be >= 0 with a "
                                               "list",
            count, hostStates == nullptr ? "null" : "non-null"));
    }
    if (count > 0)
    {
        checkHostState("releaseHostStates", hostStates[0]);
    }
}

int64_t HostStates::numFree() const noexcept
{
    return mPool ? mPool->numFree(mNumHostStates) : 0;
}

void HostStates::checkHostState(char const* what, int64_t hostState) const
{
    if (hostState < 0 || hostState >= mNumHostStates)
    {
        throw OutOfRangeError(fmt::format(
            "{}: host state {} is outside [0, {}) (HostTierOptions.numHostStates)", what, hostState, mNumHostStates));
    }
}

void* HostStates::data(int32_t hostState)
{
    synchronize(&hostState, 1);
    return static_cast<char*>(mMemory.data()) + int64_t{hostState} * mAnatomy.bytesPerSlot;
}

bool HostStates::isBusy(int32_t hostState) const
{
    checkHostState("isHostStateBusy", hostState);
    return mTracker->isBusy(hostState);
}

void HostStates::synchronize(int32_t const* hostStates, int64_t count)
{
    constexpr char const* kWHAT = "synchronizeHostStates";
    if (count < 0 || (hostStates == nullptr && count > 0))
    {
        throw InvalidArgumentError(fmt::format("{}: count is {} with a {} list; it must be >= 0 with a list", kWHAT,
            count, hostStates == nullptr ? "null" : "non-null"));
    }
    for (int64_t i = 0; i < count; ++i)
    {
        checkHostState(kWHAT, hostStates[i]);
    }
    if (count > 0)
    {
        mTracker->synchronize(hostStates, count);
    }
}

void HostStates::validate(
    char const* what, KVCacheManager const& cache, HostStateEntry const* entries, int32_t count) const
{
    KVCacheLayout const& layout = cache.layout();
    if (layout.stateLayers.empty())
    {
        throw InvalidArgumentError(fmt::format(
            "{}: the cache has no state layers (stateLayerConfigs is empty); there is no state to move", what));
    }
    if (cache.device() != mDevice)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: the cache is on device {}; the tier is mapped for device {}", what, cache.device(), mDevice));
    }
    // The tier's packed order must be the cache's: the same tensors of the same sizes, slot for slot.
    StateSlotAnatomy const theirs = stateSlotAnatomy(layout);
    if (layout.numStateSlots != mNumStateSlots || theirs.entries.size() != mAnatomy.entries.size())
    {
        throw InvalidArgumentError(
            fmt::format("{}: the cache has {} state slots of {} state tensors; the tier's has {} "
                        "of {}",
                what, layout.numStateSlots, theirs.entries.size(), mNumStateSlots, mAnatomy.entries.size()));
    }
    for (size_t i = 0; i < theirs.entries.size(); ++i)
    {
        StateSlotEntry const& mine = mAnatomy.entries[i];
        StateSlotEntry const& other = theirs.entries[i];
        if (mine.stateLayer != other.stateLayer || mine.tensor != other.tensor || mine.bytes != other.bytes)
        {
            throw InvalidArgumentError(fmt::format("{}: the cache's state layer {} tensor {} has {} bytes a slot; the "
                                                   "tier's state tensor {} is state layer {} tensor {} of {} bytes",
                what, other.stateLayer, other.tensor, other.bytes, i, mine.stateLayer, mine.tensor, mine.bytes));
        }
    }
    if (count < 0 || (entries == nullptr && count > 0))
    {
        throw InvalidArgumentError(fmt::format("{}: count is {} with a {} list; it must be >= 0 with a list", what,
            count, entries == nullptr ? "null" : "non-null"));
    }
    std::vector<int32_t> slots;
    std::vector<int32_t> hostStates;
    slots.reserve(static_cast<size_t>(count));
    hostStates.reserve(static_cast<size_t>(count));
    for (int32_t i = 0; i < count; ++i)
    {
        if (entries[i].slot < 0 || entries[i].slot >= mNumStateSlots)
        {
            throw OutOfRangeError(fmt::format("{}: entries[{}].slot is {}, outside [0, {}) (numStateSlots)", what, i,
                entries[i].slot, mNumStateSlots));
        }
        if (entries[i].hostState < 0 || entries[i].hostState >= mNumHostStates)
        {
            throw OutOfRangeError(fmt::format("{}: entries[{}].hostState is {}, outside [0, {}) "
                                              "(HostTierOptions.numHostStates)",
                what, i, entries[i].hostState, mNumHostStates));
        }
        slots.push_back(entries[i].slot);
        hostStates.push_back(entries[i].hostState);
    }
    validateDistinctIds(what, "slot", slots);
    validateDistinctIds(what, "host state", hostStates);
}

void HostStates::transfer(
    bool toHost, KVCacheManager const& cache, HostStateEntry const* entries, int32_t count, cudaStream_t stream)
{
    char const* const what = toHost ? "HostTier::offloadStates" : "HostTier::onboardStates";
    validate(what, cache, entries, count);
    if (captureStatus(stream) != cudaStreamCaptureStatusNone)
    {
        throw InvalidArgumentError(fmt::format("{}: the stream is capturing; host-list transfers query events", what));
    }
    if (count == 0)
    {
        return;
    }
    ScopedDevice const scoped(mDevice);
    // The tracker speaks of host pages and device pages: here host states and state slots.
    std::vector<HostTierEntry> tracked;
    tracked.reserve(static_cast<size_t>(count));
    for (int32_t i = 0; i < count; ++i)
    {
        tracked.push_back(HostTierEntry{entries[i].slot, entries[i].hostState});
    }
    mTracker->waitForOverlaps(tracked.data(), count, TransferTracker::kNO_STAGING, stream);
    auto* const host = static_cast<char*>(mMemory.data());
    for (int32_t i = 0; i < count; ++i)
    {
        char* const packed = host + int64_t{entries[i].hostState} * mAnatomy.bytesPerSlot;
        for (StateSlotEntry const& part : mAnatomy.entries)
        {
            // Slot n of a state tensor: n * its slotBytes after the tensor's start in its layer's allocation.
            char* const slotBytes = static_cast<char*>(cache.statePtr(part.stateLayer)) + part.layerOffset
                + int64_t{entries[i].slot} * part.bytes;
            char* const hostBytes = packed + part.offset;
            KVCACHE_CUDA_TRY(cudaMemcpyAsync(toHost ? hostBytes : slotBytes, toHost ? slotBytes : hostBytes,
                static_cast<size_t>(part.bytes), toHost ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream));
        }
    }
    mTracker->record(tracked.data(), count, TransferTracker::kNO_STAGING, stream);
}

cudaEvent_t HostStates::lastEvent() const noexcept
{
    return mTracker ? mTracker->lastEvent() : nullptr;
}

} // namespace kvcache::rt::detail
