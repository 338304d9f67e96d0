#pragma once

// The two-GPU fixture of the page transfer tests: one process drives both sides (one thread a side, non-blocking
// communicators as a runtime makes them), the sender's pages hold a byte pattern distinct across layer, half and page
// (data and scale pages alike), the receiver's a poison byte, and the receiver's pages are checked byte for byte
// against that model. Skips with fewer than two GPUs, fails under KVCACHE_REQUIRE_GPU=1.

#include "core/layout/scale_support.h"

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/dist/page_transfer.h"
#include "kvcache/memory/kv_cache_manager.h"

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

namespace kvcache::test
{

inline constexpr uint8_t kTRANSFER_POISON = 0xA5;

//! The byte every sent page holds at `offset` of (layer, half, page): distinct across all four, K apart from V and
//! data apart from scales (halves 0 and 1 are K and V data, 2 and 3 K and V scales; see poolHalves).
inline uint8_t sentByte(int32_t layer, int32_t half, int32_t page, int64_t offset)
{
    uint64_t x = (uint64_t(layer) << 48) ^ (uint64_t(half) << 40) ^ (uint64_t(page) << 24) ^ uint64_t(offset);
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return static_cast<uint8_t>(x == kTRANSFER_POISON ? x + 1 : x);
}

//! Three layers in two page groups: full-attention K/V (layer 0) and latent (layer 2) layers in group 0, a 64-token
//! window (layer 1) in group 1. Tokens per page 16, so a page of layer 0 is 16 * 4 * 64 * 2 = 8,192 bytes in float16.
//! Every headDim is a multiple of 16, so NVFP4 can hold it too.
inline ConfigBuilder transferConfig(int32_t headDim0 = 64)
{
    return ConfigBuilder(
        {rt::KVLayerConfig{4, headDim0, 0, rt::KVLayerKind::kKV}, rt::KVLayerConfig{2, 32, 64, rt::KVLayerKind::kKV},
            rt::KVLayerConfig{1, 96, 0, rt::KVLayerKind::kLATENT}})
        .maxBatchSize(2)
        .maxSequenceLength(512)
        .tokensPerPage(16)
        .maxTokensPerStep(64);
}

//! One half of one layer's pages, data or scales: `numPages` pages of `pageBytes` from `pool`.
struct PoolHalf
{
    void* pool;
    int32_t half; //!< 0 K data, 1 V data, 2 K scales, 3 V scales
    int64_t pageBytes;
    int32_t numPages;
};

//! Returns every half of layer `layer`'s pages: K and V data (a latent layer: K), then, with scale pools, K and V
//! scales (a latent layer: K scales).
inline std::vector<PoolHalf> poolHalves(rt::KVCacheManager const& cache, int32_t layer)
{
    rt::KVLayerLayout const& layout = cache.layout().layers[static_cast<size_t>(layer)];
    std::vector<PoolHalf> halves = {{cache.kPoolPtr(layer), 0, layout.pageBytes, layout.numPages}};
    if (layout.numHalves == 2)
    {
        halves.push_back({cache.vPoolPtr(layer), 1, layout.pageBytes, layout.numPages});
    }
    if (rt::detail::keepsScalePools(cache.layout().quantization))
    {
        rt::LayerRef const ref = cache.layerRef(layer);
        halves.push_back({ref.kScalePool, 2, layout.scalePageBytes, layout.numPages});
        if (layout.numHalves == 2)
        {
            halves.push_back({ref.vScalePool, 3, layout.scalePageBytes, layout.numPages});
        }
    }
    return halves;
}

//! The host-held scales makeCaches gives layer `layer` on both sides: distinct across layers, K apart from V, valid
//! for every quantization that keeps them (finite, > 0).
inline rt::LayerScales transferLayerScales(int32_t layer)
{
    return rt::LayerScales{0.5F + static_cast<float>(layer), 0.125F + static_cast<float>(layer)};
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
struct TransferSide
{
    int32_t device = 0;
    ncclComm_t comm = nullptr;
    std::unique_ptr<CudaStream> stream;
    std::unique_ptr<rt::KVCacheManager> cache;
};

//! Rethrows the first exception of `errors`, if any.
inline void rethrowIfAny(std::array<std::exception_ptr, 2> const& errors)
{
    for (std::exception_ptr const& error : errors)
    {
        if (error)
        {
            std::rethrow_exception(error);
        }
    }
}

//! Two ranks on GPUs 0 and 1 with a communicator each; side 0 sends, side 1 receives.
class PageTransferFixture : public GpuTest
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
            if (gpuRequired())
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
        for (TransferSide& side : mSides)
        {
            ncclResult_t state = ncclInProgress;
            while (state == ncclInProgress)
            {
                ASSERT_EQ(ncclCommGetAsyncError(side.comm, &state), ncclSuccess);
            }
            ASSERT_EQ(state, ncclSuccess) << ncclGetErrorString(state);
            KVCACHE_TEST_CUDA(cudaSetDevice(side.device));
            side.stream = std::make_unique<CudaStream>();
        }
    }

