#include "kvcache/dist/page_transfer.h"

#include "core/layout/page_anatomy.h"
#include "core/layout/scale_support.h"
#include "core/scoped_device.h"
#include "device/page_mover.cuh"
#include "dist/transfer_header.h"
#include "memory/cache/layer_table.h"
#include "memory/page_ops/page_list_validation.h"

#include "kvcache/core/device_allocation.h"
#include "kvcache/core/errors.h"
#include "kvcache/core/page_geometry.h"

#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace kvcache::rt
{
namespace
{

using detail::TransferHeader;

constexpr int32_t kMAX_LAYER_HALVES_PER_LAUNCH = 65535;

//! One layer half, of data or of scales, as the pack kernels address it.
struct HalfRef
{
    char* pool;
    int64_t pageBytes;
    int64_t stagingOffset; //!< where this half's pages start in the staging buffer
};

//! One stretch of pages whose ids go up by one on both sides.
struct Run
{
    int32_t sendFirst;
    int32_t receiveFirst;
    int32_t length;
};

//! How long a failed call waits, after aborting the communicator, for the NCCL kernels it queued to end.
constexpr auto kABORT_DRAIN_TIME = std::chrono::seconds(5);
constexpr auto kPOLL_INTERVAL = std::chrono::microseconds(50);

//! Aborts `comm` (ncclCommAbort blocks, whatever the communicator's blocking setting, and frees it), which makes the
//! NCCL kernels queued on `stream` return, then waits up to kABORT_DRAIN_TIME for the stream to drain, polling, never
//! synchronizing: a kernel that the abort did not end must not hang the caller. Returns whether the stream drained.
bool abortAndDrain(ncclComm_t comm, cudaStream_t stream) noexcept
{
    ncclCommAbort(comm);
    auto const until = std::chrono::steady_clock::now() + kABORT_DRAIN_TIME;
    for (;;)
    {
        cudaError_t const status = cudaStreamQuery(stream);
        if (status != cudaErrorNotReady)
        {
            // A sticky error leaves the stream unusable; report it as not drained.
            return status == cudaSuccess;
        }
        if (std::chrono::steady_clock::now() > until)
        {
            return false;
        }
        std::this_thread::sleep_for(kPOLL_INTERVAL);
    }
}

//! Aborts `comm`, drains `stream` (abortAndDrain) and throws TransferError `failure` with `message` and what became of
//! the stream.
[[noreturn]] void abortAndThrow(
    ncclComm_t comm, cudaStream_t stream, TransferFailure failure, std::string const& message)
{
    bool const drained = abortAndDrain(comm, stream);
    throw TransferError(failure,
        fmt::format("{}; the communicator was aborted and the pages are not valid; {}", message,
            drained ? "the stream has drained"
                    : fmt::format("the stream still had work {} s after the abort: abandon it (do not synchronize it)",
                        std::chrono::duration_cast<std::chrono::seconds>(kABORT_DRAIN_TIME).count())),
        drained);
}

void ncclCheck(ncclResult_t result, char const* call, ncclComm_t comm, cudaStream_t stream)
{
    if (result == ncclSuccess || result == ncclInProgress)
    {
        return;
    }
    abortAndThrow(comm, stream, TransferFailure::kCOMMUNICATION,
        fmt::format("{} failed: {} ({})", call, ncclGetErrorString(result), static_cast<int>(result)));
}

//! Waits until the work queued on `stream` is done, polling the stream and NCCL for errors, never blocking: the peer
//! may never post, and then the NCCL kernel on the stream never ends. Aborts `comm` on an error or past the deadline.
//! `what` names the step for the message.
void waitForStream(cudaStream_t stream, ncclComm_t comm, std::chrono::steady_clock::time_point deadline,
    int64_t timeoutMs, char const* what)
{
    for (;;)
    {
        cudaError_t const status = cudaStreamQuery(stream);
        if (status == cudaSuccess)
        {
            return;
        }
        if (status != cudaErrorNotReady)
        {
            abortAndThrow(comm, stream, TransferFailure::kCOMMUNICATION,
                fmt::format(
                    "{}: cudaStreamQuery failed: {} ({})", what, cudaGetErrorString(status), static_cast<int>(status)));
        }
        ncclResult_t asyncError = ncclSuccess;
        ncclCheck(ncclCommGetAsyncError(comm, &asyncError), "ncclCommGetAsyncError", comm, stream);
        ncclCheck(asyncError, what, comm, stream);
        if (std::chrono::steady_clock::now() > deadline)
        {
            abortAndThrow(comm, stream, TransferFailure::kTIMEOUT,
                fmt::format("{}: the peer did not finish within TransferOptions.timeoutMs = {} ms", what, timeoutMs));
        }
        std::this_thread::sleep_for(kPOLL_INTERVAL);
    }
}

//! Waits for the operations queued on `stream` (waitForStream), then copies `bytes` from `device` to the pageable
//! `host`. The order matters: a copy into pageable memory returns only once it is done, so queued behind an NCCL
//! receive whose peer never posts it would block the host for ever, before any timeout could fire.
void downloadAfter(void* host, void const* device, size_t bytes, cudaStream_t stream, ncclComm_t comm,
    std::chrono::steady_clock::time_point deadline, int64_t timeoutMs, char const* what)
{
    waitForStream(stream, comm, deadline, timeoutMs, what);
    KVCACHE_CUDA_TRY(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream));
    waitForStream(stream, comm, deadline, timeoutMs, what);
}

//! Ends an NCCL group; a non-blocking communicator may still be enqueuing, so poll it out of ncclInProgress.
void endGroup(ncclComm_t comm, cudaStream_t stream, std::chrono::steady_clock::time_point deadline, int64_t timeoutMs,
    char const* what)
{
    ncclResult_t result = ncclGroupEnd();
    ncclCheck(result, what, comm, stream);
    while (result == ncclInProgress)
    {
        ncclCheck(ncclCommGetAsyncError(comm, &result), "ncclCommGetAsyncError", comm, stream);
        ncclCheck(result, what, comm, stream);
        if (result != ncclInProgress)
        {
            return;
        }
        if (std::chrono::steady_clock::now() > deadline)
        {
            abortAndThrow(comm, stream, TransferFailure::kTIMEOUT,
                fmt::format("{}: NCCL did not enqueue within TransferOptions.timeoutMs = {} ms", what, timeoutMs));
        }
        std::this_thread::sleep_for(kPOLL_INTERVAL);
    }
}

//! Device scratch of one call, stream-ordered (a DeviceAllocation): freed on the stream whatever happens.
class Scratch
{
public:
    Scratch(int64_t bytes, cudaStream_t stream)
        : mAllocation(bytes > 0 ? DeviceAllocation(bytes, stream) : DeviceAllocation())
    {
    }
    char* data() const noexcept
    {
        return static_cast<char*>(mAllocation.data());
    }

private:
    DeviceAllocation mAllocation;
};

//! Copies whole pages between the pools and the staging buffer: blockIdx.x walks list entries, blockIdx.y layer
//! halves. Staging holds, half after half, the listed pages in list order.
template <bool kPACK, typename Word>
__global__ void packPagesKernel(HalfRef const* halves, int32_t const* pages, int32_t count, char* staging)
{
    HalfRef const half = halves[blockIdx.y];
    for (int32_t entry = static_cast<int32_t>(blockIdx.x); entry < count; entry += static_cast<int32_t>(gridDim.x))
    {
        auto* const pool = reinterpret_cast<Word*>(half.pool + int64_t{pages[entry]} * half.pageBytes);
        auto* const packed = reinterpret_cast<Word*>(staging + half.stagingOffset + int64_t{entry} * half.pageBytes);
        int64_t const words = half.pageBytes / static_cast<int64_t>(sizeof(Word));
        if constexpr (kPACK)
        {
            detail::moveWords<detail::PlainAccess>(pool, packed, threadIdx.x, words, blockDim.x);
        }
        else
        {
            detail::moveWords<detail::PlainAccess>(packed, pool, threadIdx.x, words, blockDim.x);
        }
    }
}

//! Packs (kPACK) or unpacks halves [begin, end) of `halves` (`deviceHalves` on the device). Called once for the data
//! halves and once for the scale halves, as copyPages launches twice: each range takes the 16-byte path on its own
//! alignment, so that scale pages whose size is no multiple of 16 (2 tokens a page of one head: 8 bytes of per
//! token-head scales) do not send the data pages down the byte path too.
template <bool kPACK>
void launchPack(std::vector<HalfRef> const& halves, size_t begin, size_t end, HalfRef const* deviceHalves,
    int32_t const* devicePages, int32_t count, char* staging, cudaStream_t stream)
{
    bool aligned = true;
    for (size_t h = begin; h < end; ++h)
    {
        HalfRef const& half = halves[h];
        aligned = aligned && half.pageBytes % 16 == 0 && half.stagingOffset % 16 == 0
            && reinterpret_cast<uintptr_t>(half.pool) % 16 == 0;
    }
    // NCCL's own runtime calls can fail by design (it probes kernels with cudaFuncGetAttributes) and leave their
    // error as the thread's last one; clear it so the check after each launch sees only the launch's own. An error
    // that poisons the context would come back from the launch itself.
    static_cast<void>(cudaGetLastError());
    for (size_t first = begin; first < end; first += kMAX_LAYER_HALVES_PER_LAUNCH)
    {
        auto const numHalves = static_cast<unsigned>(std::min<size_t>(end - first, kMAX_LAYER_HALVES_PER_LAUNCH));
        dim3 const grid(static_cast<unsigned>(std::min(count, 65535)), numHalves);
        if (aligned)
        {
            packPagesKernel<kPACK, uint4><<<grid, 256, 0, stream>>>(deviceHalves + first, devicePages, count, staging);
        }
        else
        {
            packPagesKernel<kPACK, unsigned char>
                <<<grid, 256, 0, stream>>>(deviceHalves + first, devicePages, count, staging);
        }
        KVCACHE_CUDA_TRY(cudaGetLastError());
    }
}

enum class Side
{
    kSEND,
    kRECEIVE,
};

void checkArguments(char const* what, KVCacheManager const& cache, int32_t group, int32_t const* pageIds, int32_t count,
    int32_t peer, ncclComm_t comm, cudaStream_t stream, TransferOptions const& options)
{
    if (group < 0 || group >= cache.numGroups())
    {
        throw InvalidArgumentError(
            fmt::format("{}: group is {}; it must be in [0, numGroups = {})", what, group, cache.numGroups()));
    }
    if (options.timeoutMs <= 0)
    {
        throw InvalidArgumentError(
            fmt::format("{}: TransferOptions.timeoutMs is {}; it must be > 0", what, options.timeoutMs));
    }
    if (options.path != TransferPath::kAUTO && options.path != TransferPath::kDIRECT
        && options.path != TransferPath::kSTAGED)
    {
        throw InvalidArgumentError(fmt::format("{}: TransferOptions.path is {}; it must be kAUTO (0), kDIRECT (1) or "
                                               "kSTAGED (2)",
            what, static_cast<int32_t>(options.path)));
    }
    if (comm == nullptr)
    {
        throw InvalidArgumentError(fmt::format("{}: comm is null; it must be an NCCL communicator", what));
    }
    detail::validateResetList(what, pageIds, count, cache.group(group).numPages);
    int ranks = 0;
    int self = 0;
    ncclCheck(ncclCommCount(comm, &ranks), "ncclCommCount", comm, stream);
    ncclCheck(ncclCommUserRank(comm, &self), "ncclCommUserRank", comm, stream);
    if (peer < 0 || peer >= ranks || peer == self)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: peer is {}; it must be in [0, {}) and not the caller's own rank {}", what, peer, ranks, self));
    }
}

