#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvcache::rt
{

//! Owns one stream-ordered device allocation: made with cudaMallocAsync (or cudaMallocFromPoolAsync) on a stream and
//! returned with cudaFreeAsync on the same stream, with the allocating device current. Move-only; never throws on
//! release.
class DeviceAllocation
{
public:
    //! Owns nothing.
    DeviceAllocation() noexcept = default;
    //! Allocates `bytes` (> 0) on the current device, stream-ordered on `stream`, from `pool` (nullptr: the device's
    //! current pool). `stream` must outlive the allocation. Throws InvalidArgumentError for bytes <= 0,
    //! OutOfMemoryError (naming the call, the bytes asked for and the device's free memory) when the memory cannot be
    //! had, and CudaError naming the call for any other failure.
    DeviceAllocation(int64_t bytes, cudaStream_t stream, cudaMemPool_t pool = nullptr);
    //! Frees the memory stream-ordered on its stream and device; never throws.
    ~DeviceAllocation() noexcept;

    DeviceAllocation(DeviceAllocation const&) = delete;
    DeviceAllocation& operator=(DeviceAllocation const&) = delete;
    //! Takes `other`'s memory; `other` owns nothing afterwards.
    DeviceAllocation(DeviceAllocation&& other) noexcept;
    //! Frees this allocation's memory, then takes `other`'s (a self-move leaves it owning nothing).
    DeviceAllocation& operator=(DeviceAllocation&& other) noexcept;

    //! Returns the start of the memory (nullptr when it owns nothing).
    void* data() const noexcept
    {
        return mData;
    }
    //! Returns the bytes asked for (0 when it owns nothing).
    int64_t size() const noexcept
    {
        return mSize;
    }
    //! Returns the stream the memory was allocated on and will be freed on.
    cudaStream_t stream() const noexcept
    {
        return mStream;
    }
    //! Returns the device the memory lives on.
    int32_t device() const noexcept
    {
        return mDevice;
    }
    //! Frees the memory now (stream-ordered) and owns nothing; never throws.
    void reset() noexcept;

private:
    void* mData{nullptr};
    int64_t mSize{0};
    cudaStream_t mStream{nullptr};
    int32_t mDevice{0};
};

} // namespace kvcache::rt
