// Page copies and resets from host lists (copyPages, resetPages), checked byte for byte against the host model:
// every data type, odd page sizes, large pages on the L2-hint path, targets, lists that span several launches, graph
// capture, rejected lists that must leave every byte alone, and ordering on the caller's stream.

#include "kvcache/core/data_type.h"
#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/memory/page_ops.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "support/cuda_raii.h"
#include "support/data_types.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/layout_model.h"
#include "support/page_op_reference.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::CacheUnderTest;
using kvcache::test::pagePoolConfig;
using kvcache::test::throwsNaming;

template <typename T>
class HostListPageOpsTypedTest : public kvcache::test::TypedGpuTest<T>
{
};
TYPED_TEST_SUITE(HostListPageOpsTypedTest, kvcache::test::AllKVCacheDataTypes, kvcache::test::DataTypeNames);

using HostListPageOpsTest = kvcache::test::GpuTest;

TYPED_TEST(HostListPageOpsTypedTest, RandomCopiesMatchTheReference)
{
    kvcache::test::forEachPageSize(TypeParam::value, 0,
        [](CacheUnderTest& cut)
        {
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
        });
}

TYPED_TEST(HostListPageOpsTypedTest, ResetsMatchTheReference)
{
    kvcache::test::forEachPageSize(TypeParam::value, 100,
        [](CacheUnderTest& cut)
        {
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
            }
        });
}

TEST_F(HostListPageOpsTest, PagesOfOddByteCountsAreCopiedAndResetToTheirLastByte)
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
        CacheUnderTest cut(pagePoolConfig(testCase.layers, testCase.tokensPerPage, 48).dataType(testCase.type), 5);

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
        int64_t const pageBytes =
            3 * int64_t{testCase.tokensPerPage} * kvcache::test::elementBytesByHand(testCase.type);
        uint8_t const littleEndian[4] = {0xEF, 0xBE, 0xAD, 0xDE};
        for (void* const pool : {cut.cache().kPoolPtr(0), cut.cache().vPoolPtr(0)})
        {
            std::vector<uint8_t> const bytes =
                kvcache::test::downloadBytes(static_cast<char*>(pool) + kPAGE * pageBytes, pageBytes, cut.stream());
            for (size_t i = 0; i < bytes.size(); ++i)
            {
                EXPECT_EQ(int{bytes[i]}, int{littleEndian[i % 4]}) << "byte " << i;
            }
        }
        ASSERT_TRUE(cut.matchesReference());
    }
}

TEST_F(HostListPageOpsTest, LargePagesOfWholeVectorsButNotWholeLinesAreCopiedExactly)
{
    // Pages of one or two whole 32 KiB chunks plus a tail, 16-byte multiples but not 128-byte ones (33,344 and
    // 66,624 bytes): whole chunks take the unrolled path, tails the loop. A full launch of 256 pairs writes over
    // 32 MiB, so it reads its sources at L2 priority evict_last and gives each line back; the 4-pair second launch of
    // a 260-pair list writes less and does not, nor does any launch for the single-layer V target.
    struct Case
    {
        char const* name;
        rt::KVCacheConfig config;
    };
    std::vector<Case> const cases{
        {"four alike layers", kvcache::test::largePageConfig()},
        {"mixed layers", pagePoolConfig({{1, 521}, {3, 347}, {1, 521}}, 32, 272)},
    };
    std::vector<rt::PageOpTarget> const targets{{0, -1, rt::KVHalf::kBOTH}, {1, 1, rt::KVHalf::kV}};
    for (Case const& testCase : cases)
    {
        SCOPED_TRACE(testCase.name);
        CacheUnderTest cut(testCase.config, 22);
        for (rt::PageOpTarget const& target : targets)
        {
            SCOPED_TRACE(kvcache::test::describe(target));
            for (int32_t const count : {rt::kMAX_INLINE_PAGE_OPS, 260})
            {
                std::vector<rt::PageCopy> const pairs = cut.randomPairs(count);
                rt::copyPages(cut.cache(), pairs, cut.stream(), target);
                cut.reference().copy(pairs, target);
                ASSERT_TRUE(cut.matchesReference()) << count << " pairs";
            }
            std::vector<int32_t> const pages = cut.randomPages(rt::kMAX_INLINE_PAGE_OPS);
            rt::resetPages(cut.cache(), pages, cut.stream(), 0xDEADBEEFU, target);
            cut.reference().reset(pages, 0xDEADBEEFU, target);
            ASSERT_TRUE(cut.matchesReference()) << "resetPages";
        }
    }
}

