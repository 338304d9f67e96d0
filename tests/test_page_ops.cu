#include "gpu_test_support.h"

#include "kvcache/data_type.h"
#include "kvcache/errors.h"
#include "kvcache/kv_cache_config.h"
#include "kvcache/kv_cache_manager.h"
#include "kvcache/page_ops.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::GpuTest;

constexpr int32_t kINT32_MAX = std::numeric_limits<int32_t>::max();
constexpr int32_t kINT32_MIN = std::numeric_limits<int32_t>::min();

//! Returns the element size of a KV cache type, written out by hand so the reference does not lean on the library.
int64_t elementBytesByHand(rt::DataType type)
{
    switch (type)
    {
    case rt::DataType::kFLOAT: return 4;
    case rt::DataType::kHALF:
    case rt::DataType::kBF16: return 2;
    case rt::DataType::kFP8_E4M3:
    case rt::DataType::kFP8_E5M2:
    case rt::DataType::kINT8:
    case rt::DataType::kUINT8: return 1;
    case rt::DataType::kINT32:
    case rt::DataType::kINT64: break;
    }
    throw std::invalid_argument("not a KV cache type");
}

//! Returns byte `index` of a page filled with the little-endian 4-byte `pattern`, counted from the page's start.
uint8_t patternByte(uint32_t pattern, int64_t index)
{
    return static_cast<uint8_t>(pattern >> (8 * (index % 4)));
}

//! Host model of every layer's buffer: the K pool, then the V pool, each numPages pages of P * H * D elements.
class ReferenceCache
{
public:
    //! Sizes each layer from `config` by hand; `config.numPages` must be explicit.
    explicit ReferenceCache(rt::KVCacheConfig const& config)
        : mNumPages(config.numPages)
    {
        if (mNumPages <= 0)
        {
            throw std::invalid_argument("the reference needs an explicit numPages");
        }
        int64_t const elementBytes = elementBytesByHand(config.kvCacheType);
        for (rt::KVLayerConfig const& layer : config.layerConfigs)
        {
            int64_t const pageBytes = int64_t{config.tokensPerPage} * layer.numKVHeads * layer.headDim * elementBytes;
            mPageBytes.push_back(pageBytes);
            mBytes.emplace_back(static_cast<size_t>(int64_t{2} * mNumPages * pageBytes));
        }
    }

    //! Returns the number of layers.
    int32_t numLayers() const noexcept
    {
        return static_cast<int32_t>(mBytes.size());
    }
    //! Returns the pages per half and layer.
    int32_t numPages() const noexcept
    {
        return mNumPages;
    }
    //! Returns tokensPerPage * H * D * element size of `layer`.
    int64_t pageBytes(int32_t layer) const
    {
        return mPageBytes.at(static_cast<size_t>(layer));
    }
    //! Returns the bytes of one half (K or V) of `layer`.
    int64_t halfBytes(int32_t layer) const
    {
        return int64_t{mNumPages} * pageBytes(layer);
    }
    //! Returns the bytes of the whole buffer of `layer`.
    int64_t layerBytes(int32_t layer) const
    {
        return 2 * halfBytes(layer);
    }
    //! Returns the modelled buffer of `layer`.
    std::vector<uint8_t>& bytes(int32_t layer)
    {
        return mBytes.at(static_cast<size_t>(layer));
    }
    //! Returns the first byte of page `id` of half `kv` (0 is K, 1 is V) of `layer`.
    uint8_t* page(int32_t layer, int32_t kv, int32_t id)
    {
        return bytes(layer).data() + kv * halfBytes(layer) + id * pageBytes(layer);
    }

    //! Fills every buffer with pseudo-random non-zero bytes; the first byte of each page of a layer is distinct (for
    //! up to 255 pages of K and V together), so no copy can go unseen because source and destination were equal.
    void fillRandom(std::mt19937_64& rng)
    {
        for (std::vector<uint8_t>& layer : mBytes)
        {
            for (uint8_t& value : layer)
            {
                value = static_cast<uint8_t>(1 + rng() % 255);
            }
        }
        uint64_t const salt = rng();
        for (int32_t layer = 0; layer < numLayers(); ++layer)
        {
            for (int32_t kv = 0; kv < 2; ++kv)
            {
                for (int32_t id = 0; id < mNumPages; ++id)
                {
                    uint64_t const index = static_cast<uint64_t>(kv) * static_cast<uint64_t>(mNumPages) + id;
                    page(layer, kv, id)[0] = static_cast<uint8_t>(1 + (salt + index * 37) % 255);
                }
            }
        }
    }

    //! Applies `pairs` to the targeted layers and halves, skipping any pair with an id outside [0, numPages).
    void copy(std::vector<rt::PageCopy> const& pairs, rt::PageOpTarget const& target = {})
    {
        forEachTargetedHalf(target,
            [&](int32_t layer, int32_t kv)
            {
                for (rt::PageCopy const& pair : pairs)
                {
                    if (isPage(pair.src) && isPage(pair.dst))
                    {
                        std::memcpy(page(layer, kv, pair.dst), page(layer, kv, pair.src),
                            static_cast<size_t>(pageBytes(layer)));
                    }
                }
            });
    }

    //! Fills `pages` with `pattern` in the targeted layers and halves, skipping ids outside [0, numPages).
    void reset(std::vector<int32_t> const& pages, uint32_t pattern, rt::PageOpTarget const& target = {})
    {
        forEachTargetedHalf(target,
            [&](int32_t layer, int32_t kv)
            {
                for (int32_t const id : pages)
                {
                    if (isPage(id))
                    {
                        uint8_t* const first = page(layer, kv, id);
                        for (int64_t i = 0; i < pageBytes(layer); ++i)
                        {
                            first[i] = patternByte(pattern, i);
                        }
                    }
                }
            });
    }

private:
    bool isPage(int32_t id) const noexcept
    {
        return id >= 0 && id < mNumPages;
    }

    template <typename Visit>
    void forEachTargetedHalf(rt::PageOpTarget const& target, Visit&& visit)
    {
        int32_t const count = target.numLayers < 0 ? numLayers() - target.firstLayer : target.numLayers;
        for (int32_t layer = target.firstLayer; layer < target.firstLayer + count; ++layer)
        {
            if (target.half != rt::KVHalf::kV)
            {
                visit(layer, 0);
            }
            if (target.half != rt::KVHalf::kK)
            {
                visit(layer, 1);
            }
        }
    }

    int32_t mNumPages;
    std::vector<int64_t> mPageBytes;
    std::vector<std::vector<uint8_t>> mBytes;
};

//! A non-blocking CUDA stream owned by one test.
class Stream
{
public:
    Stream()
    {
        KVCACHE_CUDA_TRY(cudaStreamCreateWithFlags(&mStream, cudaStreamNonBlocking));
    }
    ~Stream()
    {
        cudaStreamDestroy(mStream);
    }
    Stream(Stream const&) = delete;
    Stream& operator=(Stream const&) = delete;

    //! Returns the stream.
    cudaStream_t get() const noexcept
    {
        return mStream;
    }

private:
    cudaStream_t mStream{nullptr};
};

