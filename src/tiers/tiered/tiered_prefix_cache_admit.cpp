// TieredPrefixCache's admissions: the device's prefix, then the longest run of pages the device, the host and the
// disk hold between them, adopted in one manager call (PageManagerInternal::adoptRun) after its disk pages were read
// back into host pages, and the onboard of its fresh pages. Host only: transfers go through a TierMover.
#include "tiers/tiered/tiered_prefix_cache_core.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace kvcache::rt::detail
{
namespace
{

constexpr char const* kWHAT = "TieredPrefixCache";

} // namespace

TieredPrefixCacheCore::KeySlice TieredPrefixCacheCore::keysIn(
    PageExtraKey const* keys, int32_t numKeys, int64_t begin, int64_t end) noexcept
{
    if (numKeys <= 0 || keys == nullptr)
    {
        return {};
    }
    auto const byPosition = [](PageExtraKey const& key, int64_t position) { return key.position < position; };
    PageExtraKey const* const first = std::lower_bound(keys, keys + numKeys, begin, byPosition);
    PageExtraKey const* const last = std::lower_bound(first, keys + numKeys, end, byPosition);
    return {first, static_cast<int32_t>(last - first)};
}

TieredAdmission TieredPrefixCacheCore::admit(TierMover& mover, SequenceId sequence, int32_t const* tokens,
    int32_t count, PageExtraKey const* extraKeys, int32_t numExtraKeys)
{
    // adoptPrefix checks every argument before it changes anything; past it no argument can be wrong.
    int32_t const deviceTokens = mPages->adoptPrefix(sequence, tokens, count, extraKeys, numExtraKeys);
    ++mStats.admissions;
    mStats.queryTokens += count;
    mStats.deviceHitTokens += deviceTokens;
    // Evictions a direct evictCached left behind go to the host before this call can reuse their pages.
    offloadEvicted(mover);
    int32_t diskTokens = 0;
    int32_t const hostTokens =
        onboardRun(mover, sequence, tokens, count, deviceTokens, extraKeys, numExtraKeys, diskTokens);
    mStats.hostHitTokens += hostTokens;
    mStats.diskHitTokens += diskTokens;
    PageManagerInternal::addTenantHits(*mPages, sequence, hostTokens - diskTokens, diskTokens);
    int32_t const computeTokens = count - deviceTokens - hostTokens;
    mStats.missedTokens += computeTokens;
    return TieredAdmission{deviceTokens, hostTokens, computeTokens};
}

TieredPrefixCacheCore::RunPlace TieredPrefixCacheCore::source(int32_t group, int32_t index)
{
    Group& state = mGroups[static_cast<size_t>(group)];
    RunPlace& found = state.runPlaces[static_cast<size_t>(index)];
    if (found.tier == RunPlace::Tier::kUNKNOWN)
    {
        // The host first: a page it holds is there either way (adoptRun holds the device's copy when there is one and
        // onboards only into the pages it takes); the device for the pages the host lacks; the disk last.
        PageHash const hash = mHashes[static_cast<size_t>(index)];
        int32_t const hostPage = state.map.find(hash);
        int32_t diskPage = HostPageMap::kNONE;
        if (hostPage != HostPageMap::kNONE)
        {
            found = {RunPlace::Tier::kHOST, hostPage};
        }
        else if (PageManagerInternal::hasPage(*mPages, group, hash))
        {
            found = {RunPlace::Tier::kDEVICE, -1};
        }
        else if (!mDisks.empty() && (diskPage = mDisks[static_cast<size_t>(group)].find(hash)) != HostPageMap::kNONE)
        {
            found = {RunPlace::Tier::kDISK, diskPage};
        }
        else
        {
            found = {RunPlace::Tier::kNOWHERE, -1};
        }
    }
    return found;
}

bool TieredPrefixCacheCore::runIsThere(NextPageHashes const& known, int32_t pages)
{
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        int32_t const window = PageManagerInternal::firstNeededPage(*mPages, g, known.firstPage + pages);
        for (int32_t p = std::max(0, window - known.firstPage); p < pages; ++p)
        {
            if (source(g, p).tier == RunPlace::Tier::kNOWHERE)
            {
                return false;
            }
        }
    }
    return true;
}

