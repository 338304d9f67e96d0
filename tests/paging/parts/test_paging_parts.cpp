// Host tests of the parts a PageManager is made of, each on its own against a simple model: the page allocator's
// kept pages (hold, release, freeKept), the list of cached pages (src/paging/parts/cached_page_list.h), the pool that
// combines them (page_pool.h) and the two group policies (group_policy.h), whose window rule is checked against a
// token-by-token count.

#include "paging/parts/boundaries/hit_clock.h"
#include "paging/parts/cached_page_list.h"
#include "paging/parts/group_policy.h"
#include "paging/parts/page_pool.h"

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <list>
#include <random>
#include <vector>

namespace kvcache::rt
{
namespace
{

//! What the allocator's caller sees of each page: -1 kept, 0 free, else its holders; and the free stack.
struct AllocatorModel
{
    std::vector<int32_t> state;
    std::vector<int32_t> freeStack;

    explicit AllocatorModel(int32_t numPages)
        : state(static_cast<size_t>(numPages), 0)
    {
        for (int32_t p = numPages - 1; p >= 0; --p)
        {
            freeStack.push_back(p);
        }
    }
};

void expectSame(PageAllocator const& allocator, AllocatorModel const& model)
{
    int32_t kept = 0;
    for (size_t p = 0; p < model.state.size(); ++p)
    {
        int32_t const page = static_cast<int32_t>(p);
        EXPECT_EQ(allocator.isKept(page), model.state[p] == -1) << "page " << p;
        EXPECT_EQ(allocator.refCount(page), std::max(model.state[p], 0)) << "page " << p;
        kept += model.state[p] == -1 ? 1 : 0;
    }
    EXPECT_EQ(allocator.numKept(), kept);
    EXPECT_EQ(allocator.numFree(), static_cast<int32_t>(model.freeStack.size()));
    EXPECT_EQ(allocator.numUsed(), allocator.numPages() - allocator.numFree() - kept);
    EXPECT_NO_THROW(allocator.checkInvariants());
}

TEST(PageAllocatorKeeping, KeptPagesAreNeverAllocatedAndComeBackOnTopOfTheFreeList)
{
    PageAllocator allocator(4);
    int32_t pages[3] = {-7, -7, -7};
    allocator.allocate(3, pages); // 0, 1, 2
    EXPECT_EQ(allocator.release(1, true), 0);
    EXPECT_TRUE(allocator.isKept(1));
    EXPECT_EQ(allocator.numKept(), 1);
    EXPECT_EQ(allocator.numUsed(), 2);
    EXPECT_EQ(allocator.numFree(), 1);
    EXPECT_EQ(allocator.allocate(), 3); // not the kept page
    EXPECT_THROW(allocator.allocate(), OutOfMemoryError);
    EXPECT_EQ(allocator.hold(1), 1); // kept -> in use again
    EXPECT_FALSE(allocator.isKept(1));
    EXPECT_EQ(allocator.release(1, true), 0);
    allocator.freeKept(1);
    EXPECT_EQ(allocator.allocate(), 1);
    EXPECT_EQ(allocator.release(0, false), 0); // not kept: free
    EXPECT_EQ(allocator.allocate(), 0);
    // releaseIf asks only for the last holder, with the page's id.
    allocator.retain(0);
    std::vector<int32_t> asked;
    auto const keep = [&](int32_t page)
    {
        asked.push_back(page);
        return true;
    };
    EXPECT_EQ(allocator.releaseIf(0, keep), 1);
    EXPECT_TRUE(asked.empty());
    EXPECT_EQ(allocator.releaseIf(0, keep), 0);
    EXPECT_EQ(asked, std::vector<int32_t>{0});
    EXPECT_TRUE(allocator.isKept(0));
    allocator.checkInvariants();
}

TEST(PageAllocatorKeeping, RejectionsChangeNothing)
{
    PageAllocator allocator(3);
    AllocatorModel model(3);
    (void)allocator.allocate();
    model.freeStack.pop_back();
    model.state[0] = 1;
    (void)allocator.allocate();
    model.freeStack.pop_back();
    model.state[1] = 1;
    (void)allocator.release(1, true);
    model.state[1] = -1;
    EXPECT_THROW((void)allocator.hold(2), InvalidArgumentError);           // free
    EXPECT_THROW((void)allocator.hold(3), OutOfRangeError);                // out of range
    EXPECT_THROW((void)allocator.release(1, false), InvalidArgumentError); // kept
    EXPECT_THROW((void)allocator.release(2, true), InvalidArgumentError);  // free
    EXPECT_THROW(allocator.freeKept(0), InvalidArgumentError);             // in use
    EXPECT_THROW(allocator.freeKept(2), InvalidArgumentError);             // free
    EXPECT_THROW(allocator.freeKept(-1), OutOfRangeError);
    EXPECT_THROW(allocator.retain(1), InvalidArgumentError);  // kept pages take hold()
    EXPECT_THROW(allocator.release(1), InvalidArgumentError); // kept
    int32_t const list[2] = {0, 1};
    EXPECT_THROW(allocator.release(list, 2), InvalidArgumentError); // page 1 kept: page 0 stays held
    expectSame(allocator, model);
}

TEST(PageAllocatorKeeping, RandomOperationsMatchTheModel)
{
    constexpr int32_t kPAGES = 12;
    PageAllocator allocator(kPAGES);
    AllocatorModel model(kPAGES);
    std::mt19937 random(7);
    for (int32_t op = 0; op < 200000; ++op)
    {
        int32_t const page = static_cast<int32_t>(random() % (kPAGES + 1)) - (random() % 16 == 0 ? 1 : 0);
        bool const inRange = page >= 0 && page < kPAGES;
        int32_t const state = inRange ? model.state[static_cast<size_t>(page)] : 0;
        switch (random() % 4)
        {
        case 0:
            if (model.freeStack.empty())
            {
                EXPECT_THROW((void)allocator.allocate(), OutOfMemoryError);
                break;
            }
            EXPECT_EQ(allocator.allocate(), model.freeStack.back());
            model.state[static_cast<size_t>(model.freeStack.back())] = 1;
            model.freeStack.pop_back();
            break;
        case 1:
            if (!inRange || state == 0)
            {
                EXPECT_ANY_THROW((void)allocator.hold(page));
                break;
            }
            EXPECT_EQ(allocator.hold(page), std::max(state, 0) + 1);
            model.state[static_cast<size_t>(page)] = std::max(state, 0) + 1;
            break;
        case 2:
        {
            bool const keep = random() % 2 == 0;
            if (!inRange || state <= 0)
            {
                EXPECT_ANY_THROW((void)allocator.release(page, keep));
                break;
            }
            EXPECT_EQ(allocator.release(page, keep), state - 1);
            model.state[static_cast<size_t>(page)] = state - 1 == 0 && keep ? -1 : state - 1;
            if (state == 1 && !keep)
            {
                model.freeStack.push_back(page);
            }
            break;
        }
        default:
            if (!inRange || state != -1)
            {
                EXPECT_ANY_THROW(allocator.freeKept(page));
                break;
            }
            allocator.freeKept(page);
            model.state[static_cast<size_t>(page)] = 0;
            model.freeStack.push_back(page);
            break;
        }
        if (op % 1000 == 0 || HasFailure())
        {
            expectSame(allocator, model);
            ASSERT_FALSE(HasFailure()) << "operation " << op;
        }
    }
    expectSame(allocator, model);
}

//! The list's pages oldest first, read through oldest()/next() and checked backwards through newest()/previous().
std::vector<int32_t> orderOf(CachedPageList const& list)
{
    std::vector<int32_t> forward;
    for (int32_t page = list.oldest(); page != CachedPageList::kNONE; page = list.next(page))
    {
        forward.push_back(page);
    }
    std::vector<int32_t> backward;
    for (int32_t page = list.newest(); page != CachedPageList::kNONE; page = list.previous(page))
    {
        backward.insert(backward.begin(), page);
    }
    EXPECT_EQ(forward, backward);
    return forward;
}

TEST(CachedPageList, RandomPushUnlinkAndPopMatchAStdList)
{
    constexpr int32_t kPAGES = 40;
    CachedPageList list(kPAGES);
    std::list<int32_t> model;
    std::vector<bool> listed(kPAGES, false);
    std::mt19937 random(11);
    EXPECT_EQ(list.oldest(), CachedPageList::kNONE);
    for (int32_t op = 0; op < 100000; ++op)
    {
        int32_t const page = static_cast<int32_t>(random() % kPAGES);
        uint32_t const roll = static_cast<uint32_t>(random() % 3);
        if (roll == 0 && !listed[static_cast<size_t>(page)])
        {
            list.pushNewest(page);
            model.push_back(page);
            listed[static_cast<size_t>(page)] = true;
        }
        else if (roll == 1 && listed[static_cast<size_t>(page)])
        {
            list.unlink(page);
            model.remove(page);
            listed[static_cast<size_t>(page)] = false;
        }
        else if (roll == 2 && !model.empty())
        {
            EXPECT_EQ(list.popOldest(), model.front());
            listed[static_cast<size_t>(model.front())] = false;
            model.pop_front();
        }
        ASSERT_EQ(list.size(), static_cast<int32_t>(model.size())) << "operation " << op;
        ASSERT_EQ(list.oldest(), model.empty() ? CachedPageList::kNONE : model.front());
        ASSERT_EQ(list.newest(), model.empty() ? CachedPageList::kNONE : model.back());
        if (op % 97 == 0)
        {
            ASSERT_EQ(orderOf(list), std::vector<int32_t>(model.begin(), model.end())) << "operation " << op;
        }
    }
}

// Levels (retention priorities) on both sides of the 64-bit word boundary of the list's bit mask; the model is one
// std::list per level, read lowest level first.
TEST(CachedPageList, LevelsMatchOneStdListPerLevelLowestFirst)
{
    constexpr int32_t kPAGES = 40;
    constexpr int32_t kLEVELS = CachedPageList::kMAX_LEVELS;
    int32_t const levels[] = {0, 1, 35, 62, 63, 64, 65, 100, 127};
    CachedPageList list(kPAGES, kLEVELS);
    std::vector<std::list<int32_t>> model(kLEVELS);
    std::vector<bool> listed(kPAGES, false);
    auto flat = [&]
    {
        std::vector<int32_t> order;
        for (std::list<int32_t> const& level : model)
        {
            order.insert(order.end(), level.begin(), level.end());
        }
        return order;
    };
    std::mt19937 random(23);
    for (int32_t op = 0; op < 100000; ++op)
    {
        int32_t const page = static_cast<int32_t>(random() % kPAGES);
        int32_t const level = levels[random() % (sizeof(levels) / sizeof(levels[0]))];
        uint32_t const roll = static_cast<uint32_t>(random() % 4);
        if (roll <= 1 && !listed[static_cast<size_t>(page)])
        {
            if (roll == 0)
            {
                list.pushNewest(page, level);
                model[static_cast<size_t>(level)].push_back(page);
            }
            else
            {
                list.pushOldest(page, level);
                model[static_cast<size_t>(level)].push_front(page);
            }
            listed[static_cast<size_t>(page)] = true;
            ASSERT_EQ(list.level(page), level);
        }
        else if (roll == 2 && listed[static_cast<size_t>(page)])
        {
            list.unlink(page);
            for (std::list<int32_t>& l : model)
            {
                l.remove(page);
            }
            listed[static_cast<size_t>(page)] = false;
        }
        else if (roll == 3 && list.size() > 0)
        {
            int32_t const expected = flat().front();
            EXPECT_EQ(list.popOldest(), expected);
            model[static_cast<size_t>(list.level(expected))].pop_front();
            listed[static_cast<size_t>(expected)] = false;
        }
        std::vector<int32_t> const order = flat();
        ASSERT_EQ(list.size(), static_cast<int32_t>(order.size())) << "operation " << op;
        ASSERT_EQ(list.oldest(), order.empty() ? CachedPageList::kNONE : order.front()) << "operation " << op;
        ASSERT_EQ(list.newest(), order.empty() ? CachedPageList::kNONE : order.back()) << "operation " << op;
        if (op % 97 == 0)
        {
            ASSERT_EQ(orderOf(list), order) << "operation " << op;
        }
    }
}

// The clock of kept boundaries, worked out by hand: entries never hit go first, oldest first, only while there are
// more of them than the target; otherwise the hand lowers counts, passes busy entries and stops at the first at 0;
// an entry made again after being dropped joins as if hit and moves the target.
TEST(HitClock, NeverHitEntriesOverTheTargetGoFirstElseTheHandChooses)
{
    auto const none = [](int32_t) { return false; };
    HitClock clock(8);
    EXPECT_EQ(clock.target(), 8);
    EXPECT_EQ(clock.choose(none), HitClock::kNONE);
    for (int32_t id : {3, 1, 4, 5})
    {
        clock.add(id);
    }
    clock.hit(1);
    clock.hit(1);
    clock.hit(4);
    EXPECT_EQ(clock.numNeverHit(), 2);
    EXPECT_EQ(clock.hits(1), 2);
    // Ring from the hand: 3 (0), 1 (2), 4 (1), 5 (0). 3 goes; the hand stops past it.
    EXPECT_EQ(clock.choose(none), 3);
    clock.remove(3);
    // Ring: 1 (2), 4 (1), 5 (0): the hand lowers 1 and 4, and stops at 5.
    EXPECT_EQ(clock.choose(none), 5);
    EXPECT_EQ(clock.hits(1), 1);
    EXPECT_EQ(clock.hits(4), 0);
    clock.remove(5);
    // Ring: 1 (1), 4 (0). Busy 4 is passed: the hand lowers 1, passes 4, and stops at 1 on its second turn.
    EXPECT_EQ(clock.choose([](int32_t id) { return id == 4; }), 1);
    EXPECT_EQ(clock.choose([](int32_t) { return true; }), HitClock::kNONE);
    clock.remove(1);
    // 3 made again after being dropped never hit: the target rises by one, capped at 8; 3 joins as if hit.
    clock.add(3, HitClock::Dropped::kNEVER_HIT);
    EXPECT_EQ(clock.target(), 8);
    EXPECT_FALSE(clock.neverHit(3));
    // Three entries never hit; 1 made again after being dropped once hit: the target falls to 3 - 1 = 2.
    for (int32_t id : {6, 2, 7})
    {
        clock.add(id);
    }
    clock.add(1, HitClock::Dropped::kHIT);
    EXPECT_EQ(clock.target(), 2);
    // Three never hit, over the target of 2: the oldest of them goes, whatever the ring holds; a busy one is passed.
    EXPECT_EQ(clock.choose(none), 6);
    EXPECT_EQ(clock.choose([](int32_t id) { return id == 6; }), 2);
    clock.remove(6);
    // Two never hit, not over the target: the hand chooses. Ring from the hand: 4 (0), 3 (0), 2, 7, 1.
    EXPECT_EQ(clock.choose(none), 4);
    clock.remove(4);
    // 3 made again after a drop never hit raises the target to 3; now never-hit 2 and 7 wait for the hand.
    clock.remove(3);
    clock.add(3, HitClock::Dropped::kNEVER_HIT);
    EXPECT_EQ(clock.target(), 3);
    EXPECT_EQ(clock.size(), 4);
    EXPECT_EQ(clock.choose(none), 2);
}

TEST(PagePool, HoldersSharingAndCachingFollowTheCounts)
{
    PagePool pool(4);
    int32_t const a = pool.pages.allocate(); // 0
    int32_t const b = pool.pages.allocate(); // 1
    pool.hold(a);
    EXPECT_EQ(pool.numShared, 1);
    pool.hold(a);
    EXPECT_EQ(pool.numShared, 1); // counted once however many holders
    pool.release(a, [](int32_t) { return true; });
    pool.release(a, [](int32_t) { return true; });
    EXPECT_EQ(pool.numShared, 0);
    pool.release(a, [](int32_t) { return true; }); // no holder left, kept: cached
    pool.release(b, [](int32_t) { return true; });
    EXPECT_EQ(orderOf(pool.cached), (std::vector<int32_t>{a, b}));
    EXPECT_EQ(pool.available(), 4); // 2 free, 2 cached
    pool.hold(a);                   // adopted from the cache: off the list, in use
    EXPECT_EQ(orderOf(pool.cached), (std::vector<int32_t>{b}));
    EXPECT_EQ(pool.holders(a), 1);
    pool.release(a, [](int32_t) { return false; }); // not kept: free, on top
    EXPECT_EQ(pool.pages.allocate(), a);
    EXPECT_EQ(pool.pages.numKept(), 1);
    pool.pages.checkInvariants();
}

//! The first page holding a token within `window` tokens before `position` (inclusive of position - window + 1),
//! counted token by token.
int32_t firstNeededByTokens(int64_t position, int32_t window, int32_t tokensPerPage)
{
    for (int64_t token = 0;; ++token)
    {
        if (token >= position - window + 1)
        {
            return static_cast<int32_t>(token / tokensPerPage);
        }
    }
}

TEST(GroupPolicy, FullAttentionKeepsEveryPage)
{
    GroupPolicy const policy(0, 8, 2);
    EXPECT_FALSE(policy.windowed());
    for (int64_t position : {0, 1, 5, 1000, 1 << 30})
    {
        EXPECT_EQ(policy.firstNeeded(position), 0);
        EXPECT_EQ(FullAttentionPolicy::firstNeeded(position), 0);
    }
    EXPECT_EQ(policy.firstAdopted(100, 4), 0);
    EXPECT_TRUE(policy.withinBound(1 << 30));
    EXPECT_EQ(policy.visit([](auto const& p) { return p.firstNeeded(77); }), 0);
}

TEST(GroupPolicy, SlidingWindowKeepsThePagesOfTheWindowAndBoundsThem)
{
    for (int32_t shift : {0, 2, 4})
    {
        int32_t const tokensPerPage = 1 << shift;
        for (int32_t window : {1, 3, 4, 7, 16, 33})
        {
            GroupPolicy const policy(window, 5, shift);
            EXPECT_TRUE(policy.windowed());
            EXPECT_EQ(policy.pagesPerSequence(), 5);
            for (int64_t position = 0; position < 200; ++position)
            {
                int32_t const expected = firstNeededByTokens(position, window, tokensPerPage);
                ASSERT_EQ(policy.firstNeeded(position), expected)
                    << "window " << window << ", tokensPerPage " << tokensPerPage << ", position " << position;
                ASSERT_EQ(policy.visit([&](auto const& p) { return p.firstNeeded(position); }), expected);
            }
            for (int32_t pages = 0; pages < 20; ++pages)
            {
                EXPECT_EQ(policy.firstAdopted(pages, tokensPerPage),
                    firstNeededByTokens(int64_t{pages} * tokensPerPage, window, tokensPerPage));
            }
            EXPECT_TRUE(policy.withinBound(5));
            EXPECT_FALSE(policy.withinBound(6));
        }
    }
}

} // namespace
} // namespace kvcache::rt
