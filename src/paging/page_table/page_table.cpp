#include "kvcache/paging/page_table.h"

#include "core/cuda_owners.h"
#include "paging/page_table/page_table_build.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <utility>

namespace kvcache::rt
{
namespace
{

detail::PageTableShape shapeOf(PageTableBuffers const& tables) noexcept
{
    return {tables.maxBatchSize(), tables.maxPagesPerSequence(), tables.tokensPerPage()};
}

} // namespace

PageTableBuffers::PageTableBuffers(
    int32_t maxBatchSize, int32_t maxPagesPerSequence, int32_t tokensPerPage, cudaStream_t stream)
{
    detail::PageTableShape const shape = detail::makePageTableShape(maxBatchSize, maxPagesPerSequence, tokensPerPage);
    int64_t const bytes = shape.elements() * static_cast<int64_t>(sizeof(int32_t));
    // Set first, as the staging regions' addresses derive from them; release() clears them again on failure.
    mMaxBatchSize = maxBatchSize;
    mMaxPagesPerSequence = maxPagesPerSequence;
    mTokensPerPage = tokensPerPage;
    try
    {
        mDeviceTables = DeviceAllocation(bytes, stream);
        mStaging = static_cast<int32_t*>(detail::PinnedHostBuffer(kSTAGING_REGIONS * bytes).release());
        for (cudaEvent_t& uploaded : mUploaded)
        {
            uploaded = detail::CudaEvent().release();
        }
        // Both regions start as the tables of count 0, which their first builds rewrite incrementally.
        for (int32_t region = 0; region < kSTAGING_REGIONS; ++region)
        {
            detail::writeEmptyPageTables(shape, stagingRegion(region));
        }
        upload(0, shape.indicesOffset() * static_cast<int64_t>(sizeof(int32_t)), stream);
    }
    catch (...)
    {
        release();
        throw;
    }
}

PageTableBuffers::~PageTableBuffers() noexcept
{
    release();
}

PageTableBuffers::PageTableBuffers(PageTableBuffers&& other) noexcept
{
    *this = std::move(other);
}

PageTableBuffers& PageTableBuffers::operator=(PageTableBuffers&& other) noexcept
{
    // Releasing first makes a self-move give everything up, as DeviceAllocation does.
    release();
    mDeviceTables = std::move(other.mDeviceTables);
    mStaging = std::exchange(other.mStaging, nullptr);
    mUploaded = std::exchange(other.mUploaded, {});
    mRegion = std::exchange(other.mRegion, 0);
    mUploadStream = std::exchange(other.mUploadStream, nullptr);
    mMaxBatchSize = std::exchange(other.mMaxBatchSize, 0);
    mMaxPagesPerSequence = std::exchange(other.mMaxPagesPerSequence, 0);
    mTokensPerPage = std::exchange(other.mTokensPerPage, 0);
    mCount = std::exchange(other.mCount, 0);
    mUploadBytes = std::exchange(other.mUploadBytes, 0);
    return *this;
}

void PageTableBuffers::build(SequencePages const* sequences, int32_t count, cudaStream_t stream)
{
    if (mStaging == nullptr)
    {
        throw InvalidArgumentError(
            fmt::format("{}: this object owns no tables (default-constructed or moved from)", detail::kBUILD));
    }
    if (detail::captureStatus(stream) != cudaStreamCaptureStatusNone)
    {
        throw InvalidArgumentError(fmt::format("{}: stream is capturing a CUDA graph; it must not be: build() uploads "
                                               "from host staging that later builds rewrite (capture the kernels "
                                               "that read the tables instead)",
            detail::kBUILD));
    }
    // The region the last upload read stays as it is: this build writes the other, whose upload (the one before) has
    // almost always finished, so the wait is rarely a real one.
    int32_t const next = 1 - mRegion;
    waitForUpload(next);
    int64_t const elements = detail::buildPageTables(shapeOf(*this), sequences, count, stagingRegion(next));
    // Uploads on one stream land in build order; on another stream, this one waits for the last on the device (no
    // host wait ordered them).
    if (stream != mUploadStream)
    {
        KVCACHE_CUDA_TRY(cudaStreamWaitEvent(stream, mUploaded[static_cast<size_t>(mRegion)], 0));
    }
    upload(next, elements * static_cast<int64_t>(sizeof(int32_t)), stream);
    mRegion = next;
    mCount = count;
}

int32_t const* PageTableBuffers::deviceIndptr() const noexcept
{
    return deviceArray(shapeOf(*this).indptrOffset());
}

int32_t const* PageTableBuffers::deviceIndices() const noexcept
{
    return deviceArray(shapeOf(*this).indicesOffset());
}

int32_t const* PageTableBuffers::deviceLastPageLen() const noexcept
{
    return deviceArray(shapeOf(*this).lastPageLenOffset());
}

int32_t const* PageTableBuffers::deviceFirstToken() const noexcept
{
    return deviceArray(shapeOf(*this).firstTokenOffset());
}

int32_t const* PageTableBuffers::deviceResidentTokens() const noexcept
{
    return deviceArray(shapeOf(*this).residentTokensOffset());
}

int32_t const* PageTableBuffers::hostFirstToken() const noexcept
{
    return hostArray(shapeOf(*this).firstTokenOffset());
}

int32_t const* PageTableBuffers::hostResidentTokens() const noexcept
{
    return hostArray(shapeOf(*this).residentTokensOffset());
}

int32_t const* PageTableBuffers::deviceBlockTable() const noexcept
{
    return deviceArray(shapeOf(*this).blockTableOffset());
}

int32_t const* PageTableBuffers::hostIndptr() const noexcept
{
    return hostArray(shapeOf(*this).indptrOffset());
}

int32_t const* PageTableBuffers::hostIndices() const noexcept
{
    return hostArray(shapeOf(*this).indicesOffset());
}

int32_t const* PageTableBuffers::hostLastPageLen() const noexcept
{
    return hostArray(shapeOf(*this).lastPageLenOffset());
}

int32_t const* PageTableBuffers::hostBlockTable() const noexcept
{
    return hostArray(shapeOf(*this).blockTableOffset());
}

int32_t* PageTableBuffers::deviceArray(int64_t offset) const noexcept
{
    auto* const base = static_cast<int32_t*>(mDeviceTables.data());
    return base == nullptr ? nullptr : base + offset;
}

int32_t* PageTableBuffers::hostArray(int64_t offset) const noexcept
{
    return mStaging == nullptr ? nullptr : stagingRegion(mRegion) + offset;
}

int32_t* PageTableBuffers::stagingRegion(int32_t region) const noexcept
{
    return mStaging + region * shapeOf(*this).elements();
}

void PageTableBuffers::waitForUpload(int32_t region) const
{
    // Querying first keeps the common case (the copy long done) free of a blocking call.
    cudaEvent_t const uploaded = mUploaded[static_cast<size_t>(region)];
    cudaError_t const status = cudaEventQuery(uploaded);
    if (status == cudaErrorNotReady)
    {
        KVCACHE_CUDA_TRY(cudaEventSynchronize(uploaded));
    }
    else if (status != cudaSuccess)
    {
        detail::throwCudaError(status, "cudaEventQuery(mUploaded[region])", __FILE__, __LINE__);
    }
}

void PageTableBuffers::upload(int32_t region, int64_t bytes, cudaStream_t stream)
{
    KVCACHE_CUDA_TRY(cudaMemcpyAsync(
        mDeviceTables.data(), stagingRegion(region), static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream));
    KVCACHE_CUDA_TRY(cudaEventRecord(mUploaded[static_cast<size_t>(region)], stream));
    mUploadBytes = bytes;
    mUploadStream = stream;
}

void PageTableBuffers::release() noexcept
{
    {
        // The staging must outlive the copies reading it, and the device memory the copies writing it: once both
        // events have completed, freeing both (the device memory stream-ordered after them) is safe. The owners free
        // in reverse order: the events, then the staging.
        detail::PinnedHostBuffer const staging = detail::PinnedHostBuffer::adopt(std::exchange(mStaging, nullptr), 0);
        detail::CudaEvent const uploaded[kSTAGING_REGIONS] = {
            detail::CudaEvent::adopt(std::exchange(mUploaded[0], nullptr)),
            detail::CudaEvent::adopt(std::exchange(mUploaded[1], nullptr))};
        for (detail::CudaEvent const& event : uploaded)
        {
            event.synchronizeNoThrow();
        }
    }
    mDeviceTables.reset();
    mRegion = 0;
    mUploadStream = nullptr;
    mMaxBatchSize = 0;
    mMaxPagesPerSequence = 0;
    mTokensPerPage = 0;
    mCount = 0;
    mUploadBytes = 0;
}

} // namespace kvcache::rt
