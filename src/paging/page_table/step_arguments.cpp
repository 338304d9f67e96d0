#include "kvcache/paging/step_arguments.h"

#include "paging/page_table/step_arguments_build.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <utility>

namespace kvcache::rt
{

StepArgumentBuffers::StepArgumentBuffers() noexcept = default;

StepArgumentBuffers::StepArgumentBuffers(
    PageManager const& manager, int32_t maxBatchSize, int32_t maxTokensPerStep, cudaStream_t stream)
{
    auto shape = std::make_unique<detail::StepArgumentShape>(
        detail::makeStepArgumentShape(manager, maxBatchSize, maxTokensPerStep));
    detail::StagedUpload upload(shape->elements() * static_cast<int64_t>(sizeof(int32_t)), stream);
    // Both regions start as the arguments of an empty step, which their first builds rewrite incrementally.
    for (int32_t region = 0; region < detail::StagedUpload::kREGIONS; ++region)
    {
        detail::writeEmptyStepArguments(*shape, static_cast<int32_t*>(upload.region(region)));
    }
    // Everything but the last group's indices, which no row uses yet.
    detail::PageTableShape const& last = shape->groups.back();
    upload.uploadFirst(
        (shape->groupOffsets[shape->groups.size() - 1] + last.indicesOffset()) * static_cast<int64_t>(sizeof(int32_t)),
        stream);
    mScratch = std::make_unique<detail::StepScratch>();
    mScratch->pages.reserve(static_cast<size_t>(maxBatchSize));
    mScratch->lengths.reserve(static_cast<size_t>(maxBatchSize));
    mUpload = std::move(upload);
    mShape = std::move(shape);
}

StepArgumentBuffers::~StepArgumentBuffers() noexcept = default;

StepArgumentBuffers::StepArgumentBuffers(StepArgumentBuffers&& other) noexcept
{
    *this = std::move(other);
}

StepArgumentBuffers& StepArgumentBuffers::operator=(StepArgumentBuffers&& other) noexcept
{
    // StagedUpload releases its buffers first, so a self-move gives everything up.
    mUpload = std::move(other.mUpload);
    mShape = std::move(other.mShape);
    mScratch = std::move(other.mScratch);
    mCount = std::exchange(other.mCount, 0);
    mTokenCount = std::exchange(other.mTokenCount, 0);
    if (!mUpload.owns())
    {
        mShape.reset();
        mScratch.reset();
        mCount = 0;
        mTokenCount = 0;
    }
    return *this;
}

void StepArgumentBuffers::build(
    PageManager const& manager, SequenceAppend const* entries, int32_t count, cudaStream_t stream)
{
    auto* const region = static_cast<int32_t*>(mUpload.beginBuild(detail::kSTEP_BUILD, stream));
    int64_t const elements = detail::buildStepArguments(*mShape, manager, entries, count, region, *mScratch);
    mUpload.finishBuild(elements * static_cast<int64_t>(sizeof(int32_t)), stream);
    mCount = count;
    mTokenCount = region[detail::StepArgumentShape::tokenCountOffset()];
}

TokenPosition const* StepArgumentBuffers::devicePositions() const noexcept
{
    return mShape == nullptr ? nullptr : reinterpret_cast<TokenPosition const*>(deviceArray(mShape->positionsOffset()));
}

int32_t const* StepArgumentBuffers::deviceQoIndptr() const noexcept
{
    return deviceArray(detail::StepArgumentShape::qoIndptrOffset());
}

int32_t const* StepArgumentBuffers::deviceTokenCount() const noexcept
{
    return deviceArray(detail::StepArgumentShape::tokenCountOffset());
}

int32_t const* StepArgumentBuffers::deviceStateSlots() const noexcept
{
    return mShape == nullptr ? nullptr : deviceArray(mShape->stateSlotsOffset());
}

TokenPosition const* StepArgumentBuffers::hostPositions() const noexcept
{
    return mShape == nullptr ? nullptr : reinterpret_cast<TokenPosition const*>(hostArray(mShape->positionsOffset()));
}

int32_t const* StepArgumentBuffers::hostQoIndptr() const noexcept
{
    return hostArray(detail::StepArgumentShape::qoIndptrOffset());
}

int32_t const* StepArgumentBuffers::hostStateSlots() const noexcept
{
    return mShape == nullptr ? nullptr : hostArray(mShape->stateSlotsOffset());
}

DevicePageTable StepArgumentBuffers::table(int32_t group) const
{
    DevicePageTable table;
    table.indptr = deviceIndptr(group);
    table.indices = deviceIndices(group);
    table.firstToken = deviceFirstToken(group);
    table.numSequences = mShape->maxBatchSize;
    return table;
}

int32_t const* StepArgumentBuffers::deviceIndptr(int32_t group) const
{
    return deviceArray(groupOffset(group) + mShape->groups[static_cast<size_t>(group)].indptrOffset());
}

int32_t const* StepArgumentBuffers::deviceIndices(int32_t group) const
{
    return deviceArray(groupOffset(group) + mShape->groups[static_cast<size_t>(group)].indicesOffset());
}

int32_t const* StepArgumentBuffers::deviceLastPageLen(int32_t group) const
{
    return deviceArray(groupOffset(group) + mShape->groups[static_cast<size_t>(group)].lastPageLenOffset());
}

int32_t const* StepArgumentBuffers::deviceFirstToken(int32_t group) const
{
    return deviceArray(groupOffset(group) + mShape->groups[static_cast<size_t>(group)].firstTokenOffset());
}

int32_t const* StepArgumentBuffers::deviceResidentTokens(int32_t group) const
{
    return deviceArray(groupOffset(group) + mShape->groups[static_cast<size_t>(group)].residentTokensOffset());
}

int32_t const* StepArgumentBuffers::deviceBlockTable(int32_t group) const
{
    return deviceArray(groupOffset(group) + mShape->groups[static_cast<size_t>(group)].blockTableOffset());
}

int32_t const* StepArgumentBuffers::hostIndptr(int32_t group) const
{
    return hostArray(groupOffset(group) + mShape->groups[static_cast<size_t>(group)].indptrOffset());
}

int32_t const* StepArgumentBuffers::hostIndices(int32_t group) const
{
    return hostArray(groupOffset(group) + mShape->groups[static_cast<size_t>(group)].indicesOffset());
}

int32_t const* StepArgumentBuffers::hostLastPageLen(int32_t group) const
{
    return hostArray(groupOffset(group) + mShape->groups[static_cast<size_t>(group)].lastPageLenOffset());
}

int32_t const* StepArgumentBuffers::hostFirstToken(int32_t group) const
{
    return hostArray(groupOffset(group) + mShape->groups[static_cast<size_t>(group)].firstTokenOffset());
}

int32_t const* StepArgumentBuffers::hostResidentTokens(int32_t group) const
{
    return hostArray(groupOffset(group) + mShape->groups[static_cast<size_t>(group)].residentTokensOffset());
}

int32_t const* StepArgumentBuffers::hostBlockTable(int32_t group) const
{
    return hostArray(groupOffset(group) + mShape->groups[static_cast<size_t>(group)].blockTableOffset());
}

int32_t StepArgumentBuffers::usedIndices(int32_t group) const
{
    return hostIndptr(group)[mCount];
}

int32_t StepArgumentBuffers::maxPagesPerSequence(int32_t group) const
{
    groupOffset(group);
    return mShape->groups[static_cast<size_t>(group)].maxPagesPerSequence;
}

int32_t StepArgumentBuffers::numGroups() const noexcept
{
    return mShape == nullptr ? 0 : mShape->numGroups();
}

int32_t StepArgumentBuffers::maxBatchSize() const noexcept
{
    return mShape == nullptr ? 0 : mShape->maxBatchSize;
}

int32_t StepArgumentBuffers::maxTokensPerStep() const noexcept
{
    return mShape == nullptr ? 0 : mShape->maxTokensPerStep;
}

int32_t StepArgumentBuffers::tokensPerPage() const noexcept
{
    return mShape == nullptr ? 0 : mShape->tokensPerPage;
}

int32_t const* StepArgumentBuffers::deviceArray(int64_t offset) const noexcept
{
    auto const* const base = static_cast<int32_t const*>(mUpload.device());
    return base == nullptr ? nullptr : base + offset;
}

int32_t const* StepArgumentBuffers::hostArray(int64_t offset) const noexcept
{
    auto const* const base = static_cast<int32_t const*>(mUpload.current());
    return base == nullptr ? nullptr : base + offset;
}

int64_t StepArgumentBuffers::groupOffset(int32_t group) const
{
    if (group < 0 || group >= numGroups())
    {
        throw OutOfRangeError(fmt::format(
            "StepArgumentBuffers: group is {}; it must be in [0, {}) (the page groups)", group, numGroups()));
    }
    return mShape->groupOffsets[static_cast<size_t>(group)];
}

} // namespace kvcache::rt
