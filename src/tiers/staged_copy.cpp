#include "tiers/staged_copy.h"

#include "core/scoped_device.h"
#include "tiers/pinned_chunks.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <vector>

namespace kvcache::rt::detail
{
namespace
{

//! Descriptors one cudaMemcpyBatchAsync call takes at most; longer lists take several calls.
constexpr size_t kMAX_BATCH_DESCRIPTORS = 8192;
//! Blocks a multiprocessor for the gather and scatter kernel (device memory only): 1024 threads, whose warps keep 128
//! KiB in flight, which the gather measured to move at about the memory's speed (docs/benchmarks.md).
constexpr int32_t kSTAGING_BLOCKS_PER_SM = 1024 / kHOST_TIER_STAGING_THREADS;

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

int32_t stagingHostPages(int64_t hostPageBytes, int64_t stagingBytes, int64_t numHostPages)
{
    return static_cast<int32_t>(std::clamp<int64_t>(
        stagingBytes / 2 / hostPageBytes, 1, std::min<int64_t>(numHostPages, kMAX_INLINE_PAGE_OPS)));
}

} // namespace

StagedCopy::StagedCopy(
    int64_t hostPageBytes, int64_t stagingBytes, int64_t numHostPages, int32_t device, int32_t multiprocessors)
    : mHostPageBytes(hostPageBytes)
    , mNumStagingHostPages(stagingHostPages(hostPageBytes, stagingBytes, numHostPages))
    , mMultiprocessors(multiprocessors)
{
    int64_t const bytes = 2 * int64_t{mNumStagingHostPages} * hostPageBytes;
    ScopedDevice const scoped(device);
    try
    {
        mStaging = DeviceBuffer(bytes, "HostTier: the staging buffer");
    }
    catch (OutOfMemoryError const&)
    {
        throw OutOfMemoryError(
            fmt::format("HostTier: the staging buffer of {} host pages ({} bytes) does not fit on device {}",
                mNumStagingHostPages, bytes, device));
    }
}

void StagedCopy::enqueue(bool toHost, HostTierKernelParams const& cacheParams, PinnedChunks const& chunks,
    HostTierEntry const* entries, int32_t count, cudaStream_t stream) const
{
    // Scattered pages make descriptors of one layer half each (tens of KiB), which the copy engine moves at half the
    // link's speed; whole host pages (MiB) move at its full speed. So a kernel on the whole GPU gathers the pages into
    // host pages of the staging buffer at HBM speed, or scatters them from it, and the copy engine moves host pages.
    char* const buffer =
        static_cast<char*>(mStaging.data()) + (toHost ? 0 : int64_t{mNumStagingHostPages} * mHostPageBytes);
    // A staging half as a tier of numStagingHostPages() host pages in one chunk: the kernel's addressing serves both.
    HostTierKernelParams staging = cacheParams;
    staging.numHostPages = mNumStagingHostPages;
    staging.hostPagesPerChunk = static_cast<uint32_t>(mNumStagingHostPages);
    std::fill(std::begin(staging.chunks), std::end(staging.chunks), nullptr);
    staging.chunks[0] = buffer;
    int32_t const gatherGrid = mMultiprocessors * kSTAGING_BLOCKS_PER_SM;
    auto const pageBytes = static_cast<size_t>(mHostPageBytes);
    thread_local std::vector<HostTierEntry> staged;
    thread_local std::vector<void*> dsts;
    thread_local std::vector<void const*> srcs;
    thread_local std::vector<size_t> sizes;
    for (int32_t first = 0; first < count; first += mNumStagingHostPages)
    {
        int32_t const n = std::min(mNumStagingHostPages, count - first);
        staged.clear();
        dsts.clear();
        srcs.clear();
        sizes.clear();
        for (int32_t i = 0; i < n; ++i)
        {
            staged.push_back(HostTierEntry{entries[first + i].page, i});
            char* const host = chunks.hostAddress(entries[first + i].hostPage);
            char* const device = buffer + static_cast<size_t>(i) * pageBytes;
            char* const dst = toHost ? host : device;
            char const* const src = toHost ? device : host;
            // Host pages adjacent on both sides and in one pinned chunk make one descriptor (two chunks can lie side
            // by side in the address space, but one descriptor must stay inside one registered range).
            int64_t const chunk = entries[first + i].hostPage / chunks.hostPagesPerChunk();
            bool const sameChunk = i > 0 && entries[first + i - 1].hostPage / chunks.hostPagesPerChunk() == chunk;
            if (!sizes.empty() && sameChunk && static_cast<char*>(dsts.back()) + sizes.back() == dst
                && static_cast<char const*>(srcs.back()) + sizes.back() == src)
            {
                sizes.back() += pageBytes;
                continue;
            }
            dsts.push_back(dst);
            srcs.push_back(src);
            sizes.push_back(pageBytes);
        }
        if (toHost)
        {
            launchStagingKernel(staging, true, staged.data(), n, gatherGrid, stream);
            copyDescriptors(dsts, srcs, sizes, cudaMemcpyDeviceToHost, stream);
        }
        else
        {
            copyDescriptors(dsts, srcs, sizes, cudaMemcpyHostToDevice, stream);
            launchStagingKernel(staging, false, staged.data(), n, gatherGrid, stream);
        }
    }
}

} // namespace kvcache::rt::detail
