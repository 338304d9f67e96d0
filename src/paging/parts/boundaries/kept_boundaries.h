#pragma once

#include "paging/parts/boundaries/hit_clock.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! What a PageManager keeps at prefix boundaries of one kind beside the pages (a hybrid cache's window cuts, state
//! checkpoints), as far as choosing which goes: each boundary is an id (a cut's carrier page, a checkpoint's slot)
//! carried by a page of the carrier group (the page registered under the hash of the boundary's last page). The
//! HitClock chooses which goes; what it dropped at a carrier page is remembered there until the page is evicted, so
//! that the clock learns when the same boundary is made again. One kind's ids and carrier pages, the owner's
//! bookkeeping (windows, slots) apart. Nothing allocated after construction.
class KeptBoundaries
{
public:
    //! Returns an empty set for ids [0, numIds) carried by pages [0, numCarrierPages); throws std::bad_alloc.
    KeptBoundaries(int32_t numIds = 0, int32_t numCarrierPages = 0)
        : mClock(numIds)
        , mDroppedAt(static_cast<size_t>(numCarrierPages), HitClock::Dropped::kNOTHING)
    {
    }

    //! The clock, for the owner's invariant checks.
    HitClock const& clock() const noexcept
    {
        return mClock;
    }
    //! Returns the number of boundaries kept.
    int32_t size() const noexcept
    {
        return mClock.size();
    }
    //! Returns whether what the clock dropped at carrier page `page` is remembered.
    bool remembersDrop(int32_t page) const noexcept
    {
        return mDroppedAt[static_cast<size_t>(page)] != HitClock::Dropped::kNOTHING;
    }

    //! Adds boundary `id`, not kept, carried by `carrier`: made again when the clock dropped one there before.
    void add(int32_t id, int32_t carrier) noexcept
    {
        HitClock::Dropped& dropped = mDroppedAt[static_cast<size_t>(carrier)];
        mClock.add(id, dropped);
        dropped = HitClock::Dropped::kNOTHING;
    }
    //! Counts a hit on boundary `id`, kept.
    void hit(int32_t id) noexcept
    {
        mClock.hit(id);
    }
    //! Removes boundary `id`, kept (its carrier page evicted, or the clock's choice).
    void remove(int32_t id) noexcept
    {
        mClock.remove(id);
    }
    //! Returns the boundary the clock lets go (HitClock::choose with `busy`), remembering at its carrier page
    //! (`carrierOf(id)`) whether it was hit; it stays kept until the owner removes it. kNONE when every one is busy.
    template <typename Busy, typename CarrierOf>
    int32_t choose(Busy&& busy, CarrierOf&& carrierOf) noexcept
    {
        int32_t const id = mClock.choose(busy);
        if (id != HitClock::kNONE)
        {
            mDroppedAt[static_cast<size_t>(carrierOf(id))] =
                mClock.neverHit(id) ? HitClock::Dropped::kNEVER_HIT : HitClock::Dropped::kHIT;
        }
        return id;
    }
    //! Forgets what was dropped at carrier page `page`, whose content goes: a boundary made there later is another.
    void carrierEvicted(int32_t page) noexcept
    {
        mDroppedAt[static_cast<size_t>(page)] = HitClock::Dropped::kNOTHING;
    }

private:
    HitClock mClock;
    std::vector<HitClock::Dropped> mDroppedAt;
};

} // namespace kvcache::rt
