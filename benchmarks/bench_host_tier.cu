// Host tier transfer rates against one contiguous cudaMemcpyAsync of the same bytes, the kernel/copy-engine
// crossover, a device list replayed in a graph, both directions at once, the slowdown of a concurrent compute kernel,
// the time a large tier takes to construct and to pin fully, and the rates of quantized caches. Geometry: 32 layers,
// 8 KV heads x 128 dims, float16, 16 tokens a page, K and V (a host page is 2 MiB). A rate's transfer and its
// contiguous copy are timed in turns, so that the link's drift over a run moves both alike. Prints one line a
// measurement; exits 77 without a GPU, 1 when a check or a CUDA call failed. host_tier_harness.h holds the timing and
// the check.
//
// Quantized caches, last: the same geometry in kFP8_PER_TOKEN_HEAD (FP8 E4M3 data and a float32 scale per page, token
// and head: a host page of 1,081,344 bytes, 32,768 of them scales) and in kNVFP4 (two E2M1 values a byte and one FP8
// E4M3 scale per 16 values: 589,824 bytes, 65,536 of them scales). A host page holds a page's data and scale pages, so
// each row moves both, and its contiguous cudaMemcpyAsync moves pages x hostPageBytes, data and scales. Rows
// `<quantization>/<offload|onboard>/<copy_engine|kernel>/<pages>` for 8, 64 and 256 pages (kAUTO takes the copy
// engine for all of them) print the ratio to that copy, with `<quantization>/host_enqueue/...` at 256 pages. Before
// them, each method passes a round trip of each list once (`<quantization>/check/<method>/<pages>: ok`): every byte of
// the cache hashed (K, V and their scales differ), host pages poisoned, offload, each host page compared with its
// page's data and scale pages in layout order, the pages reset to a poison pattern (scales included), onboard, each
// page's data and scale pages compared again, bit for bit. NVFP4's global scales are per layer, stay in the manager
// and are not in a host page, so no row moves them.
//
// Flags: --tier-gib=N (default 64) sizes the construction run (halved until it fits in half the machine's memory);
// --reps=N (default 20) timed repetitions, the median reported; --quantized-only runs the quantized rows alone,
// --tiered-only the tiered prefix cache's onboard rows alone (tiered_onboard_rows.cu, last in a full run).

#include "host_tier_harness.h"

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/tiers/host_tier.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "support/cuda_raii.h"
#include "support/gpu_availability.h"

