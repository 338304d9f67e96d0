#include "kvcache/paging/page_table.h"

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
    detail::StagedUpload upload(shape.elements() * static_cast<int64_t>(sizeof(int32_t)), stream);
    // Both regions start as the tables of count 0, which their first builds rewrite incrementally.
    for (int32_t region = 0; region < detail::StagedUpload::kREGIONS; ++region)
    {
        detail::writeEmptyPageTables(shape, static_cast<int32_t*>(upload.region(region)));
    }
    upload.uploadFirst(shape.indicesOffset() * static_cast<int64_t>(sizeof(int32_t)), stream);
    mUpload = std::move(upload);
    mMaxBatchSize = maxBatchSize;
    mMaxPagesPerSequence = maxPagesPerSequence;
    mTokensPerPage = tokensPerPage;
}

PageTableBuffers::~PageTableBuffers() noexcept = default;

PageTableBuffers::PageTableBuffers(PageTableBuffers&& other) noexcept
{
    *this = std::move(other);
}

PageTableBuffers& PageTableBuffers::operator=(PageTableBuffers&& other) noexcept
{
    // StagedUpload releases its buffers first, so a self-move gives everything up, as DeviceAllocation does.
    mUpload = std::move(other.mUpload);
    mMaxBatchSize = std::exchange(other.mMaxBatchSize, 0);
    mMaxPagesPerSequence = std::exchange(other.mMaxPagesPerSequence, 0);
    mTokensPerPage = std::exchange(other.mTokensPerPage, 0);
    mCount = std::exchange(other.mCount, 0);
    if (!mUpload.owns())
    {
        mMaxBatchSize = 0;
        mMaxPagesPerSequence = 0;
        mTokensPerPage = 0;
        mCount = 0;
    }
    return *this;
}

void PageTableBuffers::build(SequencePages const* sequences, int32_t count, cudaStream_t stream)
{
    auto* const region = static_cast<int32_t*>(mUpload.beginBuild(detail::kBUILD, stream));
    int64_t const elements = detail::buildPageTables(shapeOf(*this), sequences, count, region);
    mUpload.finishBuild(elements * static_cast<int64_t>(sizeof(int32_t)), stream);
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
    auto* const base = static_cast<int32_t*>(mUpload.device());
    return base == nullptr ? nullptr : base + offset;
}

int32_t* PageTableBuffers::hostArray(int64_t offset) const noexcept
{
    auto* const base = static_cast<int32_t*>(mUpload.current());
    return base == nullptr ? nullptr : base + offset;
}

} // namespace kvcache::rt
