#include "host_tier_harness.h"

#include "event_timing.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/layer_ref.h"
#include "kvcache/memory/page_ops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>

#include "support/config_builder.h"
#include "support/page_segments.h"

namespace kvcache::bench
{
namespace
{

int32_t gReps = 20;

//! Written over host pages before an offload, so that an offload that moves nothing cannot pass.
constexpr int kHOST_POISON_BYTE = 0xAB;
//! What pages are reset to before an onboard (data and scales), so that an onboard that moves nothing cannot pass.
constexpr uint32_t kDEVICE_POISON_PATTERN = 0x00C0FFEEU;
//! Threads and blocks of the fill: a grid-stride loop, so any size fits.
constexpr int32_t kFILL_THREADS = 256;
constexpr int32_t kFILL_BLOCKS = 1024;

__global__ void spinKernel(long long cycles)
{
    long long const start = clock64();
    while (clock64() - start < cycles)
    {
    }
}

//! Returns the 8 bytes at word `word` of a buffer filled with `salt` (splitmix64's finaliser).
__host__ __device__ uint64_t hashedWord(uint64_t salt, int64_t word)
{
    uint64_t z = salt * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(word) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

__global__ void fillHashedKernel(uint8_t* bytes, int64_t count, uint64_t salt)
{
    int64_t const stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride)
    {
        bytes[i] = static_cast<uint8_t>(hashedWord(salt, i >> 3) >> (8 * (i & 7)));
    }
}

//! The salt of layer `layer`'s data pool (K and V: one allocation) or scale pool.
uint64_t saltOf(int32_t layer, bool scales)
{
    return 2 * static_cast<uint64_t>(layer) + (scales ? 2 : 1);
}

bool isScalePart(test::SegmentPart part)
{
    return part == test::SegmentPart::kKScales || part == test::SegmentPart::kVScales;
}

//! Returns the bytes fillHashed wrote to `segment`: where it lies in its layer's data or scale pool says which.
std::vector<uint8_t> hashedBytes(rt::KVCacheManager const& cache, test::PageSegment const& segment)
{
    rt::LayerRef const ref = cache.layerRef(segment.layer);
    bool const scales = isScalePart(segment.part);
    auto const* const base = static_cast<char const*>(scales ? ref.kScalePool : ref.kPool);
    int64_t const offset = segment.address - base;
    uint64_t const salt = saltOf(segment.layer, scales);
    std::vector<uint8_t> bytes(static_cast<size_t>(segment.bytes));
    uint64_t word = 0;
    for (int64_t i = 0; i < segment.bytes; ++i)
    {
        // One hash a word, not a byte: the check hashes every byte it compares, hundreds of MiB a format.
        int64_t const at = offset + i;
        if (i == 0 || (at & 7) == 0)
        {
            word = hashedWord(salt, at >> 3);
        }
        bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(word >> (8 * (at & 7)));
    }
    return bytes;
}

//! Throws unless `actual` (one host page's bytes) holds page `page`'s segments end to end as fillHashed wrote them;
//! `where` starts the message.
void expectPage(
    rt::KVCacheManager const& cache, int32_t group, int32_t page, uint8_t const* actual, std::string const& where)
{
    int64_t offset = 0;
    for (test::PageSegment const& segment : test::pageSegments(cache, group, page))
    {
        std::vector<uint8_t> const expected = hashedBytes(cache, segment);
        if (std::memcmp(actual + offset, expected.data(), expected.size()) != 0)
        {
            throw std::runtime_error("check failed: " + where + ": layer " + std::to_string(segment.layer) + ", "
                + test::segmentPartName(segment.part) + " holds the wrong bytes");
        }
        offset += segment.bytes;
    }
}

} // namespace

void setRepetitions(int32_t reps)
{
    gReps = std::max(1, reps);
}

int32_t repetitions()
{
    return gReps;
}

void enqueueSpin(cudaStream_t stream, long long cycles)
{
    spinKernel<<<1, 1, 0, stream>>>(cycles);
    KVCACHE_CUDA_TRY(cudaGetLastError());
}

namespace
{

//! Seconds of one `enqueue` on `stream` between `start` and `stop`, after a spin that keeps the GPU busy while the host
//! enqueues.
double timeOnce(cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop, std::function<void()> const& enqueue)
{
    enqueueSpin(stream, kSPIN_CYCLES);
    return eventSeconds(stream, start, stop, enqueue);
}

} // namespace

double medianSeconds(cudaStream_t stream, std::function<void()> const& enqueue)
{
    test::CudaEvent const start(cudaEventDefault);
    test::CudaEvent const stop(cudaEventDefault);
    std::vector<double> times;
    for (int32_t r = 0; r < gReps + 2; ++r)
    {
        double const seconds = timeOnce(stream, start.get(), stop.get(), enqueue);
        if (r >= 2)
        {
            times.push_back(seconds);
        }
    }
    return median(times);
}

std::array<double, 2> medianTurns(
    cudaStream_t stream, std::function<void()> const& first, std::function<void()> const& second)
{
    test::CudaEvent const start(cudaEventDefault);
    test::CudaEvent const stop(cudaEventDefault);
    std::array<std::vector<double>, 2> times;
    for (int32_t r = 0; r < gReps + 2; ++r)
    {
        double const a = timeOnce(stream, start.get(), stop.get(), first);
        double const b = timeOnce(stream, start.get(), stop.get(), second);
        if (r >= 2)
        {
            times[0].push_back(a);
            times[1].push_back(b);
        }
    }
    return {median(times[0]), median(times[1])};
}

rt::KVCacheConfig tierConfig(rt::DataType type, rt::KVQuantization quantization)
{
    return test::ConfigBuilder(std::vector<rt::KVLayerConfig>(kLAYERS, {8, 128}))
        .maxBatchSize(1)
        .maxSequenceLength(kPAGES * kTIER_TOKENS_PER_PAGE)
        .tokensPerPage(kTIER_TOKENS_PER_PAGE)
        .dataType(type)
        .quantization(quantization)
        .build();
}

std::vector<rt::HostTierEntry> scatteredEntries(int32_t count, uint32_t seed)
{
    std::mt19937 generator(seed);
    std::vector<int32_t> pages(kPAGES);
    std::vector<int32_t> hostPages(kHOST_PAGES);
    std::iota(pages.begin(), pages.end(), 0);
    std::iota(hostPages.begin(), hostPages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), generator);
    std::shuffle(hostPages.begin(), hostPages.end(), generator);
    std::vector<rt::HostTierEntry> entries;
    for (int32_t i = 0; i < count; ++i)
    {
        entries.push_back({pages[static_cast<size_t>(i)], hostPages[static_cast<size_t>(i)]});
    }
    return entries;
}

