// GPU tests of page transfer over NCCL, in one process driving two GPUs (one thread a side, non-blocking
// communicators as a runtime makes them): byte-exact pages with distinct K and V values across retained page ids and
// several page groups, on the run-by-run and the staged path; a geometry mismatch refused on both sides with the
// receiver's pages untouched; and a peer that never posts failing the other side within its timeout, with its stream
// drained by the abort (under a watchdog that ends the process rather than let it hang).

#include "kvcache/errors.h"
#include "kvcache/kv_cache_config.h"
#include "kvcache/kv_cache_manager.h"
#include "kvcache/transfer/page_transfer.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/gpu_availability.h"
#include "support/gpu_test.h"

namespace kvcache::rt
{
namespace
{

constexpr uint8_t kPOISON = 0xA5;

//! Three groups: full-attention K/V and latent layers (group 0) and a 64-token window (group 1). Tokens per page 16,
//! so a page of layer 0 is 16 * 4 * 64 * 2 = 8,192 bytes.
test::ConfigBuilder transferConfig(int32_t headDim0 = 64)
{
    return test::ConfigBuilder(
        {KVLayerConfig{4, headDim0, 0, KVLayerKind::kKV}, KVLayerConfig{2, 32, 64, KVLayerKind::kKV},
            KVLayerConfig{1, 96, 0, KVLayerKind::kLATENT}})
        .maxBatchSize(2)
        .maxSequenceLength(512)
        .tokensPerPage(16)
        .maxTokensPerStep(64);
}

//! The byte every sent page holds at `offset` of (layer, half, page): distinct across all four, K apart from V.
uint8_t sentByte(int32_t layer, int32_t half, int32_t page, int64_t offset)
{
    uint64_t x = (uint64_t(layer) << 48) ^ (uint64_t(half) << 40) ^ (uint64_t(page) << 24) ^ uint64_t(offset);
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return static_cast<uint8_t>(x == kPOISON ? x + 1 : x);
}

//! Ends the process with a message if it is not destroyed within `limit`: a transfer that hangs (a stream that never
//! drains, a thread that never joins) must fail the test binary, not stall the run that started it.
class Watchdog
{
public:
    Watchdog(std::chrono::seconds limit, std::string what)
        : mWhat(std::move(what))
        , mThread([this, limit] { watch(limit); })
    {
    }
    ~Watchdog()
    {
        {
            std::lock_guard<std::mutex> const lock(mMutex);
            mDone = true;
        }
        mWake.notify_all();
        mThread.join();
    }
    Watchdog(Watchdog const&) = delete;
    Watchdog& operator=(Watchdog const&) = delete;

private:
    void watch(std::chrono::seconds limit)
    {
        std::unique_lock<std::mutex> lock(mMutex);
        if (!mWake.wait_for(lock, limit, [this] { return mDone; }))
        {
            std::fprintf(stderr, "FATAL: %s still running after %lld s; the watchdog ends the process\n", mWhat.c_str(),
                static_cast<long long>(limit.count()));
            std::fflush(stderr);
            std::_Exit(1);
        }
    }

    std::string mWhat;
    std::mutex mMutex;
    std::condition_variable mWake;
    bool mDone{false};
    std::thread mThread; // last: it reads the members above
};

//! One side: a device, a stream, a communicator and a cache.
struct Side
{
    int32_t device = 0;
    ncclComm_t comm = nullptr;
    std::unique_ptr<test::CudaStream> stream;
    std::unique_ptr<KVCacheManager> cache;
};

class PageTransferTest : public test::GpuTest
{
protected:
    void SetUp() override
    {
        GpuTest::SetUp();
        if (IsSkipped() || HasFatalFailure())
        {
            return;
        }
        int devices = 0;
        KVCACHE_TEST_CUDA(cudaGetDeviceCount(&devices));
        if (devices < 2)
        {
            if (test::gpuRequired())
            {
                GTEST_FAIL() << "KVCACHE_REQUIRE_GPU=1 but page transfer tests need two GPUs; found " << devices;
            }
            GTEST_SKIP() << "needs two GPUs, found " << devices;
        }
        ncclUniqueId id;
        ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        ASSERT_EQ(ncclGroupStart(), ncclSuccess);
        for (int32_t rank = 0; rank < 2; ++rank)
        {
            mSides[rank].device = rank;
            KVCACHE_TEST_CUDA(cudaSetDevice(rank));
            ncclResult_t const result = ncclCommInitRankConfig(&mSides[rank].comm, 2, id, rank, &config);
            ASSERT_TRUE(result == ncclSuccess || result == ncclInProgress) << ncclGetErrorString(result);
        }
        ncclResult_t const grouped = ncclGroupEnd();
        ASSERT_TRUE(grouped == ncclSuccess || grouped == ncclInProgress) << ncclGetErrorString(grouped);
        for (Side& side : mSides)
        {
            ncclResult_t state = ncclInProgress;
            while (state == ncclInProgress)
            {
                ASSERT_EQ(ncclCommGetAsyncError(side.comm, &state), ncclSuccess);
            }
            ASSERT_EQ(state, ncclSuccess) << ncclGetErrorString(state);
            KVCACHE_TEST_CUDA(cudaSetDevice(side.device));
            side.stream = std::make_unique<test::CudaStream>();
        }
    }