//! Device memory for exactly `count` values of T, so that a kernel reading past the end shows under memcheck.
template <typename T>
class DeviceArray
{
public:
    explicit DeviceArray(size_t count)
        : mCount(count)
    {
        KVCACHE_CUDA_TRY(cudaMalloc(&mData, std::max<size_t>(count, 1) * sizeof(T)));
    }
    DeviceArray(std::vector<T> const& values, cudaStream_t stream)
        : DeviceArray(values.size())
    {
        upload(values, stream);
    }
    ~DeviceArray()
    {
        cudaFree(mData);
    }
    DeviceArray(DeviceArray const&) = delete;
    DeviceArray& operator=(DeviceArray const&) = delete;

    //! Returns the device pointer.
    T* get() const noexcept
    {
        return mData;
    }
    //! Copies `values` (at most the array's size) to the front of the array, ordered on `stream`, and waits for it.
    void upload(std::vector<T> const& values, cudaStream_t stream)
    {
        if (values.size() > mCount)
        {
            throw std::invalid_argument("more values than the device array holds");
        }
        KVCACHE_CUDA_TRY(
            cudaMemcpyAsync(mData, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
    }
    //! Returns the array's contents after the work queued on `stream`.
    std::vector<T> download(cudaStream_t stream) const
    {
        std::vector<T> values(mCount);
        KVCACHE_CUDA_TRY(cudaMemcpyAsync(values.data(), mData, mCount * sizeof(T), cudaMemcpyDeviceToHost, stream));
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
        return values;
    }

private:
    size_t mCount;
    T* mData{nullptr};
};

//! A manager on its own stream, its buffers filled with random bytes, and the host model of those buffers.
class CacheUnderTest
{
public:
    CacheUnderTest(rt::KVCacheConfig const& config, uint64_t seed)
        : mCache(config, mStream.get())
        , mReference(config)
        , mRng(seed)
    {
        for (int32_t layer = 0; layer < mReference.numLayers(); ++layer)
        {
            auto const* kPool = static_cast<char const*>(mCache.kPoolPtr(layer));
            auto const* vPool = static_cast<char const*>(mCache.vPoolPtr(layer));
            if (vPool - kPool != mReference.halfBytes(layer)
                || mCache.getCombinedKVCachePoolView(layer).sizeBytes() != mReference.layerBytes(layer))
            {
                throw std::runtime_error("layer " + std::to_string(layer) + " is not laid out as the reference models");
            }
        }
        refill();
    }

    //! Returns the manager.
    rt::KVCacheManager const& cache() const noexcept
    {
        return mCache;
    }
    //! Returns the stream the manager was built on.
    cudaStream_t stream() const noexcept
    {
        return mStream.get();
    }
    //! Returns the host model.
    ReferenceCache& reference() noexcept
    {
        return mReference;
    }
    //! Returns the pages per half and layer.
    int32_t numPages() const noexcept
    {
        return mReference.numPages();
    }

    //! Gives every buffer (device and model) new random contents.
    void refill()
    {
        mReference.fillRandom(mRng);
        for (int32_t layer = 0; layer < mReference.numLayers(); ++layer)
        {
            KVCACHE_CUDA_TRY(cudaMemcpyAsync(mCache.kPoolPtr(layer), mReference.bytes(layer).data(),
                static_cast<size_t>(mReference.layerBytes(layer)), cudaMemcpyHostToDevice, stream()));
        }
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream()));
    }

    //! Compares every byte of every layer, after the work queued on the manager's stream, with the model.
    ::testing::AssertionResult matchesReference()
    {
        for (int32_t layer = 0; layer < mReference.numLayers(); ++layer)
        {
            std::vector<uint8_t> actual(static_cast<size_t>(mReference.layerBytes(layer)));
            KVCACHE_CUDA_TRY(cudaMemcpyAsync(
                actual.data(), mCache.kPoolPtr(layer), actual.size(), cudaMemcpyDeviceToHost, stream()));
            KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream()));
            std::vector<uint8_t> const& expected = mReference.bytes(layer);
            if (actual != expected)
            {
                return describeMismatch(layer, expected, actual);
            }
        }
        return ::testing::AssertionSuccess();
    }

    //! Returns `count` pairs with distinct destinations and sources drawn (repeats allowed) from the other pages.
    std::vector<rt::PageCopy> randomPairs(int32_t count)
    {
        std::vector<int32_t> const ids = shuffledPages();
        std::uniform_int_distribution<size_t> pickSource(static_cast<size_t>(count), ids.size() - 1);
        std::vector<rt::PageCopy> pairs(static_cast<size_t>(count));
        for (size_t i = 0; i < pairs.size(); ++i)
        {
            pairs[i] = rt::PageCopy{ids[pickSource(mRng)], ids[i]};
        }
        return pairs;
    }

    //! Returns `count` distinct page ids in random order.
    std::vector<int32_t> randomPages(int32_t count)
    {
        std::vector<int32_t> ids = shuffledPages();
        ids.resize(static_cast<size_t>(count));
        return ids;
    }

private:
    std::vector<int32_t> shuffledPages()
    {
        std::vector<int32_t> ids(static_cast<size_t>(numPages()));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), mRng);
        return ids;
    }

    ::testing::AssertionResult describeMismatch(
        int32_t layer, std::vector<uint8_t> const& expected, std::vector<uint8_t> const& actual)
    {
        int64_t mismatches = 0;
        int64_t first = -1;
        for (size_t i = 0; i < expected.size(); ++i)
        {
            if (expected[i] != actual[i])
            {
                first = first < 0 ? static_cast<int64_t>(i) : first;
                ++mismatches;
            }
        }
        int64_t const half = first / mReference.halfBytes(layer);
        int64_t const inHalf = first % mReference.halfBytes(layer);
        char bytes[64];
        std::snprintf(bytes, sizeof(bytes), "expected 0x%02x, found 0x%02x", expected[static_cast<size_t>(first)],
            actual[static_cast<size_t>(first)]);
        return ::testing::AssertionFailure()
            << "layer " << layer << ": " << mismatches << " byte(s) differ from the reference; the first is "
            << (half == 0 ? "K" : "V") << " page " << inHalf / mReference.pageBytes(layer) << " byte "
            << inHalf % mReference.pageBytes(layer) << " (pageBytes " << mReference.pageBytes(layer) << "): " << bytes;
    }

    Stream mStream;
    rt::KVCacheManager mCache;
    ReferenceCache mReference;
    std::mt19937_64 mRng;
};

//! Builds a config with two slots of one page and one token each (four minimum pages); the rest are retained pages.
rt::KVCacheConfig makeConfig(
    std::vector<rt::KVLayerConfig> const& layers, rt::DataType type, int32_t tokensPerPage, int32_t numPages)
{
    rt::KVCacheConfig config;
    config.numAttentionLayers = static_cast<int32_t>(layers.size());
    config.maxBatchSize = 2;
    config.maxSequenceLength = tokensPerPage + 1;
    config.layerConfigs = layers;
    config.kvCacheType = type;
    config.numPages = numPages;
    config.tokensPerPage = tokensPerPage;
    return config;
}

