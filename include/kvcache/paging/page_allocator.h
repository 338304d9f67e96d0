#pragma once

#include "kvcache/core/kv_cache_layout.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! Page ids of one page group: an O(1) free list and a reference count per page. Host only; it never touches device
//! memory and allocates nothing after construction (checkInvariants aside).
//!
//! The free list is a LIFO stack: the most recently freed page is handed out first (its lines are the likeliest to be
//! warm in the caches), and a new allocator hands out 0, 1, 2, ... in order. Every rejected call throws before it
//! changes anything.
//!
//! A page can also be kept: no holder, yet off the free list, so that allocate() never hands it out (a page cache
//! keeps pages whose content may be reused this way, in its own order). hold() gives a kept page a holder again,
//! freeKept() puts it on top of the free list; both O(1). Copyable (a copy is an independent allocator of the same
//! state); a move leaves the source with no pages. Not thread-safe: one owner at a time.
class PageAllocator
{
public:
    //! Returns an allocator of no pages; never throws.
    PageAllocator() noexcept = default;
    //! Returns an allocator of `numPages` free pages, ids [0, numPages); throws InvalidArgumentError naming numPages,
    //! its value and the limit when it is outside [0, kMAX_NUM_PAGES], and std::bad_alloc when memory runs out.
    explicit PageAllocator(int32_t numPages);

    //! Returns a copy of `other`'s state; throws std::bad_alloc when memory runs out.
    PageAllocator(PageAllocator const& other) = default;
    //! Replaces this state by a copy of `other`'s and returns *this; throws std::bad_alloc when memory runs out.
    PageAllocator& operator=(PageAllocator const& other) = default;
    //! Takes `other`'s state, leaving `other` with no pages; never throws.
    PageAllocator(PageAllocator&& other) noexcept;
    //! Takes `other`'s state, leaving `other` with no pages (a self-move changes nothing), and returns *this; never
    //! throws.
    PageAllocator& operator=(PageAllocator&& other) noexcept;
    //! Destroys the allocator; never throws.
    ~PageAllocator() = default;

    //! Returns the number of page ids, [0, numPages); never throws.
    int32_t numPages() const noexcept
    {
        return static_cast<int32_t>(mRefCounts.size());
    }
    //! Returns the number of free pages (reference count 0); never throws.
    int32_t numFree() const noexcept
    {
        return mNumFree;
    }
    //! Returns the number of pages in use (reference count > 0): numPages() - numFree() - numKept(); never throws.
    int32_t numUsed() const noexcept
    {
        return numPages() - mNumFree - mNumKept;
    }
    //! Returns the number of kept pages (no holder, off the free list); never throws.
    int32_t numKept() const noexcept
    {
        return mNumKept;
    }
    //! Returns whether `page` is kept; throws OutOfRangeError for an id outside [0, numPages).
    bool isKept(int32_t page) const
    {
        if (!inRange(page))
        {
            failIndex("PageAllocator::isKept", page);
        }
        return mRefCounts[static_cast<size_t>(page)] == kKEPT;
    }

    //! Adds a holder to `page`, in use or kept (a kept page is in use again), and returns its new reference count.
    //! Throws OutOfRangeError for an id outside [0, numPages) and InvalidArgumentError for a free page or a count at
    //! kMAX_REF_COUNT, changing nothing.
    int32_t hold(int32_t page)
    {
        if (!inRange(page) || mRefCounts[static_cast<size_t>(page)] == 0
            || mRefCounts[static_cast<size_t>(page)] == kMAX_REF_COUNT)
        {
            failRetain(page);
        }
        int32_t& count = mRefCounts[static_cast<size_t>(page)];
        if (count == kKEPT)
        {
            count = 0;
            --mNumKept;
        }
        return ++count;
    }

