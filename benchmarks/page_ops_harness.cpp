#include "page_ops_harness.h"

#include "kvcache/core/errors.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>

#include "support/gpu_availability.h"

namespace kvcache::bench
{

namespace
{

//! Exit status that tells CTest and scripts "skipped": no GPU to measure on (1 instead under KVCACHE_REQUIRE_GPU=1).
constexpr int kEXIT_SKIPPED = 77;
//! Timed calls of a ceiling: odd, so the median is one of them.
constexpr int32_t kCEILING_CALLS = 31;
//! Timed batches of a back-to-back ceiling; each already holds many calls, so fewer are enough.
constexpr int32_t kCEILING_BATCHES = 5;
//! Used unless --benchmark_min_time is on the command line; chosen to keep a full run short (docs/benchmarks.md).
constexpr double kDEFAULT_MIN_TIME_SECONDS = 0.1;
//! Written over a copy's destination before the check, so that a copy that moves nothing cannot pass.
constexpr int kPOISON_BYTE = 0xA5;

std::unique_ptr<Harness> gHarness;
//! Cases that stopped with an error (a failed check or a CUDA error); any makes the process exit 1.
int32_t gFailedCases = 0;
//! False when the command line sets --benchmark_min_time, which then applies to every case as given.
bool gSetMinTime = true;

//! Returns the bytes of the L2 flush buffer: twice the L2, so that nothing a timed call reads is still there.
int64_t flushBytes()
{
    int device = 0;
    int l2Bytes = 0;
    KVCACHE_CUDA_TRY(cudaGetDevice(&device));
    KVCACHE_CUDA_TRY(cudaDeviceGetAttribute(&l2Bytes, cudaDevAttrL2CacheSize, device));
    return std::max<int64_t>(2 * static_cast<int64_t>(l2Bytes), int64_t{1} << 20);
}

//! Returns the median of `samples` (an odd count), reordering them.
double median(std::vector<double>& samples)
{
    auto const middle = samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2);
    std::nth_element(samples.begin(), middle, samples.end());
    return *middle;
}

//! Returns `bytes` pseudo-random bytes (xorshift64) that differ for each `salt`.
std::vector<uint8_t> randomBytes(int64_t bytes, uint64_t salt)
{
    std::vector<uint8_t> data(static_cast<size_t>(bytes));
    uint64_t state = 0x9E3779B97F4A7C15ULL * (salt + 1);
    for (size_t offset = 0; offset < data.size(); offset += sizeof(state))
    {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        std::memcpy(data.data() + offset, &state, std::min(sizeof(state), data.size() - offset));
    }
    return data;
}

//! Returns the indices of the segments of the first and last list entries (once when they are the same entry).
std::vector<size_t> firstAndLastEntries(std::vector<Segment> const& segments, int64_t segmentsPerEntry)
{
    std::vector<size_t> checked;
    int64_t const lastEntry = static_cast<int64_t>(segments.size()) / segmentsPerEntry - 1;
    for (int64_t entry : {int64_t{0}, lastEntry})
    {
        for (int64_t i = 0; i < segmentsPerEntry; ++i)
        {
            checked.push_back(static_cast<size_t>(entry * segmentsPerEntry + i));
        }
        if (lastEntry == 0)
        {
            break;
        }
    }
    return checked;
}

//! Adds the GPU and CUDA versions to the JSON context, so that every result file names what it was measured on.
void addGpuContext()
{
    int device = 0;
    cudaDeviceProp properties{};
    int runtimeVersion = 0;
    int driverVersion = 0;
    KVCACHE_CUDA_TRY(cudaGetDevice(&device));
    KVCACHE_CUDA_TRY(cudaGetDeviceProperties(&properties, device));
    KVCACHE_CUDA_TRY(cudaRuntimeGetVersion(&runtimeVersion));
    KVCACHE_CUDA_TRY(cudaDriverGetVersion(&driverVersion));
    benchmark::AddCustomContext("gpu", properties.name);
    benchmark::AddCustomContext("gpu_l2_bytes", std::to_string(properties.l2CacheSize));
    benchmark::AddCustomContext("cuda_runtime", std::to_string(runtimeVersion));
    benchmark::AddCustomContext("cuda_driver", std::to_string(driverVersion));
}

} // namespace

EventTimer::EventTimer()
{
    KVCACHE_CUDA_TRY(cudaEventCreate(&mStart));
    try
    {
        KVCACHE_CUDA_TRY(cudaEventCreate(&mStop));
    }
    catch (...)
    {
        KVCACHE_CUDA_LOG(cudaEventDestroy(mStart));
        throw;
    }
}

EventTimer::~EventTimer()
{
    KVCACHE_CUDA_LOG(cudaEventDestroy(mStart));
    KVCACHE_CUDA_LOG(cudaEventDestroy(mStop));
}

void EventTimer::start(cudaStream_t stream)
{
    KVCACHE_CUDA_TRY(cudaEventRecord(mStart, stream));
}

