#pragma once

// Owners of the CUDA resources the library makes: device memory (cudaMalloc), pinned host memory (cudaHostAlloc),
// registered host memory (cudaHostRegister) and events. Move-only; creation checks its arguments on the host before
// any CUDA call and throws (errors.h); destruction logs a failure and never throws. Stream-ordered device memory is
// the public DeviceAllocation (kvcache/core/device_allocation.h); the device guard is ScopedDevice (scoped_device.h).

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

namespace kvcache::rt::detail
{

//! The move-only ownership every owner below shares: it holds a `State` (its handle and sizes; a value-initialised
//! State, data == nullptr, owns nothing) and gives it to `Free` once, on reset or destruction. A move leaves the
//! source owning nothing; a self-move leaves this owning nothing.
template <typename State, void (*Free)(State const&) noexcept>
class UniqueResource
{
public:
    //! Owns nothing.
    UniqueResource() noexcept = default;
    //! Owns `state` (nothing when state.data is null).
    explicit UniqueResource(State const& state) noexcept
        : mState(state)
    {
    }
    //! Frees what it owns; never throws.
    ~UniqueResource() noexcept
    {
        reset();
    }
    UniqueResource(UniqueResource const&) = delete;
    UniqueResource& operator=(UniqueResource const&) = delete;
    //! Takes `other`'s resource; `other` owns nothing afterwards.
    UniqueResource(UniqueResource&& other) noexcept
        : mState(std::exchange(other.mState, State{}))
    {
    }
    //! Frees this resource, then takes `other`'s.
    UniqueResource& operator=(UniqueResource&& other) noexcept
    {
        reset();
        mState = std::exchange(other.mState, State{});
        return *this;
    }
    //! Frees the resource now and owns nothing; never throws.
    void reset() noexcept
    {
        State const old = std::exchange(mState, State{});
        if (old.data != nullptr)
        {
            Free(old);
        }
    }

protected:
    //! Returns what it owns.
    State const& state() const noexcept
    {
        return mState;
    }
    //! Gives the resource up without freeing it.
    State releaseState() noexcept
    {
        return std::exchange(mState, State{});
    }

private:
    State mState{};
};

//! Device memory: its address, size and device.
struct DeviceMemory
{
    void* data = nullptr;
    int64_t bytes = 0;
    int32_t device = 0;
};
//! Frees device memory with cudaFree on its device, logging a failure.
void freeDeviceMemory(DeviceMemory const& memory) noexcept;

//! Device memory from cudaMalloc on the current device, freed with cudaFree on that device.
class DeviceBuffer : public UniqueResource<DeviceMemory, freeDeviceMemory>
{
public:
    //! Owns nothing.
    DeviceBuffer() noexcept = default;
    //! Allocates `bytes` (> 0) on the current device. Throws InvalidArgumentError for bytes <= 0 (naming `what`),
    //! OutOfMemoryError naming `what`, the bytes and the device when the memory cannot be had, CudaError otherwise.
    explicit DeviceBuffer(int64_t bytes, char const* what = "DeviceBuffer");

    //! Returns the device address (nullptr when owning nothing).
    void* data() const noexcept
    {
        return state().data;
    }
    //! Returns the bytes allocated (0 when owning nothing).
    int64_t bytes() const noexcept
    {
        return state().bytes;
    }
    //! Returns the device the memory lives on.
    int32_t device() const noexcept
    {
        return state().device;
    }
};

//! Host memory: its address and size.
struct HostMemory
{
    void* data = nullptr;
    int64_t bytes = 0;
};
//! Frees pinned host memory with cudaFreeHost, logging a failure.
void freePinnedHostMemory(HostMemory const& memory) noexcept;

//! Page-locked host memory from cudaHostAlloc, freed with cudaFreeHost.
class PinnedHostBuffer : public UniqueResource<HostMemory, freePinnedHostMemory>
{
public:
    //! Owns nothing.
    PinnedHostBuffer() noexcept = default;
    //! Allocates `bytes` (> 0) of pinned host memory with cudaHostAlloc `flags`. Throws InvalidArgumentError for
    //! bytes <= 0, OutOfMemoryError naming the bytes when the memory cannot be pinned, CudaError otherwise.
    explicit PinnedHostBuffer(int64_t bytes, unsigned int flags = cudaHostAllocDefault);
    //! Takes ownership of `data` (from cudaHostAlloc, or nullptr) of `bytes` bytes; never throws.
    static PinnedHostBuffer adopt(void* data, int64_t bytes) noexcept;

