// Host tests of the page allocator of one page group (kvcache/paging/page_allocator.h): every operation against an
// independent reference model (a std::map of reference counts and a std::vector stack of free ids), every rejection
// for its type, its message (field, value, limit) and a full state left as it was (free count, every reference
// count and the order of the ids the next allocations return), the all-or-nothing list calls, LIFO order, the size
// bounds, and a randomised run of 1,000,000 operations, invalid ones included, against the model.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/paging/page_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/error_matchers.h"

namespace kvcache::rt
{
namespace
{

using test::throwsNaming;

constexpr int32_t kINT32_MIN = std::numeric_limits<int32_t>::min();
constexpr int32_t kINT32_MAX = std::numeric_limits<int32_t>::max();
//! A value no allocation writes: an output entry still holding it was never written.
constexpr int32_t kPOISON = -777;

//! Everything an allocator's caller can observe.
struct State
{
    int32_t numPages = 0;
    int32_t numFree = 0;
    int32_t numUsed = 0;
    //! refCount of every id, [0, numPages).
    std::vector<int32_t> refCounts;
    //! The ids that allocating every free page one at a time would return, in order.
    std::vector<int32_t> nextAllocations;

    bool operator==(State const& other) const
    {
        return numPages == other.numPages && numFree == other.numFree && numUsed == other.numUsed
            && refCounts == other.refCounts && nextAllocations == other.nextAllocations;
    }
};

//! Returns the observable state of `allocator`; the next allocations are drawn from a copy, which leaves it as it was.
State stateOf(PageAllocator const& allocator)
{
    State state{allocator.numPages(), allocator.numFree(), allocator.numUsed(), {}, {}};
    for (int32_t page = 0; page < allocator.numPages(); ++page)
    {
        state.refCounts.push_back(allocator.refCount(page));
    }
    PageAllocator drained = allocator;
    while (drained.numFree() > 0)
    {
        state.nextAllocations.push_back(drained.allocate());
    }
    return state;
}

//! The reference: written from the contract, not from the allocator. Used pages in a map, free pages on a stack.
class Model
{
public:
    explicit Model(int32_t numPages)
        : mNumPages(numPages)
    {
        for (int32_t page = numPages - 1; page >= 0; --page)
        {
            mFree.push_back(page);
        }
    }

    //! The expected result of a call: the error's type, or none.
    enum class Outcome
    {
        kOK,
        kOUT_OF_RANGE,
        kINVALID,
        kOUT_OF_MEMORY,
    };

    int32_t numFree() const
    {
        return static_cast<int32_t>(mFree.size());
    }

    //! Returns the outcome of allocating `count` pages into a list that is null or not; appends the ids on success.
    Outcome allocate(int32_t count, bool nullList, std::vector<int32_t>& pages)
    {
        if (count < 0 || (nullList && count > 0))
        {
            return Outcome::kINVALID;
        }
        if (count > numFree())
        {
            return Outcome::kOUT_OF_MEMORY;
        }
        for (int32_t i = 0; i < count; ++i)
        {
            pages.push_back(mFree.back());
            mUsed[mFree.back()] = 1;
            mFree.pop_back();
        }
        return Outcome::kOK;
    }

    Outcome retain(int32_t page)
    {
        Outcome const outcome = check(page, 1);
        if (outcome == Outcome::kOK)
        {
            ++mUsed[page];
        }
        return outcome;
    }

    //! Returns the outcome of releasing `pages` in order, all or nothing: checked in full before any change.
    Outcome release(std::vector<int32_t> const& pages)
    {
        std::map<int32_t, int32_t> times;
        for (int32_t const page : pages)
        {
            Outcome const outcome = check(page, ++times[page]);
            if (outcome != Outcome::kOK)
            {
                return outcome;
            }
        }
        for (int32_t const page : pages)
        {
            if (--mUsed[page] == 0)
            {
                mUsed.erase(page);
                mFree.push_back(page);
            }
        }
        return Outcome::kOK;
    }

    State state() const
    {
        State state{mNumPages, numFree(), mNumPages - numFree(), std::vector<int32_t>(static_cast<size_t>(mNumPages)),
            std::vector<int32_t>(mFree.rbegin(), mFree.rend())};
        for (auto const& [page, count] : mUsed)
        {
            state.refCounts[static_cast<size_t>(page)] = count;
        }
        return state;
    }

