// The library's CUDA owners (src/core/cuda_owners.h): argument checks and empty owners (no GPU needed), then
// allocation, moves and release on a GPU, checked through CUDA's own view of each pointer.

#include "core/cuda_owners.h"

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
// The owners under test, by their own names.
using namespace kvcache::rt::detail;
using kvcache::test::throwsNaming;

template <typename Owner>
constexpr bool kMOVE_ONLY_AND_QUIET =
    std::is_nothrow_destructible_v<Owner>&& std::is_nothrow_move_constructible_v<Owner>&&
        std::is_nothrow_move_assignable_v<
            Owner> && !std::is_copy_constructible_v<Owner> && !std::is_copy_assignable_v<Owner>;
static_assert(kMOVE_ONLY_AND_QUIET<DeviceBuffer>);
static_assert(kMOVE_ONLY_AND_QUIET<PinnedHostBuffer>);
static_assert(kMOVE_ONLY_AND_QUIET<RegisteredHostMemory>);
static_assert(kMOVE_ONLY_AND_QUIET<CudaEvent>);

TEST(CudaOwnersTest, NonPositiveSizesAreRejectedBeforeAnyCudaCall)
{
    for (int64_t const bytes : {int64_t{0}, int64_t{-1}, INT64_MIN})
    {
        std::string const value = std::to_string(bytes);
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { DeviceBuffer buffer(bytes, "stagingBuffer"); }, {"stagingBuffer", "bytes", value, "> 0"}))
            << bytes;
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { PinnedHostBuffer buffer(bytes); }, {"PinnedHostBuffer", "bytes", value, "> 0"}))
            << bytes;
        std::vector<char> memory(64);
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
            { RegisteredHostMemory registration(memory.data(), bytes, cudaHostRegisterDefault); },
            {"RegisteredHostMemory", "bytes", value, "> 0"}))
            << bytes;
    }
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { RegisteredHostMemory registration(nullptr, 64, cudaHostRegisterDefault); }, {"null", "64"}));
}

TEST(CudaOwnersTest, EmptyOwnersHoldNothingAndReleaseNothing)
{
    DeviceBuffer device;
    DeviceBuffer movedDevice(std::move(device));
    movedDevice = DeviceBuffer();
    movedDevice.reset();
    EXPECT_EQ(movedDevice.data(), nullptr);
    EXPECT_EQ(movedDevice.bytes(), 0);

    PinnedHostBuffer pinned = PinnedHostBuffer::adopt(nullptr, 4096);
    EXPECT_EQ(pinned.data(), nullptr);
    EXPECT_EQ(pinned.bytes(), 0);
    EXPECT_EQ(pinned.release(), nullptr);
    PinnedHostBuffer movedPinned(std::move(pinned));
    movedPinned.reset();
    EXPECT_EQ(movedPinned.data(), nullptr);

    RegisteredHostMemory registration;
    RegisteredHostMemory movedRegistration(std::move(registration));
    EXPECT_EQ(movedRegistration.data(), nullptr);
    EXPECT_EQ(movedRegistration.deviceData(), nullptr);
    EXPECT_EQ(movedRegistration.bytes(), 0);

    CudaEvent event = CudaEvent::adopt(nullptr);
    EXPECT_EQ(event.get(), nullptr);
    CudaEvent movedEvent(std::move(event));
    EXPECT_EQ(movedEvent.release(), nullptr);
}

class CudaOwnersGpuTest : public kvcache::test::GpuTest
{
};

cudaMemoryType memoryType(void const* pointer)
{
    cudaPointerAttributes attributes{};
    cudaError_t const status = cudaPointerGetAttributes(&attributes, pointer);
    if (status != cudaSuccess)
    {
        cudaGetLastError();
        return cudaMemoryTypeUnregistered;
    }
    return attributes.type;
}

