// The host tier: its parts put together (pinned_chunks, host_page_pool, transfer_tracker, staged_copy), the transfers'
// validation, the choice of path and the kernel path.

#include "kvcache/tiers/host_tier.h"

#include "core/cuda_owners.h"
#include "core/layout/page_anatomy.h"
#include "core/scoped_device.h"
#include "memory/cache/cache_geometry.h"
#include "memory/cache/layer_table.h"
#include "memory/page_ops/page_list_validation.h"
#include "tiers/host_tier/host_pages/host_page_pool.h"
#include "tiers/host_tier/host_pages/pinned_chunks.h"
#include "tiers/host_tier/host_states.h"
#include "tiers/host_tier/host_tier_kernels.h"
#include "tiers/host_tier/staged_copy.h"
#include "tiers/host_tier/transfer_tracker.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <optional>

namespace kvcache::rt
{
namespace
{

enum class Direction
{
    kTO_HOST,
    kTO_DEVICE,
};

//! The checks of the constructor's arguments that need no cache memory; throws as HostTier's constructor.
int32_t checkedGroup(KVCacheManager const& cache, int32_t group, int64_t numHostPages, HostTierOptions const& options)
{
    constexpr char const* kWHAT = "HostTier";
    if (group < 0 || group >= cache.numGroups())
    {
        throw OutOfRangeError(fmt::format("{}: group is {}; groups are [0, {})", kWHAT, group, cache.numGroups()));
    }
    if (numHostPages < 1 || numHostPages > std::numeric_limits<int32_t>::max())
    {
        throw InvalidArgumentError(fmt::format(
            "{}: numHostPages is {}; it must be in [1, {}]", kWHAT, numHostPages, std::numeric_limits<int32_t>::max()));
    }
    if (options.chunkBytes <= 0)
    {
        throw InvalidArgumentError(fmt::format("{}: chunkBytes is {}; it must be > 0", kWHAT, options.chunkBytes));
    }
    if (options.stagingBytes < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: stagingBytes is {}; it must be >= 0", kWHAT, options.stagingBytes));
    }
    detail::checkNumHostStates(cache.layout(), options.numHostStates);
    return group;
}

int32_t multiprocessorCount(int32_t device)
{
    int multiprocessors = 0;
    KVCACHE_CUDA_TRY(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
    return multiprocessors;
}

} // namespace

struct HostTier::Impl
{
    Impl(KVCacheManager const& cache, int32_t groupIn, int64_t numHostPages, HostTierOptions const& options);

    void checkGeometry(char const* what, KVCacheManager const& cache) const;
    void validateEntries(char const* what, KVCacheManager const& cache, HostTierEntry const* entries, int32_t count,
        int64_t numPinnedNow) const;
    detail::HostTierKernelParams kernelParams(
        KVCacheManager const& cache, int64_t numPinnedNow, int32_t* deviceErrorCount) const;
    HostTierMethod transfer(Direction direction, KVCacheManager const& cache, HostTierEntry const* entries,
        int32_t count, cudaStream_t stream, HostTierMethod method);
    void transferDevice(Direction direction, KVCacheManager const& cache, HostTierEntry const* deviceEntries,
        int32_t capacity, int32_t const* deviceCount, cudaStream_t stream, int32_t* deviceErrorCount);
    void checkHostPage(char const* what, int64_t hostPage, int64_t limit) const
    {
        detail::checkHostPage(what, hostPage, limit, chunks.numPinned(), chunks.numHostPages());
    }