    void TearDown() override
    {
        for (Side& side : mSides)
        {
            cudaSetDevice(side.device);
            side.cache.reset();
            side.stream.reset();
            // Abort rather than destroy: a test may leave a communicator mid-operation. A failed transfer has
            // aborted (freed) its communicator already; the test then set it to null.
            if (side.comm != nullptr)
            {
                ncclCommAbort(side.comm);
            }
        }
        // Stopped only now: destroying the streams above synchronizes them, and that must not hang either.
        mWatchdog.reset();
    }

    //! Builds each side's cache on its device: the sender's pages hold sentByte, the receiver's kPOISON.
    void makeCaches(KVCacheConfig const& sender, KVCacheConfig const& receiver)
    {
        for (int32_t rank = 0; rank < 2; ++rank)
        {
            Side& side = mSides[rank];
            KVCACHE_TEST_CUDA(cudaSetDevice(side.device));
            side.cache = std::make_unique<KVCacheManager>(rank == 0 ? sender : receiver, side.stream->get());
            for (int32_t layer = 0; layer < side.cache->numLayers(); ++layer)
            {
                KVLayerLayout const& layout = side.cache->layout().layers[static_cast<size_t>(layer)];
                for (int32_t half = 0; half < layout.numHalves; ++half)
                {
                    void* const pool = half == 0 ? side.cache->kPoolPtr(layer) : side.cache->vPoolPtr(layer);
                    std::vector<uint8_t> bytes(static_cast<size_t>(layout.numPages * layout.pageBytes), kPOISON);
                    if (rank == 0)
                    {
                        for (size_t b = 0; b < bytes.size(); ++b)
                        {
                            auto const page = static_cast<int32_t>(static_cast<int64_t>(b) / layout.pageBytes);
                            bytes[b] = sentByte(layer, half, page, static_cast<int64_t>(b) % layout.pageBytes);
                        }
                    }
                    test::uploadBytes(pool, bytes, side.stream->get());
                }
            }
        }
    }

    //! Runs sendPages on side 0 and receivePages on side 1 at once; returns each side's exception, if any.
    std::array<std::exception_ptr, 2> transfer(int32_t group, std::vector<int32_t> const& from,
        std::vector<int32_t> const& to, TransferOptions const& options, bool receiverPosts = true)
    {
        std::array<std::exception_ptr, 2> errors;
        auto const run = [&](int32_t rank)
        {
            try
            {
                Side const& side = mSides[rank];
                KVCACHE_CUDA_TRY(cudaSetDevice(side.device));
                std::vector<int32_t> const& pages = rank == 0 ? from : to;
                if (rank == 0)
                {
                    sendPages(*side.cache, group, pages.data(), static_cast<int32_t>(pages.size()), 1, side.comm,
                        side.stream->get(), options);
                }
                else
                {
                    receivePages(*side.cache, group, pages.data(), static_cast<int32_t>(pages.size()), 0, side.comm,
                        side.stream->get(), options);
                }
            }
            catch (...)
            {
                errors[static_cast<size_t>(rank)] = std::current_exception();
            }
        };
        std::thread sender(run, 0);
        if (receiverPosts)
        {
            run(1);
        }
        sender.join();
        return errors;
    }

    //! Checks every page of the receiver's group `group`: listed ones hold the sender's page, the others kPOISON.
    void expectReceived(int32_t group, std::vector<int32_t> const& from, std::vector<int32_t> const& to)
    {
        Side const& side = mSides[1];
        KVCACHE_TEST_CUDA(cudaSetDevice(side.device));
        int64_t mismatches = 0;
        for (int32_t const layer : side.cache->group(group).layers)
        {
            KVLayerLayout const& layout = side.cache->layout().layers[static_cast<size_t>(layer)];
            for (int32_t half = 0; half < layout.numHalves; ++half)
            {
                void* const pool = half == 0 ? side.cache->kPoolPtr(layer) : side.cache->vPoolPtr(layer);
                std::vector<uint8_t> const bytes =
                    test::downloadBytes(pool, layout.numPages * layout.pageBytes, side.stream->get());
                std::vector<int32_t> source(static_cast<size_t>(layout.numPages), -1);
                for (size_t i = 0; i < to.size(); ++i)
                {
                    source[static_cast<size_t>(to[i])] = from[i];
                }
                for (size_t b = 0; b < bytes.size(); ++b)
                {
                    int32_t const sent = source[static_cast<size_t>(static_cast<int64_t>(b) / layout.pageBytes)];
                    uint8_t const expected =
                        sent < 0 ? kPOISON : sentByte(layer, half, sent, static_cast<int64_t>(b) % layout.pageBytes);
                    mismatches += bytes[b] != expected ? 1 : 0;
                }
            }
        }
        EXPECT_EQ(mismatches, 0) << "bytes of group " << group << " that differ from the model";
    }

