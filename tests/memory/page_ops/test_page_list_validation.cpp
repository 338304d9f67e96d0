// The checks every page operation makes of its list on the host before it launches anything
// (src/page_list_validation.h), called directly: no GPU. Each rejection must name the field, the index, the value and
// the limit; lists longer than the stack table take the thread_local one; random lists must get the verdict of an
// independent std::set reference.

#include "memory/page_ops/page_list_validation.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/tiers/host_tier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "support/error_matchers.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::throwsNaming;

constexpr int32_t kINT32_MAX = std::numeric_limits<int32_t>::max();
constexpr int32_t kINT32_MIN = std::numeric_limits<int32_t>::min();
//! The longest list whose table of written ids fits on the stack (two ids an entry).
constexpr int32_t kSTACK_TABLE_ENTRIES = rt::kMAX_INLINE_PAGE_OPS;

void checkCopies(std::vector<rt::PageCopy> const& pairs, int32_t numPages)
{
    rt::detail::validateCopyList("copyPages", pairs.data(), static_cast<int32_t>(pairs.size()), numPages);
}

void checkResets(std::vector<int32_t> const& pages, int32_t numPages)
{
    rt::detail::validateResetList("resetPages", pages.data(), static_cast<int32_t>(pages.size()), numPages);
}

//! Returns the limit as the messages write it.
std::string idRange(int32_t numPages)
{
    return "page ids must be in [0, " + std::to_string(numPages) + ")";
}

//! Returns `count` pairs that pass with numPages = 2 * count, in a shuffled order: the even ids are the destinations,
//! the odd ids the sources, so 0 and numPages - 1 are both listed.
std::vector<rt::PageCopy> acceptableCopies(int32_t count, uint64_t seed)
{
    std::mt19937_64 rng(seed);
    std::vector<int32_t> sources(static_cast<size_t>(count));
    std::iota(sources.begin(), sources.end(), 0);
    std::shuffle(sources.begin(), sources.end(), rng);
    std::vector<rt::PageCopy> pairs(static_cast<size_t>(count));
    for (size_t i = 0; i < pairs.size(); ++i)
    {
        pairs[i] = rt::PageCopy{2 * sources[i] + 1, 2 * static_cast<int32_t>(i)};
    }
    std::shuffle(pairs.begin(), pairs.end(), rng);
    return pairs;
}

//! Returns every id of [0, count) once, in a shuffled order: a reset list that passes with numPages = count.
std::vector<int32_t> acceptableResets(int32_t count, uint64_t seed)
{
    std::vector<int32_t> pages(static_cast<size_t>(count));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), std::mt19937_64(seed));
    return pages;
}

TEST(PageListValidationTest, EmptyListsAreAccepted)
{
    // The entries behind the pointers would be rejected (id 2 of 2 pages), so reading one would show.
    rt::PageCopy const pair{1, 2};
    int32_t const page = 2;
    EXPECT_NO_THROW(rt::detail::validateCopyList("copyPages", nullptr, 0, 2));
    EXPECT_NO_THROW(rt::detail::validateCopyList("copyPages", &pair, 0, 2));
    EXPECT_NO_THROW(rt::detail::validateResetList("resetPages", nullptr, 0, 2));
    EXPECT_NO_THROW(rt::detail::validateResetList("resetPages", &page, 0, 2));
    EXPECT_NO_THROW(rt::detail::validateDeviceListArguments("copyPagesDevice", nullptr, 0));
    EXPECT_NO_THROW(rt::detail::validateDeviceListArguments("copyPagesDevice", &pair, 0));
    EXPECT_THROW(rt::detail::validateCopyList("copyPages", &pair, 1, 2), rt::OutOfRangeError);
    EXPECT_THROW(rt::detail::validateResetList("resetPages", &page, 1, 2), rt::OutOfRangeError);
}

