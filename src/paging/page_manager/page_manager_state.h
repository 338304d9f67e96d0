#pragma once

#include "paging/page_manager/page_manager_internal.h"
#include "paging/parts/boundaries/prefix_cuts.h"
#include "paging/parts/boundaries/state_checkpoints.h"
#include "paging/parts/group_policy.h"
#include "paging/parts/page_pool.h"
#include "paging/parts/prefix/prefix_cache.h"
#include "paging/parts/sequence_table.h"

#include "kvcache/paging/page_manager.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! What a PageManager is made of, and the operations that span its parts. The parts: per group a PagePool and a
//! GroupPolicy, the SequenceTable, the PrefixCache, a hybrid cache's PrefixCuts; the step's copy buffers.
struct PageManager::State
{
    KVCacheLayout layout;
    PageManagerOptions options;
    int32_t maxSequenceLength = 0;
    int32_t tokensPerPage = 0;
    //! tokensPerPage is a power of two: shifts and masks instead of divisions on the per-token paths.
    int32_t pageShift = 0;
    int64_t pageMask = 0;
    int32_t maxTokensPerStep = 0;
    std::vector<PagePool> pools;
    std::vector<GroupPolicy> policies;
    //! Whether any group releases pages that leave its window (else a step has nothing to release).
    bool anyWindowed = false;
    SequenceTable sequences;
    PrefixCache prefix;
    PrefixCuts cuts;
    //! The latest step's copies, one list per group, reused from step to step.
    std::vector<std::vector<PageCopy>> copies;
    //! Whether the layout has state layers: each sequence's row is its state slot.
    bool stateSlots = false;
    //! State copies queued by forks since the last step, and those the latest step handed out; each reserved for
    //! maxSequences copies (one per live fork child at most).
    std::vector<StateSlotCopy> pendingStateCopies;
    std::vector<StateSlotCopy> stateCopies;
    //! The state checkpoints (state layers and checkpoint slots); each checkpoint slot adds room for one queued copy.
    StateCheckpoints checkpoints;
    //! The step's page count per group (step(), pagesNeeded()).
    mutable std::vector<int64_t> stepNeeded;
    mutable std::vector<int64_t> stepReleased;
    int64_t copyOnWritePages = 0;
    int64_t prefixQueryTokens = 0;
    int64_t prefixHitTokens = 0;
    //! Scratch of adoptPrefix: the prompt's page hashes, and the page each group has cached under them (-1: not looked
    //! up, a windowed group's); adoptRun's lookups too.
    std::vector<PageHash> promptHashes;
    std::vector<int32_t> promptPages;

    //! Per tenant (distinct salt, by the root hash it gives), its prefix hits; up to kMAX_TENANTS, reserved at
    //! construction, then the bucket of other salts.
    struct Tenant
    {
        PageHash root = {};
        PrefixTenantStats stats;
    };
    std::vector<Tenant> tenants;
    PrefixTenantStats otherTenant;
    //! Returns the counters of tenant `index` (-1: the bucket of other salts).
    PrefixTenantStats& tenantStats(int32_t index) noexcept
    {
        return index < 0 ? otherTenant : tenants[static_cast<size_t>(index)].stats;
    }
    //! Returns the tenant of the salt whose root is `root`, adding it (a copy of its salt) while there is room.
    int32_t tenantOf(PageHash root, void const* salt, size_t saltBytes);

    //! KV events (options.recordEvents): what takeEvents() hands over.
    KVEventBatch events;
    //! Whether a sequence was created with a salt or an append carried extra keys since events were on: until then no
    //! stored page has key bytes.
    bool keysSeen = false;
    //! The pages one step entry or one adoptRun filled, in token order (page indices [firstIndex, firstIndex +
    //! count)), gathered so that each group's run of newly registered pages becomes one stored event.
    struct FilledPages
    {
        int32_t firstIndex = 0;
        int32_t count = 0;
        //! The hash of the page before the first (meaningful when firstIndex > 0).
        PageHash parent = {};
        std::vector<PageHash> hashes;
        //! Where each page's tokensPerPage token ids are (null: none), until recordFilled(): in the caller's tokens,
        //! or in partialTokens for the page the sequence's partial-page buffer completed.
        std::vector<int32_t const*> tokens;
        //! A copy of the one page per call whose tokens were in the partial-page buffer, which the rest of the append
        //! overwrites before recordFilled(); tokensPerPage entries.
        std::vector<int32_t> partialTokens;
        std::vector<KVEventPageKeys> keys;
        std::vector<uint8_t> keyBytes;
        //! Per group g and page k, at [g * maxEntries + k]: 1 when the page was newly registered in g.
        std::vector<uint8_t> fresh;
    };
    FilledPages filled;

    State(KVCacheLayout const& layout, PageManagerOptions const& options);

