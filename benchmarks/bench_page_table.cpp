// Page table building on the host (kvcache/paging/page_table.h) for a full decode batch: 256 sequences of 64 pages, 16
// tokens a page. Cases, each named <case>/<maxBatchSize>x<maxPagesPerSequence> and all at the full batch:
//  - build: PageTableBuffers::build() alone, the previous upload finished (the stream is synchronised outside the
//    timed part, as a runtime's previous step has long finished): the capture check, the event check, the staging
//    writes with the checks of the sequences and the cudaMemcpyAsync enqueue.
//  - build_back_to_back: build() called again at once, so any host wait for an upload (the one before the last, whose
//    staging region the build rewrites) counts too.
//  - build_new_lists: build() of three batches in turn, so no list repeats what its staging region holds (a row is
//    rewritten only where its list differs from the region's: the case where every one does).
//  - build_windowed: build() of a sliding-window group's entries, the first 48 of each sequence's 64 released.
//  - build_growing: build() of a batch that changes as a decode step's does: before each call (untimed) 16 of the 256
//    lists (one in 16-token pages) gain a page, or, full, give their place to a new sequence of 48 pages; lists start
//    with 48 to 63 pages. Rows change only for those lists, indices move after the first of them.
//  - write_tables: the table writes (detail::buildPageTables: the checks, the block table rows, the CSR arrays and the
//    per-sequence arrays, one pass) into pinned staging (cudaHostAlloc), alternating between two regions as build()
//    does.
//    Target: 10 us a call.
//  - write_tables_pageable: the same writes into ordinary (pageable) host memory.
//  - build_steps: build()'s steps made one by one, as build() makes them, each timed alone (counters
//    capture_check_us, event_query_us, tables_us, copy_enqueue_us, event_record_us; the case's time is their
//    sum), so that build's time can be split between them. The stream never changes, so build()'s
//    cudaStreamWaitEvent for a new stream is not among them.
// Host wall time (steady clock) around the timed calls. Counters: ns_per_op and us_per_call. Exits 77 without a GPU,
// 1 under KVCACHE_REQUIRE_GPU=1. See docs/benchmarks.md.

#include "paging/page_table/page_table_build.h"

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_table.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <memory>
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

constexpr int32_t kTOKENS_PER_PAGE = 16;
//! Page ids are drawn from a pool this large, so that the batch's pages are scattered as a busy cache's are.
constexpr int32_t kPOOL_PAGES = 100'000;

using Clock = std::chrono::steady_clock;