TEST(PageListValidationTest, IdsAtBothEndsOfTheRangeAreAccepted)
{
    for (int32_t const n : {2, 64, kINT32_MAX})
    {
        SCOPED_TRACE("numPages " + std::to_string(n));
        EXPECT_NO_THROW(checkCopies({{0, n - 1}}, n));
        EXPECT_NO_THROW(checkCopies({{n - 1, 0}}, n));
        EXPECT_NO_THROW(checkResets({0}, n));
        EXPECT_NO_THROW(checkResets({n - 1}, n));
        EXPECT_NO_THROW(checkResets({n - 1, 0}, n));
        EXPECT_THROW(checkResets({n}, n), rt::OutOfRangeError) << "the range is half open";
    }
    EXPECT_NO_THROW(checkResets({0}, 1));
    EXPECT_NO_THROW(checkCopies({{3, 0}, {3, 1}, {3, 2}}, 4)) << "one source may feed several destinations";
}

TEST(PageListValidationTest, LongListsBeyondTheStackTableAreAccepted)
{
    for (int32_t const count :
        {kSTACK_TABLE_ENTRIES - 1, kSTACK_TABLE_ENTRIES, kSTACK_TABLE_ENTRIES + 1, 2 * kSTACK_TABLE_ENTRIES + 1, 6000})
    {
        SCOPED_TRACE(std::to_string(count) + " entries");
        EXPECT_NO_THROW(checkCopies(acceptableCopies(count, static_cast<uint64_t>(count)), 2 * count));
        EXPECT_NO_THROW(checkResets(acceptableResets(count, static_cast<uint64_t>(count)), count));
    }
    // Ids spread over the whole int32 range, in one long list.
    std::vector<int32_t> spread(5000);
    for (size_t i = 0; i < spread.size(); ++i)
    {
        spread[i] = static_cast<int32_t>(int64_t{kINT32_MAX} - 1 - static_cast<int64_t>(i) * 429'000);
    }
    EXPECT_NO_THROW(checkResets(spread, kINT32_MAX));
    spread.back() = spread.front();
    EXPECT_THROW(checkResets(spread, kINT32_MAX), rt::InvalidArgumentError);
}

TEST(PageListValidationTest, ARejectedListLeavesNothingBehindForTheNextCall)
{
    // A rejection leaves the table of written ids half filled; the next call, short or long, must not see it.
    for (int32_t const count : {kSTACK_TABLE_ENTRIES, 6000})
    {
        SCOPED_TRACE(std::to_string(count) + " entries");
        std::vector<rt::PageCopy> const good = acceptableCopies(count, 7);
        std::vector<rt::PageCopy> repeated = good;
        repeated.back().dst = repeated.front().dst;
        EXPECT_THROW(checkCopies(repeated, 2 * count), rt::InvalidArgumentError);
        EXPECT_NO_THROW(checkCopies(good, 2 * count));
        EXPECT_NO_THROW(checkCopies({good.back()}, 2 * count));

        std::vector<int32_t> const pages = acceptableResets(count, 8);
        std::vector<int32_t> repeatedPage = pages;
        repeatedPage.back() = repeatedPage.front();
        EXPECT_THROW(checkResets(repeatedPage, count), rt::InvalidArgumentError);
        EXPECT_NO_THROW(checkResets(pages, count));
    }
}

TEST(PageListValidationTest, NegativeCountsAreRejected)
{
    std::vector<rt::PageCopy> const pairs{{1, 2}};
    std::vector<int32_t> const pages{1};
    for (int32_t const count : {-1, kINT32_MIN})
    {
        std::string const named = "count is " + std::to_string(count) + "; it must be >= 0";
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::detail::validateCopyList("copyPages", pairs.data(), count, 8); }, {"copyPages: " + named}));
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::detail::validateResetList("resetPages", pages.data(), count, 8); }, {"resetPages: " + named}));
    }
}

TEST(PageListValidationTest, NullListsWithEntriesAreRejected)
{
    for (int32_t const count : {1, 3, kINT32_MAX})
    {
        std::string const named = "the list is null but count is " + std::to_string(count);
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::detail::validateCopyList("copyPages", nullptr, count, 8); }, {"copyPages: " + named}));
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::detail::validateResetList("resetPages", nullptr, count, 8); }, {"resetPages: " + named}));
    }
}