//! Three float16 layers of different shapes and page sizes (1024, 1280 and 768 bytes), 64 pages.
rt::KVCacheConfig smallConfig()
{
    return makeConfig({{2, 16}, {1, 40}, {3, 8}}, rt::DataType::kHALF, 16, 64);
}

//! Two small float16 layers (pages of 256 and 768 bytes) with enough pages for lists of over 1500 entries.
rt::KVCacheConfig longListConfig()
{
    return makeConfig({{1, 8}, {2, 12}}, rt::DataType::kHALF, 16, 3200);
}

//! Returns a readable description of `target` for traces.
std::string describe(rt::PageOpTarget const& target)
{
    char const* half = target.half == rt::KVHalf::kK ? "K" : target.half == rt::KVHalf::kV ? "V" : "both";
    return "layers from " + std::to_string(target.firstLayer) + ", count " + std::to_string(target.numLayers)
        + ", half " + half;
}

//! Returns success when `call` throws `ExpectedError` whose message contains every string of `words`.
template <typename ExpectedError, typename Call>
::testing::AssertionResult throwsNaming(Call&& call, std::vector<std::string> const& words)
{
    try
    {
        call();
    }
    catch (ExpectedError const& error)
    {
        std::string const message = error.what();
        for (std::string const& word : words)
        {
            if (message.find(word) == std::string::npos)
            {
                return ::testing::AssertionFailure() << "the message \"" << message << "\" does not name " << word;
            }
        }
        return ::testing::AssertionSuccess();
    }
    catch (std::exception const& error)
    {
        return ::testing::AssertionFailure() << "threw an exception of another type: " << error.what();
    }
    return ::testing::AssertionFailure() << "did not throw";
}

//! Spins until `*release` is set, or records a timeout after `maxCycles` clock cycles.
__global__ void holdStreamUntilReleased(int32_t const volatile* release, int32_t* timedOut, long long maxCycles)
{
    long long const start = clock64();
    while (*release == 0)
    {
        if (clock64() - start > maxCycles)
        {
            *timedOut = 1;
            return;
        }
    }
}

//! Holds a stream with a kernel until the host opens the gate, so a call that waited for the stream would show.
class StreamGate
{
public:
    StreamGate()
    {
        KVCACHE_CUDA_TRY(cudaHostAlloc(&mFlags, 2 * sizeof(int32_t), cudaHostAllocMapped));
        mFlags[0] = 0;
        mFlags[1] = 0;
        KVCACHE_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&mDeviceFlags), mFlags, 0));
    }
    ~StreamGate()
    {
        open();
        cudaDeviceSynchronize();
        cudaFreeHost(mFlags);
    }
    StreamGate(StreamGate const&) = delete;
    StreamGate& operator=(StreamGate const&) = delete;

    //! Queues the holding kernel on `stream`; it gives up by itself after `maxCycles` GPU clock cycles.
    void close(cudaStream_t stream, long long maxCycles)
    {
        holdStreamUntilReleased<<<1, 1, 0, stream>>>(mDeviceFlags, mDeviceFlags + 1, maxCycles);
        KVCACHE_CUDA_TRY(cudaGetLastError());
    }
    //! Lets the holding kernel finish.
    void open() noexcept
    {
        *static_cast<int32_t volatile*>(mFlags) = 1;
        std::atomic_thread_fence(std::memory_order_seq_cst);
    }
    //! Returns true when the holding kernel gave up instead of being released.
    bool timedOut() const noexcept
    {
        return static_cast<int32_t volatile*>(mFlags)[1] != 0;
    }

private:
    int32_t* mFlags{nullptr};
    int32_t* mDeviceFlags{nullptr};
};

//! Owns a graph instantiated from what a callable queued on a capturing stream.
class CapturedGraph
{
public:
    template <typename Enqueue>
    CapturedGraph(cudaStream_t stream, Enqueue&& enqueue)
    {
        KVCACHE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        cudaGraph_t graph = nullptr;
        try
        {
            enqueue();
        }
        catch (...)
        {
            cudaStreamEndCapture(stream, &graph);
            if (graph != nullptr)
            {
                cudaGraphDestroy(graph);
            }
            throw;
        }
        KVCACHE_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
        cudaError_t const status = cudaGraphInstantiate(&mExec, graph, 0);
        cudaGraphDestroy(graph);
        KVCACHE_CUDA_TRY(status);
    }
    ~CapturedGraph()
    {
        if (mExec != nullptr)
        {
            cudaGraphExecDestroy(mExec);
        }
    }
    CapturedGraph(CapturedGraph const&) = delete;
    CapturedGraph& operator=(CapturedGraph const&) = delete;

    //! Launches the graph on `stream`.
    void launch(cudaStream_t stream)
    {
        KVCACHE_CUDA_TRY(cudaGraphLaunch(mExec, stream));
    }

private:
    cudaGraphExec_t mExec{nullptr};
};

//! Tags a KV cache type for the typed tests.
template <rt::DataType kTYPE>
using DataTypeTag = std::integral_constant<rt::DataType, kTYPE>;

using KVCacheDataTypes = ::testing::Types<DataTypeTag<rt::DataType::kFLOAT>, DataTypeTag<rt::DataType::kHALF>,
    DataTypeTag<rt::DataType::kBF16>, DataTypeTag<rt::DataType::kFP8_E4M3>, DataTypeTag<rt::DataType::kFP8_E5M2>,
    DataTypeTag<rt::DataType::kINT8>, DataTypeTag<rt::DataType::kUINT8>>;

//! Names the typed tests after the data type.
class DataTypeNames
{
public:
    template <typename T>
    static std::string GetName(int /*index*/)
    {
        return std::string(rt::dataTypeName(T::value));
    }
};

template <typename T>
class PageOpsTypedTest : public kvcache::test::TypedGpuTest<T>
{
};
TYPED_TEST_SUITE(PageOpsTypedTest, KVCacheDataTypes, DataTypeNames);

using PageOpsTest = GpuTest;

//! Layers of different head counts and widths, so every layer has its own page size.
std::vector<rt::KVLayerConfig> heterogeneousLayers()
{
    return {{2, 64}, {1, 128}, {3, 40}};
}

TYPED_TEST(PageOpsTypedTest, RandomCopiesMatchTheReference)
{
    for (int32_t const tokensPerPage : {16, 64, 128})
    {
        SCOPED_TRACE("tokensPerPage " + std::to_string(tokensPerPage));
        CacheUnderTest cut(makeConfig(heterogeneousLayers(), TypeParam::value, tokensPerPage, 40),
            static_cast<uint64_t>(tokensPerPage));

        for (int32_t const count : {1, 8, 15})
        {
            std::vector<rt::PageCopy> const pairs = cut.randomPairs(count);
            rt::copyPages(cut.cache(), pairs.data(), count, cut.stream());
            cut.reference().copy(pairs);
            ASSERT_TRUE(cut.matchesReference()) << count << " pairs from a pointer";
        }

        std::vector<rt::PageCopy> const vectorPairs = cut.randomPairs(20);
        rt::copyPages(cut.cache(), vectorPairs, cut.stream());
        cut.reference().copy(vectorPairs);
        ASSERT_TRUE(cut.matchesReference()) << "pairs from a vector";

        std::vector<rt::PageCopy> const devicePairs = cut.randomPairs(12);
        DeviceArray<rt::PageCopy> deviceList(devicePairs, cut.stream());
        DeviceArray<int32_t> deviceCount(std::vector<int32_t>{12}, cut.stream());
        rt::copyPagesDevice(cut.cache(), deviceList.get(), 12, deviceCount.get(), cut.stream());
        cut.reference().copy(devicePairs);
        ASSERT_TRUE(cut.matchesReference()) << "pairs from device memory";
    }
}

