// Page copy and reset throughput: kvcache's kernels against cudaMemcpyAsync / cudaMemsetAsync baselines and the
// contiguous-transfer ceiling, for the same bytes, in one process. The cases and one function per method are here;
// page_ops_models.h holds the models and their page lists, page_ops_harness.h times them. See docs/benchmarks.md.
//
// Quantized caches: fp8_per_token_head_uniform (FP8 E4M3 data and a float32 scale per page, token and head) and
// nvfp4_uniform (two E2M1 values a byte and one FP8 E4M3 scale per 16 values), both 32 x (8, 128) with 768 pages, are
// copied (8 and 256 scattered pairs, every method) and reset (8 and 256 pages, every reset method). A page is its data
// and its scale pages, so every method moves both, in every layer and half: the per-page baselines make one call a
// scale page too (pages x 32 x 4 calls), the ceiling is one contiguous transfer of the data and scale bytes together,
// bytes_read and bytes_written count both (their meaning unchanged: what a call reads and writes) and these rows also
// report scale_bytes_written, the scale part of bytes_written. The one-off check poisons the destination's data and
// scale pages, gives K, V, K scales and V scales distinct random bytes, and names the layer and part that is wrong.
// NVFP4's global scales are per layer, held on the host, and no page operation moves them.

#include "page_ops_harness.h"
#include "page_ops_models.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/page_ops.h"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "support/cuda_raii.h"
#include "support/page_segments.h"

