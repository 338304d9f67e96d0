#pragma once

// The measurement machinery of the page-operation benchmark: the process's GPU context, stream timing with a cold L2,
// contiguous ceilings measured once, host enqueue timing, the one-off correctness check of each method, counters,
// case registration and the program's entry. The models and cases live in bench_page_ops.cpp; docs/benchmarks.md
// says what is measured and how.

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/cuda_raii.h"
#include "support/page_segments.h"

namespace kvcache::bench
{

//! Warm-up calls before any timing, of a method and of a ceiling alike.
constexpr int32_t kWARMUP_CALLS = 3;
//! cudaMemsetAsync writes a byte value; the reset kernel's 4-byte pattern matches it only for 0.
constexpr uint32_t kRESET_PATTERN = 0;
constexpr int kRESET_BYTE = 0;

//! One call of the method being measured, enqueued on the given stream.
using Run = std::function<void(cudaStream_t)>;

//! Whether a transfer reads a source (a copy) or only writes (a fill, which is what a reset is).
enum class Transfer
{
    kCOPY,
    kFILL,
};

//! One contiguous page-sized transfer of one layer's data page or scale page of one half; `src` is null for a fill.
struct Segment
{
    char* dst;
    char* src;
    int64_t bytes;
    int32_t layer;          //!< for the check's message
    test::SegmentPart part; //!< for the check's message
};

//! Thrown by a case whose method this build cannot run: the case is skipped with the message, not counted as failed.
class MethodUnavailable : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

//! Times stream work between two events (default flags, so timing is on); the events go at scope exit.
class EventTimer
{
public:
    EventTimer();
    ~EventTimer();
    EventTimer(EventTimer const&) = delete;
    EventTimer& operator=(EventTimer const&) = delete;

    //! Records the start event on `stream`.
    void start(cudaStream_t stream);
    //! Records the stop event on `stream`, waits for it and returns the seconds since the start event.
    double stopSeconds(cudaStream_t stream);

private:
    cudaEvent_t mStart{nullptr};
    cudaEvent_t mStop{nullptr};
};

//! The process-wide GPU state: one stream, timing events, an L2 flush buffer, scratch for the ceilings, the cache of
//! the model being measured and the ceilings measured so far.
class Harness
{
public:
    Harness();
    Harness(Harness const&) = delete;
    Harness& operator=(Harness const&) = delete;

    //! Returns the non-blocking stream every case runs on.
    cudaStream_t stream() const noexcept
    {
        return mStream.get();
    }

    //! Returns the cache built from `config`, building it (and dropping the previous one) unless the cache last asked
    //! for had the same `key`. Cases are registered grouped by model, so each model's cache is built once.
    rt::KVCacheManager const& cache(std::string const& key, rt::KVCacheConfig const& config);

    //! Returns the stream time of one `run(stream)`, measured with events after evicting L2.
    double timeOnce(Run const& run);

    //! Runs `run` kWARMUP_CALLS times, then times one call per iteration of `state` (timeOnce); returns the mean
    //! seconds of one call.
    double timeIterations(benchmark::State& state, Run const& run);

    //! Times one `batch` of `callsPerBatch` calls per iteration of `state` (timeOnce), after one discarded batch, and
    //! reports the time per call; returns the mean seconds of one call.
    double timeBatches(benchmark::State& state, Run const& batch, int32_t callsPerBatch);

    //! Times one `enqueue(stream)` per iteration of `state` on the host clock, synchronising the stream outside the
    //! timed region every `syncEvery` calls so that the launch queue never fills; returns the mean seconds of one call.
    //! A template so that no indirect call falls inside the timed region.
    template <typename Enqueue>
    double timeHostEnqueue(benchmark::State& state, Enqueue const& enqueue, int64_t syncEvery)
    {
        int64_t sinceSync = 0;
        double total = 0.0;
        for (auto _ : state)
        {
            if (sinceSync == syncEvery)
            {
                mStream.synchronize();
                sinceSync = 0;
            }
            auto const begin = std::chrono::steady_clock::now();
            enqueue(mStream.get());
            auto const end = std::chrono::steady_clock::now();
            double const seconds = std::chrono::duration<double>(end - begin).count();
            state.SetIterationTime(seconds);
            total += seconds;
            ++sinceSync;
        }
        mStream.synchronize();
        return total / static_cast<double>(state.iterations());
    }

