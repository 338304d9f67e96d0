#pragma once

#include "paging/parts/cached_page_list.h"

#include "kvcache/paging/page_allocator.h"

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
struct PagePool
{
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

    PagePool() = default;
    //! Returns a pool of `numPages` free pages; throws std::bad_alloc.
    explicit PagePool(int32_t numPages)
        : pages(numPages)
        , cached(numPages)
        , scratch(static_cast<size_t>(numPages), 0)
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

    //! Removes a holder from `page`; at none the page becomes cached (newest on the list, or anchored) when keep(page)
    //! is true, else free.
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
                cached.pushNewest(page);
            }
        }
    }
};

} // namespace kvcache::rt