    int32_t numGroups() const noexcept
    {
        return static_cast<int32_t>(pools.size());
    }
    //! Pages that `tokens` tokens fill, the last possibly partial.
    int64_t pagesFor(int64_t tokens) const noexcept
    {
        return (tokens + pageMask) >> pageShift;
    }
    //! Sets up the cuts when the cache is hybrid; called once the pools and policies exist.
    void setUpCuts(int32_t maxEntries);
    //! Throws OutOfRangeError naming `what` for a group outside [0, numGroups()).
    void checkGroup(int32_t group, char const* what) const;

    //! Takes a page of `group` for a new holder: the most recently freed, else the cached one evictOne() evicts. The
    //! caller has checked that one is available.
    int32_t takePage(int32_t group)
    {
        PagePool& pool = pools[static_cast<size_t>(group)];
        if (pool.pages.numFree() > 0)
        {
            return pool.pages.allocate();
        }
        // A cache without cuts or checkpoints evicts the oldest cached page, inline: the path every step of such a
        // cache takes.
        int32_t const page =
            cuts.enabled() || checkpoints.enabled() ? evictOne(group) : prefix.evictOldest(group, pool);
        pool.pages.hold(page);
        return page;
    }
    //! Removes a holder from `page` of `group`: a registered page with no holder left becomes cached, others free.
    void releasePage(int32_t group, int32_t page)
    {
        // Whether the page is registered matters only to its last holder.
        pools[static_cast<size_t>(group)].release(page, [&](int32_t last) { return prefix.isRegistered(group, last); });
    }

    // Cuts of a hybrid cache (page_manager_cuts.cpp) --------------------------------------------------------------

    //! Drops the content of the cached page of `group` that goes first and returns it, kept and unregistered: the
    //! oldest on the list, after dropping the cuts the clock chooses while the list is empty, which happens only in a
    //! windowed group whose cached pages are all anchored; a full-attention page's cut goes with it, and a carrier
    //! page's checkpoint. The group must have a cached page.
    int32_t evictOne(int32_t group);
    //! Makes the cut of the first `pages` whole pages of the sequence in `row` (its hashes known) when it does not
    //! exist, and counts a hit on it when the sequence `adopted` those pages; makes none when the full-attention page
    //! or a window page is not registered.
    void makeCut(int32_t row, int32_t pages, bool adopted = false);
    //! Drops the cut `page` of the full-attention group carries: its window pages lose an anchor, and those left
    //! cached without one go before every other cached page of their group, the window's last page first.
    void dropCut(int32_t page);
    //! Notes that the sequence in `row` filled its page `index` (hashed `hash`, registered in every group): keeps the
    //! hash and makes the cuts the sequence waits for at that length.
    void filledPage(int32_t row, int32_t index, PageHash hash)
    {
        sequences.hashes(row)[index] = hash;
        SequenceState const& sequence = sequences[row];
        if (index + 1 == sequence.promptBoundary || index + 1 == sequence.matchBoundary)
        {
            makeCut(row, index + 1);
        }
    }
    void checkCutInvariants() const;

    // Validation (page_manager_step.cpp) ---------------------------------------------------------------------------

    void checkExtraKeys(char const* what, PageExtraKey const* keys, int32_t numKeys, int64_t begin, int64_t end) const;
    //! Checks every entry of a step as step() does, throwing what it throws; marks each listed sequence with a fresh
    //! stamp (duplicates). Returns whether an entry carries extra keys.
    bool checkStep(SequenceAppend const* appends, int32_t count) const;
    //! Writes to needed[g] the pages the (checked) step takes from group g and to released[g] those its window releases
    //! make available.
    void countStep(SequenceAppend const* appends, int32_t count, int64_t* needed, int64_t* released) const;

    // Operations ---------------------------------------------------------------------------------------------------

    StepCopies step(SequenceAppend const* appends, int32_t count);
    void releaseOutOfWindow(int32_t row);
    void appendOne(SequenceAppend const& append, int32_t row);
    void registerFilledPages(SequenceAppend const& append, int32_t row);
    //! Returns the hash of the page [start, start + tokensPerPage) the append fills, its extra keys those the sequence
    //! kept for it and the append's in it; forgets the kept ones.
    PageHash hashFilledPage(
        SequenceState& sequence, SequenceAppend const& append, int32_t const* pageTokens, int32_t start);
    int32_t adoptPrefix(int32_t row, int32_t const* tokens, int32_t count, PageExtraKey const* keys, int32_t numKeys);
    //! Returns how many whole prompt pages (of promptHashes) every windowed group can serve.
    int32_t windowedServedPages() const;
    //! Returns whether every windowed group can serve the first `pages` prompt pages (of promptHashes).
    bool windowedServes(int32_t pages) const;
    //! detail::PageManagerInternal::adoptRun, its arguments checked; fresh[g] is cleared and filled.
    bool adoptRun(int32_t row, detail::NextPageHashes const& known, int32_t pages,
        std::vector<std::vector<detail::FreshPage>>& fresh, bool hostState, int32_t& fillSlot);
    //! With state layers: the checkpoint a run ending at `hash` restores, -1 when none can be; writes whether it is
    //! a checkpoint slot still to take and fill from the host (`hostState` says the caller has the state there).
    int32_t runCheckpoint(int32_t row, PageHash hash, bool hostState, bool& fromHost) const;
    int32_t hashNextPages(
        int32_t row, int32_t const* tokens, int32_t count, PageHash* out, PageExtraKey const* keys, int32_t numKeys);
    void checkInvariants() const;
    void checkGroupInvariants(int32_t group) const;
    //! Checks the free rows (state slots) and the queued state copies.
    void checkSlotInvariants() const;

