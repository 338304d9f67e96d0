#pragma once

// The bookkeeping of a TieredPrefixCache, host only: the eviction callback's records, each group's hash -> host page
// map, which run an admission adopts and what of it it onboards, and the order of the transfers, which it asks of a
// TierMover.
// TieredPrefixCache gives it a mover over HostTier and copyPages; host tests give it one that models device and host
// pages, so every decision is checked without a GPU.

#include "paging/page_manager/page_manager_internal.h"
#include "tiers/tiered/tiered_prefix_cache_host_map.h"

#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_manager.h"
#include "kvcache/tiers/tiered_prefix_cache.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt::detail
{

//! What a TieredPrefixCacheCore enqueues, in the order it calls these (one stream's order in TieredPrefixCache). A
//! call may throw; the core then leaves its bookkeeping consistent and rethrows.
class TierMover
{
public:
    //! Returns how many of group `group`'s host pages are usable now (a HostTier's numPinnedHostPages()).
    virtual int64_t usableHostPages(int32_t group) const = 0;
    //! Copies each entry's device page of `group` to its host page.
    virtual void offload(int32_t group, HostTierEntry const* entries, int32_t count) = 0;
    //! Copies each entry's host page to its device page of `group`.
    virtual void onboard(int32_t group, HostTierEntry const* entries, int32_t count) = 0;
    //! Copies each entry's state slot to its host state (the host states of the checkpoint group's tier).
    virtual void offloadStates(HostStateEntry const* entries, int32_t count) = 0;
    //! Copies each entry's host state to its state slot.
    virtual void onboardStates(HostStateEntry const* entries, int32_t count) = 0;
    //! Runs the copies (copy-on-write) of `group`.
    virtual void copy(int32_t group, PageCopy const* copies, int32_t count) = 0;
    //! Writes host page `hostPage` of `group` (its transfers done first) to disk page `diskPage` (disk tier only), and
    //! host state `hostState` with it unless it is -1 (the checkpoint the page carries). Throws Error when the page
    //! cannot be written (the core then counts it and holds no disk page for it), CudaError.
    virtual void spill(int32_t group, int32_t hostPage, int32_t diskPage, int32_t hostState) = 0;
    //! Reads disk page `diskPage` of `group` into host page `hostPage` (disk tier only), and the state written with
    //! it into host state `hostState` unless it is -1. Throws Error when it cannot be read back whole and as written
    //! (the core then drops the disk page), CudaError.
    virtual void restore(int32_t group, int32_t diskPage, int32_t hostPage, int32_t hostState) = 0;

protected:
    TierMover() = default;
    TierMover(TierMover const&) = default;
    TierMover& operator=(TierMover const&) = default;
    ~TierMover() = default;
};

//! Throws InvalidArgumentError naming the group, the field and both values when `manager` (a PageManager's layout)
//! does not describe the pages of `cache` (a KVCacheManager's): another number of groups, tokensPerPage,
//! maxSequenceLength, or a group's numPages or page geometry.
void checkSameLayout(KVCacheLayout const& cache, KVCacheLayout const& manager);

//! Throws InvalidArgumentError naming numHostPages[g], the value and the limit when `numHostPages` does not hold one
//! entry in [1, INT32_MAX] per page group of `layout`.
void checkNumHostPages(KVCacheLayout const& layout, std::vector<int64_t> const& numHostPages);
//! Throws InvalidArgumentError naming numDiskPages and the rule when `numDiskPages` is neither empty (no disk tier)
//! nor one entry in [1, INT32_MAX] per page group of `layout`.
void checkNumDiskPages(KVCacheLayout const& layout, std::vector<int64_t> const& numDiskPages);
//! Throws InvalidArgumentError naming numHostStates, the value and the rule when it is outside [0, INT32_MAX], or
//! above 0 for a manager that keeps no state checkpoints (`checkpointGroup` -1: no state layers, no checkpoint slots or
//! no prefix caching).
void checkNumHostStates(int64_t numHostStates, int32_t checkpointGroup);

//! TieredPrefixCache's decisions and counters (its class comment gives the rules). Sets the manager's eviction
//! callback at the end of construction and clears it on destruction; neither copyable nor movable (the callback
//! holds it). Nothing allocated after construction except by the manager and the mover.
class TieredPrefixCacheCore
{
public:
    //! A disk tier of numDiskPages[g] pages a group when numDiskPages is not empty; numHostStates host states for the
    //! checkpoints of offloaded pages. Throws as checkNumHostPages, checkNumDiskPages and checkNumHostStates,
    //! std::bad_alloc; the manager is left as it was then.
    TieredPrefixCacheCore(PageManager& pages, std::vector<int64_t> const& numHostPages,
        std::vector<int64_t> const& numDiskPages = {}, int64_t numHostStates = 0);
    ~TieredPrefixCacheCore();
    TieredPrefixCacheCore(TieredPrefixCacheCore const&) = delete;
    TieredPrefixCacheCore& operator=(TieredPrefixCacheCore const&) = delete;
    TieredPrefixCacheCore(TieredPrefixCacheCore&&) = delete;
    TieredPrefixCacheCore& operator=(TieredPrefixCacheCore&&) = delete;

    //! TieredPrefixCache::admit.
    TieredAdmission admit(TierMover& mover, SequenceId sequence, int32_t const* tokens, int32_t count,
        PageExtraKey const* extraKeys, int32_t numExtraKeys);
    //! TieredPrefixCache::step.
    StepCopies step(TierMover& mover, SequenceAppend const* appends, int32_t count);
    //! TieredPrefixCache::evictCached.
    int32_t evictCached(TierMover& mover, int32_t group, int32_t count);

    //! Returns the counters.
    TieredPrefixCacheStats const& stats() const noexcept
    {
        return mStats;
    }
    //! Sets every counter to 0.
    void resetStats() noexcept
    {
        mStats = TieredPrefixCacheStats{};
    }
    //! Returns the number of page groups.
    int32_t numGroups() const noexcept
    {
        return static_cast<int32_t>(mGroups.size());
    }
    //! Returns the host page map of `group`. Throws OutOfRangeError naming `what` for a bad group.
    HostPageMap const& hostMap(int32_t group, char const* what = "TieredPrefixCache::hostMap") const;
    //! Returns the disk page map of `group` (its pages are disk pages), or null without a disk tier. Throws
    //! OutOfRangeError naming `what` for a bad group.
    HostPageMap const* diskMap(int32_t group, char const* what = "TieredPrefixCache::diskMap") const;
    //! Returns the host state map (hash of a checkpoint's carrier page -> host state), or null without host states.
    HostPageMap const* stateMap() const noexcept
    {
        return mStates.empty() ? nullptr : &mStates.front();
    }
    //! Returns the group whose pages carry checkpoints (and whose tier holds the host states), or -1.
    int32_t checkpointGroup() const noexcept
    {
        return mCheckpointGroup;
    }
    //! TieredPrefixCache::takeEvents.
    void takeEvents(KVEventBatch& out);
    //! Sets the retention priority (PageManager::setRetention) under which evicted pages are not offloaded (0: every
    //! page is); evictions recorded already stay. The caller checks it is in [0, kMAX_RETENTION_PRIORITY].
    void setMinOffloadPriority(int32_t priority) noexcept
    {
        mMinOffloadPriority = priority;
    }
    //! Returns the evictions recorded and not offloaded yet, all groups.
    int64_t numPendingEvictions() const noexcept;
    //! Throws std::logic_error naming the first broken rule: a host page map's own invariants, a host page left
    //! pinned, the record of pending evictions.
    void checkInvariants() const;

private:
    //! An evicted page waiting for its offload, and the state slot of the checkpoint it carried (-1: none).
    struct Eviction
    {
        int32_t page = 0;
        PageHash hash = {};
        int32_t stateSlot = -1;
    };
    //! Where a page of an admission's run is: the tier that holds it, and its page there.
    struct RunPlace
    {
        enum class Tier : uint8_t
        {
            kUNKNOWN, //!< not looked up yet
            kNOWHERE, //!< in no tier
            kDEVICE,  //!< on the device and not the host
            kHOST,    //!< on the host (and maybe the device too)
            kDISK,    //!< on the disk only
        };
        Tier tier = Tier::kUNKNOWN;
        int32_t page = -1; //!< the host page (kHOST) or disk page (kDISK)
    };

    //! One page group: its host pages and the scratch of its transfers (sized at construction).
    struct Group
    {
        HostPageMap map;
        bool windowed = false;
        std::vector<Eviction> pending;
        //! Per device page: its position in `pending`, or -1.
        std::vector<int32_t> pendingIndex;
        std::vector<HostTierEntry> entries;
        //! Host pages an offload pinned while its list was put together.
        std::vector<int32_t> pinned;
        //! Where each page of an admission's run is (RunPlace), looked up once.
        std::vector<RunPlace> runPlaces;
        //! Per page of the run: 1 while its host page is pinned, 2 while its disk page is, else 0.
        std::vector<uint8_t> runPinned;
    };
    //! A slice of extra keys.
    struct KeySlice
    {
        PageExtraKey const* keys = nullptr;
        int32_t count = 0;
    };

    //! The eviction callback: records the page (replacing an older record of the same page, whose bytes are gone), or,
    //! when its priority is under mMinOffloadPriority, only drops an older record.
    void recordEviction(int32_t group, int32_t page, PageHash hash) noexcept;
    //! Offloads every recorded eviction, a group at a time (see the class comment of TieredPrefixCache).
    void offloadEvicted(TierMover& mover);
    void offloadGroup(TierMover& mover, int32_t group);
    //! Offloads the checkpoints of the checkpoint group's evicted pages that a host page holds now into host states
    //! (one free each; none free: the checkpoint is dropped). Called after the group's page offload.
    void offloadStates(TierMover& mover, Group& group);
    //! Drops the hash of host page `hostPage` of group g (mapped, unpinned), and the host state it carried.
    void eraseHostPage(int32_t g, int32_t hostPage);
    //! Releases the host state of the checkpoint carried by the page of `hash` in group g, if any (its host page
    //! dropped it).
    void releaseState(int32_t g, PageHash hash);
    //! Returns whether a run of `pages` pages may end at a checkpoint: the device's, a host state's, or one a disk page
    //! of its end holds with the page (always true without state layers).
    bool checkpointThere(int32_t pages);
    //! Once the run is secured (its disk pages read back): returns whether it ends at a checkpoint the device or a host
    //! state holds, writing the host state to use, or -1 when the device's serves.
    bool checkpointHeld(int32_t pages, int32_t& hostState);
    void runCopies(TierMover& mover, StepCopies const& copies);
    //! Inserts `hash` into group g's host map; a host page given up for it goes to the disk tier first (spill()).
    HostPageMap::Insertion insertHostPage(TierMover& mover, int32_t g, PageHash hash);
    //! Writes host page `hostPage` of group g, which holds the page of `hash`, to a disk page (none without a disk
    //! tier). A write that fails with Error is counted (diskFailures) and leaves no disk page.
    //! The host state holding the checkpoint the page carries (-1: none) is written with it.
    void spill(TierMover& mover, int32_t g, int32_t hostPage, PageHash hash, int32_t hostState);
    //! Returns the host state holding the checkpoint of the page of `hash` in group g, or -1.
    int32_t stateOf(int32_t g, PageHash hash) const noexcept;
    //! Adopts the longest run of pages after `length` that the device, the host and the disk hold between them
    //! (PageManagerInternal::adoptRun) and onboards its fresh pages; returns its tokens.
    //! Writes to diskTokens the run's tokens whose page some group read back from the disk.
    int32_t onboardRun(TierMover& mover, SequenceId sequence, int32_t const* tokens, int32_t count, int32_t length,
        PageExtraKey const* keys, int32_t numKeys, int32_t& diskTokens);
    //! Returns where page `index` of the run in mHashes is in `group` (Group::runPlaces), looking it up once.
    RunPlace source(int32_t group, int32_t index);
    //! Returns whether every page a run of `pages` pages needs (all in full attention, the window before its end in a
    //! windowed group) is somewhere.
    bool runIsThere(NextPageHashes const& known, int32_t pages);
    //! Pins the host pages a run of `pages` pages needs and reads its disk pages into host pages; returns false when
    //! one could not be read back (it is nowhere then).
    bool secureRun(TierMover& mover, NextPageHashes const& known, int32_t pages);
    //! Reads disk page `diskPage` of group g into a new host page for page `index` of the run, pinned; returns false
    //! (dropping the disk page when it could not be read) when that fails.
    bool restore(TierMover& mover, int32_t g, int32_t index, int32_t diskPage);
    //! Offloads the adoption's evictions, then onboards each group's fresh pages from their host pages.
    void onboardFresh(TierMover& mover, NextPageHashes const& known);
    void unpinRun(NextPageHashes const& known) noexcept;
    //! Onboards host state `hostState` (holding the checkpoint of `hash`) into state slot `slot`, which adoptRun made
    //! that checkpoint's.
    void onboardState(TierMover& mover, PageHash hash, int32_t hostState, int32_t slot);
    static KeySlice keysIn(PageExtraKey const* keys, int32_t numKeys, int64_t begin, int64_t end) noexcept;

    PageManager* mPages = nullptr;
    int32_t mTokensPerPage = 0;
    std::vector<Group> mGroups;
    std::vector<PageHash> mHashes;
    //! Per page of an admission's run: 1 when some group read it back from the disk.
    std::vector<uint8_t> mRunFromDisk;
    //! The fresh pages of an admission's run, per group.
    std::vector<std::vector<FreshPage>> mFresh;
    //! Per group, its disk pages; empty without a disk tier.
    std::vector<HostPageMap> mDisks;
    TieredPrefixCacheStats mStats;
    int32_t mMinOffloadPriority = 0;
    //! The host and disk tiers' KV events since the last takeEvents() (when the manager records events).
    KVEventBatch mEvents;
    //! The group whose pages carry checkpoints (-1: none) and whether the manager has state layers.
    int32_t mCheckpointGroup = -1;
    bool mStateLayers = false;
    //! The host states: one map keyed by the carrier page's hash, or none.
    std::vector<HostPageMap> mStates;
    std::vector<HostStateEntry> mStateEntries;
    //! Per disk page of the checkpoint group (with host states and a disk tier): 1 when its file holds the
    //! checkpoint's state too.
    std::vector<uint8_t> mDiskStates;
    //! While step() offloads: the state copies the step hands out, which run after the offload.
    std::vector<StateSlotCopy> const* mStepStateCopies = nullptr;
};

} // namespace kvcache::rt::detail
