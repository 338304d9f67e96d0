// TieredPrefixCache's bookkeeping: the checks of a layout and of the tiers' sizes, the host maps and the host states
// of checkpoints, steps, and the invariants; the offload of evictions is in tiered_prefix_cache_offload.cpp and
// admissions in tiered_prefix_cache_admit.cpp. Host only: transfers go through a TierMover.
#include "tiers/tiered/tiered_prefix_cache_core.h"

#include "kvcache/core/errors.h"
#include "kvcache/core/page_geometry.h"

#include <fmt/format.h>

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
