#pragma once

#include "paging/parts/boundaries/kept_boundaries.h"

#include "kvcache/paging/page_hash.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! The state checkpoints of a layout with state layers and checkpoint slots (prefix caching on): the data; the
//! operations are PageManager::State's (page_manager_checkpoints.cpp).
//!
//! A prefix of k whole pages is adoptable only when a state slot holds the recurrent state after its token
//! k * tokensPerPage. A checkpoint is that slot, keyed by the hash of the prefix's page k - 1 (which chains the whole
//! prefix and its salt) and carried by the page registered under that hash in the carrier group (the first
//! full-attention group, else group 0): evicting the carrier page drops the checkpoint, since the prefix is gone.
//! Empty slots are taken first; then slots are reused in the order that every kept boundary shares (KeptBoundaries):
//! checkpoints never restored first, oldest first, then a clock with hit counts, so a checkpoint that is hit outlives
//! many that are made and never hit.
struct StateCheckpoints
{
    struct Slot
    {
        //! The prefix's length in pages; 0 when the slot holds no checkpoint.
        int32_t pages = 0;
        //! The hash of the prefix's last page.
        PageHash hash = {};
        //! The carrier group's page registered under `hash`.
        int32_t carrier = -1;
        //! Whether a queued copy fills the slot (its save, not handed out by a step yet): not adoptable until then.
        bool filling = false;
        //! Queued copies that read the slot (restores, and forks of a sequence waiting for one).
        int32_t reads = 0;
    };

    //! The group whose pages carry checkpoints; -1 when there are none (no state layers, no checkpoint slots or no
    //! prefix caching).
    int32_t carrierGroup = -1;
    //! The state slot of checkpoint 0 (the layout's maxBatchSize): checkpoint c is state slot firstSlot + c.
    int32_t firstSlot = 0;
    //! Save a checkpoint every this many pages (PageManagerOptions::checkpointIntervalPages); 0: off.
    int32_t intervalPages = 0;
    std::vector<Slot> slots;
    //! Per page of carrierGroup: the checkpoint it carries, -1 for none.
    std::vector<int32_t> byCarrier;
    //! The slots that hold a checkpoint, carried by pages of carrierGroup: a restore counts a hit, and the clock
    //! chooses the slot to reuse among those no queued copy reads or fills.
    KeptBoundaries kept;
    //! Checkpoints held (slots with pages > 0).
    int32_t held = 0;
    int64_t saved = 0;
    int64_t restored = 0;
    int64_t dropped = 0;

    bool enabled() const noexcept
    {
        return carrierGroup >= 0;
    }
    int32_t size() const noexcept
    {
        return static_cast<int32_t>(slots.size());
    }
    //! Returns the checkpoint of state slot `slot`, or -1 when it is a sequence's.
    int32_t indexOfSlot(int32_t slot) const noexcept
    {
        int32_t const index = slot - firstSlot;
        return index >= 0 && index < size() ? index : -1;
    }
    //! Returns whether checkpoint `index` may be adopted now.
    bool adoptable(int32_t index) const noexcept
    {
        Slot const& slot = slots[static_cast<size_t>(index)];
        return slot.pages > 0 && !slot.filling;
    }
};

} // namespace kvcache::rt