    //! Removes a holder from `page` and returns its new reference count; at 0 the page is kept when `keep` is true,
    //! else on top of the free list. Throws OutOfRangeError for an id outside [0, numPages) and InvalidArgumentError
    //! for a free or kept page, changing nothing.
    int32_t release(int32_t page, bool keep)
    {
        return releaseIf(page, [keep](int32_t) noexcept { return keep; });
    }
    //! release(page, keep(page)), with `keep` (a callable taking the page id, returning bool) called only when the last
    //! holder lets go, so that a caller's per-page state is read only then.
    template <typename Keep>
    int32_t releaseIf(int32_t page, Keep&& keep)
    {
        if (!inRange(page) || mRefCounts[static_cast<size_t>(page)] <= 0)
        {
            failRelease(page);
        }
        int32_t& count = mRefCounts[static_cast<size_t>(page)];
        if (--count != 0)
        {
            return count;
        }
        if (keep(page))
        {
            count = kKEPT;
            ++mNumKept;
        }
        else
        {
            mFreeStack[static_cast<size_t>(mNumFree)] = page;
            ++mNumFree;
        }
        return 0;
    }

    //! Puts the kept `page` on top of the free list (the next allocate() returns it). Throws OutOfRangeError for an
    //! id outside [0, numPages) and InvalidArgumentError for a page that is not kept, changing nothing.
    void freeKept(int32_t page)
    {
        if (!inRange(page) || mRefCounts[static_cast<size_t>(page)] != kKEPT)
        {
            failFreeKept(page);
        }
        mRefCounts[static_cast<size_t>(page)] = 0;
        --mNumKept;
        mFreeStack[static_cast<size_t>(mNumFree)] = page;
        ++mNumFree;
    }

    //! Returns a free page, now with reference count 1: the most recently freed one. Throws OutOfMemoryError naming the
    //! 1 page needed and the 0 free when every page is in use.
    int32_t allocate()
    {
        if (mNumFree == 0)
        {
            failAllocate(1, false);
        }
        --mNumFree;
        int32_t const page = mFreeStack[static_cast<size_t>(mNumFree)];
        mRefCounts[static_cast<size_t>(page)] = 1;
        return page;
    }

    //! Writes `count` free pages, each now with reference count 1, to `pages[0, count)`: the ids `count` calls of
    //! allocate() would return, in that order. All or nothing: throws OutOfMemoryError naming the pages needed and
    //! the pages free when fewer than `count` are free, and InvalidArgumentError for a negative count or a null
    //! `pages` with count > 0, leaving the allocator unchanged. Zero pages is a no-op.
    void allocate(int32_t count, int32_t* pages)
    {
        if (count < 0 || count > mNumFree || (pages == nullptr && count > 0))
        {
            failAllocate(count, pages == nullptr);
        }
        int32_t const* const top = mFreeStack.data() + mNumFree;
        int32_t* const refCounts = mRefCounts.data();
        for (int32_t i = 0; i < count; ++i)
        {
            int32_t const page = top[-1 - i];
            pages[i] = page;
            refCounts[page] = 1;
        }
        mNumFree -= count;
    }

    //! Adds one to the reference count of `page` (one more sharer). Throws OutOfRangeError for an id outside
    //! [0, numPages) and InvalidArgumentError for a free or kept page or a count already at INT32_MAX, changing
    //! nothing.
    void retain(int32_t page)
    {
        if (!inRange(page) || mRefCounts[static_cast<size_t>(page)] <= 0
            || mRefCounts[static_cast<size_t>(page)] == kMAX_REF_COUNT)
        {
            failRetain(page);
        }
        ++mRefCounts[static_cast<size_t>(page)];
    }

    //! Subtracts one from the reference count of `page`; at 0 the page is free again, on top of the free list.
    //! Throws OutOfRangeError for an id outside [0, numPages) and InvalidArgumentError for a free page (a double
    //! free) or a kept page, changing nothing.
    void release(int32_t page)
    {
        if (!inRange(page) || mRefCounts[static_cast<size_t>(page)] <= 0)
        {
            failRelease(page);
        }
        if (--mRefCounts[static_cast<size_t>(page)] == 0)
        {
            mFreeStack[static_cast<size_t>(mNumFree)] = page;
            ++mNumFree;
        }
    }