bool TieredPrefixCacheCore::checkpointThere(int32_t pages)
{
    if (!mStateLayers)
    {
        return true;
    }
    PageHash const hash = mHashes[static_cast<size_t>(pages - 1)];
    if (PageManagerInternal::hasCheckpoint(*mPages, hash) || stateOf(mCheckpointGroup, hash) != HostPageMap::kNONE)
    {
        return true;
    }
    // A disk page holding the state with the page: secureRun reads both back.
    RunPlace const end = mCheckpointGroup >= 0 ? source(mCheckpointGroup, pages - 1) : RunPlace{};
    return end.tier == RunPlace::Tier::kDISK && !mDiskStates.empty() && mDiskStates[static_cast<size_t>(end.page)] != 0;
}

bool TieredPrefixCacheCore::checkpointHeld(int32_t pages, int32_t& hostState)
{
    hostState = HostPageMap::kNONE;
    if (!mStateLayers)
    {
        return true;
    }
    PageHash const hash = mHashes[static_cast<size_t>(pages - 1)];
    if (PageManagerInternal::hasCheckpoint(*mPages, hash))
    {
        return true;
    }
    hostState = stateOf(mCheckpointGroup, hash);
    return hostState != HostPageMap::kNONE;
}

bool TieredPrefixCacheCore::secureRun(TierMover& mover, NextPageHashes const& known, int32_t pages)
{
    // Pass 1: the run's host pages are pinned, so that neither the restores below nor the offloads of the adoption's
    // evictions give them up before they are read; its disk pages too, so that no spill overwrites one first.
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        Group& group = mGroups[static_cast<size_t>(g)];
        int32_t const window = PageManagerInternal::firstNeededPage(*mPages, g, known.firstPage + pages);
        for (int32_t p = std::max(0, window - known.firstPage); p < pages; ++p)
        {
            RunPlace const found = source(g, p);
            uint8_t& pinned = group.runPinned[static_cast<size_t>(p)];
            if (found.tier == RunPlace::Tier::kHOST && pinned == 0)
            {
                group.map.pin(found.page);
                pinned = 1;
            }
            else if (found.tier == RunPlace::Tier::kDISK && pinned == 0)
            {
                mDisks[static_cast<size_t>(g)].pin(found.page);
                pinned = 2;
            }
        }
    }
    // Pass 2: each disk page into a host page of its own (pinned), read from the disk now; one that cannot be read,
    // or finds no host page, is nowhere. Every disk page is unpinned as it is done with.
    bool all = true;
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        Group& group = mGroups[static_cast<size_t>(g)];
        for (int32_t p = 0; p < pages; ++p)
        {
            uint8_t& pinned = group.runPinned[static_cast<size_t>(p)];
            if (pinned != 2)
            {
                continue;
            }
            RunPlace& found = group.runPlaces[static_cast<size_t>(p)];
            int32_t const diskPage = found.page;
            mDisks[static_cast<size_t>(g)].unpin(diskPage);
            pinned = 0;
            found = {RunPlace::Tier::kNOWHERE, -1};
            all = all && restore(mover, g, p, diskPage);
        }
    }
    return all;
}

