// The host tier: chunked pinning with a background thread, slot bookkeeping, transfer validation, in-flight tracking,
// the copy-engine path and sequence files over slots.

#include "kvcache/tiers/host_tier.h"

#include "kernels/host_tier_kernels.h"
#include "memory/layer_table.h"
#include "core/scoped_device.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

namespace kvcache::rt
{

//! A transfer's completion: the event recorded after it and the stream it ran on.
struct HostTier::TransferRecord
{
    cudaEvent_t event = nullptr;
    cudaStream_t stream = nullptr;
};

namespace
{

//! Huge-page size: chunks are rounded to it so transparent huge pages can back them, which makes pinning faster.
constexpr int64_t kHUGE_PAGE_BYTES = int64_t{2} << 20;
//! Descriptors one cudaMemcpyBatchAsync call takes at most; longer lists take several calls.
constexpr size_t kMAX_BATCH_DESCRIPTORS = 8192;
//! Blocks a multiprocessor for the kCOPY_ENGINE path's gather and scatter kernel (device memory only): 2048 threads.
constexpr int32_t kSTAGING_BLOCKS_PER_SM = 2048 / detail::kHOST_TIER_STAGING_THREADS;
//! mbind's MPOL_PREFERRED (linux/mempolicy.h), spelled here so no NUMA header or library is needed.
constexpr int kMPOL_PREFERRED = 1;

//! Returns the NUMA node of `device`'s PCI function, or -1 when the machine has one node or it cannot be told.
int32_t gpuNumaNode(int32_t device)
{
    if (::access("/sys/devices/system/node/node1", F_OK) != 0)
    {
        return -1;
    }
    std::array<char, 64> busId{};
    if (cudaDeviceGetPCIBusId(busId.data(), static_cast<int>(busId.size()), device) != cudaSuccess)
    {
        cudaGetLastError();
        return -1;
    }
    std::string id(busId.data());
    std::transform(id.begin(), id.end(), id.begin(), [](char c) { return static_cast<char>(std::tolower(c)); });
    std::ifstream file("/sys/bus/pci/devices/" + id + "/numa_node");
    int node = -1;
    if (!(file >> node))
    {
        return -1;
    }
    return node;
}

//! Asks the kernel to place [address, address + bytes) on `node`; returns false when it refused (the memory works
//! anyway, from whichever node the kernel picks).
bool preferNode(void* address, int64_t bytes, int32_t node)
{
    constexpr int32_t kMAX_NODE_BITS = 1024;
    if (node < 0 || node >= kMAX_NODE_BITS)
    {
        return false;
    }
    std::array<unsigned long, kMAX_NODE_BITS / (8 * sizeof(unsigned long))> mask{};
    mask[static_cast<size_t>(node) / (8 * sizeof(unsigned long))] |= 1UL
        << (static_cast<size_t>(node) % (8 * sizeof(unsigned long)));
    // The kernel reads maxnode - 1 bits of the mask.
    return ::syscall(SYS_mbind, address, static_cast<unsigned long>(bytes), kMPOL_PREFERRED, mask.data(),
               static_cast<unsigned long>(kMAX_NODE_BITS + 1), 0U)
        == 0;
}

void checkNoDuplicates(char const* what, char const* field, std::vector<int32_t>& ids)
{
    std::sort(ids.begin(), ids.end());
    auto const repeated = std::adjacent_find(ids.begin(), ids.end());
    if (repeated != ids.end())
    {
        throw InvalidArgumentError(fmt::format("{}: {} {} is listed more than once", what, field, *repeated));
    }
}

int32_t listCount(char const* what, size_t size)
{
    if (size > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    {
        throw InvalidArgumentError(fmt::format(
            "{}: the list has {} entries; the limit is {}", what, size, std::numeric_limits<int32_t>::max()));
    }
    return static_cast<int32_t>(size);
}

//! Enqueues the copies dsts[i] <- srcs[i] of sizes[i] bytes on `stream` through the copy engine.
void copyDescriptors(std::vector<void*> const& dsts, std::vector<void const*> const& srcs,
    std::vector<size_t> const& sizes, cudaMemcpyKind kind, cudaStream_t stream)
{
#if CUDART_VERSION >= 12080
    // The batch call refuses the legacy default stream; that stream gets one cudaMemcpyAsync a descriptor.
    bool const legacy = stream == nullptr || stream == cudaStreamLegacy;
    if (!legacy)
    {
        cudaMemcpyAttributes attributes{};
        attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        attributes.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        for (size_t first = 0; first < sizes.size(); first += kMAX_BATCH_DESCRIPTORS)
        {
            size_t const part = std::min(kMAX_BATCH_DESCRIPTORS, sizes.size() - first);
            size_t attributeIndex = 0;
#if CUDART_VERSION >= 13000
            KVCACHE_CUDA_TRY(cudaMemcpyBatchAsync(dsts.data() + first, srcs.data() + first, sizes.data() + first, part,
                &attributes, &attributeIndex, 1, stream));
#else
            size_t failIndex = 0;
            KVCACHE_CUDA_TRY(cudaMemcpyBatchAsync(const_cast<void**>(dsts.data() + first),
                const_cast<void**>(srcs.data() + first), const_cast<size_t*>(sizes.data() + first), part, &attributes,
                &attributeIndex, 1, &failIndex, stream));
#endif
        }
        return;
    }
#endif
    for (size_t i = 0; i < sizes.size(); ++i)
    {
        KVCACHE_CUDA_TRY(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], kind, stream));
    }
}

} // namespace

