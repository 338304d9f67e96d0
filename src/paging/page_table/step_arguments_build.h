#pragma once

#include "paging/page_table/page_table_build.h"

#include "kvcache/memory/kv_write.h"
#include "kvcache/paging/page_manager.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt::detail
{

//! What StepArgumentBuffers' errors name.
inline constexpr char const* kSTEP_BUILD = "StepArgumentBuffers::build";

//! The sizes of a step argument region and where its parts sit, in int32 elements from its start: the token count,
//! qoIndptr, the state slots, the positions (two int32 a TokenPosition), then each group's page table region
//! (PageTableShape) in group order, each part starting a multiple of kPAGE_TABLE_ALIGNMENT_BYTES from the start.
struct StepArgumentShape
{
    int32_t maxBatchSize = 0;
    int32_t maxTokensPerStep = 0;
    int32_t tokensPerPage = 0;
    //! One table shape a group: maxBatchSize rows of the group's pagesPerSequence.
    std::vector<PageTableShape> groups;
    //! Where each group's tables start, and past the last one: the region's elements.
    std::vector<int64_t> groupOffsets;

    //! Returns the offset of the token count (one element).
    static constexpr int64_t tokenCountOffset() noexcept
    {
        return 0;
    }
    //! Returns the offset of qoIndptr (maxBatchSize + 1 entries).
    static constexpr int64_t qoIndptrOffset() noexcept
    {
        return alignedElements(1);
    }
    //! Returns the offset of the state slots (maxBatchSize entries).
    int64_t stateSlotsOffset() const noexcept
    {
        return qoIndptrOffset() + alignedElements(int64_t{maxBatchSize} + 1);
    }
    //! Returns the offset of the positions (2 * maxTokensPerStep elements).
    int64_t positionsOffset() const noexcept
    {
        return stateSlotsOffset() + alignedElements(maxBatchSize);
    }
    //! Returns the number of page groups.
    int32_t numGroups() const noexcept
    {
        return static_cast<int32_t>(groups.size());
    }
    //! Returns the elements of the whole region.
    int64_t elements() const noexcept
    {
        return groupOffsets.back();
    }
};

//! What a build reuses from one call to the next, so that a steady batch allocates nothing: each entry's page list
//! of one group at a time, and each entry's sequence length.
struct StepScratch
{
    std::vector<SequencePages> pages;
    std::vector<int32_t> lengths;
};

//! Returns the shape of step arguments for `manager`'s page groups; throws InvalidArgumentError naming the field, its
//! value and the limit for a non-positive size or a group table of more than INT32_MAX entries.
StepArgumentShape makeStepArgumentShape(PageManager const& manager, int32_t maxBatchSize, int32_t maxTokensPerStep);

//! Writes the arguments of an empty step over the whole `region` (shape.elements() entries), padding included.
void writeEmptyStepArguments(StepArgumentShape const& shape, int32_t* region) noexcept;

//! Checks the step (the rules of StepArgumentBuffers::build) before writing anything, then writes its arguments into
//! `region`, which holds arguments of `shape` as a previous build (or writeEmptyStepArguments) left them: only what
//! differs from those is written. `scratch` is reused between calls. Returns the elements one upload must
//! copy from the region's start (through the last group's indices in use). Throws InvalidArgumentError naming the
//! field, the value and the limit, with `region` untouched.
int64_t buildStepArguments(StepArgumentShape const& shape, PageManager const& manager, SequenceAppend const* entries,
    int32_t count, int32_t* region, StepScratch& scratch);

} // namespace kvcache::rt::detail
