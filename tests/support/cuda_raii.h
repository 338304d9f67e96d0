#pragma once

// Owners of the CUDA objects tests and benchmarks make: a stream, typed device memory, a dedicated memory pool and an
// instantiated graph, plus the library's own owners (src/core/cuda_owners.h) for events and pinned host memory.
// Creation throws kvcache::rt::CudaError; destruction logs a failure and never throws. No GoogleTest: benchmarks use
// them too.

#include "core/cuda_owners.h"

#include "kvcache/core/errors.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

namespace kvcache::test
{

//! A CUDA event: the library's owner.
using CudaEvent = rt::detail::CudaEvent;
//! Pinned host memory (cudaHostAlloc): the library's owner.
using PinnedHostBuffer = rt::detail::PinnedHostBuffer;

//! Base of the owners of one CUDA handle below: holds it and is not copyable.
template <typename Handle>
class CudaHandle
{
public:
    CudaHandle(CudaHandle const&) = delete;
    CudaHandle& operator=(CudaHandle const&) = delete;

    //! Returns the handle.
    Handle get() const noexcept
    {
        return mHandle;
    }

protected:
    CudaHandle() = default;
    ~CudaHandle() = default;

    Handle mHandle{nullptr};
};

//! A stream of its own (non-blocking by default), synchronised and destroyed at scope exit.
class CudaStream : public CudaHandle<cudaStream_t>
{
public:
    explicit CudaStream(unsigned int flags = cudaStreamNonBlocking)
    {
        KVCACHE_CUDA_TRY(cudaStreamCreateWithFlags(&mHandle, flags));
    }
    ~CudaStream()
    {
        KVCACHE_CUDA_LOG(cudaStreamSynchronize(mHandle));
        KVCACHE_CUDA_LOG(cudaStreamDestroy(mHandle));
    }
    //! Waits for the work queued on the stream; throws CudaError when it failed.
    void synchronize() const
    {
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(mHandle));
    }
};

//! Device memory (cudaMalloc) for exactly `count` values of T, so that a kernel reading past the end shows under
//! memcheck.
template <typename T>
class DeviceArray
{
public:
    explicit DeviceArray(size_t count)
        : mCount(count)
        , mBuffer(static_cast<int64_t>(std::max<size_t>(count, 1) * sizeof(T)), "DeviceArray")
    {
    }
    //! Holds `values`, copied in on `stream` (and waited for).
    DeviceArray(std::vector<T> const& values, cudaStream_t stream)
        : DeviceArray(values.size())
    {
        upload(values, stream);
    }
    DeviceArray(DeviceArray const&) = delete;
    DeviceArray& operator=(DeviceArray const&) = delete;

    //! Returns the device pointer.
    T* get() const noexcept
    {
        return static_cast<T*>(mBuffer.data());
    }
    //! Returns the number of values.
    size_t size() const noexcept
    {
        return mCount;
    }
    //! Copies `values` (at most size()) to the front of the array, ordered on `stream`, and waits for it.
    void upload(std::vector<T> const& values, cudaStream_t stream)
    {
        if (values.size() > mCount)
        {
            throw std::invalid_argument("more values than the device array holds");
        }
        KVCACHE_CUDA_TRY(
            cudaMemcpyAsync(get(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
    }
    //! Sets every byte to `byte`, ordered on `stream`, and waits for it.
    void fillBytes(int byte, cudaStream_t stream)
    {
        KVCACHE_CUDA_TRY(cudaMemsetAsync(get(), byte, mCount * sizeof(T), stream));
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
    }
    //! Returns the array's contents after the work queued on `stream`.
    std::vector<T> download(cudaStream_t stream) const
    {
        std::vector<T> values(mCount);
        KVCACHE_CUDA_TRY(cudaMemcpyAsync(values.data(), get(), mCount * sizeof(T), cudaMemcpyDeviceToHost, stream));
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
        return values;
    }

private:
    size_t mCount;
    rt::detail::DeviceBuffer mBuffer;
};

//! Copies `bytes` device bytes at `device` to the host after the work queued on `stream`.
inline std::vector<uint8_t> downloadBytes(void const* device, int64_t bytes, cudaStream_t stream)
{
    std::vector<uint8_t> host(static_cast<size_t>(bytes));
    KVCACHE_CUDA_TRY(cudaMemcpyAsync(host.data(), device, host.size(), cudaMemcpyDeviceToHost, stream));
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
    return host;
}

//! Copies `host` to `device` on `stream` and waits for it.
inline void uploadBytes(void* device, std::vector<uint8_t> const& host, cudaStream_t stream)
{
    KVCACHE_CUDA_TRY(cudaMemcpyAsync(device, host.data(), host.size(), cudaMemcpyHostToDevice, stream));
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
}

//! A memory pool of its own on the current device, so that its used-memory counters see only one test's memory.
class DedicatedPool : public CudaHandle<cudaMemPool_t>
{
public:
    DedicatedPool()
    {
        int device = 0;
        KVCACHE_CUDA_TRY(cudaGetDevice(&device));
        cudaMemPoolProps props{};
        props.allocType = cudaMemAllocationTypePinned;
        props.handleTypes = cudaMemHandleTypeNone;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = device;
        KVCACHE_CUDA_TRY(cudaMemPoolCreate(&mHandle, &props));
    }
    ~DedicatedPool()
    {
        KVCACHE_CUDA_LOG(cudaMemPoolDestroy(mHandle));
    }
    //! Returns the bytes allocated from the pool now (call after the allocating stream is synchronised).
    uint64_t usedBytes() const
    {
        return attribute(cudaMemPoolAttrUsedMemCurrent);
    }
    //! Returns the most bytes ever allocated from the pool at once.
    uint64_t usedBytesHigh() const
    {
        return attribute(cudaMemPoolAttrUsedMemHigh);
    }

private:
    uint64_t attribute(cudaMemPoolAttr which) const
    {
        uint64_t value = 0;
        KVCACHE_CUDA_TRY(cudaMemPoolGetAttribute(mHandle, which, &value));
        return value;
    }
};

//! Owns a graph instantiated from what a callable queued on a capturing stream.
class CapturedGraph
{
public:
    template <typename Enqueue>
    CapturedGraph(cudaStream_t stream, Enqueue&& enqueue)
    {
        KVCACHE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        cudaGraph_t graph = nullptr;
        try
        {
            std::forward<Enqueue>(enqueue)();
        }
        catch (...)
        {
            cudaStreamEndCapture(stream, &graph);
            if (graph != nullptr)
            {
                cudaGraphDestroy(graph);
            }
            throw;
        }
        KVCACHE_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
        cudaError_t const status = cudaGraphInstantiate(&mExec, graph, 0);
        KVCACHE_CUDA_LOG(cudaGraphDestroy(graph));
        KVCACHE_CUDA_TRY(status);
    }
    ~CapturedGraph()
    {
        if (mExec != nullptr)
        {
            KVCACHE_CUDA_LOG(cudaGraphExecDestroy(mExec));
        }
    }
    CapturedGraph(CapturedGraph const&) = delete;
    CapturedGraph& operator=(CapturedGraph const&) = delete;

    //! Launches the graph on `stream`.
    void launch(cudaStream_t stream)
    {
        KVCACHE_CUDA_TRY(cudaGraphLaunch(mExec, stream));
    }

private:
    cudaGraphExec_t mExec{nullptr};
};

} // namespace kvcache::test