    void TearDown() override
    {
        for (TransferSide& side : mSides)
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

    //! Builds each side's cache on its device: every half of the sender's pages (data and scales) holds sentByte, the
    //! receiver's kTRANSFER_POISON; both get transferLayerScales when their quantization keeps host-held scales.
    void makeCaches(rt::KVCacheConfig const& sender, rt::KVCacheConfig const& receiver)
    {
        for (int32_t rank = 0; rank < 2; ++rank)
        {
            TransferSide& side = mSides[rank];
            KVCACHE_TEST_CUDA(cudaSetDevice(side.device));
            side.cache = std::make_unique<rt::KVCacheManager>(rank == 0 ? sender : receiver, side.stream->get());
            bool const hostScales = rt::detail::keepsHostScales(side.cache->layout().quantization);
            for (int32_t layer = 0; layer < side.cache->numLayers(); ++layer)
            {
                if (hostScales)
                {
                    side.cache->setLayerScales(layer, transferLayerScales(layer));
                }
                for (PoolHalf const& half : poolHalves(*side.cache, layer))
                {
                    std::vector<uint8_t> bytes(static_cast<size_t>(half.numPages * half.pageBytes), kTRANSFER_POISON);
                    if (rank == 0)
                    {
                        for (size_t b = 0; b < bytes.size(); ++b)
                        {
                            auto const page = static_cast<int32_t>(static_cast<int64_t>(b) / half.pageBytes);
                            bytes[b] = sentByte(layer, half.half, page, static_cast<int64_t>(b) % half.pageBytes);
                        }
                    }
                    uploadBytes(half.pool, bytes, side.stream->get());
                }
            }
        }
    }

    //! Runs sendPages on side 0 and receivePages on side 1 at once; returns each side's exception, if any.
    std::array<std::exception_ptr, 2> transfer(int32_t group, std::vector<int32_t> const& from,
        std::vector<int32_t> const& to, rt::TransferOptions const& options, bool receiverPosts = true)
    {
        std::array<std::exception_ptr, 2> errors;
        auto const run = [&](int32_t rank)
        {
            try
            {
                TransferSide const& side = mSides[rank];
                KVCACHE_CUDA_TRY(cudaSetDevice(side.device));
                std::vector<int32_t> const& pages = rank == 0 ? from : to;
                if (rank == 0)
                {
                    rt::sendPages(*side.cache, group, pages.data(), static_cast<int32_t>(pages.size()), 1, side.comm,
                        side.stream->get(), options);
                }
                else
                {
                    rt::receivePages(*side.cache, group, pages.data(), static_cast<int32_t>(pages.size()), 0, side.comm,
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

    //! Checks every half (data and scales) of every page of the receiver's group `group`: listed ones hold the
    //! sender's page, the others kTRANSFER_POISON.
    void expectReceived(int32_t group, std::vector<int32_t> const& from, std::vector<int32_t> const& to)
    {
        TransferSide const& side = mSides[1];
        KVCACHE_TEST_CUDA(cudaSetDevice(side.device));
        for (int32_t const layer : side.cache->group(group).layers)
        {
            for (PoolHalf const& half : poolHalves(*side.cache, layer))
            {
                std::vector<uint8_t> const bytes =
                    downloadBytes(half.pool, half.numPages * half.pageBytes, side.stream->get());
                std::vector<int32_t> source(static_cast<size_t>(half.numPages), -1);
                for (size_t i = 0; i < to.size(); ++i)
                {
                    source[static_cast<size_t>(to[i])] = from[i];
                }
                int64_t mismatches = 0;
                for (size_t b = 0; b < bytes.size(); ++b)
                {
                    int32_t const sent = source[static_cast<size_t>(static_cast<int64_t>(b) / half.pageBytes)];
                    uint8_t const expected = sent < 0
                        ? kTRANSFER_POISON
                        : sentByte(layer, half.half, sent, static_cast<int64_t>(b) % half.pageBytes);
                    mismatches += bytes[b] != expected ? 1 : 0;
                }
                EXPECT_EQ(mismatches, 0) << "bytes of group " << group << ", layer " << layer << ", half " << half.half
                                         << " (0/1 K/V data, 2/3 K/V scales) that differ from the model";
            }
        }
    }

    //! Expects `error` to be a TransferError kMISMATCH whose message holds `naming`.
    static void expectMismatch(std::exception_ptr const& error, std::string const& naming)
    {
        ASSERT_TRUE(error) << "no error; expected a refusal naming '" << naming << "'";
        try
        {
            std::rethrow_exception(error);
        }
        catch (rt::TransferError const& transferError)
        {
            EXPECT_EQ(transferError.failure(), rt::TransferFailure::kMISMATCH);
            EXPECT_FALSE(transferError.pagesInvalid());
            EXPECT_NE(std::string(transferError.what()).find(naming), std::string::npos) << transferError.what();
        }
        catch (std::exception const& other)
        {
            ADD_FAILURE() << "another exception: " << other.what();
        }
    }

    std::array<TransferSide, 2> mSides{};
    //! Set by a test that may hang; ends the process if the test and TearDown are not done in time.
    std::unique_ptr<Watchdog> mWatchdog;
};

} // namespace kvcache::test