    //! Returns whether `page` is in use (false for any other id).
    bool used(int32_t page) const
    {
        return mUsed.count(page) != 0;
    }

    //! Returns every page in use with its reference count, ascending.
    std::vector<std::pair<int32_t, int32_t>> usedPages() const
    {
        return {mUsed.begin(), mUsed.end()};
    }

private:
    //! Returns the outcome of touching `page` as its `times`-th release (or a retain, times = 1).
    Outcome check(int32_t page, int32_t times) const
    {
        if (page < 0 || page >= mNumPages)
        {
            return Outcome::kOUT_OF_RANGE;
        }
        auto const found = mUsed.find(page);
        return found == mUsed.end() || found->second < times ? Outcome::kINVALID : Outcome::kOK;
    }

    int32_t mNumPages;
    std::map<int32_t, int32_t> mUsed;
    std::vector<int32_t> mFree;
};

using Outcome = Model::Outcome;

//! Runs `call` and returns the type of the error it threw, or kOK.
template <typename Call>
Outcome outcomeOf(Call&& call)
{
    try
    {
        call();
    }
    catch (OutOfRangeError const&)
    {
        return Outcome::kOUT_OF_RANGE;
    }
    catch (OutOfMemoryError const&)
    {
        return Outcome::kOUT_OF_MEMORY;
    }
    catch (InvalidArgumentError const&)
    {
        return Outcome::kINVALID;
    }
    return Outcome::kOK;
}

//! Checks that `call` throws `ExpectedError` naming `words` and leaves the full state of `allocator` as it was.
template <typename ExpectedError, typename Call>
void expectRejected(PageAllocator& allocator, Call&& call, std::vector<std::string> const& words)
{
    State const before = stateOf(allocator);
    EXPECT_TRUE(throwsNaming<ExpectedError>(call, words));
    EXPECT_EQ(stateOf(allocator), before);
    EXPECT_NO_THROW(allocator.checkInvariants());
}

//! Returns the ids of `count` single allocations.
std::vector<int32_t> allocateEach(PageAllocator& allocator, int32_t count)
{
    std::vector<int32_t> pages;
    for (int32_t i = 0; i < count; ++i)
    {
        pages.push_back(allocator.allocate());
    }
    return pages;
}

std::vector<int32_t> iota(int32_t first, int32_t count)
{
    std::vector<int32_t> ids(static_cast<size_t>(count));
    std::iota(ids.begin(), ids.end(), first);
    return ids;
}

void releaseList(PageAllocator& allocator, std::vector<int32_t> const& pages)
{
    allocator.release(pages.data(), static_cast<int32_t>(pages.size()));
}

TEST(PageAllocator, EmptyAllocatorsHaveNoPagesAndRejectEveryId)
{
    PageAllocator defaulted;
    PageAllocator zero(0);
    for (PageAllocator* allocator : {&defaulted, &zero})
    {
        EXPECT_EQ(allocator->numPages(), 0);
        EXPECT_EQ(allocator->numFree(), 0);
        EXPECT_EQ(allocator->numUsed(), 0);
        EXPECT_NO_THROW(allocator->checkInvariants());
        expectRejected<OutOfMemoryError>(*allocator, [&] { allocator->allocate(); }, {"1 needed", "0 free of 0"});
        expectRejected<OutOfRangeError>(*allocator, [&] { allocator->retain(0); }, {"page 0", "[0, 0)"});
        expectRejected<OutOfRangeError>(*allocator, [&] { allocator->release(0); }, {"page 0", "[0, 0)"});
        expectRejected<OutOfRangeError>(*allocator, [&] { allocator->refCount(0); }, {"page 0", "[0, 0)"});
        allocator->allocate(0, nullptr);
        allocator->release(nullptr, 0);
        EXPECT_EQ(stateOf(*allocator), Model(0).state());
    }
}

TEST(PageAllocator, ConstructorRejectsCountsOutsideTheBound)
{
    std::string const limit = "[0, " + std::to_string(kMAX_NUM_PAGES) + "]";
    for (int32_t const numPages : {-1, kINT32_MIN, kMAX_NUM_PAGES + 1, kINT32_MAX})
    {
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&] { PageAllocator{numPages}; }, {"numPages is " + std::to_string(numPages), limit, "kMAX_NUM_PAGES"}));
    }
}

