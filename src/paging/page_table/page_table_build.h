#pragma once

#include "kvcache/paging/page_table.h"

#include <cstdint>
#include <cstring>

namespace kvcache::rt::detail
{

//! What build()'s errors name.
inline constexpr char const* kBUILD = "PageTableBuffers::build";

//! Each array of a page table region starts a multiple of this many bytes from the region's start, so a kernel can
//! read it with aligned vector loads and whole cache lines.
inline constexpr int64_t kPAGE_TABLE_ALIGNMENT_BYTES = 128;

//! Returns `elements` int32 rounded up to a multiple of kPAGE_TABLE_ALIGNMENT_BYTES: where the next array starts.
constexpr int64_t alignedElements(int64_t elements) noexcept
{
    constexpr int64_t step = kPAGE_TABLE_ALIGNMENT_BYTES / static_cast<int64_t>(sizeof(int32_t));
    return (elements + step - 1) / step * step;
}

//! The sizes of a page table region and where its six arrays sit, in int32 elements from its start: indptr,
//! lastPageLen, firstToken, residentTokens, block table, indices (the order that lets one copy of a prefix move
//! everything in use).
struct PageTableShape
{
    int32_t maxBatchSize = 0;
    int32_t maxPagesPerSequence = 0;
    int32_t tokensPerPage = 0;

    //! Returns maxBatchSize * maxPagesPerSequence: the block table's entries and the indices' room.
    int64_t entries() const noexcept
    {
        return int64_t{maxBatchSize} * maxPagesPerSequence;
    }
    //! Returns the offset of indptr (maxBatchSize + 1 entries).
    int64_t indptrOffset() const noexcept
    {
        return 0;
    }
    //! Returns the offset of lastPageLen (maxBatchSize entries).
    int64_t lastPageLenOffset() const noexcept
    {
        return aligned(int64_t{maxBatchSize} + 1);
    }
    //! Returns the offset of firstToken (maxBatchSize entries).
    int64_t firstTokenOffset() const noexcept
    {
        return lastPageLenOffset() + aligned(maxBatchSize);
    }
    //! Returns the offset of residentTokens (maxBatchSize entries).
    int64_t residentTokensOffset() const noexcept
    {
        return firstTokenOffset() + aligned(maxBatchSize);
    }
    //! Returns the offset of the block table (entries()).
    int64_t blockTableOffset() const noexcept
    {
        return residentTokensOffset() + aligned(maxBatchSize);
    }
    //! Returns the offset of indices (room for entries()).
    int64_t indicesOffset() const noexcept
    {
        return blockTableOffset() + aligned(entries());
    }
    //! Returns the elements of the whole region.
    int64_t elements() const noexcept
    {
        return indicesOffset() + aligned(entries());
    }

private:
    static int64_t aligned(int64_t elements) noexcept
    {
        return alignedElements(elements);
    }
};

//! Returns the shape of tables of these sizes; throws InvalidArgumentError naming the field, its value and the limit
//! for a non-positive size or more than INT32_MAX entries.
PageTableShape makePageTableShape(int32_t maxBatchSize, int32_t maxPagesPerSequence, int32_t tokensPerPage);

//! Returns the pages a sliding window released at the front of `sequence`: its leading kUNUSED_PAGE_ENTRY entries.
//! Eight entries are taken at a time while all are released (their AND is kUNUSED_PAGE_ENTRY, all bits set, only
//! then): a window's list is mostly released entries, and one compare and branch an entry made a windowed build of 256
//! lists of 64 entries, 48 released, three to four times as slow as a full one.
inline int64_t releasedPages(SequencePages const& sequence) noexcept
{
    static_assert(kUNUSED_PAGE_ENTRY == -1, "the AND of released entries is -1");
    int64_t released = 0;
    while (released + 8 <= sequence.numPages)
    {
        // Two entries a 64-bit load: four loads and ANDs.
        uint64_t all = ~uint64_t{0};
        for (int32_t k = 0; k < 8; k += 2)
        {
            uint64_t pair = 0;
            std::memcpy(&pair, sequence.pages + released + k, sizeof pair);
            all &= pair;
        }
        if (all != ~uint64_t{0})
        {
            break;
        }
        released += 8;
    }
    while (released < sequence.numPages && sequence.pages[released] == kUNUSED_PAGE_ENTRY)
    {
        ++released;
    }
    return released;
}

//! Writes the tables of count 0 over the whole `region` (shape.elements() entries), padding included.
void writeEmptyPageTables(PageTableShape const& shape, int32_t* region) noexcept;

//! Throws InvalidArgumentError, naming the sequence index, the field, the value and the limit, unless `count`
//! sequences make tables of `shape` (the rules of PageTableBuffers::build); touches nothing. Builds check as they write
//! (buildPageTables): this is for a caller that only checks.
void validateSequences(PageTableShape const& shape, SequencePages const* sequences, int32_t count);

//! Checks `count` sequences (the rules of PageTableBuffers::build) and writes their tables into `region`, which holds
//! tables of `shape` as a previous build (or writeEmptyPageTables) left them: only what differs from those is written.
//! Returns the elements one upload must copy from the region's start (indicesOffset() + indptr[count]). Throws
//! InvalidArgumentError, naming the sequence index, the field, the value and the limit: for a bad `count` or null
//! `sequences` with `region` untouched, for a refused sequence with `region` holding the tables of count 0.
int64_t buildPageTables(PageTableShape const& shape, SequencePages const* sequences, int32_t count, int32_t* region);

} // namespace kvcache::rt::detail
