#include "kvcache/paging/page_table.h"

#include "paging/page_table_build.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

namespace kvcache::rt
{
namespace detail
{
namespace
{

constexpr char const* kBUILD = "PageTableBuffers::build";

void checkPositive(char const* field, int32_t value)
{
    if (value <= 0)
    {
        throw InvalidArgumentError(fmt::format("PageTableBuffers: {} is {}; it must be > 0", field, value));
    }
}

void validateSequence(PageTableShape const& shape, SequencePages const& sequence, int32_t index)
{
    int64_t const numPages = sequence.numPages;
    if (numPages < 0 || numPages > shape.maxPagesPerSequence)
    {
        throw InvalidArgumentError(fmt::format("{}: sequences[{}].numPages is {}; it must be in [0, {}] "
                                               "(maxPagesPerSequence)",
            kBUILD, index, numPages, shape.maxPagesPerSequence));
    }
    if (numPages > 0 && sequence.pages == nullptr)
    {
        throw InvalidArgumentError(fmt::format("{}: sequences[{}].pages is null with numPages {}; it must point to {} "
                                               "page ids",
            kBUILD, index, numPages, numPages));
    }
    int64_t const tokensPerPage = shape.tokensPerPage;
    int64_t const fewest = numPages == 0 ? 0 : (numPages - 1) * tokensPerPage + 1;
    int64_t const most = numPages * tokensPerPage;
    if (sequence.numTokens < fewest || sequence.numTokens > most)
    {
        throw InvalidArgumentError(fmt::format("{}: sequences[{}].numTokens is {} with numPages {} and tokensPerPage "
                                               "{}; it must be in [{}, {}]",
            kBUILD, index, sequence.numTokens, numPages, tokensPerPage, fewest, most));
    }
}

} // namespace

PageTableShape makePageTableShape(int32_t maxBatchSize, int32_t maxPagesPerSequence, int32_t tokensPerPage)
{
    checkPositive("maxBatchSize", maxBatchSize);
    checkPositive("maxPagesPerSequence", maxPagesPerSequence);
    checkPositive("tokensPerPage", tokensPerPage);
    PageTableShape const shape{maxBatchSize, maxPagesPerSequence, tokensPerPage};
    int64_t const limit = std::numeric_limits<int32_t>::max();
    if (shape.entries() > limit)
    {
        throw InvalidArgumentError(fmt::format("PageTableBuffers: maxBatchSize * maxPagesPerSequence is {} ({} x {}); "
                                               "it must be at most {} (indptr holds int32)",
            shape.entries(), maxBatchSize, maxPagesPerSequence, limit));
    }
    return shape;
}

void validateSequences(PageTableShape const& shape, SequencePages const* sequences, int32_t count)
{
    if (count < 0 || count > shape.maxBatchSize)
    {
        throw InvalidArgumentError(
            fmt::format("{}: count is {}; it must be in [0, {}] (maxBatchSize)", kBUILD, count, shape.maxBatchSize));
    }
    if (count > 0 && sequences == nullptr)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: sequences is null with count {}; it must point to {} SequencePages", kBUILD, count, count));
    }
    for (int32_t i = 0; i < count; ++i)
    {
        validateSequence(shape, sequences[i], i);
    }
}

void writeEmptyPageTables(PageTableShape const& shape, int32_t* region) noexcept
{
    std::fill(region, region + shape.elements(), 0);
    int32_t* const table = region + shape.blockTableOffset();
    std::fill(table, table + shape.entries(), kUNUSED_PAGE_ENTRY);
}

int64_t writePageTables(
    PageTableShape const& shape, SequencePages const* sequences, int32_t count, int32_t* region) noexcept
{
    int32_t* const indptr = region + shape.indptrOffset();
    int32_t* const lastPageLen = region + shape.lastPageLenOffset();
    int32_t* const table = region + shape.blockTableOffset();
    int32_t* const indices = region + shape.indicesOffset();
    int64_t const width = shape.maxPagesPerSequence;
    int64_t const tokensPerPage = shape.tokensPerPage;
    // One pass reads each page list once, for both tables. The previous indptr says how many pages each row held; the
    // pass overwrites indptr[b + 1] only after reading it, carrying the previous indptr[b] in `heldFrom`.
    int64_t const heldInAll = indptr[shape.maxBatchSize];
    int64_t heldFrom = 0;
    int64_t used = 0;
    for (int64_t b = 0; b < count; ++b)
    {
        SequencePages const& sequence = sequences[b];
        int64_t const pages = sequence.numPages;
        int64_t const heldTo = indptr[b + 1];
        int32_t* const row = table + b * width;
        // copy_n and fill take empty ranges (and a null list with no pages) without a branch here.
        std::copy_n(sequence.pages, pages, row);
        // From the list, not the row just written: indices sit a multiple of 4 KiB after the block table at the
        // usual sizes, and reading the row while storing there stalls on 4K aliasing.
        std::copy_n(sequence.pages, pages, indices + used);
        // Padding over the rest of the old pages leaves the row whole without rewriting its unused tail.
        std::fill(row + pages, row + std::max(heldTo - heldFrom, pages), kUNUSED_PAGE_ENTRY);
        heldFrom = heldTo;
        used += pages;
        // At most maxBatchSize * maxPagesPerSequence, which makePageTableShape keeps within int32.
        indptr[b + 1] = static_cast<int32_t>(used);
        // numTokens is 0 with no pages, so the tokens past the full pages are 0 too.
        lastPageLen[b] = static_cast<int32_t>(sequence.numTokens - std::max<int64_t>(pages - 1, 0) * tokensPerPage);
    }
    // Rows from `count` on are empty now; only those that held pages before need padding, and they end where the
    // previous pages in use do.
    for (int64_t b = count; b < shape.maxBatchSize && heldFrom < heldInAll; ++b)
    {
        int64_t const heldTo = indptr[b + 1];
        int32_t* const row = table + b * width;
        std::fill(row, row + (heldTo - heldFrom), kUNUSED_PAGE_ENTRY);
        heldFrom = heldTo;
    }
    std::fill(indptr + count + 1, indptr + shape.maxBatchSize + 1, static_cast<int32_t>(used));
    std::fill(lastPageLen + count, lastPageLen + shape.maxBatchSize, 0);
    return shape.indicesOffset() + used;
}

int64_t buildPageTables(PageTableShape const& shape, SequencePages const* sequences, int32_t count, int32_t* region)
{
    validateSequences(shape, sequences, count);
    return writePageTables(shape, sequences, count, region);
}

} // namespace detail

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
    try
    {
        mDeviceTables = DeviceAllocation(bytes, stream);
        void* staging = nullptr;
        KVCACHE_CUDA_TRY(cudaHostAlloc(&staging, static_cast<size_t>(bytes), cudaHostAllocDefault));
        mStaging = static_cast<int32_t*>(staging);
        KVCACHE_CUDA_TRY(cudaEventCreateWithFlags(&mUploaded, cudaEventDisableTiming));
        detail::writeEmptyPageTables(shape, mStaging);
        upload(shape.indicesOffset() * static_cast<int64_t>(sizeof(int32_t)), stream);
    }
    catch (...)
    {
        release();
        throw;
    }
    mMaxBatchSize = maxBatchSize;
    mMaxPagesPerSequence = maxPagesPerSequence;
    mTokensPerPage = tokensPerPage;
}