    int32_t group;
    int32_t device;
    KVQuantization quantization;
    PageGeometry geometry;
    int32_t numPages; //!< the group's pages: the device id range
    int32_t multiprocessors;
    detail::PageAnatomy anatomy; //!< what a host page holds, in order: the group's page entries back to back
    // Declared in the order they are made; destroyed the other way: transfers waited for, memory unpinned, staging
    // and offsets freed.
    detail::DeviceBuffer entryOffsets; //!< device: each anatomy entry's offset in a host page
    detail::StagedCopy staged;
    detail::PinnedChunks chunks;
    detail::HostPagePool pool;
    detail::TransferTracker tracker;
    detail::HostStates states;
    bool lastWasState = false; //!< whether the latest host-list transfer moved host states
};

namespace
{

//! The device buffer of a host page's entry offsets, filled (once, at construction); made on `device`.
detail::DeviceBuffer entryOffsetsOf(detail::PageAnatomy const& anatomy, int32_t device)
{
    std::vector<int64_t> offsets;
    for (detail::PageEntry const& entry : anatomy.entries)
    {
        offsets.push_back(entry.offset);
    }
    detail::ScopedDevice const scoped(device);
    size_t const bytes = offsets.size() * sizeof(int64_t);
    detail::DeviceBuffer buffer(static_cast<int64_t>(std::max<size_t>(bytes, 1)), "HostTier: entry offsets");
    KVCACHE_CUDA_TRY(cudaMemcpy(buffer.data(), offsets.data(), bytes, cudaMemcpyHostToDevice));
    return buffer;
}

} // namespace

HostTier::Impl::Impl(KVCacheManager const& cache, int32_t groupIn, int64_t numHostPages, HostTierOptions const& options)
    : group(checkedGroup(cache, groupIn, numHostPages, options))
    , device(cache.device())
    , quantization(cache.layout().quantization)
    , geometry(pageGeometry(cache.layout(), group))
    , numPages(cache.group(group).numPages)
    , multiprocessors(multiprocessorCount(device))
    , anatomy(detail::pageAnatomy(geometry))
    , entryOffsets(entryOffsetsOf(anatomy, device))
    , staged(geometry.bytesPerPage, options.stagingBytes, numHostPages, device, multiprocessors)
    , chunks(device, numHostPages, geometry.bytesPerPage, options.chunkBytes, options.preferGpuNumaNode)
    , pool(numHostPages)
    , tracker(numHostPages, numPages)
    , states(cache.layout(), device, options.numHostStates)
{
}

void HostTier::Impl::checkGeometry(char const* what, KVCacheManager const& cache) const
{
    if (cache.device() != device)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: the cache is on device {}; the tier is mapped for device {}", what, cache.device(), device));
    }
    detail::checkGroupGeometry(what, cache, group, geometry, "the tier");
    if (cache.group(group).numPages != numPages)
    {
        throw InvalidArgumentError(fmt::format("{}: the cache's group {} has {} pages per half; the tier's has {}",
            what, group, cache.group(group).numPages, numPages));
    }
}

void HostTier::Impl::validateEntries(char const* what, KVCacheManager const& cache, HostTierEntry const* entries,
    int32_t count, int64_t numPinnedNow) const
{
    checkGeometry(what, cache);
    detail::validateHostTierEntries(what, entries, count, numPages, numPinnedNow,
        fmt::format("({} of {} pinned)", numPinnedNow, chunks.numHostPages()));
}

detail::HostTierKernelParams HostTier::Impl::kernelParams(
    KVCacheManager const& cache, int64_t numPinnedNow, int32_t* deviceErrorCount) const
{
    detail::HostTierKernelParams params{};
    params.table = detail::KVCacheManagerInternal::layerTable(cache, group);
    params.entryOffsets = static_cast<int64_t const*>(entryOffsets.data());
    params.numEntries = static_cast<int32_t>(anatomy.entries.size());
    params.numPages = numPages;
    params.chunksPerHalf = static_cast<int32_t>(
        (anatomy.largestHalfBytes + detail::kHOST_TIER_KERNEL_CHUNK_BYTES - 1) / detail::kHOST_TIER_KERNEL_CHUNK_BYTES);
    params.numHostPages = static_cast<int32_t>(numPinnedNow);
    params.hostPagesPerChunk = static_cast<uint32_t>(chunks.hostPagesPerChunk());
    params.hostPageBytes = geometry.bytesPerPage;
    params.errorCount = deviceErrorCount;
    for (size_t c = 0; c < chunks.numChunks(); ++c)
    {
        params.chunks[c] = chunks.chunkDeviceAddress(c, numPinnedNow);
    }
    return params;
}

HostTierMethod HostTier::Impl::transfer(Direction direction, KVCacheManager const& cache, HostTierEntry const* entries,
    int32_t count, cudaStream_t stream, HostTierMethod method)
{
    char const* const what = direction == Direction::kTO_HOST ? "HostTier::offload" : "HostTier::onboard";
    int64_t const numPinnedNow = chunks.numPinned();
    validateEntries(what, cache, entries, count, numPinnedNow);
    if (method != HostTierMethod::kAUTO && method != HostTierMethod::kCOPY_ENGINE && method != HostTierMethod::kKERNEL)
    {
        throw InvalidArgumentError(
            fmt::format("{}: method is {}; it must be 0, 1 or 2", what, static_cast<int32_t>(method)));
    }
    if (detail::captureStatus(stream) != cudaStreamCaptureStatusNone)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: the stream is capturing; host-list transfers query events, capture the device-list form", what));
    }
    int64_t const bytes = int64_t{count} * geometry.bytesPerPage;
    if (method == HostTierMethod::kAUTO)
    {
        method = bytes <= kHOST_TIER_KERNEL_MAX_BYTES ? HostTierMethod::kKERNEL : HostTierMethod::kCOPY_ENGINE;
    }
    // The kernel's parameters, built once for the check below and the launch.
    detail::HostTierKernelParams const params = kernelParams(cache, numPinnedNow, nullptr);
    // Both methods launch the host tier kernel (the copy engine's gather and scatter too), at most
    // kMAX_INLINE_PAGE_OPS entries a launch.
    int64_t const perEntry = detail::hostTierItemsPerEntry(params);
    if (int64_t{kMAX_INLINE_PAGE_OPS} * perEntry > std::numeric_limits<uint32_t>::max())
    {
        throw InvalidArgumentError(
            fmt::format("{}: the host tier kernel needs fewer than 2^32 work items a launch; {} an entry are too many",
                what, perEntry));
    }
    if (count == 0)
    {
        return method;
    }
    detail::ScopedDevice const scoped(device);
    bool const toHost = direction == Direction::kTO_HOST;
    int32_t const stagingHalf =
        method == HostTierMethod::kCOPY_ENGINE ? (toHost ? 0 : 1) : detail::TransferTracker::kNO_STAGING;
    // Transfers of this tier still in flight on other streams that touch these host pages or pages: wait for them.
    tracker.waitForOverlaps(entries, count, stagingHalf, stream);
    if (method == HostTierMethod::kKERNEL)
    {
        int32_t const maxGrid = std::min(multiprocessors, kHOST_TIER_MAX_SMS);
        detail::launchHostTierKernel(params, toHost, entries, count, maxGrid, stream);
    }
    else if (detail::StagedCopy::movesDirect(count, anatomy.halves, stream))
    {
        // The pools' addresses from the cache of this call (the tier checked its geometry only).
        detail::StagedCopy::enqueueDirect(toHost, detail::KVCacheManagerInternal::hostLayerTable(cache, group), anatomy,
            numPages, chunks, entries, count, stream);
    }
    else
    {
        staged.enqueue(toHost, params, chunks, entries, count, stream);
    }
    tracker.record(entries, count, stagingHalf, stream);
    lastWasState = false;
    return method;
}

