// PageTableBuffers, the device page tables attention kernels read. Without a GPU: the sizes checks, the table building
// (src/paging/page_table/page_table_build.h) against a reference written from the documentation for random batches, in
// one region and in two alternating ones as the staging does, and the argument checks: a refused count leaves the
// region as it was, a refused sequence the tables of count 0 (sequences before it were written), and the next build is
// exact. On a GPU: uploads at fixed addresses, the build after next waiting for an upload (the next need not), uploads
// on two streams landing in build order, failed builds, moves, destruction with an upload in flight, builds refused
// inside a capture, and a captured kernel that reads the block table replaying with the rebuilt tables.

#include "paging/page_table/page_table_build.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/paging/page_table.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/cuda_raii.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/page_op_reference.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::throwsNaming;

static_assert(
    std::is_nothrow_destructible_v<
        rt::PageTableBuffers> && std::is_nothrow_move_constructible_v<rt::PageTableBuffers> && std::is_nothrow_move_assignable_v<rt::PageTableBuffers>,
    "PageTableBuffers moves and dies without throwing");
static_assert(!std::is_copy_constructible_v<rt::PageTableBuffers> && !std::is_copy_assignable_v<rt::PageTableBuffers>,
    "PageTableBuffers is move-only");

constexpr int32_t kINT32_MAX = std::numeric_limits<int32_t>::max();
//! Written over memory before the code under test writes it, so that a write that never happens cannot pass.
constexpr int kPOISON_BYTE = 0x5A;

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
Batch randomBatch(std::mt19937_64& rng, Sizes const& sizes, int32_t count, int32_t poolPages)
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
Tables referenceTables(Batch const& batch, Sizes const& sizes)
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

TableViews hostViews(rt::PageTableBuffers const& tables)
{
    return {tables.hostIndptr(), tables.hostIndices(), tables.hostLastPageLen(), tables.hostBlockTable(),
        tables.hostFirstToken(), tables.hostResidentTokens()};
}

TableViews deviceViews(rt::PageTableBuffers const& tables)
{
    return {tables.deviceIndptr(), tables.deviceIndices(), tables.deviceLastPageLen(), tables.deviceBlockTable(),
        tables.deviceFirstToken(), tables.deviceResidentTokens()};
}

TableViews regionViews(rt::detail::PageTableShape const& shape, std::vector<int32_t> const& region)
{
    int32_t const* const start = region.data();
    return {start + shape.indptrOffset(), start + shape.indicesOffset(), start + shape.lastPageLenOffset(),
        start + shape.blockTableOffset(), start + shape.firstTokenOffset(), start + shape.residentTokensOffset()};
}

//! Returns the number of CSR indices `indptr` ends with, kept within the room for them.
size_t indicesInUse(std::vector<int32_t> const& indptr, Sizes const& sizes)
{
    int64_t const room = int64_t{sizes.maxBatchSize} * sizes.maxPagesPerSequence;
    return static_cast<size_t>(std::clamp<int64_t>(indptr.back(), 0, room));
}

//! Returns the tables at host `views`.
Tables readTables(TableViews const& views, Sizes const& sizes)
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
std::vector<int32_t> downloadInts(int32_t const* device, size_t count, cudaStream_t stream)
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
Tables downloadTables(TableViews const& views, Sizes const& sizes, cudaStream_t stream)
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

