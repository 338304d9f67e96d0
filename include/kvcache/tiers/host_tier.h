#pragma once

#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/tiers/sequence_file.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvcache::rt
{
namespace detail
{
struct HostTierKernelParams;
} // namespace detail

//! One page moved between the cache and the host tier: device page `page` of the tier's group and host slot `slot`.
//! Device-resident lists may hold kUNUSED_PAGE_ENTRY (-1) in either field as padding; the kernel skips the entry.
struct HostTierEntry
{
    int32_t page;
    int32_t slot;
};

//! How a transfer moves its bytes.
enum class HostTierMethod : int32_t
{
    //! The kernel for small transfers, the copy engine otherwise (kHOST_TIER_KERNEL_MAX_BYTES gives the rule).
    kAUTO = 0,
    //! Staged through device memory: a kernel on every multiprocessor gathers the pages into whole slots in the
    //! tier's staging buffer (or scatters them from it), and the copy engine moves each slot as one descriptor
    //! (cudaMemcpyBatchAsync; cudaMemcpyAsync a slot on the legacy default stream). Scattered page ids move at
    //! close to a contiguous copy's speed; the gather kernel takes the whole GPU for about 2% of the transfer's time.
    kCOPY_ENGINE = 1,
    //! A kernel of one 256-thread block a multiprocessor on at most kHOST_TIER_MAX_SMS multiprocessors, reading or
    //! writing the mapped pinned memory directly, in launches of at most 16 MiB (at least one slot) so compute
    //! kernels waiting for room get it between launches: the fastest for one or two pages, and what device lists
    //! (graph capture) use.
    kKERNEL = 2,
};

//! kAUTO takes the kernel for transfers of at most this many bytes (count * slotBytes()) and the copy engine for
//! larger ones. On an H200 over PCIe Gen5, across runs, the kernel moved one or two 2 MiB pages at 94-108% of a
//! contiguous copy and the staged copy engine at 82-103% (onboards lowest: its copy and its scatter run one after
//! the other); from 8 pages the copy engine was faster both ways (docs/benchmarks.md).
inline constexpr int64_t kHOST_TIER_KERNEL_MAX_BYTES = int64_t{4} << 20;
//! The kernel path's grid: one block on each of at most this many multiprocessors, so it leaves the rest of the GPU
//! to concurrent compute.
inline constexpr int32_t kHOST_TIER_MAX_SMS = 8;
//! The most pinned chunks a tier has; a larger tier pins larger chunks.
inline constexpr int32_t kHOST_TIER_MAX_CHUNKS = 256;

//! How a HostTier pins its memory.
struct HostTierOptions
{
    //! Bytes pinned at a time (rounded to whole slots, at least one). The constructor pins the first chunk, a
    //! background thread the rest, so construction takes one chunk's pinning whatever the tier's size.
    int64_t chunkBytes = int64_t{256} << 20;
    //! Where the machine has several NUMA nodes, ask the kernel to place the memory on the GPU's node
    //! (MPOL_PREFERRED through the mbind system call, no libnuma); memory comes from another node when that one is
    //! full.
    bool preferGpuNumaNode = true;
    //! Device memory of the kCOPY_ENGINE path, half for each direction so offloads and onboards can overlap, each
    //! half rounded down to whole slots (at least one): a transfer is staged there that many slots at a time.
    //! Allocated by the constructor, outside the cache's memory.
    int64_t stagingBytes = int64_t{128} << 20;
};

//! Pinned host memory for pages of one page group of a cache's geometry, in slots: a slot holds one page id's bytes
//! of every layer of the group in layer order, each layer's K page then its V page (a latent layer: its one page),
//! contiguous, slotBytes() = the group's bytesPerPage.
//!
//! Transfers (offload: device pages to slots; onboard: slots to device pages) move every layer of the group in one
//! call, stream-ordered on the caller's stream, without synchronising the host.
//!
//! What is guaranteed about transfers in flight. After a host-list transfer the tier records an event on its stream
//! and remembers it for every slot and device page id it touched. A later host-list transfer (either direction) that
//! touches one of them from another stream, while that event has not completed, makes its stream wait for the event
//! first (cudaStreamWaitEvent); on the same stream, stream order already serialises them. So the tier's own
//! host-list transfers never race on a slot or a page. saveSequence, loadSequence, slotData readers and
//! synchronizeSlots wait on the host for the slots' events. Not covered: device-list transfers (the host cannot
//! see their ids: order them yourself, e.g. on one stream) and the caller's own kernels touching the device pages
//! (order them after lastEvent() or on the transfer's stream).
//!
//! Not thread-safe except capacity(), targetCapacity() and waitUntilReady(), which any thread may call. Neither
//! copyable nor movable (its pinning thread holds it).
class HostTier
{
public:
    //! Sizes the tier for `numSlots` slots of page group `group` of `cache`'s geometry on the cache's device, pins the
    //! first chunk and starts a thread pinning the rest. Throws OutOfRangeError for a bad group, InvalidArgumentError
    //! for numSlots outside [1, INT32_MAX], chunkBytes <= 0 or stagingBytes < 0, OutOfMemoryError when the staging
    //! buffer cannot be allocated or the first chunk cannot be mapped or pinned, CudaError for other CUDA failures.
    HostTier(KVCacheManager const& cache, int32_t group, int64_t numSlots, HostTierOptions const& options = {});
    //! Stops the pinning thread, waits for the tier's transfers, then unpins and frees everything; never throws.
    ~HostTier() noexcept;
    HostTier(HostTier const&) = delete;
    HostTier& operator=(HostTier const&) = delete;
    HostTier(HostTier&&) = delete;
    HostTier& operator=(HostTier&&) = delete;

    //! Returns the slots pinned now: slots [0, capacity()) are usable. Grows to targetCapacity().
    int64_t capacity() const noexcept
    {
        return mCapacity.load(std::memory_order_acquire);
    }
    //! Returns the slots the tier was sized for.
    int64_t targetCapacity() const noexcept
    {
        return mTargetCapacity;
    }
    //! Blocks until every slot is pinned or pinning stopped; rethrows what stopped it (the tier keeps the slots
    //! pinned so far).
    void waitUntilReady() const;
    //! Returns the bytes of one slot: the group's bytesPerPage.
    int64_t slotBytes() const noexcept
    {
        return mGeometry.bytesPerPage;
    }
    //! Returns the slots the kCOPY_ENGINE path stages at a time in each direction (HostTierOptions::stagingBytes).
    int32_t stagingSlots() const noexcept
    {
        return mStagingSlots;
    }
    //! Returns the page group the tier holds pages of.
    int32_t group() const noexcept
    {
        return mGroup;
    }
    //! Returns the device the tier's memory is mapped for.
    int32_t device() const noexcept
    {
        return mDevice;
    }
    //! Returns the NUMA node the memory was bound to, or -1 when it was not (one node, option off, unknown node).
    int32_t numaNode() const noexcept
    {
        return mNumaNode;
    }
    //! Returns the geometry a slot's bytes have (what sequence files record).
    SequenceFileGeometry const& geometry() const noexcept
    {
        return mGeometry;
    }
    //! Returns the host address of slot `slot`, after waiting for the tier's transfers touching it. Throws
    //! OutOfRangeError for a slot outside [0, capacity()).
    void* slotData(int32_t slot);

    //! Hands out `count` free slots among those pinned (released ones first, most recent first; then never used ones
    //! in ascending order). Throws InvalidArgumentError for a negative count and OutOfMemoryError naming the count,
    //! the free slots and the capacity when the tier is full (nothing is handed out then).
    std::vector<int32_t> allocateSlots(int32_t count);
    //! Returns slots to the free list. Throws OutOfRangeError for a slot outside [0, capacity()) and
    //! InvalidArgumentError for one not handed out or listed twice, before releasing any.
    void releaseSlots(int32_t const* slots, int32_t count);
    //! Returns the slots neither handed out nor waiting to be pinned.
    int64_t freeSlots() const noexcept;

    //! Copies each entry's device page of the group in `cache` to its slot, all layers and halves, on `stream`.
    //! `cache` must have the tier's geometry (a cache built from the same config). kAUTO picks the kernel for at most
    //! kHOST_TIER_KERNEL_MAX_BYTES (count * slotBytes()), the copy engine above. Returns the method used.
    //! Throws, before enqueuing anything: InvalidArgumentError for another geometry, a negative count, a null list
    //! with a positive count, a page or a slot listed twice, or a capturing stream (capture offloadDevice instead:
    //! host-list calls query events); OutOfRangeError for a page outside [0, the group's numPages) or a slot outside
    //! [0, capacity()).
    HostTierMethod offload(KVCacheManager const& cache, HostTierEntry const* entries, int32_t count,
        cudaStream_t stream, HostTierMethod method = HostTierMethod::kAUTO);
    //! As above, for a std::vector.
    HostTierMethod offload(KVCacheManager const& cache, std::vector<HostTierEntry> const& entries, cudaStream_t stream,
        HostTierMethod method = HostTierMethod::kAUTO);
    //! Copies each entry's slot to its device page, as offload does the other way.
    HostTierMethod onboard(KVCacheManager const& cache, HostTierEntry const* entries, int32_t count,
        cudaStream_t stream, HostTierMethod method = HostTierMethod::kAUTO);
    //! As above, for a std::vector.
    HostTierMethod onboard(KVCacheManager const& cache, std::vector<HostTierEntry> const& entries, cudaStream_t stream,
        HostTierMethod method = HostTierMethod::kAUTO);

    //! Offloads entries listed in device memory with the kernel, in launches on `stream` (16 MiB of list positions
    //! each, more where that would take over 16 launches; launches past the count end at once), so a graph that captured
    //! the call replays with whatever the list holds then. `deviceEntries` holds `capacity` entries; the kernel reads
    //! `*deviceCount` of them (all when it is nullptr; clamped to [0, capacity]). Entries with a kUNUSED_PAGE_ENTRY
    //! field are skipped; an entry with a page outside [0, numPages) or a slot outside [0, capacity() at the call)
    //! is skipped and, when `deviceErrorCount` is given, adds one to it. Duplicates are the caller's to avoid.
    //! Records no event (see the class comment). Throws, before launching, for another geometry, a negative capacity,
    //! a null list with a positive capacity, or capacity above kMAX_DEVICE_PAGE_OPS_PER_LAUNCH.
    void offloadDevice(KVCacheManager const& cache, HostTierEntry const* deviceEntries, int32_t capacity,
        int32_t const* deviceCount, cudaStream_t stream, int32_t* deviceErrorCount = nullptr);
    //! Onboards entries listed in device memory, with offloadDevice's rules.
    void onboardDevice(KVCacheManager const& cache, HostTierEntry const* deviceEntries, int32_t capacity,
        int32_t const* deviceCount, cudaStream_t stream, int32_t* deviceErrorCount = nullptr);

    //! Returns true while a host-list transfer touching `slot` has not completed. Throws OutOfRangeError for a slot
    //! outside [0, targetCapacity()).
    bool isSlotBusy(int32_t slot) const;
    //! Waits on the host for the tier's transfers touching the listed slots. Throws OutOfRangeError for a slot
    //! outside [0, capacity()) and CudaError when a transfer failed.
    void synchronizeSlots(int32_t const* slots, int64_t count);
    //! Returns the event recorded after the latest host-list transfer (nullptr before the first); valid until the next
    //! transfer call, which may record it again.
    cudaEvent_t lastEvent() const noexcept;

private:
    struct Chunk
    {
        char* host = nullptr;   //!< mapped and registered address
        char* device = nullptr; //!< the same memory as the device addresses it (cudaHostGetDevicePointer)
        int64_t bytes = 0;
    };
    struct TransferRecord;
    using RecordPtr = std::shared_ptr<TransferRecord>;
    enum class Direction
    {
        kTO_HOST,
        kTO_DEVICE,
    };

    void pinChunk(int32_t chunk);
    void pinRemaining() noexcept;
    void checkGeometry(char const* what, KVCacheManager const& cache) const;
    void validateEntries(char const* what, KVCacheManager const& cache, HostTierEntry const* entries, int32_t count,
        int64_t capacityNow) const;
    HostTierMethod transfer(char const* what, Direction direction, KVCacheManager const& cache,
        HostTierEntry const* entries, int32_t count, cudaStream_t stream, HostTierMethod method);
    void transferDevice(char const* what, Direction direction, KVCacheManager const& cache,
        HostTierEntry const* deviceEntries, int32_t capacity, int32_t const* deviceCount, cudaStream_t stream,
        int32_t* deviceErrorCount);
    void copyEngine(Direction direction, KVCacheManager const& cache, HostTierEntry const* entries, int32_t count,
        cudaStream_t stream);
    char* slotHost(int64_t slot) const noexcept;
    detail::HostTierKernelParams kernelParams(
        KVCacheManager const& cache, int64_t capacityNow, int32_t* deviceErrorCount) const;
    detail::HostTierKernelParams stagingParams(KVCacheManager const& cache, char* staging) const;
    RecordPtr acquireRecord();
    void checkSlot(char const* what, int64_t slot, int64_t limit) const;

    int32_t mGroup = 0;
    int32_t mDevice = 0;
    int32_t mNumaNode = -1;
    int32_t mNumPages = 0; //!< the group's pages: the device id range
    int32_t mMultiprocessors = 0;
    char* mStaging = nullptr; //!< device memory of 2 * stagingSlots() slots, for kCOPY_ENGINE: offloads, onboards
    int32_t mStagingSlots = 0;
    SequenceFileGeometry mGeometry{};
    std::vector<int64_t> mLayerOffsets{}; //!< bytes from a slot's start to each layer's K page
    int64_t* mDeviceLayerOffsets = nullptr;
    int64_t mTargetCapacity = 0;
    int64_t mSlotsPerChunk = 0;
    std::vector<Chunk> mChunks{}; //!< sized once; entry i is written before capacity() covers its slots
    std::atomic<int64_t> mCapacity{0};
    std::atomic<bool> mStop{false};
    mutable std::mutex mReadyMutex{};
    mutable std::condition_variable mReady{};
    bool mPinningDone = false;
    std::exception_ptr mPinningError{};
    std::thread mPinner{};

    std::vector<RecordPtr> mRecords{}; //!< every record made; one held by nobody else is free to record again
    size_t mNextRecord = 0;
    std::vector<RecordPtr> mSlotLast{}; //!< per slot: its latest transfer (null: none in flight, as far as known)
    std::vector<RecordPtr> mPageLast{}; //!< per device page id of the group
    RecordPtr mLast{};
    RecordPtr mStagingLast[2]{}; //!< per direction: the latest kCOPY_ENGINE transfer, which used its staging half

    std::vector<int32_t> mReleased{}; //!< released slots, most recent last
    int64_t mNeverUsed = 0;           //!< slots [mNeverUsed, capacity) were never handed out
    std::vector<uint8_t> mHandedOut{};
};

//! Writes the pages in `slots[0, count)` of `tier` (in that order) and `tokenCount` to a sequence file at `path`
//! (see writeSequenceFile), after waiting for the tier's transfers touching those slots. Throws as writeSequenceFile
//! and, for a bad slot, as HostTier::synchronizeSlots.
void saveSequence(std::string const& path, HostTier& tier, int32_t const* slots, int64_t count, int64_t tokenCount);
//! Reads the sequence file at `path` into `slots[0, count)` of `tier` and returns its token count, after waiting for
//! the tier's transfers touching those slots. The whole file is verified before any slot is written: another
//! geometry, a count other than the file's, a truncated or corrupt file throw InvalidArgumentError (see
//! readSequenceFile) and leave every slot as it was; so do a bad slot or one listed twice.
int64_t loadSequence(std::string const& path, HostTier& tier, int32_t const* slots, int64_t count);

} // namespace kvcache::rt