    //! Releases each of `pages[0, count)` once, in order (so the last page freed is the next allocated). All or
    //! nothing: every id is checked, a page listed more times than its reference count included, before the call
    //! returns, and a rejected call changes nothing. Throws OutOfRangeError for an id outside [0, numPages),
    //! InvalidArgumentError for a free page, a page listed more times than its count, a negative count or a null
    //! `pages` with count > 0. Zero pages is a no-op.
    void release(int32_t const* pages, int32_t count)
    {
        if (count < 0 || (pages == nullptr && count > 0))
        {
            failReleaseList(pages, count, 0);
        }
        // Locals, so that the compiler need not reload them after each store through an int32_t pointer.
        int32_t* const refCounts = mRefCounts.data();
        int32_t* const freeStack = mFreeStack.data();
        uint32_t const numPages = static_cast<uint32_t>(mRefCounts.size());
        int32_t numFree = mNumFree;
        for (int32_t i = 0; i < count; ++i)
        {
            int32_t const page = pages[i];
            if (static_cast<uint32_t>(page) >= numPages || refCounts[page] <= 0)
            {
                mNumFree = numFree;
                failReleaseList(pages, count, i);
            }
            if (--refCounts[page] == 0)
            {
                freeStack[numFree] = page;
                ++numFree;
            }
        }
        mNumFree = numFree;
    }

    //! Returns the reference count of `page`, 0 for a free or kept page; throws OutOfRangeError for an id outside
    //! [0, numPages).
    int32_t refCount(int32_t page) const
    {
        if (!inRange(page))
        {
            failIndex("PageAllocator::refCount", page);
        }
        int32_t const count = mRefCounts[static_cast<size_t>(page)];
        return count < 0 ? 0 : count;
    }

    //! Returns normally when the state is consistent; throws std::logic_error describing the first broken invariant:
    //! free pages have count 0 and appear once in the free list; used pages have count > 0; kept pages are off the
    //! free list and counted in numKept; numFree + numUsed + numKept == numPages. Linear time; allocates a scratch
    //! bitmap of numPages bits (std::bad_alloc when memory runs out).
    void checkInvariants() const;

    //! The largest reference count a page can have.
    static constexpr int32_t kMAX_REF_COUNT = INT32_MAX;

private:
    //! Returns whether `page` is an id of this allocator.
    bool inRange(int32_t page) const noexcept
    {
        return static_cast<uint32_t>(page) < static_cast<uint32_t>(mRefCounts.size());
    }
    //! Throws InvalidArgumentError or OutOfMemoryError for allocating `count` pages into a list that may be null.
    [[noreturn]] void failAllocate(int32_t count, bool nullList) const;
    //! Throws OutOfRangeError or InvalidArgumentError for retaining `page`.
    [[noreturn]] void failRetain(int32_t page) const;
    //! Throws OutOfRangeError or InvalidArgumentError for releasing `page`.
    [[noreturn]] void failRelease(int32_t page) const;
    //! Undoes the release of `pages[0, failed)`, then throws the error of `pages[failed]` (or of `pages` and `count`).
    [[noreturn]] void failReleaseList(int32_t const* pages, int32_t count, int32_t failed);
    //! Throws OutOfRangeError or InvalidArgumentError for freeing `page` from the kept pages.
    [[noreturn]] void failFreeKept(int32_t page) const;
    //! Throws OutOfRangeError naming `what`, `page` and the id range.
    [[noreturn]] void failIndex(char const* what, int32_t page) const;

    //! The stored count of a kept page.
    static constexpr int32_t kKEPT = -1;

    //! Reference count per page id; 0 means free, kKEPT kept.
    std::vector<int32_t> mRefCounts;
    //! The free list: ids [0, mNumFree) are free, the top (most recently freed) last; sized numPages at construction.
    std::vector<int32_t> mFreeStack;
    int32_t mNumFree = 0;
    int32_t mNumKept = 0;
};

} // namespace kvcache::rt
