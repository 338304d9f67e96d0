// GPU tests of page transfer over NCCL, in one process driving two GPUs (one thread a side, non-blocking
// communicators as a runtime makes them): byte-exact pages with distinct K and V values across retained page ids and
// several page groups, on the run-by-run and the staged path; a geometry mismatch refused on both sides with the
// receiver's pages untouched; and a peer that never posts failing the other side within its timeout, with its stream
// drained by the abort (under a watchdog that ends the process rather than let it hang). Quantized caches:
// test_page_transfer_scales.cu.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/dist/page_transfer.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/page_transfer_fixture.h"

namespace kvcache::rt
{
namespace
{

using test::rethrowIfAny;
using test::transferConfig;
using test::Watchdog;

class PageTransferTest : public test::PageTransferFixture
{
};

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
        expectMismatch(error, "geometry fingerprint");
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
    test::TransferSide const& side = mSides[0];
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