TEST(PageAllocator, ModerateAllocatorStartsAllFreeInAscendingOrder)
{
    constexpr int32_t kPAGES = 1 << 20;
    PageAllocator allocator(kPAGES);
    EXPECT_EQ(allocator.numPages(), kPAGES);
    EXPECT_EQ(allocator.numFree(), kPAGES);
    EXPECT_EQ(allocator.numUsed(), 0);
    allocator.checkInvariants();
    EXPECT_EQ(stateOf(allocator), Model(kPAGES).state());
    EXPECT_EQ(allocateEach(allocator, 3), iota(0, 3));
    EXPECT_EQ(allocator.refCount(kPAGES - 1), 0);
    expectRejected<OutOfRangeError>(allocator, [&] { allocator.refCount(kPAGES); }, {"page 1048576", "[0, 1048576)"});
}

TEST(PageAllocator, FreedPagesComeBackMostRecentFirst)
{
    PageAllocator allocator(16);
    EXPECT_EQ(allocateEach(allocator, 10), iota(0, 10));
    allocator.release(3);
    allocator.release(7);
    allocator.release(5);
    EXPECT_EQ(allocateEach(allocator, 4), (std::vector<int32_t>{5, 7, 3, 10}));
    releaseList(allocator, {2, 8, 4});
    std::vector<int32_t> pages(3, kPOISON);
    allocator.allocate(3, pages.data());
    EXPECT_EQ(pages, (std::vector<int32_t>{4, 8, 2}));
    allocator.checkInvariants();
}

TEST(PageAllocator, AllocatingManyReturnsWhatSingleAllocationsWould)
{
    PageAllocator allocator(64);
    allocateEach(allocator, 40);
    releaseList(allocator, {17, 3, 39, 22, 0});
    PageAllocator singles = allocator;
    std::vector<int32_t> pages(29, kPOISON);
    allocator.allocate(29, pages.data());
    EXPECT_EQ(allocator.numFree(), 0);
    EXPECT_EQ(pages, allocateEach(singles, 29));
    EXPECT_EQ(stateOf(allocator), stateOf(singles));
    for (int32_t const page : pages)
    {
        EXPECT_EQ(allocator.refCount(page), 1);
    }
    allocator.checkInvariants();
}

TEST(PageAllocator, AllocationFailuresChangeNothing)
{
    PageAllocator allocator(8);
    allocateEach(allocator, 5);
    std::vector<int32_t> pages(8, kPOISON);
    expectRejected<OutOfMemoryError>(
        allocator, [&] { allocator.allocate(4, pages.data()); }, {"4 needed", "3 free of 8 pages", "nothing"});
    EXPECT_EQ(pages, std::vector<int32_t>(8, kPOISON));
    expectRejected<InvalidArgumentError>(
        allocator, [&] { allocator.allocate(-1, pages.data()); }, {"count is -1", ">= 0"});
    expectRejected<InvalidArgumentError>(
        allocator, [&] { allocator.allocate(kINT32_MIN, nullptr); }, {"count is -2147483648", ">= 0"});
    expectRejected<InvalidArgumentError>(allocator, [&] { allocator.allocate(2, nullptr); }, {"null", "count is 2"});
    EXPECT_EQ(pages, std::vector<int32_t>(8, kPOISON));
    allocator.allocate(0, nullptr);
    allocator.allocate(3, pages.data());
    EXPECT_EQ(allocator.numFree(), 0);
    expectRejected<OutOfMemoryError>(allocator, [&] { allocator.allocate(); }, {"1 needed", "0 free of 8 pages"});
    expectRejected<OutOfMemoryError>(
        allocator, [&] { allocator.allocate(1, pages.data()); }, {"1 needed", "0 free of 8 pages"});
}

TEST(PageAllocator, RetainAndReleaseCountSharers)
{
    PageAllocator allocator(4);
    int32_t const page = allocator.allocate();
    allocator.retain(page);
    allocator.retain(page);
    EXPECT_EQ(allocator.refCount(page), 3);
    EXPECT_EQ(allocator.numUsed(), 1);
    allocator.release(page);
    allocator.release(page);
    EXPECT_EQ(allocator.refCount(page), 1);
    EXPECT_EQ(allocator.numFree(), 3);
    allocator.release(page);
    EXPECT_EQ(allocator.refCount(page), 0);
    EXPECT_EQ(allocator.numFree(), 4);
    EXPECT_EQ(allocator.allocate(), page);
    allocator.checkInvariants();
}