void HostTier::Impl::transferDevice(Direction direction, KVCacheManager const& cache,
    HostTierEntry const* deviceEntries, int32_t capacity, int32_t const* deviceCount, cudaStream_t stream,
    int32_t* deviceErrorCount)
{
    char const* const what = direction == Direction::kTO_HOST ? "HostTier::offloadDevice" : "HostTier::onboardDevice";
    checkGeometry(what, cache);
    if (capacity < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: capacity is {}; it must be >= 0", what, capacity));
    }
    if (deviceEntries == nullptr && capacity > 0)
    {
        throw InvalidArgumentError(fmt::format("{}: the list is null but capacity is {}", what, capacity));
    }
    if (capacity > kMAX_DEVICE_PAGE_OPS_PER_LAUNCH)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: capacity is {}; one call takes at most {}", what, capacity, kMAX_DEVICE_PAGE_OPS_PER_LAUNCH));
    }
    detail::HostTierKernelParams const params = kernelParams(cache, chunks.numPinned(), deviceErrorCount);
    int64_t const perEntry = detail::hostTierItemsPerEntry(params);
    if (int64_t{capacity} * perEntry > std::numeric_limits<uint32_t>::max())
    {
        throw InvalidArgumentError(fmt::format("{}: capacity is {}; with {} work items an entry the limit is {}", what,
            capacity, perEntry, std::numeric_limits<uint32_t>::max() / perEntry));
    }
    detail::ScopedDevice const scoped(device);
    int32_t const maxGrid = std::min(multiprocessors, kHOST_TIER_MAX_SMS);
    detail::launchHostTierKernelDevice(
        params, direction == Direction::kTO_HOST, deviceEntries, capacity, deviceCount, maxGrid, stream);
}