::testing::AssertionResult sameArray(
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
::testing::AssertionResult sameTables(Tables const& expected, Tables const& actual)
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
std::vector<int32_t> buildCounts(std::mt19937_64& rng, int32_t maxBatchSize, int32_t builds)
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
constexpr int32_t kSOME_PAGES[] = {7, 8, 9, 10};
//! Page lists with a negative id where a page must be resident.
constexpr int32_t kHOLE_INSIDE[] = {7, rt::kUNUSED_PAGE_ENTRY, 9};
constexpr int32_t kRELEASED_THEN_HOLE[] = {rt::kUNUSED_PAGE_ENTRY, 8, rt::kUNUSED_PAGE_ENTRY};
constexpr int32_t kALL_RELEASED[] = {rt::kUNUSED_PAGE_ENTRY, rt::kUNUSED_PAGE_ENTRY};
constexpr int32_t kNEGATIVE_ID[] = {7, -7};

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
constexpr Sizes kBAD_BUILD_SIZES{4, 3, 16};

//! Returns builds that tables of kBAD_BUILD_SIZES refuse: one of each rule, each after valid sequences where it can.
std::vector<BadBuild> badBuilds()
{
    rt::SequencePages const one{kSOME_PAGES, 1, 5};
    rt::SequencePages const two{kSOME_PAGES, 2, 20};
    return {
        {{one, one, one, one, one}, 5, {"build: count is 5", "[0, 4]", "maxBatchSize"}},
        {{one}, -1, {"build: count is -1", "[0, 4]"}},
        {{}, 2, {"build: sequences is null with count 2"}, true},
        {{one, {kSOME_PAGES, 4, 50}}, 2, {"build: sequences[1].numPages is 4", "[0, 3]", "maxPagesPerSequence"}},
        {{one, two, {kSOME_PAGES, -1, 0}}, 3, {"sequences[2].numPages is -1", "[0, 3]"}},
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
Batch goodBatch()
{
    return {{{3, 1}, {}, {2, 0, 4}}, {17, 0, 48}};
}

TEST(PageTableSizesTest, NonPositiveSizesAndOversizedTablesAreRefusedBeforeAnyCudaCall)
{
    struct Case
    {
        Sizes sizes;
        std::vector<std::string> named;
    };
    std::vector<Case> const cases = {
        {{0, 4, 16}, {"maxBatchSize is 0", "> 0"}},
        {{-3, 4, 16}, {"maxBatchSize is -3", "> 0"}},
        {{4, 0, 16}, {"maxPagesPerSequence is 0", "> 0"}},
        {{4, 4, 0}, {"tokensPerPage is 0", "> 0"}},
        {{4, 4, -16}, {"tokensPerPage is -16", "> 0"}},
        {{1 << 16, 1 << 15, 16}, {"maxBatchSize * maxPagesPerSequence is 2147483648", "65536 x 32768", "2147483647"}},
        {{kINT32_MAX, 2, 16}, {"is 4294967294", "2147483647"}},
    };
    for (Case const& c : cases)
    {
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] {
                rt::PageTableBuffers tables(
                    c.sizes.maxBatchSize, c.sizes.maxPagesPerSequence, c.sizes.tokensPerPage, nullptr);
            },
            c.named))
            << c.named.front();
    }
    // INT32_MAX entries are within the limit, and the region's offsets do not overflow.
    rt::detail::PageTableShape const largest = rt::detail::makePageTableShape(1, kINT32_MAX, 1);
    EXPECT_EQ(largest.entries(), kINT32_MAX);
    EXPECT_GE(largest.elements(), 2 * largest.entries());
}

TEST(PageTableSizesTest, ArraysStartOn128BytesAndDoNotOverlap)
{
    for (Sizes const sizes : {Sizes{1, 1, 1}, Sizes{7, 33, 5}, Sizes{256, 64, 16}, Sizes{31, 1, 128}})
    {
        rt::detail::PageTableShape const shape =
            rt::detail::makePageTableShape(sizes.maxBatchSize, sizes.maxPagesPerSequence, sizes.tokensPerPage);
        int64_t const rows = sizes.maxBatchSize;
        int64_t const entries = rows * sizes.maxPagesPerSequence;
        // Each array from its start to its end, in the region's order.
        std::vector<std::pair<int64_t, int64_t>> const arrays = {{shape.indptrOffset(), rows + 1},
            {shape.lastPageLenOffset(), rows}, {shape.firstTokenOffset(), rows}, {shape.residentTokensOffset(), rows},
            {shape.blockTableOffset(), entries}, {shape.indicesOffset(), entries}};
        int64_t end = 0;
        for (auto const& [offset, length] : arrays)
        {
            EXPECT_EQ(offset * 4 % 128, 0) << "an array at element " << offset;
            EXPECT_GE(offset, end) << "arrays overlap";
            end = offset + length;
        }
        EXPECT_GE(shape.elements(), end);
    }
}

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
            bad.numPages = sizes.maxPagesPerSequence + 1;
            named = ".numPages is " + std::to_string(bad.numPages);
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

