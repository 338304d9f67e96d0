#include "core/cuda_owners.h"

#include "core/scoped_device.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <string>

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

//! Throws OutOfMemoryError with `message` for a failed allocation, CudaError naming `call` for any other failure.
void checkAllocation(cudaError_t status, char const* call, std::string const& message)
{
    if (status == cudaErrorMemoryAllocation)
    {
        cudaGetLastError();
        throw OutOfMemoryError(message);
    }
    if (status != cudaSuccess)
    {
        throwCudaError(status, call, __FILE__, __LINE__);
    }
}

DeviceMemory allocateDevice(int64_t bytes, char const* what)
{
    checkBytes(what, bytes);
    int device = 0;
    KVCACHE_CUDA_TRY(cudaGetDevice(&device));
    void* data = nullptr;
    checkAllocation(cudaMalloc(&data, static_cast<size_t>(bytes)), "cudaMalloc",
        fmt::format("{}: {} bytes do not fit on device {}", what, bytes, device));
    return DeviceMemory{data, bytes, device};
}

HostMemory allocatePinned(int64_t bytes, unsigned int flags)
{
    checkBytes("PinnedHostBuffer", bytes);
    void* data = nullptr;
    checkAllocation(cudaHostAlloc(&data, static_cast<size_t>(bytes), flags), "cudaHostAlloc",
        fmt::format("PinnedHostBuffer: {} bytes of pinned host memory cannot be had", bytes));
    return HostMemory{data, bytes};
}

HostRegistration registerHost(void* data, int64_t bytes, unsigned int flags)
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
    HostRegistration registration{data, bytes, nullptr};
    if ((flags & cudaHostRegisterMapped) != 0)
    {
        cudaError_t const mapped = cudaHostGetDevicePointer(&registration.deviceData, data, 0);
        if (mapped != cudaSuccess)
        {
            unregisterHostMemory(registration);
            throwCudaError(mapped, "cudaHostGetDevicePointer", __FILE__, __LINE__);
        }
    }
    return registration;
}

StreamHandle createStream()
{
    StreamHandle stream{};
    KVCACHE_CUDA_TRY(cudaStreamCreateWithFlags(&stream.data, cudaStreamNonBlocking));
    return stream;
}

EventHandle createEvent(unsigned int flags)
{
    EventHandle event{};
    KVCACHE_CUDA_TRY(cudaEventCreateWithFlags(&event.data, flags));
    return event;
}

} // namespace

void freeDeviceMemory(DeviceMemory const& memory) noexcept
{
    ScopedDevice const onDevice(memory.device);
    KVCACHE_CUDA_LOG(cudaFree(memory.data));
}

void freePinnedHostMemory(HostMemory const& memory) noexcept
{
    KVCACHE_CUDA_LOG(cudaFreeHost(memory.data));
}

void unregisterHostMemory(HostRegistration const& registration) noexcept
{
    KVCACHE_CUDA_LOG(cudaHostUnregister(registration.data));
}

void destroyEvent(EventHandle const& event) noexcept
{
    KVCACHE_CUDA_LOG(cudaEventDestroy(event.data));
}

void destroyStream(StreamHandle const& stream) noexcept
{
    KVCACHE_CUDA_LOG(cudaStreamDestroy(stream.data));
}

DeviceBuffer::DeviceBuffer(int64_t bytes, char const* what)
    : UniqueResource(allocateDevice(bytes, what))
{
}

PinnedHostBuffer::PinnedHostBuffer(int64_t bytes, unsigned int flags)
    : UniqueResource(allocatePinned(bytes, flags))
{
}

PinnedHostBuffer PinnedHostBuffer::adopt(void* data, int64_t bytes) noexcept
{
    return PinnedHostBuffer(HostMemory{data, data == nullptr ? 0 : bytes});
}

RegisteredHostMemory::RegisteredHostMemory(void* data, int64_t bytes, unsigned int flags)
    : UniqueResource(registerHost(data, bytes, flags))
{
}

CudaStream::CudaStream()
    : UniqueResource(createStream())
{
}

CudaEvent::CudaEvent(unsigned int flags)
    : UniqueResource(createEvent(flags))
{
}

CudaEvent CudaEvent::adopt(cudaEvent_t event) noexcept
{
    return CudaEvent(EventHandle{event});
}

void CudaEvent::record(cudaStream_t stream) const
{
    KVCACHE_CUDA_TRY(cudaEventRecord(get(), stream));
}

bool CudaEvent::isComplete() const
{
    cudaError_t const status = cudaEventQuery(get());
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
    KVCACHE_CUDA_TRY(cudaEventSynchronize(get()));
}

void CudaEvent::synchronizeNoThrow() const noexcept
{
    if (get() != nullptr)
    {
        KVCACHE_CUDA_LOG(cudaEventSynchronize(get()));
    }
}

cudaStreamCaptureStatus captureStatus(cudaStream_t stream)
{
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    KVCACHE_CUDA_TRY(cudaStreamIsCapturing(stream, &status));
    return status;
}

} // namespace kvcache::rt::detail
