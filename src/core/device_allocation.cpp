#include "kvcache/core/device_allocation.h"

#include "core/scoped_device.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <utility>

namespace kvcache::rt
{
namespace
{

double toGiB(int64_t bytes)
{
    return static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30);
}

} // namespace

DeviceAllocation::DeviceAllocation(int64_t bytes, cudaStream_t stream, cudaMemPool_t pool)
    : mStream(stream)
{
    if (bytes <= 0)
    {
        throw InvalidArgumentError(fmt::format("DeviceAllocation: bytes is {}; it must be > 0", bytes));
    }
    int device = 0;
    KVCACHE_CUDA_TRY(cudaGetDevice(&device));
    char const* const call = pool != nullptr ? "cudaMallocFromPoolAsync" : "cudaMallocAsync";
    auto const size = static_cast<size_t>(bytes);
    cudaError_t const status =
        pool != nullptr ? cudaMallocFromPoolAsync(&mData, size, pool, stream) : cudaMallocAsync(&mData, size, stream);
    if (status == cudaErrorMemoryAllocation)
    {
        cudaGetLastError();
        size_t freeBytes = 0;
        size_t totalBytes = 0;
        KVCACHE_CUDA_LOG(cudaMemGetInfo(&freeBytes, &totalBytes));
        throw OutOfMemoryError(fmt::format("{} of {} bytes ({:.3f} GiB) failed: device {} has {} bytes ({:.3f} GiB) "
                                           "free of {}",
            call, bytes, toGiB(bytes), device, freeBytes, toGiB(static_cast<int64_t>(freeBytes)), totalBytes));
    }
    if (status != cudaSuccess)
    {
        detail::throwCudaError(status, call, __FILE__, __LINE__);
    }
    mSize = bytes;
    mDevice = device;
}

DeviceAllocation::~DeviceAllocation() noexcept
{
    reset();
}

DeviceAllocation::DeviceAllocation(DeviceAllocation&& other) noexcept
    : mData(std::exchange(other.mData, nullptr))
    , mSize(std::exchange(other.mSize, 0))
    , mStream(std::exchange(other.mStream, nullptr))
    , mDevice(std::exchange(other.mDevice, 0))
{
}

DeviceAllocation& DeviceAllocation::operator=(DeviceAllocation&& other) noexcept
{
    // Freeing first makes a self-move give the memory up, as std::vector does: a manager built of these never keeps
    // half its memory.
    reset();
    mData = std::exchange(other.mData, nullptr);
    mSize = std::exchange(other.mSize, 0);
    mStream = std::exchange(other.mStream, nullptr);
    mDevice = std::exchange(other.mDevice, 0);
    return *this;
}

void DeviceAllocation::reset() noexcept
{
    if (mData == nullptr)
    {
        return;
    }
    detail::ScopedDevice const onDevice(mDevice);
    KVCACHE_CUDA_LOG(cudaFreeAsync(mData, mStream));
    mData = nullptr;
    mSize = 0;
    mStream = nullptr;
    mDevice = 0;
}

} // namespace kvcache::rt
