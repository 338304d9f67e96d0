// The page table building (src/paging/page_table/page_table_build.h, no GPU) against a reference written from the
// documentation for random batches, in one region and in two alternating ones as the staging does, and the argument
// checks: a refused count leaves the region as it was, a refused sequence the tables of count 0 (sequences before it
// were written), and the next build is exact.
// The batches and reference tables are tests/support/page_table_reference.h.

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_table.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/error_matchers.h"
#include "support/page_table_reference.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::throwsNaming;
using namespace kvcache::test::page_tables;

TEST(PageTableBuildTest, RandomBatchesGiveTheReferenceTablesAsTheyGrowAndShrink)
{
    std::mt19937_64 rng(20240611);
    for (Sizes const sizes : {Sizes{1, 1, 1}, Sizes{16, 12, 16}, Sizes{7, 33, 5}, Sizes{40, 3, 128}})
    {
        SCOPED_TRACE("maxBatchSize " + std::to_string(sizes.maxBatchSize) + ", maxPagesPerSequence "
            + std::to_string(sizes.maxPagesPerSequence));
        rt::detail::PageTableShape const shape =
            rt::detail::makePageTableShape(sizes.maxBatchSize, sizes.maxPagesPerSequence, sizes.tokensPerPage);
        std::vector<int32_t> region(static_cast<size_t>(shape.elements()));
        std::memset(region.data(), kPOISON_BYTE, region.size() * sizeof(int32_t));
        rt::detail::writeEmptyPageTables(shape, region.data());
        ASSERT_TRUE(sameTables(referenceTables({}, sizes), readTables(regionViews(shape, region), sizes)));

        int32_t const poolPages = 2 * sizes.maxBatchSize * sizes.maxPagesPerSequence;
        for (int32_t const count : buildCounts(rng, sizes.maxBatchSize, 40))
        {
            SCOPED_TRACE("count " + std::to_string(count));
            Batch const batch = randomBatch(rng, sizes, count, poolPages);
            std::vector<rt::SequencePages> const sequences = batch.sequences();
            int64_t const elements = rt::detail::buildPageTables(shape, sequences.data(), count, region.data());
            Tables const expected = referenceTables(batch, sizes);
            ASSERT_TRUE(sameTables(expected, readTables(regionViews(shape, region), sizes)));
            EXPECT_EQ(elements, shape.indicesOffset() + static_cast<int64_t>(expected.indices.size()));
        }
    }
}

//! Returns a staging region of `shape`, poisoned and then written with the tables of count 0.
std::vector<int32_t> emptyRegion(rt::detail::PageTableShape const& shape)
{
    std::vector<int32_t> region(static_cast<size_t>(shape.elements()));
    std::memset(region.data(), kPOISON_BYTE, region.size() * sizeof(int32_t));
    rt::detail::writeEmptyPageTables(shape, region.data());
    return region;
}

TEST(PageTableBuildTest, AlternatingRegionsUploadWhatAFreshBuildWould)
{
    // PageTableBuffers alternates between two staging regions, each rewritten over what it held two builds before.
    std::mt19937_64 rng(99);
    for (Sizes const sizes : {Sizes{16, 12, 16}, Sizes{7, 33, 5}, Sizes{64, 8, 16}})
    {
        SCOPED_TRACE("maxBatchSize " + std::to_string(sizes.maxBatchSize));
        rt::detail::PageTableShape const shape =
            rt::detail::makePageTableShape(sizes.maxBatchSize, sizes.maxPagesPerSequence, sizes.tokensPerPage);
        std::vector<int32_t> regions[2] = {emptyRegion(shape), emptyRegion(shape)};
        int32_t const poolPages = 2 * sizes.maxBatchSize * sizes.maxPagesPerSequence;
        std::vector<int32_t> const counts = buildCounts(rng, sizes.maxBatchSize, 60);
        for (size_t build = 0; build < counts.size(); ++build)
        {
            SCOPED_TRACE("build " + std::to_string(build) + ", count " + std::to_string(counts[build]));
            Batch const batch = randomBatch(rng, sizes, counts[build], poolPages);
            std::vector<rt::SequencePages> const sequences = batch.sequences();
            std::vector<int32_t>& region = regions[build % 2];
            int64_t const elements = rt::detail::buildPageTables(shape, sequences.data(), batch.count(), region.data());
            ASSERT_TRUE(sameTables(referenceTables(batch, sizes), readTables(regionViews(shape, region), sizes)));
            // What the upload copies, padding between the arrays included, is what it would be from a fresh region.
            std::vector<int32_t> fresh = emptyRegion(shape);
            ASSERT_EQ(rt::detail::buildPageTables(shape, sequences.data(), batch.count(), fresh.data()), elements);
            ASSERT_TRUE(std::equal(region.begin(), region.begin() + elements, fresh.begin()));
        }
    }
}

