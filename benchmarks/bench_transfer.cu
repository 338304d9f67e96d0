// Page transfer between two GPUs of one process over NCCL: sendPages/receivePages of 1, 8, 64 and 256 page ids of a
// 32-layer cache (8 x 128 float16, 128-token pages: 256 KiB a layer half, 16 MiB a page id), contiguous and scattered
// (every other id), on the automatic, direct and staged paths, against one contiguous ncclSend/ncclRecv of the same
// bytes and cudaMemcpyPeerAsync of the same bytes, measured in the same run. Counters: bytes per second and the
// ratios vs_nccl and vs_peer_copy (above 1 is faster than the baseline). Exits 77 with fewer than two GPUs.
// NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 runs it over NCCL's socket transport.

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/dist/page_transfer.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/cuda_raii.h"

namespace kvcache::rt
{
namespace
{

constexpr int32_t kLAYERS = 32;
constexpr int32_t kPAGES = 512;
constexpr int64_t kPAGE_ID_BYTES = int64_t{kLAYERS} * 2 * 128 * 8 * 128 * 2;

//! Both GPUs' caches, streams and communicators, made once.
struct Rig
{
    std::array<ncclComm_t, 2> comms{};
    std::array<std::unique_ptr<test::CudaStream>, 2> streams;
    std::array<std::unique_ptr<KVCacheManager>, 2> caches;
    std::array<void*, 2> contiguous{}; //!< 256 page ids' bytes on each GPU, for the baselines
};

Rig& rig()
{
    static Rig* const instance = []
    {
        auto* made = new Rig;
        std::array<int, 2> const devices = {0, 1};
        if (ncclCommInitAll(made->comms.data(), 2, devices.data()) != ncclSuccess)
        {
            std::fprintf(stderr, "kvcache-bench-transfer: ncclCommInitAll failed\n");
            std::exit(1);
        }
        KVCacheConfig config;
        config.numAttentionLayers = kLAYERS;
        config.layerConfigs.assign(kLAYERS, KVLayerConfig{8, 128});
        config.maxBatchSize = 4;
        config.maxSequenceLength = kPAGES / 4 * 128;
        for (int32_t d = 0; d < 2; ++d)
        {
            KVCACHE_CUDA_TRY(cudaSetDevice(d));
            made->streams[d] = std::make_unique<test::CudaStream>();
            made->caches[d] = std::make_unique<KVCacheManager>(config, made->streams[d]->get());
            KVCACHE_CUDA_TRY(cudaMalloc(&made->contiguous[d], static_cast<size_t>(256 * kPAGE_ID_BYTES)));
            made->streams[d]->synchronize();
        }
        KVCACHE_CUDA_TRY(cudaSetDevice(0));
        if (cudaDeviceCanAccessPeer(nullptr, 0, 1) == cudaSuccess)
        {
            cudaDeviceEnablePeerAccess(1, 0);
            cudaGetLastError();
        }
        return made;
    }();
    return *instance;
}

//! Runs `side(0)` on a thread and `side(1)` here; returns the wall time of both.
template <typename Side>
double timePair(Side const& side)
{
    auto const start = std::chrono::steady_clock::now();
    std::thread sender(side, 0);
    side(1);
    sender.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double ncclBaseline(int64_t bytes)
{
    Rig& r = rig();
    return timePair(
        [&](int32_t d)
        {
            KVCACHE_CUDA_TRY(cudaSetDevice(d));
            ncclGroupStart();
            if (d == 0)
            {
                ncclSend(r.contiguous[0], static_cast<size_t>(bytes), ncclChar, 1, r.comms[0], r.streams[0]->get());
            }
            else
            {
                ncclRecv(r.contiguous[1], static_cast<size_t>(bytes), ncclChar, 0, r.comms[1], r.streams[1]->get());
            }
            ncclGroupEnd();
            r.streams[d]->synchronize();
        });
}

double peerCopyBaseline(int64_t bytes)
{
    Rig& r = rig();
    KVCACHE_CUDA_TRY(cudaSetDevice(0));
    auto const start = std::chrono::steady_clock::now();
    KVCACHE_CUDA_TRY(
        cudaMemcpyPeerAsync(r.contiguous[1], 1, r.contiguous[0], 0, static_cast<size_t>(bytes), r.streams[0]->get()));
    r.streams[0]->synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

//! Median of `runs` timings of `measure`, after one warm-up.
template <typename Measure>
double median(Measure const& measure, int runs = 11)
{
    measure();
    std::vector<double> times;
    for (int i = 0; i < runs; ++i)
    {
        times.push_back(measure());
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

void transferBenchmark(benchmark::State& state, TransferPath path, bool scattered)
{
    auto const count = static_cast<int32_t>(state.range(0));
    Rig& r = rig();
    std::vector<int32_t> pages;
    for (int32_t i = 0; i < count; ++i)
    {
        pages.push_back(scattered ? 2 * i : i);
    }
    TransferOptions options;
    options.path = path;
    auto const once = [&]
    {
        return timePair(
            [&](int32_t d)
            {
                KVCACHE_CUDA_TRY(cudaSetDevice(d));
                if (d == 0)
                {
                    sendPages(*r.caches[0], 0, pages.data(), count, 1, r.comms[0], r.streams[0]->get(), options);
                }
                else
                {
                    receivePages(*r.caches[1], 0, pages.data(), count, 0, r.comms[1], r.streams[1]->get(), options);
                }
            });
    };
    int64_t const bytes = int64_t{count} * kPAGE_ID_BYTES;
    for (auto _ : state)
    {
        state.SetIterationTime(once());
    }
    double const seconds = median(once);
    state.counters["bytes_per_second"] = static_cast<double>(bytes) / seconds;
    state.counters["vs_nccl"] = median([&] { return ncclBaseline(bytes); }) / seconds;
    state.counters["vs_peer_copy"] = median([&] { return peerCopyBaseline(bytes); }) / seconds;
}

void baselineBenchmark(benchmark::State& state, bool nccl)
{
    int64_t const bytes = state.range(0) * kPAGE_ID_BYTES;
    for (auto _ : state)
    {
        state.SetIterationTime(nccl ? ncclBaseline(bytes) : peerCopyBaseline(bytes));
    }
    state.SetBytesProcessed(state.iterations() * bytes);
}

//! Runs `bench` for 1, 8, 64 and 256 pages, timed by the benchmark itself, in microseconds.
void withPageCounts(benchmark::internal::Benchmark* bench)
{
    bench->Arg(1)->Arg(8)->Arg(64)->Arg(256)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

void registerAll()
{
    std::vector<std::pair<std::string, TransferPath>> const paths = {
        {"auto", TransferPath::kAUTO}, {"direct", TransferPath::kDIRECT}, {"staged", TransferPath::kSTAGED}};
    for (bool const scattered : {false, true})
    {
        for (auto const& [name, path] : paths)
        {
            withPageCounts(benchmark::RegisterBenchmark(
                ("transfer/" + std::string(scattered ? "scattered/" : "contiguous/") + name).c_str(),
                [path = path, scattered](benchmark::State& state) { transferBenchmark(state, path, scattered); }));
        }
    }
    for (bool const nccl : {true, false})
    {
        withPageCounts(benchmark::RegisterBenchmark(nccl ? "baseline/nccl_contiguous" : "baseline/memcpy_peer",
            [nccl](benchmark::State& state) { baselineBenchmark(state, nccl); }));
    }
}

} // namespace
} // namespace kvcache::rt

int main(int argc, char** argv)
{
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2)
    {
        std::fprintf(stderr, "kvcache-bench-transfer: needs two GPUs, found %d; skipping\n", devices);
        return 77;
    }
    benchmark::Initialize(&argc, argv);
    kvcache::rt::registerAll();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