TEST(PageAllocator, RetainRejectsIdsOutOfRangeAndFreePages)
{
    PageAllocator allocator(8);
    allocateEach(allocator, 3);
    allocator.retain(1);
    for (int32_t const page : {-1, 8, kINT32_MIN, kINT32_MAX})
    {
        expectRejected<OutOfRangeError>(
            allocator, [&] { allocator.retain(page); }, {"retain", "page " + std::to_string(page), "[0, 8)"});
    }
    expectRejected<InvalidArgumentError>(allocator, [&] { allocator.retain(5); }, {"retain", "page 5", "free"});
}

TEST(PageAllocator, ReleaseRejectsIdsOutOfRangeAndDoubleFrees)
{
    PageAllocator allocator(8);
    allocateEach(allocator, 3);
    for (int32_t const page : {-1, 8, kINT32_MIN, kINT32_MAX})
    {
        expectRejected<OutOfRangeError>(
            allocator, [&] { allocator.release(page); }, {"release", "page " + std::to_string(page), "[0, 8)"});
    }
    allocator.release(2);
    expectRejected<InvalidArgumentError>(
        allocator, [&] { allocator.release(2); }, {"page 2", "free", "double free", "count >= 1"});
    expectRejected<InvalidArgumentError>(allocator, [&] { allocator.release(6); }, {"page 6", "double free"});
}

TEST(PageAllocator, ReleasingAListIsAllOrNothing)
{
    PageAllocator allocator(10);
    allocateEach(allocator, 8);
    allocator.retain(4);
    releaseList(allocator, {6});
    // Every rejected list first releases pages that reach count 0: the undo must take them off the free list again.
    expectRejected<OutOfRangeError>(allocator,
        [&] {
            releaseList(allocator, {0, 1, 4, 10});
        },
        {"pages[3]", "page 10", "[0, 10)", "nothing"});
    expectRejected<OutOfRangeError>(allocator, [&] { releaseList(allocator, {2, -3}); }, {"pages[1]", "page -3"});
    expectRejected<InvalidArgumentError>(allocator,
        [&] {
            releaseList(allocator, {0, 3, 6, 1});
        },
        {"pages[2]", "page 6", "double free", "nothing"});
    expectRejected<InvalidArgumentError>(allocator,
        [&] {
            releaseList(allocator, {0, 4, 3, 4, 4});
        },
        {"pages[4]", "page 4", "listed 3 times", "reference count is 2", "nothing"});
    expectRejected<InvalidArgumentError>(allocator,
        [&] {
            releaseList(allocator, {5, 5});
        },
        {"pages[1]", "page 5", "listed 2 times", "count is 1"});
    std::vector<int32_t> const pages = {1, 2};
    expectRejected<InvalidArgumentError>(
        allocator, [&] { allocator.release(pages.data(), -2); }, {"count is -2", ">= 0"});
    expectRejected<InvalidArgumentError>(allocator, [&] { allocator.release(nullptr, 3); }, {"null", "count is 3"});

    // A page listed as many times as its count is freed, once.
    Model model(10);
    std::vector<int32_t> ignored;
    model.allocate(8, false, ignored);
    model.retain(4);
    model.release({6});
    ASSERT_EQ(stateOf(allocator), model.state());
    releaseList(allocator, {4, 0, 4, 7});
    ASSERT_EQ(model.release({4, 0, 4, 7}), Outcome::kOK);
    EXPECT_EQ(stateOf(allocator), model.state());
    allocator.checkInvariants();
}

TEST(PageAllocator, CopiesAreIndependentAndMovesLeaveNoPages)
{
    PageAllocator original(6);
    allocateEach(original, 4);
    original.retain(2);
    State const state = stateOf(original);

    PageAllocator copy = original;
    copy.release(2);
    copy.release(2);
    EXPECT_EQ(stateOf(original), state);
    copy = original;
    EXPECT_EQ(stateOf(copy), state);

    PageAllocator moved = std::move(copy);
    EXPECT_EQ(stateOf(moved), state);
    EXPECT_EQ(stateOf(copy), Model(0).state()); // NOLINT(bugprone-use-after-move): a moved-from one has no pages
    copy.checkInvariants();
    PageAllocator assigned(3);
    assigned = std::move(moved);
    EXPECT_EQ(stateOf(assigned), state);
    EXPECT_EQ(stateOf(moved), Model(0).state()); // NOLINT(bugprone-use-after-move)
    moved.checkInvariants();
    PageAllocator& alias = assigned;
    assigned = std::move(alias);
    EXPECT_EQ(stateOf(assigned), state);
}