TEST(PageTableBuildTest, ARefusedSequenceLeavesTheEmptyTablesAndTheNextBuildIsExact)
{
    // Sequences are checked as they are written; a sequence refused after others were written leaves the tables of
    // count 0, so that the region is whole and the next build into it (the next round's) is exact.
    std::mt19937_64 rng(4242);
    Sizes const sizes{24, 9, 4};
    rt::detail::PageTableShape const shape = rt::detail::makePageTableShape(24, 9, 4);
    std::vector<int32_t> region = emptyRegion(shape);
    int32_t const poolPages = 2 * sizes.maxBatchSize * sizes.maxPagesPerSequence;
    std::uniform_int_distribution<int32_t> anyCount(1, sizes.maxBatchSize);
    for (int32_t round = 0; round < 200; ++round)
    {
        SCOPED_TRACE("round " + std::to_string(round));
        Batch const batch = randomBatch(rng, sizes, anyCount(rng), poolPages);
        std::vector<rt::SequencePages> sequences = batch.sequences();
        if (round % 2 == 0)
        {
            rt::detail::buildPageTables(shape, sequences.data(), batch.count(), region.data());
            ASSERT_TRUE(sameTables(referenceTables(batch, sizes), readTables(regionViews(shape, region), sizes)));
            continue;
        }
        // One sequence made invalid by one of three rules; those before it are valid and are written first.
        int32_t const index = std::uniform_int_distribution<int32_t>(0, batch.count() - 1)(rng);
        rt::SequencePages& bad = sequences[static_cast<size_t>(index)];
        std::vector<int32_t> pages(bad.pages, bad.pages + bad.numPages);
        std::string const sequence = "sequences[" + std::to_string(index) + "]";
        std::string named;
        int32_t const rule = std::uniform_int_distribution<int32_t>(0, 2)(rng);
        if (rule == 2 && bad.numPages > 0)
        {
            // A negative id other than kUNUSED_PAGE_ENTRY is refused wherever it is.
            auto const entry = std::uniform_int_distribution<size_t>(0, pages.size() - 1)(rng);
            pages[entry] = -2 - static_cast<int32_t>(entry);
            bad.pages = pages.data();
            // The message names the first negative id after the leading released entries: this one or one before.
            auto const resident =
                std::find_if(pages.begin(), pages.end(), [](int32_t id) { return id != rt::kUNUSED_PAGE_ENTRY; });
            auto const hole = std::find_if(resident, pages.end(), [](int32_t id) { return id < 0; });
            named = ".pages[" + std::to_string(hole - pages.begin()) + "] is " + std::to_string(*hole);
        }
        else if (rule == 1)
        {
            // One resident page more than a row holds, after 0 to 2 released entries (which take no room).
            int32_t const released = std::uniform_int_distribution<int32_t>(0, 2)(rng);
            pages.assign(static_cast<size_t>(released), rt::kUNUSED_PAGE_ENTRY);
            for (int32_t k = 0; k <= sizes.maxPagesPerSequence; ++k)
            {
                pages.push_back(1000 + k);
            }
            bad.pages = pages.data();
            bad.numPages = static_cast<int32_t>(pages.size());
            bad.numTokens = bad.numPages * sizes.tokensPerPage;
            named = ".numPages is " + std::to_string(bad.numPages) + " with " + std::to_string(released) + " released";
        }
        else
        {
            bad.numTokens = bad.numPages * sizes.tokensPerPage + 1;
            named = ".numTokens is " + std::to_string(bad.numTokens);
        }
        std::vector<int32_t> const before = region;
        ASSERT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
            { rt::detail::buildPageTables(shape, sequences.data(), batch.count(), region.data()); },
            {sequence + named}));
        ASSERT_TRUE(region == emptyRegion(shape)) << "the refused build left other tables than those of count 0";
    }
}

//! Returns tokens for `numPages` pages: a random count its pages hold.
int32_t tokensFor(std::mt19937_64& rng, int32_t numPages, int32_t tokensPerPage)
{
    if (numPages == 0)
    {
        return 0;
    }
    return std::uniform_int_distribution<int32_t>((numPages - 1) * tokensPerPage + 1, numPages * tokensPerPage)(rng);
}

