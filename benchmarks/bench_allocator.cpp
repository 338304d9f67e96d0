// Page allocator bookkeeping on the host (kvcache/page_allocator.h), shaped like the vLLM baseline's cases a and b
// (shared/anchors/vllm-blockpool): one page allocated and freed on a 100,000-page pool with half of it in use, and an
// 8192-token request's pages (512 at 16 tokens a page, 64 at 128) allocated and freed. No GPU. Counters: ns_per_op
// (one allocate + free of the case's pages) and ns_per_page, wall time. See docs/benchmarks.md.

#include "kvcache/page_allocator.h"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace kvcache::bench
{
namespace
{

namespace rt = kvcache::rt;

//! The baseline's pool: POOL_BLOCKS in bench_vllm_alloc.py.
constexpr int32_t kPOOL_PAGES = 100'000;
//! The baseline's request: PROMPT tokens.
constexpr int32_t kREQUEST_TOKENS = 8192;

using Clock = std::chrono::steady_clock;

//! Reports the time of one operation (an iteration) and of one page of it, in nanoseconds, from the steady clock
//! read around the timed loop.
void reportNanoseconds(benchmark::State& state, Clock::time_point start, int64_t pagesPerOp)
{
    double const nanoseconds = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    double const iterations = static_cast<double>(state.iterations());
    state.counters["ns_per_op"] = nanoseconds / iterations;
    state.counters["ns_per_page"] = nanoseconds / (iterations * static_cast<double>(pagesPerOp));
}

//! allocate_free/N: N single-page allocate() calls, then N single-page release() calls, on a pool with half its pages
//! in use (the baseline's case a holds half its pool too). N = 1 is a decode step's new page.
void allocateFree(benchmark::State& state)
{
    int32_t const count = static_cast<int32_t>(state.range(0));
    rt::PageAllocator allocator(kPOOL_PAGES);
    std::vector<int32_t> held(kPOOL_PAGES / 2);
    allocator.allocate(static_cast<int32_t>(held.size()), held.data());
    std::vector<int32_t> pages(static_cast<size_t>(count));
    Clock::time_point const start = Clock::now();
    for (auto _ : state)
    {
        for (int32_t& page : pages)
        {
            page = allocator.allocate();
            benchmark::DoNotOptimize(page);
        }
        for (int32_t const page : pages)
        {
            allocator.release(page);
        }
        benchmark::ClobberMemory();
    }
    reportNanoseconds(state, start, count);
}

//! request_allocate_free/N: one allocate(N, list) and one release(list, N) on a pool of kPOOL_PAGES free pages (the
//! baseline's case b starts from an empty pool too). N = 8192 / tokensPerPage.
void requestAllocateFree(benchmark::State& state)
{
    int32_t const count = static_cast<int32_t>(state.range(0));
    rt::PageAllocator allocator(kPOOL_PAGES);
    std::vector<int32_t> pages(static_cast<size_t>(count));
    Clock::time_point const start = Clock::now();
    for (auto _ : state)
    {
        allocator.allocate(count, pages.data());
        benchmark::DoNotOptimize(pages.data());
        allocator.release(pages.data(), count);
        benchmark::ClobberMemory();
    }
    reportNanoseconds(state, start, count);
}

void registerAll()
{
    benchmark::RegisterBenchmark("allocate_free", allocateFree)->Arg(1);
    // 16 and 128 tokens a page: the baseline's two block sizes.
    benchmark::RegisterBenchmark("request_allocate_free", requestAllocateFree)
        ->Arg(kREQUEST_TOKENS / 16)
        ->Arg(kREQUEST_TOKENS / 128);
    benchmark::AddCustomContext("pool_pages", std::to_string(kPOOL_PAGES));
    benchmark::AddCustomContext("request_tokens", std::to_string(kREQUEST_TOKENS));
}

} // namespace
} // namespace kvcache::bench

int main(int argc, char** argv)
{
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv))
    {
        return 1;
    }
    kvcache::bench::registerAll();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