TEST_F(CudaOwnersGpuTest, DeviceBufferHoldsDeviceMemoryUntilItsLastOwnerGoes)
{
    int device = 0;
    KVCACHE_TEST_CUDA(cudaGetDevice(&device));
    DeviceBuffer buffer(int64_t{1} << 20);
    void* const data = buffer.data();
    ASSERT_NE(data, nullptr);
    EXPECT_EQ(buffer.bytes(), int64_t{1} << 20);
    EXPECT_EQ(buffer.device(), device);
    EXPECT_EQ(memoryType(data), cudaMemoryTypeDevice);
    // The memory works: a pattern written on the device reads back.
    KVCACHE_TEST_CUDA(cudaMemset(data, 0x5A, 4096));
    std::vector<uint8_t> back(4096, 0);
    KVCACHE_TEST_CUDA(cudaMemcpy(back.data(), data, back.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(back, std::vector<uint8_t>(4096, 0x5A));

    DeviceBuffer moved(std::move(buffer));
    EXPECT_EQ(buffer.data(), nullptr);
    EXPECT_EQ(moved.data(), data);
    EXPECT_EQ(memoryType(data), cudaMemoryTypeDevice);
    moved = DeviceBuffer(256);
    EXPECT_NE(memoryType(data), cudaMemoryTypeDevice) << "move assignment freed the old memory";
    void* const second = moved.data();
    moved.reset();
    EXPECT_EQ(moved.data(), nullptr);
    EXPECT_NE(memoryType(second), cudaMemoryTypeDevice);
}

TEST_F(CudaOwnersGpuTest, PinnedHostBufferIsPinnedUntilFreedAndReleaseHandsItOver)
{
    PinnedHostBuffer buffer(1 << 16);
    void* const data = buffer.data();
    ASSERT_NE(data, nullptr);
    EXPECT_EQ(memoryType(data), cudaMemoryTypeHost);
    static_cast<uint8_t*>(data)[0] = 0x11;
    static_cast<uint8_t*>(data)[(1 << 16) - 1] = 0x22;

    void* const released = buffer.release();
    EXPECT_EQ(released, data);
    EXPECT_EQ(buffer.data(), nullptr);
    EXPECT_EQ(memoryType(data), cudaMemoryTypeHost) << "release must not free";
    {
        PinnedHostBuffer const adopted = PinnedHostBuffer::adopt(released, 1 << 16);
        EXPECT_EQ(static_cast<uint8_t const*>(adopted.data())[(1 << 16) - 1], 0x22);
    }
    EXPECT_NE(memoryType(data), cudaMemoryTypeHost) << "the adopting owner freed it";
}

TEST_F(CudaOwnersGpuTest, RegisteredHostMemoryIsMappedWhileRegistered)
{
    std::vector<uint8_t> memory(1 << 16, 0x33);
    {
        RegisteredHostMemory registration(memory.data(), static_cast<int64_t>(memory.size()), cudaHostRegisterMapped);
        EXPECT_EQ(registration.data(), memory.data());
        ASSERT_NE(registration.deviceData(), nullptr);
        EXPECT_EQ(memoryType(memory.data()), cudaMemoryTypeHost);
        // The device address reaches the same bytes.
        DeviceBuffer device(static_cast<int64_t>(memory.size()));
        KVCACHE_TEST_CUDA(cudaMemset(device.data(), 0x44, memory.size()));
        KVCACHE_TEST_CUDA(cudaMemcpy(registration.deviceData(), device.data(), 128, cudaMemcpyDefault));
        EXPECT_EQ(memory[0], 0x44);
        EXPECT_EQ(memory[127], 0x44);
        EXPECT_EQ(memory[128], 0x33);
    }
    EXPECT_NE(memoryType(memory.data()), cudaMemoryTypeHost) << "destruction unregistered the range";
}

TEST_F(CudaOwnersGpuTest, EventRecordsWaitsAndMoves)
{
    kvcache::test::CudaStream stream;
    CudaEvent event;
    ASSERT_NE(event.get(), nullptr);
    EXPECT_TRUE(event.isComplete()) << "an event never recorded has completed";
    DeviceBuffer buffer(int64_t{64} << 20);
    KVCACHE_TEST_CUDA(cudaMemsetAsync(buffer.data(), 1, static_cast<size_t>(buffer.bytes()), stream.get()));
    event.record(stream.get());
    event.synchronize();
    EXPECT_TRUE(event.isComplete());

    cudaEvent_t const handle = event.get();
    CudaEvent moved(std::move(event));
    EXPECT_EQ(event.get(), nullptr);
    EXPECT_EQ(moved.get(), handle);
    cudaEvent_t const released = moved.release();
    EXPECT_EQ(released, handle);
    CudaEvent const adopted = CudaEvent::adopt(released);
    adopted.synchronizeNoThrow();
    EXPECT_TRUE(adopted.isComplete());
}

} // namespace
