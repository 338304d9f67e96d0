// DeviceAllocation, the owner of one stream-ordered allocation: argument checks (no GPU needed), then allocation,
// moves and release against a dedicated pool's counters on a GPU.

#include "kvcache/core/device_allocation.h"
#include "kvcache/core/errors.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/cuda_raii.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::throwsNaming;

static_assert(std::is_nothrow_destructible_v<rt::DeviceAllocation>);
static_assert(std::is_nothrow_move_constructible_v<rt::DeviceAllocation>);
static_assert(std::is_nothrow_move_assignable_v<rt::DeviceAllocation>);
static_assert(!std::is_copy_constructible_v<rt::DeviceAllocation>);
static_assert(!std::is_copy_assignable_v<rt::DeviceAllocation>);

TEST(DeviceAllocationTest, AnEmptyOwnerHoldsNothingAndReleasesNothing)
{
    rt::DeviceAllocation empty;
    EXPECT_EQ(empty.data(), nullptr);
    EXPECT_EQ(empty.size(), 0);
    rt::DeviceAllocation moved(std::move(empty));
    EXPECT_EQ(moved.data(), nullptr);
    moved.reset();
    EXPECT_EQ(moved.size(), 0);
}

TEST(DeviceAllocationTest, NonPositiveSizesAreRejectedBeforeAnyCudaCall)
{
    for (int64_t const bytes : {int64_t{0}, int64_t{-1}, INT64_MIN})
    {
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::DeviceAllocation allocation(bytes, nullptr); }, {"bytes", std::to_string(bytes), "> 0"}))
            << bytes;
    }
}

class DeviceAllocationGpuTest : public kvcache::test::GpuTest
{
};

TEST_F(DeviceAllocationGpuTest, AllocatesFromThePoolAndFreesOnItsStream)
{
    kvcache::test::DedicatedPool pool;
    kvcache::test::CudaStream stream;
    int device = 0;
    KVCACHE_TEST_CUDA(cudaGetDevice(&device));
    int64_t const bytes = int64_t{3} << 20;
    {
        rt::DeviceAllocation allocation(bytes, stream.get(), pool.get());
        ASSERT_NE(allocation.data(), nullptr);
        EXPECT_EQ(allocation.size(), bytes);
        EXPECT_EQ(allocation.stream(), stream.get());
        EXPECT_EQ(allocation.device(), device);
        // The memory is usable: write a pattern and read it back.
        KVCACHE_TEST_CUDA(cudaMemsetAsync(allocation.data(), 0x5A, static_cast<size_t>(bytes), stream.get()));
        std::vector<uint8_t> const back = kvcache::test::downloadBytes(allocation.data(), bytes, stream.get());
        EXPECT_EQ(back.front(), 0x5A);
        EXPECT_EQ(back.back(), 0x5A);
        EXPECT_GE(pool.usedBytes(), static_cast<uint64_t>(bytes));
    }
    stream.synchronize();
    EXPECT_EQ(pool.usedBytes(), 0u) << "the allocation was not returned";
}

TEST_F(DeviceAllocationGpuTest, MovesHandOverTheMemoryAndFreeItOnce)
{
    kvcache::test::DedicatedPool pool;
    kvcache::test::CudaStream stream;
    int64_t const bytes = int64_t{1} << 20;
    {
        rt::DeviceAllocation first(bytes, stream.get(), pool.get());
        void* const memory = first.data();
        rt::DeviceAllocation second(std::move(first));
        EXPECT_EQ(first.data(), nullptr);
        EXPECT_EQ(first.size(), 0);
        EXPECT_EQ(second.data(), memory);
        EXPECT_EQ(second.size(), bytes);

        rt::DeviceAllocation third(2 * bytes, stream.get(), pool.get());
        stream.synchronize();
        EXPECT_GE(pool.usedBytes(), static_cast<uint64_t>(3 * bytes));
        third = std::move(second);
        stream.synchronize();
        EXPECT_EQ(third.data(), memory);
        EXPECT_EQ(second.data(), nullptr);
        EXPECT_LT(pool.usedBytes(), static_cast<uint64_t>(3 * bytes)) << "the target's own memory was not freed";

        // A self-move gives the memory up rather than keeping half a state.
        rt::DeviceAllocation& alias = third;
        third = std::move(alias);
        stream.synchronize();
        EXPECT_EQ(third.data(), nullptr);
        EXPECT_EQ(pool.usedBytes(), 0u);
    }
    stream.synchronize();
    EXPECT_EQ(pool.usedBytes(), 0u) << "memory freed twice or never";
}

TEST_F(DeviceAllocationGpuTest, OutOfMemoryNamesTheCallTheSizeAndTheFreeMemory)
{
    kvcache::test::DedicatedPool pool;
    kvcache::test::CudaStream stream;
    size_t freeBytes = 0;
    size_t totalBytes = 0;
    KVCACHE_TEST_CUDA(cudaMemGetInfo(&freeBytes, &totalBytes));
    int64_t const bytes = 2 * static_cast<int64_t>(totalBytes);
    EXPECT_TRUE(
        throwsNaming<rt::OutOfMemoryError>([&] { rt::DeviceAllocation allocation(bytes, stream.get(), pool.get()); },
            {"cudaMallocFromPoolAsync", std::to_string(bytes), "free"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfMemoryError>([&] { rt::DeviceAllocation allocation(bytes, stream.get()); },
        {"cudaMallocAsync", std::to_string(bytes), "free"}));
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failed allocation left a CUDA error behind";
    stream.synchronize();
    EXPECT_EQ(pool.usedBytes(), 0u);
}

} // namespace