HostTier::HostTier(KVCacheManager const& cache, int32_t group, int64_t numSlots, HostTierOptions const& options)
{
    constexpr char const* kWHAT = "HostTier";
    if (group < 0 || group >= cache.numGroups())
    {
        throw OutOfRangeError(fmt::format("{}: group is {}; groups are [0, {})", kWHAT, group, cache.numGroups()));
    }
    if (numSlots < 1 || numSlots > std::numeric_limits<int32_t>::max())
    {
        throw InvalidArgumentError(fmt::format(
            "{}: numSlots is {}; it must be in [1, {}]", kWHAT, numSlots, std::numeric_limits<int32_t>::max()));
    }
    if (options.chunkBytes <= 0)
    {
        throw InvalidArgumentError(fmt::format("{}: chunkBytes is {}; it must be > 0", kWHAT, options.chunkBytes));
    }
    if (options.stagingBytes < 0)
    {
        throw InvalidArgumentError(
            fmt::format("{}: stagingBytes is {}; it must be >= 0", kWHAT, options.stagingBytes));
    }
    mGroup = group;
    mDevice = cache.device();
    mGeometry = sequenceFileGeometry(cache.layout(), group);
    KVPageGroupLayout const& groupLayout = cache.group(group);
    mNumPages = groupLayout.numPages;
    int64_t offset = 0;
    for (int32_t const layer : groupLayout.layers)
    {
        KVLayerLayout const& layout = cache.layout().layers[static_cast<size_t>(layer)];
        mLayerOffsets.push_back(offset);
        offset += layout.numHalves * layout.pageBytes;
    }
    mTargetCapacity = numSlots;
    int64_t const slotBytesValue = mGeometry.bytesPerPage;
    mSlotsPerChunk = std::max<int64_t>(1, options.chunkBytes / slotBytesValue);
    int64_t const fewestSlotsPerChunk = (numSlots + kHOST_TIER_MAX_CHUNKS - 1) / kHOST_TIER_MAX_CHUNKS;
    mSlotsPerChunk = std::min(numSlots, std::max(mSlotsPerChunk, fewestSlotsPerChunk));
    int64_t const numChunks = (numSlots + mSlotsPerChunk - 1) / mSlotsPerChunk;
    mChunks.resize(static_cast<size_t>(numChunks));
    for (int64_t c = 0; c < numChunks; ++c)
    {
        int64_t const slots = std::min(mSlotsPerChunk, numSlots - c * mSlotsPerChunk);
        int64_t const bytes = slots * slotBytesValue;
        mChunks[static_cast<size_t>(c)].bytes = (bytes + kHUGE_PAGE_BYTES - 1) / kHUGE_PAGE_BYTES * kHUGE_PAGE_BYTES;
    }
    mSlotLast.resize(static_cast<size_t>(numSlots));
    mPageLast.resize(static_cast<size_t>(mNumPages));
    mHandedOut.assign(static_cast<size_t>(numSlots), 0);

    detail::ScopedDevice const scoped(mDevice);
    if (options.preferGpuNumaNode)
    {
        mNumaNode = gpuNumaNode(mDevice);
    }
    int multiprocessors = 0;
    KVCACHE_CUDA_TRY(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, mDevice));
    mMultiprocessors = multiprocessors;
    mStagingSlots = static_cast<int32_t>(std::clamp<int64_t>(
        options.stagingBytes / 2 / slotBytesValue, 1, std::min<int64_t>(numSlots, kMAX_INLINE_PAGE_OPS)));

    void* deviceOffsets = nullptr;
    size_t const offsetBytes = mLayerOffsets.size() * sizeof(int64_t);
    KVCACHE_CUDA_TRY(cudaMalloc(&deviceOffsets, std::max<size_t>(offsetBytes, 1)));
    mDeviceLayerOffsets = static_cast<int64_t*>(deviceOffsets);
    try
    {
        KVCACHE_CUDA_TRY(cudaMemcpy(mDeviceLayerOffsets, mLayerOffsets.data(), offsetBytes, cudaMemcpyHostToDevice));
        int64_t const stagingBytes = 2 * int64_t{mStagingSlots} * slotBytesValue;
        void* staging = nullptr;
        cudaError_t const status = cudaMalloc(&staging, static_cast<size_t>(stagingBytes));
        if (status == cudaErrorMemoryAllocation)
        {
            cudaGetLastError();
            throw OutOfMemoryError(fmt::format("{}: the staging buffer of {} slots ({} bytes) does not fit on device {}",
                kWHAT, mStagingSlots, stagingBytes, mDevice));
        }
        KVCACHE_CUDA_TRY(status);
        mStaging = static_cast<char*>(staging);
        pinChunk(0);
    }
    catch (...)
    {
        KVCACHE_CUDA_LOG(cudaFree(mStaging));
        KVCACHE_CUDA_LOG(cudaFree(mDeviceLayerOffsets));
        throw;
    }
    mCapacity.store(std::min(mSlotsPerChunk, numSlots), std::memory_order_release);
    if (numChunks == 1)
    {
        mPinningDone = true;
    }
    else
    {
        mPinner = std::thread([this] { pinRemaining(); });
    }
}