TEST(PageTableBuffersTest, AnEmptyObjectOwnsNothingAndRefusesToBuild)
{
    rt::PageTableBuffers empty;
    EXPECT_EQ(empty.deviceIndptr(), nullptr);
    EXPECT_EQ(empty.deviceBlockTable(), nullptr);
    EXPECT_EQ(empty.hostIndices(), nullptr);
    EXPECT_EQ(empty.maxBatchSize(), 0);
    EXPECT_EQ(empty.count(), 0);
    EXPECT_EQ(empty.uploadBytes(), 0);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { empty.build(nullptr, 0, nullptr); }, {"build: this object owns no tables"}));
    rt::PageTableBuffers moved(std::move(empty));
    EXPECT_EQ(moved.hostIndptr(), nullptr);
}

//! Builds `batch` into `tables` on `stream`.
void build(rt::PageTableBuffers& tables, Batch const& batch, cudaStream_t stream)
{
    std::vector<rt::SequencePages> const sequences = batch.sequences();
    tables.build(sequences.data(), batch.count(), stream);
}

//! What a GPU test starts from: a stream, tables of `sizes` made on it, and a seeded generator of batches.
struct TablesUnderTest
{
    TablesUnderTest(Sizes const& tableSizes, uint64_t seed)
        : sizes(tableSizes)
        , tables(sizes.maxBatchSize, sizes.maxPagesPerSequence, sizes.tokensPerPage, stream.get())
        , rng(seed)
    {
    }

    //! Returns `count` random sequences whose pages are drawn from room for twice the table.
    Batch randomBatch(int32_t count)
    {
        return ::randomBatch(rng, sizes, count, 2 * sizes.maxBatchSize * sizes.maxPagesPerSequence);
    }
    //! Builds `batch` on the stream.
    void build(Batch const& batch)
    {
        ::build(tables, batch, stream.get());
    }
    //! Returns the device tables after the work queued on the stream.
    Tables device() const
    {
        return downloadTables(deviceViews(tables), sizes, stream.get());
    }
    //! Returns the staging tables.
    Tables host() const
    {
        return readTables(hostViews(tables), sizes);
    }

    Sizes sizes;
    kvcache::test::CudaStream stream;
    rt::PageTableBuffers tables;
    std::mt19937_64 rng;
};

//! Writes kPOISON_BYTE over every device array of `tables`, ordered on `stream`.
void poisonDevice(rt::PageTableBuffers const& tables, cudaStream_t stream)
{
    size_t const rows = static_cast<size_t>(tables.maxBatchSize());
    size_t const entries = rows * static_cast<size_t>(tables.maxPagesPerSequence());
    TableViews const views = deviceViews(tables);
    for (auto const& [array, count] : {std::pair{views.indptr, rows + 1}, std::pair{views.lastPageLen, rows},
             std::pair{views.blockTable, entries}, std::pair{views.indices, entries}})
    {
        KVCACHE_CUDA_TRY(cudaMemsetAsync(const_cast<int32_t*>(array), kPOISON_BYTE, count * sizeof(int32_t), stream));
    }
}

//! Holds `stream` for 100 ms (a host function), then sets `done`: work queued after it waits that long.
void holdStream(cudaStream_t stream, std::atomic<bool>& done)
{
    KVCACHE_CUDA_TRY(cudaLaunchHostFunc(
        stream,
        [](void* flag)
        {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            static_cast<std::atomic<bool>*>(flag)->store(true);
        },
        &done));
}

class PageTableGpuTest : public kvcache::test::GpuTest
{
};

