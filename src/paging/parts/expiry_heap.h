#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! A binary min-heap of ids [0, numIds), each at most once, ordered by a 64-bit time and then by id, with the position
//! of every id kept so that an id's time can change and an id can leave in O(log n). Sized at construction: nothing
//! is allocated afterwards. The retention durations of a page pool use it (page_pool.h), one id a page.
class ExpiryHeap
{
public:
    //! Marks an id that is not in the heap.
    static constexpr int32_t kABSENT = -1;

    //! Returns an empty heap for ids [0, numIds); throws std::bad_alloc.
    explicit ExpiryHeap(int32_t numIds = 0)
        : mHeap(static_cast<size_t>(numIds), 0)
        , mTime(static_cast<size_t>(numIds), 0)
        , mPosition(static_cast<size_t>(numIds), kABSENT)
    {
    }

    bool empty() const noexcept
    {
        return mSize == 0;
    }
    int32_t size() const noexcept
    {
        return mSize;
    }
    bool contains(int32_t id) const noexcept
    {
        return mPosition[static_cast<size_t>(id)] != kABSENT;
    }
    //! Returns the time of `id`, which is in the heap.
    int64_t timeOf(int32_t id) const noexcept
    {
        return mTime[static_cast<size_t>(id)];
    }
    //! Returns the id of the earliest time (the lowest id among equal times); the heap must not be empty.
    int32_t top() const noexcept
    {
        return mHeap[0];
    }

    //! Puts `id` in the heap at `time`, or moves it there when it is in already.
    void set(int32_t id, int64_t time) noexcept
    {
        mTime[static_cast<size_t>(id)] = time;
        int32_t position = mPosition[static_cast<size_t>(id)];
        if (position == kABSENT)
        {
            position = mSize++;
            place(position, id);
        }
        up(position);
        down(mPosition[static_cast<size_t>(id)]);
    }
    //! Takes `id` out of the heap; nothing when it is not in.
    void remove(int32_t id) noexcept
    {
        int32_t const position = mPosition[static_cast<size_t>(id)];
        if (position == kABSENT)
        {
            return;
        }
        mPosition[static_cast<size_t>(id)] = kABSENT;
        int32_t const last = mHeap[static_cast<size_t>(--mSize)];
        if (position != mSize)
        {
            place(position, last);
            up(position);
            down(mPosition[static_cast<size_t>(last)]);
        }
    }

private:
    bool before(int32_t a, int32_t b) const noexcept
    {
        int64_t const ta = mTime[static_cast<size_t>(a)];
        int64_t const tb = mTime[static_cast<size_t>(b)];
        return ta < tb || (ta == tb && a < b);
    }
    void place(int32_t position, int32_t id) noexcept
    {
        mHeap[static_cast<size_t>(position)] = id;
        mPosition[static_cast<size_t>(id)] = position;
    }
    void up(int32_t position) noexcept
    {
        int32_t const id = mHeap[static_cast<size_t>(position)];
        while (position > 0)
        {
            int32_t const parent = (position - 1) / 2;
            int32_t const above = mHeap[static_cast<size_t>(parent)];
            if (!before(id, above))
            {
                break;
            }
            place(position, above);
            position = parent;
        }
        place(position, id);
    }
    void down(int32_t position) noexcept
    {
        int32_t const id = mHeap[static_cast<size_t>(position)];
        while (true)
        {
            int32_t child = 2 * position + 1;
            if (child >= mSize)
            {
                break;
            }
            if (child + 1 < mSize && before(mHeap[static_cast<size_t>(child + 1)], mHeap[static_cast<size_t>(child)]))
            {
                ++child;
            }
            int32_t const below = mHeap[static_cast<size_t>(child)];
            if (!before(below, id))
            {
                break;
            }
            place(position, below);
            position = child;
        }
        place(position, id);
    }

    std::vector<int32_t> mHeap;
    std::vector<int64_t> mTime;
    std::vector<int32_t> mPosition;
    int32_t mSize = 0;
};

} // namespace kvcache::rt