bool TieredPrefixCacheCore::restore(TierMover& mover, int32_t g, int32_t index, int32_t diskPage)
{
    Group& group = mGroups[static_cast<size_t>(g)];
    PageHash const hash = mHashes[static_cast<size_t>(index)];
    HostPageMap::Insertion const insertion = insertHostPage(mover, g, hash);
    if (insertion.hostPage == HostPageMap::kNONE)
    {
        return false;
    }
    // The checkpoint written with the page comes back into a free host state (after the insertion, whose given-up
    // host page may have freed one); none free: the page comes back alone. A failure below releases it with the page.
    int32_t hostState = HostPageMap::kNONE;
    if (g == mCheckpointGroup && !mDiskStates.empty() && mDiskStates[static_cast<size_t>(diskPage)] != 0
        && stateOf(g, hash) == HostPageMap::kNONE)
    {
        HostPageMap& states = mStates.front();
        if (states.numFree() > 0)
        {
            hostState = states.insert(hash).hostPage;
        }
        else
        {
            ++mStats.droppedStates;
        }
    }
    try
    {
        mover.restore(g, diskPage, insertion.hostPage, hostState);
    }
    catch (CudaError const&)
    {
        eraseHostPage(g, insertion.hostPage);
        throw;
    }
    catch (Error const&)
    {
        // A file that cannot be read back (gone, corrupt, written under other host-held scales) holds no page.
        eraseHostPage(g, insertion.hostPage);
        mDisks[static_cast<size_t>(g)].erase(diskPage);
        ++mStats.diskFailures;
        return false;
    }
    mDisks[static_cast<size_t>(g)].touch(diskPage);
    mStats.restoredStates += hostState != HostPageMap::kNONE ? 1 : 0;
    group.map.pin(insertion.hostPage);
    group.runPinned[static_cast<size_t>(index)] = 1;
    group.runPlaces[static_cast<size_t>(index)] = {RunPlace::Tier::kHOST, insertion.hostPage};
    mRunFromDisk[static_cast<size_t>(index)] = 1;
    ++mStats.restoredPages;
    return true;
}

int32_t TieredPrefixCacheCore::onboardRun(TierMover& mover, SequenceId sequence, int32_t const* tokens, int32_t count,
    int32_t length, PageExtraKey const* keys, int32_t numKeys, int32_t& diskTokens)
{
    diskTokens = 0;
    // Whole pages, leaving at least the last prompt token to compute (as adoptPrefix does).
    int64_t const maxPages = (int64_t{count} - 1 - length) / mTokensPerPage;
    if (maxPages <= 0)
    {
        return 0;
    }
    auto const runTokens = static_cast<int32_t>(maxPages * mTokensPerPage);
    KeySlice const after = keysIn(keys, numKeys, length, int64_t{length} + runTokens);
    NextPageHashes const known = PageManagerInternal::hashNextPages(
        *mPages, sequence, tokens + length, runTokens, mHashes.data(), after.keys, after.count);
    std::fill(mRunFromDisk.begin(), mRunFromDisk.begin() + known.count, uint8_t{0});
    for (Group& group : mGroups)
    {
        std::fill(group.runPlaces.begin(), group.runPlaces.begin() + known.count, RunPlace{});
        std::fill(group.runPinned.begin(), group.runPinned.begin() + known.count, uint8_t{0});
    }
    // A run of k pages is there when every page the sequence then needs is on the device, the host or the disk in
    // every group: all k in full attention, those of the window before the run's end in a windowed group. The first
    // page a full-attention group has nowhere bounds k; the longest run that is there, whose disk pages could be read
    // back and whose fresh pages the device can give is adopted.
    int32_t pages = known.count;
    // With state layers the run must end at a checkpoint (PageManagerInternal::adoptRun): the device's, or a host
    // state onboarded into the checkpoint slot adoptRun gives. The host state needs no pin of its own: it goes only
    // with its carrier page's host page, which the run pins (secureRun) as the page of its end.
    int32_t hostState = HostPageMap::kNONE;
    int32_t fillSlot = -1;
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        for (int32_t p = 0; p < pages && !mGroups[static_cast<size_t>(g)].windowed; ++p)
        {
            if (source(g, p).tier == RunPlace::Tier::kNOWHERE)
            {
                pages = p;
            }
        }
    }
    try
    {
        while (pages > 0
            && !(runIsThere(known, pages) && checkpointThere(pages) && secureRun(mover, known, pages)
                && checkpointHeld(pages, hostState)
                && PageManagerInternal::adoptRun(
                    *mPages, known, pages, mFresh, hostState != HostPageMap::kNONE, &fillSlot)))
        {
            --pages;
        }
        if (pages > 0)
        {
            onboardFresh(mover, known);
        }
        if (pages > 0 && fillSlot >= 0)
        {
            onboardState(mover, known.hashes[pages - 1], hostState, fillSlot);
        }
    }
    catch (...)
    {
        unpinRun(known);
        throw;
    }
    unpinRun(known);
    diskTokens = static_cast<int32_t>(std::count(mRunFromDisk.begin(), mRunFromDisk.begin() + pages, uint8_t{1}))
        * mTokensPerPage;
    return pages * mTokensPerPage;
}