TEST_F(HostListPageOpsTest, CapturedHostListsReplayTheCapturedList)
{
    CacheUnderTest cut(kvcache::test::longListConfig(), 13);
    // Longer than one launch carries, so the graph holds several launches.
    constexpr int32_t kPAIRS = rt::kMAX_INLINE_PAGE_OPS + 188;
    constexpr uint32_t kPATTERN = 0xDEADBEEFU;
    std::vector<rt::PageCopy> pairs = cut.randomPairs(kPAIRS);
    std::vector<int32_t> pages = cut.randomPages(600);
    std::vector<rt::PageCopy> const capturedPairs = pairs;
    std::vector<int32_t> const capturedPages = pages;

    kvcache::test::CapturedGraph graph(cut.stream(),
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

TEST_F(HostListPageOpsTest, TargetsTouchOnlyTheChosenLayersAndHalves)
{
    CacheUnderTest cut(kvcache::test::smallConfig(), 14);
    for (rt::PageOpTarget const& target : kvcache::test::targetsOfThreeLayers())
    {
        SCOPED_TRACE(kvcache::test::describe(target));
        std::vector<rt::PageCopy> const pairs = cut.randomPairs(9);
        rt::copyPages(cut.cache(), pairs, cut.stream(), target);
        cut.reference().copy(pairs, target);
        ASSERT_TRUE(cut.matchesReference()) << "copyPages";

        std::vector<int32_t> const pages = cut.randomPages(6);
        rt::resetPages(cut.cache(), pages, cut.stream(), 0xDEADBEEFU, target);
        cut.reference().reset(pages, 0xDEADBEEFU, target);
        ASSERT_TRUE(cut.matchesReference()) << "resetPages";
    }
}

TEST_F(HostListPageOpsTest, BadTargetsThrowBeforeAnyLaunch)
{
    CacheUnderTest cut(kvcache::test::smallConfig(), 15);
    std::vector<rt::PageCopy> const pairs = cut.randomPairs(4);
    std::vector<int32_t> const pages = cut.randomPages(4);
    for (kvcache::test::BadTarget const& bad : kvcache::test::badTargetsOfThreeLayers())
    {
        SCOPED_TRACE(kvcache::test::describe(bad.target));
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::copyPages(cut.cache(), pairs, cut.stream(), bad.target); }, bad.named("copyPages")));
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
            { rt::resetPages(cut.cache(), pages, cut.stream(), 0xDEADBEEFU, bad.target); },
            bad.named("resetPages")));
    }
    ASSERT_TRUE(cut.matchesReference());
}

TEST_F(HostListPageOpsTest, AnEmptyLayerRangeIsANoOp)
{
    CacheUnderTest cut(kvcache::test::smallConfig(), 16);
    rt::PageOpTarget const target{1, 0, rt::KVHalf::kBOTH};
    EXPECT_NO_THROW(rt::copyPages(cut.cache(), cut.randomPairs(4), cut.stream(), target));
    EXPECT_NO_THROW(rt::resetPages(cut.cache(), cut.randomPages(4), cut.stream(), 0xDEADBEEFU, target));
    ASSERT_TRUE(cut.matchesReference());
}

