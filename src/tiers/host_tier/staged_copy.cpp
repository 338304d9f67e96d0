#include "tiers/host_tier/staged_copy.h"

#include "core/scoped_device.h"
#include "tiers/host_tier/host_pages/pinned_chunks.h"

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
//! A transfer of fewer than kPARTED_FROM host pages moves straight between the pages and the host pages, one descriptor
//! per page half of a layer, when it takes at most this many: up to this many descriptors of a few KiB in one call
//! move as fast as one contiguous copy, and many more move far slower (docs/benchmarks.md).
constexpr int64_t kDIRECT_MAX_DESCRIPTORS = 1024;
//! Blocks a multiprocessor for the gather and scatter kernel (device memory only): 1024 threads, whose warps keep 128
//! KiB in flight, which the gather measured to move at about the memory's speed (docs/benchmarks.md).
constexpr int32_t kSTAGING_BLOCKS_PER_SM = 1024 / kHOST_TIER_STAGING_THREADS;

//! Whether `stream` takes cudaMemcpyBatchAsync, which refuses the legacy default stream.
bool takesBatches(cudaStream_t stream)
{
#if CUDART_VERSION >= 12080
    return stream != nullptr && stream != cudaStreamLegacy;
#else
    static_cast<void>(stream);
    return false;
#endif
}