    std::array<Side, 2> mSides{};
    //! Set by a test that may hang; ends the process if the test and TearDown are not done in time.
    std::unique_ptr<Watchdog> mWatchdog;
};

void rethrowIfAny(std::array<std::exception_ptr, 2> const& errors)
{
    for (std::exception_ptr const& error : errors)
    {
        if (error)
        {
            std::rethrow_exception(error);
        }
    }
}

TEST_F(PageTransferTest, RunsAndScatteredPagesArriveByteExactInEveryGroupAndPath)
{
    // The receiver's pools are larger: retained page ids beyond its minimum receive too.
    makeCaches(transferConfig(), transferConfig().numPagesPerGroup({100, 40}));
    // Group 0: 64 pages minimum on the sender (2 x 32). Group 1: 2 x 6 = 12 pages on the sender.
    std::vector<int32_t> contiguousFrom = {5, 6, 7, 8, 9, 10};
    std::vector<int32_t> contiguousTo = {90, 91, 92, 93, 94, 95};
    std::vector<int32_t> scatteredFrom;
    std::vector<int32_t> scatteredTo;
    for (int32_t i = 0; i < 20; ++i)
    {
        scatteredFrom.push_back((i * 7) % 64);
        scatteredTo.push_back(89 - i * 3);
    }
    for (TransferPath const path : {TransferPath::kAUTO, TransferPath::kDIRECT, TransferPath::kSTAGED})
    {
        SCOPED_TRACE(testing::Message() << "path " << static_cast<int32_t>(path));
        TransferOptions options;
        options.path = path;
        ASSERT_NO_THROW(rethrowIfAny(transfer(0, contiguousFrom, contiguousTo, options)));
        ASSERT_NO_THROW(rethrowIfAny(transfer(0, scatteredFrom, scatteredTo, options)));
        ASSERT_NO_THROW(rethrowIfAny(transfer(1, {11, 0, 3, 4}, {39, 12, 20, 21}, options)));
    }
    std::vector<int32_t> from = contiguousFrom;
    std::vector<int32_t> to = contiguousTo;
    from.insert(from.end(), scatteredFrom.begin(), scatteredFrom.end());
    to.insert(to.end(), scatteredTo.begin(), scatteredTo.end());
    expectReceived(0, from, to);
    expectReceived(1, {11, 0, 3, 4}, {39, 12, 20, 21});
}

TEST_F(PageTransferTest, ZeroPagesOnlyExchangeTheHeader)
{
    makeCaches(transferConfig(), transferConfig());
    ASSERT_NO_THROW(rethrowIfAny(transfer(0, {}, {}, {})));
    expectReceived(0, {}, {});
}

TEST_F(PageTransferTest, GeometryMismatchIsRefusedOnBothSides)
{
    makeCaches(transferConfig(64), transferConfig(128));
    auto const errors = transfer(0, {1, 2, 3}, {4, 5, 6}, {});
    for (std::exception_ptr const& error : errors)
    {
        ASSERT_TRUE(error);
        try
        {
            std::rethrow_exception(error);
        }
        catch (TransferError const& transferError)
        {
            EXPECT_EQ(transferError.failure(), TransferFailure::kMISMATCH);
            EXPECT_FALSE(transferError.pagesInvalid());
            EXPECT_NE(std::string(transferError.what()).find("geometry fingerprint"), std::string::npos)
                << transferError.what();
        }
        catch (std::exception const& other)
        {
            ADD_FAILURE() << "another exception: " << other.what();
        }
    }
    expectReceived(0, {}, {});
}

TEST_F(PageTransferTest, CountMismatchIsRefused)
{
    makeCaches(transferConfig(), transferConfig());
    std::vector<int32_t> const three = {1, 2, 3};
    std::array<std::exception_ptr, 2> errors;
    std::thread sender(
        [&]
        {
            try
            {
                KVCACHE_CUDA_TRY(cudaSetDevice(0));
                sendPages(*mSides[0].cache, 0, three.data(), 3, 1, mSides[0].comm, mSides[0].stream->get());
            }
            catch (...)
            {
                errors[0] = std::current_exception();
            }
        });
    try
    {
        KVCACHE_CUDA_TRY(cudaSetDevice(1));
        receivePages(*mSides[1].cache, 0, three.data(), 2, 0, mSides[1].comm, mSides[1].stream->get());
    }
    catch (...)
    {
        errors[1] = std::current_exception();
    }
    sender.join();
    for (std::exception_ptr const& error : errors)
    {
        EXPECT_THROW(std::rethrow_exception(error), TransferError);
    }
    expectReceived(0, {}, {});
}

TEST_F(PageTransferTest, PeerThatNeverPostsFailsWithinTheTimeout)
{
    mWatchdog = std::make_unique<Watchdog>(
        std::chrono::seconds(60), "PageTransferTest.PeerThatNeverPostsFailsWithinTheTimeout");
    makeCaches(transferConfig(), transferConfig());
    // One good transfer first, so that the connection exists and only the missing peer can stall the next one.
    ASSERT_NO_THROW(rethrowIfAny(transfer(0, {1}, {2}, {})));
    TransferOptions options;
    options.timeoutMs = 500;
    auto const start = std::chrono::steady_clock::now();
    auto const errors = transfer(0, {3, 4}, {5, 6}, options, /*receiverPosts=*/false);
    double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(errors[0]);
    try
    {
        std::rethrow_exception(errors[0]);
    }
    catch (TransferError const& error)
    {
        if (error.pagesInvalid())
        {
            mSides[0].comm = nullptr; // aborted, and so freed, by the failed call
        }
        EXPECT_EQ(error.failure(), TransferFailure::kTIMEOUT);
        EXPECT_TRUE(error.pagesInvalid());
        EXPECT_TRUE(error.streamDrained()) << error.what();
        EXPECT_NE(std::string(error.what()).find("timeoutMs = 500"), std::string::npos) << error.what();
    }
    catch (std::exception const& other)
    {
        ADD_FAILURE() << "another exception: " << other.what();
    }
    // Within the timeout plus the abort's own time.
    EXPECT_LT(seconds, 10.0);
    EXPECT_GE(seconds, 0.5);
    // The abort ended the NCCL kernel the call had queued: the sender's stream drains on its own (polled here, so that
    // a kernel that did not end fails this check instead of hanging it).
    KVCACHE_TEST_CUDA(cudaSetDevice(mSides[0].device));
    auto const drainUntil = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    cudaError_t query = cudaStreamQuery(mSides[0].stream->get());
    while (query == cudaErrorNotReady && std::chrono::steady_clock::now() < drainUntil)
    {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        query = cudaStreamQuery(mSides[0].stream->get());
    }
    EXPECT_EQ(query, cudaSuccess) << "the sender's stream after the abort: " << cudaGetErrorString(query);
    if (query == cudaErrorNotReady)
    {
        // Abandoned as TransferError documents: never synchronized, so TearDown cannot hang on it.
        static_cast<void>(mSides[0].stream.release());
        static_cast<void>(mSides[0].cache.release());
    }
}

TEST_F(PageTransferTest, BadArgumentsThrowBeforeTheCommunicatorIsUsed)
{
    makeCaches(transferConfig(), transferConfig());
    Side const& side = mSides[0];
    KVCACHE_TEST_CUDA(cudaSetDevice(0));
    std::vector<int32_t> const pages = {1, 1};
    EXPECT_THROW(sendPages(*side.cache, 2, pages.data(), 1, 1, side.comm, side.stream->get()), InvalidArgumentError);
    EXPECT_THROW(sendPages(*side.cache, 0, pages.data(), 2, 1, side.comm, side.stream->get()), InvalidArgumentError);
    EXPECT_THROW(sendPages(*side.cache, 0, pages.data(), 1, 0, side.comm, side.stream->get()), InvalidArgumentError);
    std::vector<int32_t> const outside = {64};
    EXPECT_THROW(sendPages(*side.cache, 0, outside.data(), 1, 1, side.comm, side.stream->get()), OutOfRangeError);
    TransferOptions noTime;
    noTime.timeoutMs = 0;
    EXPECT_THROW(
        sendPages(*side.cache, 0, pages.data(), 1, 1, side.comm, side.stream->get(), noTime), InvalidArgumentError);
    // The communicator still works.
    ASSERT_NO_THROW(rethrowIfAny(transfer(0, {7}, {8}, {})));
    expectReceived(0, {7}, {8});
}

} // namespace
} // namespace kvcache::rt