HostTier::~HostTier() noexcept
{
    mStop.store(true, std::memory_order_relaxed);
    if (mPinner.joinable())
    {
        mPinner.join();
    }
    detail::ScopedDevice const scoped(mDevice);
    // Nothing may still read or write the memory once it is unpinned.
    for (RecordPtr const& record : mRecords)
    {
        KVCACHE_CUDA_LOG(cudaEventSynchronize(record->event));
        KVCACHE_CUDA_LOG(cudaEventDestroy(record->event));
    }
    for (Chunk const& chunk : mChunks)
    {
        if (chunk.host != nullptr)
        {
            KVCACHE_CUDA_LOG(cudaHostUnregister(chunk.host));
            ::munmap(chunk.host, static_cast<size_t>(chunk.bytes));
        }
    }
    KVCACHE_CUDA_LOG(cudaFree(mStaging));
    KVCACHE_CUDA_LOG(cudaFree(mDeviceLayerOffsets));
}

void HostTier::pinChunk(int32_t index)
{
    Chunk& chunk = mChunks[static_cast<size_t>(index)];
    void* const address =
        ::mmap(nullptr, static_cast<size_t>(chunk.bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (address == MAP_FAILED)
    {
        throw OutOfMemoryError(
            fmt::format("HostTier: mapping chunk {} of {} bytes failed: {}", index, chunk.bytes, std::strerror(errno)));
    }
    // Advice only: without huge pages pinning is slower, not wrong.
    static_cast<void>(::madvise(address, static_cast<size_t>(chunk.bytes), MADV_HUGEPAGE));
    if (mNumaNode >= 0 && !preferNode(address, chunk.bytes, mNumaNode) && index == 0)
    {
        mNumaNode = -1;
    }
    cudaError_t const status =
        cudaHostRegister(address, static_cast<size_t>(chunk.bytes), cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (status != cudaSuccess)
    {
        ::munmap(address, static_cast<size_t>(chunk.bytes));
        cudaGetLastError();
        throw OutOfMemoryError(fmt::format("HostTier: pinning chunk {} of {} bytes failed: {} ({} of {} slots pinned)",
            index, chunk.bytes, cudaGetErrorString(status), int64_t{index} * mSlotsPerChunk, mTargetCapacity));
    }
    void* device = nullptr;
    cudaError_t const mapped = cudaHostGetDevicePointer(&device, address, 0);
    if (mapped != cudaSuccess)
    {
        KVCACHE_CUDA_LOG(cudaHostUnregister(address));
        ::munmap(address, static_cast<size_t>(chunk.bytes));
        detail::throwCudaError(mapped, "cudaHostGetDevicePointer", __FILE__, __LINE__);
    }
    chunk.host = static_cast<char*>(address);
    chunk.device = static_cast<char*>(device);
}

void HostTier::pinRemaining() noexcept
{
    std::exception_ptr error;
    try
    {
        KVCACHE_CUDA_TRY(cudaSetDevice(mDevice));
        auto const numChunks = static_cast<int32_t>(mChunks.size());
        for (int32_t c = 1; c < numChunks && !mStop.load(std::memory_order_relaxed); ++c)
        {
            pinChunk(c);
            mCapacity.store(std::min(mTargetCapacity, (c + 1) * mSlotsPerChunk), std::memory_order_release);
        }
    }
    catch (...)
    {
        error = std::current_exception();
    }
    {
        std::lock_guard<std::mutex> const lock(mReadyMutex);
        mPinningDone = true;
        mPinningError = error;
    }
    mReady.notify_all();
}

void HostTier::waitUntilReady() const
{
    std::unique_lock<std::mutex> lock(mReadyMutex);
    mReady.wait(lock, [this] { return mPinningDone; });
    if (mPinningError)
    {
        std::rethrow_exception(mPinningError);
    }
}

char* HostTier::slotHost(int64_t slot) const noexcept
{
    int64_t const chunk = slot / mSlotsPerChunk;
    return mChunks[static_cast<size_t>(chunk)].host + (slot - chunk * mSlotsPerChunk) * slotBytes();
}

void HostTier::checkSlot(char const* what, int64_t slot, int64_t limit) const
{
    if (slot < 0 || slot >= limit)
    {
        throw OutOfRangeError(fmt::format("{}: slot {} is outside [0, {}) (capacity {} of target {})", what, slot,
            limit, capacity(), mTargetCapacity));
    }
}

void* HostTier::slotData(int32_t slot)
{
    synchronizeSlots(&slot, 1);
    return slotHost(slot);
}

std::vector<int32_t> HostTier::allocateSlots(int32_t count)
{
    constexpr char const* kWHAT = "allocateSlots";
    if (count < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: count is {}; it must be >= 0", kWHAT, count));
    }
    int64_t const available = freeSlots();
    if (count > available)
    {
        throw OutOfMemoryError(fmt::format("{}: count is {}; the tier has {} free slots (capacity {} of target {})",
            kWHAT, count, available, capacity(), mTargetCapacity));
    }
    std::vector<int32_t> slots;
    slots.reserve(static_cast<size_t>(count));
    while (static_cast<int32_t>(slots.size()) < count && !mReleased.empty())
    {
        slots.push_back(mReleased.back());
        mReleased.pop_back();
    }
    while (static_cast<int32_t>(slots.size()) < count)
    {
        slots.push_back(static_cast<int32_t>(mNeverUsed++));
    }
    for (int32_t const slot : slots)
    {
        mHandedOut[static_cast<size_t>(slot)] = 1;
    }
    return slots;
}

void HostTier::releaseSlots(int32_t const* slots, int32_t count)
{
    constexpr char const* kWHAT = "releaseSlots";
    if (count < 0 || (slots == nullptr && count > 0))
    {
        throw InvalidArgumentError(fmt::format("{}: count is {} with a {} list; it must be >= 0 with a list", kWHAT,
            count, slots == nullptr ? "null" : "non-null"));
    }
    std::vector<int32_t> sorted(slots, slots + count);
    for (int32_t i = 0; i < count; ++i)
    {
        checkSlot(kWHAT, slots[i], capacity());
        if (mHandedOut[static_cast<size_t>(slots[i])] == 0)
        {
            throw InvalidArgumentError(
                fmt::format("{}: slots[{}] is slot {}, which is not handed out", kWHAT, i, slots[i]));
        }
    }
    checkNoDuplicates(kWHAT, "slot", sorted);
    for (int32_t i = 0; i < count; ++i)
    {
        mHandedOut[static_cast<size_t>(slots[i])] = 0;
        mReleased.push_back(slots[i]);
    }
}

int64_t HostTier::freeSlots() const noexcept
{
    return static_cast<int64_t>(mReleased.size()) + (capacity() - mNeverUsed);
}

void HostTier::checkGeometry(char const* what, KVCacheManager const& cache) const
{
    if (cache.device() != mDevice)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: the cache is on device {}; the tier is mapped for device {}", what, cache.device(), mDevice));
    }
    if (mGroup >= cache.numGroups())
    {
        throw InvalidArgumentError(
            fmt::format("{}: the cache has {} groups; the tier holds group {}", what, cache.numGroups(), mGroup));
    }
    SequenceFileGeometry const other = sequenceFileGeometry(cache.layout(), mGroup);
    bool same = other.dataType == mGeometry.dataType && other.tokensPerPage == mGeometry.tokensPerPage
        && other.slidingWindow == mGeometry.slidingWindow && other.layers.size() == mGeometry.layers.size()
        && other.bytesPerPage == mGeometry.bytesPerPage;
    for (size_t i = 0; same && i < other.layers.size(); ++i)
    {
        same = other.layers[i].kind == mGeometry.layers[i].kind
            && other.layers[i].numKVHeads == mGeometry.layers[i].numKVHeads
            && other.layers[i].headDim == mGeometry.layers[i].headDim;
    }
    if (!same || cache.group(mGroup).numPages != mNumPages)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: the cache's group {} has another geometry: {} layers, {} bytes and {} pages a half; the tier's has {} "
            "layers, {} bytes and {} pages",
            what, mGroup, other.layers.size(), other.bytesPerPage, cache.group(mGroup).numPages,
            mGeometry.layers.size(), mGeometry.bytesPerPage, mNumPages));
    }
}