TEST(PageListValidationTest, IdsOutsideTheRangeAreRejectedNamingTheFieldIndexValueAndLimit)
{
    constexpr int32_t kPAGES = 64;
    for (int32_t const bad : {-1, -5, kPAGES, kPAGES + 1, 1 << 30, kINT32_MAX, kINT32_MIN})
    {
        SCOPED_TRACE("id " + std::to_string(bad));
        std::string const value = " is page " + std::to_string(bad);
        EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
            [&] {
                checkCopies({{1, 2}, {3, 4}, {bad, 5}}, kPAGES);
            },
            {"copyPages: pairs.src[2]" + value, idRange(kPAGES)}));
        EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
            [&] {
                checkCopies({{1, 2}, {3, 4}, {6, bad}}, kPAGES);
            },
            {"copyPages: pairs.dst[2]" + value, idRange(kPAGES)}));
        EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
            [&] {
                checkCopies({{bad, bad}}, kPAGES);
            },
            {"copyPages: pairs.", "[0]" + value, idRange(kPAGES)}));
        EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
            [&] {
                checkResets({1, 2, 3, bad}, kPAGES);
            },
            {"resetPages: pages[3]" + value, idRange(kPAGES)}));
    }
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] {
            checkResets({0, kINT32_MAX}, kINT32_MAX);
        },
        {"pages[1] is page 2147483647", idRange(kINT32_MAX)}));
}

TEST(PageListValidationTest, AnIdFarDownALongListIsRejectedWithItsIndex)
{
    constexpr int32_t kCOUNT = 6000;
    std::vector<rt::PageCopy> badDestination = acceptableCopies(kCOUNT, 1);
    badDestination[4321].dst = 2 * kCOUNT;
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] { checkCopies(badDestination, 2 * kCOUNT); }, {"pairs.dst[4321] is page 12000", idRange(2 * kCOUNT)}));
    std::vector<rt::PageCopy> badSource = acceptableCopies(kCOUNT, 2);
    badSource.back().src = -1;
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] { checkCopies(badSource, 2 * kCOUNT); }, {"pairs.src[5999] is page -1", idRange(2 * kCOUNT)}));
    std::vector<int32_t> badPage = acceptableResets(kCOUNT, 3);
    badPage[5000] = kINT32_MIN;
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] { checkResets(badPage, kCOUNT); }, {"pages[5000] is page -2147483648", idRange(kCOUNT)}));
}

TEST(PageListValidationTest, ADestinationListedTwiceIsRejected)
{
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            checkCopies({{1, 2}, {3, 4}, {5, 2}}, 8);
        },
        {"copyPages: page 2 is a destination more than once"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            checkCopies({{1, 7}, {1, 7}}, 8);
        },
        {"copyPages: page 7 is a destination more than once"}));
    // Far apart, in lists that fill the stack table and that need the thread_local one.
    for (int32_t const count : {kSTACK_TABLE_ENTRIES, kSTACK_TABLE_ENTRIES + 1, 6000})
    {
        SCOPED_TRACE(std::to_string(count) + " entries");
        std::vector<rt::PageCopy> pairs = acceptableCopies(count, 4);
        pairs.back().dst = pairs.front().dst;
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { checkCopies(pairs, 2 * count); },
            {"page " + std::to_string(pairs.front().dst) + " is a destination more than once"}));
    }
}

TEST(PageListValidationTest, APageThatIsBothSourceAndDestinationIsRejected)
{
    struct Case
    {
        std::vector<rt::PageCopy> pairs;
        int32_t page;
    };
    std::vector<Case> const cases{
        {{{1, 2}, {2, 4}}, 2}, // a destination, then a source
        {{{1, 2}, {3, 1}}, 1}, // a source, then a destination
        {{{6, 6}}, 6},         // a page copied onto itself
        {{{1, 2}, {6, 6}}, 6},
    };
    for (Case const& testCase : cases)
    {
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { checkCopies(testCase.pairs, 8); },
            {"copyPages: page " + std::to_string(testCase.page) + " is both a source and a destination"}));
    }
    // Far apart in a long list, each way round.
    constexpr int32_t kCOUNT = 6000;
    std::vector<rt::PageCopy> earlySource = acceptableCopies(kCOUNT, 5);
    earlySource[5].src = earlySource[5995].dst;
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { checkCopies(earlySource, 2 * kCOUNT); },
        {"page " + std::to_string(earlySource[5].src) + " is both a source and a destination"}));
    std::vector<rt::PageCopy> lateSource = acceptableCopies(kCOUNT, 6);
    lateSource[5995].src = lateSource[5].dst;
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { checkCopies(lateSource, 2 * kCOUNT); },
        {"page " + std::to_string(lateSource[5995].src) + " is both a source and a destination"}));
}

