// TieredPrefixCache's bookkeeping: evictions recorded by the callback and offloaded once the manager's call returned
// (host pages a full host tier gives up go to the disk tier first), steps, and the checks of a layout and of the tiers'
// sizes; admissions are in tiered_prefix_cache_admit.cpp. Host only: transfers go through a TierMover.
#include "tiers/tiered/tiered_prefix_cache_core.h"

#include "kvcache/core/errors.h"
#include "kvcache/core/page_geometry.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace kvcache::rt::detail
{
namespace
{

constexpr char const* kWHAT = "TieredPrefixCache";

//! Throws InvalidArgumentError naming the field, the manager's value and the cache's.
template <typename Value>
void checkField(char const* field, Value manager, Value cache)
{
    if (manager != cache)
    {
        throw InvalidArgumentError(fmt::format("{}: the page manager's layout is not the cache's: {} is {} in the "
                                               "manager and {} in the cache; size the manager from cache.layout()",
            kWHAT, field, manager, cache));
    }
}

} // namespace

void checkSameLayout(KVCacheLayout const& cache, KVCacheLayout const& manager)
{
    checkField("the number of page groups", manager.groups.size(), cache.groups.size());
    checkField("tokensPerPage", manager.tokensPerPage, cache.tokensPerPage);
    checkField("maxSequenceLength", manager.maxSequenceLength, cache.maxSequenceLength);
    for (size_t g = 0; g < cache.groups.size(); ++g)
    {
        std::string const numPages = fmt::format("group {} numPages", g);
        checkField(numPages.c_str(), manager.groups[g].numPages, cache.groups[g].numPages);
        std::string const window = fmt::format("group {} slidingWindow", g);
        checkField(window.c_str(), manager.groups[g].slidingWindow, cache.groups[g].slidingWindow);
        std::string const difference = pageGeometryDifference(pageGeometry(manager, static_cast<int32_t>(g)),
            pageGeometry(cache, static_cast<int32_t>(g)), "the manager", "the cache");
        if (!difference.empty())
        {
            throw InvalidArgumentError(
                fmt::format("{}: the page manager's layout is not the cache's: group {}'s page geometry differs: {}",
                    kWHAT, g, difference));
        }
    }
}

void checkNumHostPages(KVCacheLayout const& layout, std::vector<int64_t> const& numHostPages)
{
    if (numHostPages.size() != layout.groups.size())
    {
        throw InvalidArgumentError(fmt::format("{}: numHostPages has {} entries; it must have one per page group ({}): "
                                               "every group needs a host tier",
            kWHAT, numHostPages.size(), layout.groups.size()));
    }
    for (size_t g = 0; g < numHostPages.size(); ++g)
    {
        if (numHostPages[g] < 1 || numHostPages[g] > std::numeric_limits<int32_t>::max())
        {
            throw InvalidArgumentError(fmt::format("{}: numHostPages[{}] is {}; it must be in [1, {}] (group {}, {}, "
                                                   "needs a host tier: an onboarded run fills its pages in every "
                                                   "group)",
                kWHAT, g, numHostPages[g], std::numeric_limits<int32_t>::max(), g,
                layout.groups[g].slidingWindow == 0
                    ? std::string("full attention")
                    : fmt::format("sliding window of {} tokens", layout.groups[g].slidingWindow)));
        }
    }
}

void checkNumDiskPages(KVCacheLayout const& layout, std::vector<int64_t> const& numDiskPages)
{
    if (numDiskPages.empty())
    {
        return;
    }
    if (numDiskPages.size() != layout.groups.size())
    {
        throw InvalidArgumentError(fmt::format("{}: numDiskPages has {} entries; it must be empty (no disk tier) or "
                                               "have one per page group ({})",
            kWHAT, numDiskPages.size(), layout.groups.size()));
    }
    for (size_t g = 0; g < numDiskPages.size(); ++g)
    {
        if (numDiskPages[g] < 1 || numDiskPages[g] > std::numeric_limits<int32_t>::max())
        {
            throw InvalidArgumentError(fmt::format("{}: numDiskPages[{}] is {}; it must be in [1, {}] (with a disk "
                                                   "tier, every group has one: a run needs its pages in every group)",
                kWHAT, g, numDiskPages[g], std::numeric_limits<int32_t>::max()));
        }
    }
}

void checkNumHostStates(int64_t numHostStates, int32_t checkpointGroup)
{
    if (numHostStates < 0 || numHostStates > std::numeric_limits<int32_t>::max())
    {
        throw InvalidArgumentError(fmt::format("{}: numHostStates is {}; it must be in [0, {}]", kWHAT, numHostStates,
            std::numeric_limits<int32_t>::max()));
    }
    if (numHostStates > 0 && checkpointGroup < 0)
    {
        throw InvalidArgumentError(fmt::format("{}: numHostStates is {}; it must be 0 when the page manager keeps no "
                                               "state checkpoints (they need state layers, numCheckpointSlots above 0 "
                                               "and prefix caching)",
            kWHAT, numHostStates));
    }
}

TieredPrefixCacheCore::TieredPrefixCacheCore(PageManager& pages, std::vector<int64_t> const& numHostPages,
    std::vector<int64_t> const& numDiskPages, int64_t numHostStates)
    : mPages(&pages)
    , mCheckpointGroup(PageManagerInternal::checkpointGroup(pages))
    , mStateLayers(PageManagerInternal::hasStateLayers(pages))
{
    KVCacheLayout const& layout = pages.layout();
    checkNumHostPages(layout, numHostPages);
    checkNumDiskPages(layout, numDiskPages);
    checkNumHostStates(numHostStates, mCheckpointGroup);
    if (numHostStates > 0)
    {
        // Host states are pinned whole by the tier's constructor: every one is usable from the start.
        mStates.emplace_back(numHostStates).setUsable(numHostStates);
        // An offload lists each evicted page of the checkpoint group at most once.
        mStateEntries.reserve(static_cast<size_t>(layout.groups[static_cast<size_t>(mCheckpointGroup)].numPages));
        if (!numDiskPages.empty())
        {
            mDiskStates.assign(static_cast<size_t>(numDiskPages[static_cast<size_t>(mCheckpointGroup)]), 0);
        }
    }
    mTokensPerPage = layout.tokensPerPage;
    int64_t const pagesPerSequence = (int64_t{layout.maxSequenceLength} + mTokensPerPage - 1) / mTokensPerPage;
    mHashes.resize(static_cast<size_t>(pagesPerSequence));
    mRunFromDisk.assign(static_cast<size_t>(pagesPerSequence), 0);
    mGroups.reserve(layout.groups.size());
    for (size_t g = 0; g < layout.groups.size(); ++g)
    {
        auto const numPages = static_cast<size_t>(layout.groups[g].numPages);
        // A group's evictions between two offloads are distinct pages (recordEviction replaces a page's older
        // record), and an offload or an onboard lists at most every page once: numPages bounds every list.
        Group group{HostPageMap(numHostPages[g]), layout.groups[g].slidingWindow != 0, {},
            std::vector<int32_t>(numPages, -1), {}, {}, std::vector<RunPlace>(static_cast<size_t>(pagesPerSequence)),
            std::vector<uint8_t>(static_cast<size_t>(pagesPerSequence), 0)};
        group.pending.reserve(numPages);
        group.entries.reserve(numPages);
        group.pinned.reserve(numPages);
        mGroups.push_back(std::move(group));
        mFresh.emplace_back().reserve(static_cast<size_t>(pagesPerSequence));
    }
    mDisks.reserve(numDiskPages.size());
    for (int64_t const diskPages : numDiskPages)
    {
        // Disk pages are files: every one is usable from the start.
        mDisks.emplace_back(diskPages).setUsable(diskPages);
    }
    if (PageManagerInternal::recordsEvents(pages))
    {
        mEvents.reserve(64, 64, 0);
        for (size_t g = 0; g < mGroups.size(); ++g)
        {
            mGroups[g].map.setEventBatch(&mEvents, static_cast<int32_t>(g), KVEventMedium::kCPU, mTokensPerPage);
        }
        for (size_t g = 0; g < mDisks.size(); ++g)
        {
            mDisks[g].setEventBatch(&mEvents, static_cast<int32_t>(g), KVEventMedium::kDISK, mTokensPerPage);
        }
    }
    // Last, once nothing can throw any more: a failed construction leaves the manager's callback as it was.
    pages.setEvictionCallback(
        [this](int32_t group, int32_t page, PageHash hash) { recordEviction(group, page, hash); });
}

TieredPrefixCacheCore::~TieredPrefixCacheCore()
{
    try
    {
        mPages->setEvictionCallback({});
    }
    catch (...)
    {
        // Clearing a std::function does not throw in practice; a destructor must not let anything out regardless.
    }
}

void TieredPrefixCacheCore::takeEvents(KVEventBatch& out)
{
    mPages->takeEvents(out);
    out.append(mEvents);
    mEvents.clear();
}

HostPageMap const& TieredPrefixCacheCore::hostMap(int32_t group, char const* what) const
{
    if (group < 0 || group >= numGroups())
    {
        throw OutOfRangeError(fmt::format("{}: group is {}; groups are [0, {})", what, group, numGroups()));
    }
    return mGroups[static_cast<size_t>(group)].map;
}

HostPageMap const* TieredPrefixCacheCore::diskMap(int32_t group, char const* what) const
{
    hostMap(group, what);
    return mDisks.empty() ? nullptr : &mDisks[static_cast<size_t>(group)];
}

int64_t TieredPrefixCacheCore::numPendingEvictions() const noexcept
{
    int64_t pending = 0;
    for (Group const& group : mGroups)
    {
        pending += static_cast<int64_t>(group.pending.size());
    }
    return pending;
}

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

int32_t TieredPrefixCacheCore::stateOf(int32_t g, PageHash hash) const noexcept
{
    return g == mCheckpointGroup && !mStates.empty() ? mStates.front().find(hash) : HostPageMap::kNONE;
}

void TieredPrefixCacheCore::eraseHostPage(int32_t g, int32_t hostPage)
{
    HostPageMap& map = mGroups[static_cast<size_t>(g)].map;
    PageHash const hash = map.hashOf(hostPage);
    map.erase(hostPage);
    releaseState(g, hash);
}

void TieredPrefixCacheCore::releaseState(int32_t g, PageHash hash)
{
    if (g != mCheckpointGroup || mStates.empty())
    {
        return;
    }
    HostPageMap& states = mStates.front();
    int32_t const hostState = states.find(hash);
    if (hostState != HostPageMap::kNONE)
    {
        states.erase(hostState);
        ++mStats.releasedStates;
    }
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

void TieredPrefixCacheCore::runCopies(TierMover& mover, StepCopies const& copies)
{
    for (int32_t g = 0; g < copies.numGroups(); ++g)
    {
        std::vector<PageCopy> const& list = copies[g];
        if (!list.empty())
        {
            mover.copy(g, list.data(), static_cast<int32_t>(list.size()));
        }
    }
}

StepCopies TieredPrefixCacheCore::step(TierMover& mover, SequenceAppend const* appends, int32_t count)
{
    StepCopies const copies = mPages->step(appends, count);
    mStepStateCopies = &copies.stateCopies();
    try
    {
        offloadEvicted(mover);
    }
    catch (...)
    {
        mStepStateCopies = nullptr;
        throw;
    }
    mStepStateCopies = nullptr;
    runCopies(mover, copies);
    return copies;
}

int32_t TieredPrefixCacheCore::evictCached(TierMover& mover, int32_t group, int32_t count)
{
    int32_t const evicted = mPages->evictCached(group, count);
    offloadEvicted(mover);
    return evicted;
}

void TieredPrefixCacheCore::checkInvariants() const
{
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        Group const& group = mGroups[static_cast<size_t>(g)];
        group.map.checkInvariants();
        if (group.map.numPinned() != 0)
        {
            throw std::logic_error(
                fmt::format("{}: group {} has {} host pages pinned between calls", kWHAT, g, group.map.numPinned()));
        }
        if (!mDisks.empty())
        {
            HostPageMap const& disk = mDisks[static_cast<size_t>(g)];
            disk.checkInvariants();
            if (disk.numPinned() != 0)
            {
                throw std::logic_error(
                    fmt::format("{}: group {} has {} disk pages pinned between calls", kWHAT, g, disk.numPinned()));
            }
        }
        if (g == mCheckpointGroup && !mStates.empty())
        {
            HostPageMap const& states = mStates.front();
            states.checkInvariants();
            if (states.numPinned() != 0)
            {
                throw std::logic_error(
                    fmt::format("{}: {} host states pinned between calls", kWHAT, states.numPinned()));
            }
            for (int32_t const hostState : states.leastRecentFirst())
            {
                if (group.map.find(states.hashOf(hostState)) == HostPageMap::kNONE)
                {
                    throw std::logic_error(fmt::format("{}: host state {} holds the checkpoint of a page no host page "
                                                       "of group {} holds",
                        kWHAT, hostState, g));
                }
            }
        }
        int64_t indexed = 0;
        for (size_t page = 0; page < group.pendingIndex.size(); ++page)
        {
            int32_t const index = group.pendingIndex[page];
            if (index < 0)
            {
                continue;
            }
            ++indexed;
            if (static_cast<size_t>(index) >= group.pending.size()
                || group.pending[static_cast<size_t>(index)].page != static_cast<int32_t>(page))
            {
                throw std::logic_error(fmt::format(
                    "{}: group {}'s record of page {}'s eviction is not where its index says", kWHAT, g, page));
            }
        }
        if (indexed != static_cast<int64_t>(group.pending.size()))
        {
            throw std::logic_error(fmt::format(
                "{}: group {} has {} pending evictions but {} indexed", kWHAT, g, group.pending.size(), indexed));
        }
    }
}

} // namespace kvcache::rt::detail