//! Returns `batch` a step later, sequence by sequence: as it was, a page more, one page replaced (as copy-on-write
//! does), a page fewer, its first resident page released, or a new list; fresh page ids come from `nextId`.
Batch evolve(std::mt19937_64& rng, Batch batch, Sizes const& sizes, int32_t& nextId)
{
    for (size_t b = 0; b < batch.pages.size(); ++b)
    {
        std::vector<int32_t>& pages = batch.pages[b];
        auto const resident = static_cast<int32_t>(
            std::find_if(pages.begin(), pages.end(), [](int32_t id) { return id >= 0; }) - pages.begin());
        int32_t const numPages = static_cast<int32_t>(pages.size());
        switch (std::uniform_int_distribution<int32_t>(0, 5)(rng))
        {
        case 1:
            if (numPages < sizes.maxPagesPerSequence)
            {
                pages.push_back(nextId++);
            }
            break;
        case 2:
            if (resident < numPages)
            {
                pages[static_cast<size_t>(std::uniform_int_distribution<int32_t>(resident, numPages - 1)(rng))] =
                    nextId++;
            }
            break;
        case 3:
            if (resident + 1 < numPages)
            {
                pages.pop_back();
            }
            break;
        case 4:
            if (resident + 1 < numPages)
            {
                pages[static_cast<size_t>(resident)] = rt::kUNUSED_PAGE_ENTRY;
            }
            break;
        case 5:
            pages.assign(
                static_cast<size_t>(std::uniform_int_distribution<int32_t>(0, sizes.maxPagesPerSequence)(rng)), 0);
            for (int32_t& id : pages)
            {
                id = nextId++;
            }
            break;
        default: break;
        }
        batch.tokens[b] = tokensFor(rng, static_cast<int32_t>(pages.size()), sizes.tokensPerPage);
    }
    return batch;
}

TEST(PageTableBuildTest, ListsThatRepeatTheRegionsRowsGiveTheReferenceTablesAndTheirNewEntriesAreChecked)
{
    // A row is rewritten only where its list differs from what the region holds, and the ids it held are not checked
    // again: a list that repeats them but for new, changed, fewer or released pages must still give exact tables, and
    // a bad id among its new entries (past the ids the row held, where the row held padding) must still be refused.
    std::mt19937_64 rng(777);
    Sizes const sizes{16, 12, 16};
    rt::detail::PageTableShape const shape = rt::detail::makePageTableShape(16, 12, 16);
    std::vector<int32_t> region = emptyRegion(shape);
    int32_t nextId = 0;
    Batch batch = randomBatch(rng, sizes, sizes.maxBatchSize, 4 * sizes.maxBatchSize * sizes.maxPagesPerSequence);
    nextId = 4 * sizes.maxBatchSize * sizes.maxPagesPerSequence;
    for (int32_t round = 0; round < 300; ++round)
    {
        SCOPED_TRACE("round " + std::to_string(round));
        batch = evolve(rng, batch, sizes, nextId);
        std::vector<rt::SequencePages> sequences = batch.sequences();
        int32_t const count = std::uniform_int_distribution<int32_t>(1, batch.count())(rng);
        if (round % 3 == 2)
        {
            // The next step's list of one sequence with a bad entry appended: a negative id, or kUNUSED_PAGE_ENTRY
            // where the row held padding.
            auto const index = std::uniform_int_distribution<int32_t>(0, count - 1)(rng);
            std::vector<int32_t> pages = batch.pages[static_cast<size_t>(index)];
            if (pages.empty() || static_cast<int32_t>(pages.size()) == sizes.maxPagesPerSequence)
            {
                continue;
            }
            int32_t const bad = round % 2 == 0 ? -5 : rt::kUNUSED_PAGE_ENTRY;
            pages.push_back(bad);
            sequences[static_cast<size_t>(index)].pages = pages.data();
            sequences[static_cast<size_t>(index)].numPages = static_cast<int32_t>(pages.size());
            sequences[static_cast<size_t>(index)].numTokens =
                tokensFor(rng, static_cast<int32_t>(pages.size()), sizes.tokensPerPage);
            std::string const named = "sequences[" + std::to_string(index) + "].pages["
                + std::to_string(pages.size() - 1) + "] is " + std::to_string(bad);
            ASSERT_TRUE(throwsNaming<rt::InvalidArgumentError>(
                [&] { rt::detail::buildPageTables(shape, sequences.data(), count, region.data()); }, {named}));
            ASSERT_TRUE(region == emptyRegion(shape)) << "the refused build left other tables than those of count 0";
            continue;
        }
        int64_t const elements = rt::detail::buildPageTables(shape, sequences.data(), count, region.data());
        Batch shown = batch;
        shown.pages.resize(static_cast<size_t>(count));
        shown.tokens.resize(static_cast<size_t>(count));
        ASSERT_TRUE(sameTables(referenceTables(shown, sizes), readTables(regionViews(shape, region), sizes)));
        std::vector<int32_t> fresh = emptyRegion(shape);
        ASSERT_EQ(rt::detail::buildPageTables(shape, sequences.data(), count, fresh.data()), elements);
        ASSERT_TRUE(std::equal(region.begin(), region.begin() + elements, fresh.begin()));
    }
}

