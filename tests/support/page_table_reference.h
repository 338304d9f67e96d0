#pragma once

// Page tables for the tests of PageTableBuffers (kvcache/paging/page_table.h): random batches, the tables the
// documentation defines for a batch (written from the batch alone), reading them back from a staging region, the host
// or the device, comparing them array by array, and builds the table building must refuse.

#include "paging/page_table/page_table_build.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/paging/page_table.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/cuda_raii.h"

namespace kvcache::test::page_tables
{

inline constexpr int32_t kINT32_MAX = std::numeric_limits<int32_t>::max();

//! Written over memory before the code under test writes it, so that a write that never happens cannot pass.
inline constexpr int kPOISON_BYTE = 0x5A;

//! The sizes of the tables under test.
struct Sizes
{
    int32_t maxBatchSize;
    int32_t maxPagesPerSequence;
    int32_t tokensPerPage;
};

//! A batch as a caller holds it: each sequence's page ids and tokens.
struct Batch
{
    std::vector<std::vector<int32_t>> pages;
    std::vector<int32_t> tokens;

    //! Returns the number of sequences.
    int32_t count() const
    {
        return static_cast<int32_t>(pages.size());
    }
    //! Returns the list build() takes (pointing into this batch).
    std::vector<rt::SequencePages> sequences() const
    {
        std::vector<rt::SequencePages> list;
        for (size_t b = 0; b < pages.size(); ++b)
        {
            list.push_back({pages[b].data(), static_cast<int32_t>(pages[b].size()), tokens[b]});
        }
        return list;
    }
    //! Returns every page id of the batch.
    std::vector<int32_t> allPages() const
    {
        std::vector<int32_t> all;
        for (std::vector<int32_t> const& sequence : pages)
        {
            all.insert(all.end(), sequence.begin(), sequence.end());
        }
        return all;
    }
};

//! Returns `count` sequences of distinct page ids drawn from [0, poolPages) (at least count * maxPagesPerSequence): a
//! quarter of them empty, a quarter full, the rest of any length, each of any number of tokens its pages can hold.
inline Batch randomBatch(std::mt19937_64& rng, Sizes const& sizes, int32_t count, int32_t poolPages)
{
    std::vector<int32_t> ids(static_cast<size_t>(poolPages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::uniform_int_distribution<int32_t> kind(0, 3);
    std::uniform_int_distribution<int32_t> length(0, sizes.maxPagesPerSequence);
    Batch batch;
    auto next = ids.begin();
    for (int32_t b = 0; b < count; ++b)
    {
        int32_t const which = kind(rng);
        int32_t const numPages = which == 0 ? 0 : which == 1 ? sizes.maxPagesPerSequence : length(rng);
        batch.pages.emplace_back(next, next + numPages);
        next += numPages;
        // A third of the sequences with pages lost some to a sliding window: their lists start with released entries.
        if (numPages > 1 && kind(rng) == 0)
        {
            int32_t const released = std::uniform_int_distribution<int32_t>(1, numPages - 1)(rng);
            std::fill_n(batch.pages.back().begin(), released, rt::kUNUSED_PAGE_ENTRY);
        }
        int64_t const fewest = numPages == 0 ? 0 : int64_t{numPages - 1} * sizes.tokensPerPage + 1;
        int64_t const most = int64_t{numPages} * sizes.tokensPerPage;
        batch.tokens.push_back(static_cast<int32_t>(std::uniform_int_distribution<int64_t>(fewest, most)(rng)));
    }
    return batch;
}

//! The six arrays of page tables, the CSR indices cut at indptr[maxBatchSize].
struct Tables
{
    std::vector<int32_t> indptr;
    std::vector<int32_t> indices;
    std::vector<int32_t> lastPageLen;
    std::vector<int32_t> blockTable;
    std::vector<int32_t> firstToken;
    std::vector<int32_t> residentTokens;
};

//! Returns the tables of `batch` as the documentation defines them, written from the batch alone: sequences past the
//! batch's count are empty, every row of the block table is padded with kUNUSED_PAGE_ENTRY.
inline Tables referenceTables(Batch const& batch, Sizes const& sizes)
{
    Tables tables;
    auto const rows = static_cast<size_t>(sizes.maxBatchSize);
    auto const width = static_cast<size_t>(sizes.maxPagesPerSequence);
    tables.blockTable.assign(rows * width, rt::kUNUSED_PAGE_ENTRY);
    tables.lastPageLen.assign(rows, 0);
    tables.firstToken.assign(rows, 0);
    tables.residentTokens.assign(rows, 0);
    tables.indptr.push_back(0);
    for (size_t b = 0; b < rows; ++b)
    {
        if (b < batch.pages.size())
        {
            // Released pages (leading kUNUSED_PAGE_ENTRY) are in neither table; the rows start after them.
            std::vector<int32_t> const& pages = batch.pages[b];
            auto const resident =
                std::find_if(pages.begin(), pages.end(), [](int32_t page) { return page != rt::kUNUSED_PAGE_ENTRY; });
            auto const released = static_cast<int32_t>(resident - pages.begin());
            tables.indices.insert(tables.indices.end(), resident, pages.end());
            std::copy(resident, pages.end(), tables.blockTable.begin() + static_cast<std::ptrdiff_t>(b * width));
            int32_t const tokens = batch.tokens[b];
            tables.lastPageLen[b] = tokens == 0 ? 0 : (tokens - 1) % sizes.tokensPerPage + 1;
            tables.firstToken[b] = released * sizes.tokensPerPage;
            tables.residentTokens[b] = tokens - released * sizes.tokensPerPage;
        }
        tables.indptr.push_back(static_cast<int32_t>(tables.indices.size()));
    }
    return tables;
}

//! Where the six arrays of some tables are (host or device).
struct TableViews
{
    int32_t const* indptr;
    int32_t const* indices;
    int32_t const* lastPageLen;
    int32_t const* blockTable;
    int32_t const* firstToken;
    int32_t const* residentTokens;
};

inline TableViews hostViews(rt::PageTableBuffers const& tables)
{
    return {tables.hostIndptr(), tables.hostIndices(), tables.hostLastPageLen(), tables.hostBlockTable(),
        tables.hostFirstToken(), tables.hostResidentTokens()};
}

inline TableViews deviceViews(rt::PageTableBuffers const& tables)
{
    return {tables.deviceIndptr(), tables.deviceIndices(), tables.deviceLastPageLen(), tables.deviceBlockTable(),
        tables.deviceFirstToken(), tables.deviceResidentTokens()};
}

inline TableViews regionViews(rt::detail::PageTableShape const& shape, std::vector<int32_t> const& region)
{
    int32_t const* const start = region.data();
    return {start + shape.indptrOffset(), start + shape.indicesOffset(), start + shape.lastPageLenOffset(),
        start + shape.blockTableOffset(), start + shape.firstTokenOffset(), start + shape.residentTokensOffset()};
}

//! Returns the number of CSR indices `indptr` ends with, kept within the room for them.
inline size_t indicesInUse(std::vector<int32_t> const& indptr, Sizes const& sizes)
{
    int64_t const room = int64_t{sizes.maxBatchSize} * sizes.maxPagesPerSequence;
    return static_cast<size_t>(std::clamp<int64_t>(indptr.back(), 0, room));
}

//! Returns the tables at host `views`.
inline Tables readTables(TableViews const& views, Sizes const& sizes)
{
    auto const rows = static_cast<size_t>(sizes.maxBatchSize);
    Tables tables;
    tables.indptr.assign(views.indptr, views.indptr + rows + 1);
    tables.indices.assign(views.indices, views.indices + indicesInUse(tables.indptr, sizes));
    tables.lastPageLen.assign(views.lastPageLen, views.lastPageLen + rows);
    tables.blockTable.assign(
        views.blockTable, views.blockTable + rows * static_cast<size_t>(sizes.maxPagesPerSequence));
    tables.firstToken.assign(views.firstToken, views.firstToken + rows);
    tables.residentTokens.assign(views.residentTokens, views.residentTokens + rows);
    return tables;
}

//! Returns `count` int32 values at `device` after the work queued on `stream`.
inline std::vector<int32_t> downloadInts(int32_t const* device, size_t count, cudaStream_t stream)
{
    std::vector<int32_t> values(count);
    if (count > 0)
    {
        std::vector<uint8_t> const bytes =
            kvcache::test::downloadBytes(device, static_cast<int64_t>(count * sizeof(int32_t)), stream);
        std::memcpy(values.data(), bytes.data(), bytes.size());
    }
    return values;
}

//! Returns the tables at device `views` after the work queued on `stream`.
inline Tables downloadTables(TableViews const& views, Sizes const& sizes, cudaStream_t stream)
{
    auto const rows = static_cast<size_t>(sizes.maxBatchSize);
    Tables tables;
    tables.indptr = downloadInts(views.indptr, rows + 1, stream);
    tables.indices = downloadInts(views.indices, indicesInUse(tables.indptr, sizes), stream);
    tables.lastPageLen = downloadInts(views.lastPageLen, rows, stream);
    tables.blockTable = downloadInts(views.blockTable, rows * static_cast<size_t>(sizes.maxPagesPerSequence), stream);
    tables.firstToken = downloadInts(views.firstToken, rows, stream);
    tables.residentTokens = downloadInts(views.residentTokens, rows, stream);
    return tables;
}

inline ::testing::AssertionResult sameArray(
    char const* name, std::vector<int32_t> const& expected, std::vector<int32_t> const& actual)
{
    if (expected.size() != actual.size())
    {
        return ::testing::AssertionFailure()
            << name << " holds " << actual.size() << " entries; " << expected.size() << " expected";
    }
    auto const [wanted, found] = std::mismatch(expected.begin(), expected.end(), actual.begin());
    if (wanted != expected.end())
    {
        return ::testing::AssertionFailure()
            << name << "[" << (wanted - expected.begin()) << "] is " << *found << "; " << *wanted << " expected";
    }
    return ::testing::AssertionSuccess();
}

//! Compares every array of `actual` with `expected`, naming the first entry that differs.
inline ::testing::AssertionResult sameTables(Tables const& expected, Tables const& actual)
{
    for (::testing::AssertionResult result :
        {sameArray("indptr", expected.indptr, actual.indptr), sameArray("indices", expected.indices, actual.indices),
            sameArray("lastPageLen", expected.lastPageLen, actual.lastPageLen),
            sameArray("blockTable", expected.blockTable, actual.blockTable),
            sameArray("firstToken", expected.firstToken, actual.firstToken),
            sameArray("residentTokens", expected.residentTokens, actual.residentTokens)})
    {
        if (!result)
        {
            return result;
        }
    }
    return ::testing::AssertionSuccess();
}

//! Returns the batch counts a sequence of builds runs through: none, the most, one, then random ones, so that tables
//! grow and shrink.
inline std::vector<int32_t> buildCounts(std::mt19937_64& rng, int32_t maxBatchSize, int32_t builds)
{
    std::vector<int32_t> counts = {0, maxBatchSize, 1, maxBatchSize, 0};
    std::uniform_int_distribution<int32_t> any(0, maxBatchSize);
    while (static_cast<int32_t>(counts.size()) < builds)
    {
        counts.push_back(any(rng));
    }
    return counts;
}

//! Page ids the bad builds below list.
inline constexpr int32_t kSOME_PAGES[] = {7, 8, 9, 10};

//! Page lists with a negative id where a page must be resident.
inline constexpr int32_t kHOLE_INSIDE[] = {7, rt::kUNUSED_PAGE_ENTRY, 9};

inline constexpr int32_t kRELEASED_THEN_HOLE[] = {rt::kUNUSED_PAGE_ENTRY, 8, rt::kUNUSED_PAGE_ENTRY};

inline constexpr int32_t kALL_RELEASED[] = {rt::kUNUSED_PAGE_ENTRY, rt::kUNUSED_PAGE_ENTRY};
//! Two released entries, then four pages: one resident page more than a row of kBAD_BUILD_SIZES holds.
inline constexpr int32_t kRELEASED_THEN_FOUR[] = {rt::kUNUSED_PAGE_ENTRY, rt::kUNUSED_PAGE_ENTRY, 7, 8, 9, 10};

inline constexpr int32_t kNEGATIVE_ID[] = {7, -7};

//! A build that must be refused, with what its message must name.
struct BadBuild
{
    std::vector<rt::SequencePages> sequences;
    int32_t count;
    std::vector<std::string> named;
    bool nullList = false;

    rt::SequencePages const* list() const
    {
        return nullList ? nullptr : sequences.data();
    }
};

//! The sizes the bad builds are made for.
inline constexpr Sizes kBAD_BUILD_SIZES{4, 3, 16};

//! Returns builds that tables of kBAD_BUILD_SIZES refuse: one of each rule, each after valid sequences where it can.
inline std::vector<BadBuild> badBuilds()
{
    rt::SequencePages const one{kSOME_PAGES, 1, 5};
    rt::SequencePages const two{kSOME_PAGES, 2, 20};
    return {
        {{one, one, one, one, one}, 5, {"build: count is 5", "[0, 4]", "maxBatchSize"}},
        {{one}, -1, {"build: count is -1", "[0, 4]"}},
        {{}, 2, {"build: sequences is null with count 2"}, true},
        {{one, {kSOME_PAGES, 4, 50}}, 2,
            {"build: sequences[1].numPages is 4 with 0 released", "4 resident pages", "at most 3",
                "maxPagesPerSequence"}},
        {{one, {kRELEASED_THEN_FOUR, 6, 90}}, 2,
            {"build: sequences[1].numPages is 6 with 2 released", "4 resident pages", "at most 3",
                "maxPagesPerSequence"}},
        {{one, two, {kSOME_PAGES, -1, 0}}, 3, {"sequences[2].numPages is -1", ">= 0"}},
        {{two, {nullptr, 2, 20}}, 2, {"sequences[1].pages is null with numPages 2"}},
        {{one, {kSOME_PAGES, 2, 16}}, 2,
            {"sequences[1].numTokens is 16 with numPages 2 and tokensPerPage 16", "[17, 32]"}},
        {{two, two, {kSOME_PAGES, 2, 33}}, 3, {"sequences[2].numTokens is 33", "[17, 32]"}},
        {{{kSOME_PAGES, 0, 1}}, 1, {"sequences[0].numTokens is 1 with numPages 0", "[0, 0]"}},
        {{one, {kSOME_PAGES, 1, 0}}, 2, {"sequences[1].numTokens is 0", "[1, 16]"}},
        {{{kSOME_PAGES, 3, kINT32_MAX}}, 1, {"numTokens is 2147483647", "[33, 48]"}},
        {{{kSOME_PAGES, 3, -5}}, 1, {"numTokens is -5", "[33, 48]"}},
        {{one, {kHOLE_INSIDE, 3, 40}}, 2, {"sequences[1].pages[1] is -1", "entry 0", "entry 2", ">= 0"}},
        {{{kRELEASED_THEN_HOLE, 3, 40}}, 1, {"sequences[0].pages[2] is -1", "entry 1", "entry 2"}},
        {{{kALL_RELEASED, 2, 20}}, 1, {"sequences[0].pages[1] is -1", "entry 1"}},
        {{{kNEGATIVE_ID, 2, 20}}, 1, {"sequences[0].pages[1] is -7", ">= 0"}},
    };
}

//! A valid batch of kBAD_BUILD_SIZES for the bad builds to leave in place.
inline Batch goodBatch()
{
    return {{{3, 1}, {}, {2, 0, 4}}, {17, 0, 48}};
}

} // namespace kvcache::test::page_tables