TYPED_TEST(PageOpsTypedTest, ResetsMatchTheReference)
{
    for (int32_t const tokensPerPage : {16, 64, 128})
    {
        SCOPED_TRACE("tokensPerPage " + std::to_string(tokensPerPage));
        CacheUnderTest cut(makeConfig(heterogeneousLayers(), TypeParam::value, tokensPerPage, 40),
            static_cast<uint64_t>(100 + tokensPerPage));

        for (uint32_t const pattern : {0x7E007E00U, 0xDEADBEEFU, 0U})
        {
            std::vector<int32_t> const pages = cut.randomPages(9);
            rt::resetPages(cut.cache(), pages.data(), static_cast<int32_t>(pages.size()), cut.stream(), pattern);
            cut.reference().reset(pages, pattern);
            ASSERT_TRUE(cut.matchesReference()) << "pattern " << pattern << " from a pointer";

            std::vector<int32_t> const vectorPages = cut.randomPages(5);
            rt::resetPages(cut.cache(), vectorPages, cut.stream(), pattern);
            cut.reference().reset(vectorPages, pattern);
            ASSERT_TRUE(cut.matchesReference()) << "pattern " << pattern << " from a vector";

            std::vector<int32_t> const devicePages = cut.randomPages(7);
            DeviceArray<int32_t> deviceList(devicePages, cut.stream());
            rt::resetPagesDevice(cut.cache(), deviceList.get(), 7, nullptr, cut.stream(), pattern);
            cut.reference().reset(devicePages, pattern);
            ASSERT_TRUE(cut.matchesReference()) << "pattern " << pattern << " from device memory";
        }
    }
}

TEST_F(PageOpsTest, PagesOfOddByteCountsAreCopiedAndResetToTheirLastByte)
{
    struct Case
    {
        rt::DataType type;
        int32_t tokensPerPage;
        std::vector<rt::KVLayerConfig> layers;
    };
    // Pages of 3, 5 and 14 bytes; of 6, 10 and 28 bytes; of 6 and 10 bytes: none a multiple of 4, most not of 2.
    std::vector<Case> const cases{
        {rt::DataType::kINT8, 1, {{1, 3}, {1, 5}, {2, 7}}},
        {rt::DataType::kINT8, 2, {{1, 3}, {1, 5}, {2, 7}}},
        {rt::DataType::kHALF, 1, {{1, 3}, {1, 5}}},
    };
    for (Case const& testCase : cases)
    {
        SCOPED_TRACE(
            std::string(rt::dataTypeName(testCase.type)) + ", tokensPerPage " + std::to_string(testCase.tokensPerPage));
        CacheUnderTest cut(makeConfig(testCase.layers, testCase.type, testCase.tokensPerPage, 48), 5);

        for (int32_t round = 0; round < 3; ++round)
        {
            std::vector<rt::PageCopy> const pairs = cut.randomPairs(10);
            rt::copyPages(cut.cache(), pairs, cut.stream());
            cut.reference().copy(pairs);
            ASSERT_TRUE(cut.matchesReference()) << "copy round " << round;
        }
        for (uint32_t const pattern : {0xDEADBEEFU, 0x7E007E00U, 0U})
        {
            std::vector<int32_t> const pages = cut.randomPages(7);
            rt::resetPages(cut.cache(), pages, cut.stream(), pattern);
            cut.reference().reset(pages, pattern);
            ASSERT_TRUE(cut.matchesReference()) << "pattern " << pattern;
        }

        // The byte order of the pattern, spelled out: layer 0's pages are 3 * tokensPerPage * element bytes long.
        constexpr int32_t kPAGE = 5;
        rt::resetPages(cut.cache(), std::vector<int32_t>{kPAGE}, cut.stream(), 0xDEADBEEFU);
        cut.reference().reset({kPAGE}, 0xDEADBEEFU);
        int64_t const pageBytes = 3 * int64_t{testCase.tokensPerPage} * elementBytesByHand(testCase.type);
        uint8_t const littleEndian[4] = {0xEF, 0xBE, 0xAD, 0xDE};
        for (void* const pool : {cut.cache().kPoolPtr(0), cut.cache().vPoolPtr(0)})
        {
            std::vector<uint8_t> bytes(static_cast<size_t>(pageBytes));
            KVCACHE_TEST_CUDA(cudaMemcpyAsync(bytes.data(), static_cast<char*>(pool) + kPAGE * pageBytes, bytes.size(),
                cudaMemcpyDeviceToHost, cut.stream()));
            KVCACHE_TEST_CUDA(cudaStreamSynchronize(cut.stream()));
            for (size_t i = 0; i < bytes.size(); ++i)
            {
                EXPECT_EQ(int{bytes[i]}, int{littleEndian[i % 4]}) << "byte " << i;
            }
        }
        ASSERT_TRUE(cut.matchesReference());
    }
}

TEST_F(PageOpsTest, DeviceCopySkipsUnusedEntriesAndCountsBadIds)
{
    CacheUnderTest cut(smallConfig(), 7);
    int32_t const n = cut.numPages();
    std::vector<rt::PageCopy> const list{
        {3, 10},
        {rt::kUNUSED_PAGE_ENTRY, 11},
        {4, rt::kUNUSED_PAGE_ENTRY},
        {rt::kUNUSED_PAGE_ENTRY, rt::kUNUSED_PAGE_ENTRY},
        {n, 12},
        {5, n},
        {1 << 30, 13},
        {6, -5},
        {kINT32_MIN, 14},
        {8, kINT32_MAX},
        {7, 15},
        {3, 16},
        {n - 1, 0},
    };
    constexpr int32_t kBAD_PAIRS = 6; // {n, 12}, {5, n}, {1 << 30, 13}, {6, -5}, {INT32_MIN, 14}, {8, INT32_MAX}
    constexpr int32_t kEARLIER_ERRORS = 7;
    int32_t const size = static_cast<int32_t>(list.size());
    DeviceArray<rt::PageCopy> deviceList(list, cut.stream());
    DeviceArray<int32_t> errors(std::vector<int32_t>{kEARLIER_ERRORS}, cut.stream());

    rt::copyPagesDevice(cut.cache(), deviceList.get(), size, nullptr, cut.stream(), {}, errors.get());
    cut.reference().copy(list);
    ASSERT_TRUE(cut.matchesReference());
    EXPECT_EQ(errors.download(cut.stream())[0], kEARLIER_ERRORS + kBAD_PAIRS);

    // Without an error counter the bad pairs are skipped all the same.
    cut.refill();
    rt::copyPagesDevice(cut.cache(), deviceList.get(), size, nullptr, cut.stream());
    cut.reference().copy(list);
    ASSERT_TRUE(cut.matchesReference());
}