TEST(PageListValidationTest, AResetPageListedTwiceIsRejected)
{
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            checkResets({1, 2, 3, 2}, 8);
        },
        {"resetPages: page 2 is a destination more than once"}));
    constexpr int32_t kCOUNT = 6000;
    std::vector<int32_t> pages = acceptableResets(kCOUNT, 9);
    pages[5999] = pages[2];
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { checkResets(pages, kCOUNT); },
        {"page " + std::to_string(pages[2]) + " is a destination more than once"}));
}

TEST(PageListValidationTest, DeviceListArgumentsAreChecked)
{
    rt::PageCopy const pairs[3] = {{1, 2}, {3, 4}, {5, 6}};
    for (int32_t const capacity : {-1, kINT32_MIN})
    {
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
            { rt::detail::validateDeviceListArguments("copyPagesDevice", pairs, capacity); },
            {"copyPagesDevice: capacity is " + std::to_string(capacity) + "; it must be >= 0"}));
    }
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::detail::validateDeviceListArguments("resetPagesDevice", nullptr, 3); },
        {"resetPagesDevice: the list is null but capacity is 3"}));
    // Only the pointer and the capacity are checked: the entries are in device memory.
    EXPECT_NO_THROW(rt::detail::validateDeviceListArguments("copyPagesDevice", pairs, 3));
    EXPECT_NO_THROW(rt::detail::validateDeviceListArguments("copyPagesDevice", pairs, kINT32_MAX));
    EXPECT_NO_THROW(rt::detail::validateDeviceListArguments("copyPagesDevice", nullptr, 0));
}

// The randomized comparison: an independent reference built on std::set, and lists that pass or break one rule.

enum class Verdict
{
    kACCEPTED,
    kOUT_OF_RANGE,
    kCONFLICT,
};

char const* nameOf(Verdict verdict)
{
    switch (verdict)
    {
    case Verdict::kACCEPTED: return "accepted";
    case Verdict::kOUT_OF_RANGE: return "out of range";
    case Verdict::kCONFLICT: return "conflict";
    }
    return "?";
}

//! The reference: ids in range first (a conflict among out-of-range ids means nothing), then the written pages.
Verdict referenceVerdict(std::vector<int32_t> const& read, std::vector<int32_t> const& written, int32_t numPages)
{
    auto const outside = [numPages](int32_t id) { return id < 0 || id >= numPages; };
    if (std::any_of(read.begin(), read.end(), outside) || std::any_of(written.begin(), written.end(), outside))
    {
        return Verdict::kOUT_OF_RANGE;
    }
    std::set<int32_t> const distinct(written.begin(), written.end());
    if (distinct.size() != written.size())
    {
        return Verdict::kCONFLICT;
    }
    bool const overlap = std::any_of(read.begin(), read.end(), [&](int32_t id) { return distinct.count(id) != 0; });
    return overlap ? Verdict::kCONFLICT : Verdict::kACCEPTED;
}

//! Returns the verdict of `check` and the message of its rejection.
template <typename Check>
Verdict verdictOf(Check&& check, std::string& message)
{
    try
    {
        check();
    }
    catch (rt::OutOfRangeError const& error)
    {
        message = error.what();
        return Verdict::kOUT_OF_RANGE;
    }
    catch (rt::InvalidArgumentError const& error)
    {
        message = error.what();
        return Verdict::kCONFLICT;
    }
    return Verdict::kACCEPTED;
}

//! Returns the page a rejection names ("... page 12 ..."), if any.
std::optional<int64_t> namedPage(std::string const& message)
{
    size_t const at = message.find("page ");
    if (at == std::string::npos)
    {
        return std::nullopt;
    }
    return std::stoll(message.substr(at + 5));
}