TEST(PageTableBuildTest, TokensAtTheEdgesOfTheirPagesGiveFullAndOneTokenLastPages)
{
    Sizes const sizes{6, 3, 16};
    rt::detail::PageTableShape const shape = rt::detail::makePageTableShape(6, 3, 16);
    std::vector<int32_t> region(static_cast<size_t>(shape.elements()));
    rt::detail::writeEmptyPageTables(shape, region.data());
    Batch const batch{{{0}, {1}, {2, 3}, {4, 5}, {6, 7, 8}, {9, 10, 11}}, {1, 16, 17, 32, 33, 48}};
    std::vector<rt::SequencePages> const sequences = batch.sequences();
    rt::detail::buildPageTables(shape, sequences.data(), batch.count(), region.data());
    Tables const actual = readTables(regionViews(shape, region), sizes);
    EXPECT_EQ(actual.lastPageLen, (std::vector<int32_t>{1, 16, 1, 16, 1, 16}));
    EXPECT_TRUE(sameTables(referenceTables(batch, sizes), actual));
}

TEST(PageTableBuildTest, ReleasedPagesAreLeftOutAndFirstTokenSaysWhereEachRowStarts)
{
    Sizes const sizes{3, 4, 16};
    rt::detail::PageTableShape const shape = rt::detail::makePageTableShape(3, 4, 16);
    std::vector<int32_t> region(static_cast<size_t>(shape.elements()));
    rt::detail::writeEmptyPageTables(shape, region.data());
    int32_t const unused = rt::kUNUSED_PAGE_ENTRY;
    Batch const batch{{{unused, unused, 5, 6}, {7, 8}, {unused, 9}}, {50, 20, 17}};
    std::vector<rt::SequencePages> const sequences = batch.sequences();
    int64_t const elements = rt::detail::buildPageTables(shape, sequences.data(), batch.count(), region.data());
    Tables const actual = readTables(regionViews(shape, region), sizes);
    EXPECT_EQ(actual.indptr, (std::vector<int32_t>{0, 2, 4, 5}));
    EXPECT_EQ(actual.indices, (std::vector<int32_t>{5, 6, 7, 8, 9}));
    EXPECT_EQ(actual.lastPageLen, (std::vector<int32_t>{2, 4, 1}));
    EXPECT_EQ(actual.firstToken, (std::vector<int32_t>{32, 0, 16}));
    EXPECT_EQ(actual.residentTokens, (std::vector<int32_t>{18, 20, 1}));
    EXPECT_EQ(actual.blockTable,
        (std::vector<int32_t>{5, 6, unused, unused, 7, 8, unused, unused, 9, unused, unused, unused}));
    EXPECT_EQ(elements, shape.indicesOffset() + 5);
}

