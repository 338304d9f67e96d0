#pragma once

#include "kvcache/paging/page_hash.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! Open-addressing map from page hash to page id, sized once: linear probing over a power-of-two table at most half
//! full, deletion by backward shift (no tombstones, so lookups stay short however long the cache churns).
class PageHashTable
{
public:
    //! Returned by find() for a hash not in the table.
    static constexpr int32_t kNONE_PAGE = -1;

    PageHashTable() = default;
    explicit PageHashTable(int32_t maxEntries)
    {
        size_t capacity = 16;
        while (capacity < static_cast<size_t>(maxEntries) * 2)
        {
            capacity *= 2;
        }
        mSlots.assign(capacity, Slot{});
        mMask = capacity - 1;
    }

    //! Returns the page registered under `hash`, or kNONE_PAGE.
    int32_t find(PageHash hash) const noexcept
    {
        for (size_t i = home(hash);; i = (i + 1) & mMask)
        {
            Slot const& slot = mSlots[i];
            if (slot.page == kNONE_PAGE)
            {
                return kNONE_PAGE;
            }
            if (slot.hash == hash)
            {
                return slot.page;
            }
        }
    }

    //! Registers `page` under `hash` unless the hash is present; returns whether it registered (one probe run).
    bool insertIfAbsent(PageHash hash, int32_t page) noexcept
    {
        size_t i = home(hash);
        for (; mSlots[i].page != kNONE_PAGE; i = (i + 1) & mMask)
        {
            if (mSlots[i].hash == hash)
            {
                return false;
            }
        }
        mSlots[i] = Slot{hash, page};
        ++mSize;
        return true;
    }

    //! Starts loading the slot where a lookup of `hash` begins, so that lookups of a batch of hashes overlap.
    void prefetch(PageHash hash) const noexcept
    {
        __builtin_prefetch(&mSlots[home(hash)]);
    }

    //! Removes `hash`, which must be present.
    void erase(PageHash hash) noexcept
    {
        size_t i = home(hash);
        while (!(mSlots[i].hash == hash && mSlots[i].page != kNONE_PAGE))
        {
            i = (i + 1) & mMask;
        }
        // Backward shift: move later entries of the probe run into the hole when their home allows it.
        size_t hole = i;
        for (size_t j = (i + 1) & mMask; mSlots[j].page != kNONE_PAGE; j = (j + 1) & mMask)
        {
            size_t const want = home(mSlots[j].hash);
            bool const movable = hole <= j ? (want <= hole || want > j) : (want <= hole && want > j);
            if (movable)
            {
                mSlots[hole] = mSlots[j];
                hole = j;
            }
        }
        mSlots[hole] = Slot{};
        --mSize;
    }

    //! Returns the number of hashes in the table.
    int32_t size() const noexcept
    {
        return mSize;
    }

private:
    struct Slot
    {
        PageHash hash = {};
        int32_t page = kNONE_PAGE;
    };
    size_t home(PageHash hash) const noexcept
    {
        return static_cast<size_t>(hash.lo ^ (hash.hi >> 17)) & mMask;
    }

    std::vector<Slot> mSlots;
    size_t mMask = 0;
    int32_t mSize = 0;
};

} // namespace kvcache::rt
