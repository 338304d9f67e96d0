// Page table building on the host: the checks and the pass that writes a staging region (page_table_build.h).
// No CUDA calls, so host tests drive every path.

#include "paging/page_table/page_table_build.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace kvcache::rt
{
namespace detail
{
namespace
{

void checkPositive(char const* field, int32_t value)
{
    if (value <= 0)
    {
        throw InvalidArgumentError(fmt::format("PageTableBuffers: {} is {}; it must be > 0", field, value));
    }
}

//! Throws unless `count` sequences fit the tables and `sequences` points to them.
void checkCount(PageTableShape const& shape, SequencePages const* sequences, int32_t count)
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
}

[[noreturn]] void throwNumPages(int32_t index, int64_t numPages)
{
    throw InvalidArgumentError(
        fmt::format("{}: sequences[{}].numPages is {}; it must be >= 0", kBUILD, index, numPages));
}

[[noreturn]] void throwResidentPages(int32_t index, int64_t numPages, int64_t released, int64_t most)
{
    throw InvalidArgumentError(
        fmt::format("{}: sequences[{}].numPages is {} with {} released: {} resident pages; resident pages (numPages "
                    "less the leading kUNUSED_PAGE_ENTRY entries) must be at most {} (maxPagesPerSequence)",
            kBUILD, index, numPages, released, numPages - released, most));
}

[[noreturn]] void throwNullPages(int32_t index, int64_t numPages)
{
    throw InvalidArgumentError(
        fmt::format("{}: sequences[{}].pages is null with numPages {}; it must point to {} page ids", kBUILD, index,
            numPages, numPages));
}

[[noreturn]] void throwNumTokens(
    int32_t index, int64_t numTokens, int64_t numPages, int64_t tokensPerPage, int64_t fewest, int64_t most)
{
    throw InvalidArgumentError(
        fmt::format("{}: sequences[{}].numTokens is {} with numPages {} and tokensPerPage {}; it "
                    "must be in [{}, {}]",
            kBUILD, index, numTokens, numPages, tokensPerPage, fewest, most));
}

//! Throws unless the sizes of `sequence` are valid, so that its page list can be read. The messages are made out of
//! line, which keeps this small enough to inline into the build's loop.
inline void checkSizes(PageTableShape const& shape, SequencePages const& sequence, int32_t index)
{
    int64_t const numPages = sequence.numPages;
    if (numPages < 0)
    {
        throwNumPages(index, numPages);
    }
    if (numPages > 0 && sequence.pages == nullptr)
    {
        throwNullPages(index, numPages);
    }
    int64_t const tokensPerPage = shape.tokensPerPage;
    int64_t const fewest = numPages == 0 ? 0 : (numPages - 1) * tokensPerPage + 1;
    int64_t const most = numPages * tokensPerPage;
    if (sequence.numTokens < fewest || sequence.numTokens > most)
    {
        throwNumTokens(index, sequence.numTokens, numPages, tokensPerPage, fewest, most);
    }
}

//! Throws unless the pages of `sequence` past its `released` leading entries fit a row of the table: a window's
//! released pages take no room, so a long windowed sequence fits a table as wide as the pages its window holds.
inline void checkResident(PageTableShape const& shape, SequencePages const& sequence, int32_t index, int64_t released)
{
    if (sequence.numPages - released > shape.maxPagesPerSequence)
    {
        throwResidentPages(index, sequence.numPages, released, shape.maxPagesPerSequence);
    }
}

//! Throws for the first negative id of `sequence` from its first resident page on (`released` entries lead it), or its
//! last entry when every entry was released; called once a check found one.
[[noreturn]] void throwNegativeId(SequencePages const& sequence, int32_t index, int64_t released)
{
    int64_t const numPages = sequence.numPages;
    int64_t entry = released == numPages ? numPages - 1 : released;
    while (sequence.pages[entry] >= 0)
    {
        ++entry;
    }
    throw InvalidArgumentError(fmt::format("{}: sequences[{}].pages[{}] is {}; page ids from the first resident page "
                                           "(entry {}) to the last (entry {}) must be >= 0 (only released pages "
                                           "before them may be kUNUSED_PAGE_ENTRY)",
        kBUILD, index, entry, sequence.pages[entry], std::min(released, numPages - 1), numPages - 1));
}

//! Returns the OR of `count` ids, negative when one is. Eight accumulators make it vectorisable at -O2 as well (GCC's
//! cheap cost model vectorises no single-accumulator reduction of unknown length).
int32_t orOfIds(int32_t const* ids, int64_t count) noexcept
{
    int32_t lanes[8] = {};
    int64_t j = 0;
    for (; j + 8 <= count; j += 8)
    {
        for (int32_t k = 0; k < 8; ++k)
        {
            lanes[k] |= ids[j + k];
        }
    }
    for (; j < count; ++j)
    {
        lanes[0] |= ids[j];
    }
    int32_t all = 0;
    for (int32_t const lane : lanes)
    {
        all |= lane;
    }
    return all;
}

//! Returns true when `count` ids at `held` are those at `ids` (none differs). The first pair is compared inline: a list
//! that differs almost always differs there, and the branch predicted past it keeps the load of `held` off the path
//! of the copy that follows (docs/benchmarks.md, "Page tables for kernels").
inline bool sameIds(int32_t const* ids, int64_t count, int32_t const* held) noexcept
{
    return count > 0 && ids[0] == held[0] && std::memcmp(ids, held, static_cast<size_t>(count) * sizeof(int32_t)) == 0;
}

//! Throws unless the entries of `sequence` from its first resident page on (after `released` leading entries) are
//! page ids and there is one; `ids` is their OR.
void checkIds(SequencePages const& sequence, int32_t index, int64_t released, int32_t ids)
{
    if (ids < 0 || (released > 0 && released == sequence.numPages))
    {
        throwNegativeId(sequence, index, released);
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

void writeEmptyPageTables(PageTableShape const& shape, int32_t* region) noexcept
{
    std::fill(region, region + shape.elements(), 0);
    int32_t* const table = region + shape.blockTableOffset();
    std::fill(table, table + shape.entries(), kUNUSED_PAGE_ENTRY);
}

void validateSequences(PageTableShape const& shape, SequencePages const* sequences, int32_t count)
{
    checkCount(shape, sequences, count);
    for (int32_t b = 0; b < count; ++b)
    {
        SequencePages const& sequence = sequences[b];
        checkSizes(shape, sequence, b);
        int64_t const released = releasedPages(sequence);
        checkResident(shape, sequence, b, released);
        checkIds(sequence, b, released, orOfIds(sequence.pages + released, sequence.numPages - released));
    }
}

int64_t buildPageTables(PageTableShape const& shape, SequencePages const* sequences, int32_t count, int32_t* region)
{
    checkCount(shape, sequences, count);
    int32_t* const indptr = region + shape.indptrOffset();
    int32_t* const lastPageLen = region + shape.lastPageLenOffset();
    int32_t* const firstToken = region + shape.firstTokenOffset();
    int32_t* const residentTokens = region + shape.residentTokensOffset();
    int32_t* const table = region + shape.blockTableOffset();
    int32_t* const indices = region + shape.indicesOffset();
    int64_t const width = shape.maxPagesPerSequence;
    int64_t const tokensPerPage = shape.tokensPerPage;
    // One pass: a sequence is checked as its row and its indices are written, so its list is read from memory once
    // and is still in the cache when its indices are compared and copied. indptr[b + 1] is this region's previous
    // build's until sequence b's turn, which reads it first: where row b's previous ids end.
    int64_t used = 0;
    int64_t heldEnd = indptr[0];
    // While every list so far repeats its row exactly, its indices are where and what they were (both arrays were
    // written from the same lists), and are neither compared nor copied.
    bool repeated = true;
    int64_t b = 0;
    try
    {
        for (; b < count; ++b)
        {
            SequencePages const& sequence = sequences[b];
            checkSizes(shape, sequence, static_cast<int32_t>(b));
            // Released pages are left out: rows start at the first resident page, and firstToken says which token
            // that is.
            int64_t const released = releasedPages(sequence);
            checkResident(shape, sequence, static_cast<int32_t>(b), released);
            int64_t const pages = sequence.numPages - released;
            int32_t* const row = table + b * width;
            int32_t const* const resident = sequence.pages + released;
            // The row's first `held` entries are ids a build checked. A decode step's list repeats those of two builds
            // before (this region's) but for new pages, so a row that starts with the list's pages is neither written
            // nor checked again there; comparing costs reads where writing costs stores, and a list that differs
            // differs at once, almost always.
            int64_t const heldStart = heldEnd;
            heldEnd = indptr[b + 1];
            int64_t const held = heldEnd - heldStart;
            int64_t const kept = sameIds(resident, std::min(pages, held), row) ? std::min(pages, held) : 0;
            std::copy_n(resident + kept, pages - kept, row + kept);
            checkIds(sequence, static_cast<int32_t>(b), released, orOfIds(resident + kept, pages - kept));
            // Padding over the rest of the old pages leaves the row whole without rewriting its unused tail.
            if (held > pages)
            {
                std::fill(row + pages, row + held, kUNUSED_PAGE_ENTRY);
            }
            // Indices from the list, not the row just written: indices sit a multiple of 4 KiB after the block table
            // at the usual sizes, and reading the row while storing there stalls on 4K aliasing. Rewritten only where
            // they differ, as the rows are.
            repeated = repeated && kept == pages && held == pages;
            if (!repeated && !sameIds(resident, pages, indices + used))
            {
                std::copy_n(resident, pages, indices + used);
            }
            used += pages;
            // At most maxBatchSize * maxPagesPerSequence, which makePageTableShape keeps within int32.
            indptr[b + 1] = static_cast<int32_t>(used);
            // numTokens is 0 with no pages, so the tokens past the full pages are 0 too.
            int64_t const firstResident = released * tokensPerPage;
            lastPageLen[b] =
                static_cast<int32_t>(sequence.numTokens - std::max<int64_t>(sequence.numPages - 1, 0) * tokensPerPage);
            // Both fit: numTokens is an int32 and firstResident is below it.
            firstToken[b] = static_cast<int32_t>(firstResident);
            residentTokens[b] = static_cast<int32_t>(sequence.numTokens - firstResident);
        }
    }
    catch (...)
    {
        // The sequences before the refused one are written, the rest are not: the tables of count 0 make the region
        // whole again, and the next build into it writes everything.
        writeEmptyPageTables(shape, region);
        throw;
    }
    // Rows from `count` on are empty now; only those that held pages before need padding (heldEnd is where row
    // `count`'s previous ids start, indptr past `count` still the previous build's).
    for (int64_t row = count; row < shape.maxBatchSize && heldEnd < indptr[shape.maxBatchSize]; ++row)
    {
        int64_t const heldStart = heldEnd;
        heldEnd = indptr[row + 1];
        std::fill(table + row * width, table + row * width + (heldEnd - heldStart), kUNUSED_PAGE_ENTRY);
    }
    std::fill(indptr + count + 1, indptr + shape.maxBatchSize + 1, static_cast<int32_t>(used));
    std::fill(lastPageLen + count, lastPageLen + shape.maxBatchSize, 0);
    std::fill(firstToken + count, firstToken + shape.maxBatchSize, 0);
    std::fill(residentTokens + count, residentTokens + shape.maxBatchSize, 0);
    return shape.indicesOffset() + used;
}

} // namespace detail

} // namespace kvcache::rt