TEST_F(PageOpsTest, DeviceCopyReadsTheCountFromDeviceMemory)
{
    CacheUnderTest cut(smallConfig(), 8);
    constexpr int32_t kMAX_PAIRS = 10;
    std::vector<rt::PageCopy> const pairs = cut.randomPairs(kMAX_PAIRS);
    DeviceArray<rt::PageCopy> deviceList(pairs, cut.stream());
    DeviceArray<int32_t> deviceCount(1);
    auto const firstPairs = [&](int32_t count)
    { return std::vector<rt::PageCopy>(pairs.begin(), pairs.begin() + count); };

    struct Case
    {
        int32_t deviceCount;
        int32_t applied;
    };
    // 1000 is clamped to maxPairs: the list holds exactly maxPairs entries, so reading more would show in memcheck.
    for (Case const& testCase :
        {Case{4, 4}, Case{0, 0}, Case{1, 1}, Case{kMAX_PAIRS, kMAX_PAIRS}, Case{1000, kMAX_PAIRS}})
    {
        SCOPED_TRACE("device count " + std::to_string(testCase.deviceCount));
        cut.refill();
        deviceCount.upload({testCase.deviceCount}, cut.stream());
        rt::copyPagesDevice(cut.cache(), deviceList.get(), kMAX_PAIRS, deviceCount.get(), cut.stream());
        cut.reference().copy(firstPairs(testCase.applied));
        ASSERT_TRUE(cut.matchesReference());
    }

    // Without a count pointer the kernel takes maxPairs, which may be shorter than the list.
    for (int32_t const maxPairs : {kMAX_PAIRS, 6})
    {
        SCOPED_TRACE("no device count, maxPairs " + std::to_string(maxPairs));
        cut.refill();
        rt::copyPagesDevice(cut.cache(), deviceList.get(), maxPairs, nullptr, cut.stream());
        cut.reference().copy(firstPairs(maxPairs));
        ASSERT_TRUE(cut.matchesReference());
    }

    // Bad pairs past the count are neither applied nor counted.
    std::vector<rt::PageCopy> withBadTail = cut.randomPairs(kMAX_PAIRS);
    withBadTail[7].src = cut.numPages();
    withBadTail[9].dst = -5;
    deviceList.upload(withBadTail, cut.stream());
    deviceCount.upload({5}, cut.stream());
    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cut.stream());
    cut.refill();
    rt::copyPagesDevice(cut.cache(), deviceList.get(), kMAX_PAIRS, deviceCount.get(), cut.stream(), {}, errors.get());
    cut.reference().copy(std::vector<rt::PageCopy>(withBadTail.begin(), withBadTail.begin() + 5));
    ASSERT_TRUE(cut.matchesReference());
    EXPECT_EQ(errors.download(cut.stream())[0], 0);
}

TEST_F(PageOpsTest, DeviceResetSkipsUnusedEntriesCountsBadIdsAndReadsTheCount)
{
    CacheUnderTest cut(smallConfig(), 9);
    int32_t const n = cut.numPages();
    std::vector<int32_t> const list{3, rt::kUNUSED_PAGE_ENTRY, n, 17, 1 << 30, -5, 40, kINT32_MIN, kINT32_MAX, 63, 0};
    constexpr int32_t kBAD_PAGES = 5; // n, 1 << 30, -5, INT32_MIN, INT32_MAX
    constexpr int32_t kEARLIER_ERRORS = 3;
    constexpr uint32_t kPATTERN = 0xDEADBEEFU;
    int32_t const size = static_cast<int32_t>(list.size());
    DeviceArray<int32_t> deviceList(list, cut.stream());
    DeviceArray<int32_t> errors(std::vector<int32_t>{kEARLIER_ERRORS}, cut.stream());

    rt::resetPagesDevice(cut.cache(), deviceList.get(), size, nullptr, cut.stream(), kPATTERN, {}, errors.get());
    cut.reference().reset(list, kPATTERN);
    ASSERT_TRUE(cut.matchesReference());
    EXPECT_EQ(errors.download(cut.stream())[0], kEARLIER_ERRORS + kBAD_PAGES);

    cut.refill();
    rt::resetPagesDevice(cut.cache(), deviceList.get(), size, nullptr, cut.stream(), kPATTERN);
    cut.reference().reset(list, kPATTERN);
    ASSERT_TRUE(cut.matchesReference()) << "without an error counter";

    // Only the first *deviceNumPages entries count, clamped to maxPages; the bad ids at 2 and 4 lie past a count of 2.
    DeviceArray<int32_t> deviceCount(1);
    DeviceArray<int32_t> freshErrors(std::vector<int32_t>{0}, cut.stream());
    for (int32_t const count : {2, 0, 1000})
    {
        SCOPED_TRACE("device count " + std::to_string(count));
        cut.refill();
        deviceCount.upload({count}, cut.stream());
        rt::resetPagesDevice(cut.cache(), deviceList.get(), size, deviceCount.get(), cut.stream(), 0U, {},
            count == 2 ? freshErrors.get() : nullptr);
        int32_t const applied = std::min(count, size);
        cut.reference().reset(std::vector<int32_t>(list.begin(), list.begin() + applied), 0U);
        ASSERT_TRUE(cut.matchesReference());
    }
    EXPECT_EQ(freshErrors.download(cut.stream())[0], 0);
}

TEST_F(PageOpsTest, CapturedDeviceCopyReplaysWithTheCurrentListAndCount)
{
    CacheUnderTest cut(smallConfig(), 11);
    constexpr int32_t kMAX_PAIRS = 16;
    DeviceArray<rt::PageCopy> deviceList(cut.randomPairs(kMAX_PAIRS), cut.stream());
    DeviceArray<int32_t> deviceCount(std::vector<int32_t>{kMAX_PAIRS}, cut.stream());
    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cut.stream());

    CapturedGraph graph(cut.stream(),
        [&] {
            rt::copyPagesDevice(
                cut.cache(), deviceList.get(), kMAX_PAIRS, deviceCount.get(), cut.stream(), {}, errors.get());
        });
    ASSERT_TRUE(cut.matchesReference()) << "capturing ran something";

    int32_t expectedErrors = 0;
    for (int32_t const count : {kMAX_PAIRS, 5, 11, 0, 40})
    {
        SCOPED_TRACE("device count " + std::to_string(count));
        std::vector<rt::PageCopy> pairs = cut.randomPairs(kMAX_PAIRS);
        if (count == 11)
        {
            pairs[2].src = rt::kUNUSED_PAGE_ENTRY;
            pairs[6].dst = cut.numPages();
            ++expectedErrors;
        }
        deviceList.upload(pairs, cut.stream());
        deviceCount.upload({count}, cut.stream());
        graph.launch(cut.stream());
        int32_t const applied = std::min(count, kMAX_PAIRS);
        cut.reference().copy(std::vector<rt::PageCopy>(pairs.begin(), pairs.begin() + applied));
        ASSERT_TRUE(cut.matchesReference());
    }
    EXPECT_EQ(errors.download(cut.stream())[0], expectedErrors);
}