TEST_F(PageTableGpuTest, UploadsGiveTheReferenceTablesAtAddressesThatNeverChange)
{
    TablesUnderTest tut({16, 12, 16}, 77);
    EXPECT_EQ(tut.tables.count(), 0);
    ASSERT_TRUE(sameTables(referenceTables({}, tut.sizes), tut.device())) << "the tables before the first build";

    TableViews const addresses = deviceViews(tut.tables);
    for (int32_t const* array : {addresses.lastPageLen, addresses.blockTable, addresses.indices})
    {
        EXPECT_EQ((array - addresses.indptr) * 4 % 128, 0);
    }
    for (int32_t const count : buildCounts(tut.rng, tut.sizes.maxBatchSize, 12))
    {
        SCOPED_TRACE("count " + std::to_string(count));
        Batch const batch = tut.randomBatch(count);
        poisonDevice(tut.tables, tut.stream.get());
        tut.build(batch);
        Tables const expected = referenceTables(batch, tut.sizes);
        ASSERT_TRUE(sameTables(expected, tut.device()));
        ASSERT_TRUE(sameTables(expected, tut.host()));
        EXPECT_EQ(tut.tables.count(), count);
        EXPECT_EQ(tut.tables.uploadBytes(),
            4 * ((addresses.indices - addresses.indptr) + static_cast<int64_t>(expected.indices.size())))
            << "the upload moves indptr, lastPageLen, the block table and the indices in use";
        TableViews const now = deviceViews(tut.tables);
        EXPECT_TRUE(now.indptr == addresses.indptr && now.indices == addresses.indices
            && now.lastPageLen == addresses.lastPageLen && now.blockTable == addresses.blockTable);
    }
}

//! Device arrays as large as `sizes`' tables, poisoned on `stream`, into which a copy of the device tables is queued.
struct TableSnapshot
{
    TableSnapshot(Sizes const& sizes, cudaStream_t stream)
        : rows(static_cast<size_t>(sizes.maxBatchSize))
        , entries(rows * static_cast<size_t>(sizes.maxPagesPerSequence))
        , indptr(rows + 1)
        , indices(entries)
        , lastPageLen(rows)
        , blockTable(entries)
        , firstToken(rows)
        , residentTokens(rows)
    {
        for (auto* array : {&indptr, &indices, &lastPageLen, &blockTable, &firstToken, &residentTokens})
        {
            array->fillBytes(kPOISON_BYTE, stream);
        }
    }
    //! Queues a copy of the device tables of `tables` on `stream`.
    void copy(rt::PageTableBuffers const& tables, cudaStream_t stream)
    {
        TableViews const device = deviceViews(tables);
        for (auto const& [from, to, count] : {std::tuple{device.indptr, &indptr, rows + 1},
                 std::tuple{device.indices, &indices, entries}, std::tuple{device.lastPageLen, &lastPageLen, rows},
                 std::tuple{device.blockTable, &blockTable, entries}, std::tuple{device.firstToken, &firstToken, rows},
                 std::tuple{device.residentTokens, &residentTokens, rows}})
        {
            KVCACHE_TEST_CUDA(
                cudaMemcpyAsync(to->get(), from, count * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream));
        }
    }
    //! Returns the snapshot's tables after the work queued on `stream`.
    Tables download(Sizes const& sizes, cudaStream_t stream) const
    {
        TableViews const views{
            indptr.get(), indices.get(), lastPageLen.get(), blockTable.get(), firstToken.get(), residentTokens.get()};
        return downloadTables(views, sizes, stream);
    }

    size_t rows;
    size_t entries;
    kvcache::test::DeviceArray<int32_t> indptr;
    kvcache::test::DeviceArray<int32_t> indices;
    kvcache::test::DeviceArray<int32_t> lastPageLen;
    kvcache::test::DeviceArray<int32_t> blockTable;
    kvcache::test::DeviceArray<int32_t> firstToken;
    kvcache::test::DeviceArray<int32_t> residentTokens;
};

