// Chunked pinning of a host tier's memory: mmap, NUMA placement through mbind, cudaHostRegister, a background thread.

#include "tiers/host_tier/host_pages/pinned_chunks.h"

#include "core/scoped_device.h"

#include "kvcache/core/errors.h"
#include "kvcache/tiers/host_tier.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

namespace kvcache::rt::detail
{
namespace
{

//! Huge-page size: chunks are rounded to it so transparent huge pages can back them, which makes pinning faster.
constexpr int64_t kHUGE_PAGE_BYTES = int64_t{2} << 20;
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

} // namespace

namespace
{

HostMemory mapAnonymous(int64_t bytes, std::string const& what)
{
    void* const address =
        ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (address == MAP_FAILED)
    {
        throw OutOfMemoryError(fmt::format("{}: mapping {} bytes failed: {}", what, bytes, std::strerror(errno)));
    }
    return HostMemory{address, bytes};
}

} // namespace

void unmapMemory(HostMemory const& memory) noexcept
{
    ::munmap(memory.data, static_cast<size_t>(memory.bytes));
}

MappedMemory::MappedMemory(int64_t bytes, std::string const& what)
    : UniqueResource(mapAnonymous(bytes, what))
{
}

PinnedChunks::PinnedChunks(
    int32_t device, int64_t numHostPages, int64_t hostPageBytes, int64_t chunkBytes, bool preferGpuNumaNode)
    : mDevice(device)
    , mNumHostPages(numHostPages)
    , mHostPageBytes(hostPageBytes)
{
    int64_t const fewestPerChunk = (numHostPages + kHOST_TIER_MAX_CHUNKS - 1) / kHOST_TIER_MAX_CHUNKS;
    mHostPagesPerChunk =
        std::min(numHostPages, std::max(std::max<int64_t>(1, chunkBytes / hostPageBytes), fewestPerChunk));
    int64_t const numChunks = (numHostPages + mHostPagesPerChunk - 1) / mHostPagesPerChunk;
    mChunks.resize(static_cast<size_t>(numChunks));
    for (int64_t c = 0; c < numChunks; ++c)
    {
        int64_t const bytes = std::min(mHostPagesPerChunk, numHostPages - c * mHostPagesPerChunk) * hostPageBytes;
        mChunks[static_cast<size_t>(c)].bytes = (bytes + kHUGE_PAGE_BYTES - 1) / kHUGE_PAGE_BYTES * kHUGE_PAGE_BYTES;
    }
    ScopedDevice const scoped(mDevice);
    if (preferGpuNumaNode)
    {
        mNumaNode = gpuNumaNode(mDevice);
    }
    pinChunk(0);
    mNumPinned.store(mHostPagesPerChunk, std::memory_order_release);
    if (numChunks == 1)
    {
        mPinningDone = true;
    }
    else
    {
        mPinner = std::thread([this] { pinRemaining(); });
    }
}

PinnedChunks::~PinnedChunks() noexcept
{
    stopPinning();
    ScopedDevice const scoped(mDevice);
    mChunks.clear();
}

void PinnedChunks::stopPinning() noexcept
{
    mStop.store(true, std::memory_order_relaxed);
    if (mPinner.joinable())
    {
        mPinner.join();
    }
}

void PinnedChunks::pinChunk(size_t index)
{
    Chunk& chunk = mChunks[index];
    MappedMemory memory(chunk.bytes, fmt::format("HostTier: chunk {}", index));
    // Advice only: without huge pages pinning is slower, not wrong.
    static_cast<void>(::madvise(memory.data(), static_cast<size_t>(chunk.bytes), MADV_HUGEPAGE));
    if (mNumaNode >= 0 && !preferNode(memory.data(), chunk.bytes, mNumaNode) && index == 0)
    {
        mNumaNode = -1;
    }
    try
    {
        chunk.registration =
            RegisteredHostMemory(memory.data(), chunk.bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
    }
    catch (OutOfMemoryError const& error)
    {
        throw OutOfMemoryError(fmt::format("HostTier: pinning chunk {} of {} bytes failed ({} of {} host pages "
                                           "pinned): {}",
            index, chunk.bytes, static_cast<int64_t>(index) * mHostPagesPerChunk, mNumHostPages, error.what()));
    }
    chunk.memory = std::move(memory);
}

void PinnedChunks::pinRemaining() noexcept
{
    std::exception_ptr error;
    try
    {
        KVCACHE_CUDA_TRY(cudaSetDevice(mDevice));
        for (size_t c = 1; c < mChunks.size() && !mStop.load(std::memory_order_relaxed); ++c)
        {
            pinChunk(c);
            mNumPinned.store(
                std::min(mNumHostPages, static_cast<int64_t>(c + 1) * mHostPagesPerChunk), std::memory_order_release);
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

void PinnedChunks::waitUntilReady() const
{
    std::unique_lock<std::mutex> lock(mReadyMutex);
    mReady.wait(lock, [this] { return mPinningDone; });
    if (mPinningError)
    {
        std::rethrow_exception(mPinningError);
    }
}

char* PinnedChunks::hostAddress(int64_t hostPage) const noexcept
{
    int64_t const chunk = hostPage / mHostPagesPerChunk;
    return static_cast<char*>(mChunks[static_cast<size_t>(chunk)].memory.data())
        + (hostPage - chunk * mHostPagesPerChunk) * mHostPageBytes;
}

char* PinnedChunks::chunkDeviceAddress(size_t chunk, int64_t numPinnedNow) const noexcept
{
    return static_cast<int64_t>(chunk) * mHostPagesPerChunk < numPinnedNow
        ? static_cast<char*>(mChunks[chunk].registration.deviceData())
        : nullptr;
}

} // namespace kvcache::rt::detail
