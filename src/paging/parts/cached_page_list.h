#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! The cached pages of one page group in release order (oldest first), as an intrusive doubly linked list over page
//! ids: O(1) push, unlink and pop of the oldest, nothing allocated after construction. A page is in the list or not;
//! the list does not check which (its owner knows). The cuts of a hybrid cache (prefix_cuts.h) use one too, over the
//! full-attention pages that carry a cut, least recently made first.
class CachedPageList
{
public:
    //! Marks the end of the list and a page in no list.
    static constexpr int32_t kNONE = -1;

    //! Returns an empty list for page ids [0, numPages) (none by default); throws std::bad_alloc.
    explicit CachedPageList(int32_t numPages = 0)
        : mPrev(static_cast<size_t>(numPages), kNONE)
        , mNext(mPrev)
    {
    }

    //! Returns the number of pages in the list.
    int32_t size() const noexcept
    {
        return mSize;
    }
    //! Returns the oldest page, or kNONE when the list is empty.
    int32_t oldest() const noexcept
    {
        return mHead;
    }
    //! Returns the page after `page` (newer), or kNONE.
    int32_t next(int32_t page) const noexcept
    {
        return mNext[static_cast<size_t>(page)];
    }
    //! Returns the page before `page` (older), or kNONE.
    int32_t previous(int32_t page) const noexcept
    {
        return mPrev[static_cast<size_t>(page)];
    }
    //! Returns the newest page, or kNONE when the list is empty.
    int32_t newest() const noexcept
    {
        return mTail;
    }

    //! Appends `page`, which must not be in the list, as the newest.
    void pushNewest(int32_t page) noexcept
    {
        mPrev[static_cast<size_t>(page)] = mTail;
        mNext[static_cast<size_t>(page)] = kNONE;
        (mTail == kNONE ? mHead : mNext[static_cast<size_t>(mTail)]) = page;
        mTail = page;
        ++mSize;
    }

    //! Puts `page`, which must not be in the list, before every other page: it is evicted next.
    void pushOldest(int32_t page) noexcept
    {
        mPrev[static_cast<size_t>(page)] = kNONE;
        mNext[static_cast<size_t>(page)] = mHead;
        (mHead == kNONE ? mTail : mPrev[static_cast<size_t>(mHead)]) = page;
        mHead = page;
        ++mSize;
    }

    //! Removes `page`, which must be in the list.
    void unlink(int32_t page) noexcept
    {
        int32_t const prev = mPrev[static_cast<size_t>(page)];
        int32_t const next = mNext[static_cast<size_t>(page)];
        (prev == kNONE ? mHead : mNext[static_cast<size_t>(prev)]) = next;
        (next == kNONE ? mTail : mPrev[static_cast<size_t>(next)]) = prev;
        mPrev[static_cast<size_t>(page)] = kNONE;
        mNext[static_cast<size_t>(page)] = kNONE;
        --mSize;
    }

    //! Removes and returns the oldest page; the list must not be empty.
    int32_t popOldest() noexcept
    {
        int32_t const page = mHead;
        unlink(page);
        return page;
    }

private:
    std::vector<int32_t> mPrev;
    std::vector<int32_t> mNext;
    int32_t mHead = kNONE;
    int32_t mTail = kNONE;
    int32_t mSize = 0;
};

} // namespace kvcache::rt