TEST_F(PageTableGpuTest, TheBuildAfterNextWaitsForAnUploadAndCopiesBetweenBuildsSeeEachBuild)
{
    TablesUnderTest tut({8, 6, 16}, 5);
    Batch const first = tut.randomBatch(8);
    Batch const second = tut.randomBatch(5);
    Batch const third = tut.randomBatch(7);
    TableSnapshot afterFirst(tut.sizes, tut.stream.get());
    TableSnapshot afterSecond(tut.sizes, tut.stream.get());

    // The first upload queues behind a held stream, so it is still pending when the next builds start. The second
    // writes the other staging region and need not wait (100 ms is far more than a build takes); the third writes the
    // first's region again and must wait, or it would rewrite the staging under the first copy.
    std::atomic<bool> released{false};
    holdStream(tut.stream.get(), released);
    tut.build(first);
    afterFirst.copy(tut.tables, tut.stream.get());
    tut.build(second);
    EXPECT_FALSE(released.load()) << "the second build waited for the first upload";
    EXPECT_TRUE(sameTables(referenceTables(second, tut.sizes), tut.host())) << "the host copies before any upload ran";
    afterSecond.copy(tut.tables, tut.stream.get());
    tut.build(third);
    EXPECT_TRUE(released.load()) << "the third build returned before the first upload could have run";

    EXPECT_TRUE(sameTables(referenceTables(first, tut.sizes), afterFirst.download(tut.sizes, tut.stream.get())))
        << "the copy queued after the first build";
    EXPECT_TRUE(sameTables(referenceTables(second, tut.sizes), afterSecond.download(tut.sizes, tut.stream.get())))
        << "the copy queued after the second build";
    EXPECT_TRUE(sameTables(referenceTables(third, tut.sizes), tut.device()));
    EXPECT_TRUE(sameTables(referenceTables(third, tut.sizes), tut.host()));
}

TEST_F(PageTableGpuTest, AnUploadOnAnotherStreamLandsAfterTheLastOne)
{
    TablesUnderTest tut({6, 5, 16}, 17);
    kvcache::test::CudaStream other;
    Batch const first = tut.randomBatch(6);
    Batch const second = tut.randomBatch(4);
    // The first upload waits 100 ms behind a held stream; the second, on another stream, must land after it.
    std::atomic<bool> released{false};
    holdStream(tut.stream.get(), released);
    tut.build(first);
    build(tut.tables, second, other.get());
    tut.stream.synchronize();
    other.synchronize();
    EXPECT_TRUE(sameTables(referenceTables(second, tut.sizes), tut.device()))
        << "the first upload overwrote the second";
    // And back on the first stream, after an upload held up on the other.
    Batch const third = tut.randomBatch(5);
    Batch const fourth = tut.randomBatch(2);
    std::atomic<bool> releasedOther{false};
    holdStream(other.get(), releasedOther);
    build(tut.tables, third, other.get());
    tut.build(fourth);
    other.synchronize();
    tut.stream.synchronize();
    EXPECT_TRUE(sameTables(referenceTables(fourth, tut.sizes), tut.device()))
        << "the third upload overwrote the fourth";
}

TEST_F(PageTableGpuTest, ARefusedBuildLeavesTheHostAndDeviceTablesAsTheyWere)
{
    TablesUnderTest tut(kBAD_BUILD_SIZES, 0);
    Batch const good = goodBatch();
    tut.build(good);
    Tables const expected = referenceTables(good, tut.sizes);
    for (BadBuild const& bad : badBuilds())
    {
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { tut.tables.build(bad.list(), bad.count, tut.stream.get()); }, bad.named))
            << bad.named.front();
        ASSERT_TRUE(sameTables(expected, tut.host())) << bad.named.front();
        ASSERT_TRUE(sameTables(expected, tut.device())) << bad.named.front();
        EXPECT_EQ(tut.tables.count(), good.count());
    }
}

TEST_F(PageTableGpuTest, ABuildOnACapturingStreamIsRefused)
{
    TablesUnderTest tut({2, 2, 16}, 0);
    Batch const batch{{{4, 2}}, {20}};
    KVCACHE_TEST_CUDA(cudaStreamBeginCapture(tut.stream.get(), cudaStreamCaptureModeThreadLocal));
    bool const refused =
        throwsNaming<rt::InvalidArgumentError>([&] { tut.build(batch); }, {"build: stream is capturing a CUDA graph"});
    cudaGraph_t graph = nullptr;
    KVCACHE_TEST_CUDA(cudaStreamEndCapture(tut.stream.get(), &graph));
    if (graph != nullptr)
    {
        KVCACHE_TEST_CUDA(cudaGraphDestroy(graph));
    }
    EXPECT_TRUE(refused);
    EXPECT_TRUE(sameTables(referenceTables({}, tut.sizes), tut.device())) << "the refused build uploaded";

    tut.build(batch);
    EXPECT_TRUE(sameTables(referenceTables(batch, tut.sizes), tut.device()));
}

