#pragma once

#include "paging/parts/cached_page_list.h"
#include "paging/parts/expiry_heap.h"

#include "kvcache/paging/page_allocator.h"
#include "kvcache/paging/page_manager.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! The pages of one page group: a PageAllocator (free pages and holders; a cached page is kept there) and the list
//! of cached pages beside it, oldest first. Every page is free, used or cached. Whether a page is cached on release is
//! the caller's choice (the prefix cache knows which pages are registered); evicting, too.
//!
//! In a windowed group of a hybrid cache a page may also be anchored: it lies in the window of one or more cuts
//! (prefix_cuts.h). An anchored cached page is kept by the allocator but is off the list, so that evicting from the
//! list takes the pages no cut needs first; it joins the list when its last anchor goes (unanchor()).
//!
//! Every page has a retention priority: the highest its holders set (PageManager::setRetention), kDEFAULT_PRIORITY
//! while none did. A priority set with a duration is kept apart (one per page, the highest in force) with the time it
//! ends, in a heap by that time; expire() drops it then. A cached page is on the list at the level of its priority, so
//! the lowest priority goes first. A page is unset again when it becomes free (released unkept, or evicted).
struct PagePool
{
    static constexpr int32_t kDEFAULT_PRIORITY = PageManager::kDEFAULT_RETENTION_PRIORITY;
    static constexpr int32_t kMAX_PRIORITY = PageManager::kMAX_RETENTION_PRIORITY;
    //! The stored priority of a page no holder set a priority on.
    static constexpr uint8_t kUNSET = 0xFF;

    PageAllocator pages;
    CachedPageList cached;
    //! Used pages with more than one holder.
    int32_t numShared = 0;
    //! Per page, the cuts whose window holds it; empty outside the windowed groups of a hybrid cache.
    std::vector<int32_t> anchors;
    //! Cached pages with an anchor (kept, off the list).
    int32_t numAnchoredCached = 0;
    //! Per-page scratch for step()'s exact page count; all zero between calls.
    mutable std::vector<int32_t> scratch;
    //! Per page, the highest retention priority its holders set without a duration, in [0, kMAX_PRIORITY], or kUNSET.
    std::vector<uint8_t> priority;
    //! Per page, the highest priority set with a duration and still in force, or kUNSET; it ends at the page's time
    //! in `expiries`.
    std::vector<uint8_t> timed;
    //! The pages with a timed priority, by the time it ends.
    ExpiryHeap expiries;

    PagePool() = default;
    //! Returns a pool of `numPages` free pages; throws std::bad_alloc.
    explicit PagePool(int32_t numPages)
        : pages(numPages)
        , cached(numPages, kMAX_PRIORITY + 1)
        , scratch(static_cast<size_t>(numPages), 0)
        , priority(static_cast<size_t>(numPages), kUNSET)
        , timed(static_cast<size_t>(numPages), kUNSET)
        , expiries(numPages)
    {
    }

    //! Returns the pages a holder can take now: free, else cached (evicting them; anchored ones once their cuts are
    //! dropped).
    int64_t available() const noexcept
    {
        return int64_t{pages.numFree()} + numCached();
    }
    //! Returns the cached pages, on the list or anchored.
    int32_t numCached() const noexcept
    {
        return cached.size() + numAnchoredCached;
    }
    //! Returns whether `page` lies in the window of a cut.
    bool anchored(int32_t page) const noexcept
    {
        return !anchors.empty() && anchors[static_cast<size_t>(page)] > 0;
    }
    //! Sizes the anchor counts: the pool belongs to a windowed group of a hybrid cache.
    void enableAnchors()
    {
        anchors.assign(static_cast<size_t>(pages.numPages()), 0);
    }

    //! Adds an anchor to the registered, used or cached `page` (a cached page leaves the list).
    void anchor(int32_t page)
    {
        if (anchors[static_cast<size_t>(page)]++ == 0 && pages.isKept(page))
        {
            cached.unlink(page);
            ++numAnchoredCached;
        }
    }
    //! Removes an anchor from `page`; returns true when that leaves it cached with no anchor, off the list: the caller
    //! puts it on the list where it belongs.
    bool unanchor(int32_t page)
    {
        if (--anchors[static_cast<size_t>(page)] == 0 && pages.isKept(page))
        {
            --numAnchoredCached;
            return true;
        }
        return false;
    }
    //! Returns the reference count of a page (0 for free or cached ones) without a range check.
    int32_t holders(int32_t page) const noexcept
    {
        return pages.refCount(page);
    }

