// PageManager::checkInvariants(): the parts agree with each other (reference counts with the sequences' entries, the
// cached list and the anchored pages with the kept pages and the registered hashes); the cuts' own checks are in
// page_manager_cuts.cpp.
#include "paging/page_manager/page_manager_state.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kvcache::rt
{
namespace
{

[[noreturn]] void fail(std::string const& message)
{
    throw std::logic_error("PageManager invariant: " + message);
}

} // namespace

void PageManager::State::checkInvariants() const
{
    int32_t alive = 0;
    for (int32_t s = 0; s < sequences.maxSequences(); ++s)
    {
        alive += sequences[s].alive ? 1 : 0;
    }
    if (alive != sequences.numSequences())
    {
        fail(fmt::format("{} live sequences, counted {}", alive, sequences.numSequences()));
    }
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        checkGroupInvariants(g);
    }
    checkCutInvariants();
    checkSlotInvariants();
    checkCheckpointInvariants();
}

void PageManager::State::checkGroupInvariants(int32_t g) const
{
    PagePool const& pool = pools[static_cast<size_t>(g)];
    GroupPolicy const& policy = policies[static_cast<size_t>(g)];
    int32_t const numPages = pool.pages.numPages();
    size_t const n = static_cast<size_t>(numPages);
    std::vector<int32_t> holders(n, 0);
    for (int32_t s = 0; s < sequences.maxSequences(); ++s)
    {
        SequenceState const& sequence = sequences[s];
        if (!sequence.alive)
        {
            continue;
        }
        int32_t const* entries = sequences.entries(g, s);
        int32_t const numEntries = static_cast<int32_t>(pagesFor(sequence.length));
        int32_t const first = sequence.firstHeld[static_cast<size_t>(g)];
        if (first < 0 || (first > numEntries && numEntries > 0) || (numEntries == 0 && first != 0))
        {
            fail(fmt::format("group {} sequence row {}: first held entry {} of {}", g, s, first, numEntries));
        }
        if (!policy.withinBound(numEntries - first))
        {
            fail(fmt::format("group {} sequence row {} holds {} pages; the window allows {}", g, s, numEntries - first,
                policy.pagesPerSequence()));
        }
        for (int32_t e = 0; e < numEntries; ++e)
        {
            int32_t const page = entries[e];
            if (e < first)
            {
                if (page != kUNUSED_PAGE_ENTRY)
                {
                    fail(fmt::format("group {} sequence row {} entry {} released but holds {}", g, s, e, page));
                }
                continue;
            }
            if (page < 0 || page >= numPages)
            {
                fail(fmt::format("group {} sequence row {} entry {} holds page {}", g, s, e, page));
            }
            ++holders[static_cast<size_t>(page)];
        }
    }
    try
    {
        pool.pages.checkInvariants();
    }
    catch (std::logic_error const& error)
    {
        fail(fmt::format("group {}: {}", g, error.what()));
    }
    std::vector<uint8_t> onCached(n, 0);
    int32_t cachedCount = 0;
    int32_t previous = CachedPageList::kNONE;
    for (int32_t page = pool.cached.oldest(); page != CachedPageList::kNONE; page = pool.cached.next(page))
    {
        if (page < 0 || page >= numPages || onCached[static_cast<size_t>(page)] != 0 || cachedCount > numPages
            || pool.cached.previous(page) != previous)
        {
            fail(fmt::format("group {} cached list is broken at page {}", g, page));
        }
        if (pool.cached.level(page) != pool.priorityOf(page)
            || (previous != CachedPageList::kNONE && pool.cached.level(previous) > pool.cached.level(page)))
        {
            fail(fmt::format("group {} cached page {} of priority {} is at level {} of the list, after level {}", g,
                page, pool.priorityOf(page), pool.cached.level(page),
                previous == CachedPageList::kNONE ? -1 : pool.cached.level(previous)));
        }
        onCached[static_cast<size_t>(page)] = 1;
        previous = page;
        ++cachedCount;
    }
    if (previous != pool.cached.newest() || cachedCount != pool.cached.size())
    {
        fail(fmt::format("group {} cached list holds {} pages, counted {}", g, cachedCount, pool.cached.size()));
    }
    bool const anchorable = cuts.enabled() && policy.windowed();
    if (pool.anchors.size() != (anchorable ? n : 0))
    {
        fail(fmt::format("group {} has {} anchor counts for {} pages", g, pool.anchors.size(), numPages));
    }
    int32_t registeredCount = 0;
    int32_t shared = 0;
    int32_t anchoredCached = 0;
    for (int32_t p = 0; p < numPages; ++p)
    {
        size_t const i = static_cast<size_t>(p);
        int32_t const refs = pool.pages.refCount(p);
        bool const kept = pool.pages.isKept(p);
        bool const isFree = refs == 0 && !kept;
        bool const isRegistered = prefix.isRegistered(g, p);
        bool const anchored = pool.anchored(p);
        for (uint8_t const stored : {pool.priority[i], pool.timed[i]})
        {
            if ((stored > PagePool::kMAX_PRIORITY && stored != PagePool::kUNSET)
                || (isFree && stored != PagePool::kUNSET))
            {
                fail(
                    fmt::format("group {} page {} (free {}) has retention priority {}", g, p, isFree, int32_t{stored}));
            }
        }
        if ((pool.timed[i] != PagePool::kUNSET) != pool.expiries.contains(p))
        {
            fail(fmt::format("group {} page {}: timed priority {} and {} in the expiry heap", g, p,
                int32_t{pool.timed[i]}, pool.expiries.contains(p) ? "" : "not"));
        }
        if (refs != holders[i])
        {
            fail(fmt::format("group {} page {} has reference count {} and {} holders", g, p, refs, holders[i]));
        }
        // A cached (kept) page is on the list, or kept off it by an anchor (a cut's window needs it); used and
        // free pages are on neither.
        int32_t const states = (refs > 0 ? 1 : 0) + (isFree ? 1 : 0) + onCached[i] + (kept && anchored ? 1 : 0);
        if (states != 1)
        {
            fail(fmt::format("group {} page {} is in {} states (used {}, free {}, listed {}, anchored {}, kept {})", g,
                p, states, refs, isFree, onCached[i], anchored, kept));
        }
        if ((isFree && isRegistered) || (kept && !isRegistered) || (anchored && !isRegistered))
        {
            fail(fmt::format("group {} page {}: registered {} but {}{}", g, p, isRegistered,
                isFree ? "free" : (kept ? "cached" : "used"), anchored ? " and anchored" : ""));
        }
        anchoredCached += kept && anchored ? 1 : 0;
        if (isRegistered)
        {
            ++registeredCount;
            int32_t const found = prefix.find(g, prefix.hashOf(g, p));
            if (found != p)
            {
                fail(fmt::format("group {} page {} is registered but its hash maps to page {}", g, p, found));
            }
        }
        shared += refs > 1 ? 1 : 0;
    }
    if (registeredCount != prefix.numRegistered(g))
    {
        fail(fmt::format(
            "group {} has {} registered pages and {} cached hashes", g, registeredCount, prefix.numRegistered(g)));
    }
    if (shared != pool.numShared)
    {
        fail(fmt::format("group {} has {} shared pages, counted {}", g, shared, pool.numShared));
    }
    if (anchoredCached != pool.numAnchoredCached)
    {
        fail(fmt::format(
            "group {} has {} anchored cached pages, counted {}", g, anchoredCached, pool.numAnchoredCached));
    }
}

} // namespace kvcache::rt