void HostTier::validateEntries(char const* what, KVCacheManager const& cache, HostTierEntry const* entries,
    int32_t count, int64_t capacityNow) const
{
    checkGeometry(what, cache);
    if (count < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: count is {}; it must be >= 0", what, count));
    }
    if (entries == nullptr && count > 0)
    {
        throw InvalidArgumentError(fmt::format("{}: the list is null but count is {}", what, count));
    }
    for (int32_t i = 0; i < count; ++i)
    {
        if (entries[i].page < 0 || entries[i].page >= mNumPages)
        {
            throw OutOfRangeError(fmt::format(
                "{}: entries[{}].page is page {}; page ids must be in [0, {})", what, i, entries[i].page, mNumPages));
        }
        if (entries[i].slot < 0 || entries[i].slot >= capacityNow)
        {
            throw OutOfRangeError(
                fmt::format("{}: entries[{}].slot is slot {}; slots must be in [0, {}) (capacity {} of "
                            "target {})",
                    what, i, entries[i].slot, capacityNow, capacityNow, mTargetCapacity));
        }
    }
    thread_local std::vector<int32_t> ids;
    ids.resize(static_cast<size_t>(count));
    std::transform(entries, entries + count, ids.begin(), [](HostTierEntry const& e) { return e.page; });
    checkNoDuplicates(what, "page", ids);
    std::transform(entries, entries + count, ids.begin(), [](HostTierEntry const& e) { return e.slot; });
    checkNoDuplicates(what, "slot", ids);
}