//! One random id: mostly a page the model has in use (when `wantUsed`), sometimes any id in range, rarely out of it.
int32_t pickPage(std::mt19937_64& rng, Model const& model, int32_t numPages, bool wantUsed)
{
    uint64_t const roll = rng() % 64;
    if (roll == 0)
    {
        return rng() % 2 == 0 ? numPages + static_cast<int32_t>(rng() % 3) : -1 - static_cast<int32_t>(rng() % 3);
    }
    if (numPages == 0)
    {
        return 0;
    }
    int32_t page = 0;
    for (int32_t attempt = 0; attempt < 8; ++attempt)
    {
        page = static_cast<int32_t>(rng() % static_cast<uint64_t>(numPages));
        if (!wantUsed || model.used(page))
        {
            break;
        }
    }
    return page;
}

//! Writes a list to release to `pages`: random pages in use, each up to its reference count times, shuffled; one list
//! in eight also has a random id (valid or not) somewhere.
void releaseCandidates(
    std::mt19937_64& rng, Model const& model, int32_t numPages, int32_t maxList, std::vector<int32_t>& pages)
{
    pages.clear();
    std::vector<std::pair<int32_t, int32_t>> used = model.usedPages();
    std::shuffle(used.begin(), used.end(), rng);
    size_t const count = rng() % static_cast<uint64_t>(maxList);
    for (size_t i = 0; i < used.size() && pages.size() < count; ++i)
    {
        int32_t const times =
            rng() % 4 == 0 ? 1 + static_cast<int32_t>(rng() % static_cast<uint64_t>(used[i].second)) : 1;
        pages.insert(pages.end(), static_cast<size_t>(times), used[i].first);
    }
    std::shuffle(pages.begin(), pages.end(), rng);
    if (rng() % 8 == 0)
    {
        size_t const at = rng() % (pages.size() + 1);
        pages.insert(pages.begin() + static_cast<std::ptrdiff_t>(at), pickPage(rng, model, numPages, false));
    }
}

//! The calls the randomised test makes.
enum class Op
{
    kALLOCATE_ONE,
    kALLOCATE_MANY,
    kRETAIN,
    kRELEASE_ONE,
    kRELEASE_MANY,
};

//! How often each call had each outcome.
using Coverage = std::map<std::pair<Op, Outcome>, int64_t>;

//! Makes one random call of kind `op` on `allocator` and on `model`; returns both outcomes. `pages` gets the ids the
//! allocator returned and `expected` those the model did.
std::pair<Outcome, Outcome> randomCall(Op op, std::mt19937_64& rng, PageAllocator& allocator, Model& model,
    std::vector<int32_t>& pages, std::vector<int32_t>& expected)
{
    int32_t const numPages = allocator.numPages();
    int32_t const maxList = numPages / 2 + 3;
    switch (op)
    {
    case Op::kALLOCATE_ONE:
    {
        pages.assign(1, kPOISON);
        Outcome const actual = outcomeOf([&] { pages[0] = allocator.allocate(); });
        return {actual, model.allocate(1, false, expected)};
    }
    case Op::kALLOCATE_MANY:
    {
        // Negative one call in 16, else from 0 to past what is free.
        int32_t const count = rng() % 16 == 0 ? -1 - static_cast<int32_t>(rng() % 3)
                                              : static_cast<int32_t>(rng() % static_cast<uint64_t>(maxList + 1));
        bool const nullList = rng() % 32 == 0;
        pages.assign(static_cast<size_t>(std::max(count, 0)), kPOISON);
        Outcome const actual = outcomeOf([&] { allocator.allocate(count, nullList ? nullptr : pages.data()); });
        return {actual, model.allocate(count, nullList, expected)};
    }
    case Op::kRETAIN:
    {
        int32_t const page = pickPage(rng, model, numPages, true);
        return {outcomeOf([&] { allocator.retain(page); }), model.retain(page)};
    }
    case Op::kRELEASE_ONE:
    {
        int32_t const page = pickPage(rng, model, numPages, true);
        return {outcomeOf([&] { allocator.release(page); }), model.release({page})};
    }
    case Op::kRELEASE_MANY: break;
    }
    releaseCandidates(rng, model, numPages, maxList, pages);
    Outcome const actual = outcomeOf([&] { releaseList(allocator, pages); });
    return {actual, model.release(pages)};
}