//! Makes random lists: mostly lists that pass, then broken in one place by one rule, and some of ids drawn freely,
//! where clashes are likely.
class RandomLists
{
public:
    explicit RandomLists(uint64_t seed)
        : mRng(seed)
    {
    }

    //! Returns a random id in [0, numPages).
    int32_t id(int32_t numPages)
    {
        return std::uniform_int_distribution<int32_t>(0, numPages - 1)(mRng);
    }
    //! Returns an index in [0, count).
    size_t index(size_t count)
    {
        return std::uniform_int_distribution<size_t>(0, count - 1)(mRng);
    }
    //! Returns an id outside [0, numPages).
    int32_t outside(int32_t numPages)
    {
        int32_t const above = numPages <= kINT32_MAX - 1000 ? numPages + static_cast<int32_t>(index(1000)) : numPages;
        std::vector<int32_t> const choices{-1, numPages, kINT32_MIN, kINT32_MAX, -1 - id(numPages), above};
        return choices[index(choices.size())];
    }
    //! Returns `count` ids (count <= numPages / 2), distinct from each other and from `taken` when `distinct`.
    std::vector<int32_t> ids(int32_t count, int32_t numPages, bool distinct, std::set<int32_t> const& taken = {})
    {
        std::set<int32_t> used;
        std::vector<int32_t> drawn;
        while (drawn.size() < static_cast<size_t>(count))
        {
            int32_t const candidate = id(numPages);
            if (!distinct || (taken.count(candidate) == 0 && used.insert(candidate).second))
            {
                drawn.push_back(candidate);
            }
        }
        return drawn;
    }
    //! Returns one of the ways to break a list, 0 for none; 4 draws its ids freely.
    int32_t fault()
    {
        return static_cast<int32_t>(index(5));
    }

private:
    std::mt19937_64 mRng;
};

//! Returns `count` pairs over `numPages` pages (numPages >= 2 * count) with one fault of RandomLists::fault().
std::vector<rt::PageCopy> randomCopies(RandomLists& random, int32_t count, int32_t numPages, int32_t fault)
{
    bool const free = fault == 4;
    std::vector<int32_t> const dst = random.ids(count, numPages, !free);
    std::vector<int32_t> const src =
        random.ids(count, numPages, !free, free ? std::set<int32_t>{} : std::set<int32_t>(dst.begin(), dst.end()));
    std::vector<rt::PageCopy> pairs(static_cast<size_t>(count));
    for (size_t i = 0; i < pairs.size(); ++i)
    {
        pairs[i] = rt::PageCopy{src[i], dst[i]};
    }
    if (count > 0)
    {
        rt::PageCopy& broken = pairs[random.index(pairs.size())];
        rt::PageCopy const& other = pairs[random.index(pairs.size())];
        switch (fault)
        {
        case 1: broken.dst = other.dst; break;
        case 2: broken.src = other.dst; break;
        case 3: (random.index(2) == 0 ? broken.src : broken.dst) = random.outside(numPages); break;
        default: break;
        }
    }
    return pairs;
}

//! Returns `count` pages over `numPages` pages (numPages >= 2 * count) with one fault of RandomLists::fault().
std::vector<int32_t> randomResets(RandomLists& random, int32_t count, int32_t numPages, int32_t fault)
{
    std::vector<int32_t> pages = random.ids(count, numPages, fault != 4);
    if (count > 0)
    {
        int32_t& broken = pages[random.index(pages.size())];
        int32_t const other = pages[random.index(pages.size())];
        switch (fault)
        {
        case 1:
        case 2: broken = other; break;
        case 3: broken = random.outside(numPages); break;
        default: break;
        }
    }
    return pages;
}

//! Checks that a rejection's message names a page that breaks the rule the reference found broken.
::testing::AssertionResult namesAnOffendingPage(Verdict verdict, std::string const& message,
    std::vector<int32_t> const& read, std::vector<int32_t> const& written, int32_t numPages)
{
    std::optional<int64_t> const page = namedPage(message);
    if (!page)
    {
        return ::testing::AssertionFailure() << "\"" << message << "\" names no page";
    }
    auto const count = [](std::vector<int32_t> const& ids, int64_t id)
    { return std::count(ids.begin(), ids.end(), id); };
    bool const offends = verdict == Verdict::kOUT_OF_RANGE
        ? (*page < 0 || *page >= numPages) && count(read, *page) + count(written, *page) > 0
        : count(written, *page) > 1 || (count(written, *page) == 1 && count(read, *page) > 0);
    if (!offends)
    {
        return ::testing::AssertionFailure()
            << "\"" << message << "\" names page " << *page << ", which breaks no rule";
    }
    return ::testing::AssertionSuccess();
}