HostTier::RecordPtr HostTier::acquireRecord()
{
    // A record nobody but this list holds belongs to no slot, page or caller-visible lastEvent any more.
    for (size_t n = 0; n < mRecords.size(); ++n)
    {
        size_t const i = (mNextRecord + n) % mRecords.size();
        if (mRecords[i].use_count() == 1)
        {
            mNextRecord = i + 1;
            return mRecords[i];
        }
    }
    auto record = std::make_shared<TransferRecord>();
    KVCACHE_CUDA_TRY(cudaEventCreateWithFlags(&record->event, cudaEventDisableTiming));
    mRecords.push_back(record);
    return record;
}

HostTierMethod HostTier::transfer(char const* what, Direction direction, KVCacheManager const& cache,
    HostTierEntry const* entries, int32_t count, cudaStream_t stream, HostTierMethod method)
{
    int64_t const capacityNow = capacity();
    validateEntries(what, cache, entries, count, capacityNow);
    if (method != HostTierMethod::kAUTO && method != HostTierMethod::kCOPY_ENGINE && method != HostTierMethod::kKERNEL)
    {
        throw InvalidArgumentError(
            fmt::format("{}: method is {}; it must be 0, 1 or 2", what, static_cast<int32_t>(method)));
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    KVCACHE_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: the stream is capturing; host-list transfers query events, capture the device-list form", what));
    }
    int64_t const bytes = int64_t{count} * slotBytes();
    if (method == HostTierMethod::kAUTO)
    {
        method = bytes <= kHOST_TIER_KERNEL_MAX_BYTES ? HostTierMethod::kKERNEL : HostTierMethod::kCOPY_ENGINE;
    }
    // The kernel's parameters, built once for the check below and the launch.
    detail::HostTierKernelParams kernel{};
    if (method == HostTierMethod::kKERNEL)
    {
        kernel = kernelParams(cache, capacityNow, nullptr);
        int64_t const perEntry = detail::hostTierItemsPerEntry(kernel);
        if (int64_t{kMAX_INLINE_PAGE_OPS} * perEntry > std::numeric_limits<uint32_t>::max())
        {
            throw InvalidArgumentError(
                fmt::format("{}: the kernel method needs fewer than 2^32 work items a launch; {} an entry are too many",
                    what, perEntry));
        }
    }
    if (count == 0)
    {
        return method;
    }
    detail::ScopedDevice const scoped(mDevice);

    // Transfers of this tier still in flight on other streams that touch these slots or pages: wait for them.
    std::vector<TransferRecord*> waits;
    auto const consider = [&](RecordPtr& last)
    {
        if (!last || last->stream == stream)
        {
            return;
        }
        cudaError_t const status = cudaEventQuery(last->event);
        if (status == cudaSuccess)
        {
            last.reset();
        }
        else if (status == cudaErrorNotReady)
        {
            if (std::find(waits.begin(), waits.end(), last.get()) == waits.end())
            {
                waits.push_back(last.get());
            }
        }
        else
        {
            detail::throwCudaError(status, "cudaEventQuery", __FILE__, __LINE__);
        }
    };
    for (int32_t i = 0; i < count; ++i)
    {
        consider(mSlotLast[static_cast<size_t>(entries[i].slot)]);
        consider(mPageLast[static_cast<size_t>(entries[i].page)]);
    }
    size_t const half = direction == Direction::kTO_HOST ? 0 : 1;
    if (method == HostTierMethod::kCOPY_ENGINE)
    {
        consider(mStagingLast[half]);
    }
    for (TransferRecord const* record : waits)
    {
        KVCACHE_CUDA_TRY(cudaStreamWaitEvent(stream, record->event, 0));
    }

    if (method == HostTierMethod::kKERNEL)
    {
        int32_t const maxGrid = std::min(mMultiprocessors, kHOST_TIER_MAX_SMS);
        detail::launchHostTierKernel(kernel, direction == Direction::kTO_HOST, entries, count, maxGrid, stream);
    }
    else
    {
        copyEngine(direction, cache, entries, count, stream);
    }

    RecordPtr const record = acquireRecord();
    KVCACHE_CUDA_TRY(cudaEventRecord(record->event, stream));
    record->stream = stream;
    for (int32_t i = 0; i < count; ++i)
    {
        mSlotLast[static_cast<size_t>(entries[i].slot)] = record;
        mPageLast[static_cast<size_t>(entries[i].page)] = record;
    }
    mLast = record;
    if (method == HostTierMethod::kCOPY_ENGINE)
    {
        mStagingLast[half] = record;
    }
    return method;
}