char const* methodName(rt::HostTierMethod method)
{
    switch (method)
    {
    case rt::HostTierMethod::kKERNEL: return "kernel";
    case rt::HostTierMethod::kCOPY_ENGINE: return "copy_engine";
    case rt::HostTierMethod::kAUTO: return "auto";
    }
    return "unknown";
}

ContiguousBuffers::ContiguousBuffers(int64_t hostPageBytes)
    : bytes(int64_t{kMAX_COUNT} * hostPageBytes)
    , device(static_cast<size_t>(bytes))
    , pinned(bytes)
{
}

void enqueueContiguous(cudaStream_t stream, ContiguousBuffers& buffers, bool toHost, int64_t bytes)
{
    auto const size = static_cast<size_t>(bytes);
    KVCACHE_CUDA_TRY(toHost
            ? cudaMemcpyAsync(buffers.pinned.data(), buffers.device.get(), size, cudaMemcpyDeviceToHost, stream)
            : cudaMemcpyAsync(buffers.device.get(), buffers.pinned.data(), size, cudaMemcpyHostToDevice, stream));
}

double contiguousSeconds(cudaStream_t stream, ContiguousBuffers& buffers, bool toHost, int64_t bytes)
{
    return medianSeconds(stream, [&] { enqueueContiguous(stream, buffers, toHost, bytes); });
}

std::array<double, 2> measureRates(std::string const& prefix, rt::HostTier& tier, rt::KVCacheManager const& cache,
    std::vector<rt::HostTierEntry> const& entries, bool toHost, ContiguousBuffers& buffers, cudaStream_t stream,
    bool hostEnqueue)
{
    char const* const direction = toHost ? "offload" : "onboard";
    auto const count = static_cast<int32_t>(entries.size());
    auto const bytes = static_cast<double>(int64_t{count} * tier.hostPageBytes());
    auto const transfer = [&](rt::HostTierMethod method)
    {
        if (toHost)
        {
            tier.offload(cache, entries, stream, method);
        }
        else
        {
            tier.onboard(cache, entries, stream, method);
        }
    };
    std::array<double, 2> seconds{};
    for (auto const method : {rt::HostTierMethod::kCOPY_ENGINE, rt::HostTierMethod::kKERNEL})
    {
        // In turns with the contiguous copy, so that the link's drift over a run moves both alike.
        auto const [contiguous, s] = medianTurns(
            stream, [&] { enqueueContiguous(stream, buffers, toHost, static_cast<int64_t>(bytes)); },
            [&] { transfer(method); });
        seconds[method == rt::HostTierMethod::kKERNEL ? 1 : 0] = s;
        if (hostEnqueue)
        {
            std::vector<double> host;
            for (int32_t r = 0; r < gReps; ++r)
            {
                auto const begin = std::chrono::steady_clock::now();
                transfer(method);
                host.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
                KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
            }
            std::sort(host.begin(), host.end());
            std::printf("%shost_enqueue/%s/%s/%d: %.1f us a call\n", prefix.c_str(), direction, methodName(method),
                count, host[host.size() / 2] * 1e6);
        }
        std::printf("%s%s/%s/%d: %.2f GB/s, contiguous %.2f GB/s, ratio %.3f\n", prefix.c_str(), direction,
            methodName(method), count, bytes / s * 1e-9, bytes / contiguous * 1e-9, contiguous / s);
    }
    return seconds;
}