TEST_F(PageOpsTest, CapturedDeviceResetReplaysWithTheCurrentListAndCount)
{
    CacheUnderTest cut(smallConfig(), 12);
    constexpr int32_t kMAX_PAGES = 12;
    constexpr uint32_t kPATTERN = 0x7E007E00U;
    DeviceArray<int32_t> deviceList(cut.randomPages(kMAX_PAGES), cut.stream());
    DeviceArray<int32_t> deviceCount(std::vector<int32_t>{kMAX_PAGES}, cut.stream());
    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cut.stream());

    CapturedGraph graph(cut.stream(),
        [&]
        {
            rt::resetPagesDevice(
                cut.cache(), deviceList.get(), kMAX_PAGES, deviceCount.get(), cut.stream(), kPATTERN, {}, errors.get());
        });
    ASSERT_TRUE(cut.matchesReference()) << "capturing ran something";

    int32_t expectedErrors = 0;
    for (int32_t const count : {kMAX_PAGES, 3, 8, 0, 100})
    {
        SCOPED_TRACE("device count " + std::to_string(count));
        std::vector<int32_t> pages = cut.randomPages(kMAX_PAGES);
        if (count == 8)
        {
            pages[1] = rt::kUNUSED_PAGE_ENTRY;
            pages[4] = 1 << 30;
            ++expectedErrors;
        }
        deviceList.upload(pages, cut.stream());
        deviceCount.upload({count}, cut.stream());
        graph.launch(cut.stream());
        int32_t const applied = std::min(count, kMAX_PAGES);
        cut.reference().reset(std::vector<int32_t>(pages.begin(), pages.begin() + applied), kPATTERN);
        ASSERT_TRUE(cut.matchesReference());
        cut.refill();
    }
    EXPECT_EQ(errors.download(cut.stream())[0], expectedErrors);
}

TEST_F(PageOpsTest, CapturedHostListsReplayTheCapturedList)
{
    CacheUnderTest cut(longListConfig(), 13);
    // Longer than one launch carries, so the graph holds several launches.
    constexpr int32_t kPAIRS = rt::kMAX_INLINE_PAGE_OPS + 188;
    constexpr uint32_t kPATTERN = 0xDEADBEEFU;
    std::vector<rt::PageCopy> pairs = cut.randomPairs(kPAIRS);
    std::vector<int32_t> pages = cut.randomPages(600);
    std::vector<rt::PageCopy> const capturedPairs = pairs;
    std::vector<int32_t> const capturedPages = pages;

    CapturedGraph graph(cut.stream(),
        [&]
        {
            rt::copyPages(cut.cache(), pairs, cut.stream());
            rt::resetPages(cut.cache(), pages.data(), static_cast<int32_t>(pages.size()), cut.stream(), kPATTERN);
        });
    ASSERT_TRUE(cut.matchesReference()) << "capturing ran something";
    // The graph must hold its own copy of the lists.
    pairs = cut.randomPairs(kPAIRS);
    pages = cut.randomPages(600);

    for (int32_t replay = 0; replay < 2; ++replay)
    {
        SCOPED_TRACE("replay " + std::to_string(replay));
        graph.launch(cut.stream());
        cut.reference().copy(capturedPairs);
        cut.reference().reset(capturedPages, kPATTERN);
        ASSERT_TRUE(cut.matchesReference());
        cut.refill();
    }
}

TEST_F(PageOpsTest, TargetsTouchOnlyTheChosenLayersAndHalves)
{
    CacheUnderTest cut(smallConfig(), 14);
    std::vector<rt::PageOpTarget> const targets{
        {0, -1, rt::KVHalf::kBOTH},
        {1, 1, rt::KVHalf::kBOTH},
        {1, -1, rt::KVHalf::kK},
        {0, 2, rt::KVHalf::kV},
        {2, 1, rt::KVHalf::kK},
        {0, 3, rt::KVHalf::kV},
        {2, -1, rt::KVHalf::kBOTH},
    };
    for (rt::PageOpTarget const& target : targets)
    {
        SCOPED_TRACE(describe(target));
        std::vector<rt::PageCopy> const pairs = cut.randomPairs(9);
        rt::copyPages(cut.cache(), pairs, cut.stream(), target);
        cut.reference().copy(pairs, target);
        ASSERT_TRUE(cut.matchesReference()) << "copyPages";

        std::vector<int32_t> const pages = cut.randomPages(6);
        rt::resetPages(cut.cache(), pages, cut.stream(), 0xDEADBEEFU, target);
        cut.reference().reset(pages, 0xDEADBEEFU, target);
        ASSERT_TRUE(cut.matchesReference()) << "resetPages";

        std::vector<rt::PageCopy> const devicePairs = cut.randomPairs(7);
        DeviceArray<rt::PageCopy> deviceList(devicePairs, cut.stream());
        rt::copyPagesDevice(cut.cache(), deviceList.get(), 7, nullptr, cut.stream(), target);
        cut.reference().copy(devicePairs, target);
        ASSERT_TRUE(cut.matchesReference()) << "copyPagesDevice";

        std::vector<int32_t> const devicePages = cut.randomPages(5);
        DeviceArray<int32_t> devicePageList(devicePages, cut.stream());
        rt::resetPagesDevice(cut.cache(), devicePageList.get(), 5, nullptr, cut.stream(), 0x7E007E00U, target);
        cut.reference().reset(devicePages, 0x7E007E00U, target);
        ASSERT_TRUE(cut.matchesReference()) << "resetPagesDevice";
    }
}

TEST_F(PageOpsTest, BadTargetsThrowBeforeAnyLaunch)
{
    CacheUnderTest cut(smallConfig(), 15);
    std::vector<rt::PageOpTarget> const targets{
        {-1, -1, rt::KVHalf::kBOTH},
        {3, -1, rt::KVHalf::kBOTH},
        {3, 1, rt::KVHalf::kBOTH},
        {0, 4, rt::KVHalf::kBOTH},
        {2, 2, rt::KVHalf::kBOTH},
        {0, -2, rt::KVHalf::kBOTH},
        {0, -1, static_cast<rt::KVHalf>(3)},
    };
    std::vector<rt::PageCopy> const pairs = cut.randomPairs(4);
    std::vector<int32_t> const pages = cut.randomPages(4);
    for (rt::PageOpTarget const& target : targets)
    {
        SCOPED_TRACE(describe(target));
        EXPECT_THROW(rt::copyPages(cut.cache(), pairs, cut.stream(), target), rt::InvalidArgumentError);
        EXPECT_THROW(rt::resetPages(cut.cache(), pages, cut.stream(), 0xDEADBEEFU, target), rt::InvalidArgumentError);
    }
    ASSERT_TRUE(cut.matchesReference());
}

