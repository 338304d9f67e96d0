// Page table building on the host (kvcache/page_table.h) for a full decode batch: 256 sequences of 64 pages, 16 tokens
// a page. Cases, each named <case>/<maxBatchSize>x<maxPagesPerSequence> and all at the full batch:
//  - build: PageTableBuffers::build() alone, the previous upload finished (the stream is synchronised outside the
//    timed part, as a runtime's previous step has long finished): validation, the event check, the staging writes and
//    the cudaMemcpyAsync enqueue. Target: 10 us a call.
//  - build_back_to_back: build() called again at once, so any host wait for the previous upload counts too.
//  - write_block_table, write_csr: the dense and the CSR staging writes alone, on ordinary host memory.
// Host wall time (steady clock) around the timed calls. Counters: ns_per_op and us_per_call. Exits 77 without a GPU,
// 1 under KVCACHE_REQUIRE_GPU=1. See docs/benchmarks.md.

#include "page_table_build.h"

#include "kvcache/errors.h"
#include "kvcache/page_table.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/cuda_raii.h"
#include "support/gpu_availability.h"

namespace kvcache::bench
{
namespace
{

namespace rt = kvcache::rt;

constexpr int32_t kTOKENS_PER_PAGE = 16;
//! Page ids are drawn from a pool this large, so that the batch's pages are scattered as a busy cache's are.
constexpr int32_t kPOOL_PAGES = 100'000;

using Clock = std::chrono::steady_clock;

//! A full batch: maxBatchSize sequences of maxPagesPerSequence distinct random pages, the last page of each partly
//! full.
struct Workload
{
    Workload(int32_t maxBatchSize, int32_t maxPagesPerSequence)
        : shape(rt::detail::makePageTableShape(maxBatchSize, maxPagesPerSequence, kTOKENS_PER_PAGE))
        , pages(kPOOL_PAGES)
    {
        std::iota(pages.begin(), pages.end(), 0);
        std::shuffle(pages.begin(), pages.end(), std::mt19937_64(1));
        int32_t const numTokens = maxPagesPerSequence * kTOKENS_PER_PAGE - kTOKENS_PER_PAGE / 2;
        for (int32_t b = 0; b < maxBatchSize; ++b)
        {
            sequences.push_back({pages.data() + int64_t{b} * maxPagesPerSequence, maxPagesPerSequence, numTokens});
        }
    }

    rt::detail::PageTableShape shape;
    std::vector<int32_t> pages;
    std::vector<rt::SequencePages> sequences;
};

//! Sets the counters from the seconds the timed calls took in all.
void reportCalls(benchmark::State& state, double seconds)
{
    double const nanoseconds = seconds * 1e9 / static_cast<double>(state.iterations());
    state.counters["ns_per_op"] = nanoseconds;
    state.counters["us_per_call"] = nanoseconds * 1e-3;
}

double secondsSince(Clock::time_point start)
{
    return std::chrono::duration<double>(Clock::now() - start).count();
}

//! build/BxM: build() alone, the stream synchronised first (untimed), so the previous upload has finished.
//! build_back_to_back/BxM: build() again at once; a call waits for its predecessor's upload if that is still in flight.
template <bool kBACK_TO_BACK>
void buildTables(benchmark::State& state, Workload const& work)
{
    test::CudaStream stream;
    rt::PageTableBuffers tables(
        work.shape.maxBatchSize, work.shape.maxPagesPerSequence, kTOKENS_PER_PAGE, stream.get());
    double total = 0.0;
    for (auto _ : state)
    {
        if constexpr (!kBACK_TO_BACK)
        {
            stream.synchronize();
        }
        Clock::time_point const start = Clock::now();
        tables.build(work.sequences.data(), work.shape.maxBatchSize, stream.get());
        double const seconds = secondsSince(start);
        state.SetIterationTime(seconds);
        total += seconds;
    }
    stream.synchronize();
    reportCalls(state, total);
}

//! write_block_table/BxM and write_csr/BxM: one of the two staging writes alone, over the tables of the same batch
//! (every row rewritten, none shrinking).
template <bool kDENSE>
void writeOnly(benchmark::State& state, Workload const& work)
{
    std::vector<int32_t> region(static_cast<size_t>(work.shape.elements()));
    rt::detail::writeEmptyPageTables(work.shape, region.data());
    rt::detail::buildPageTables(work.shape, work.sequences.data(), work.shape.maxBatchSize, region.data());
    double total = 0.0;
    for (auto _ : state)
    {
        Clock::time_point const start = Clock::now();
        if constexpr (kDENSE)
        {
            rt::detail::writeBlockTable(work.shape, work.sequences.data(), work.shape.maxBatchSize, region.data());
        }
        else
        {
            benchmark::DoNotOptimize(
                rt::detail::writeCsr(work.shape, work.sequences.data(), work.shape.maxBatchSize, region.data()));
        }
        benchmark::ClobberMemory();
        double const seconds = secondsSince(start);
        state.SetIterationTime(seconds);
        total += seconds;
    }
    reportCalls(state, total);
}

//! Cases that stopped with an error; any makes the process exit 1.
int32_t gFailedCases = 0;

void registerCase(char const* name, void (*body)(benchmark::State&, Workload const&), int32_t maxBatchSize,
    int32_t maxPagesPerSequence)
{
    std::string const caseName =
        std::string(name) + "/" + std::to_string(maxBatchSize) + "x" + std::to_string(maxPagesPerSequence);
    benchmark::RegisterBenchmark(caseName.c_str(),
        [=](benchmark::State& state)
        {
            try
            {
                Workload const work(maxBatchSize, maxPagesPerSequence);
                body(state, work);
            }
            catch (std::exception const& error)
            {
                ++gFailedCases;
                state.SkipWithError(error.what());
            }
        })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
}

void registerAll()
{
    for (auto const& [name, body] :
        {std::pair{"build", &buildTables<false>}, std::pair{"build_back_to_back", &buildTables<true>},
            std::pair{"write_block_table", &writeOnly<true>}, std::pair{"write_csr", &writeOnly<false>}})
    {
        registerCase(name, body, 256, 64);
    }
    benchmark::AddCustomContext("tokens_per_page", std::to_string(kTOKENS_PER_PAGE));
    benchmark::AddCustomContext("pool_pages", std::to_string(kPOOL_PAGES));
}

} // namespace
} // namespace kvcache::bench

int main(int argc, char** argv)
{
    char const* const program = "kvcache-bench-page-table";
    std::string const reason = kvcache::test::gpuUnavailableReason();
    if (!reason.empty())
    {
        bool const required = kvcache::test::gpuRequired();
        std::fprintf(stderr, "%s: nothing measured, no usable GPU (%s)%s\n", program, reason.c_str(),
            required ? "; KVCACHE_REQUIRE_GPU=1 makes that a failure" : "");
        return required ? 1 : 77;
    }
    kvcache::bench::registerAll();
    benchmark::Initialize(&argc, argv);
    bool const badArguments = benchmark::ReportUnrecognizedArguments(argc, argv);
    size_t const cases = badArguments ? 0 : benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    int32_t const failed = kvcache::bench::gFailedCases;
    if (failed > 0)
    {
        std::fprintf(stderr, "%s: %d of %zu case(s) failed\n", program, failed, cases);
    }
    return badArguments || failed > 0 ? 1 : 0;
}
