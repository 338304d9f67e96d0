#pragma once

#include "kvcache/core/page_geometry.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/tiers/sequence_file.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvcache::rt
{

//! How a transfer moves its bytes.
enum class HostTierMethod : int32_t
{
    //! The kernel for small transfers, the copy engine otherwise (kHOST_TIER_KERNEL_MAX_BYTES gives the rule).
    kAUTO = 0,
    //! The copy engine (cudaMemcpyBatchAsync). A transfer of fewer than 16 host pages that takes at most 1024
    //! descriptors moves straight between the pages and the host pages, one descriptor a page half of a layer (data
    //! or scales), in one call, which moves at the link's speed and needs no kernel. Longer transfers, and every one
    //! on the legacy default stream (which takes no batch calls: cudaMemcpyAsync a host page), are staged through
    //! device memory: a kernel on every multiprocessor gathers the pages into whole host pages in the tier's staging
    //! buffer (or scatters them from it), and the copy engine moves each host page as one descriptor, in parts from 16
    //! host pages, the kernel's work on all parts but one on a stream of the tier's (ordered by events) while the copy
    //! engine moves another part; the caller's stream waits for that work, so the transfer is still ordered on it as
    //! a whole.
    kCOPY_ENGINE = 1,
    //! A kernel of one 256-thread block a multiprocessor on at most kHOST_TIER_MAX_SMS multiprocessors, reading or
    //! writing the mapped pinned memory directly, in launches of at most 16 MiB (at least one host page) so compute
    //! kernels waiting for room get it between launches: the fastest for one or two pages, and what device lists
    //! (graph capture) use.
    kKERNEL = 2,
};

//! kAUTO takes the kernel for transfers of at most this many bytes (count * hostPageBytes()) and the copy engine for
//! larger ones: for one or two large pages the kernel is as fast as the staged copy engine or faster (an onboard's
//! copy and scatter run one after the other), from a few pages on the copy engine is faster both ways
//! (docs/benchmarks.md has the measurements).
inline constexpr int64_t kHOST_TIER_KERNEL_MAX_BYTES = int64_t{4} << 20;
//! The kernel path's grid: one block on each of at most this many multiprocessors, so it leaves the rest of the GPU
//! to concurrent compute.
inline constexpr int32_t kHOST_TIER_MAX_SMS = 8;
//! The most pinned chunks a tier has; a larger tier pins larger chunks.
inline constexpr int32_t kHOST_TIER_MAX_CHUNKS = 256;

//! How a HostTier pins its memory.
struct HostTierOptions
{
    //! Bytes pinned at a time (rounded to whole host pages, at least one). The constructor pins the first chunk, a
    //! background thread the rest, so construction takes one chunk's pinning whatever the tier's size.
    int64_t chunkBytes = int64_t{256} << 20;
    //! Where the machine has several NUMA nodes, ask the kernel to place the memory on the GPU's node
    //! (MPOL_PREFERRED through the mbind system call, no libnuma); memory comes from another node when that one is
    //! full.
    bool preferGpuNumaNode = true;
    //! Device memory of the kCOPY_ENGINE path, half for each direction so offloads and onboards can overlap, each
    //! half rounded down to whole host pages (at least one): a transfer is staged there that many host pages at a
    //! time. Allocated by the constructor, outside the cache's memory.
    int64_t stagingBytes = int64_t{128} << 20;
    //! Host states: room for this many state slots (a sequence's recurrent state in every state layer and tensor,
    //! hostStateBytes() each), pinned by the constructor in one allocation. 0 for none; a cache without state layers
    //! takes only 0.
    int64_t numHostStates = 0;
};

//! One state slot transfer: the cache's state slot `slot` and the tier's host state `hostState`.
struct HostStateEntry
{
    int32_t slot;
    int32_t hostState;
};

//! Pinned host memory for pages of one page group of a cache's geometry, in host pages: a host page holds one page
//! id's bytes of every layer of the group in layer order, each layer's K page then its V page (a latent layer: its
//! one page), contiguous; then, for a quantization with scale pools (kFP8_PER_TOKEN_HEAD, kNVFP4), every layer's
//! scale pages in the same order, K scales then V scales (none for a latent layer's V). hostPageBytes() = the
//! group's bytesPerPage, data and scales, with nothing between them (docs/layout.md, "Host pages").
//!
//! Transfers (offload: device pages to host pages; onboard: host pages to device pages) move every layer of the group,
//! data and scales, in one call, stream-ordered on the caller's stream, without synchronising the host. Host-held
//! scales (per-tensor FP8, NVFP4 global scales) stay in the manager: a host page does not hold them (sequence files
//! record them, see saveSequence).
//!
//! What is guaranteed about transfers in flight. After a host-list transfer the tier records an event on its stream
//! and remembers it for every host page and device page id it touched. A later host-list transfer (either direction)
//! that touches one of them from another stream, while that event has not completed, makes its stream wait for the
//! event first (cudaStreamWaitEvent); on the same stream, stream order already serialises them. So the tier's own
//! host-list transfers never race on a host page or a page. saveSequence, loadSequence, hostPageData readers and
//! synchronizeHostPages wait on the host for the host pages' events. Not covered: device-list transfers (the host
//! cannot see their ids: order them yourself, e.g. on one stream) and the caller's own kernels touching the device
//! pages (order them after lastEvent() or on the transfer's stream).
//!
//! Host states (HostTierOptions::numHostStates) hold state slots the same way: a host state is one state slot of every
//! state layer, in the layout's order (state layers in order, each layer's tensors in config order, back to back;
//! docs/layout.md, "Host states"), hostStateBytes() = the layout's stateBytesPerSlot. offloadStates and onboardStates
//! move them on the caller's stream (the copy engine, one copy a state tensor), tracked as host pages are: a later
//! state transfer on another stream touching the same host state or slot waits for one in flight, and hostStateData
//! and synchronizeHostStates wait on the host. Host states belong to the tier, not to its page group.
//!
//! Not thread-safe except numPinnedHostPages(), numHostPages() and waitUntilReady(), which any thread may call.
//! Neither copyable nor movable (its pinning thread holds it).
class HostTier
{
public:
    //! Sizes the tier for `numHostPages` host pages of page group `group` of `cache`'s geometry on the cache's device,
    //! pins the first chunk and starts a thread pinning the rest. Throws OutOfRangeError for a bad group,
    //! InvalidArgumentError for numHostPages outside [1, INT32_MAX], chunkBytes <= 0, stagingBytes < 0, or
    //! numHostStates outside [0, INT32_MAX] or above 0 for a cache without state layers,
    //! OutOfMemoryError when the staging buffer or the host states cannot be allocated or the first chunk cannot be
    //! mapped or pinned,
    //! CudaError for other CUDA failures.
    HostTier(KVCacheManager const& cache, int32_t group, int64_t numHostPages, HostTierOptions const& options = {});
    //! Stops the pinning thread, waits for the tier's host-list transfers, then unpins and frees everything; never
    //! throws. Transfers from device lists (offloadDevice, onboardDevice, graph-capturable) are not tracked: they must
    //! have completed before the tier is destroyed.
    ~HostTier() noexcept;
    HostTier(HostTier const&) = delete;
    HostTier& operator=(HostTier const&) = delete;
    HostTier(HostTier&&) = delete;
    HostTier& operator=(HostTier&&) = delete;

    //! Returns the host pages pinned now: host pages [0, numPinnedHostPages()) are usable. Grows to numHostPages().
    int64_t numPinnedHostPages() const noexcept;
    //! Returns the host pages the tier was sized for.
    int64_t numHostPages() const noexcept;
    //! Blocks until every host page is pinned or pinning stopped; rethrows what stopped it (the tier keeps the host
    //! pages pinned so far).
    void waitUntilReady() const;
    //! Returns the bytes of one host page: the group's bytesPerPage, its data and scale pages exactly.
    int64_t hostPageBytes() const noexcept;
    //! Returns the host pages the kCOPY_ENGINE path stages at a time in each direction
    //! (HostTierOptions::stagingBytes).
    int32_t numStagingHostPages() const noexcept;
    //! Returns the page group the tier holds pages of.
    int32_t group() const noexcept;
    //! Returns the device the tier's memory is mapped for.
    int32_t device() const noexcept;
    //! Returns the NUMA node the memory was bound to, or -1 when it was not (one node, option off, unknown node).
    int32_t numaNode() const noexcept;
    //! Returns the quantization of the cache the tier was made for (also geometry().quantization).
    KVQuantization quantization() const noexcept;
    //! Returns the geometry a host page's bytes have (what sequence files record).
    PageGeometry const& geometry() const noexcept;
    //! Returns the host address of host page `hostPage`, after waiting for the tier's transfers touching it. Throws
    //! OutOfRangeError for a host page outside [0, numPinnedHostPages()).
    void* hostPageData(int32_t hostPage);

    //! Hands out `count` free host pages among those pinned (released ones first, most recent first; then never used
    //! ones in ascending order). Throws InvalidArgumentError for a negative count and OutOfMemoryError naming the
    //! count, the free host pages and the pinned ones when the tier is full (nothing is handed out then).
    std::vector<int32_t> allocateHostPages(int32_t count);
    //! Returns host pages to the free list. Throws OutOfRangeError for a host page outside [0, numPinnedHostPages())
    //! and InvalidArgumentError for one not handed out or listed twice, before releasing any.
    void releaseHostPages(int32_t const* hostPages, int32_t count);
    //! Returns the host pages neither handed out nor waiting to be pinned.
    int64_t numFreeHostPages() const noexcept;

    //! Copies each entry's device page of the group in `cache` to its host page, all layers and halves, data and scale
    //! pages, on `stream`.
    //! `cache` must have the tier's geometry (a cache built from the same config). kAUTO picks the kernel for at most
    //! kHOST_TIER_KERNEL_MAX_BYTES (count * hostPageBytes()), the copy engine above. Returns the method used.
    //! Throws, before enqueuing anything: InvalidArgumentError for another geometry, a negative count, a null list
    //! with a positive count, a page or a host page listed twice, or a capturing stream (capture offloadDevice
    //! instead: host-list calls query events); OutOfRangeError for a page outside [0, the group's numPages) or a host
    //! page outside [0, numPinnedHostPages()).
    HostTierMethod offload(KVCacheManager const& cache, HostTierEntry const* entries, int32_t count,
        cudaStream_t stream, HostTierMethod method = HostTierMethod::kAUTO);
    //! As above, for a std::vector (InvalidArgumentError for more than INT32_MAX entries).
    HostTierMethod offload(KVCacheManager const& cache, std::vector<HostTierEntry> const& entries, cudaStream_t stream,
        HostTierMethod method = HostTierMethod::kAUTO)
    {
        return offload(cache, entries.data(), listCount("HostTier::offload", entries.size()), stream, method);
    }
    //! Copies each entry's host page to its device page, as offload does the other way.
    HostTierMethod onboard(KVCacheManager const& cache, HostTierEntry const* entries, int32_t count,
        cudaStream_t stream, HostTierMethod method = HostTierMethod::kAUTO);
    //! As above, for a std::vector (InvalidArgumentError for more than INT32_MAX entries).
    HostTierMethod onboard(KVCacheManager const& cache, std::vector<HostTierEntry> const& entries, cudaStream_t stream,
        HostTierMethod method = HostTierMethod::kAUTO)
    {
        return onboard(cache, entries.data(), listCount("HostTier::onboard", entries.size()), stream, method);
    }

    //! Offloads entries listed in device memory with the kernel, in launches on `stream` (16 MiB of list positions
    //! each, more where that would take over 16 launches; launches past the count end at once), so a graph that
    //! captured the call replays with whatever the list holds then. `deviceEntries` holds `capacity` entries; the
    //! kernel reads `*deviceCount` of them (all when it is nullptr; clamped to [0, capacity]). Entries with a
    //! kUNUSED_PAGE_ENTRY field are skipped; an entry with a page outside [0, numPages) or a host page outside
    //! [0, numPinnedHostPages() at the call) is skipped and, when `deviceErrorCount` is given, adds one to it.
    //! Duplicates are the caller's to avoid. Records no event (see the class comment). Throws, before launching, for
    //! another geometry, a negative capacity, a null list with a positive capacity, or capacity above
    //! kMAX_DEVICE_PAGE_OPS_PER_LAUNCH.
    void offloadDevice(KVCacheManager const& cache, HostTierEntry const* deviceEntries, int32_t capacity,
        int32_t const* deviceCount, cudaStream_t stream, int32_t* deviceErrorCount = nullptr);
    //! Onboards entries listed in device memory, with offloadDevice's rules.
    void onboardDevice(KVCacheManager const& cache, HostTierEntry const* deviceEntries, int32_t capacity,
        int32_t const* deviceCount, cudaStream_t stream, int32_t* deviceErrorCount = nullptr);

    //! Returns the host states the tier holds (HostTierOptions::numHostStates), all pinned by the constructor.
    int64_t numHostStates() const noexcept;
    //! Returns the bytes of one host state: the cache layout's stateBytesPerSlot (0 without state layers).
    int64_t hostStateBytes() const noexcept;
    //! Hands out `count` free host states, as allocateHostPages does host pages. Throws InvalidArgumentError for a
    //! negative count and OutOfMemoryError naming the count and the free host states when too few are free (nothing is
    //! handed out then).
    std::vector<int32_t> allocateHostStates(int32_t count);
    //! Returns host states to the free list. Throws OutOfRangeError for a host state outside [0, numHostStates()) and
    //! InvalidArgumentError for one not handed out or listed twice, before releasing any.
    void releaseHostStates(int32_t const* hostStates, int32_t count);
    //! Returns the host states not handed out.
    int64_t numFreeHostStates() const noexcept;
    //! Returns the host address of host state `hostState` (hostStateBytes() bytes, packed as the class comment says),
    //! after waiting for the tier's transfers touching it. Throws OutOfRangeError for a host state outside
    //! [0, numHostStates()).
    void* hostStateData(int32_t hostState);

    //! Copies each entry's state slot of `cache` (every state layer and tensor) to its host state, on `stream`.
    //! `cache` must have the tier's state layout (a cache built from the same config). Throws, before enqueuing
    //! anything: InvalidArgumentError for a cache without state layers, another state layout or device, a negative
    //! count, a null list with a positive count, a slot or a host state listed twice, or a capturing stream;
    //! OutOfRangeError for a slot outside [0, numStateSlots) or a host state outside [0, numHostStates()).
    void offloadStates(KVCacheManager const& cache, HostStateEntry const* entries, int32_t count, cudaStream_t stream);
    //! As above, for a std::vector (InvalidArgumentError for more than INT32_MAX entries).
    void offloadStates(KVCacheManager const& cache, std::vector<HostStateEntry> const& entries, cudaStream_t stream)
    {
        offloadStates(cache, entries.data(), listCount("HostTier::offloadStates", entries.size()), stream);
    }
    //! Copies each entry's host state to its state slot of `cache`, as offloadStates does the other way.
    void onboardStates(KVCacheManager const& cache, HostStateEntry const* entries, int32_t count, cudaStream_t stream);
    //! As above, for a std::vector (InvalidArgumentError for more than INT32_MAX entries).
    void onboardStates(KVCacheManager const& cache, std::vector<HostStateEntry> const& entries, cudaStream_t stream)
    {
        onboardStates(cache, entries.data(), listCount("HostTier::onboardStates", entries.size()), stream);
    }
    //! Returns true while a state transfer touching `hostState` has not completed. Throws OutOfRangeError for a host
    //! state outside [0, numHostStates()).
    bool isHostStateBusy(int32_t hostState) const;
    //! Waits on the host for the tier's transfers touching the listed host states. Throws OutOfRangeError for a host
    //! state outside [0, numHostStates()) and CudaError when a transfer failed.
    void synchronizeHostStates(int32_t const* hostStates, int64_t count);

    //! Returns true while a host-list transfer touching `hostPage` has not completed. Throws OutOfRangeError for a
    //! host page outside [0, numHostPages()).
    bool isHostPageBusy(int32_t hostPage) const;
    //! Waits on the host for the tier's transfers touching the listed host pages. Throws OutOfRangeError for a host
    //! page outside [0, numPinnedHostPages()) and CudaError when a transfer failed.
    void synchronizeHostPages(int32_t const* hostPages, int64_t count);
    //! Returns the event recorded after the latest host-list transfer, of pages or states (nullptr before the first);
    //! valid until the next transfer call, which may record it again.
    cudaEvent_t lastEvent() const noexcept;

private:
    //! Returns `size` as a list count; throws InvalidArgumentError naming `what` above INT32_MAX.
    static int32_t listCount(char const* what, size_t size);

    struct Impl;
    std::unique_ptr<Impl> mImpl;
};

//! Writes host pages `hostPages[0, count)` of `tier` (in that order), `tokenCount` and the host-held scales of
//! `cache`'s layers of the tier's group (kFP8_PER_TENSOR, kNVFP4; none for other quantizations) to a sequence file at
//! `path` (see writeSequenceFile), after waiting for the tier's transfers touching them. The host pages must hold
//! pages offloaded from a cache with those scales. Throws, before touching anything, InvalidArgumentError naming both
//! geometries when `cache`'s group has another geometry than the tier's; then as writeSequenceFile and, for a bad
//! host page, as HostTier::synchronizeHostPages.
void saveSequence(std::string const& path, HostTier& tier, KVCacheManager const& cache, int32_t const* hostPages,
    int64_t count, int64_t tokenCount);
//! As above, and with the sequence's state: host state `hostState` of `tier` (offloaded from a cache with `cache`'s
//! state layers), recorded with `cache`'s state tensors (sequenceStateTensors) and written after the pages. Throws,
//! before touching anything, InvalidArgumentError when `cache` has no state layers or state slots of other bytes than
//! the tier's host states, and OutOfRangeError for a host state outside [0, numHostStates()).
void saveSequence(std::string const& path, HostTier& tier, KVCacheManager const& cache, int32_t const* hostPages,
    int64_t count, int64_t tokenCount, int32_t hostState);
//! As above, for a tier whose quantization keeps no host-held scales (kNONE, kFP8_PER_TOKEN_HEAD, whose page scales
//! are in the host pages). Throws InvalidArgumentError naming the quantization, before touching anything, for
//! kFP8_PER_TENSOR and kNVFP4: their scales are in the manager, so pass the cache.
void saveSequence(std::string const& path, HostTier& tier, int32_t const* hostPages, int64_t count, int64_t tokenCount);
//! Reads the sequence file at `path` into host pages `hostPages[0, count)` of `tier` and returns its token count,
//! after waiting for the tier's transfers touching them. The whole file is verified before any host page is
//! written: another geometry (quantization included), host-held scales other than `cache`'s (compared bit for bit,
//! layer by layer of the group; to adopt a file's scales, read them with readSequenceFileInfo and set them with
//! KVCacheManager::setLayerScales first), a count other than the file's, a format version older than 2, a truncated or
//! corrupt file throw InvalidArgumentError naming the field, the file's value and the expected one (see
//! readSequenceFile) and leave every host page as it was; so do a bad host page or one listed twice, and a `cache`
//! whose group has another geometry than the tier's.
int64_t loadSequence(
    std::string const& path, HostTier& tier, KVCacheManager const& cache, int32_t const* hostPages, int64_t count);
//! As above, and the file's state into host state `hostState` of `tier`, verified with the pages before anything is
//! written: a file holding no state (version 2 files included) or state tensors other than `cache`'s
//! (sequenceStateTensors) throws InvalidArgumentError naming the field, the file's value and the cache's, and leaves
//! every host page and the host state as they were; so do the refusals of the state saveSequence.
int64_t loadSequence(std::string const& path, HostTier& tier, KVCacheManager const& cache, int32_t const* hostPages,
    int64_t count, int32_t hostState);
//! As above, for a tier whose quantization keeps no host-held scales; throws InvalidArgumentError naming the
//! quantization, before touching anything, for kFP8_PER_TENSOR and kNVFP4 (pass the cache). A file's state, if it
//! holds one, is verified but not read out.
int64_t loadSequence(std::string const& path, HostTier& tier, int32_t const* hostPages, int64_t count);

} // namespace kvcache::rt