//! A full batch: maxBatchSize sequences of maxPagesPerSequence distinct random pages, the last page of each partly
//! full; the first `releasedPages` entries of each are kUNUSED_PAGE_ENTRY (pages a sliding window released).
struct Workload
{
    Workload(int32_t maxBatchSize, int32_t maxPagesPerSequence, int32_t releasedPages = 0, uint64_t seed = 1)
        : shape(rt::detail::makePageTableShape(maxBatchSize, maxPagesPerSequence, kTOKENS_PER_PAGE))
        , pages(kPOOL_PAGES)
    {
        std::iota(pages.begin(), pages.end(), 0);
        std::shuffle(pages.begin(), pages.end(), std::mt19937_64(seed));
        int32_t const numTokens = maxPagesPerSequence * kTOKENS_PER_PAGE - kTOKENS_PER_PAGE / 2;
        for (int32_t b = 0; b < maxBatchSize; ++b)
        {
            int32_t* const list = pages.data() + int64_t{b} * maxPagesPerSequence;
            std::fill_n(list, releasedPages, rt::kUNUSED_PAGE_ENTRY);
            sequences.push_back({list, maxPagesPerSequence, numTokens});
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

//! Builds `batch` into `tables` on `stream` and returns the host seconds the call took, the iteration's time.
double timedBuild(benchmark::State& state, rt::PageTableBuffers& tables, Workload const& batch, cudaStream_t stream)
{
    Clock::time_point const start = Clock::now();
    tables.build(batch.sequences.data(), batch.shape.maxBatchSize, stream);
    double const seconds = secondsSince(start);
    state.SetIterationTime(seconds);
    return seconds;
}

//! build/BxM: build() alone, the stream synchronised first (untimed), so the previous upload has finished.
//! build_back_to_back/BxM: build() again at once; a call waits for its predecessor's upload if that is still in flight.
//! build_new_lists/BxM (kBATCHES 3): build() as build/BxM, but of three batches in turn (the same sizes, other random
//! pages), so that no list repeats the one its staging region holds, as a decode step's lists (but for new pages) do.
template <bool kBACK_TO_BACK, int32_t kBATCHES = 1>
void buildTables(benchmark::State& state, Workload const& work)
{
    // A deque keeps each batch where it was built: its sequences point into its own pages.
    std::deque<Workload> others;
    std::vector<Workload const*> batches{&work};
    for (int32_t seed = 2; seed <= kBATCHES; ++seed)
    {
        batches.push_back(&others.emplace_back(
            work.shape.maxBatchSize, work.shape.maxPagesPerSequence, 0, static_cast<uint64_t>(seed)));
    }
    test::CudaStream stream;
    rt::PageTableBuffers tables(
        work.shape.maxBatchSize, work.shape.maxPagesPerSequence, kTOKENS_PER_PAGE, stream.get());
    int64_t call = 0;
    double total = 0.0;
    for (auto _ : state)
    {
        if constexpr (!kBACK_TO_BACK)
        {
            stream.synchronize();
        }
        total += timedBuild(state, tables, *batches[static_cast<size_t>(call++ % kBATCHES)], stream.get());
    }
    stream.synchronize();
    reportCalls(state, total);
}

//! Pinned host memory for `count` int32 values (cudaHostAlloc, as PageTableBuffers allocates its staging).
class PinnedInts
{
public:
    explicit PinnedInts(int64_t count)
    {
        void* data = nullptr;
        KVCACHE_CUDA_TRY(cudaHostAlloc(&data, static_cast<size_t>(count) * sizeof(int32_t), cudaHostAllocDefault));
        mData.reset(static_cast<int32_t*>(data));
    }
    //! Returns the first value.
    int32_t* get() const noexcept
    {
        return mData.get();
    }

private:
    struct Free
    {
        void operator()(int32_t* data) const noexcept
        {
            KVCACHE_CUDA_LOG(cudaFreeHost(data));
        }
    };
    std::unique_ptr<int32_t, Free> mData;
};

//! An event without timing, as PageTableBuffers records after each upload.
class UploadEvent
{
public:
    UploadEvent()
    {
        KVCACHE_CUDA_TRY(cudaEventCreateWithFlags(&mEvent, cudaEventDisableTiming));
    }
    ~UploadEvent()
    {
        KVCACHE_CUDA_LOG(cudaEventDestroy(mEvent));
    }
    UploadEvent(UploadEvent const&) = delete;
    UploadEvent& operator=(UploadEvent const&) = delete;
    //! Returns the event.
    cudaEvent_t get() const noexcept
    {
        return mEvent;
    }

private:
    cudaEvent_t mEvent{nullptr};
};

//! Staging regions as PageTableBuffers keeps them: two of the tables' layout, one after the other, each starting as
//! the tables of count 0 and then those of the workload's batch (every row of a build rewritten, none shrinking).
class StagingRegions
{
public:
    StagingRegions(Workload const& work, bool pinned)
        : mElements(work.shape.elements())
    {
        if (pinned)
        {
            mPinned = std::make_unique<PinnedInts>(2 * mElements);
            mData = mPinned->get();
        }
        else
        {
            mPageable.resize(static_cast<size_t>(2 * mElements));
            mData = mPageable.data();
        }
        for (int32_t region = 0; region < 2; ++region)
        {
            rt::detail::writeEmptyPageTables(work.shape, get(region));
            rt::detail::buildPageTables(work.shape, work.sequences.data(), work.shape.maxBatchSize, get(region));
        }
    }
    //! Returns region 0 or 1.
    int32_t* get(int32_t region) const noexcept
    {
        return mData + region * mElements;
    }

private:
    int64_t mElements;
    std::unique_ptr<PinnedInts> mPinned;
    std::vector<int32_t> mPageable;
    int32_t* mData{nullptr};
};

//! write_tables/BxM (kPINNED) and write_tables_pageable/BxM: both passes, alternating between two staging regions.
template <bool kPINNED>
void writeTables(benchmark::State& state, Workload const& work)
{
    StagingRegions const regions(work, kPINNED);
    int32_t region = 0;
    double total = 0.0;
    for (auto _ : state)
    {
        region = 1 - region;
        Clock::time_point const start = Clock::now();
        benchmark::DoNotOptimize(rt::detail::buildPageTables(
            work.shape, work.sequences.data(), work.shape.maxBatchSize, regions.get(region)));
        benchmark::ClobberMemory();
        double const seconds = secondsSince(start);
        state.SetIterationTime(seconds);
        total += seconds;
    }
    reportCalls(state, total);
}

//! build_steps/BxM: the steps of PageTableBuffers::build() in its order, on staging regions, device memory and events
//! of the same kinds, each step timed alone; the stream is synchronised first (untimed), as for build/BxM.
void buildSteps(benchmark::State& state, Workload const& work)
{
    enum Step
    {
        kCAPTURE_CHECK,
        kEVENT_QUERY,
        kTABLES,
        kCOPY_ENQUEUE,
        kEVENT_RECORD,
        kSTEPS
    };
    constexpr char const* kCOUNTERS[kSTEPS] = {
        "capture_check_us", "event_query_us", "tables_us", "copy_enqueue_us", "event_record_us"};
    test::CudaStream stream;
    StagingRegions const regions(work, true);
    test::DeviceArray<int32_t> device(static_cast<size_t>(work.shape.elements()));
    UploadEvent const uploaded[2];
    int32_t const count = work.shape.maxBatchSize;
    int32_t region = 0;
    double seconds[kSTEPS] = {};
    double total = 0.0;
    for (auto _ : state)
    {
        stream.synchronize();
        region = 1 - region;
        Clock::time_point start = Clock::now();
        // Each step's time runs from the previous step's end, so the clock reads are counted once.
        auto const lap = [&](Step step)
        {
            Clock::time_point const now = Clock::now();
            seconds[step] += std::chrono::duration<double>(now - start).count();
            start = now;
        };
        Clock::time_point const first = start;
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        KVCACHE_CUDA_TRY(cudaStreamIsCapturing(stream.get(), &capture));
        lap(kCAPTURE_CHECK);
        cudaError_t const status = cudaEventQuery(uploaded[region].get());
        if (status != cudaSuccess)
        {
            KVCACHE_CUDA_TRY(cudaEventSynchronize(uploaded[region].get()));
        }
        lap(kEVENT_QUERY);
        int64_t const elements =
            rt::detail::buildPageTables(work.shape, work.sequences.data(), count, regions.get(region));
        lap(kTABLES);
        KVCACHE_CUDA_TRY(cudaMemcpyAsync(device.get(), regions.get(region),
            static_cast<size_t>(elements) * sizeof(int32_t), cudaMemcpyHostToDevice, stream.get()));
        lap(kCOPY_ENQUEUE);
        KVCACHE_CUDA_TRY(cudaEventRecord(uploaded[region].get(), stream.get()));
        lap(kEVENT_RECORD);
        double const iteration = std::chrono::duration<double>(start - first).count();
        state.SetIterationTime(iteration);
        total += iteration;
    }
    stream.synchronize();
    reportCalls(state, total);
    for (int32_t step = 0; step < kSTEPS; ++step)
    {
        state.counters[kCOUNTERS[step]] = seconds[step] * 1e6 / static_cast<double>(state.iterations());
    }
}

//! build_growing/BxM: build() of a batch in which, before each call (untimed), maxBatchSize / kTOKENS_PER_PAGE random
//! sequences gain a page (a decode step adds a token to each, so a sequence in kTOKENS_PER_PAGE starts a page), or, at
//! maxPagesPerSequence pages, are replaced by a new sequence of 3/4 of that; the stream synchronised first, as
//! build/BxM.
void buildGrowing(benchmark::State& state, Workload const& work)
{
    int32_t const width = work.shape.maxPagesPerSequence;
    int32_t const fewest = width * 3 / 4;
    Workload batch(work.shape.maxBatchSize, width, 0, 4);
    std::mt19937 random(5);
    // New sequences take page ids from the pool past the lists' own, in turn.
    int64_t const ownPages = int64_t{work.shape.maxBatchSize} * width;
    int64_t nextPage = ownPages;
    auto const setPages = [](rt::SequencePages& sequence, int32_t numPages)
    {
        sequence.numPages = numPages;
        sequence.numTokens = numPages * kTOKENS_PER_PAGE - kTOKENS_PER_PAGE / 2;
    };
    for (rt::SequencePages& sequence : batch.sequences)
    {
        setPages(sequence, fewest + static_cast<int32_t>(random() % static_cast<uint32_t>(width - fewest)));
    }
    test::CudaStream stream;
    rt::PageTableBuffers tables(work.shape.maxBatchSize, width, kTOKENS_PER_PAGE, stream.get());
    double total = 0.0;
    for (auto _ : state)
    {
        for (int32_t k = 0; k < work.shape.maxBatchSize / kTOKENS_PER_PAGE; ++k)
        {
            size_t const b = random() % batch.sequences.size();
            rt::SequencePages& sequence = batch.sequences[b];
            if (sequence.numPages < width)
            {
                setPages(sequence, sequence.numPages + 1);
                continue;
            }
            int32_t* const list = batch.pages.data() + static_cast<int64_t>(b) * width;
            for (int32_t i = 0; i < width; ++i)
            {
                list[i] = batch.pages[static_cast<size_t>(nextPage)];
                nextPage = nextPage + 1 < kPOOL_PAGES ? nextPage + 1 : ownPages;
            }
            setPages(sequence, fewest);
        }
        stream.synchronize();
        total += timedBuild(state, tables, batch, stream.get());
    }
    stream.synchronize();
    reportCalls(state, total);
}

//! Cases that stopped with an error; any makes the process exit 1.
int32_t gFailedCases = 0;

void registerCase(char const* name, void (*body)(benchmark::State&, Workload const&), int32_t maxBatchSize,
    int32_t maxPagesPerSequence, int32_t releasedPages = 0)
{
    std::string const caseName =
        std::string(name) + "/" + std::to_string(maxBatchSize) + "x" + std::to_string(maxPagesPerSequence);
    benchmark::RegisterBenchmark(caseName.c_str(),
        [=](benchmark::State& state)
        {
            try
            {
                Workload const work(maxBatchSize, maxPagesPerSequence, releasedPages);
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
    for (auto const& [name, body] : {std::pair{"build", &buildTables<false>},
             std::pair{"build_back_to_back", &buildTables<true>}, std::pair{"build_new_lists", &buildTables<false, 3>},
             std::pair{"write_tables", &writeTables<true>}, std::pair{"write_tables_pageable", &writeTables<false>},
             std::pair{"build_steps", &buildSteps}, std::pair{"build_growing", &buildGrowing}})
    {
        registerCase(name, body, 256, 64);
    }
    // A windowed group's tables: 48 of each sequence's 64 entries released, left out of both tables.
    registerCase("build_windowed", &buildTables<false>, 256, 64, 48);
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
