#pragma once

#include "paging/parts/cached_page_list.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! Which kept prefix boundary goes first: the one eviction rule of what a PageManager keeps at a boundary (a state
//! checkpoint, a hybrid cache's window cut), so that what gets hit stays and what is made and never hit goes.
//!
//! Entries are ids in [0, numIds) on a ring with a hand (a clock with hit counts, GCLOCK): an entry joins behind the
//! hand, so the hand reaches it last; a hit raises its count (at most kMAX_HITS); to choose an entry, the hand lowers
//! a positive count and passes on, and stops at the first entry at 0. Beside the ring, the entries never hit since
//! they were made are kept in the order made: while there are more of them than a target, the oldest goes instead,
//! and the hand does not move. The target adapts to what was dropped too soon: the owner (KeptBoundaries) remembers,
//! while a dropped entry's key lasts, whether it had been hit, and says so when the same boundary is made again. One
//! never hit raises the target by one (entries needed more time than the target gave them), one that had been hit
//! lowers it below the entries never hit (they took the room of those that get hit); a boundary made again joins as if
//! it had been hit. So a workload whose boundaries are made once and never hit (prompts with one-off endings) keeps few
//! of them and loses none of those that get hit, and one whose boundaries come back after a while (repeated prompts) is
//! served by the clock alone. Entries the owner calls busy are passed over. O(1) add, remove and hit; nothing allocated
//! after construction.
class HitClock
{
public:
    //! An entry's count after a hit is min(count + 1, kMAX_HITS).
    static constexpr int32_t kMAX_HITS = 3;
    //! Marks the end of the ring and a choice that found nothing.
    static constexpr int32_t kNONE = CachedPageList::kNONE;

    //! What the owner remembers of the last entry dropped for a boundary, while it can: nothing, an entry never hit,
    //! or one that had been hit (or made again). choose() tells which; the owner forgets it when the key goes.
    enum class Dropped : uint8_t
    {
        kNOTHING = 0,
        kNEVER_HIT = 1,
        kHIT = 2,
    };

    //! Returns an empty clock for ids [0, numIds), its target at numIds; throws std::bad_alloc.
    explicit HitClock(int32_t numIds = 0)
        : mRing(numIds)
        , mNeverHit(numIds)
        , mNew(static_cast<size_t>(numIds), 0)
        , mHits(static_cast<size_t>(numIds), 0)
        , mNumIds(numIds)
        , mTarget(numIds)
    {
    }

    //! Returns the number of entries.
    int32_t size() const noexcept
    {
        return mRing.size();
    }
    //! Returns the number of entries never hit since they were made.
    int32_t numNeverHit() const noexcept
    {
        return mNeverHit.size();
    }
    //! Returns the most entries never hit that are kept before the oldest of them goes first, in [0, numIds].
    int32_t target() const noexcept
    {
        return mTarget;
    }
    //! Returns the count of `id` (0 for an id not in the clock).
    int32_t hits(int32_t id) const noexcept
    {
        return mHits[static_cast<size_t>(id)];
    }
    //! Returns whether entry `id`, in the clock, was never hit since it was made.
    bool neverHit(int32_t id) const noexcept
    {
        return mNew[static_cast<size_t>(id)] != 0;
    }
    //! The ring from the hand on: returns the entry at the hand, or kNONE when there is none.
    int32_t first() const noexcept
    {
        return mRing.oldest();
    }
    //! Returns the entry the hand reaches after `id`, or kNONE after the last.
    int32_t next(int32_t id) const noexcept
    {
        return mRing.next(id);
    }
    //! Returns the entry the hand reaches before `id`, or kNONE before the first.
    int32_t previous(int32_t id) const noexcept
    {
        return mRing.previous(id);
    }
    //! Returns the entry the hand reaches last, or kNONE when there is none.
    int32_t last() const noexcept
    {
        return mRing.newest();
    }
    //! The entries never hit, oldest first: returns the first, or kNONE.
    int32_t firstNeverHit() const noexcept
    {
        return mNeverHit.oldest();
    }
    //! Returns the entry never hit made after `id`, or kNONE.
    int32_t nextNeverHit(int32_t id) const noexcept
    {
        return mNeverHit.next(id);
    }

    //! Adds `id`, which must not be in the clock, behind the hand with a count of 0: never hit, or, when the same
    //! boundary was dropped before (`dropped`), as if hit, the target adapting.
    void add(int32_t id, Dropped dropped = Dropped::kNOTHING) noexcept
    {
        mHits[static_cast<size_t>(id)] = 0;
        mRing.pushNewest(id);
        if (dropped == Dropped::kNOTHING)
        {
            mNew[static_cast<size_t>(id)] = 1;
            mNeverHit.pushNewest(id);
            return;
        }
        mTarget = dropped == Dropped::kNEVER_HIT ? std::min(mTarget + 1, mNumIds)
                                                 : std::max(std::min(mTarget, numNeverHit()) - 1, 0);
    }
    //! Removes `id`, which must be in the clock.
    void remove(int32_t id) noexcept
    {
        mRing.unlink(id);
        if (neverHit(id))
        {
            mNeverHit.unlink(id);
            mNew[static_cast<size_t>(id)] = 0;
        }
        mHits[static_cast<size_t>(id)] = 0;
    }
    //! Counts a hit on `id`, which must be in the clock.
    void hit(int32_t id) noexcept
    {
        if (neverHit(id))
        {
            mNeverHit.unlink(id);
            mNew[static_cast<size_t>(id)] = 0;
        }
        int32_t& count = mHits[static_cast<size_t>(id)];
        count = std::min(count + 1, kMAX_HITS);
    }

    //! Returns the entry to let go as the class comment says (it stays in the clock: the owner notes neverHit() and
    //! removes it), or kNONE when every entry is busy or there is none. `busy(id)` may be called for any entry.
    template <typename Busy>
    int32_t choose(Busy&& busy) noexcept
    {
        if (numNeverHit() > mTarget)
        {
            for (int32_t id = mNeverHit.oldest(); id != kNONE; id = mNeverHit.next(id))
            {
                if (!busy(id))
                {
                    return id;
                }
            }
        }
        // Each turn lowers every count the hand passes: kMAX_HITS + 1 turns bring any entry that is not busy to 0.
        int64_t const steps = int64_t{size()} * (kMAX_HITS + 1);
        for (int64_t step = 0; step < steps; ++step)
        {
            int32_t const id = mRing.popOldest();
            mRing.pushNewest(id);
            if (busy(id))
            {
                continue;
            }
            int32_t& count = mHits[static_cast<size_t>(id)];
            if (count > 0)
            {
                --count;
                continue;
            }
            return id;
        }
        return kNONE;
    }

private:
    //! Every entry, from the hand on.
    CachedPageList mRing;
    //! The entries never hit, oldest first, and per id whether it is one.
    CachedPageList mNeverHit;
    std::vector<uint8_t> mNew;
    std::vector<int32_t> mHits;
    int32_t mNumIds = 0;
    int32_t mTarget = 0;
};

} // namespace kvcache::rt