namespace kvcache::bench
{
namespace
{

constexpr int64_t kENQUEUE_ITERATIONS = 2000;
constexpr int64_t kENQUEUE_SYNC_EVERY = 32;
//! Single-pair calls in one back-to-back batch: every call on its own pages (2 * 384 = kPOOL_PAGES).
constexpr int32_t kBACK_TO_BACK_CALLS = kPOOL_PAGES / 2;
//! Timed batches of a back-to-back case, whatever --benchmark_min_time says. Each batch reports its time per call,
//! so a minimum time would be met only after about kBACK_TO_BACK_CALLS times as long.
constexpr int64_t kBACK_TO_BACK_BATCHES = 30;

//! Returns every page-sized transfer of a copy list (`pairs`) or a reset list (`resetPages`) in the layers of `group`,
//! in list order, then test::pageSegments' order (data pages layer by layer, K before V, then the scale pages the same
//! way): the per-page baselines move exactly these, and the check reads them back.
std::vector<Segment> segmentsOf(rt::KVCacheManager const& cache, int32_t group, std::vector<rt::PageCopy> const& pairs,
    std::vector<int32_t> const& resetPages)
{
    std::vector<Segment> segments;
    bool const isCopy = !pairs.empty();
    size_t const count = isCopy ? pairs.size() : resetPages.size();
    for (size_t i = 0; i < count; ++i)
    {
        std::vector<test::PageSegment> const dst =
            test::pageSegments(cache, group, isCopy ? pairs[i].dst : resetPages[i]);
        std::vector<test::PageSegment> const src =
            isCopy ? test::pageSegments(cache, group, pairs[i].src) : std::vector<test::PageSegment>{};
        for (size_t s = 0; s < dst.size(); ++s)
        {
            segments.push_back(
                {dst[s].address, isCopy ? src[s].address : nullptr, dst[s].bytes, dst[s].layer, dst[s].part});
        }
    }
    return segments;
}

//! What a copy or reset case moves in one call: its list and the page-sized transfers that list means.
struct Workload
{
    rt::KVCacheManager const& cache;
    rt::PageOpTarget target; //!< every layer of the model's group, both halves
    Transfer transfer;
    std::vector<rt::PageCopy> pairs; //!< a copy's list
    std::vector<int32_t> pages;      //!< a reset's list
    std::vector<Segment> segments;
    int64_t bytesWritten;
    int64_t scaleBytesWritten; //!< the part of bytesWritten that is scale pages
};

Workload makeWorkload(rt::KVCacheManager const& cache, Model const& model, Transfer transfer,
    std::vector<rt::PageCopy> pairs, std::vector<int32_t> pages)
{
    std::vector<Segment> segments = segmentsOf(cache, groupOf(model), pairs, pages);
    int64_t bytesWritten = 0;
    int64_t scaleBytesWritten = 0;
    for (Segment const& segment : segments)
    {
        bytesWritten += segment.bytes;
        bool const isScale = segment.part == test::SegmentPart::kKScales || segment.part == test::SegmentPart::kVScales;
        scaleBytesWritten += isScale ? segment.bytes : 0;
    }
    rt::PageOpTarget target;
    target.group = model.group;
    return Workload{cache, target, transfer, std::move(pairs), std::move(pages), std::move(segments), bytesWritten,
        scaleBytesWritten};
}

// One function per method of a copy or reset case: each returns the call the harness times. The call may refer to
// `work`, which outlives it.

Run contiguousCeiling(Workload const& work, Harness& harness)
{
    return harness.ceilingRun(work.transfer, work.bytesWritten);
}

Run perPageMemcpy(Workload const& work, Harness& /*harness*/)
{
    return [&segments = work.segments](cudaStream_t stream)
    {
        for (Segment const& segment : segments)
        {
            auto const size = static_cast<size_t>(segment.bytes);
            if (segment.src != nullptr)
            {
                KVCACHE_CUDA_TRY(cudaMemcpyAsync(segment.dst, segment.src, size, cudaMemcpyDeviceToDevice, stream));
            }
            else
            {
                KVCACHE_CUDA_TRY(cudaMemsetAsync(segment.dst, kRESET_BYTE, size, stream));
            }
        }
    };
}

Run batchMemcpy([[maybe_unused]] Workload const& work, Harness& /*harness*/)
{
#if CUDART_VERSION >= 13000
    // Built before timing, so that the timed call is the batch call alone.
    struct Arguments
    {
        std::vector<void*> dsts;
        std::vector<void const*> srcs;
        std::vector<size_t> sizes;
        cudaMemcpyAttributes attributes{};
        size_t attributeIndex = 0;
    };
    auto batch = std::make_shared<Arguments>();
    for (Segment const& segment : work.segments)
    {
        batch->dsts.push_back(segment.dst);
        batch->srcs.push_back(segment.src);
        batch->sizes.push_back(static_cast<size_t>(segment.bytes));
    }
    batch->attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    return [batch](cudaStream_t stream)
    {
        KVCACHE_CUDA_TRY(cudaMemcpyBatchAsync(batch->dsts.data(), batch->srcs.data(), batch->sizes.data(),
            batch->sizes.size(), &batch->attributes, &batch->attributeIndex, 1, stream));
    };
#else
    throw MethodUnavailable("cudaMemcpyBatchAsync with this signature needs CUDA 13");
#endif
}

Run kvcacheHostList(Workload const& work, Harness& /*harness*/)
{
    if (work.transfer == Transfer::kFILL)
    {
        return [&work](cudaStream_t stream)
        {
            rt::resetPages(work.cache, work.pages.data(), static_cast<int32_t>(work.pages.size()), stream,
                kRESET_PATTERN, work.target);
        };
    }
    return [&work](cudaStream_t stream)
    { rt::copyPages(work.cache, work.pairs.data(), static_cast<int32_t>(work.pairs.size()), stream, work.target); };
}

Run kvcacheDeviceList(Workload const& work, Harness& harness)
{
    // Uploaded before timing: a runtime's device list is already in device memory when it calls.
    if (work.transfer == Transfer::kFILL)
    {
        auto const list = std::make_shared<test::DeviceArray<int32_t>>(work.pages, harness.stream());
        return [&work, list](cudaStream_t stream)
        {
            rt::resetPagesDevice(work.cache, list->get(), static_cast<int32_t>(list->size()), nullptr, stream,
                kRESET_PATTERN, work.target);
        };
    }
    auto const list = std::make_shared<test::DeviceArray<rt::PageCopy>>(work.pairs, harness.stream());
    return [&work, list](cudaStream_t stream)
    { rt::copyPagesDevice(work.cache, list->get(), static_cast<int32_t>(list->size()), nullptr, stream, work.target); };
}

//! A method of copy and reset cases: its name in the case name and the function that makes its call.
struct Method
{
    char const* name;
    Run (*make)(Workload const& work, Harness& harness);
    //! False for the ceiling: it moves scratch bytes, not pages, so there is nothing on the pages to check.
    bool checked;
};

constexpr Method kCEILING{"ceiling", contiguousCeiling, false};
constexpr Method kPER_PAGE{"per_page", perPageMemcpy, true};
constexpr Method kBATCH_MEMCPY{"batch_memcpy", batchMemcpy, true};
constexpr Method kKVCACHE_HOST{"kvcache_host", kvcacheHostList, true};
constexpr Method kKVCACHE_DEVICE{"kvcache_device", kvcacheDeviceList, true};

//! Which pages a copy or reset case lists.
enum class Operation
{
    kCOPY,      //!< scattered pairs
    kRESET,     //!< scattered pages
    kCOPY_RUNS, //!< pairs in one run, or in runs of runLength pages taken in a pseudo-random order
};

//! One copy or reset case.
struct TransferCase
{
    Operation operation;
    Model const* model;
    Method method;
    int32_t pages;
    //! kCOPY_RUNS only: pages in one run, 0 for a single run of all pages.
    int32_t runLength;
};

//! Returns the operation's name, which also keys its ceilings (copy_runs_of_<k> shares copy_runs' ceiling).
std::string familyOf(Operation operation)
{
    switch (operation)
    {
    case Operation::kCOPY: return "copy";
    case Operation::kRESET: return "reset";
    case Operation::kCOPY_RUNS: return "copy_runs";
    }
    return "unknown";
}

std::string caseName(std::string const& operation, Model const& model, char const* method, int32_t pages)
{
    return operation + "/" + model.name + "/" + method + "/" + std::to_string(pages);
}

Workload workloadOf(TransferCase const& c, rt::KVCacheManager const& cache)
{
    Model const& model = *c.model;
    int32_t const numPages = poolPagesOf(cache, model);
    if (c.operation == Operation::kRESET)
    {
        return makeWorkload(cache, model, Transfer::kFILL, {}, scatteredPages(c.pages, numPages));
    }
    if (c.operation == Operation::kCOPY)
    {
        return makeWorkload(cache, model, Transfer::kCOPY, scatteredPairs(c.pages, numPages), {});
    }
    if (c.runLength > 0)
    {
        return makeWorkload(cache, model, Transfer::kCOPY, pairsInRuns(c.pages, c.runLength, numPages), {});
    }
    return makeWorkload(cache, model, Transfer::kCOPY, pairsInOneRun(c.pages), {});
}

//! Checks the method once, then times it against the ceiling of the same bytes.
void measureTransfer(benchmark::State& state, Harness& harness, TransferCase const& c, std::string const& name)
{
    rt::KVCacheManager const& cache = cacheOf(harness, *c.model);
    Workload const work = workloadOf(c, cache);
    Run const run = c.method.make(work, harness);
    if (c.method.checked && harness.firstVisit(name))
    {
        int64_t const segmentsPerEntry = static_cast<int64_t>(work.segments.size()) / std::max(c.pages, 1);
        checkMethod(harness.stream(), work.segments, segmentsPerEntry, run);
    }
    double const ceiling = harness.ceilingSeconds(familyOf(c.operation), work.transfer, work.bytesWritten);
    double const secondsPerCall = harness.timeIterations(state, run);
    if (c.runLength > 0)
    {
        state.counters["run_pages"] = c.runLength;
    }
    if (work.scaleBytesWritten > 0)
    {
        state.counters["scale_bytes_written"] = static_cast<double>(work.scaleBytesWritten);
    }
    int64_t const bytesRead = work.transfer == Transfer::kCOPY ? work.bytesWritten : 0;
    reportTransfer(state, c.pages, bytesRead, work.bytesWritten, secondsPerCall, ceiling);
}

void registerTransfer(
    Operation operation, Model const& model, Method const& method, int32_t pages, int32_t runLength = 0)
{
    std::string const family = familyOf(operation);
    std::string const name =
        caseName(runLength > 0 ? family + "_of_" + std::to_string(runLength) : family, model, method.name, pages);
    TransferCase const c{operation, &model, method, pages, runLength};
    registerCase(
        name, [c, name](benchmark::State& state, Harness& harness) { measureTransfer(state, harness, c, name); });
}

//! A back-to-back case's calls: call i copies pairs[i], on pages no other call of the batch touches, so that nothing
//! a call reads is left in L2 by the calls before it.
struct BackToBackWork
{
    rt::KVCacheManager const& cache;
    std::vector<rt::PageCopy> pairs;
    int64_t bytesPerCall;
};

// One function per back-to-back method: each returns one batch of kBACK_TO_BACK_CALLS calls, launched directly (no
// graph).

Run backToBackCeiling(BackToBackWork const& work, Harness& harness)
{
    return harness.backToBackCeilingRun(work.bytesPerCall, kBACK_TO_BACK_CALLS);
}

Run backToBackHostList(BackToBackWork const& work, Harness& /*harness*/)
{
    return [&work](cudaStream_t stream)
    {
        for (rt::PageCopy const& pair : work.pairs)
        {
            rt::copyPages(work.cache, &pair, 1, stream);
        }
    };
}

Run backToBackDeviceList(BackToBackWork const& work, Harness& harness)
{
    auto const list = std::make_shared<test::DeviceArray<rt::PageCopy>>(work.pairs, harness.stream());
    return [&cache = work.cache, list](cudaStream_t stream)
    {
        for (size_t i = 0; i < list->size(); ++i)
        {
            rt::copyPagesDevice(cache, list->get() + i, 1, nullptr, stream);
        }
    };
}

//! A method of back-to-back cases.
struct BackToBackMethod
{
    char const* name;
    Run (*make)(BackToBackWork const& work, Harness& harness);
};

//! Times batches of single-pair calls against the same number of contiguous copies of the same bytes.
void measureBackToBack(benchmark::State& state, Harness& harness, Model const& model, BackToBackMethod const& method)
{
    rt::KVCacheManager const& cache = cacheOf(harness, model);
    std::vector<int32_t> const ids = scatteredPages(2 * kBACK_TO_BACK_CALLS, cache.numPages());
    BackToBackWork work{cache, {}, cache.layout().bytesPerPage};
    for (size_t i = 0; i < static_cast<size_t>(kBACK_TO_BACK_CALLS); ++i)
    {
        work.pairs.push_back({ids[2 * i], ids[2 * i + 1]});
    }
    Run const batch = method.make(work, harness);
    // Every method times with the ceiling's scratch allocated, as the ceiling method itself does.
    harness.scratch(work.bytesPerCall * kBACK_TO_BACK_CALLS);
    double const secondsPerCall = harness.timeBatches(state, batch, kBACK_TO_BACK_CALLS);
    double const ceiling = harness.backToBackCeilingSeconds(work.bytesPerCall, kBACK_TO_BACK_CALLS);
    reportTransfer(state, 1, work.bytesPerCall, work.bytesPerCall, secondsPerCall, ceiling);
}

void registerBackToBack(Model const& model, BackToBackMethod const& method)
{
    registerCase(
        caseName("back_to_back", model, method.name, 1),
        [&model, method](benchmark::State& state, Harness& harness)
        { measureBackToBack(state, harness, model, method); },
        kBACK_TO_BACK_BATCHES);
}

//! Times the host side of one rt::copyPages call of `count` scattered pairs: checks and launch, no synchronisation.
void measureEnqueue(benchmark::State& state, Harness& harness, Model const& model, int32_t count)
{
    rt::KVCacheManager const& cache = cacheOf(harness, model);
    std::vector<rt::PageCopy> const pairs = scatteredPairs(count, cache.numPages());
    double const secondsPerCall = harness.timeHostEnqueue(
        state, [&](cudaStream_t stream) { rt::copyPages(cache, pairs.data(), count, stream); }, kENQUEUE_SYNC_EVERY);
    state.counters["pages_per_call"] = count;
    state.counters["us_per_call"] = secondsPerCall * 1e6;
}

void registerEnqueue(Model const& model, int32_t count)
{
    registerCase(
        caseName("enqueue", model, kKVCACHE_HOST.name, count),
        [&model, count](benchmark::State& state, Harness& harness) { measureEnqueue(state, harness, model, count); },
        kENQUEUE_ITERATIONS);
}

void registerAll()
{
    std::vector<Method> const copyMethods{kCEILING, kPER_PAGE, kBATCH_MEMCPY, kKVCACHE_HOST, kKVCACHE_DEVICE};
    std::vector<Method> const resetMethods{kCEILING, kPER_PAGE, kKVCACHE_HOST, kKVCACHE_DEVICE};
    // Grouped by model: each group builds its cache once.
    for (int32_t pairs = 1; pairs <= 256; pairs *= 2)
    {
        for (Method const& method : copyMethods)
        {
            registerTransfer(Operation::kCOPY, uniformModel(), method, pairs);
        }
    }
    for (int32_t pages : {1, 8, 256})
    {
        for (Method const& method : resetMethods)
        {
            registerTransfer(Operation::kRESET, uniformModel(), method, pages);
        }
    }
    for (int32_t pairs : {1, 64, 256})
    {
        registerEnqueue(uniformModel(), pairs);
    }
    for (int32_t pairs : {8, 256})
    {
        for (Method const& method : {kCEILING, kKVCACHE_HOST, kKVCACHE_DEVICE})
        {
            registerTransfer(Operation::kCOPY_RUNS, uniformModel(), method, pairs);
        }
    }
    // How the same 256-pair copy depends on where the pages lie: between scattered pages (copy) and one run.
    for (int32_t runLength : {2, 4, 8, 32})
    {
        for (Method const& method : {kCEILING, kKVCACHE_HOST})
        {
            registerTransfer(Operation::kCOPY_RUNS, uniformModel(), method, 256, runLength);
        }
    }
    for (BackToBackMethod const& method :
        {BackToBackMethod{"ceiling", backToBackCeiling}, BackToBackMethod{"kvcache_host", backToBackHostList},
            BackToBackMethod{"kvcache_device", backToBackDeviceList}})
    {
        registerBackToBack(uniformModel(), method);
    }
    for (Model const* model : {&mixedModel(), &fp8Model(), &groupedFullModel(), &groupedWindowModel()})
    {
        for (int32_t pairs : {8, 256})
        {
            for (Method const& method : copyMethods)
            {
                registerTransfer(Operation::kCOPY, *model, method, pairs);
            }
        }
        for (Method const& method : resetMethods)
        {
            registerTransfer(Operation::kRESET, *model, method, 256);
        }
    }
    // Quantized caches: 8 pages as well as 256 for resets, so that the smoke run (8 pages) checks a reset's scale
    // pages too.
    for (Model const* model : {&fp8PerTokenHeadModel(), &nvfp4Model()})
    {
        for (int32_t pairs : {8, 256})
        {
            for (Method const& method : copyMethods)
            {
                registerTransfer(Operation::kCOPY, *model, method, pairs);
            }
        }
        for (int32_t pages : {8, 256})
        {
            for (Method const& method : resetMethods)
            {
                registerTransfer(Operation::kRESET, *model, method, pages);
            }
        }
    }
}

} // namespace
} // namespace kvcache::bench

int main(int argc, char** argv)
{
    namespace bench = kvcache::bench;
    return bench::runProgram(argc, argv,
        {"kvcache-bench-page-ops", bench::registerAll,
            {{"pool_pages_per_half", std::to_string(bench::kPOOL_PAGES)},
                {"tokens_per_page", std::to_string(kvcache::rt::kTOKENS_PER_PAGE)}}});
}