void fillHashed(rt::KVCacheManager const& cache, cudaStream_t stream)
{
    for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
    {
        rt::LayerRef const ref = cache.layerRef(layer);
        rt::KVLayerLayout const& sizes = cache.layout().layers[static_cast<size_t>(layer)];
        fillHashedKernel<<<kFILL_BLOCKS, kFILL_THREADS, 0, stream>>>(
            static_cast<uint8_t*>(ref.kPool), sizes.layerBytes, saltOf(layer, false));
        KVCACHE_CUDA_TRY(cudaGetLastError());
        if (sizes.scaleBytes > 0)
        {
            fillHashedKernel<<<kFILL_BLOCKS, kFILL_THREADS, 0, stream>>>(
                static_cast<uint8_t*>(ref.kScalePool), sizes.scaleBytes, saltOf(layer, true));
            KVCACHE_CUDA_TRY(cudaGetLastError());
        }
    }
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
}

void checkRoundTrip(rt::HostTier& tier, rt::KVCacheManager const& cache, std::vector<rt::HostTierEntry> const& entries,
    rt::HostTierMethod method, ContiguousBuffers& buffers, cudaStream_t stream)
{
    int32_t const group = tier.group();
    int64_t const hostPageBytes = tier.hostPageBytes();
    int64_t segmentBytes = 0;
    for (test::PageSegment const& segment : test::pageSegments(cache, group, 0))
    {
        segmentBytes += segment.bytes;
    }
    // The expected host page is the page's segments end to end: they must be the host page's bytes exactly.
    if (segmentBytes != hostPageBytes)
    {
        throw std::runtime_error("check: a page's segments hold " + std::to_string(segmentBytes)
            + " bytes but a host page " + std::to_string(hostPageBytes));
    }
    if (static_cast<int64_t>(entries.size()) * hostPageBytes > buffers.bytes)
    {
        throw std::runtime_error("check: " + std::to_string(entries.size()) + " pages do not fit the gather buffer's "
            + std::to_string(kMAX_COUNT));
    }
    for (rt::HostTierEntry const& entry : entries)
    {
        std::memset(tier.hostPageData(entry.hostPage), kHOST_POISON_BYTE, static_cast<size_t>(hostPageBytes));
    }
    tier.offload(cache, entries, stream, method);
    for (rt::HostTierEntry const& entry : entries)
    {
        expectPage(cache, group, entry.page, static_cast<uint8_t const*>(tier.hostPageData(entry.hostPage)),
            std::string(methodName(method)) + " offload, host page " + std::to_string(entry.hostPage) + " holding page "
                + std::to_string(entry.page));
    }

    std::vector<int32_t> pages;
    for (rt::HostTierEntry const& entry : entries)
    {
        pages.push_back(entry.page);
    }
    rt::PageOpTarget const wholeGroup{0, -1, rt::KVHalf::kBOTH, group};
    rt::resetPages(cache, pages, stream, kDEVICE_POISON_PATTERN, wholeGroup);
    tier.onboard(cache, entries, stream, method);
    auto* const gathered = static_cast<char*>(buffers.pinned.data());
    for (size_t i = 0; i < entries.size(); ++i)
    {
        int64_t offset = static_cast<int64_t>(i) * hostPageBytes;
        for (test::PageSegment const& segment : test::pageSegments(cache, group, entries[i].page))
        {
            KVCACHE_CUDA_TRY(cudaMemcpyAsync(gathered + offset, segment.address, static_cast<size_t>(segment.bytes),
                cudaMemcpyDeviceToHost, stream));
            offset += segment.bytes;
        }
    }
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < entries.size(); ++i)
    {
        expectPage(cache, group, entries[i].page,
            reinterpret_cast<uint8_t const*>(gathered + static_cast<int64_t>(i) * hostPageBytes),
            std::string(methodName(method)) + " onboard, page " + std::to_string(entries[i].page) + " from host page "
                + std::to_string(entries[i].hostPage));
    }
}

} // namespace kvcache::bench