TEST(PageTableBuildTest, ALongWindowedSequenceFitsATableAsWideAsItsResidentPages)
{
    // Rows of 3 pages, as a window that holds 3 pages needs, for sequences far longer than 3 pages: only resident
    // pages count against the width. Each build is checked against the reference, and the first by hand.
    Sizes const sizes{4, 3, 16};
    rt::detail::PageTableShape const shape = rt::detail::makePageTableShape(4, 3, 16);
    std::vector<int32_t> regions[2] = {emptyRegion(shape), emptyRegion(shape)};
    int32_t const unused = rt::kUNUSED_PAGE_ENTRY;
    // Sequence 0 covers 43 pages, 40 released; sequence 1 covers 9, 7 released; sequence 2 is short and whole.
    Batch batch;
    batch.pages = {std::vector<int32_t>(40, unused), std::vector<int32_t>(7, unused), {20, 21, 22}};
    batch.pages[0].insert(batch.pages[0].end(), {30, 31, 32});
    batch.pages[1].insert(batch.pages[1].end(), {40, 41});
    batch.tokens = {43 * 16 - 5, 8 * 16 + 1, 3 * 16};
    {
        std::vector<rt::SequencePages> const sequences = batch.sequences();
        rt::detail::buildPageTables(shape, sequences.data(), batch.count(), regions[0].data());
        Tables const actual = readTables(regionViews(shape, regions[0]), sizes);
        EXPECT_EQ(actual.indptr, (std::vector<int32_t>{0, 3, 5, 8, 8}));
        EXPECT_EQ(actual.indices, (std::vector<int32_t>{30, 31, 32, 40, 41, 20, 21, 22}));
        EXPECT_EQ(actual.firstToken, (std::vector<int32_t>{640, 112, 0, 0}));
        EXPECT_EQ(actual.residentTokens, (std::vector<int32_t>{43 * 16 - 5 - 640, 8 * 16 + 1 - 112, 48, 0}));
        EXPECT_EQ(actual.lastPageLen, (std::vector<int32_t>{11, 1, 16, 0}));
        EXPECT_EQ(
            actual.blockTable, (std::vector<int32_t>{30, 31, 32, 40, 41, unused, 20, 21, 22, unused, unused, unused}));
        EXPECT_TRUE(sameTables(referenceTables(batch, sizes), actual));
    }
    // The window slides on: each build releases the first resident page of sequence 0 and takes a new one, in the
    // two regions in turn.
    for (int32_t build = 1; build <= 20; ++build)
    {
        std::vector<int32_t>& pages = batch.pages[0];
        pages[pages.size() - 3] = unused;
        pages.push_back(100 + build);
        batch.tokens[0] = static_cast<int32_t>(pages.size()) * 16 - build % 16;
        std::vector<rt::SequencePages> const sequences = batch.sequences();
        std::vector<int32_t>& region = regions[build % 2];
        rt::detail::buildPageTables(shape, sequences.data(), batch.count(), region.data());
        ASSERT_TRUE(sameTables(referenceTables(batch, sizes), readTables(regionViews(shape, region), sizes)))
            << "build " << build;
    }
}

TEST(PageTableBuildTest, ReleasedPagesCountsTheLeadingUnusedEntriesOfEveryLength)
{
    // Every list length and released prefix around the eight-entry steps the count takes, the entry after the prefix
    // a page id, another negative id, or a zero (whose bits an AND with the prefix's could hide): the count stops at
    // the first entry that is not kUNUSED_PAGE_ENTRY, as entry-by-entry counting does.
    for (int32_t const next : {7, -5, 0})
    {
        for (int32_t length = 0; length <= 26; ++length)
        {
            for (int32_t prefix = 0; prefix <= length; ++prefix)
            {
                std::vector<int32_t> pages(static_cast<size_t>(length) + 1, rt::kUNUSED_PAGE_ENTRY);
                std::iota(pages.begin() + prefix, pages.end(), 100);
                if (prefix < length)
                {
                    pages[static_cast<size_t>(prefix)] = next;
                }
                rt::SequencePages const sequence{pages.data(), length, 0};
                EXPECT_EQ(rt::detail::releasedPages(sequence), prefix)
                    << "length " << length << ", prefix " << prefix << ", next " << next;
            }
        }
    }
}

TEST(PageTableBuildTest, BadBuildsNameTheFieldAndLeaveWholeTables)
{
    rt::detail::PageTableShape const shape = rt::detail::makePageTableShape(
        kBAD_BUILD_SIZES.maxBatchSize, kBAD_BUILD_SIZES.maxPagesPerSequence, kBAD_BUILD_SIZES.tokensPerPage);
    std::vector<int32_t> region = emptyRegion(shape);
    Batch const good = goodBatch();
    std::vector<rt::SequencePages> const sequences = good.sequences();
    rt::detail::buildPageTables(shape, sequences.data(), good.count(), region.data());
    std::vector<int32_t> const before = region;
    for (BadBuild const& bad : badBuilds())
    {
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::detail::buildPageTables(shape, bad.list(), bad.count, region.data()); }, bad.named))
            << bad.named.front();
        // A bad count or a null list is refused before anything is written; a bad sequence leaves the tables of
        // count 0, after which the good batch builds its tables exactly again.
        std::string const& front = bad.named.front();
        bool const countRefused =
            front.find("build: count is") != std::string::npos || front.find("sequences is null") != std::string::npos;
        ASSERT_EQ(region, countRefused ? before : emptyRegion(shape))
            << "a refused build left the wrong tables: " << bad.named.front();
        rt::detail::buildPageTables(shape, sequences.data(), good.count(), region.data());
        ASSERT_EQ(region, before) << "the build after: " << bad.named.front();
        // validateSequences, the check alone, refuses the same builds with the same words.
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::detail::validateSequences(shape, bad.list(), bad.count); }, bad.named))
            << bad.named.front();
    }
    EXPECT_NO_THROW(rt::detail::validateSequences(shape, sequences.data(), good.count()));
}

} // namespace