HostTier::HostTier(KVCacheManager const& cache, int32_t group, int64_t numHostPages, HostTierOptions const& options)
    : mImpl(std::make_unique<Impl>(cache, group, numHostPages, options))
{
}

HostTier::~HostTier() noexcept
{
    // Pinning stops first, so that destruction never waits for the rest of the memory to be pinned.
    mImpl->chunks.stopPinning();
}

int64_t HostTier::numPinnedHostPages() const noexcept
{
    return mImpl->chunks.numPinned();
}

int64_t HostTier::numHostPages() const noexcept
{
    return mImpl->chunks.numHostPages();
}

void HostTier::waitUntilReady() const
{
    mImpl->chunks.waitUntilReady();
}

int64_t HostTier::hostPageBytes() const noexcept
{
    return mImpl->geometry.bytesPerPage;
}

int32_t HostTier::numStagingHostPages() const noexcept
{
    return mImpl->staged.numStagingHostPages();
}

int32_t HostTier::group() const noexcept
{
    return mImpl->group;
}

int32_t HostTier::device() const noexcept
{
    return mImpl->device;
}

int32_t HostTier::numaNode() const noexcept
{
    return mImpl->chunks.numaNode();
}

KVQuantization HostTier::quantization() const noexcept
{
    return mImpl->quantization;
}

PageGeometry const& HostTier::geometry() const noexcept
{
    return mImpl->geometry;
}

void* HostTier::hostPageData(int32_t hostPage)
{
    synchronizeHostPages(&hostPage, 1);
    return mImpl->chunks.hostAddress(hostPage);
}

std::vector<int32_t> HostTier::allocateHostPages(int32_t count)
{
    return mImpl->pool.allocate(count, mImpl->chunks.numPinned());
}

void HostTier::releaseHostPages(int32_t const* hostPages, int32_t count)
{
    mImpl->pool.release(hostPages, count, mImpl->chunks.numPinned());
}

int64_t HostTier::numFreeHostPages() const noexcept
{
    return mImpl->pool.numFree(mImpl->chunks.numPinned());
}