void checkStateCopies(std::vector<rt::StateSlotCopy> const& copies, int32_t numStateSlots)
{
    rt::detail::validateStateCopyList("copyStates", copies.data(), static_cast<int32_t>(copies.size()), numStateSlots);
}

TEST(PageListValidationTest, StateCopyListsInRangeAndDisjointAreAccepted)
{
    // Slot 0 read by two copies, the last slot (6 of 7) written; an empty list needs no state layers.
    EXPECT_NO_THROW(checkStateCopies({{0, 3}, {2, 6}, {0, 5}}, 7));
    rt::StateSlotCopy const copy{9, 9};
    EXPECT_NO_THROW(rt::detail::validateStateCopyList("copyStates", nullptr, 0, 7));
    EXPECT_NO_THROW(rt::detail::validateStateCopyList("copyStates", &copy, 0, 0));
    EXPECT_NO_THROW(rt::detail::validateStateCopyList("copyStates", nullptr, 0, 0));
}

TEST(PageListValidationTest, StateCopyListsAreRefusedNamingTheFieldTheValueAndTheLimit)
{
    rt::StateSlotCopy const copy{0, 1};
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::detail::validateStateCopyList("copyStates", &copy, -3, 7); }, {"copyStates", "count is -3", ">= 0"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [] { rt::detail::validateStateCopyList("copyStates", nullptr, 1, 7); }, {"copyStates", "null", "count is 1"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [] {
            checkStateCopies({{0, 1}}, 0);
        },
        {"copyStates", "count is 1", "no state layers"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [] {
            checkStateCopies({{0, 1}, {2, 7}}, 7);
        },
        {"copyStates", "copies[1].dst is slot 7", "[0, 7)"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [] {
            checkStateCopies({{-1, 1}}, 7);
        },
        {"copies[0].src is slot -1", "[0, 7)"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [] {
            checkStateCopies({{0, 1}, {kINT32_MIN, 2}}, 7);
        },
        {"copies[1].src", std::to_string(kINT32_MIN)}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [] {
            checkStateCopies({{0, 4}, {2, 3}, {1, 4}}, 7);
        },
        {"copyStates", "slot 4 is a destination more than once"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [] {
            checkStateCopies({{0, 4}, {4, 5}}, 7);
        },
        {"copyStates", "slot 4 is both a source and a destination"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [] {
            checkStateCopies({{3, 3}}, 7);
        },
        {"slot 3 is both a source and a destination"}));
}

TEST(PageListValidationTest, RandomListsGetTheVerdictOfASetBasedReference)
{
    RandomLists random(20261130);
    int64_t seen[3][2] = {}; // [verdict][long]
    int32_t failures = 0;
    for (int32_t trial = 0; trial < 4000 && failures < 5; ++trial)
    {
        bool const isLong = trial % 20 == 0;
        int32_t const count = isLong ? 200 + random.id(3000) : random.id(41);
        // Small id ranges make free lists clash; kINT32_MAX makes them pass.
        int32_t const numPages = random.index(4) == 0 ? kINT32_MAX : 2 * count + 1 + random.id(isLong ? 2000 : 8);
        int32_t const fault = random.fault();
        std::string const trace = "trial " + std::to_string(trial) + ": " + std::to_string(count) + " entries of "
            + std::to_string(numPages) + " pages, fault " + std::to_string(fault);

        auto const compare =
            [&](char const* what, std::vector<int32_t> const& read, std::vector<int32_t> const& written, auto&& check)
        {
            Verdict const expected = referenceVerdict(read, written, numPages);
            std::string message;
            Verdict const actual = verdictOf(check, message);
            ++seen[static_cast<int32_t>(expected)][isLong ? 1 : 0];
            if (actual != expected)
            {
                ++failures;
                ADD_FAILURE() << trace << ": " << what << " says " << nameOf(actual) << " (" << message
                              << "), the reference " << nameOf(expected);
            }
            else if (actual != Verdict::kACCEPTED)
            {
                EXPECT_TRUE(namesAnOffendingPage(actual, message, read, written, numPages)) << trace << ", " << what;
            }
        };

        std::vector<rt::PageCopy> const pairs = randomCopies(random, count, numPages, fault);
        std::vector<int32_t> read;
        std::vector<int32_t> written;
        for (rt::PageCopy const& pair : pairs)
        {
            read.push_back(pair.src);
            written.push_back(pair.dst);
        }
        compare("copyPages", read, written, [&] { checkCopies(pairs, numPages); });
        std::vector<int32_t> const pages = randomResets(random, count, numPages, fault);
        compare("resetPages", {}, pages, [&] { checkResets(pages, numPages); });
    }
    // The lists must have tried every verdict, in short lists and in long ones.
    for (Verdict const verdict : {Verdict::kACCEPTED, Verdict::kOUT_OF_RANGE, Verdict::kCONFLICT})
    {
        EXPECT_GE(seen[static_cast<int32_t>(verdict)][0], 100) << nameOf(verdict) << " in short lists";
        EXPECT_GE(seen[static_cast<int32_t>(verdict)][1], 10) << nameOf(verdict) << " in long lists";
    }
}

//! Runs the host tier's entry check as HostTier does: the tier's note after the host page limit.
void checkEntries(std::vector<rt::HostTierEntry> const& entries, int32_t numPages, int64_t numHostPages)
{
    rt::detail::validateHostTierEntries(
        "offload", entries.data(), static_cast<int32_t>(entries.size()), numPages, numHostPages, "(4 of 8 pinned)");
}

TEST(PageListValidationTest, HostTierEntriesInRangeAndDistinctAreAccepted)
{
    rt::HostTierEntry const entry{5, 0};
    EXPECT_NO_THROW(rt::detail::validateHostTierEntries("offload", nullptr, 0, 2, 2));
    EXPECT_NO_THROW(rt::detail::validateHostTierEntries("offload", &entry, 0, 2, 2)) << "page 5 of 2 must go unread";
    EXPECT_NO_THROW(checkEntries({{0, 3}, {6, 0}}, 7, 4)) << "both ends of both ranges";
    EXPECT_NO_THROW(checkEntries({{2, 1}, {1, 2}}, 7, 4)) << "a page id may equal another entry's host page id";
    EXPECT_NO_THROW(checkEntries({{kINT32_MAX - 1, 0}}, kINT32_MAX, 1));
    EXPECT_NO_THROW(checkEntries({{0, kINT32_MAX - 1}}, 1, int64_t{kINT32_MAX} + 5)) << "the host page range is 64-bit";
}

TEST(PageListValidationTest, HostTierEntriesNameTheFieldTheValueAndTheLimit)
{
    rt::HostTierEntry const entry{0, 0};
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::detail::validateHostTierEntries("offload", &entry, -1, 2, 2); }, {"offload", "count is -1", ">= 0"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::detail::validateHostTierEntries("onboard", nullptr, 3, 2, 2); }, {"onboard", "null", "count is 3"}));
    std::string message;
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] { rt::detail::validateHostTierEntries("offload", &entry, 1, 2, 0); }, {"entries[0].hostPage"}, &message));
    EXPECT_EQ(message, "offload: entries[0].hostPage is host page 0; host pages must be in [0, 0)")
        << "no note, nothing after it";

    // Lists over 9 pages and 4 host pages; each must be refused with these words.
    struct Refused
    {
        std::vector<rt::HostTierEntry> entries;
        bool outOfRange;
        std::vector<std::string> words;
    };
    std::vector<Refused> const cases = {
        {{{1, 0}, {9, 1}}, true, {"offload", "entries[1].page", "page 9", "[0, 9)"}},
        {{{-1, 0}}, true, {"entries[0].page", "page -1", "[0, 9)"}},
        {{{1, 0}, {2, 4}}, true, {"entries[1].hostPage", "host page 4", "[0, 4) (4 of 8 pinned)"}},
        // The page is checked before the host page, and every range before any repeat.
        {{{kINT32_MIN, kINT32_MIN}}, true, {"entries[0].page", std::to_string(kINT32_MIN)}},
        {{{1, 0}, {1, 0}, {2, 7}}, true, {"entries[2].hostPage", "host page 7"}},
        {{{3, 0}, {1, 1}, {3, 2}}, false, {"offload", "page 3", "listed more than once"}},
        {{{1, 0}, {2, 0}}, false, {"offload", "host page 0", "listed more than once"}},
    };
    for (size_t i = 0; i < cases.size(); ++i)
    {
        Refused const& refused = cases[i];
        auto const check = [&] { checkEntries(refused.entries, 9, 4); };
        EXPECT_TRUE(refused.outOfRange ? throwsNaming<rt::OutOfRangeError>(check, refused.words)
                                       : throwsNaming<rt::InvalidArgumentError>(check, refused.words))
            << "case " << i;
    }
}