namespace kvcache::bench
{
namespace
{

using kvcache::test::CudaEvent;
using kvcache::test::CudaStream;

//! Pages a call of the float16 rows moves.
constexpr int32_t kCOUNTS[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
//! Pages a call of the quantized rows moves: the targets hold from 8 pages on.
constexpr int32_t kQUANTIZED_COUNTS[] = {8, 64, kMAX_COUNT};

//! Median seconds of `compute` on `stream` while `transfers` run on `other`, and the transfers' own median seconds.
//! The transfers start first: a long spin hides the host's enqueueing of both, then `other` is released and a short
//! spin later the compute kernel starts, so it meets transfer blocks already resident, as a forward pass meets a
//! transfer begun between two of its kernels.
std::pair<double, double> sharedSeconds(cudaStream_t stream, cudaStream_t other, std::function<void()> const& transfers,
    std::function<void()> const& compute)
{
    CudaEvent const goEvent;
    CudaEvent const timing[3] = {CudaEvent(cudaEventDefault), CudaEvent(cudaEventDefault), CudaEvent(cudaEventDefault)};
    cudaEvent_t const go = goEvent.get();
    cudaEvent_t const start = timing[0].get();
    cudaEvent_t const stop = timing[1].get();
    cudaEvent_t const transfersDone = timing[2].get();
    std::vector<double> times;
    std::vector<double> transferTimes;
    for (int32_t r = 0; r < repetitions() + 2; ++r)
    {
        enqueueSpin(stream, kSPIN_CYCLES * 30);
        KVCACHE_CUDA_TRY(cudaEventRecord(go, stream));
        enqueueSpin(stream, kSPIN_CYCLES / 5);
        KVCACHE_CUDA_TRY(cudaEventRecord(start, stream));
        KVCACHE_CUDA_TRY(cudaStreamWaitEvent(other, go, 0));
        transfers();
        KVCACHE_CUDA_TRY(cudaEventRecord(transfersDone, other));
        compute();
        KVCACHE_CUDA_TRY(cudaEventRecord(stop, stream));
        KVCACHE_CUDA_TRY(cudaEventSynchronize(stop));
        KVCACHE_CUDA_TRY(cudaEventSynchronize(transfersDone));
        float ms = 0;
        float transferMs = 0;
        KVCACHE_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
        KVCACHE_CUDA_TRY(cudaEventElapsedTime(&transferMs, start, transfersDone));
        if (r >= 2)
        {
            times.push_back(ms * 1e-3);
            transferTimes.push_back(transferMs * 1e-3);
        }
    }
    std::sort(times.begin(), times.end());
    std::sort(transferTimes.begin(), transferTimes.end());
    return {times[times.size() / 2], transferTimes[transferTimes.size() / 2]};
}

__global__ void computeKernel(float* out, int32_t iterations)
{
    float a = static_cast<float>(threadIdx.x);
    float b = 1.0001f;
    for (int32_t i = 0; i < iterations; ++i)
    {
        a = a * b + 0.5f;
        b = b * 0.99999f + 0.00001f;
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a;
}

//! The float16 rows: everything but the quantized caches.
void float16Rows(int64_t tierGib)
{
    CudaStream stream;
    CudaStream second;
    rt::KVCacheManager cache(tierConfig(rt::DataType::kHALF, rt::KVQuantization::kNONE), stream.get());
    rt::HostTier tier(cache, 0, kHOST_PAGES);
    tier.waitUntilReady();
    int64_t const hostPageBytes = tier.hostPageBytes();
    std::printf("geometry: %d layers, host page %lld bytes, %d device pages, %d host pages\n", kLAYERS,
        static_cast<long long>(hostPageBytes), kPAGES, kHOST_PAGES);

    // The contiguous baseline: one cudaMemcpyAsync between a device buffer and a pinned buffer of the same size.
    ContiguousBuffers buffers(hostPageBytes);

    int64_t crossoverBytes[2] = {-1, -1};
    for (int32_t d = 0; d < 2; ++d)
    {
        bool const toHost = d == 0;
        char const* direction = toHost ? "offload" : "onboard";
        for (int32_t const count : kCOUNTS)
        {
            int64_t const bytes = count * hostPageBytes;
            auto const entries = scatteredEntries(count, static_cast<uint32_t>(count));
            std::array<double, 2> const seconds =
                measureRates("", tier, cache, entries, toHost, buffers, stream.get(), count == 1 || count == 256);
            if (seconds[1] <= seconds[0])
            {
                crossoverBytes[d] = bytes;
            }
        }
        std::printf("crossover/%s: the kernel is faster up to %lld bytes (%lld pages); kHOST_TIER_KERNEL_MAX_BYTES is "
                    "%lld\n",
            direction, static_cast<long long>(crossoverBytes[d]),
            static_cast<long long>(crossoverBytes[d] / hostPageBytes),
            static_cast<long long>(rt::kHOST_TIER_KERNEL_MAX_BYTES));
    }

    // A device list replayed in a CUDA graph: 256 positions (16 launches), one of them counted or all of them, against
    // the same pages by a host list through the kernel.
    {
        auto const entries = scatteredEntries(256, 5);
        kvcache::test::DeviceArray<rt::HostTierEntry> list(entries, stream.get());
        kvcache::test::DeviceArray<int32_t> count(std::vector<int32_t>{1}, stream.get());
        kvcache::test::CapturedGraph graph(
            stream.get(), [&] { tier.onboardDevice(cache, list.get(), 256, count.get(), stream.get()); });
        for (int32_t const counted : {1, 256})
        {
            count.upload({counted}, stream.get());
            double const replay = medianSeconds(stream.get(), [&] { graph.launch(stream.get()); });
            std::vector<rt::HostTierEntry> const first(entries.begin(), entries.begin() + counted);
            double const hostList = medianSeconds(
                stream.get(), [&] { tier.onboard(cache, first, stream.get(), rt::HostTierMethod::kKERNEL); });
            std::printf("device_list/onboard/capacity 256/count %d: %.1f us a graph replay, host list %.1f us\n",
                counted, replay * 1e6, hostList * 1e6);
        }
    }

    // Both directions at once: disjoint pages and host pages, offload on one stream, onboard on another.
    for (auto const method : {rt::HostTierMethod::kCOPY_ENGINE, rt::HostTierMethod::kKERNEL})
    {
        auto const all = scatteredEntries(256, 99);
        std::vector<rt::HostTierEntry> const out(all.begin(), all.begin() + 128);
        std::vector<rt::HostTierEntry> const in(all.begin() + 128, all.end());
        int64_t const bytes = 128 * hostPageBytes;
        double const alone = medianSeconds(stream.get(), [&] { tier.offload(cache, out, stream.get(), method); });
        double const aloneIn = medianSeconds(stream.get(), [&] { tier.onboard(cache, in, stream.get(), method); });
        CudaEvent const forkEvent;
        CudaEvent const joinEvent;
        cudaEvent_t const fork = forkEvent.get();
        cudaEvent_t const join = joinEvent.get();
        double const both = medianSeconds(stream.get(),
            [&]
            {
                KVCACHE_CUDA_TRY(cudaEventRecord(fork, stream.get()));
                KVCACHE_CUDA_TRY(cudaStreamWaitEvent(second.get(), fork, 0));
                tier.offload(cache, out, stream.get(), method);
                tier.onboard(cache, in, second.get(), method);
                KVCACHE_CUDA_TRY(cudaEventRecord(join, second.get()));
                KVCACHE_CUDA_TRY(cudaStreamWaitEvent(stream.get(), join, 0));
            });
        std::printf("bidirectional/%s/128+128: combined %.2f GB/s; offload alone %.2f GB/s, onboard alone %.2f GB/s\n",
            methodName(method), 2.0 * static_cast<double>(bytes) / both * 1e-9,
            static_cast<double>(bytes) / alone * 1e-9, static_cast<double>(bytes) / aloneIn * 1e-9);
    }

    // A compute kernel alone and with transfers running on another stream for its whole duration, in three shapes:
    // one wave filling every multiprocessor (8 blocks of 256 threads each: the worst case, any block the transfer
    // holds pushes compute blocks into a second wave), 64 such waves of shorter blocks (most kernels), and one
    // block of 1024 threads a multiprocessor (a persistent kernel, as many GEMMs are). The transfers: 256-page
    // onboards by each method, and one-page onboards by kAUTO (which takes the kernel for them) back to back.
    int multiprocessors = 0;
    KVCACHE_CUDA_TRY(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, cache.device()));
    struct ComputeShape
    {
        char const* name;
        int32_t blocks;
        int32_t threads;
        int32_t iterations;
    };
    ComputeShape const shapes[] = {{"one_wave", multiprocessors * 8, 256, 1 << 18},
        {"many_waves", multiprocessors * 8 * 64, 256, 1 << 15}, {"persistent", multiprocessors, 1024, 1 << 18}};
    struct TransferCase
    {
        char const* name;
        int32_t pages;
        rt::HostTierMethod method;
    };
    TransferCase const cases[] = {{"copy_engine/256", 256, rt::HostTierMethod::kCOPY_ENGINE},
        {"kernel/256", 256, rt::HostTierMethod::kKERNEL}, {"auto/1", 1, rt::HostTierMethod::kAUTO}};
    kvcache::test::DeviceArray<float> sink(static_cast<size_t>(multiprocessors) * 8 * 64 * 256);
    for (ComputeShape const& shape : shapes)
    {
        auto const compute = [&]
        {
            computeKernel<<<shape.blocks, shape.threads, 0, stream.get()>>>(sink.get(), shape.iterations);
            KVCACHE_CUDA_TRY(cudaGetLastError());
        };
        double const computeAlone = medianSeconds(stream.get(), compute);
        for (TransferCase const& transfer : cases)
        {
            auto const entries = scatteredEntries(transfer.pages, 7);
            rt::HostTierMethod used = transfer.method;
            double const oneTransfer = medianSeconds(
                second.get(), [&] { used = tier.onboard(cache, entries, second.get(), transfer.method); });
            // Enough transfers to outlast the compute kernel and the spin before it.
            auto const transfers = static_cast<int32_t>((computeAlone + 2e-4) / oneTransfer) + 2;
            auto const [computeShared, transfersShared] = sharedSeconds(
                stream.get(), second.get(),
                [&]
                {
                    for (int32_t t = 0; t < transfers; ++t)
                    {
                        tier.onboard(cache, entries, second.get(), transfer.method);
                    }
                },
                compute);
            std::printf("compute_slowdown/%s/%s: compute alone %.3f ms, beside %d onboards (%s) %.3f ms, slowdown "
                        "%.1f%%; the onboards took %.3f ms (%.3f ms alone)\n",
                shape.name, transfer.name, computeAlone * 1e3, transfers, methodName(used), computeShared * 1e3,
                (computeShared / computeAlone - 1.0) * 100.0, transfersShared * 1e3, transfers * oneTransfer * 1e3);
        }
    }

    buffers.pinned.reset();

    // Construction of a large tier: time to return and time to every host page pinned.
    int64_t const physical = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
    while (tierGib > 1 && (tierGib << 30) > physical / 2)
    {
        tierGib /= 2;
    }
    int64_t const hostPages = (tierGib << 30) / hostPageBytes;
    auto const begin = std::chrono::steady_clock::now();
    {
        rt::HostTier big(cache, 0, hostPages);
        auto const returned = std::chrono::steady_clock::now();
        int64_t const pinnedAtReturn = big.numPinnedHostPages();
        big.waitUntilReady();
        auto const ready = std::chrono::steady_clock::now();
        std::printf("construction/%lld GiB: returned in %.3f s with %lld of %lld host pages; all pinned after %.3f s "
                    "(NUMA node %d)\n",
            static_cast<long long>(tierGib), std::chrono::duration<double>(returned - begin).count(),
            static_cast<long long>(pinnedAtReturn), static_cast<long long>(hostPages),
            std::chrono::duration<double>(ready - begin).count(), big.numaNode());
    }
    std::printf("construction/%lld GiB: destroyed after %.3f s in all\n", static_cast<long long>(tierGib),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
}

//! The quantized rows (see the top of this file): for each format a cache and a tier of the same geometry, each list
//! checked once by each method, then the rates of each list against the contiguous copy of its data and scale bytes.
void quantizedRows()
{
    struct Format
    {
        rt::KVQuantization quantization;
        rt::DataType storage;
    };
    Format const formats[] = {{rt::KVQuantization::kFP8_PER_TOKEN_HEAD, rt::DataType::kFP8_E4M3},
        {rt::KVQuantization::kNVFP4, rt::DataType::kUINT8}};
    for (Format const& format : formats)
    {
        CudaStream stream;
        rt::KVCacheManager cache(tierConfig(format.storage, format.quantization), stream.get());
        rt::HostTier tier(cache, 0, kHOST_PAGES);
        tier.waitUntilReady();
        ContiguousBuffers buffers(tier.hostPageBytes());
        std::string const name(rt::kvQuantizationName(format.quantization));
        int64_t scaleBytes = 0;
        for (int32_t const layer : cache.group(0).layers)
        {
            rt::KVLayerLayout const& sizes = cache.layout().layers[static_cast<size_t>(layer)];
            scaleBytes += sizes.numHalves * sizes.scalePageBytes;
        }
        std::printf("%s/geometry: %d layers, host page %lld bytes (%lld of them scales), %d device pages, %d host "
                    "pages\n",
            name.c_str(), kLAYERS, static_cast<long long>(tier.hostPageBytes()), static_cast<long long>(scaleBytes),
            kPAGES, kHOST_PAGES);

        fillHashed(cache, stream.get());
        for (int32_t const count : kQUANTIZED_COUNTS)
        {
            auto const entries = scatteredEntries(count, static_cast<uint32_t>(count));
            for (auto const method : {rt::HostTierMethod::kCOPY_ENGINE, rt::HostTierMethod::kKERNEL})
            {
                checkRoundTrip(tier, cache, entries, method, buffers, stream.get());
                std::printf("%s/check/%s/%d: ok\n", name.c_str(), methodName(method), count);
            }
        }
        for (bool const toHost : {true, false})
        {
            for (int32_t const count : kQUANTIZED_COUNTS)
            {
                auto const entries = scatteredEntries(count, static_cast<uint32_t>(count));
                measureRates(name + "/", tier, cache, entries, toHost, buffers, stream.get(), count == kMAX_COUNT);
            }
        }
    }
}

} // namespace
} // namespace kvcache::bench

int main(int argc, char** argv)
{
    int64_t tierGib = 64;
    bool quantizedOnly = false;
    bool tieredOnly = false;
    for (int i = 1; i < argc; ++i)
    {
        if (std::strncmp(argv[i], "--tier-gib=", 11) == 0)
        {
            tierGib = std::max<int64_t>(1, std::atoll(argv[i] + 11));
        }
        else if (std::strncmp(argv[i], "--reps=", 7) == 0)
        {
            kvcache::bench::setRepetitions(std::atoi(argv[i] + 7));
        }
        else if (std::strcmp(argv[i], "--quantized-only") == 0)
        {
            quantizedOnly = true;
        }
        else if (std::strcmp(argv[i], "--tiered-only") == 0)
        {
            tieredOnly = true;
        }
        else
        {
            std::fprintf(stderr, "usage: %s [--tier-gib=N] [--reps=N] [--quantized-only | --tiered-only]\n", argv[0]);
            return 2;
        }
    }
    std::string const reason = kvcache::test::gpuUnavailableReason();
    if (!reason.empty())
    {
        std::printf("skipped: %s\n", reason.c_str());
        return kvcache::test::gpuRequired() ? 1 : 77;
    }
    try
    {
        if (!quantizedOnly && !tieredOnly)
        {
            kvcache::bench::float16Rows(tierGib);
        }
        if (!tieredOnly)
        {
            kvcache::bench::quantizedRows();
        }
        if (!quantizedOnly)
        {
            kvcache::bench::tieredRows();
        }
        return 0;
    }
    catch (std::exception const& error)
    {
        std::fprintf(stderr, "kvcache-bench-host-tier: %s\n", error.what());
        return 1;
    }
}
