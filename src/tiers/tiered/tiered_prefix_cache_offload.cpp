// TieredPrefixCache's offload: evictions the manager's callback recorded go to the host tier once the manager's call
// returned; host pages a full host tier gives up go to the disk tier first, and the host states of checkpoints follow
// their pages. Host only: transfers go through a TierMover.
#include "tiers/tiered/tiered_prefix_cache_core.h"

#include "kvcache/core/errors.h"

#include <algorithm>

namespace kvcache::rt::detail
{

void TieredPrefixCacheCore::recordEviction(int32_t group, int32_t page, PageHash hash) noexcept
{
    // The manager gives only its own groups and pages; the checks keep a broken promise from writing out of bounds.
    if (group < 0 || group >= numGroups())
    {
        return;
    }
    Group& state = mGroups[static_cast<size_t>(group)];
    if (page < 0 || static_cast<size_t>(page) >= state.pendingIndex.size())
    {
        return;
    }
    int32_t& index = state.pendingIndex[static_cast<size_t>(page)];
    if (PageManagerInternal::evictedPriority(*mPages) < mMinOffloadPriority)
    {
        if (index >= 0)
        {
            // The older record's bytes are gone and these are not to be kept: the record goes, the others keep their
            // order (the oldest are dropped first when the host is short).
            state.pending.erase(state.pending.begin() + index);
            for (size_t i = static_cast<size_t>(index); i < state.pending.size(); ++i)
            {
                state.pendingIndex[static_cast<size_t>(state.pending[i].page)] = static_cast<int32_t>(i);
            }
            index = -1;
        }
        return;
    }
    if (index >= 0)
    {
        // Evicted again before an offload (a direct evictCached, then a step that bypassed this class): the older
        // bytes are gone, the page holds those of `hash`.
        state.pending[static_cast<size_t>(index)].hash = hash;
        state.pending[static_cast<size_t>(index)].stateSlot = PageManagerInternal::evictedStateSlot(*mPages);
        return;
    }
    index = static_cast<int32_t>(state.pending.size());
    state.pending.push_back(Eviction{page, hash, PageManagerInternal::evictedStateSlot(*mPages)});
}

HostPageMap::Insertion TieredPrefixCacheCore::insertHostPage(TierMover& mover, int32_t g, PageHash hash)
{
    HostPageMap& map = mGroups[static_cast<size_t>(g)].map;
    HostPageMap::Insertion const insertion = map.insert(hash);
    if (insertion.hostPage == HostPageMap::kNONE || !insertion.evicted)
    {
        return insertion;
    }
    ++mStats.evictedHostPages;
    try
    {
        // The host page still holds the bytes of the page it gave up: to the disk tier before anything overwrites it,
        // with the checkpoint it carried.
        spill(mover, g, insertion.hostPage, insertion.evictedHash, stateOf(g, insertion.evictedHash));
    }
    catch (...)
    {
        releaseState(g, insertion.evictedHash);
        eraseHostPage(g, insertion.hostPage);
        throw;
    }
    // The host state goes with its host page.
    releaseState(g, insertion.evictedHash);
    return insertion;
}

void TieredPrefixCacheCore::offloadStates(TierMover& mover, Group& group)
{
    HostPageMap& states = mStates.front();
    mStateEntries.clear();
    for (Eviction const& eviction : group.pending)
    {
        // A checkpoint goes where its page went: none for a page the host did not take.
        if (eviction.stateSlot < 0 || group.map.find(eviction.hash) == HostPageMap::kNONE
            || states.find(eviction.hash) != HostPageMap::kNONE)
        {
            continue;
        }
        if (mStepStateCopies != nullptr
            && std::any_of(mStepStateCopies->begin(), mStepStateCopies->end(),
                [&](StateSlotCopy const& copy) { return copy.dst == eviction.stateSlot; }))
        {
            // Saved by a copy this step hands out: the slot holds the state only once the runtime ran it, after
            // this offload. The checkpoint goes with its page.
            ++mStats.droppedStates;
            continue;
        }
        if (states.numFree() == 0)
        {
            // Host states are never given up for another: each goes with its host page.
            ++mStats.droppedStates;
            continue;
        }
        HostPageMap::Insertion const insertion = states.insert(eviction.hash);
        mStateEntries.push_back(HostStateEntry{eviction.stateSlot, insertion.hostPage});
    }
    if (mStateEntries.empty())
    {
        return;
    }
    try
    {
        mover.offloadStates(mStateEntries.data(), static_cast<int32_t>(mStateEntries.size()));
    }
    catch (...)
    {
        for (HostStateEntry const& entry : mStateEntries)
        {
            states.erase(entry.hostState);
        }
        throw;
    }
    mStats.offloadedStates += static_cast<int64_t>(mStateEntries.size());
}

void TieredPrefixCacheCore::spill(TierMover& mover, int32_t g, int32_t hostPage, PageHash hash, int32_t hostState)
{
    if (mDisks.empty())
    {
        return;
    }
    HostPageMap& disk = mDisks[static_cast<size_t>(g)];
    int32_t const held = disk.find(hash);
    if (held != HostPageMap::kNONE)
    {
        disk.touch(held);
        ++mStats.alreadyOnDiskPages;
        return;
    }
    HostPageMap::Insertion const insertion = disk.insert(hash);
    if (insertion.hostPage == HostPageMap::kNONE)
    {
        ++mStats.droppedPages;
        return;
    }
    mStats.evictedDiskPages += insertion.evicted ? 1 : 0;
    // Only the checkpoint group's disk pages hold states (mDiskStates is empty otherwise).
    bool const withState = hostState != HostPageMap::kNONE && !mDiskStates.empty();
    try
    {
        mover.spill(g, hostPage, insertion.hostPage, withState ? hostState : HostPageMap::kNONE);
    }
    catch (CudaError const&)
    {
        disk.erase(insertion.hostPage);
        throw;
    }
    catch (Error const&)
    {
        // A disk tier is a cache: a page it could not write (disk full, no permission) is one it does not hold.
        disk.erase(insertion.hostPage);
        ++mStats.diskFailures;
        return;
    }
    ++mStats.spilledPages;
    if (!mDiskStates.empty())
    {
        mDiskStates[static_cast<size_t>(insertion.hostPage)] = withState ? 1 : 0;
        mStats.spilledStates += withState ? 1 : 0;
    }
}

void TieredPrefixCacheCore::offloadEvicted(TierMover& mover)
{
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        offloadGroup(mover, g);
    }
}