    //! Adds a holder to a used or cached page (a cached page leaves the list).
    void hold(int32_t page)
    {
        // Free pages are refused, so a count of 1 now means the page was cached (kept).
        int32_t const count = pages.hold(page);
        if (count == 1)
        {
            if (anchored(page))
            {
                --numAnchoredCached;
            }
            else
            {
                cached.unlink(page);
            }
        }
        else if (count == 2)
        {
            ++numShared;
        }
    }

    //! Returns the retention priority of `page`: the higher of the two it holds, kDEFAULT_PRIORITY when it holds none.
    int32_t priorityOf(int32_t page) const noexcept
    {
        uint8_t const held = priority[static_cast<size_t>(page)];
        uint8_t const limited = timed[static_cast<size_t>(page)];
        if (limited == kUNSET)
        {
            return held == kUNSET ? kDEFAULT_PRIORITY : held;
        }
        return held == kUNSET ? limited : std::max(held, limited);
    }
    //! Sets the priority of the used `page` to `value` when no holder set one yet or `value` is higher (it is off the
    //! list: nothing moves).
    void raisePriority(int32_t page, int32_t value) noexcept
    {
        uint8_t& stored = priority[static_cast<size_t>(page)];
        if (stored == kUNSET || stored < value)
        {
            stored = static_cast<uint8_t>(value);
        }
    }
    //! Sets the timed priority of the used `page` to `value`, in force until `endMs`, when it has none or a lower one;
    //! an equal one is extended to `endMs` if that is later, and a higher one stays as it is (it is off the list:
    //! nothing moves).
    void raiseTimedPriority(int32_t page, int32_t value, int64_t endMs) noexcept
    {
        uint8_t& stored = timed[static_cast<size_t>(page)];
        if (stored == kUNSET || stored < value)
        {
            stored = static_cast<uint8_t>(value);
            expiries.set(page, endMs);
        }
        else if (stored == value && expiries.timeOf(page) < endMs)
        {
            expiries.set(page, endMs);
        }
    }
    //! Drops the timed priority that ends first; a cached page on the list whose priority that changes moves to its new
    //! level as the newest there. The heap must not be empty.
    void expireFirst() noexcept
    {
        int32_t const page = expiries.top();
        int32_t const before = priorityOf(page);
        expiries.remove(page);
        timed[static_cast<size_t>(page)] = kUNSET;
        if (pages.isKept(page) && !anchored(page) && priorityOf(page) != before)
        {
            cached.unlink(page);
            listNewest(page);
        }
    }
    //! Unsets both priorities of a page that becomes free.
    void unsetPriority(int32_t page) noexcept
    {
        priority[static_cast<size_t>(page)] = kUNSET;
        timed[static_cast<size_t>(page)] = kUNSET;
        expiries.remove(page);
    }
    //! Puts the cached, unanchored `page` on the list as the newest of its priority.
    void listNewest(int32_t page) noexcept
    {
        cached.pushNewest(page, priorityOf(page));
    }
    //! Puts the cached, unanchored `page` on the list before the other pages of its priority.
    void listOldest(int32_t page) noexcept
    {
        cached.pushOldest(page, priorityOf(page));
    }
    //! Takes the page that goes first off the list (the lowest priority's oldest); its priority unset.
    int32_t popOldest() noexcept
    {
        int32_t const page = cached.popOldest();
        unsetPriority(page);
        return page;
    }

    //! Removes a holder from `page`; at none the page becomes cached (newest of its priority on the list, or
    //! anchored) when keep(page) is true, else free (its priority unset).
    template <typename Keep>
    void release(int32_t page, Keep&& keep)
    {
        bool kept = false;
        int32_t const count = pages.releaseIf(page, [&](int32_t last) { return kept = keep(last); });
        if (count == 1)
        {
            --numShared;
        }
        else if (kept)
        {
            if (anchored(page))
            {
                ++numAnchoredCached;
            }
            else
            {
                listNewest(page);
            }
        }
        else if (count == 0)
        {
            unsetPriority(page);
        }
    }
};

} // namespace kvcache::rt
