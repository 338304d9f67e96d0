// Chained page hashes on the host (kvcache/paging/page_hash.h): the full pages of an 8192-token prompt (512 pages of 16
// tokens, 64 of 128) hashed with PageHasher::chain, SHA-256 and XXH3. No GPU. Counters: ns_per_page and ns_per_prompt,
// wall time; cpu_s_per_page, CPU time. See docs/benchmarks.md.

#include "kvcache/paging/page_hash.h"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

namespace kvcache::bench
{
namespace
{

constexpr int32_t kPROMPT_TOKENS = 8192;

using Clock = std::chrono::steady_clock;

//! chain/<algorithm>/<tokensPerPage>: one prompt's pages hashed from its root.
void chainPrompt(benchmark::State& state, rt::PageHashAlgorithm algorithm)
{
    int32_t const tokensPerPage = static_cast<int32_t>(state.range(0));
    int32_t const numPages = kPROMPT_TOKENS / tokensPerPage;
    std::mt19937 generator(1);
    std::vector<int32_t> tokens(kPROMPT_TOKENS);
    for (int32_t& token : tokens)
    {
        token = static_cast<int32_t>(generator() % 128'000);
    }
    rt::PageHasher const hasher(algorithm, std::array<uint8_t, 32>{});
    rt::PageHash const root = hasher.root(nullptr, 0);
    std::vector<rt::PageHash> hashes(static_cast<size_t>(numPages));
    Clock::time_point const start = Clock::now();
    for (auto _ : state)
    {
        hasher.chain(root, tokens.data(), numPages, tokensPerPage, hashes.data());
        benchmark::DoNotOptimize(hashes.data());
        benchmark::ClobberMemory();
    }
    double const nanoseconds = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    double const iterations = static_cast<double>(state.iterations());
    state.counters["ns_per_prompt"] = nanoseconds / iterations;
    state.counters["ns_per_page"] = nanoseconds / (iterations * numPages);
    // The same from the process's CPU time, steadier than wall time on a machine shared with other work.
    state.counters["cpu_s_per_page"] = benchmark::Counter(
        static_cast<double>(numPages), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

BENCHMARK_CAPTURE(chainPrompt, sha256, rt::PageHashAlgorithm::kSHA256)->Arg(16)->Arg(128);
BENCHMARK_CAPTURE(chainPrompt, xxh3_128, rt::PageHashAlgorithm::kXXH3_128)->Arg(16)->Arg(128);

} // namespace
} // namespace kvcache::bench

BENCHMARK_MAIN();