TEST_F(PageOpsTest, AnEmptyLayerRangeIsANoOp)
{
    CacheUnderTest cut(smallConfig(), 16);
    rt::PageOpTarget const target{1, 0, rt::KVHalf::kBOTH};
    EXPECT_NO_THROW(rt::copyPages(cut.cache(), cut.randomPairs(4), cut.stream(), target));
    EXPECT_NO_THROW(rt::resetPages(cut.cache(), cut.randomPages(4), cut.stream(), 0xDEADBEEFU, target));
    ASSERT_TRUE(cut.matchesReference());
}

TEST_F(PageOpsTest, HostCopyRejectsBadListsBeforeAnyLaunch)
{
    CacheUnderTest cut(smallConfig(), 17);
    int32_t const n = cut.numPages();
    // The bad pair comes last, so a launch of the leading good pairs would show in the buffer.
    for (int32_t const bad : {-1, -5, n, 1 << 30, kINT32_MAX, kINT32_MIN})
    {
        SCOPED_TRACE("id " + std::to_string(bad));
        std::vector<rt::PageCopy> const badSource{{1, 2}, {3, 4}, {bad, 5}};
        std::vector<rt::PageCopy> const badDestination{{1, 2}, {3, 4}, {6, bad}};
        std::vector<std::string> const named{std::to_string(bad), std::to_string(n)};
        EXPECT_TRUE(
            throwsNaming<rt::OutOfRangeError>([&] { rt::copyPages(cut.cache(), badSource, cut.stream()); }, named));
        EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
            [&] { rt::copyPages(cut.cache(), badDestination, cut.stream()); }, named));
    }

    std::vector<std::vector<rt::PageCopy>> const conflicting{
        {{1, 2}, {3, 4}, {5, 2}}, // destination 2 twice
        {{1, 2}, {2, 4}},         // 2 is a destination, then a source
        {{1, 2}, {3, 1}},         // 1 is a source, then a destination
        {{1, 2}, {6, 6}},         // a page copied onto itself
    };
    for (std::vector<rt::PageCopy> const& pairs : conflicting)
    {
        EXPECT_THROW(rt::copyPages(cut.cache(), pairs, cut.stream()), rt::InvalidArgumentError)
            << "pairs " << pairs.front().src << "->" << pairs.front().dst << ", " << pairs.back().src << "->"
            << pairs.back().dst;
    }

    std::vector<rt::PageCopy> const good{{1, 2}};
    EXPECT_THROW(rt::copyPages(cut.cache(), good.data(), -1, cut.stream()), rt::InvalidArgumentError);
    ASSERT_TRUE(cut.matchesReference()) << "a rejected list changed the buffer";

    EXPECT_NO_THROW(rt::copyPages(cut.cache(), nullptr, 0, cut.stream()));
    EXPECT_NO_THROW(rt::copyPages(cut.cache(), good.data(), 0, cut.stream()));
    EXPECT_NO_THROW(rt::copyPages(cut.cache(), std::vector<rt::PageCopy>{}, cut.stream()));
    ASSERT_TRUE(cut.matchesReference()) << "an empty list changed the buffer";

    // One source may feed several destinations.
    std::vector<rt::PageCopy> const fanOut{{7, 8}, {7, 9}, {7, 20}};
    rt::copyPages(cut.cache(), fanOut, cut.stream());
    cut.reference().copy(fanOut);
    ASSERT_TRUE(cut.matchesReference());
}

TEST_F(PageOpsTest, HostResetRejectsBadListsBeforeAnyLaunch)
{
    CacheUnderTest cut(smallConfig(), 18);
    int32_t const n = cut.numPages();
    for (int32_t const bad : {-1, -5, n, 1 << 30, kINT32_MAX, kINT32_MIN})
    {
        SCOPED_TRACE("id " + std::to_string(bad));
        std::vector<int32_t> const pages{1, 2, bad};
        EXPECT_TRUE(
            throwsNaming<rt::OutOfRangeError>([&] { rt::resetPages(cut.cache(), pages, cut.stream(), 0xDEADBEEFU); },
                {std::to_string(bad), std::to_string(n)}));
    }
    EXPECT_THROW(rt::resetPages(cut.cache(), std::vector<int32_t>{1, 2, 3, 2}, cut.stream()), rt::InvalidArgumentError);
    std::vector<int32_t> const good{1};
    EXPECT_THROW(rt::resetPages(cut.cache(), good.data(), -1, cut.stream()), rt::InvalidArgumentError);
    ASSERT_TRUE(cut.matchesReference()) << "a rejected list changed the buffer";

    EXPECT_NO_THROW(rt::resetPages(cut.cache(), nullptr, 0, cut.stream(), 0xDEADBEEFU));
    EXPECT_NO_THROW(rt::resetPages(cut.cache(), std::vector<int32_t>{}, cut.stream(), 0xDEADBEEFU));
    ASSERT_TRUE(cut.matchesReference()) << "an empty list changed the buffer";
}

TEST_F(PageOpsTest, LongHostListsSpanSeveralLaunches)
{
    CacheUnderTest cut(longListConfig(), 19);
    for (int32_t const count : {rt::kMAX_INLINE_PAGE_OPS, rt::kMAX_INLINE_PAGE_OPS + 1, 1500})
    {
        SCOPED_TRACE(std::to_string(count) + " entries");
        std::vector<rt::PageCopy> const pairs = cut.randomPairs(count);
        rt::copyPages(cut.cache(), pairs, cut.stream());
        cut.reference().copy(pairs);
        ASSERT_TRUE(cut.matchesReference()) << "copyPages";

        std::vector<int32_t> const pages = cut.randomPages(count);
        rt::resetPages(cut.cache(), pages, cut.stream(), 0x7E007E00U);
        cut.reference().reset(pages, 0x7E007E00U);
        ASSERT_TRUE(cut.matchesReference()) << "resetPages";
    }

    // A bad entry far down the list is found before the first launch.
    std::vector<rt::PageCopy> badLastSource = cut.randomPairs(1500);
    badLastSource.back().src = cut.numPages();
    EXPECT_THROW(rt::copyPages(cut.cache(), badLastSource, cut.stream()), rt::OutOfRangeError);
    std::vector<rt::PageCopy> lateDuplicate = cut.randomPairs(1500);
    lateDuplicate[1400].dst = lateDuplicate[3].dst;
    EXPECT_THROW(rt::copyPages(cut.cache(), lateDuplicate, cut.stream()), rt::InvalidArgumentError);
    std::vector<rt::PageCopy> lateOverlap = cut.randomPairs(1500);
    lateOverlap[1300].src = lateOverlap[10].dst;
    EXPECT_THROW(rt::copyPages(cut.cache(), lateOverlap, cut.stream()), rt::InvalidArgumentError);
    std::vector<int32_t> badLastPage = cut.randomPages(1500);
    badLastPage.back() = -1;
    EXPECT_THROW(rt::resetPages(cut.cache(), badLastPage, cut.stream()), rt::OutOfRangeError);
    std::vector<int32_t> lateRepeat = cut.randomPages(1500);
    lateRepeat[1499] = lateRepeat[2];
    EXPECT_THROW(rt::resetPages(cut.cache(), lateRepeat, cut.stream()), rt::InvalidArgumentError);
    ASSERT_TRUE(cut.matchesReference()) << "a rejected list changed the buffer";
}