TEST_F(HostListPageOpsTest, HostCopyRejectsBadListsBeforeAnyLaunch)
{
    CacheUnderTest cut(kvcache::test::smallConfig(), 17);
    int32_t const n = cut.numPages();
    std::string const range = "page ids must be in [0, " + std::to_string(n) + ")";
    // The bad pair comes last, so a launch of the leading good pairs would show in the buffer.
    for (int32_t const bad : kvcache::test::pageIdsOutside(n))
    {
        SCOPED_TRACE("id " + std::to_string(bad));
        std::vector<rt::PageCopy> const badSource{{1, 2}, {3, 4}, {bad, 5}};
        std::vector<rt::PageCopy> const badDestination{{1, 2}, {3, 4}, {6, bad}};
        EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>([&] { rt::copyPages(cut.cache(), badSource, cut.stream()); },
            {"copyPages: pairs.src[2] is page " + std::to_string(bad), range}));
        EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>([&] { rt::copyPages(cut.cache(), badDestination, cut.stream()); },
            {"copyPages: pairs.dst[2] is page " + std::to_string(bad), range}));
    }

    struct Conflict
    {
        std::vector<rt::PageCopy> pairs;
        std::string named;
    };
    std::vector<Conflict> const conflicting{
        {{{1, 2}, {3, 4}, {5, 2}}, "page 2 is a destination more than once"},
        {{{1, 2}, {2, 4}}, "page 2 is both a source and a destination"},
        {{{1, 2}, {3, 1}}, "page 1 is both a source and a destination"},
        {{{1, 2}, {6, 6}}, "page 6 is both a source and a destination"}, // a page copied onto itself
    };
    for (Conflict const& conflict : conflicting)
    {
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::copyPages(cut.cache(), conflict.pairs, cut.stream()); }, {"copyPages: " + conflict.named}));
    }

    std::vector<rt::PageCopy> const good{{1, 2}};
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::copyPages(cut.cache(), good.data(), -1, cut.stream()); }, {"copyPages: count is -1"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::copyPages(cut.cache(), nullptr, 1, cut.stream()); }, {"copyPages: the list is null but count is 1"}));
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

TEST_F(HostListPageOpsTest, HostResetRejectsBadListsBeforeAnyLaunch)
{
    CacheUnderTest cut(kvcache::test::smallConfig(), 18);
    int32_t const n = cut.numPages();
    for (int32_t const bad : kvcache::test::pageIdsOutside(n))
    {
        SCOPED_TRACE("id " + std::to_string(bad));
        std::vector<int32_t> const pages{1, 2, bad};
        EXPECT_TRUE(
            throwsNaming<rt::OutOfRangeError>([&] { rt::resetPages(cut.cache(), pages, cut.stream(), 0xDEADBEEFU); },
                {"resetPages: pages[2] is page " + std::to_string(bad), "[0, " + std::to_string(n) + ")"}));
    }
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            rt::resetPages(cut.cache(), std::vector<int32_t>{1, 2, 3, 2}, cut.stream());
        },
        {"resetPages: page 2", "more than once"}));
    std::vector<int32_t> const good{1};
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::resetPages(cut.cache(), good.data(), -1, cut.stream()); }, {"resetPages: count is -1"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { rt::resetPages(cut.cache(), nullptr, 2, cut.stream()); },
        {"resetPages: the list is null but count is 2"}));
    ASSERT_TRUE(cut.matchesReference()) << "a rejected list changed the buffer";

    EXPECT_NO_THROW(rt::resetPages(cut.cache(), nullptr, 0, cut.stream(), 0xDEADBEEFU));
    EXPECT_NO_THROW(rt::resetPages(cut.cache(), std::vector<int32_t>{}, cut.stream(), 0xDEADBEEFU));
    ASSERT_TRUE(cut.matchesReference()) << "an empty list changed the buffer";
}

TEST_F(HostListPageOpsTest, LongHostListsSpanSeveralLaunches)
{
    CacheUnderTest cut(kvcache::test::longListConfig(), 19);
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
        KVCACHE_CUDA_LOG(cudaDeviceSynchronize());
        KVCACHE_CUDA_LOG(cudaFreeHost(mFlags));
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

TEST_F(HostListPageOpsTest, OperationsQueueBehindEarlierWorkWithoutWaitingForIt)
{
    CacheUnderTest cut(kvcache::test::smallConfig(), 21);
    // A stream other than the manager's: the operations follow the stream they are given.
    kvcache::test::CudaStream other;
    std::vector<rt::PageCopy> const hostPairs = cut.randomPairs(10);
    std::vector<int32_t> const hostPages = cut.randomPages(6);
    std::vector<rt::PageCopy> const devicePairs = cut.randomPairs(8);
    std::vector<int32_t> const devicePages = cut.randomPages(5);
    kvcache::test::DeviceArray<rt::PageCopy> deviceList(devicePairs, other.get());
    kvcache::test::DeviceArray<int32_t> devicePageList(devicePages, other.get());
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
