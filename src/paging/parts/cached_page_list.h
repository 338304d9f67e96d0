#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! The cached pages of one page group in eviction order, as intrusive doubly linked lists over page ids, one per
//! level (a retention priority), each in release order (oldest first): the whole order is level 0's list, then level
//! 1's, and so on. O(1) push, unlink and pop of the oldest (a bit scan finds the lowest level in use), nothing
//! allocated after construction. A page is in the list or not; the list does not check which (its owner knows). The
//! clock of kept prefix boundaries (hit_clock.h) uses two of a single level over its own ids.
class CachedPageList
{
public:
    //! Marks the end of the list and a page in no list.
    static constexpr int32_t kNONE = -1;
    //! The most levels a list can have.
    static constexpr int32_t kMAX_LEVELS = 128;

    //! Returns an empty list for page ids [0, numPages) (none by default) with levels [0, numLevels), numLevels in
    //! [1, kMAX_LEVELS]; throws std::bad_alloc.
    explicit CachedPageList(int32_t numPages = 0, int32_t numLevels = 1)
        : mPrev(static_cast<size_t>(numPages), kNONE)
        , mNext(static_cast<size_t>(numPages), kNONE)
        , mLevel(static_cast<size_t>(numPages), 0)
        , mHead(static_cast<size_t>(numLevels), kNONE)
        , mTail(static_cast<size_t>(numLevels), kNONE)
    {
    }

    //! Returns the number of pages in the list.
    int32_t size() const noexcept
    {
        return mSize;
    }
    //! Returns the oldest page of the lowest level, or kNONE when the list is empty.
    int32_t oldest() const noexcept
    {
        int32_t const level = lowestFrom(0);
        return level < 0 ? kNONE : mHead[static_cast<size_t>(level)];
    }
    //! Returns the page after `page` (newer, or the oldest of the next level in use), or kNONE.
    int32_t next(int32_t page) const noexcept
    {
        int32_t const after = mNext[static_cast<size_t>(page)];
        if (after != kNONE)
        {
            return after;
        }
        int32_t const level = lowestFrom(mLevel[static_cast<size_t>(page)] + 1);
        return level < 0 ? kNONE : mHead[static_cast<size_t>(level)];
    }
    //! Returns the page before `page` (older, or the newest of the previous level in use), or kNONE.
    int32_t previous(int32_t page) const noexcept
    {
        int32_t const before = mPrev[static_cast<size_t>(page)];
        if (before != kNONE)
        {
            return before;
        }
        int32_t const level = highestBelow(mLevel[static_cast<size_t>(page)]);
        return level < 0 ? kNONE : mTail[static_cast<size_t>(level)];
    }
    //! Returns the newest page of the highest level, or kNONE when the list is empty.
    int32_t newest() const noexcept
    {
        int32_t const level = highestBelow(static_cast<int32_t>(mHead.size()));
        return level < 0 ? kNONE : mTail[static_cast<size_t>(level)];
    }
    //! Returns the oldest page of `level`, or kNONE when the level has none.
    int32_t oldestAt(int32_t level) const noexcept
    {
        return mHead[static_cast<size_t>(level)];
    }
    //! Returns the level of `page` (meaningful while it is in the list).
    int32_t level(int32_t page) const noexcept
    {
        return mLevel[static_cast<size_t>(page)];
    }

    //! Appends `page`, which must not be in the list, as the newest of `level`.
    void pushNewest(int32_t page, int32_t level = 0) noexcept
    {
        size_t const l = static_cast<size_t>(level);
        mLevel[static_cast<size_t>(page)] = static_cast<uint8_t>(level);
        mPrev[static_cast<size_t>(page)] = mTail[l];
        mNext[static_cast<size_t>(page)] = kNONE;
        (mTail[l] == kNONE ? mHead[l] : mNext[static_cast<size_t>(mTail[l])]) = page;
        mTail[l] = page;
        mark(level);
        ++mSize;
    }

    //! Puts `page`, which must not be in the list, before every other page of `level`: it is the level's next to go.
    void pushOldest(int32_t page, int32_t level = 0) noexcept
    {
        size_t const l = static_cast<size_t>(level);
        mLevel[static_cast<size_t>(page)] = static_cast<uint8_t>(level);
        mPrev[static_cast<size_t>(page)] = kNONE;
        mNext[static_cast<size_t>(page)] = mHead[l];
        (mHead[l] == kNONE ? mTail[l] : mPrev[static_cast<size_t>(mHead[l])]) = page;
        mHead[l] = page;
        mark(level);
        ++mSize;
    }

    //! Removes `page`, which must be in the list.
    void unlink(int32_t page) noexcept
    {
        int32_t const level = mLevel[static_cast<size_t>(page)];
        size_t const l = static_cast<size_t>(level);
        int32_t const prev = mPrev[static_cast<size_t>(page)];
        int32_t const next = mNext[static_cast<size_t>(page)];
        (prev == kNONE ? mHead[l] : mNext[static_cast<size_t>(prev)]) = next;
        (next == kNONE ? mTail[l] : mPrev[static_cast<size_t>(next)]) = prev;
        mPrev[static_cast<size_t>(page)] = kNONE;
        mNext[static_cast<size_t>(page)] = kNONE;
        if (mHead[l] == kNONE)
        {
            mInUse[l >> 6] &= ~(uint64_t{1} << (l & 63));
        }
        --mSize;
    }

    //! Removes and returns the oldest page of the lowest level; the list must not be empty.
    int32_t popOldest() noexcept
    {
        int32_t const page = oldest();
        unlink(page);
        return page;
    }

private:
    void mark(int32_t level) noexcept
    {
        mInUse[static_cast<size_t>(level) >> 6] |= uint64_t{1} << (level & 63);
    }
    //! Returns the lowest level >= `from` with a page, or -1.
    int32_t lowestFrom(int32_t from) const noexcept
    {
        for (int32_t word = from >> 6; word < 2; ++word)
        {
            uint64_t bits = mInUse[static_cast<size_t>(word)];
            if (word == from >> 6)
            {
                bits &= ~uint64_t{0} << (from & 63);
            }
            if (bits != 0)
            {
                return word * 64 + __builtin_ctzll(bits);
            }
        }
        return -1;
    }
    //! Returns the highest level < `below` with a page, or -1.
    int32_t highestBelow(int32_t below) const noexcept
    {
        for (int32_t word = (below - 1) >> 6; word >= 0; --word)
        {
            uint64_t bits = mInUse[static_cast<size_t>(word)];
            if (word == (below - 1) >> 6 && ((below - 1) & 63) != 63)
            {
                bits &= (uint64_t{1} << ((below - 1) & 63) << 1) - 1;
            }
            if (bits != 0)
            {
                return word * 64 + 63 - __builtin_clzll(bits);
            }
        }
        return -1;
    }

    std::vector<int32_t> mPrev;
    std::vector<int32_t> mNext;
    std::vector<uint8_t> mLevel;
    //! Per level, its oldest and newest page.
    std::vector<int32_t> mHead;
    std::vector<int32_t> mTail;
    //! Bit l set: level l has a page.
    uint64_t mInUse[2] = {0, 0};
    int32_t mSize = 0;
};

} // namespace kvcache::rt
