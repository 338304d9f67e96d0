// The device buffer and double-buffered pinned staging behind PageTableBuffers and StepArgumentBuffers
// (kvcache/paging/page_table.h, detail::StagedUpload).

#include "core/cuda_owners.h"

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_table.h"

#include <fmt/format.h>

#include <utility>

namespace kvcache::rt::detail
{

StagedUpload::StagedUpload(int64_t bytes, cudaStream_t stream)
{
    try
    {
        mDevice = DeviceAllocation(bytes, stream);
        mStaging = static_cast<std::byte*>(PinnedHostBuffer(kREGIONS * bytes).release());
        mBytes = bytes;
        for (cudaEvent_t& uploaded : mUploaded)
        {
            uploaded = CudaEvent().release();
        }
    }
    catch (...)
    {
        release();
        throw;
    }
}

StagedUpload::~StagedUpload() noexcept
{
    release();
}

StagedUpload::StagedUpload(StagedUpload&& other) noexcept
{
    *this = std::move(other);
}

StagedUpload& StagedUpload::operator=(StagedUpload&& other) noexcept
{
    // Releasing first makes a self-move give everything up, as DeviceAllocation does.
    release();
    mDevice = std::move(other.mDevice);
    mStaging = std::exchange(other.mStaging, nullptr);
    mBytes = std::exchange(other.mBytes, 0);
    mUploaded = std::exchange(other.mUploaded, {});
    mRegion = std::exchange(other.mRegion, 0);
    mUploadStream = std::exchange(other.mUploadStream, nullptr);
    mUploadBytes = std::exchange(other.mUploadBytes, 0);
    return *this;
}

void* StagedUpload::region(int32_t region) const noexcept
{
    return mStaging == nullptr ? nullptr : mStaging + region * mBytes;
}

void* StagedUpload::beginBuild(char const* what, cudaStream_t stream)
{
    if (mStaging == nullptr)
    {
        throw InvalidArgumentError(
            fmt::format("{}: this object owns no buffers (default-constructed or moved from)", what));
    }
    if (captureStatus(stream) != cudaStreamCaptureStatusNone)
    {
        throw InvalidArgumentError(fmt::format("{}: stream is capturing a CUDA graph; it must not be: build() uploads "
                                               "from host staging that later builds rewrite (capture the kernels "
                                               "that read the buffers instead)",
            what));
    }
    // The region the last upload read stays as it is: this build writes the other, whose upload (the one before) has
    // almost always finished, so the wait is rarely a real one. Querying first keeps that case free of a blocking
    // call.
    int32_t const next = 1 - mRegion;
    cudaEvent_t const uploaded = mUploaded[static_cast<size_t>(next)];
    cudaError_t const status = cudaEventQuery(uploaded);
    if (status == cudaErrorNotReady)
    {
        KVCACHE_CUDA_TRY(cudaEventSynchronize(uploaded));
    }
    else if (status != cudaSuccess)
    {
        throwCudaError(status, "cudaEventQuery(mUploaded[region])", __FILE__, __LINE__);
    }
    return region(next);
}

void StagedUpload::finishBuild(int64_t bytes, cudaStream_t stream)
{
    // Uploads on one stream land in build order; on another stream, this one waits for the last on the device (no
    // host wait ordered them).
    if (stream != mUploadStream)
    {
        KVCACHE_CUDA_TRY(cudaStreamWaitEvent(stream, mUploaded[static_cast<size_t>(mRegion)], 0));
    }
    int32_t const next = 1 - mRegion;
    upload(next, bytes, stream);
    mRegion = next;
}

void StagedUpload::uploadFirst(int64_t bytes, cudaStream_t stream)
{
    upload(0, bytes, stream);
    mRegion = 0;
}

void StagedUpload::upload(int32_t region, int64_t bytes, cudaStream_t stream)
{
    KVCACHE_CUDA_TRY(cudaMemcpyAsync(
        mDevice.data(), this->region(region), static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream));
    KVCACHE_CUDA_TRY(cudaEventRecord(mUploaded[static_cast<size_t>(region)], stream));
    mUploadBytes = bytes;
    mUploadStream = stream;
}

void StagedUpload::release() noexcept
{
    {
        // The staging must outlive the copies reading it, and the device memory the copies writing it: once both
        // events have completed, freeing both (the device memory stream-ordered after them) is safe. The owners free
        // in reverse order: the events, then the staging.
        PinnedHostBuffer const staging = PinnedHostBuffer::adopt(std::exchange(mStaging, nullptr), 0);
        CudaEvent const uploaded[kREGIONS] = {CudaEvent::adopt(std::exchange(mUploaded[0], nullptr)),
            CudaEvent::adopt(std::exchange(mUploaded[1], nullptr))};
        for (CudaEvent const& event : uploaded)
        {
            event.synchronizeNoThrow();
        }
    }
    mDevice.reset();
    mBytes = 0;
    mRegion = 0;
    mUploadStream = nullptr;
    mUploadBytes = 0;
}

} // namespace kvcache::rt::detail