TEST_F(PageOpsTest, ThousandsOfDeviceEntriesOnALargePool)
{
    CacheUnderTest cut(makeConfig({{1, 64}, {1, 24}}, rt::DataType::kHALF, 16, 4608), 20);
    constexpr int32_t kPAIRS = 3000;
    constexpr int32_t kPAGES = 4000;
    std::vector<rt::PageCopy> const pairs = cut.randomPairs(kPAIRS);
    DeviceArray<rt::PageCopy> deviceList(pairs, cut.stream());
    DeviceArray<int32_t> deviceCount(std::vector<int32_t>{kPAIRS}, cut.stream());
    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cut.stream());
    rt::copyPagesDevice(cut.cache(), deviceList.get(), kPAIRS, deviceCount.get(), cut.stream(), {}, errors.get());
    cut.reference().copy(pairs);
    ASSERT_TRUE(cut.matchesReference());
    EXPECT_EQ(errors.download(cut.stream())[0], 0);

    std::vector<int32_t> const pages = cut.randomPages(kPAGES);
    DeviceArray<int32_t> devicePages(pages, cut.stream());
    rt::resetPagesDevice(cut.cache(), devicePages.get(), kPAGES, nullptr, cut.stream(), 0xDEADBEEFU);
    cut.reference().reset(pages, 0xDEADBEEFU);
    ASSERT_TRUE(cut.matchesReference());
}

TEST_F(PageOpsTest, DeviceListsLongerThanOneGridAreCoveredWholeWithTheirCount)
{
    CacheUnderTest cut(smallConfig(), 21);
    constexpr int32_t kLIMIT = rt::kMAX_DEVICE_PAGE_OPS_PER_LAUNCH;
    constexpr int32_t kCAPACITY = kLIMIT + 300;
    // Real pairs on both sides of every launch boundary; a bad pair and a reset page past the first launch.
    std::vector<int32_t> const positions{0, kLIMIT - 1, kLIMIT, kLIMIT + 150, kCAPACITY - 1};
    std::vector<rt::PageCopy> const real = cut.randomPairs(static_cast<int32_t>(positions.size()));
    std::vector<rt::PageCopy> list(kCAPACITY, rt::PageCopy{rt::kUNUSED_PAGE_ENTRY, rt::kUNUSED_PAGE_ENTRY});
    for (size_t i = 0; i < positions.size(); ++i)
    {
        list[static_cast<size_t>(positions[i])] = real[i];
    }
    constexpr int32_t kBAD_POSITION = kLIMIT + 100;
    list[kBAD_POSITION] = rt::PageCopy{cut.numPages(), 0};
    DeviceArray<rt::PageCopy> deviceList(list, cut.stream());
    DeviceArray<int32_t> deviceCount(1);
    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cut.stream());
    auto const firstEntries = [&](int32_t count)
    { return std::vector<rt::PageCopy>(list.begin(), list.begin() + count); };

    for (int32_t const count : {kCAPACITY, kLIMIT + 120, kLIMIT})
    {
        SCOPED_TRACE("device count " + std::to_string(count));
        cut.refill();
        deviceCount.upload({count}, cut.stream());
        errors.upload({0}, cut.stream());
        rt::copyPagesDevice(
            cut.cache(), deviceList.get(), kCAPACITY, deviceCount.get(), cut.stream(), {}, errors.get());
        cut.reference().copy(firstEntries(count));
        ASSERT_TRUE(cut.matchesReference());
        EXPECT_EQ(errors.download(cut.stream())[0], count > kBAD_POSITION ? 1 : 0);
    }

    std::vector<int32_t> pages(kCAPACITY, rt::kUNUSED_PAGE_ENTRY);
    pages[kLIMIT - 1] = real[0].dst;
    pages[kCAPACITY - 1] = real[1].dst;
    DeviceArray<int32_t> devicePages(pages, cut.stream());
    cut.refill();
    rt::resetPagesDevice(cut.cache(), devicePages.get(), kCAPACITY, nullptr, cut.stream(), 0x5EEDF00DU);
    cut.reference().reset({real[0].dst, real[1].dst}, 0x5EEDF00DU);
    ASSERT_TRUE(cut.matchesReference());
}

TEST_F(PageOpsTest, OperationsQueueBehindEarlierWorkWithoutWaitingForIt)
{
    CacheUnderTest cut(smallConfig(), 21);
    // A stream other than the manager's: the operations follow the stream they are given.
    Stream other;
    std::vector<rt::PageCopy> const hostPairs = cut.randomPairs(10);
    std::vector<int32_t> const hostPages = cut.randomPages(6);
    std::vector<rt::PageCopy> const devicePairs = cut.randomPairs(8);
    std::vector<int32_t> const devicePages = cut.randomPages(5);
    DeviceArray<rt::PageCopy> deviceList(devicePairs, other.get());
    DeviceArray<int32_t> devicePageList(devicePages, other.get());
    auto const runAll = [&]
    {
        rt::copyPages(cut.cache(), hostPairs, other.get());
        rt::resetPages(cut.cache(), hostPages, other.get(), 0xDEADBEEFU);
        rt::copyPagesDevice(cut.cache(), deviceList.get(), 8, nullptr, other.get());
        rt::resetPagesDevice(cut.cache(), devicePageList.get(), 5, nullptr, other.get(), 0x7E007E00U);
    };
    auto const modelAll = [&]
    {
        cut.reference().copy(hostPairs);
        cut.reference().reset(hostPages, 0xDEADBEEFU);
        cut.reference().copy(devicePairs);
        cut.reference().reset(devicePages, 0x7E007E00U);
    };

    // A first round loads every kernel: with lazy loading, a first launch may wait for the device to go idle.
    runAll();
    KVCACHE_TEST_CUDA(cudaStreamSynchronize(other.get()));
    modelAll();
    ASSERT_TRUE(cut.matchesReference()) << "on a stream other than the manager's";
    cut.refill();

    // Some tools (compute-sanitizer among them) may make every launch wait for its kernel; nothing can be seen then.
    {
        StreamGate probe;
        probe.close(other.get(), 1LL << 29);
        bool const launchesBlock = probe.timedOut();
        probe.open();
        KVCACHE_TEST_CUDA(cudaStreamSynchronize(other.get()));
        if (launchesBlock)
        {
            GTEST_SKIP() << "kernel launches wait for their kernel here, so queued work cannot be held back";
        }
    }

    StreamGate gate;
    gate.close(other.get(), 1LL << 34);
    runAll();
    cudaError_t const pending = cudaStreamQuery(other.get());
    gate.open();
    KVCACHE_TEST_CUDA(cudaStreamSynchronize(other.get()));

    EXPECT_EQ(pending, cudaErrorNotReady) << "a page operation waited for the work queued before it";
    EXPECT_FALSE(gate.timedOut()) << "a page operation blocked until the holding kernel gave up";
    modelAll();
    ASSERT_TRUE(cut.matchesReference());
}

} // namespace