    // State slots (page_manager_state_slots.cpp) ----------------------------------------------------------------

    //! Queues the copy of the parent's state into the fork child's slot `row` (state layers only).
    void queueForkCopy(int32_t parentRow, int32_t row) noexcept;
    //! Drops the queued copy into the slot of the sequence in `row`, which is being freed, and returns whether a
    //! queued copy reads the slot (the row is then held until the next step).
    bool freeState(int32_t row) noexcept;
    //! Hands the queued copies to the step being made (stateCopies), starts a new list, and frees the held rows.
    void takeStateCopies() noexcept;
    //! Drops the queued copy into the slot of the waiting sequence in `row` (its stateSource) and clears its source.
    void dropCopyInto(int32_t row) noexcept;

    // State checkpoints (page_manager_checkpoints.cpp) -------------------------------------------------------------

    //! Sets up the checkpoints when the layout has state layers and checkpoint slots; called once stateSlots is set.
    void setUpCheckpoints();
    //! Returns the longest prefix, at most `pages` pages of promptHashes, that every group can serve with an adoptable
    //! checkpoint at its end, and writes that checkpoint to `index` (-1 with 0).
    int32_t checkpointedPages(int32_t pages, int32_t& index) const;
    //! Queues the restore of checkpoint `index` into the slot of the sequence in `row` and counts a hit on it.
    void restoreCheckpoint(int32_t row, int32_t index) noexcept;
    //! Returns an empty checkpoint slot (the lowest), else the one the clock reuses (its checkpoint dropped), or -1
    //! when every slot is read or filled by a queued copy.
    int32_t takeCheckpointSlot() noexcept;
    //! Forgets checkpoint `index` (its carrier page evicted, or its slot reused); a queued copy into it still runs.
    void dropCheckpoint(int32_t index) noexcept;
    bool checkpointState(int32_t row);
    int32_t checkpointBoundary(int32_t row) const;
    void checkCheckpointInvariants() const;

    // Retention durations (page_manager_retention.cpp) -----------------------------------------------------------

    //! Returns the options' clock reading, in milliseconds.
    int64_t now() const;
    //! Drops the timed priorities whose end has come (PagePool::expireFirst), in every group.
    void expireRetention();

    // KV events (page_manager_events.cpp) -----------------------------------------------------------------------

    bool recordsEvents() const noexcept
    {
        return options.recordEvents;
    }
    //! Sizes the scratch of stored events and records AllBlocksCleared; called once from the constructor.
    void setUpEvents(int32_t maxEntries);
    //! Reserves the room the events of the (checked, counted) step may take, `withKeys` when an entry carries extra
    //! keys; throws std::bad_alloc.
    void reserveStepEvents(SequenceAppend const* appends, int32_t count, bool withKeys);
    //! Starts gathering the pages the sequence in `row` fills from page index `firstIndex`.
    void beginFilled(int32_t row, int32_t firstIndex);
    //! Adds the next filled page: its hash, its tokens (null: none) and the extra-key bytes its hash mixed in.
    void addFilled(
        int32_t row, PageHash const& hash, int32_t const* tokens, uint8_t const* keyBytes, size_t numKeyBytes);
    //! addFilled() with the bytes of the extra keys among `keys` (sorted by position) that fall in the page.
    void addFilled(int32_t row, PageHash const& hash, int32_t const* tokens, PageExtraKey const* keys, int32_t numKeys);
    //! Notes that the filled page `k` (0 for the first added) was newly registered in `group`.
    void markFresh(int32_t group, int32_t k) noexcept
    {
        filled
            .fresh[static_cast<size_t>(group) * static_cast<size_t>(sequences.maxEntries()) + static_cast<size_t>(k)] =
            1;
    }
    //! Copies the tokensPerPage token ids at `tokens` to filled.partialTokens and returns them there.
    int32_t const* keepPartialTokens(int32_t const* tokens) noexcept;
    //! Adds the next filled page's hash, tokens and salt (page 0 only), its key count still 0.
    void openFilled(int32_t row, PageHash const& hash, int32_t const* tokens);
    //! Records one stored event per group and run of fresh pages gathered, and forgets them.
    void recordFilled();
};

} // namespace kvcache::rt