//! Runs `operations` random calls on an allocator of `numPages` and on the model, comparing each call's outcome and
//! the ids it returned, and the full state with the invariants every `checkEvery` calls and at the end.
void runRandomOperations(int32_t numPages, int64_t operations, int64_t checkEvery, uint64_t seed, Coverage& coverage)
{
    // Weights out of 16: allocations and releases of pages balance, so the pool fills and drains now and then.
    constexpr Op kOPS[16] = {Op::kALLOCATE_ONE, Op::kALLOCATE_ONE, Op::kALLOCATE_ONE, Op::kALLOCATE_ONE,
        Op::kALLOCATE_MANY, Op::kALLOCATE_MANY, Op::kRETAIN, Op::kRETAIN, Op::kRELEASE_ONE, Op::kRELEASE_ONE,
        Op::kRELEASE_ONE, Op::kRELEASE_ONE, Op::kRELEASE_MANY, Op::kRELEASE_MANY, Op::kRELEASE_MANY, Op::kRELEASE_MANY};
    std::mt19937_64 rng(seed);
    PageAllocator allocator(numPages);
    Model model(numPages);
    std::vector<int32_t> pages;
    std::vector<int32_t> expected;
    for (int64_t call = 0; call < operations; ++call)
    {
        Op const op = kOPS[rng() % 16];
        expected.clear();
        auto const [actual, wanted] = randomCall(op, rng, allocator, model, pages, expected);
        ASSERT_EQ(actual, wanted) << "call " << call << " (op " << static_cast<int>(op) << ")";
        ++coverage[{op, actual}];
        if (actual == Outcome::kOK && (op == Op::kALLOCATE_ONE || op == Op::kALLOCATE_MANY))
        {
            ASSERT_EQ(pages, expected) << "call " << call;
        }
        ASSERT_EQ(allocator.numFree(), model.numFree()) << "call " << call;
        if (call % checkEvery == 0 || call + 1 == operations)
        {
            ASSERT_NO_THROW(allocator.checkInvariants()) << "call " << call;
            ASSERT_EQ(stateOf(allocator), model.state()) << "call " << call;
        }
    }
}

TEST(PageAllocator, MillionRandomOperationsMatchTheModel)
{
    // Sizes from none (every call fails) to some hundreds (long lists, repeated ids, exhaustion now and then).
    std::vector<std::pair<int32_t, int64_t>> const runs = {
        {0, 10'000}, {1, 90'000}, {5, 200'000}, {64, 350'000}, {300, 350'000}};
    uint64_t seed = 20260101;
    Coverage coverage;
    for (auto const& [numPages, operations] : runs)
    {
        SCOPED_TRACE("numPages " + std::to_string(numPages));
        runRandomOperations(numPages, operations, 997, seed++, coverage);
        if (HasFatalFailure())
        {
            return;
        }
    }
    // Every call must have met each of its outcomes often, or the run tested less than it claims.
    std::vector<std::pair<Op, Outcome>> const wanted = {{Op::kALLOCATE_ONE, Outcome::kOK},
        {Op::kALLOCATE_ONE, Outcome::kOUT_OF_MEMORY}, {Op::kALLOCATE_MANY, Outcome::kOK},
        {Op::kALLOCATE_MANY, Outcome::kOUT_OF_MEMORY}, {Op::kALLOCATE_MANY, Outcome::kINVALID},
        {Op::kRETAIN, Outcome::kOK}, {Op::kRETAIN, Outcome::kOUT_OF_RANGE}, {Op::kRETAIN, Outcome::kINVALID},
        {Op::kRELEASE_ONE, Outcome::kOK}, {Op::kRELEASE_ONE, Outcome::kOUT_OF_RANGE},
        {Op::kRELEASE_ONE, Outcome::kINVALID}, {Op::kRELEASE_MANY, Outcome::kOK},
        {Op::kRELEASE_MANY, Outcome::kOUT_OF_RANGE}, {Op::kRELEASE_MANY, Outcome::kINVALID}};
    for (auto const& key : wanted)
    {
        EXPECT_GE(coverage[key], 500) << "op " << static_cast<int>(key.first) << " outcome "
                                      << static_cast<int>(key.second);
    }
}

} // namespace
} // namespace kvcache::rt