TEST(PageListValidationTest, HostTierEntriesGetTheVerdictOfASetBasedReference)
{
    std::mt19937_64 rng(20261201);
    int64_t seen[3] = {}; // accepted, out of range, repeated
    for (int32_t trial = 0; trial < 2000; ++trial)
    {
        // Long lists run past the stack table; small ranges make repeats likely.
        int32_t const count =
            trial % 10 == 0 ? 200 + static_cast<int32_t>(rng() % 3000) : static_cast<int32_t>(rng() % 40);
        auto const numPages = static_cast<int32_t>(count + rng() % (count + 3));
        auto const numHostPages = static_cast<int64_t>(count + rng() % (count + 3));
        std::vector<rt::HostTierEntry> entries(static_cast<size_t>(count));
        std::vector<int32_t> pages(static_cast<size_t>(numPages));
        std::vector<int32_t> hostPages(static_cast<size_t>(numHostPages));
        std::iota(pages.begin(), pages.end(), 0);
        std::iota(hostPages.begin(), hostPages.end(), 0);
        std::shuffle(pages.begin(), pages.end(), rng);
        std::shuffle(hostPages.begin(), hostPages.end(), rng);
        for (size_t i = 0; i < entries.size(); ++i)
        {
            entries[i] = rt::HostTierEntry{pages[i], hostPages[i]};
        }
        if (count > 0 && trial % 3 != 0)
        {
            rt::HostTierEntry& broken = entries[rng() % entries.size()];
            rt::HostTierEntry const& other = entries[rng() % entries.size()];
            switch (rng() % 4)
            {
            case 0: broken.page = other.page; break;
            case 1: broken.hostPage = other.hostPage; break;
            case 2: broken.page = rng() % 2 == 0 ? -1 - static_cast<int32_t>(rng() % 5) : numPages; break;
            default: broken.hostPage = static_cast<int32_t>(numHostPages + static_cast<int64_t>(rng() % 5)); break;
            }
        }
        // The reference: ranges first, then repeats, with std::set.
        int32_t expected = 0;
        std::set<int32_t> usedPages;
        std::set<int32_t> usedHostPages;
        for (rt::HostTierEntry const& e : entries)
        {
            if (e.page < 0 || e.page >= numPages || e.hostPage < 0 || e.hostPage >= numHostPages)
            {
                expected = 1;
            }
            if (!usedPages.insert(e.page).second || !usedHostPages.insert(e.hostPage).second)
            {
                expected = expected == 0 ? 2 : expected;
            }
        }
        int32_t actual = 0;
        try
        {
            checkEntries(entries, numPages, numHostPages);
        }
        catch (rt::OutOfRangeError const&)
        {
            actual = 1;
        }
        catch (rt::InvalidArgumentError const&)
        {
            actual = 2;
        }
        ++seen[expected];
        ASSERT_EQ(actual, expected) << "trial " << trial << ": " << count << " entries, " << numPages << " pages, "
                                    << numHostPages << " hostPages";
    }
    EXPECT_GE(seen[0], 100);
    EXPECT_GE(seen[1], 100);
    EXPECT_GE(seen[2], 100);
}

} // namespace
