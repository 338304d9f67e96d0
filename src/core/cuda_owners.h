#pragma once

// Owners of the CUDA resources the library makes: device memory (cudaMalloc), pinned host memory (cudaHostAlloc),
// registered host memory (cudaHostRegister) and events. Move-only; creation checks its arguments on the host before
// any CUDA call and throws (errors.h); destruction logs a failure and never throws. Stream-ordered device memory is
// the public DeviceAllocation (kvcache/core/device_allocation.h); the device guard is ScopedDevice (scoped_device.h).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvcache::rt::detail
{

//! Device memory from cudaMalloc on the current device, freed with cudaFree on that device.
class DeviceBuffer
{
public:
    //! Owns nothing.
    DeviceBuffer() noexcept = default;
    //! Allocates `bytes` (> 0) on the current device. Throws InvalidArgumentError for bytes <= 0 (naming `what`),
    //! OutOfMemoryError naming `what`, the bytes and the device when the memory cannot be had, CudaError otherwise.
    explicit DeviceBuffer(int64_t bytes, char const* what = "DeviceBuffer");
    //! Frees the memory on its device; never throws.
    ~DeviceBuffer() noexcept;
    DeviceBuffer(DeviceBuffer const&) = delete;
    DeviceBuffer& operator=(DeviceBuffer const&) = delete;
    //! Takes `other`'s memory; `other` owns nothing afterwards.
    DeviceBuffer(DeviceBuffer&& other) noexcept;
    //! Frees this buffer's memory, then takes `other`'s (a self-move leaves it owning nothing).
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

    //! Returns the device address (nullptr when owning nothing).
    void* data() const noexcept
    {
        return mData;
    }
    //! Returns the bytes allocated (0 when owning nothing).
    int64_t bytes() const noexcept
    {
        return mBytes;
    }
    //! Returns the device the memory lives on.
    int32_t device() const noexcept
    {
        return mDevice;
    }
    //! Frees the memory now and owns nothing; never throws.
    void reset() noexcept;

private:
    void* mData{nullptr};
    int64_t mBytes{0};
    int32_t mDevice{0};
};

//! Page-locked host memory from cudaHostAlloc, freed with cudaFreeHost.
class PinnedHostBuffer
{
public:
    //! Owns nothing.
    PinnedHostBuffer() noexcept = default;
    //! Allocates `bytes` (> 0) of pinned host memory with cudaHostAlloc `flags`. Throws InvalidArgumentError for
    //! bytes <= 0, OutOfMemoryError naming the bytes when the memory cannot be pinned, CudaError otherwise.
    explicit PinnedHostBuffer(int64_t bytes, unsigned int flags = cudaHostAllocDefault);
    //! Takes ownership of `data` (from cudaHostAlloc, or nullptr) of `bytes` bytes; never throws.
    static PinnedHostBuffer adopt(void* data, int64_t bytes) noexcept;
    //! Frees the memory; never throws.
    ~PinnedHostBuffer() noexcept;
    PinnedHostBuffer(PinnedHostBuffer const&) = delete;
    PinnedHostBuffer& operator=(PinnedHostBuffer const&) = delete;
    //! Takes `other`'s memory; `other` owns nothing afterwards.
    PinnedHostBuffer(PinnedHostBuffer&& other) noexcept;
    //! Frees this buffer's memory, then takes `other`'s (a self-move leaves it owning nothing).
    PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;

    //! Returns the host address (nullptr when owning nothing).
    void* data() const noexcept
    {
        return mData;
    }
    //! Returns the bytes allocated (0 when owning nothing).
    int64_t bytes() const noexcept
    {
        return mBytes;
    }
    //! Gives the memory up without freeing it and returns its address (the caller frees it, e.g. through adopt).
    void* release() noexcept;
    //! Frees the memory now and owns nothing; never throws.
    void reset() noexcept;

private:
    void* mData{nullptr};
    int64_t mBytes{0};
};

//! A range of host memory the caller allocated, page-locked with cudaHostRegister and unregistered on destruction
//! (the memory itself stays the caller's to free, after this owner).
class RegisteredHostMemory
{
public:
    //! Owns nothing.
    RegisteredHostMemory() noexcept = default;
    //! Registers [data, data + bytes) with cudaHostRegister `flags`; with cudaHostRegisterMapped, also finds its
    //! device address. Throws InvalidArgumentError for a null `data` or bytes <= 0, OutOfMemoryError naming the bytes
    //! and CUDA's reason when the range cannot be registered, CudaError when the device address cannot be had (the
    //! range is unregistered again then).
    RegisteredHostMemory(void* data, int64_t bytes, unsigned int flags);
    //! Unregisters the range; never throws.
    ~RegisteredHostMemory() noexcept;
    RegisteredHostMemory(RegisteredHostMemory const&) = delete;
    RegisteredHostMemory& operator=(RegisteredHostMemory const&) = delete;
    //! Takes `other`'s registration; `other` owns nothing afterwards.
    RegisteredHostMemory(RegisteredHostMemory&& other) noexcept;
    //! Unregisters this range, then takes `other`'s (a self-move leaves it owning nothing).
    RegisteredHostMemory& operator=(RegisteredHostMemory&& other) noexcept;

    //! Returns the host address (nullptr when owning nothing).
    void* data() const noexcept
    {
        return mData;
    }
    //! Returns the device address of a mapped registration (nullptr otherwise).
    void* deviceData() const noexcept
    {
        return mDeviceData;
    }
    //! Returns the bytes registered (0 when owning nothing).
    int64_t bytes() const noexcept
    {
        return mBytes;
    }
    //! Unregisters now and owns nothing; never throws.
    void reset() noexcept;

private:
    void* mData{nullptr};
    void* mDeviceData{nullptr};
    int64_t mBytes{0};
};

//! A CUDA event (cudaEventCreateWithFlags), destroyed with cudaEventDestroy.
class CudaEvent
{
public:
    //! Creates an event with `flags` (timing off by default: cheaper to record and query). Throws CudaError.
    explicit CudaEvent(unsigned int flags = cudaEventDisableTiming);
    //! Takes ownership of `event` (or nullptr); never throws.
    static CudaEvent adopt(cudaEvent_t event) noexcept;
    //! Destroys the event; never throws.
    ~CudaEvent() noexcept;
    CudaEvent(CudaEvent const&) = delete;
    CudaEvent& operator=(CudaEvent const&) = delete;
    //! Takes `other`'s event; `other` owns nothing afterwards.
    CudaEvent(CudaEvent&& other) noexcept;
    //! Destroys this event, then takes `other`'s (a self-move leaves it owning nothing).
    CudaEvent& operator=(CudaEvent&& other) noexcept;

    //! Returns the event (nullptr when owning nothing).
    cudaEvent_t get() const noexcept
    {
        return mEvent;
    }
    //! Records the event on `stream`. Throws CudaError.
    void record(cudaStream_t stream) const;
    //! Returns true once the work the event was last recorded after has completed (an unrecorded event has). Throws
    //! CudaError when that work failed.
    bool isComplete() const;
    //! Waits on the host for the event. Throws CudaError.
    void synchronize() const;
    //! Waits on the host for the event, logging a failure; for destructors. Never throws.
    void synchronizeNoThrow() const noexcept;
    //! Gives the event up without destroying it and returns it.
    cudaEvent_t release() noexcept;

private:
    struct Empty
    {
    };
    explicit CudaEvent(Empty) noexcept
    {
    }

    cudaEvent_t mEvent{nullptr};
};

} // namespace kvcache::rt::detail
