#pragma once

#include "paging/cached_page_list.h"

#include "kvcache/paging/page_allocator.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! The pages of one page group: a PageAllocator (free pages and holders; a cached page is parked there) and the list
//! of cached pages beside it, oldest first. Every page is free, used or cached. Whether a page is cached on release is
//! the caller's choice (the prefix cache knows which pages are registered); evicting, too.
struct PagePool
{
    PageAllocator pages;
    CachedPageList cached;
    //! Used pages with more than one holder.
    int32_t numShared = 0;
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

    //! Returns the pages a holder can take now: free, else cached (evicting them).
    int64_t available() const noexcept
    {
        return int64_t{pages.numFree()} + cached.size();
    }
    //! Returns the reference count of a page (0 for free or cached ones) without a range check.
    int32_t holders(int32_t page) const noexcept
    {
        return pages.refCount(page);
    }

    //! Adds a holder to a used or cached page (a cached page leaves the list).
    void hold(int32_t page)
    {
        // Free pages are refused, so a count of 1 now means the page was cached (parked).
        int32_t const count = pages.hold(page);
        if (count == 1)
        {
            cached.unlink(page);
        }
        else if (count == 2)
        {
            ++numShared;
        }
    }

    //! Removes a holder from `page`; at none the page becomes cached (newest) when keep(page) is true, else free.
    template <typename Keep>
    void letGo(int32_t page, Keep&& keep)
    {
        bool kept = false;
        int32_t const count = pages.letGoIf(page, [&](int32_t last) { return kept = keep(last); });
        if (count == 1)
        {
            --numShared;
        }
        else if (kept)
        {
            cached.pushNewest(page);
        }
    }
};

} // namespace kvcache::rt