    //! Returns one contiguous cudaMemcpyAsync (copy) or cudaMemsetAsync (fill) of `bytes` between scratch buffers:
    //! the transfer that bounds any page method moving the same bytes.
    Run ceilingRun(Transfer transfer, int64_t bytes);

    //! Returns the median seconds of one ceilingRun(transfer, bytes), measuring it the first time `family` asks for
    //! these bytes. The median keeps one slow call from moving every percentage; keying by family as well compares
    //! each family of cases with a ceiling measured when that family first ran.
    double ceilingSeconds(std::string const& family, Transfer transfer, int64_t bytes);

    //! Returns `calls` contiguous cudaMemcpyAsync calls of `bytesPerCall`, each on its own slice of the scratch
    //! buffers, so that no call finds its bytes in L2.
    Run backToBackCeilingRun(int64_t bytesPerCall, int32_t calls);

    //! Returns the median seconds per call of backToBackCeilingRun(bytesPerCall, calls), measured once.
    double backToBackCeilingSeconds(int64_t bytesPerCall, int32_t calls);

    //! Returns scratch destination and source buffers of at least `bytes` each, growing them when needed.
    std::pair<char*, char const*> scratch(int64_t bytes);

    //! Returns true the first time `name` is passed: checks run once per case, not once per estimation run.
    bool firstVisit(std::string const& name);

private:
    // Declared first, destroyed last: the cache frees its memory stream-ordered on this stream.
    test::CudaStream mStream;
    EventTimer mTimer;
    test::DeviceArray<char> mFlush;
    std::unique_ptr<test::DeviceArray<char>> mScratchSrc;
    std::unique_ptr<test::DeviceArray<char>> mScratchDst;
    std::string mCacheKey;
    std::unique_ptr<rt::KVCacheManager> mCache;
    std::map<std::tuple<std::string, Transfer, int64_t>, double> mCeilings;
    std::map<std::pair<int64_t, int32_t>, double> mBackToBackCeilings;
    std::set<std::string> mVisited;
};

//! Runs `run` once on poisoned pages and throws unless the first and last list entries were moved (copy) or filled
//! with kRESET_PATTERN (reset) in every layer and half, scale pages included. `segments` holds `segmentsPerEntry`
//! segments per list entry, each with its own random bytes (K, V and their scales differ), in test::pageSegments'
//! order. Catches a method that measures nothing, and one that moves data pages but not their scales.
void checkMethod(cudaStream_t stream, std::vector<Segment> const& segments, int64_t segmentsPerEntry, Run const& run);

//! Reports a case's counters (docs/benchmarks.md, "Output columns") from its mean seconds per call and the ceiling's.
void reportTransfer(benchmark::State& state, int64_t pagesPerCall, int64_t bytesRead, int64_t bytesWritten,
    double secondsPerCall, double ceilingSeconds);

//! What one case does, given the process's harness; throws on a CUDA error or a failed check.
using CaseBody = std::function<void(benchmark::State& state, Harness& harness)>;

//! Registers `body` as the case `name`, timed manually in microseconds. With `fixedIterations` > 0 it runs exactly
//! that many iterations; otherwise a default minimum time applies unless the command line sets one. A case that
//! throws is skipped with the error and makes the program exit 1.
void registerCase(std::string const& name, CaseBody body, int64_t fixedIterations = 0);

//! What a benchmark program measures.
struct Program
{
    char const* name;                                         //!< for messages
    void (*registerCases)();                                  //!< registers every case (registerCase)
    std::vector<std::pair<std::string, std::string>> context; //!< entries added to the JSON context
};

//! The program's main: exits 77 (CTest's "skipped") without a usable GPU, or 1 when KVCACHE_REQUIRE_GPU=1; otherwise
//! registers and runs the cases selected on the command line and exits 1 when any failed.
int runProgram(int argc, char** argv, Program const& program);

} // namespace kvcache::bench