double EventTimer::stopSeconds(cudaStream_t stream)
{
    KVCACHE_CUDA_TRY(cudaEventRecord(mStop, stream));
    KVCACHE_CUDA_TRY(cudaEventSynchronize(mStop));
    float milliseconds = 0.0F;
    KVCACHE_CUDA_TRY(cudaEventElapsedTime(&milliseconds, mStart, mStop));
    return static_cast<double>(milliseconds) * 1e-3;
}

Harness::Harness()
    : mFlush(static_cast<size_t>(flushBytes()))
{
}

rt::KVCacheManager const& Harness::cache(std::string const& key, rt::KVCacheConfig const& config)
{
    if (mCache != nullptr && mCacheKey == key)
    {
        return *mCache;
    }
    // The previous cache goes first: two models' caches need not fit at once.
    mCache.reset();
    mStream.synchronize();
    mCache = std::make_unique<rt::KVCacheManager>(config, mStream.get());
    mCacheKey = key;
    return *mCache;
}

double Harness::timeOnce(Run const& run)
{
    KVCACHE_CUDA_TRY(cudaMemsetAsync(mFlush.get(), 0, mFlush.size(), mStream.get()));
    mTimer.start(mStream.get());
    run(mStream.get());
    return mTimer.stopSeconds(mStream.get());
}

double Harness::timeIterations(benchmark::State& state, Run const& run)
{
    for (int32_t i = 0; i < kWARMUP_CALLS; ++i)
    {
        run(mStream.get());
    }
    double total = 0.0;
    for (auto _ : state)
    {
        double const seconds = timeOnce(run);
        state.SetIterationTime(seconds);
        total += seconds;
    }
    return total / static_cast<double>(state.iterations());
}

double Harness::timeBatches(benchmark::State& state, Run const& batch, int32_t callsPerBatch)
{
    timeOnce(batch);
    double total = 0.0;
    for (auto _ : state)
    {
        double const seconds = timeOnce(batch);
        state.SetIterationTime(seconds / callsPerBatch);
        total += seconds;
    }
    return total / static_cast<double>(state.iterations()) / callsPerBatch;
}

Run Harness::ceilingRun(Transfer transfer, int64_t bytes)
{
    auto const [scratchDst, scratchSrc] = scratch(bytes);
    void* const dst = scratchDst;
    void const* const src = scratchSrc;
    auto const size = static_cast<size_t>(bytes);
    if (transfer == Transfer::kFILL)
    {
        return [dst, size](cudaStream_t stream) { KVCACHE_CUDA_TRY(cudaMemsetAsync(dst, kRESET_BYTE, size, stream)); };
    }
    return [dst, src, size](cudaStream_t stream)
    { KVCACHE_CUDA_TRY(cudaMemcpyAsync(dst, src, size, cudaMemcpyDeviceToDevice, stream)); };
}

double Harness::ceilingSeconds(std::string const& family, Transfer transfer, int64_t bytes)
{
    auto const key = std::make_tuple(family, transfer, bytes);
    auto const found = mCeilings.find(key);
    if (found != mCeilings.end())
    {
        return found->second;
    }
    Run const run = ceilingRun(transfer, bytes);
    for (int32_t i = 0; i < kWARMUP_CALLS; ++i)
    {
        run(mStream.get());
    }
    std::vector<double> samples;
    for (int32_t i = 0; i < kCEILING_CALLS; ++i)
    {
        samples.push_back(timeOnce(run));
    }
    double const seconds = median(samples);
    mCeilings.emplace(key, seconds);
    return seconds;
}

Run Harness::backToBackCeilingRun(int64_t bytesPerCall, int32_t calls)
{
    auto const [dst, src] = scratch(bytesPerCall * calls);
    return [dst = dst, src = src, bytesPerCall, calls](cudaStream_t stream)
    {
        for (int32_t i = 0; i < calls; ++i)
        {
            KVCACHE_CUDA_TRY(cudaMemcpyAsync(dst + int64_t{i} * bytesPerCall, src + int64_t{i} * bytesPerCall,
                static_cast<size_t>(bytesPerCall), cudaMemcpyDeviceToDevice, stream));
        }
    };
}

double Harness::backToBackCeilingSeconds(int64_t bytesPerCall, int32_t calls)
{
    auto const key = std::make_pair(bytesPerCall, calls);
    auto const found = mBackToBackCeilings.find(key);
    if (found != mBackToBackCeilings.end())
    {
        return found->second;
    }
    Run const run = backToBackCeilingRun(bytesPerCall, calls);
    run(mStream.get());
    std::vector<double> samples;
    for (int32_t i = 0; i < kCEILING_BATCHES; ++i)
    {
        samples.push_back(timeOnce(run) / calls);
    }
    double const seconds = median(samples);
    mBackToBackCeilings.emplace(key, seconds);
    return seconds;
}

std::pair<char*, char const*> Harness::scratch(int64_t bytes)
{
    if (mScratchDst == nullptr || static_cast<int64_t>(mScratchDst->size()) < bytes)
    {
        // Both old buffers go before the new ones are allocated: the largest ceilings need most of the memory.
        mStream.synchronize();
        mScratchSrc.reset();
        mScratchDst.reset();
        mScratchSrc = std::make_unique<test::DeviceArray<char>>(static_cast<size_t>(bytes));
        mScratchDst = std::make_unique<test::DeviceArray<char>>(static_cast<size_t>(bytes));
    }
    return {mScratchDst->get(), mScratchSrc->get()};
}