void HostTier::copyEngine(
    Direction direction, KVCacheManager const& cache, HostTierEntry const* entries, int32_t count, cudaStream_t stream)
{
    // Scattered pages make descriptors of one layer half each (tens of KiB), which the copy engine moves at half the
    // link's speed; whole slots (MiB) move at its full speed. So a kernel on the whole GPU gathers the pages into
    // slots of the staging buffer at HBM speed, or scatters them from it, and the copy engine moves slots.
    bool const toHost = direction == Direction::kTO_HOST;
    char* const buffer = mStaging + (toHost ? 0 : int64_t{mStagingSlots} * slotBytes());
    detail::HostTierKernelParams const staging = stagingParams(cache, buffer);
    int32_t const gatherGrid = mMultiprocessors * kSTAGING_BLOCKS_PER_SM;
    size_t const slotBytesValue = static_cast<size_t>(slotBytes());
    thread_local std::vector<HostTierEntry> staged;
    thread_local std::vector<void*> dsts;
    thread_local std::vector<void const*> srcs;
    thread_local std::vector<size_t> sizes;
    for (int32_t first = 0; first < count; first += mStagingSlots)
    {
        int32_t const n = std::min(mStagingSlots, count - first);
        staged.clear();
        dsts.clear();
        srcs.clear();
        sizes.clear();
        for (int32_t i = 0; i < n; ++i)
        {
            staged.push_back(HostTierEntry{entries[first + i].page, i});
            char* const host = slotHost(entries[first + i].slot);
            char* const device = buffer + static_cast<size_t>(i) * slotBytesValue;
            char* const dst = toHost ? host : device;
            char const* const src = toHost ? device : host;
            // Slots adjacent on both sides (in one pinned chunk) make one descriptor.
            if (!sizes.empty() && static_cast<char*>(dsts.back()) + sizes.back() == dst
                && static_cast<char const*>(srcs.back()) + sizes.back() == src)
            {
                sizes.back() += slotBytesValue;
                continue;
            }
            dsts.push_back(dst);
            srcs.push_back(src);
            sizes.push_back(slotBytesValue);
        }
        if (toHost)
        {
            detail::launchStagingKernel(staging, true, staged.data(), n, gatherGrid, stream);
            copyDescriptors(dsts, srcs, sizes, cudaMemcpyDeviceToHost, stream);
        }
        else
        {
            copyDescriptors(dsts, srcs, sizes, cudaMemcpyHostToDevice, stream);
            detail::launchStagingKernel(staging, false, staged.data(), n, gatherGrid, stream);
        }
    }
}