void TieredPrefixCacheCore::offloadGroup(TierMover& mover, int32_t g)
{
    Group& group = mGroups[static_cast<size_t>(g)];
    if (group.pending.empty())
    {
        return;
    }
    HostPageMap& map = group.map;
    int64_t const usable = std::min<int64_t>(mover.usableHostPages(g), map.numHostPages());
    map.setUsable(std::max<int64_t>(usable, map.numUsable()));
    for (Eviction const& eviction : group.pending)
    {
        group.pendingIndex[static_cast<size_t>(eviction.page)] = -1;
    }
    // Pass 1: evicted pages the host holds already need no copy; they are pinned so that no new one displaces them.
    // The rest are counted, so that when more are new than the tier can take, the oldest evictions are the ones
    // dropped (the device evicts least recently used first).
    group.pinned.clear();
    group.entries.clear();
    int32_t fresh = 0;
    for (Eviction& eviction : group.pending)
    {
        int32_t const held = map.find(eviction.hash);
        if (held == HostPageMap::kNONE)
        {
            ++fresh;
            continue;
        }
        map.pin(held);
        group.pinned.push_back(held);
        ++mStats.alreadyOnHostPages;
        eviction.page = -1;
    }
    int32_t toDrop = std::max(0, fresh - map.numAvailable());
    try
    {
        // Pass 2: a host page for each new one, pinned until the offload is enqueued.
        for (Eviction const& eviction : group.pending)
        {
            if (eviction.page < 0)
            {
                continue;
            }
            if (map.find(eviction.hash) != HostPageMap::kNONE)
            {
                // The same hash twice in one batch (possible only after a bypassed step): the first copy serves.
                ++mStats.alreadyOnHostPages;
                continue;
            }
            if (toDrop > 0)
            {
                --toDrop;
                ++mStats.droppedPages;
                continue;
            }
            HostPageMap::Insertion const insertion = insertHostPage(mover, g, eviction.hash);
            if (insertion.hostPage == HostPageMap::kNONE)
            {
                ++mStats.droppedPages;
                continue;
            }
            map.pin(insertion.hostPage);
            group.pinned.push_back(insertion.hostPage);
            group.entries.push_back(HostTierEntry{eviction.page, insertion.hostPage});
        }
        if (!group.entries.empty())
        {
            mover.offload(g, group.entries.data(), static_cast<int32_t>(group.entries.size()));
        }
        // After the pages, in the same stream order: the checkpoints their carrier pages held.
        if (g == mCheckpointGroup && !mStates.empty())
        {
            offloadStates(mover, group);
        }
        group.pending.clear();
    }
    catch (...)
    {
        // The host pages of the failed offload hold unknown bytes: they hold no page any more.
        group.pending.clear();
        for (int32_t const hostPage : group.pinned)
        {
            map.unpin(hostPage);
        }
        for (HostTierEntry const& entry : group.entries)
        {
            eraseHostPage(g, entry.hostPage);
        }
        throw;
    }
    for (int32_t const hostPage : group.pinned)
    {
        map.unpin(hostPage);
    }
    mStats.offloadedPages += static_cast<int64_t>(group.entries.size());
}

} // namespace kvcache::rt::detail
