#include "core/cuda_owners.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <utility>

#include "core/scoped_device.h"

namespace kvcache::rt::detail
{
namespace
{

void checkBytes(char const* what, int64_t bytes)
{
    if (bytes <= 0)
    {
        throw InvalidArgumentError(fmt::format("{}: bytes is {}; it must be > 0", what, bytes));
    }
}

} // namespace

DeviceBuffer::DeviceBuffer(int64_t bytes, char const* what)
{
    checkBytes(what, bytes);
    int device = 0;
    KVCACHE_CUDA_TRY(cudaGetDevice(&device));
    void* data = nullptr;
    cudaError_t const status = cudaMalloc(&data, static_cast<size_t>(bytes));
    if (status == cudaErrorMemoryAllocation)
    {
        cudaGetLastError();
        throw OutOfMemoryError(fmt::format("{}: {} bytes do not fit on device {}", what, bytes, device));
    }
    if (status != cudaSuccess)
    {
        throwCudaError(status, "cudaMalloc", __FILE__, __LINE__);
    }
    mData = data;
    mBytes = bytes;
    mDevice = device;
}

DeviceBuffer::~DeviceBuffer() noexcept
{
    reset();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : mData(std::exchange(other.mData, nullptr))
    , mBytes(std::exchange(other.mBytes, 0))
    , mDevice(std::exchange(other.mDevice, 0))
{
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept
{
    reset();
    mData = std::exchange(other.mData, nullptr);
    mBytes = std::exchange(other.mBytes, 0);
    mDevice = std::exchange(other.mDevice, 0);
    return *this;
}

void DeviceBuffer::reset() noexcept
{
    if (mData != nullptr)
    {
        ScopedDevice const onDevice(mDevice);
        KVCACHE_CUDA_LOG(cudaFree(mData));
    }
    mData = nullptr;
    mBytes = 0;
    mDevice = 0;
}

PinnedHostBuffer::PinnedHostBuffer(int64_t bytes, unsigned int flags)
{
    checkBytes("PinnedHostBuffer", bytes);
    void* data = nullptr;
    cudaError_t const status = cudaHostAlloc(&data, static_cast<size_t>(bytes), flags);
    if (status == cudaErrorMemoryAllocation)
    {
        cudaGetLastError();
        throw OutOfMemoryError(fmt::format("PinnedHostBuffer: {} bytes of pinned host memory cannot be had", bytes));
    }
    if (status != cudaSuccess)
    {
        throwCudaError(status, "cudaHostAlloc", __FILE__, __LINE__);
    }
    mData = data;
    mBytes = bytes;
}

PinnedHostBuffer PinnedHostBuffer::adopt(void* data, int64_t bytes) noexcept
{
    PinnedHostBuffer buffer;
    buffer.mData = data;
    buffer.mBytes = data == nullptr ? 0 : bytes;
    return buffer;
}

PinnedHostBuffer::~PinnedHostBuffer() noexcept
{
    reset();
}

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : mData(std::exchange(other.mData, nullptr))
    , mBytes(std::exchange(other.mBytes, 0))
{
}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept
{
    reset();
    mData = std::exchange(other.mData, nullptr);
    mBytes = std::exchange(other.mBytes, 0);
    return *this;
}

void* PinnedHostBuffer::release() noexcept
{
    mBytes = 0;
    return std::exchange(mData, nullptr);
}

void PinnedHostBuffer::reset() noexcept
{
    if (mData != nullptr)
    {
        KVCACHE_CUDA_LOG(cudaFreeHost(mData));
    }
    mData = nullptr;
    mBytes = 0;
}

RegisteredHostMemory::RegisteredHostMemory(void* data, int64_t bytes, unsigned int flags)
{
    if (data == nullptr)
    {
        throw InvalidArgumentError(fmt::format("RegisteredHostMemory: data is null with bytes {}", bytes));
    }
    checkBytes("RegisteredHostMemory", bytes);
    cudaError_t const status = cudaHostRegister(data, static_cast<size_t>(bytes), flags);
    if (status != cudaSuccess)
    {
        cudaGetLastError();
        throw OutOfMemoryError(
            fmt::format("RegisteredHostMemory: pinning {} bytes failed: {}", bytes, cudaGetErrorString(status)));
    }
    mData = data;
    mBytes = bytes;
    if ((flags & cudaHostRegisterMapped) != 0)
    {
        void* device = nullptr;
        cudaError_t const mapped = cudaHostGetDevicePointer(&device, data, 0);
        if (mapped != cudaSuccess)
        {
            reset();
            throwCudaError(mapped, "cudaHostGetDevicePointer", __FILE__, __LINE__);
        }
        mDeviceData = device;
    }
}

RegisteredHostMemory::~RegisteredHostMemory() noexcept
{
    reset();
}

RegisteredHostMemory::RegisteredHostMemory(RegisteredHostMemory&& other) noexcept
    : mData(std::exchange(other.mData, nullptr))
    , mDeviceData(std::exchange(other.mDeviceData, nullptr))
    , mBytes(std::exchange(other.mBytes, 0))
{
}

RegisteredHostMemory& RegisteredHostMemory::operator=(RegisteredHostMemory&& other) noexcept
{
    reset();
    mData = std::exchange(other.mData, nullptr);
    mDeviceData = std::exchange(other.mDeviceData, nullptr);
    mBytes = std::exchange(other.mBytes, 0);
    return *this;
}

void RegisteredHostMemory::reset() noexcept
{
    if (mData != nullptr)
    {
        KVCACHE_CUDA_LOG(cudaHostUnregister(mData));
    }
    mData = nullptr;
    mDeviceData = nullptr;
    mBytes = 0;
}

CudaEvent::CudaEvent(unsigned int flags)
{
    KVCACHE_CUDA_TRY(cudaEventCreateWithFlags(&mEvent, flags));
}

CudaEvent CudaEvent::adopt(cudaEvent_t event) noexcept
{
    CudaEvent owner{Empty{}};
    owner.mEvent = event;
    return owner;
}

CudaEvent::~CudaEvent() noexcept
{
    if (mEvent != nullptr)
    {
        KVCACHE_CUDA_LOG(cudaEventDestroy(mEvent));
    }
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : mEvent(std::exchange(other.mEvent, nullptr))
{
}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept
{
    CudaEvent const old = adopt(std::exchange(mEvent, nullptr));
    mEvent = std::exchange(other.mEvent, nullptr);
    return *this;
}

void CudaEvent::record(cudaStream_t stream) const
{
    KVCACHE_CUDA_TRY(cudaEventRecord(mEvent, stream));
}

bool CudaEvent::isComplete() const
{
    cudaError_t const status = cudaEventQuery(mEvent);
    if (status == cudaErrorNotReady)
    {
        return false;
    }
    if (status != cudaSuccess)
    {
        throwCudaError(status, "cudaEventQuery", __FILE__, __LINE__);
    }
    return true;
}

void CudaEvent::synchronize() const
{
    KVCACHE_CUDA_TRY(cudaEventSynchronize(mEvent));
}

void CudaEvent::synchronizeNoThrow() const noexcept
{
    if (mEvent != nullptr)
    {
        KVCACHE_CUDA_LOG(cudaEventSynchronize(mEvent));
    }
}

cudaEvent_t CudaEvent::release() noexcept
{
    return std::exchange(mEvent, nullptr);
}

} // namespace kvcache::rt::detail