//! Enqueues the copies dsts[i] <- srcs[i] of sizes[i] bytes on `stream` through the copy engine.
void copyDescriptors(std::vector<void*> const& dsts, std::vector<void const*> const& srcs,
    std::vector<size_t> const& sizes, cudaMemcpyKind kind, cudaStream_t stream)
{
#if CUDART_VERSION >= 12080
    // The legacy default stream gets one cudaMemcpyAsync a descriptor.
    if (takesBatches(stream))
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

//! Each part of a batch holds this many times the host pages of the one before. The kernel gathers or scatters a host
//! page some twenty times as fast as the copy engine moves it over PCIe (docs/benchmarks.md), so the kernel's work on
//! a part eight times as large still ends before the copy of the one before it.
constexpr int32_t kPART_GROWTH = 8;
//! Batches of fewer host pages move in one part: for a few pages an extra copy's start costs as much as the kernel's
//! work it hides, or more (docs/benchmarks.md).
constexpr int32_t kPARTED_FROM = 16;

//! The bounds of a batch of `n` host pages' parts, in the order they are moved: 0 = b[0] < ... < b[P] = n, parts of 1,
//! kPART_GROWTH, kPART_GROWTH^2... host pages, the last what is left (one part below kPARTED_FROM); an onboard's in
//! reverse (the largest first), since its last part's scatter is the one nothing overlaps.
void partBounds(int32_t n, bool toHost, std::vector<int32_t>& bounds)
{
    bounds.assign(1, 0);
    for (int32_t size = n < kPARTED_FROM ? n : 1; bounds.back() < n; size *= kPART_GROWTH)
    {
        bounds.push_back(bounds.back() + std::min(size, n - bounds.back()));
    }
    if (!toHost)
    {
        std::reverse(bounds.begin(), bounds.end());
        for (int32_t& bound : bounds)
        {
            bound = n - bound;
        }
    }
}

void waitFor(cudaStream_t stream, CudaEvent const& event)
{
    KVCACHE_CUDA_TRY(cudaStreamWaitEvent(stream, event.get(), 0));
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
    mSide = CudaStream();
    std::vector<int32_t> bounds;
    partBounds(mNumStagingHostPages, true, bounds);
    for (size_t part = 1; part < bounds.size(); ++part)
    {
        mParts.emplace_back();
    }
}

bool StagedCopy::movesDirect(int32_t count, int64_t pageHalves, cudaStream_t stream)
{
    // From kPARTED_FROM host pages a staged transfer moves in parts, which hide its kernel's work; below, a staged
    // transfer's gather or scatter and its hand-over to or from the copy engine add to the copy, which a direct one
    // does not have.
    return takesBatches(stream) && count < kPARTED_FROM && int64_t{count} * pageHalves <= kDIRECT_MAX_DESCRIPTORS;
}

void StagedCopy::enqueueDirect(bool toHost, std::vector<LayerTableEntry> const& table, PageAnatomy const& anatomy,
    int32_t numPages, PinnedChunks const& chunks, HostTierEntry const* entries, int32_t count, cudaStream_t stream)
{
    thread_local std::vector<void*> dsts;
    thread_local std::vector<void const*> srcs;
    thread_local std::vector<size_t> sizes;
    dsts.clear();
    srcs.clear();
    sizes.clear();
    for (int32_t i = 0; i < count; ++i)
    {
        char* const hostPage = chunks.hostAddress(entries[i].hostPage);
        for (size_t e = 0; e < table.size(); ++e)
        {
            int64_t const pageBytes = table[e].pageBytes();
            for (int32_t half = 0; half <= int32_t{table[e].hasV()}; ++half)
            {
                // A page half's place in the cache, as the kernels find it (LayerTableEntry), and in the host page.
                char* const device = table[e].halfAddress(half, numPages, entries[i].page);
                char* const host = hostPage + anatomy.entries[e].offset + half * pageBytes;
                dsts.push_back(toHost ? host : device);
                srcs.push_back(toHost ? device : host);
                sizes.push_back(static_cast<size_t>(pageBytes));
            }
        }
    }
    copyDescriptors(dsts, srcs, sizes, toHost ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream);
}

void StagedCopy::enqueue(bool toHost, HostTierKernelParams const& cacheParams, PinnedChunks const& chunks,
    HostTierEntry const* entries, int32_t count, cudaStream_t stream)
{
    // Scattered pages make descriptors of one layer half each (KiB), which the copy engine moves at a fraction of the
    // link's speed once a call holds thousands of them (8192: a fifth); whole host pages (MiB) move at its full speed.
    // So a kernel on the whole GPU gathers the pages into host pages of the staging buffer at HBM speed, or scatters
    // them from it, and the copy engine moves host pages.
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
    cudaStream_t const side = mSide.get();
    thread_local std::vector<HostTierEntry> staged;
    thread_local std::vector<int32_t> bounds;
    thread_local std::vector<void*> dsts;
    thread_local std::vector<void const*> srcs;
    thread_local std::vector<size_t> sizes;
    for (int32_t first = 0; first < count; first += mNumStagingHostPages)
    {
        int32_t const n = std::min(mNumStagingHostPages, count - first);
        staged.clear();
        for (int32_t i = 0; i < n; ++i)
        {
            staged.push_back(HostTierEntry{entries[first + i].page, i});
        }
        partBounds(n, toHost, bounds);
        auto const parts = static_cast<int32_t>(bounds.size()) - 1;
        auto const kernel = [&](int32_t part, cudaStream_t on)
        {
            launchStagingKernel(
                staging, toHost, staged.data() + bounds[part], bounds[part + 1] - bounds[part], gatherGrid, on);
        };
        auto const copy = [&](int32_t part)
        {
            dsts.clear();
            srcs.clear();
            sizes.clear();
            for (int32_t i = bounds[part]; i < bounds[part + 1]; ++i)
            {
                char* const host = chunks.hostAddress(entries[first + i].hostPage);
                char* const device = buffer + static_cast<size_t>(i) * pageBytes;
                char* const dst = toHost ? host : device;
                char const* const src = toHost ? device : host;
                // Host pages adjacent on both sides and in one pinned chunk make one descriptor (two chunks can lie
                // side by side in the address space, but one descriptor must stay inside one registered range).
                int64_t const chunk = entries[first + i].hostPage / chunks.hostPagesPerChunk();
                bool const sameChunk =
                    i > bounds[part] && entries[first + i - 1].hostPage / chunks.hostPagesPerChunk() == chunk;
                if (sameChunk && static_cast<char*>(dsts.back()) + sizes.back() == dst
                    && static_cast<char const*>(srcs.back()) + sizes.back() == src)
                {
                    sizes.back() += pageBytes;
                    continue;
                }
                dsts.push_back(dst);
                srcs.push_back(src);
                sizes.push_back(pageBytes);
            }
            copyDescriptors(dsts, srcs, sizes, toHost ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream);
        };
        if (toHost)
        {
            // The first part's gather on `stream`, the others' on the side stream after it (and so after everything
            // `stream` held before); each copy waits for its own part's gather only.
            kernel(0, stream);
            if (parts > 1)
            {
                mParts[0].record(stream);
                waitFor(side, mParts[0]);
                for (int32_t part = 1; part < parts; ++part)
                {
                    kernel(part, side);
                    mParts[static_cast<size_t>(part)].record(side);
                }
            }
            for (int32_t part = 0; part < parts; ++part)
            {
                if (part > 0)
                {
                    waitFor(stream, mParts[static_cast<size_t>(part)]);
                }
                copy(part);
            }
        }
        else
        {
            // Each part's scatter but the last on the side stream once its copy is done, while the next copies;
            // `stream` waits for all of them before the last.
            for (int32_t part = 0; part + 1 < parts; ++part)
            {
                copy(part);
                mParts[static_cast<size_t>(part)].record(stream);
                waitFor(side, mParts[static_cast<size_t>(part)]);
                kernel(part, side);
            }
            copy(parts - 1);
            if (parts > 1)
            {
                mParts[static_cast<size_t>(parts - 1)].record(side);
                waitFor(stream, mParts[static_cast<size_t>(parts - 1)]);
            }
            kernel(parts - 1, stream);
        }
    }
}

} // namespace kvcache::rt::detail