PageTableBuffers::~PageTableBuffers() noexcept
{
    release();
}

PageTableBuffers::PageTableBuffers(PageTableBuffers&& other) noexcept
    : mDeviceTables(std::move(other.mDeviceTables))
    , mStaging(std::exchange(other.mStaging, nullptr))
    , mUploaded(std::exchange(other.mUploaded, nullptr))
    , mMaxBatchSize(std::exchange(other.mMaxBatchSize, 0))
    , mMaxPagesPerSequence(std::exchange(other.mMaxPagesPerSequence, 0))
    , mTokensPerPage(std::exchange(other.mTokensPerPage, 0))
    , mCount(std::exchange(other.mCount, 0))
    , mUploadBytes(std::exchange(other.mUploadBytes, 0))
{
}

PageTableBuffers& PageTableBuffers::operator=(PageTableBuffers&& other) noexcept
{
    // Releasing first makes a self-move give everything up, as DeviceAllocation does.
    release();
    mDeviceTables = std::move(other.mDeviceTables);
    mStaging = std::exchange(other.mStaging, nullptr);
    mUploaded = std::exchange(other.mUploaded, nullptr);
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
    detail::PageTableShape const shape = shapeOf(*this);
    detail::validateSequences(shape, sequences, count);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    KVCACHE_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone)
    {
        throw InvalidArgumentError(fmt::format("{}: stream is capturing a CUDA graph; it must not be: build() uploads "
                                               "from host staging that the next build rewrites (capture the kernels "
                                               "that read the tables instead)",
            detail::kBUILD));
    }
    waitForUpload();
    int64_t const elements = detail::writePageTables(shape, sequences, count, mStaging);
    upload(elements * static_cast<int64_t>(sizeof(int32_t)), stream);
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
    return mStaging == nullptr ? nullptr : mStaging + offset;
}

void PageTableBuffers::waitForUpload() const
{
    // Querying first keeps the common case (the copy long done) free of a blocking call.
    cudaError_t const status = cudaEventQuery(mUploaded);
    if (status == cudaErrorNotReady)
    {
        KVCACHE_CUDA_TRY(cudaEventSynchronize(mUploaded));
    }
    else if (status != cudaSuccess)
    {
        detail::throwCudaError(status, "cudaEventQuery(mUploaded)", __FILE__, __LINE__);
    }
}

void PageTableBuffers::upload(int64_t bytes, cudaStream_t stream)
{
    KVCACHE_CUDA_TRY(
        cudaMemcpyAsync(mDeviceTables.data(), mStaging, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream));
    KVCACHE_CUDA_TRY(cudaEventRecord(mUploaded, stream));
    mUploadBytes = bytes;
}

void PageTableBuffers::release() noexcept
{
    if (mUploaded != nullptr)
    {
        // The staging must outlive the copy reading it, and the device memory the copy writing it: once the event has
        // completed, freeing both (the device memory stream-ordered after it) is safe.
        KVCACHE_CUDA_LOG(cudaEventSynchronize(mUploaded));
        KVCACHE_CUDA_LOG(cudaEventDestroy(mUploaded));
        mUploaded = nullptr;
    }
    if (mStaging != nullptr)
    {
        KVCACHE_CUDA_LOG(cudaFreeHost(mStaging));
        mStaging = nullptr;
    }
    mDeviceTables.reset();
    mMaxBatchSize = 0;
    mMaxPagesPerSequence = 0;
    mTokensPerPage = 0;
    mCount = 0;
    mUploadBytes = 0;
}

} // namespace kvcache::rt
