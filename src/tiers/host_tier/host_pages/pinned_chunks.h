#pragma once

// A host tier's pinned memory: host pages in chunks mapped with mmap, placed on the GPU's NUMA node where asked, and
// registered (pinned and mapped for the device). The constructor pins the first chunk, a background thread the rest.

#include "core/cuda_owners.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvcache::rt::detail
{

//! Anonymous memory from mmap (a HostMemory), unmapped with munmap.
void unmapMemory(HostMemory const& memory) noexcept;

//! Anonymous memory from mmap, unmapped on destruction. Move-only; never throws on release.
class MappedMemory : public UniqueResource<HostMemory, unmapMemory>
{
public:
    MappedMemory() noexcept = default;
    //! Maps `bytes` of private anonymous memory. Throws OutOfMemoryError naming `what`, the bytes and the reason.
    MappedMemory(int64_t bytes, std::string const& what);

    //! Returns the address (nullptr when owning nothing).
    void* data() const noexcept
    {
        return state().data;
    }
};

//! `numHostPages` host pages of `hostPageBytes` bytes in chunks of hostPagesPerChunk() host pages; host pages
//! [0, numPinned()) are pinned and mapped. Neither copyable nor movable: its pinning thread holds it.
class PinnedChunks
{
public:
    //! Plans the chunks (at least one host page each, at most kHOST_TIER_MAX_CHUNKS of them), picks the NUMA node of
    //! `device` when `preferGpuNumaNode`, pins the first chunk and starts a thread pinning the rest. Throws
    //! OutOfMemoryError when the first chunk cannot be mapped or pinned, CudaError for other CUDA failures.
    PinnedChunks(
        int32_t device, int64_t numHostPages, int64_t hostPageBytes, int64_t chunkBytes, bool preferGpuNumaNode);
    //! Stops the pinning thread, then unpins and unmaps every chunk; never throws.
    ~PinnedChunks() noexcept;
    PinnedChunks(PinnedChunks const&) = delete;
    PinnedChunks& operator=(PinnedChunks const&) = delete;

    //! Stops the pinning thread after the chunk it is pinning and waits for it; never throws. Idempotent.
    void stopPinning() noexcept;
    //! Returns the host pages pinned now; any thread may call it.
    int64_t numPinned() const noexcept
    {
        return mNumPinned.load(std::memory_order_acquire);
    }
    //! Returns the host pages planned.
    int64_t numHostPages() const noexcept
    {
        return mNumHostPages;
    }
    //! Blocks until every chunk is pinned or pinning stopped; rethrows what stopped it. Any thread may call it.
    void waitUntilReady() const;
    //! Returns the host pages of one chunk.
    int64_t hostPagesPerChunk() const noexcept
    {
        return mHostPagesPerChunk;
    }
    //! Returns the NUMA node the memory was bound to, or -1.
    int32_t numaNode() const noexcept
    {
        return mNumaNode;
    }
    //! Returns the host address of a pinned host page (unchecked).
    char* hostAddress(int64_t hostPage) const noexcept;
    //! Returns the number of chunks planned.
    size_t numChunks() const noexcept
    {
        return mChunks.size();
    }
    //! Returns the device address of chunk `chunk` when it holds host pages below `numPinnedNow`, nullptr otherwise.
    char* chunkDeviceAddress(size_t chunk, int64_t numPinnedNow) const noexcept;

private:
    struct Chunk
    {
        MappedMemory memory;
        RegisteredHostMemory registration; //!< declared after `memory`: unregistered before it is unmapped
        int64_t bytes = 0;
    };

    void pinChunk(size_t index);
    void pinRemaining() noexcept;

    int32_t mDevice = 0;
    int32_t mNumaNode = -1;
    int64_t mNumHostPages = 0;
    int64_t mHostPageBytes = 0;
    int64_t mHostPagesPerChunk = 0;
    std::vector<Chunk> mChunks{}; //!< sized once; entry i is written before numPinned() covers its host pages
    std::atomic<int64_t> mNumPinned{0};
    std::atomic<bool> mStop{false};
    mutable std::mutex mReadyMutex{};
    mutable std::condition_variable mReady{};
    bool mPinningDone = false;
    std::exception_ptr mPinningError{};
    std::thread mPinner{};
};

} // namespace kvcache::rt::detail