    //! Returns the host address (nullptr when owning nothing).
    void* data() const noexcept
    {
        return state().data;
    }
    //! Returns the bytes allocated (0 when owning nothing).
    int64_t bytes() const noexcept
    {
        return state().bytes;
    }
    //! Gives the memory up without freeing it and returns its address (the caller frees it, e.g. through adopt).
    void* release() noexcept
    {
        return releaseState().data;
    }

private:
    explicit PinnedHostBuffer(HostMemory const& memory) noexcept
        : UniqueResource(memory)
    {
    }
};

//! A registered range: its host address, size and device address (mapped registrations).
struct HostRegistration
{
    void* data = nullptr;
    int64_t bytes = 0;
    void* deviceData = nullptr;
};
//! Unregisters a range with cudaHostUnregister, logging a failure.
void unregisterHostMemory(HostRegistration const& registration) noexcept;

//! A range of host memory the caller allocated, page-locked with cudaHostRegister and unregistered on destruction
//! (the memory itself stays the caller's to free, after this owner).
class RegisteredHostMemory : public UniqueResource<HostRegistration, unregisterHostMemory>
{
public:
    //! Owns nothing.
    RegisteredHostMemory() noexcept = default;
    //! Registers [data, data + bytes) with cudaHostRegister `flags`; with cudaHostRegisterMapped, also finds its
    //! device address. Throws InvalidArgumentError for a null `data` or bytes <= 0, OutOfMemoryError naming the bytes
    //! and CUDA's reason when the range cannot be registered, CudaError when the device address cannot be had (the
    //! range is unregistered again then).
    RegisteredHostMemory(void* data, int64_t bytes, unsigned int flags);

    //! Returns the host address (nullptr when owning nothing).
    void* data() const noexcept
    {
        return state().data;
    }
    //! Returns the device address of a mapped registration (nullptr otherwise).
    void* deviceData() const noexcept
    {
        return state().deviceData;
    }
    //! Returns the bytes registered (0 when owning nothing).
    int64_t bytes() const noexcept
    {
        return state().bytes;
    }
};

//! An event handle.
struct EventHandle
{
    cudaEvent_t data = nullptr;
};
//! Destroys an event with cudaEventDestroy, logging a failure.
void destroyEvent(EventHandle const& event) noexcept;

//! A CUDA event (cudaEventCreateWithFlags), destroyed with cudaEventDestroy.
class CudaEvent : public UniqueResource<EventHandle, destroyEvent>
{
public:
    //! Creates an event with `flags` (timing off by default: cheaper to record and query). Throws CudaError.
    explicit CudaEvent(unsigned int flags = cudaEventDisableTiming);
    //! Takes ownership of `event` (or nullptr); never throws.
    static CudaEvent adopt(cudaEvent_t event) noexcept;

    //! Returns the event (nullptr when owning nothing).
    cudaEvent_t get() const noexcept
    {
        return state().data;
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
    cudaEvent_t release() noexcept
    {
        return releaseState().data;
    }

private:
    explicit CudaEvent(EventHandle const& event) noexcept
        : UniqueResource(event)
    {
    }
};

//! A stream handle.
struct StreamHandle
{
    cudaStream_t data = nullptr;
};
//! Destroys a stream with cudaStreamDestroy (work already enqueued still runs), logging a failure.
void destroyStream(StreamHandle const& stream) noexcept;

//! A stream of the current device that does not synchronise with the legacy default stream
//! (cudaStreamNonBlocking), destroyed with cudaStreamDestroy.
class CudaStream : public UniqueResource<StreamHandle, destroyStream>
{
public:
    //! Creates the stream on the current device. Throws CudaError.
    CudaStream();

    //! Returns the stream (nullptr when owning nothing).
    cudaStream_t get() const noexcept
    {
        return state().data;
    }
};

//! Returns the capture status of `stream` (cudaStreamIsCapturing); throws CudaError. Host-list paths call it to
//! refuse a capture before they change anything.
cudaStreamCaptureStatus captureStatus(cudaStream_t stream);

} // namespace kvcache::rt::detail