bool Harness::firstVisit(std::string const& name)
{
    return mVisited.insert(name).second;
}

void checkMethod(cudaStream_t stream, std::vector<Segment> const& segments, int64_t segmentsPerEntry, Run const& run)
{
    std::vector<size_t> const checked = firstAndLastEntries(segments, segmentsPerEntry);
    std::vector<std::vector<uint8_t>> expected;
    for (size_t index : checked)
    {
        Segment const& segment = segments[index];
        std::vector<uint8_t> data = randomBytes(segment.bytes, index);
        if (segment.src != nullptr)
        {
            KVCACHE_CUDA_TRY(cudaMemsetAsync(segment.dst, kPOISON_BYTE, static_cast<size_t>(segment.bytes), stream));
            test::uploadBytes(segment.src, data, stream);
        }
        else
        {
            test::uploadBytes(segment.dst, data, stream);
            for (size_t b = 0; b < data.size(); ++b)
            {
                data[b] = static_cast<uint8_t>((kRESET_PATTERN >> (8 * (b % 4))) & 0xFFU);
            }
        }
        expected.push_back(std::move(data));
    }
    run(stream);
    for (size_t i = 0; i < checked.size(); ++i)
    {
        Segment const& segment = segments[checked[i]];
        if (test::downloadBytes(segment.dst, segment.bytes, stream) != expected[i])
        {
            auto const index = static_cast<int64_t>(checked[i]);
            throw std::runtime_error("check failed: list entry " + std::to_string(index / segmentsPerEntry) + ", layer "
                + std::to_string(segment.layer) + ", " + test::segmentPartName(segment.part)
                + " holds the wrong bytes");
        }
    }
}

void reportTransfer(benchmark::State& state, int64_t pagesPerCall, int64_t bytesRead, int64_t bytesWritten,
    double secondsPerCall, double ceilingSeconds)
{
    state.counters["pages_per_call"] = static_cast<double>(pagesPerCall);
    state.counters["bytes_read"] = static_cast<double>(bytesRead);
    state.counters["bytes_written"] = static_cast<double>(bytesWritten);
    state.counters["GBps_read_plus_write"] = static_cast<double>(bytesRead + bytesWritten) / secondsPerCall * 1e-9;
    state.counters["pct_of_ceiling"] = 100.0 * ceilingSeconds / secondsPerCall;
    state.counters["us_per_call"] = secondsPerCall * 1e6;
}

void registerCase(std::string const& name, CaseBody body, int64_t fixedIterations)
{
    auto* const bench = benchmark::RegisterBenchmark(name.c_str(),
        [body = std::move(body)](benchmark::State& state)
        {
            try
            {
                body(state, *gHarness);
            }
            catch (MethodUnavailable const& unavailable)
            {
                state.SkipWithError(unavailable.what());
            }
            catch (std::exception const& error)
            {
                ++gFailedCases;
                state.SkipWithError(error.what());
            }
        });
    bench->UseManualTime()->Unit(benchmark::kMicrosecond);
    if (fixedIterations > 0)
    {
        bench->Iterations(fixedIterations);
    }
    else if (gSetMinTime)
    {
        bench->MinTime(kDEFAULT_MIN_TIME_SECONDS);
    }
}

int runProgram(int argc, char** argv, Program const& program)
{
    std::string const reason = test::gpuUnavailableReason();
    if (!reason.empty())
    {
        bool const mustRun = test::gpuRequired();
        std::fprintf(stderr, "%s: no usable GPU (%s); nothing measured%s.\n", program.name, reason.c_str(),
            mustRun ? ", and KVCACHE_REQUIRE_GPU=1 makes that a failure" : "");
        return mustRun ? 1 : kEXIT_SKIPPED;
    }
    // Read before benchmark::Initialize, which removes the flags it knows from argv.
    for (int i = 1; i < argc; ++i)
    {
        gSetMinTime = gSetMinTime && std::strncmp(argv[i], "--benchmark_min_time", 20) != 0;
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv))
    {
        return 1;
    }
    int exitCode = 0;
    try
    {
        addGpuContext();
        for (auto const& [key, value] : program.context)
        {
            benchmark::AddCustomContext(key, value);
        }
        program.registerCases();
        gHarness = std::make_unique<Harness>();
        benchmark::RunSpecifiedBenchmarks();
        if (gFailedCases > 0)
        {
            std::fprintf(stderr, "%s: %d case(s) failed\n", program.name, gFailedCases);
            exitCode = 1;
        }
    }
    catch (std::exception const& error)
    {
        std::fprintf(stderr, "%s: %s\n", program.name, error.what());
        exitCode = 1;
    }
    gHarness.reset();
    benchmark::Shutdown();
    return exitCode;
}

} // namespace kvcache::bench