//! Returns the hash of the host-held scales of `cache`'s group `group` (detail::hostScalesHash).
uint64_t groupScalesHash(KVCacheManager const& cache, int32_t group)
{
    std::vector<LayerScales> scales;
    if (detail::keepsHostScales(cache.layout().quantization))
    {
        for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
        {
            scales.push_back(cache.layerScales(layer));
        }
    }
    return detail::hostScalesHash(cache.layout(), group, scales);
}

std::vector<Run> findRuns(std::vector<int32_t> const& send, std::vector<int32_t> const& receive)
{
    std::vector<Run> runs;
    for (size_t i = 0; i < send.size(); ++i)
    {
        if (!runs.empty() && send[i] == send[i - 1] + 1 && receive[i] == receive[i - 1] + 1)
        {
            ++runs.back().length;
        }
        else
        {
            runs.push_back({send[i], receive[i], 1});
        }
    }
    return runs;
}

void transferPages(Side side, KVCacheManager const& cache, int32_t group, int32_t const* pageIds, int32_t count,
    int32_t peer, ncclComm_t comm, cudaStream_t stream, TransferOptions const& options)
{
    char const* const what = side == Side::kSEND ? "sendPages" : "receivePages";
    checkArguments(what, cache, group, pageIds, count, peer, comm, stream, options);
    detail::ScopedDevice const device(cache.device());
    auto const deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.timeoutMs);

    // A page of the group is its entries' halves in the layer table's order (pageAnatomy): data, then scales. Page ids
    // index scale pages as they index data pages, so both go by the same runs and the same list.
    std::vector<HalfRef> halves;
    size_t dataHalves = 0; // halves before the first scale entry's: the pack kernels take the two ranges apart
    int64_t stagingBytes = 0;
    int32_t const numPages = cache.group(group).numPages;
    detail::PageAnatomy const anatomy = detail::pageAnatomy(cache.layout(), group);
    std::vector<detail::LayerTableEntry> const table = detail::KVCacheManagerInternal::hostLayerTable(cache, group);
    for (size_t e = 0; e < table.size(); ++e)
    {
        for (int32_t half = 0; half <= int32_t{table[e].hasV()}; ++half)
        {
            halves.push_back({table[e].halfAddress(half, numPages, 0), table[e].pageBytes(), stagingBytes});
            stagingBytes += int64_t{count} * table[e].pageBytes();
        }
        dataHalves = anatomy.entries[e].kind == detail::PagePartKind::kDATA ? halves.size() : dataHalves;
    }

    // Scratch: two headers, both page lists, the half table, then the staging buffer (each 256-byte aligned).
    auto const align = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
    int64_t const listBytes = align(int64_t{count} * 4);
    int64_t const headerOffset = 0;
    int64_t const listsOffset = 2 * 256;
    int64_t const halvesOffset = listsOffset + 2 * listBytes;
    int64_t const stagingOffset = halvesOffset + align(static_cast<int64_t>(halves.size() * sizeof(HalfRef)));
    bool const mayStage = options.path != TransferPath::kDIRECT;
    Scratch const scratch(stagingOffset + (mayStage ? stagingBytes : 0), stream);
    char* const headers = scratch.data() + headerOffset;

    TransferHeader const mine{detail::kTRANSFER_HEADER_MAGIC, group,
        pageGeometryFingerprint(pageGeometry(cache.layout(), group)), count,
        static_cast<int32_t>(options.path), groupScalesHash(cache, group),
        static_cast<int32_t>(cache.layout().quantization), 0};
    KVCACHE_CUDA_TRY(cudaMemcpyAsync(headers, &mine, sizeof(mine), cudaMemcpyHostToDevice, stream));
    ncclCheck(ncclGroupStart(), "ncclGroupStart", comm, stream);
    ncclCheck(
        ncclSend(headers, sizeof(TransferHeader), ncclChar, peer, comm, stream), "ncclSend (header)", comm, stream);
    ncclCheck(ncclRecv(headers + 256, sizeof(TransferHeader), ncclChar, peer, comm, stream), "ncclRecv (header)", comm,
        stream);
    endGroup(comm, stream, deadline, options.timeoutMs, what);
    TransferHeader theirs{};
    downloadAfter(
        &theirs, headers + 256, sizeof(theirs), stream, comm, deadline, options.timeoutMs, "the header exchange");

    std::string const mismatch = detail::headerMismatch(mine, theirs, peer);
    if (!mismatch.empty())
    {
        throw TransferError(
            TransferFailure::kMISMATCH, fmt::format("{}: refused, nothing was sent: {}", what, mismatch));
    }
    if (count == 0)
    {
        return;
    }

    // Both sides compute the same runs from the same two lists, so their operations pair up one to one.
    std::vector<int32_t> const ownList(pageIds, pageIds + count);
    char* const lists = scratch.data() + listsOffset;
    KVCACHE_CUDA_TRY(cudaMemcpyAsync(lists, ownList.data(), size_t(count) * 4, cudaMemcpyHostToDevice, stream));
    std::vector<Run> runs;
    if (options.path != TransferPath::kSTAGED)
    {
        ncclCheck(ncclGroupStart(), "ncclGroupStart", comm, stream);
        ncclCheck(
            ncclSend(lists, size_t(count) * 4, ncclChar, peer, comm, stream), "ncclSend (page list)", comm, stream);
        ncclCheck(ncclRecv(lists + listBytes, size_t(count) * 4, ncclChar, peer, comm, stream), "ncclRecv (page list)",
            comm, stream);
        endGroup(comm, stream, deadline, options.timeoutMs, what);
        std::vector<int32_t> peerList(static_cast<size_t>(count));
        downloadAfter(peerList.data(), lists + listBytes, size_t(count) * 4, stream, comm, deadline, options.timeoutMs,
            "the page list exchange");
        runs = side == Side::kSEND ? findRuns(ownList, peerList) : findRuns(peerList, ownList);
    }
    bool const staged = options.path == TransferPath::kSTAGED
        || (options.path == TransferPath::kAUTO && static_cast<int32_t>(runs.size()) >= kSTAGED_TRANSFER_MIN_RUNS);

    auto* const deviceHalves = reinterpret_cast<HalfRef*>(scratch.data() + halvesOffset);
    char* const staging = scratch.data() + stagingOffset;
    auto const* const devicePages = reinterpret_cast<int32_t const*>(lists);
    if (staged)
    {
        KVCACHE_CUDA_TRY(cudaMemcpyAsync(
            deviceHalves, halves.data(), halves.size() * sizeof(HalfRef), cudaMemcpyHostToDevice, stream));
        if (side == Side::kSEND)
        {
            launchPack<true>(halves, 0, dataHalves, deviceHalves, devicePages, count, staging, stream);
            launchPack<true>(halves, dataHalves, halves.size(), deviceHalves, devicePages, count, staging, stream);
        }
    }
    ncclCheck(ncclGroupStart(), "ncclGroupStart", comm, stream);
    if (staged)
    {
        ncclCheck(side == Side::kSEND
                ? ncclSend(staging, static_cast<size_t>(stagingBytes), ncclChar, peer, comm, stream)
                : ncclRecv(staging, static_cast<size_t>(stagingBytes), ncclChar, peer, comm, stream),
            side == Side::kSEND ? "ncclSend (pages)" : "ncclRecv (pages)", comm, stream);
    }
    else
    {
        for (HalfRef const& half : halves)
        {
            for (Run const& run : runs)
            {
                int32_t const first = side == Side::kSEND ? run.sendFirst : run.receiveFirst;
                char* const start = half.pool + int64_t{first} * half.pageBytes;
                auto const bytes = static_cast<size_t>(int64_t{run.length} * half.pageBytes);
                ncclCheck(side == Side::kSEND ? ncclSend(start, bytes, ncclChar, peer, comm, stream)
                                              : ncclRecv(start, bytes, ncclChar, peer, comm, stream),
                    side == Side::kSEND ? "ncclSend (pages)" : "ncclRecv (pages)", comm, stream);
            }
        }
    }
    endGroup(comm, stream, deadline, options.timeoutMs, what);
    if (staged && side == Side::kRECEIVE)
    {
        launchPack<false>(halves, 0, dataHalves, deviceHalves, devicePages, count, staging, stream);
        launchPack<false>(halves, dataHalves, halves.size(), deviceHalves, devicePages, count, staging, stream);
    }
    waitForStream(stream, comm, deadline, options.timeoutMs, side == Side::kSEND ? "sendPages" : "receivePages");
}

} // namespace

void sendPages(KVCacheManager const& cache, int32_t group, int32_t const* pageIds, int32_t count, int32_t peer,
    ncclComm_t comm, cudaStream_t stream, TransferOptions const& options)
{
    transferPages(Side::kSEND, cache, group, pageIds, count, peer, comm, stream, options);
}

void receivePages(KVCacheManager const& cache, int32_t group, int32_t const* pageIds, int32_t count, int32_t peer,
    ncclComm_t comm, cudaStream_t stream, TransferOptions const& options)
{
    transferPages(Side::kRECEIVE, cache, group, pageIds, count, peer, comm, stream, options);
}

} // namespace kvcache::rt