detail::HostTierKernelParams HostTier::stagingParams(KVCacheManager const& cache, char* staging) const
{
    // A staging half as a tier of stagingSlots() slots in one chunk: the kernel's slot addressing serves both.
    detail::HostTierKernelParams params = kernelParams(cache, mStagingSlots, nullptr);
    params.numSlots = mStagingSlots;
    params.slotsPerChunk = static_cast<uint32_t>(mStagingSlots);
    std::fill(std::begin(params.chunks), std::end(params.chunks), nullptr);
    params.chunks[0] = staging;
    return params;
}

detail::HostTierKernelParams HostTier::kernelParams(
    KVCacheManager const& cache, int64_t capacityNow, int32_t* deviceErrorCount) const
{
    detail::HostTierKernelParams params{};
    params.table = detail::ManagerInternals::layerTable(cache, mGroup);
    params.layerOffsets = mDeviceLayerOffsets;
    params.numLayers = static_cast<int32_t>(mGeometry.layers.size());
    params.numPages = mNumPages;
    int64_t maxPageBytes = 0;
    for (int32_t const layer : cache.group(mGroup).layers)
    {
        maxPageBytes = std::max(maxPageBytes, cache.layout().layers[static_cast<size_t>(layer)].pageBytes);
    }
    params.chunksPerHalf = static_cast<int32_t>(
        (maxPageBytes + detail::kHOST_TIER_KERNEL_CHUNK_BYTES - 1) / detail::kHOST_TIER_KERNEL_CHUNK_BYTES);
    params.numSlots = static_cast<int32_t>(capacityNow);
    params.slotsPerChunk = static_cast<uint32_t>(mSlotsPerChunk);
    params.slotBytes = slotBytes();
    params.errorCount = deviceErrorCount;
    for (size_t c = 0; c < mChunks.size(); ++c)
    {
        params.chunks[c] = static_cast<int64_t>(c) * mSlotsPerChunk < capacityNow ? mChunks[c].device : nullptr;
    }
    return params;
}

void HostTier::transferDevice(char const* what, Direction direction, KVCacheManager const& cache,
    HostTierEntry const* deviceEntries, int32_t capacityOfList, int32_t const* deviceCount, cudaStream_t stream,
    int32_t* deviceErrorCount)
{
    checkGeometry(what, cache);
    if (capacityOfList < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: capacity is {}; it must be >= 0", what, capacityOfList));
    }
    if (deviceEntries == nullptr && capacityOfList > 0)
    {
        throw InvalidArgumentError(fmt::format("{}: the list is null but capacity is {}", what, capacityOfList));
    }
    if (capacityOfList > kMAX_DEVICE_PAGE_OPS_PER_LAUNCH)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: capacity is {}; one call takes at most {}", what, capacityOfList, kMAX_DEVICE_PAGE_OPS_PER_LAUNCH));
    }
    detail::HostTierKernelParams const params = kernelParams(cache, capacity(), deviceErrorCount);
    if (int64_t{capacityOfList} * detail::hostTierItemsPerEntry(params) > std::numeric_limits<uint32_t>::max())
    {
        throw InvalidArgumentError(fmt::format("{}: capacity is {}; with {} work items an entry the limit is {}", what,
            capacityOfList, detail::hostTierItemsPerEntry(params),
            std::numeric_limits<uint32_t>::max() / detail::hostTierItemsPerEntry(params)));
    }
    detail::ScopedDevice const scoped(mDevice);
    int32_t const maxGrid = std::min(mMultiprocessors, kHOST_TIER_MAX_SMS);
    detail::launchHostTierKernelDevice(
        params, direction == Direction::kTO_HOST, deviceEntries, capacityOfList, deviceCount, maxGrid, stream);
}