void TieredPrefixCacheCore::onboardFresh(TierMover& mover, NextPageHashes const& known)
{
    // Each fresh page was looked up (the run was there) and is on the host now: a page found only on the device was
    // held, not taken, and a disk page was read into a host page.
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        Group const& group = mGroups[static_cast<size_t>(g)];
        for (FreshPage const& fresh : mFresh[static_cast<size_t>(g)])
        {
            size_t const index = static_cast<size_t>(fresh.index - known.firstPage);
            if (group.runPlaces[index].tier != RunPlace::Tier::kHOST || group.runPinned[index] != 1)
            {
                throw std::logic_error(fmt::format(
                    "{}: group {} took a fresh page for page {} of the run, which no pinned host page holds", kWHAT, g,
                    fresh.index));
            }
        }
    }
    // The adoption's evictions leave before anything is written: a page it evicted may be one it took.
    offloadEvicted(mover);
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        Group& group = mGroups[static_cast<size_t>(g)];
        group.entries.clear();
        for (FreshPage const& fresh : mFresh[static_cast<size_t>(g)])
        {
            group.entries.push_back(
                HostTierEntry{fresh.page, group.runPlaces[static_cast<size_t>(fresh.index - known.firstPage)].page});
        }
        if (!group.entries.empty())
        {
            mover.onboard(g, group.entries.data(), static_cast<int32_t>(group.entries.size()));
            mStats.onboardedPages += static_cast<int64_t>(group.entries.size());
        }
    }
}

void TieredPrefixCacheCore::onboardState(TierMover& mover, PageHash hash, int32_t hostState, int32_t slot)
{
    HostPageMap& states = mStates.front();
    if (states.find(hash) != hostState)
    {
        throw std::logic_error(
            fmt::format("{}: host state {} was released before the checkpoint slot {} it fills was written", kWHAT,
                hostState, slot));
    }
    HostStateEntry const entry{slot, hostState};
    // After onboardFresh's offloads: the slot may have held a checkpoint whose state one of them reads.
    mover.onboardStates(&entry, 1);
    states.touch(hostState);
    ++mStats.onboardedStates;
}

void TieredPrefixCacheCore::unpinRun(NextPageHashes const& known) noexcept
{
    // Last page first, so that the run's first pages end up the most recently used: a run is only usable from its
    // start, so its later pages should be the first ones given up.
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        Group& group = mGroups[static_cast<size_t>(g)];
        for (int32_t p = known.count - 1; p >= 0; --p)
        {
            uint8_t& pinned = group.runPinned[static_cast<size_t>(p)];
            int32_t const page = group.runPlaces[static_cast<size_t>(p)].page;
            if (pinned == 1)
            {
                group.map.unpin(page);
            }
            else if (pinned == 2)
            {
                // Left by a restore that threw: its disk page stays on the disk.
                mDisks[static_cast<size_t>(g)].unpin(page);
            }
            pinned = 0;
        }
    }
}

} // namespace kvcache::rt::detail
