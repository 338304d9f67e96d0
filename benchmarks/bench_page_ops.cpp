// Page copy and reset throughput: kvcache's kernels against cudaMemcpyAsync / cudaMemsetAsync baselines and the
// contiguous-transfer ceiling, for the same bytes, in one process. See docs/benchmarks.md.

#include "kvcache/errors.h"
#include "kvcache/kv_cache_manager.h"
#include "kvcache/page_ops.h"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace
{

namespace rt = kvcache::rt;

//! Exit status that tells CTest and scripts "skipped": no GPU to measure on (1 instead under KVCACHE_REQUIRE_GPU=1).
constexpr int kEXIT_SKIPPED = 77;
constexpr int32_t kNUM_LAYERS = 32;
//! The uniform models' layer shape (8 KV heads of 128), the first of the mixed model's four.
constexpr rt::KVLayerConfig kUNIFORM_LAYER{8, 128};
//! Pages per half and layer: three times the largest list, so source and destination sets drawn from it are
//! disjoint and scattered (the runtime's pool has many retained pages).
constexpr int32_t kPOOL_PAGES = 768;
constexpr int32_t kWARMUP_CALLS = 3;
constexpr int32_t kCEILING_CALLS = 31;
constexpr int32_t kCEILING_BATCHES = 5;
//! Used unless --benchmark_min_time is on the command line; keeps the whole run within about a minute.
constexpr double kDEFAULT_MIN_TIME_SECONDS = 0.1;
constexpr int64_t kENQUEUE_ITERATIONS = 2000;
constexpr int64_t kENQUEUE_SYNC_EVERY = 32;
//! Single-pair calls in one back-to-back batch: every call on its own pages (2 * 384 = kPOOL_PAGES).
constexpr int32_t kBACK_TO_BACK_CALLS = kPOOL_PAGES / 2;
//! Timed batches of a back-to-back case, whatever --benchmark_min_time says. Each batch reports its time per call,
//! so a minimum time would be met only after about kBACK_TO_BACK_CALLS times as long.
constexpr int64_t kBACK_TO_BACK_BATCHES = 30;
//! cudaMemsetAsync writes a byte value; the reset kernel's 4-byte pattern matches it only for 0.
constexpr uint32_t kRESET_PATTERN = 0;
constexpr int kRESET_BYTE = 0;
constexpr int kPOISON_BYTE = 0xA5;
constexpr uint64_t kPAGE_SEED = 20240611;

//! What a case does to its pages.
enum class Operation
{
    kCOPY,
    kRESET,
    kENQUEUE,
    //! Copies of pages laid out in runs: sources [0, n), destinations [n, 2n), as a freshly forked sequence has. With a
    //! run length, the pool is cut into runs of that many adjacent pages, taken in a pseudo-random order.
    kCOPY_RUNS,
    //! Single-pair copies launched back to back, each on pages no earlier call touched (nothing left in L2).
    kBACK_TO_BACK,
};

//! How the bytes are moved.
enum class Method
{
    kCEILING,
    kPER_PAGE,
    kBATCH,
    kKVCACHE_HOST,
    kKVCACHE_DEVICE,
};

//! A model's attention layers and cache element type.
struct Model
{
    char const* name;
    rt::DataType type;
    std::vector<rt::KVLayerConfig> layers;
};

//! One benchmark: operation, model, method and pages per call (pairs for copies).
struct Case
{
    Operation operation;
    Model const* model;
    Method method;
    int32_t pages;
    //! kCOPY_RUNS only: pages in one run, 0 for a single run of all pages.
    int32_t runLength = 0;
};

//! One contiguous page-sized transfer of one layer and half; `src` is null for resets.
struct Segment
{
    char* dst;
    char* src;
    int64_t bytes;
};

Model const& uniformModel()
{
    static Model const model{
        "fp16_uniform", rt::DataType::kHALF, std::vector<rt::KVLayerConfig>(kNUM_LAYERS, kUNIFORM_LAYER)};
    return model;
}

Model const& fp8Model()
{
    static Model const model{
        "fp8_uniform", rt::DataType::kFP8_E4M3, std::vector<rt::KVLayerConfig>(kNUM_LAYERS, kUNIFORM_LAYER)};
    return model;
}

Model const& mixedModel()
{
    static Model const model = []
    {
        std::vector<rt::KVLayerConfig> const shapes{kUNIFORM_LAYER, {4, 64}, {2, 256}, {1, 80}};
        Model result{"fp16_mixed", rt::DataType::kHALF, {}};
        for (int32_t i = 0; i < kNUM_LAYERS; ++i)
        {
            result.layers.push_back(shapes[static_cast<size_t>(i) % shapes.size()]);
        }
        return result;
    }();
    return model;
}

char const* operationName(Operation operation)
{
    switch (operation)
    {
    case Operation::kCOPY: return "copy";
    case Operation::kRESET: return "reset";
    case Operation::kENQUEUE: return "enqueue";
    case Operation::kCOPY_RUNS: return "copy_runs";
    case Operation::kBACK_TO_BACK: return "back_to_back";
    }
    return "unknown";
}

char const* methodName(Method method)
{
    switch (method)
    {
    case Method::kCEILING: return "ceiling";
    case Method::kPER_PAGE: return "per_page";
    case Method::kBATCH: return "batch_memcpy";
    case Method::kKVCACHE_HOST: return "kvcache_host";
    case Method::kKVCACHE_DEVICE: return "kvcache_device";
    }
    return "unknown";
}

std::string caseName(Case const& c)
{
    std::string const operation = c.runLength > 0
        ? std::string(operationName(c.operation)) + "_of_" + std::to_string(c.runLength)
        : std::string(operationName(c.operation));
    return operation + "/" + c.model->name + "/" + methodName(c.method) + "/" + std::to_string(c.pages);
}

//! Owns a cudaMalloc allocation.
class DeviceBuffer
{
public:
    DeviceBuffer() noexcept = default;
    explicit DeviceBuffer(int64_t bytes)
        : mBytes(bytes)
    {
        KVCACHE_CUDA_TRY(cudaMalloc(&mData, static_cast<size_t>(bytes)));
    }
    ~DeviceBuffer() noexcept
    {
        if (mData != nullptr)
        {
            KVCACHE_CUDA_LOG(cudaFree(mData));
        }
    }
    DeviceBuffer(DeviceBuffer const&) = delete;
    DeviceBuffer& operator=(DeviceBuffer const&) = delete;
    DeviceBuffer(DeviceBuffer&& other) noexcept
        : mData(std::exchange(other.mData, nullptr))
        , mBytes(std::exchange(other.mBytes, 0))
    {
    }
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept
    {
        std::swap(mData, other.mData);
        std::swap(mBytes, other.mBytes);
        return *this;
    }

    //! Returns the device pointer (null when empty).
    void* data() const noexcept
    {
        return mData;
    }
    //! Returns the allocation's size.
    int64_t bytes() const noexcept
    {
        return mBytes;
    }

private:
    void* mData{nullptr};
    int64_t mBytes{0};
};

//! The process-wide GPU state: one stream, timing events, an L2 flush buffer, scratch for the ceilings, the cache
//! of the model being measured and the ceilings measured so far.
class Harness
{
public:
    Harness()
    {
        KVCACHE_CUDA_TRY(cudaStreamCreateWithFlags(&mStream, cudaStreamNonBlocking));
        KVCACHE_CUDA_TRY(cudaEventCreate(&mStart));
        KVCACHE_CUDA_TRY(cudaEventCreate(&mStop));
        int device = 0;
        int l2Bytes = 0;
        KVCACHE_CUDA_TRY(cudaGetDevice(&device));
        KVCACHE_CUDA_TRY(cudaDeviceGetAttribute(&l2Bytes, cudaDevAttrL2CacheSize, device));
        mFlush = DeviceBuffer(std::max<int64_t>(2 * static_cast<int64_t>(l2Bytes), int64_t{1} << 20));
    }
    ~Harness() noexcept
    {
        mCache.reset();
        KVCACHE_CUDA_LOG(cudaStreamSynchronize(mStream));
        KVCACHE_CUDA_LOG(cudaEventDestroy(mStart));
        KVCACHE_CUDA_LOG(cudaEventDestroy(mStop));
        KVCACHE_CUDA_LOG(cudaStreamDestroy(mStream));
    }
    Harness(Harness const&) = delete;
    Harness& operator=(Harness const&) = delete;

    //! Returns the non-blocking stream every case runs on.
    cudaStream_t stream() const noexcept
    {
        return mStream;
    }

    //! Returns the cache of `model`, building it (and dropping the previous model's) on first use.
    rt::KVCacheManager const& cache(Model const& model)
    {
        if (mCache != nullptr && mModelName == model.name)
        {
            return *mCache;
        }
        mCache.reset();
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(mStream));
        rt::KVCacheConfig config;
        config.numAttentionLayers = static_cast<int32_t>(model.layers.size());
        config.maxBatchSize = 1;
        config.maxSequenceLength = rt::kTOKENS_PER_PAGE;
        config.layerConfigs = model.layers;
        config.kvCacheType = model.type;
        config.numPages = kPOOL_PAGES;
        mCache = std::make_unique<rt::KVCacheManager>(config, mStream);
        mModelName = model.name;
        return *mCache;
    }

    //! Returns the stream time of one `run(stream)`, measured with events after evicting L2.
    double timeOnce(std::function<void(cudaStream_t)> const& run)
    {
        KVCACHE_CUDA_TRY(cudaMemsetAsync(mFlush.data(), 0, static_cast<size_t>(mFlush.bytes()), mStream));
        KVCACHE_CUDA_TRY(cudaEventRecord(mStart, mStream));
        run(mStream);
        KVCACHE_CUDA_TRY(cudaEventRecord(mStop, mStream));
        KVCACHE_CUDA_TRY(cudaEventSynchronize(mStop));
        float milliseconds = 0.0F;
        KVCACHE_CUDA_TRY(cudaEventElapsedTime(&milliseconds, mStart, mStop));
        return static_cast<double>(milliseconds) * 1e-3;
    }

    //! Returns the median seconds of one contiguous cudaMemcpyAsync (copy) or cudaMemsetAsync (reset) of `bytes`,
    //! measuring it the first time it is asked for. The median keeps one slow call from moving every percentage.
    double ceilingSeconds(Operation operation, int64_t bytes)
    {
        auto const key = std::make_pair(operation, bytes);
        auto const found = mCeilings.find(key);
        if (found != mCeilings.end())
        {
            return found->second;
        }
        std::function<void(cudaStream_t)> const run = ceilingRun(operation, bytes);
        for (int32_t i = 0; i < kWARMUP_CALLS; ++i)
        {
            run(mStream);
        }
        std::vector<double> samples;
        for (int32_t i = 0; i < kCEILING_CALLS; ++i)
        {
            samples.push_back(timeOnce(run));
        }
        std::nth_element(samples.begin(), samples.begin() + kCEILING_CALLS / 2, samples.end());
        double const seconds = samples[kCEILING_CALLS / 2];
        mCeilings.emplace(key, seconds);
        return seconds;
    }

    //! Returns scratch destination and source buffers of at least `bytes` each, growing them when needed.
    std::pair<char*, char const*> scratch(int64_t bytes)
    {
        if (mScratchDst.bytes() < bytes)
        {
            KVCACHE_CUDA_TRY(cudaStreamSynchronize(mStream));
            mScratchSrc = DeviceBuffer();
            mScratchDst = DeviceBuffer();
            mScratchSrc = DeviceBuffer(bytes);
            mScratchDst = DeviceBuffer(bytes);
        }
        return {static_cast<char*>(mScratchDst.data()), static_cast<char const*>(mScratchSrc.data())};
    }

    //! Returns the median seconds per call of kBACK_TO_BACK_CALLS contiguous cudaMemcpyAsync calls of `bytes`, each
    //! on its own slice of the scratch buffers, measured once.
    double backToBackCeilingSeconds(int64_t bytes)
    {
        auto const key = std::make_pair(Operation::kBACK_TO_BACK, bytes);
        auto const found = mCeilings.find(key);
        if (found != mCeilings.end())
        {
            return found->second;
        }
        auto const [dst, src] = scratch(bytes * kBACK_TO_BACK_CALLS);
        auto const run = [dst = dst, src = src, bytes](cudaStream_t stream)
        {
            for (int32_t i = 0; i < kBACK_TO_BACK_CALLS; ++i)
            {
                KVCACHE_CUDA_TRY(cudaMemcpyAsync(dst + int64_t{i} * bytes, src + int64_t{i} * bytes,
                    static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
            }
        };
        run(mStream);
        std::vector<double> samples;
        for (int32_t i = 0; i < kCEILING_BATCHES; ++i)
        {
            samples.push_back(timeOnce(run) / kBACK_TO_BACK_CALLS);
        }
        std::nth_element(samples.begin(), samples.begin() + kCEILING_BATCHES / 2, samples.end());
        double const seconds = samples[kCEILING_BATCHES / 2];
        mCeilings.emplace(key, seconds);
        return seconds;
    }

    //! Returns the contiguous transfer of `bytes` that bounds `operation`, on scratch buffers.
    std::function<void(cudaStream_t)> ceilingRun(Operation operation, int64_t bytes)
    {
        auto const [scratchDst, scratchSrc] = scratch(bytes);
        void* const dst = scratchDst;
        void const* const src = scratchSrc;
        auto const size = static_cast<size_t>(bytes);
        if (operation == Operation::kRESET)
        {
            return [dst, size](cudaStream_t stream)
            { KVCACHE_CUDA_TRY(cudaMemsetAsync(dst, kRESET_BYTE, size, stream)); };
        }
        return [dst, src, size](cudaStream_t stream)
        { KVCACHE_CUDA_TRY(cudaMemcpyAsync(dst, src, size, cudaMemcpyDeviceToDevice, stream)); };
    }

    //! Returns true the first time `name` is passed: checks run once per case, not once per estimation run.
    bool firstVisit(std::string const& name)
    {
        return mVisited.insert(name).second;
    }

private:
    cudaStream_t mStream{nullptr};
    cudaEvent_t mStart{nullptr};
    cudaEvent_t mStop{nullptr};
    DeviceBuffer mFlush;
    DeviceBuffer mScratchSrc;
    DeviceBuffer mScratchDst;
    std::string mModelName;
    std::unique_ptr<rt::KVCacheManager> mCache;
    std::map<std::pair<Operation, int64_t>, double> mCeilings;
    std::set<std::string> mVisited;
};

std::unique_ptr<Harness> gHarness;
//! Cases that stopped with an error (a failed check or a CUDA error); any makes the process exit 1.
int32_t gFailedCases = 0;

//! Returns `count` distinct page ids in [0, numPages), in a fixed pseudo-random order.
std::vector<int32_t> scatteredPages(int32_t count, int32_t numPages)
{
    std::vector<int32_t> ids(static_cast<size_t>(numPages));
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937_64 generator(kPAGE_SEED + static_cast<uint64_t>(count));
    std::shuffle(ids.begin(), ids.end(), generator);
    ids.resize(static_cast<size_t>(count));
    return ids;
}

//! Returns `count` pairs whose sources, and whose destinations, are runs of `runLength` adjacent pages: the pool is cut
//! into runs, taken in a fixed pseudo-random order, sources from the first runs and destinations from the next.
std::vector<rt::PageCopy> pairsInRuns(int32_t count, int32_t runLength, int32_t numPages)
{
    int32_t const runsPerSide = (count + runLength - 1) / runLength;
    if (2 * runsPerSide * runLength > numPages)
    {
        throw std::runtime_error(
            "the pool is too small for " + std::to_string(count) + " pairs in runs of " + std::to_string(runLength));
    }
    std::vector<int32_t> const runs = scatteredPages(2 * runsPerSide, numPages / runLength);
    std::vector<rt::PageCopy> pairs;
    for (int32_t i = 0; i < count; ++i)
    {
        int32_t const run = i / runLength;
        int32_t const offset = i % runLength;
        pairs.push_back({runs[static_cast<size_t>(run)] * runLength + offset,
            runs[static_cast<size_t>(runsPerSide + run)] * runLength + offset});
    }
    return pairs;
}

//! Returns the first byte of page `page` of `layer`'s K (half 0) or V (half 1) pool.
char* pagePointer(rt::KVCacheManager const& cache, int32_t layer, int32_t half, int32_t page)
{
    void* const base = half == 0 ? cache.kPoolPtr(layer) : cache.vPoolPtr(layer);
    int64_t const pageBytes = cache.getLayout().layers[static_cast<size_t>(layer)].pageBytes;
    return static_cast<char*>(base) + static_cast<int64_t>(page) * pageBytes;
}

//! Returns every page-sized transfer of the list, in list order, then layer, then half (K before V).
std::vector<Segment> segmentsOf(
    rt::KVCacheManager const& cache, std::vector<rt::PageCopy> const& pairs, std::vector<int32_t> const& resetPages)
{
    std::vector<Segment> segments;
    bool const isCopy = !pairs.empty();
    size_t const count = isCopy ? pairs.size() : resetPages.size();
    for (size_t i = 0; i < count; ++i)
    {
        for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
        {
            int64_t const bytes = cache.getLayout().layers[static_cast<size_t>(layer)].pageBytes;
            for (int32_t half = 0; half < 2; ++half)
            {
                if (isCopy)
                {
                    segments.push_back({pagePointer(cache, layer, half, pairs[i].dst),
                        pagePointer(cache, layer, half, pairs[i].src), bytes});
                }
                else
                {
                    segments.push_back({pagePointer(cache, layer, half, resetPages[i]), nullptr, bytes});
                }
            }
        }
    }
    return segments;
}

//! Returns `bytes` pseudo-random bytes (xorshift64) that differ for each `salt`.
std::vector<unsigned char> randomBytes(int64_t bytes, uint64_t salt)
{
    std::vector<unsigned char> data(static_cast<size_t>(bytes));
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

//! Runs `run` once on poisoned pages and throws unless the first and last entries of the list were moved (copy)
//! or filled with the reset pattern (reset) in every layer and half. Catches a method that measures nothing.
void checkMethod(cudaStream_t stream, std::vector<Segment> const& segments, int64_t segmentsPerEntry,
    std::function<void(cudaStream_t)> const& run)
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
    std::vector<std::vector<unsigned char>> expected;
    for (size_t index : checked)
    {
        Segment const& segment = segments[index];
        auto const size = static_cast<size_t>(segment.bytes);
        std::vector<unsigned char> data = randomBytes(segment.bytes, index);
        if (segment.src != nullptr)
        {
            KVCACHE_CUDA_TRY(cudaMemsetAsync(segment.dst, kPOISON_BYTE, size, stream));
            KVCACHE_CUDA_TRY(cudaMemcpyAsync(segment.src, data.data(), size, cudaMemcpyHostToDevice, stream));
        }
        else
        {
            KVCACHE_CUDA_TRY(cudaMemcpyAsync(segment.dst, data.data(), size, cudaMemcpyHostToDevice, stream));
            for (size_t b = 0; b < data.size(); ++b)
            {
                data[b] = static_cast<unsigned char>((kRESET_PATTERN >> (8 * (b % 4))) & 0xFFU);
            }
        }
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
        expected.push_back(std::move(data));
    }
    run(stream);
    std::vector<unsigned char> actual;
    for (size_t i = 0; i < checked.size(); ++i)
    {
        Segment const& segment = segments[checked[i]];
        actual.assign(static_cast<size_t>(segment.bytes), 0);
        KVCACHE_CUDA_TRY(cudaMemcpyAsync(actual.data(), segment.dst, actual.size(), cudaMemcpyDeviceToHost, stream));
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
        if (actual != expected[i])
        {
            auto const index = static_cast<int64_t>(checked[i]);
            throw std::runtime_error("check failed: list entry " + std::to_string(index / segmentsPerEntry) + ", layer "
                + std::to_string(index % segmentsPerEntry / 2) + (index % 2 == 0 ? ", K" : ", V")
                + " holds the wrong bytes");
        }
    }
}

//! Uploads `items` to a new device buffer.
template <typename T>
DeviceBuffer upload(std::vector<T> const& items, cudaStream_t stream)
{
    DeviceBuffer buffer(static_cast<int64_t>(items.size() * sizeof(T)));
    KVCACHE_CUDA_TRY(
        cudaMemcpyAsync(buffer.data(), items.data(), items.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
    return buffer;
}

//! Host-side arguments of one cudaMemcpyBatchAsync over every segment.
struct BatchArguments
{
    std::vector<void*> dsts;
    std::vector<void const*> srcs;
    std::vector<size_t> sizes;
    cudaMemcpyAttributes attributes{};
    size_t attributeIndex = 0;
};

//! Measures kBACK_TO_BACK: batches of kBACK_TO_BACK_CALLS single-pair calls, each on pages of its own, launched
//! directly (no graph) and timed with events around the batch. The ceiling is the same number of contiguous
//! cudaMemcpyAsync calls of the same bytes, each on its own slice of the scratch buffers.
void runBackToBack(benchmark::State& state, Case const& c, rt::KVCacheManager const& cache, int64_t bytesPerCall)
{
    Harness& harness = *gHarness;
    cudaStream_t const stream = harness.stream();
    std::vector<int32_t> const ids = scatteredPages(2 * kBACK_TO_BACK_CALLS, cache.numPages());
    DeviceBuffer devicePairs;
    std::vector<rt::PageCopy> pairs;
    for (int32_t i = 0; i < kBACK_TO_BACK_CALLS; ++i)
    {
        pairs.push_back({ids[static_cast<size_t>(2 * i)], ids[static_cast<size_t>(2 * i + 1)]});
    }
    auto const* list = static_cast<rt::PageCopy const*>(nullptr);
    if (c.method == Method::kKVCACHE_DEVICE)
    {
        devicePairs = upload(pairs, stream);
        list = static_cast<rt::PageCopy const*>(devicePairs.data());
    }
    auto [scratchDst, scratchSrc] = harness.scratch(bytesPerCall * kBACK_TO_BACK_CALLS);
    auto const size = static_cast<size_t>(bytesPerCall);
    auto const call = [&](int32_t i)
    {
        switch (c.method)
        {
        case Method::kCEILING:
            KVCACHE_CUDA_TRY(cudaMemcpyAsync(scratchDst + int64_t{i} * bytesPerCall,
                scratchSrc + int64_t{i} * bytesPerCall, size, cudaMemcpyDeviceToDevice, stream));
            break;
        case Method::kKVCACHE_HOST: rt::copyPages(cache, &pairs[static_cast<size_t>(i)], 1, stream); break;
        case Method::kKVCACHE_DEVICE: rt::copyPagesDevice(cache, list + i, 1, nullptr, stream); break;
        default: throw std::runtime_error("back_to_back measures ceiling, kvcache_host and kvcache_device only");
        }
    };
    auto const batchSeconds = [&]
    {
        return harness.timeOnce(
            [&](cudaStream_t)
            {
                for (int32_t i = 0; i < kBACK_TO_BACK_CALLS; ++i)
                {
                    call(i);
                }
            });
    };
    batchSeconds();
    double total = 0.0;
    for (auto _ : state)
    {
        double const seconds = batchSeconds();
        state.SetIterationTime(seconds / kBACK_TO_BACK_CALLS);
        total += seconds;
    }
    double const secondsPerCall = total / static_cast<double>(state.iterations()) / kBACK_TO_BACK_CALLS;
    double const ceiling = harness.backToBackCeilingSeconds(bytesPerCall);
    state.counters["pages_per_call"] = 1;
    state.counters["bytes_read"] = static_cast<double>(bytesPerCall);
    state.counters["bytes_written"] = static_cast<double>(bytesPerCall);
    state.counters["GBps_read_plus_write"] = 2.0 * static_cast<double>(bytesPerCall) / secondsPerCall * 1e-9;
    state.counters["pct_of_ceiling"] = 100.0 * ceiling / secondsPerCall;
    state.counters["us_per_call"] = secondsPerCall * 1e6;
}

//! Measures one case and reports its counters; throws on a CUDA error or a failed check.
void runCase(benchmark::State& state, Case const& c)
{
    Harness& harness = *gHarness;
    cudaStream_t const stream = harness.stream();
    rt::KVCacheManager const& cache = harness.cache(*c.model);

    std::vector<rt::PageCopy> pairs;
    std::vector<int32_t> resetPages;
    if (c.operation == Operation::kRESET)
    {
        resetPages = scatteredPages(c.pages, cache.numPages());
    }
    else if (c.operation == Operation::kCOPY_RUNS && c.runLength > 0)
    {
        pairs = pairsInRuns(c.pages, c.runLength, cache.numPages());
    }
    else if (c.operation == Operation::kCOPY_RUNS)
    {
        for (int32_t i = 0; i < c.pages; ++i)
        {
            pairs.push_back({i, c.pages + i});
        }
    }
    else
    {
        std::vector<int32_t> const ids = scatteredPages(2 * c.pages, cache.numPages());
        for (size_t i = 0; i < static_cast<size_t>(c.pages); ++i)
        {
            pairs.push_back({ids[i], ids[i + static_cast<size_t>(c.pages)]});
        }
    }
    std::vector<Segment> const segments = segmentsOf(cache, pairs, resetPages);
    int64_t bytesWritten = 0;
    for (Segment const& segment : segments)
    {
        bytesWritten += segment.bytes;
    }
    int64_t const bytesRead = c.operation == Operation::kRESET ? 0 : bytesWritten;

    if (c.operation == Operation::kENQUEUE)
    {
        int64_t sinceSync = 0;
        double total = 0.0;
        for (auto _ : state)
        {
            if (sinceSync == kENQUEUE_SYNC_EVERY)
            {
                KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
                sinceSync = 0;
            }
            auto const begin = std::chrono::steady_clock::now();
            rt::copyPages(cache, pairs.data(), c.pages, stream);
            auto const end = std::chrono::steady_clock::now();
            double const seconds = std::chrono::duration<double>(end - begin).count();
            state.SetIterationTime(seconds);
            total += seconds;
            ++sinceSync;
        }
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
        state.counters["pages_per_call"] = c.pages;
        state.counters["us_per_call"] = total / static_cast<double>(state.iterations()) * 1e6;
        return;
    }

    if (c.operation == Operation::kBACK_TO_BACK)
    {
        runBackToBack(state, c, cache, bytesWritten);
        return;
    }

    DeviceBuffer devicePairs;
    DeviceBuffer devicePages;
    BatchArguments batch;
    std::function<void(cudaStream_t)> run;
    switch (c.method)
    {
    case Method::kCEILING: run = harness.ceilingRun(c.operation, bytesWritten); break;
    case Method::kPER_PAGE:
        run = [&segments](cudaStream_t s)
        {
            for (Segment const& segment : segments)
            {
                auto const size = static_cast<size_t>(segment.bytes);
                if (segment.src != nullptr)
                {
                    KVCACHE_CUDA_TRY(cudaMemcpyAsync(segment.dst, segment.src, size, cudaMemcpyDeviceToDevice, s));
                }
                else
                {
                    KVCACHE_CUDA_TRY(cudaMemsetAsync(segment.dst, kRESET_BYTE, size, s));
                }
            }
        };
        break;
    case Method::kBATCH:
#if CUDART_VERSION >= 13000
        for (Segment const& segment : segments)
        {
            batch.dsts.push_back(segment.dst);
            batch.srcs.push_back(segment.src);
            batch.sizes.push_back(static_cast<size_t>(segment.bytes));
        }
        batch.attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        run = [&batch](cudaStream_t s)
        {
            KVCACHE_CUDA_TRY(cudaMemcpyBatchAsync(batch.dsts.data(), batch.srcs.data(), batch.sizes.data(),
                batch.sizes.size(), &batch.attributes, &batch.attributeIndex, 1, s));
        };
        break;
#else
        state.SkipWithError("cudaMemcpyBatchAsync with this signature needs CUDA 13");
        return;
#endif
    case Method::kKVCACHE_HOST:
        if (c.operation == Operation::kRESET)
        {
            run = [&cache, &resetPages](cudaStream_t s)
            { rt::resetPages(cache, resetPages.data(), static_cast<int32_t>(resetPages.size()), s, kRESET_PATTERN); };
        }
        else
        {
            run = [&cache, &pairs](cudaStream_t s)
            { rt::copyPages(cache, pairs.data(), static_cast<int32_t>(pairs.size()), s); };
        }
        break;
    case Method::kKVCACHE_DEVICE:
        if (c.operation == Operation::kRESET)
        {
            devicePages = upload(resetPages, stream);
            auto const* list = static_cast<int32_t const*>(devicePages.data());
            run = [&cache, list, count = c.pages](cudaStream_t s)
            { rt::resetPagesDevice(cache, list, count, nullptr, s, kRESET_PATTERN); };
        }
        else
        {
            devicePairs = upload(pairs, stream);
            auto const* list = static_cast<rt::PageCopy const*>(devicePairs.data());
            run = [&cache, list, count = c.pages](cudaStream_t s)
            { rt::copyPagesDevice(cache, list, count, nullptr, s); };
        }
        break;
    }

    std::string const name = caseName(c);
    if (c.method != Method::kCEILING && harness.firstVisit(name))
    {
        checkMethod(stream, segments, 2 * static_cast<int64_t>(cache.numLayers()), run);
    }
    double const ceiling = harness.ceilingSeconds(c.operation, bytesWritten);
    for (int32_t i = 0; i < kWARMUP_CALLS; ++i)
    {
        run(stream);
    }
    double total = 0.0;
    for (auto _ : state)
    {
        double const seconds = harness.timeOnce(run);
        state.SetIterationTime(seconds);
        total += seconds;
    }
    double const secondsPerCall = total / static_cast<double>(state.iterations());
    state.counters["pages_per_call"] = c.pages;
    if (c.runLength > 0)
    {
        state.counters["run_pages"] = c.runLength;
    }
    state.counters["bytes_read"] = static_cast<double>(bytesRead);
    state.counters["bytes_written"] = static_cast<double>(bytesWritten);
    state.counters["GBps_read_plus_write"] = static_cast<double>(bytesRead + bytesWritten) / secondsPerCall * 1e-9;
    state.counters["pct_of_ceiling"] = 100.0 * ceiling / secondsPerCall;
    state.counters["us_per_call"] = secondsPerCall * 1e6;
}

void registerCase(Case const& c, bool setMinTime)
{
    auto* const bench = benchmark::RegisterBenchmark(caseName(c).c_str(),
        [c](benchmark::State& state)
        {
            try
            {
                runCase(state, c);
            }
            catch (std::exception const& error)
            {
                ++gFailedCases;
                state.SkipWithError(error.what());
            }
        });
    bench->UseManualTime()->Unit(benchmark::kMicrosecond);
    if (c.operation == Operation::kENQUEUE)
    {
        bench->Iterations(kENQUEUE_ITERATIONS);
    }
    else if (c.operation == Operation::kBACK_TO_BACK)
    {
        bench->Iterations(kBACK_TO_BACK_BATCHES);
    }
    else if (setMinTime)
    {
        bench->MinTime(kDEFAULT_MIN_TIME_SECONDS);
    }
}

void registerAll(bool setMinTime)
{
    std::vector<Method> const copyMethods{
        Method::kCEILING, Method::kPER_PAGE, Method::kBATCH, Method::kKVCACHE_HOST, Method::kKVCACHE_DEVICE};
    std::vector<Method> const resetMethods{
        Method::kCEILING, Method::kPER_PAGE, Method::kKVCACHE_HOST, Method::kKVCACHE_DEVICE};
    // Grouped by model: each group builds its cache once.
    for (int32_t pairs = 1; pairs <= 256; pairs *= 2)
    {
        for (Method method : copyMethods)
        {
            registerCase({Operation::kCOPY, &uniformModel(), method, pairs}, setMinTime);
        }
    }
    for (int32_t pages : {1, 8, 256})
    {
        for (Method method : resetMethods)
        {
            registerCase({Operation::kRESET, &uniformModel(), method, pages}, setMinTime);
        }
    }
    for (int32_t pairs : {1, 64, 256})
    {
        registerCase({Operation::kENQUEUE, &uniformModel(), Method::kKVCACHE_HOST, pairs}, setMinTime);
    }
    for (int32_t pairs : {8, 256})
    {
        for (Method method : {Method::kCEILING, Method::kKVCACHE_HOST, Method::kKVCACHE_DEVICE})
        {
            registerCase({Operation::kCOPY_RUNS, &uniformModel(), method, pairs}, setMinTime);
        }
    }
    // How the same 256-pair copy depends on where the pages lie: between scattered pages (copy) and one run.
    for (int32_t runLength : {2, 4, 8, 32})
    {
        for (Method method : {Method::kCEILING, Method::kKVCACHE_HOST})
        {
            registerCase({Operation::kCOPY_RUNS, &uniformModel(), method, 256, runLength}, setMinTime);
        }
    }
    for (Method method : {Method::kCEILING, Method::kKVCACHE_HOST, Method::kKVCACHE_DEVICE})
    {
        registerCase({Operation::kBACK_TO_BACK, &uniformModel(), method, 1}, setMinTime);
    }
    for (Model const* model : {&mixedModel(), &fp8Model()})
    {
        for (int32_t pairs : {8, 256})
        {
            for (Method method : copyMethods)
            {
                registerCase({Operation::kCOPY, model, method, pairs}, setMinTime);
            }
        }
        for (Method method : resetMethods)
        {
            registerCase({Operation::kRESET, model, method, 256}, setMinTime);
        }
    }
}

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
    benchmark::AddCustomContext("pool_pages_per_half", std::to_string(kPOOL_PAGES));
    benchmark::AddCustomContext("tokens_per_page", std::to_string(rt::kTOKENS_PER_PAGE));
}

} // namespace

int main(int argc, char** argv)
{
    int deviceCount = 0;
    cudaError_t const status = cudaGetDeviceCount(&deviceCount);
    if (status != cudaSuccess || deviceCount == 0)
    {
        char const* const required = std::getenv("KVCACHE_REQUIRE_GPU");
        bool const mustRun = required != nullptr && std::strcmp(required, "1") == 0;
        std::fprintf(stderr, "kvcache-bench-page-ops: no usable GPU (%s); nothing measured%s.\n",
            status != cudaSuccess ? cudaGetErrorString(status) : "no CUDA device is visible",
            mustRun ? ", and KVCACHE_REQUIRE_GPU=1 makes that a failure" : "");
        return mustRun ? 1 : kEXIT_SKIPPED;
    }
    bool minTimeGiven = false;
    for (int i = 1; i < argc; ++i)
    {
        minTimeGiven = minTimeGiven || std::strncmp(argv[i], "--benchmark_min_time", 20) == 0;
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
        registerAll(!minTimeGiven);
        gHarness = std::make_unique<Harness>();
        benchmark::RunSpecifiedBenchmarks();
        if (gFailedCases > 0)
        {
            std::fprintf(stderr, "kvcache-bench-page-ops: %d case(s) failed\n", gFailedCases);
            exitCode = 1;
        }
    }
    catch (std::exception const& error)
    {
        std::fprintf(stderr, "kvcache-bench-page-ops: %s\n", error.what());
        exitCode = 1;
    }
    gHarness.reset();
    benchmark::Shutdown();
    return exitCode;
}