HostTierMethod HostTier::offload(KVCacheManager const& cache, HostTierEntry const* entries, int32_t count,
    cudaStream_t stream, HostTierMethod method)
{
    return transfer("HostTier::offload", Direction::kTO_HOST, cache, entries, count, stream, method);
}

HostTierMethod HostTier::offload(
    KVCacheManager const& cache, std::vector<HostTierEntry> const& entries, cudaStream_t stream, HostTierMethod method)
{
    return offload(cache, entries.data(), listCount("HostTier::offload", entries.size()), stream, method);
}

HostTierMethod HostTier::onboard(KVCacheManager const& cache, HostTierEntry const* entries, int32_t count,
    cudaStream_t stream, HostTierMethod method)
{
    return transfer("HostTier::onboard", Direction::kTO_DEVICE, cache, entries, count, stream, method);
}

HostTierMethod HostTier::onboard(
    KVCacheManager const& cache, std::vector<HostTierEntry> const& entries, cudaStream_t stream, HostTierMethod method)
{
    return onboard(cache, entries.data(), listCount("HostTier::onboard", entries.size()), stream, method);
}

void HostTier::offloadDevice(KVCacheManager const& cache, HostTierEntry const* deviceEntries, int32_t capacityOfList,
    int32_t const* deviceCount, cudaStream_t stream, int32_t* deviceErrorCount)
{
    transferDevice("HostTier::offloadDevice", Direction::kTO_HOST, cache, deviceEntries, capacityOfList, deviceCount,
        stream, deviceErrorCount);
}

void HostTier::onboardDevice(KVCacheManager const& cache, HostTierEntry const* deviceEntries, int32_t capacityOfList,
    int32_t const* deviceCount, cudaStream_t stream, int32_t* deviceErrorCount)
{
    transferDevice("HostTier::onboardDevice", Direction::kTO_DEVICE, cache, deviceEntries, capacityOfList, deviceCount,
        stream, deviceErrorCount);
}

bool HostTier::isSlotBusy(int32_t slot) const
{
    checkSlot("isSlotBusy", slot, mTargetCapacity);
    RecordPtr const& last = mSlotLast[static_cast<size_t>(slot)];
    if (!last)
    {
        return false;
    }
    cudaError_t const status = cudaEventQuery(last->event);
    if (status == cudaErrorNotReady)
    {
        return true;
    }
    KVCACHE_CUDA_TRY(status);
    return false;
}

void HostTier::synchronizeSlots(int32_t const* slots, int64_t count)
{
    constexpr char const* kWHAT = "synchronizeSlots";
    if (count < 0 || (slots == nullptr && count > 0))
    {
        throw InvalidArgumentError(fmt::format("{}: count is {} with a {} list; it must be >= 0 with a list", kWHAT,
            count, slots == nullptr ? "null" : "non-null"));
    }
    int64_t const capacityNow = capacity();
    for (int64_t i = 0; i < count; ++i)
    {
        checkSlot(kWHAT, slots[i], capacityNow);
    }
    for (int64_t i = 0; i < count; ++i)
    {
        RecordPtr& last = mSlotLast[static_cast<size_t>(slots[i])];
        if (last)
        {
            KVCACHE_CUDA_TRY(cudaEventSynchronize(last->event));
            last.reset();
        }
    }
}

cudaEvent_t HostTier::lastEvent() const noexcept
{
    return mLast ? mLast->event : nullptr;
}

void saveSequence(std::string const& path, HostTier& tier, int32_t const* slots, int64_t count, int64_t tokenCount)
{
    tier.synchronizeSlots(slots, count);
    std::vector<void const*> pages;
    pages.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
    {
        pages.push_back(tier.slotData(slots[i]));
    }
    writeSequenceFile(path, tier.geometry(), tokenCount, pages.data(), count);
}

int64_t loadSequence(std::string const& path, HostTier& tier, int32_t const* slots, int64_t count)
{
    tier.synchronizeSlots(slots, count);
    std::vector<int32_t> sorted(slots, slots + count);
    checkNoDuplicates("loadSequence", "slot", sorted);
    std::vector<void*> pages;
    pages.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
    {
        pages.push_back(tier.slotData(slots[i]));
    }
    return readSequenceFile(path, tier.geometry(), pages.data(), count);
}

} // namespace kvcache::rt