TEST_F(PageTableGpuTest, MovesHandOverTheSameDeviceTables)
{
    TablesUnderTest tut({3, 4, 8}, 31);
    Batch const first = tut.randomBatch(3);
    tut.build(first);
    TableViews const addresses = deviceViews(tut.tables);

    rt::PageTableBuffers moved(std::move(tut.tables));
    EXPECT_EQ(tut.tables.deviceIndptr(), nullptr);
    EXPECT_EQ(tut.tables.hostBlockTable(), nullptr);
    EXPECT_EQ(tut.tables.count(), 0);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { tut.build(first); }, {"owns no tables"}));
    EXPECT_EQ(moved.deviceBlockTable(), addresses.blockTable);
    EXPECT_EQ(moved.count(), 3);

    rt::PageTableBuffers target(1, 1, 1, tut.stream.get());
    target = std::move(moved);
    EXPECT_EQ(target.deviceIndices(), addresses.indices);
    EXPECT_EQ(target.maxPagesPerSequence(), tut.sizes.maxPagesPerSequence);
    EXPECT_TRUE(sameTables(referenceTables(first, tut.sizes), downloadTables(addresses, tut.sizes, tut.stream.get())));
    Batch const second = tut.randomBatch(2);
    build(target, second, tut.stream.get());
    EXPECT_TRUE(sameTables(referenceTables(second, tut.sizes), downloadTables(addresses, tut.sizes, tut.stream.get())));

    // A self-move gives the tables up rather than keeping half a state.
    rt::PageTableBuffers& alias = target;
    target = std::move(alias);
    EXPECT_EQ(target.deviceIndptr(), nullptr);
}

TEST_F(PageTableGpuTest, DestroyingTheTablesWaitsForTheirUploadInFlight)
{
    kvcache::test::CudaStream stream;
    std::atomic<bool> released{false};
    {
        rt::PageTableBuffers tables(4, 4, 16, stream.get());
        holdStream(stream.get(), released);
        build(tables, Batch{{{1, 2, 3}, {4}}, {40, 16}}, stream.get());
    }
    EXPECT_TRUE(released.load()) << "the destructor freed the staging before the upload reading it had run";
    stream.synchronize();
}

TEST_F(PageTableGpuTest, ACapturedKernelReadingTheBlockTableReplaysWithTheRebuiltTables)
{
    kvcache::test::CacheUnderTest cut(kvcache::test::smallConfig(), 29);
    std::mt19937_64 rng(29);
    constexpr uint32_t kPATTERN = 0xC0FFEE11U;
    Sizes const sizes{4, 8, cut.cache().tokensPerPage()};
    rt::PageTableBuffers tables(sizes.maxBatchSize, sizes.maxPagesPerSequence, sizes.tokensPerPage, cut.stream());
    Batch batch = randomBatch(rng, sizes, 4, cut.numPages());
    build(tables, batch, cut.stream());

    // resetPagesDevice reads its page list from device memory: here the whole block table, padding skipped.
    kvcache::test::CapturedGraph graph(cut.stream(),
        [&]
        {
            rt::resetPagesDevice(cut.cache(), tables.deviceBlockTable(), sizes.maxBatchSize * sizes.maxPagesPerSequence,
                nullptr, cut.stream(), kPATTERN);
        });
    ASSERT_TRUE(cut.matchesReference()) << "capturing ran something";
    for (int32_t const count : {4, 2, 3, 0})
    {
        SCOPED_TRACE("count " + std::to_string(count));
        if (count != 4)
        {
            cut.refill();
            batch = randomBatch(rng, sizes, count, cut.numPages());
            build(tables, batch, cut.stream());
        }
        graph.launch(cut.stream());
        cut.reference().reset(batch.allPages(), kPATTERN);
        ASSERT_TRUE(cut.matchesReference()) << "the replay reset other pages than the rebuilt table lists";
    }
}

} // namespace