int32_t HostTier::listCount(char const* what, size_t size)
{
    if (size > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    {
        throw InvalidArgumentError(fmt::format(
            "{}: the list has {} entries; the limit is {}", what, size, std::numeric_limits<int32_t>::max()));
    }
    return static_cast<int32_t>(size);
}

// The transfers' entry points name their direction; Impl does the rest.
HostTierMethod HostTier::offload(KVCacheManager const& cache, HostTierEntry const* entries, int32_t count,
    cudaStream_t stream, HostTierMethod method)
{
    return mImpl->transfer(Direction::kTO_HOST, cache, entries, count, stream, method);
}

bool HostTier::isHostPageBusy(int32_t hostPage) const
{
    mImpl->checkHostPage("isHostPageBusy", hostPage, mImpl->chunks.numHostPages());
    return mImpl->tracker.isBusy(hostPage);
}

HostTierMethod HostTier::onboard(KVCacheManager const& cache, HostTierEntry const* entries, int32_t count,
    cudaStream_t stream, HostTierMethod method)
{
    return mImpl->transfer(Direction::kTO_DEVICE, cache, entries, count, stream, method);
}

void HostTier::synchronizeHostPages(int32_t const* hostPages, int64_t count)
{
    constexpr char const* kWHAT = "synchronizeHostPages";
    if (count < 0 || (hostPages == nullptr && count > 0))
    {
        throw InvalidArgumentError(fmt::format("{}: count is {} with a {} list; it must be >= 0 with a list", kWHAT,
            count, hostPages == nullptr ? "null" : "non-null"));
    }
    int64_t const numPinnedNow = mImpl->chunks.numPinned();
    for (int64_t i = 0; i < count; ++i)
    {
        mImpl->checkHostPage(kWHAT, hostPages[i], numPinnedNow);
    }
    mImpl->tracker.synchronize(hostPages, count);
}

void HostTier::offloadDevice(KVCacheManager const& cache, HostTierEntry const* deviceEntries, int32_t capacity,
    int32_t const* deviceCount, cudaStream_t stream, int32_t* deviceErrorCount)
{
    mImpl->transferDevice(Direction::kTO_HOST, cache, deviceEntries, capacity, deviceCount, stream, deviceErrorCount);
}

cudaEvent_t HostTier::lastEvent() const noexcept
{
    return mImpl->lastWasState ? mImpl->states.lastEvent() : mImpl->tracker.lastEvent();
}

int64_t HostTier::numHostStates() const noexcept
{
    return mImpl->states.numHostStates();
}

int64_t HostTier::hostStateBytes() const noexcept
{
    return mImpl->states.bytesPerState();
}

std::vector<int32_t> HostTier::allocateHostStates(int32_t count)
{
    return mImpl->states.allocate(count);
}

void HostTier::releaseHostStates(int32_t const* hostStates, int32_t count)
{
    mImpl->states.release(hostStates, count);
}

int64_t HostTier::numFreeHostStates() const noexcept
{
    return mImpl->states.numFree();
}

void* HostTier::hostStateData(int32_t hostState)
{
    return mImpl->states.data(hostState);
}

void HostTier::offloadStates(
    KVCacheManager const& cache, HostStateEntry const* entries, int32_t count, cudaStream_t stream)
{
    mImpl->states.transfer(true, cache, entries, count, stream);
    mImpl->lastWasState = mImpl->lastWasState || count > 0;
}

void HostTier::onboardStates(
    KVCacheManager const& cache, HostStateEntry const* entries, int32_t count, cudaStream_t stream)
{
    mImpl->states.transfer(false, cache, entries, count, stream);
    mImpl->lastWasState = mImpl->lastWasState || count > 0;
}

bool HostTier::isHostStateBusy(int32_t hostState) const
{
    return mImpl->states.isBusy(hostState);
}

void HostTier::synchronizeHostStates(int32_t const* hostStates, int64_t count)
{
    mImpl->states.synchronize(hostStates, count);
}

void HostTier::onboardDevice(KVCacheManager const& cache, HostTierEntry const* deviceEntries, int32_t capacity,
    int32_t const* deviceCount, cudaStream_t stream, int32_t* deviceErrorCount)
{
    mImpl->transferDevice(Direction::kTO_DEVICE, cache, deviceEntries, capacity, deviceCount, stream, deviceErrorCount);
}

} // namespace kvcache::rt
