// Transfer descriptors on the host (kvcache/dist/transfer_descriptors.h): the ranges that move 256 sequences of 64
// pages through 64 layers (float16, 8 KV heads of 128, 16 tokens per page) between two caches of the same geometry,
// the pages scattered (no two adjacent, so nothing merges) or in runs (each sequence's pages adjacent on both sides).
// No GPU: the pools are made-up addresses. Counters: ms_per_batch (all 256 sequences), ns_per_range, ranges. See
// docs/benchmarks.md.

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/dist/transfer_descriptors.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "support/config_builder.h"

namespace kvcache::bench
{
namespace
{

constexpr int32_t kSEQUENCES = 256;
constexpr int32_t kPAGES = 64;
constexpr int32_t kLAYERS = 64;
constexpr int32_t kTOKENS_PER_PAGE = 16;

rt::TransferDescription describe(uint64_t address)
{
    rt::KVCacheLayout const layout =
        rt::computeLayout(test::ConfigBuilder(std::vector<rt::KVLayerConfig>(kLAYERS, rt::KVLayerConfig{8, 128}))
                              .maxBatchSize(kSEQUENCES)
                              .maxSequenceLength(kPAGES * kTOKENS_PER_PAGE)
                              .tokensPerPage(kTOKENS_PER_PAGE));
    std::vector<uint64_t> bases;
    for (int32_t layer = 0; layer < kLAYERS; ++layer)
    {
        bases.push_back(address + static_cast<uint64_t>(layer) * (uint64_t{1} << 32));
    }
    return rt::describeForTransfer(layout, bases, 0);
}

//! descriptors/<scattered|runs>: every sequence's ranges, one transferDescriptors call per sequence.
void descriptors(benchmark::State& state, bool scattered)
{
    rt::TransferDescription const local = describe(0x7000'0000'0000);
    std::vector<rt::TransferDescription> const remotes{describe(0x5000'0000'0000)};
    // Page ids of sequence s: a permutation of the pool with every other page (scattered), or s's own run.
    std::vector<int32_t> order(static_cast<size_t>(kSEQUENCES * kPAGES));
    std::iota(order.begin(), order.end(), 0);
    if (scattered)
    {
        std::mt19937 generator(3);
        std::shuffle(order.begin(), order.end(), generator);
    }
    int64_t ranges = 0;
    auto const start = std::chrono::steady_clock::now();
    for (auto _ : state)
    {
        ranges = 0;
        for (int32_t s = 0; s < kSEQUENCES; ++s)
        {
            int32_t const* pages = order.data() + static_cast<ptrdiff_t>(s) * kPAGES;
            std::vector<rt::TransferDescriptors> const result =
                rt::transferDescriptors(local, pages, kPAGES, remotes, pages, kPAGES, 0, kPAGES * kTOKENS_PER_PAGE);
            ranges += static_cast<int64_t>(result[0].local.size());
            benchmark::DoNotOptimize(result.data());
        }
    }
    double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double const iterations = static_cast<double>(state.iterations());
    state.counters["ms_per_batch"] = seconds * 1e3 / iterations;
    state.counters["ns_per_range"] = seconds * 1e9 / (iterations * static_cast<double>(ranges));
    state.counters["ranges"] = static_cast<double>(ranges);
}

BENCHMARK_CAPTURE(descriptors, scattered, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(descriptors, runs, false)->Unit(benchmark::kMillisecond);

} // namespace
} // namespace kvcache::bench

BENCHMARK_MAIN();
