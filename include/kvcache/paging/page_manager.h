#pragma once

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/paging/kv_events.h"
#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_table.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace kvcache::rt
{

//! Names a sequence of a PageManager. The low 32 bits are a row of the sequence table, the high bits a generation, so
//! an id is never reused: an id of a freed sequence is refused, even after its row serves a new one.
using SequenceId = int64_t;

//! How a PageManager hashes pages and how many sequences it holds.
struct PageManagerOptions
{
    //! Sequences alive at once, forks included; 0 means the config's maxBatchSize.
    int32_t maxSequences = 0;
    //! Whether full pages are hashed, kept after their last holder lets go, and adopted by new sequences.
    bool enablePrefixCaching = true;
    //! The hash of page contents. SHA-256 (the default) is collision resistant; XXH3-128 is faster but an adversary
    //! who knows the seed can make two prompts collide: use it only when every prompt is trusted.
    PageHashAlgorithm hashAlgorithm = PageHashAlgorithm::kSHA256;
    //! The hash seed; absent, a random one per process. Give one to reuse pages across processes (e.g. saved files).
    std::optional<std::array<uint8_t, 32>> hashSeed = {};
    //! Whether the manager records KV events for takeEvents() (a cache-aware router learns what it holds from them);
    //! off, nothing is recorded and nothing is reserved.
    bool recordEvents = false;
    //! The clock of retention durations (PageManager::setRetention), in milliseconds, never going back; empty: the
    //! steady clock. Called by setRetention with a duration, and by step(), append() and evictCached() while a
    //! duration is in force.
    std::function<int64_t()> clock = {};
    //! With state checkpoints (class comment, "State checkpoints"), ask for one every this many pages of a sequence
    //! (checkpointBoundary()); 0 asks for none but the prompt's and the match's. Must be >= 0.
    int32_t checkpointIntervalPages = 0;
};

//! Mixes `key` (e.g. a multimodal item's hash) into the hash of the page that holds token `position`.
struct PageExtraKey
{
    //! A token position of the sequence, [0, maxSequenceLength).
    int32_t position = 0;
    PageHash key = {};
};

//! What a sequence is created with.
struct SequenceOptions
{
    //! Bytes mixed into the start of the hash chain (per-tenant salt, LoRA adapter id, ...): sequences with different
    //! salts never share a page through prefix reuse. May be null when saltBytes is 0.
    void const* salt = nullptr;
    size_t saltBytes = 0;
};

//! Tokens to append to one sequence in a step.
struct SequenceAppend
{
    SequenceId sequence = -1;
    //! count token ids (null when count is 0).
    int32_t const* tokens = nullptr;
    //! [0, maxTokensPerStep]; the sequence's length after the append must stay within maxSequenceLength.
    int32_t count = 0;
    //! Extra hash keys of pages these tokens complete, positions within [old length, new length); may be null.
    PageExtraKey const* extraKeys = nullptr;
    int32_t numExtraKeys = 0;
};

//! The copies one step() or append() queued, one list per page group, in the order they must run (a page may be the
//! destination of one copy and later the source of another only through distinct steps, never within one list), and
//! the state slot copies of the forks made since the step before (stateCopies()). A view into buffers the PageManager
//! reuses: valid until the manager's next step(), append() or destruction.
class StepCopies
{
public:
    //! Returns a view of no groups.
    StepCopies() noexcept = default;
    //! Returns a view of `numGroups` lists starting at `groups` (the manager's buffers) and of the state slot copies
    //! `stateCopies` (null: none).
    StepCopies(std::vector<PageCopy> const* groups, int32_t numGroups,
        std::vector<StateSlotCopy> const* stateCopies = nullptr) noexcept
        : mGroups(groups)
        , mNumGroups(numGroups)
        , mStateCopies(stateCopies)
    {
    }
    //! Returns the number of page groups.
    int32_t numGroups() const noexcept
    {
        return mNumGroups;
    }
    //! Returns the copies of `group`; throws OutOfRangeError for a group outside [0, numGroups()).
    std::vector<PageCopy> const& operator[](int32_t group) const;
    //! Returns whether no group has a copy (page copies only: see stateCopies()).
    bool empty() const noexcept;
    //! Returns the number of page copies, all groups (state copies not counted).
    int64_t size() const noexcept;
    //! Returns the state slot copies queued since the previous step (forks, checkpoints saved, checkpoints restored),
    //! in the order they were queued; empty without state layers. They run before the step's kernels, as the page
    //! copies do, in any order (PageManager, "State slots" and "State checkpoints").
    std::vector<StateSlotCopy> const& stateCopies() const noexcept;

private:
    std::vector<PageCopy> const* mGroups = nullptr;
    int32_t mNumGroups = 0;
    std::vector<StateSlotCopy> const* mStateCopies = nullptr;
};

//! Pages of one page group, by state. Every page is in exactly one state: free (no holder, no cached content),
//! used (held by one or more sequences) or cached (no holder, its hash kept for prefix reuse until evicted).
struct PageGroupCounts
{
    int32_t numPages = 0;
    int32_t free = 0;
    int32_t used = 0;
    int32_t cached = 0;
    //! Used pages with more than one holder (forks, adopted prefixes); a part of `used`.
    int32_t shared = 0;
    //! Cached pages in the window of a cut (a windowed group of a hybrid cache; see PageManager), evicted only after
    //! the group's other cached pages; a part of `cached`.
    int32_t anchored = 0;
};

//! Prefix reuse and copy-on-write since construction (or resetStats()).
struct PageManagerStats
{
    //! Tokens offered to adoptPrefix() and tokens it found cached.
    int64_t prefixQueryTokens = 0;
    int64_t prefixHitTokens = 0;
    //! Cached pages whose content was dropped to reuse the page, all groups.
    int64_t evictedPages = 0;
    //! Copies queued because a sequence wrote to a page it shared, all groups.
    int64_t copyOnWritePages = 0;
    //! State checkpoints made (a copy into a checkpoint slot queued), restored by adoptPrefix() (or by a
    //! TieredPrefixCache admission's run: one restore an admission), and dropped (their carrier page evicted, or their
    //! slot reused for another).
    int64_t checkpointsSaved = 0;
    int64_t checkpointsRestored = 0;
    int64_t checkpointsDropped = 0;
};

//! Prefix hits of one tenant: the sequences created with one salt (SequenceOptions), since construction (or
//! resetStats()). The tiers are disjoint: a token found on the device is not counted again on the host or disk.
struct PrefixTenantStats
{
    //! The salt's bytes (empty: sequences without a salt).
    std::vector<uint8_t> salt;
    //! The bucket of every salt past PageManager::kMAX_TENANTS distinct ones (salt then empty).
    bool other = false;
    //! Tokens offered to adoptPrefix() (TieredPrefixCache::admit() included).
    int64_t queryTokens = 0;
    //! Of those, tokens adopted from the device, brought back from a host tier, and read back from a disk tier
    //! (the last two through a TieredPrefixCache).
    int64_t deviceHitTokens = 0;
    int64_t hostHitTokens = 0;
    int64_t diskHitTokens = 0;
};

namespace detail
{
//! The library's own access to a PageManager beyond its public calls (src/paging/page_manager/page_manager_internal.h).
class PageManagerInternal;
} // namespace detail

//! Called once for each cached page whose content was dropped (evicted to be reused, or by evictCached()): its group,
//! page id and hash. The calls of one PageManager call are made at its end, in eviction order, once the manager is
//! consistent again; the page's device bytes are still intact then (the manager never touches them), and work the
//! callback enqueues (e.g. an offload to host memory) must be ordered before the kernels of the step that reuses the
//! page. It must not call back into the PageManager. When it throws, the evicting call has completed (the page free
//! or taken, its hash dropped, every other change made, the callback still called for the call's other evicted pages)
//! and the first exception propagates out of it; for step() and append(), lastCopies() then returns the copies the
//! step queued, which must still run.
using EvictionCallback = std::function<void(int32_t group, int32_t page, PageHash hash)>;

//! The page lifecycle of one cache, on the host: which page ids each sequence holds in each page group, sharing
//! between forks with copy-on-write, prefix reuse through chained page hashes with least-recently-used eviction, and
//! the page lists attention kernels read. It never touches device memory: step() returns the copies it asks for, one
//! PageCopy list per group (StepCopies), to run with copyPages before the step's kernels write; it allocates nothing
//! after construction except in checkInvariants() and tenantStats(), at create() for a salt it has not seen (a copy
//! for its tenant's counters, kMAX_TENANTS at most), and with recordEvents when the events outgrow their buffers
//! (takeEvents). pagesNeeded() and canStep() tell, changing nothing, what a step
//! would take: running out of pages is a routine scheduling event, not an error to provoke.
//!
//! Sequences: a sequence holds, in each group, one entry per page of its tokens in token order. In a group with a
//! sliding window W, pages whose tokens all lie more than W - 1 tokens before the first token being appended are
//! released, their entries becoming kUNUSED_PAGE_ENTRY; at most the group's pagesPerSequence pages stay held. A
//! sequence's last page is partial when its length is not a multiple of tokensPerPage. fork() shares every page with
//! the parent (reference counts); the first append to a shared partial page by any of its holders moves that
//! holder to a fresh page and queues a copy of the shared one (copy-on-write). Full pages are never written again.
//!
//! Prefix reuse (enablePrefixCaching): when a page becomes full its hash is chained from the previous page's hash
//! (the first from the sequence's root, made from the seed and the salt), its token ids and its extra keys, and the
//! page is registered in its group's cache unless that hash is already there. A page that loses its last holder
//! stays cached if it is registered, and is free otherwise. adoptPrefix() gives an empty sequence the longest run of
//! whole pages of a prompt found cached in every group (for a windowed group, the pages covering the window before
//! the first token to compute), at most the prompt's length minus one token, so a runtime always computes at least
//! the last prompt token.
//!
//! Hybrid caches (prefix caching on, a full-attention group and one or more windowed groups, as gpt-oss, Gemma 3 or
//! Command R7B have): a prefix of k whole pages is adoptable when the full-attention group has its pages 0..k-1 cached
//! and each windowed group the pages its window at token k * tokensPerPage reaches, so the manager keeps those windows
//! as units, called cuts. A cut of k pages is made for a sequence: by adoptPrefix(), at the pages it adopted; once the
//! sequence's whole pages reach them (entries register, group by group, then the cut), at the prompt's whole pages
//! before its last token and at the run of prompt pages adoptPrefix() found in the full-attention group, each when
//! larger than what it adopted (the last adoptPrefix() call of the sequence counts; forks inherit these); and by
//! free(), at its whole pages, before its pages are let go. A cut is made only when the full-attention page of entry
//! k - 1 and every page of its windows are registered (found by hash); it hangs on that full-attention page (making
//! it again changes nothing) and anchors its windows' pages. adoptPrefix() counts a hit on the cut of the prefix it
//! adopted (making it first when there is none). An anchored cached page counts in counts().cached and
//! counts().anchored and is evicted only after every unanchored cached page of its group. When a windowed group must
//! evict and all its cached pages are anchored, cuts are dropped, chosen as "Boundaries kept" says, until one is not.
//! Evicting a full-attention page drops the cut it carries. A dropped cut's window pages left cached with
//! no anchor go before every other cached page of their group, the window's last page first: no cut needs them. Caches
//! of one group, of windowed groups only, or without prefix caching make no cuts.
//!
//! Extra keys enter the hash of the page holding their position: 20 bytes each, in position order (the position's
//! offset in the page as int32, then key.lo and key.hi as uint64, little-endian), as PageHasher::next's extra bytes.
//! Keys given for a page that is not full yet are kept until it fills (more than four on one page allocate).
//!
//! Order, so that page ids are predictable: a group's pages are taken from its free pages first, most recently freed
//! first (a new manager hands out 0, 1, 2, ...), then from its cached pages, lowest retention priority first
//! (setRetention) and least recently released first within one (evicting them; in a hybrid cache, unanchored ones
//! first, as above). step() and append() skip entries of 0 tokens (no window release either); for the others they first
//! release every entry's out-of-window pages (entries in list order, groups ascending, pages ascending), so that a page
//! one sequence lets go of can serve another in the same step; then, entry by entry in list order and, within an entry,
//! group by group: a shared partial last page is replaced (new page taken, copy queued, shared page released), then new
//! pages are taken in token order; after all of an entry's pages are taken, the pages it filled are hashed and
//! registered in every group. free() releases a sequence's entries last page first, group by group (so a prompt's later
//! pages are evicted before its earlier ones). adoptPrefix() and fork() take pages in token order. evictCached() puts
//! the pages it empties on top of the free pages, in the order it evicts them.
//!
//! State slots (a layout with state layers: KVCacheLayout::stateLayers, docs/layout.md "State layers"): a sequence
//! holds one state slot from create() or fork() to free(): the row of its id (SequenceId's low 32 bits), an index in
//! [0, maxSequences), within the maxBatchSize slots of running sequences; checkpoint slots [maxBatchSize,
//! numStateSlots) are never handed out. Order, like pages: a new manager hands out slots 0, 1, 2, ..., then the most
//! recently freed slot first. A new sequence's slot holds whatever its last holder left: the runtime sets the initial
//! state (zeros, or the kernels' has_initial_state false) of a sequence of length 0. fork() queues a copy of the
//! parent's state into the child's slot, from the slot that holds it: the parent's, or, when the parent is a fork
//! child whose copy is still queued, that copy's source. The next successful step() or append() hands the queued
//! copies out (StepCopies::stateCopies(), lastCopies()), to run before its kernels as the page copies do, and starts a
//! new list. No copy reads a slot a queued copy fills, so they may run in any order (one launch). To keep it so, free()
//! of a sequence whose slot a queued copy reads holds the slot (its row) back until that step: it then goes on the
//! free slots, in the order freed; until then create() and fork() may find no free slot while fewer than maxSequences
//! are alive (InvalidArgumentError naming the held rows). free() of a fork child drops the copy into its slot.
//! pendingStateCopies() shows the list before the step. stateSlots() writes the slots of a batch, the per-row table
//! (vLLM's state_indices) that batched recurrent kernels read.
//!
//! State checkpoints (state layers, numCheckpointSlots > 0, prefix caching on): with state layers a prefix of k whole
//! pages is adoptable only when a checkpoint slot [maxBatchSize, numStateSlots) holds the state after its token
//! k * tokensPerPage: a checkpoint, keyed by the hash of the prefix's page k - 1 (which chains the whole prefix and
//! its salt) and carried by the page registered under that hash in the carrier group (the first full-attention group,
//! else group 0). adoptPrefix() then gives the longest prefix every group can serve: its pages cached in every
//! full-attention group, each windowed group's window before it, and an adoptable checkpoint at its end; it queues
//! the restore (the checkpoint's slot to the sequence's) with the fork copies, and counts a hit on the checkpoint.
//! Without checkpoint slots or with prefix caching off, a layout with state layers adopts nothing. The runtime saves
//! checkpoints: checkpointBoundary() tells where the manager asks for one (the end of the prompt's last whole page
//! before its last token, the end of the run of pages adoptPrefix() found cached past what it adopted, and every
//! checkpointIntervalPages pages); the runtime ends a prefill chunk there, runs the step, and calls checkpointState(),
//! which queues the copy of the sequence's slot (its source, when a fork or restore copy into it is still queued)
//! into a checkpoint slot. A checkpoint is adoptable from the step that hands its copy out. Empty slots are taken
//! first, lowest first; then the checkpoint to drop is chosen as "Boundaries kept" says, a restore counting a hit, and
//! a slot a queued copy reads or fills is never reused before the step. Evicting a checkpoint's carrier page drops it
//! (its prefix is gone; a TieredPrefixCache with host states moves its state to the host with the page, and brings it
//! back into a checkpoint slot with a run ending there). Queued copies still never read a slot one fills; so an empty
//! sequence whose slot a queued copy reads (forked since the last step) adopts nothing, and a restore into a fork child
//! replaces the child's copy.
//!
//! Boundaries kept: a windowed group's cut and a state layer's checkpoint are what the manager keeps at a page
//! boundary so that a prefix ending there stays adoptable, beside the full-attention pages. Which one goes first
//! follows one rule, so that those that get hit stay and those made and never hit go: each is on a clock, joining
//! behind the hand with a count of 0; a hit raises its count (at most 3). Those never hit since they were made are
//! also kept in the order made, and while there are more of them than a target, the oldest goes; otherwise the hand
//! lowers each positive count it passes and takes the first at 0. The target starts at the carrier group's pages (cuts)
//! or the checkpoint slots (checkpoints) and adapts: the manager remembers at the carrier page, while the page keeps
//! its content, whether a dropped cut or checkpoint had been hit; made again there, it joins as if hit, and the target
//! rises by one when it had not been hit (boundaries needed more time) or falls to one less than those never hit when
//! it had (they took the room of those that get hit).
//!
//! Every call validates everything before it changes anything: a rejected call throws and leaves the state as it
//! was. Not thread-safe: one owner at a time. Movable, not copyable.
class PageManager
{
public:
    //! Sizes everything for `layout` (a KVCacheManager's layout(), or computeLayout's) and `options`: each group's
    //! numPages, maxSequences sequences of up to maxSequenceLength tokens. Throws InvalidArgumentError for a bad option
    //! (maxSequences < 0, or above maxBatchSize, the sequences' state slots, when the layout has state layers) or a
    //! layout with no page groups, no maxSequenceLength, or state layers with numStateSlots below maxBatchSize,
    //! std::bad_alloc.
    explicit PageManager(KVCacheLayout const& layout, PageManagerOptions const& options = {});
    //! PageManager(computeLayout(config), options). Throws InvalidConfigError for a bad config, and what the layout
    //! constructor throws.
    explicit PageManager(KVCacheConfig const& config, PageManagerOptions const& options = {});
    ~PageManager();
    PageManager(PageManager&&) noexcept;
    PageManager& operator=(PageManager&&) noexcept;
    PageManager(PageManager const&) = delete;
    PageManager& operator=(PageManager const&) = delete;

    //! Returns a new empty sequence. Throws InvalidArgumentError when maxSequences are alive, when the free slots left
    //! are held until the next step (class comment, "State slots"), or for a null salt with saltBytes > 0.
    SequenceId create(SequenceOptions const& options = {});

    //! Gives the empty sequence `sequence` the longest cached prefix of `tokens[0, count)` (whole pages, at most
    //! count - 1 tokens; with state layers, one with a checkpoint, whose restore it queues: class comment, "State
    //! checkpoints") and returns its length in tokens (0 when nothing is cached or prefix caching is off). The
    //! sequence then holds those pages and has that length; the runtime appends the remaining tokens. extraKeys are
    //! those of the prompt's pages (positions in [0, count)). Counts count query tokens and the result as hit tokens
    //! in stats(). Throws InvalidArgumentError for an unknown or non-empty sequence, count outside
    //! [0, maxSequenceLength], null pointers with nonzero lengths, extra keys out of order or outside [0, count).
    int32_t adoptPrefix(SequenceId sequence, int32_t const* tokens, int32_t count,
        PageExtraKey const* extraKeys = nullptr, int32_t numExtraKeys = 0);

    //! Writes to out[0, count / tokensPerPage) the hashes the full pages of `tokens[0, count)` would be registered
    //! under if they were appended to `sequence` now, returns how many it wrote, and changes nothing. This is the
    //! prefix hit on another tier: after adoptPrefix(), look these hashes up where evicted pages went (the eviction
    //! callback's hashes, e.g. a HostTier's host pages), append() the tokens of the run found (fresh pages, registered
    //! under these same hashes) and fill those pages (HostTier::onboard) before the step's kernels read them. extraKeys
    //! as append() takes them (positions in [length, length + count)). Throws InvalidArgumentError for an unknown
    //! sequence, a length that is not a multiple of tokensPerPage, count outside [0, maxSequenceLength - length],
    //! null pointers with nonzero lengths, extra keys out of order or outside the positions.
    int32_t hashNextPages(SequenceId sequence, int32_t const* tokens, int32_t count, PageHash* out,
        PageExtraKey const* extraKeys = nullptr, int32_t numExtraKeys = 0) const;
    //! Appends tokens to one sequence: step() with one entry; returns its copies.
    StepCopies append(SequenceAppend const& append);

    //! Appends tokens to each listed sequence (each at most once), all or nothing: first every entry is checked and
    //! the pages the whole step needs are counted (new pages, copy-on-write pages) against the free and cached pages
    //! of each group (windowed groups counting the pages the step releases that no other sequence holds); then
    //! out-of-window pages are released, shared partial pages are copied, new pages taken, and pages that become
    //! full hashed and registered, in the order the class comment gives. Returns the copies the step queued (valid
    //! until the next step() or append()). Throws InvalidArgumentError for an unknown or repeated sequence, a count
    //! outside [0, maxTokensPerStep], a length past maxSequenceLength, null pointers, extra keys out of order or
    //! outside the appended positions; OutOfMemoryError naming the group, the pages needed and the pages available;
    //! nothing changes then. An exception from the eviction callback propagates after the step completed
    //! (EvictionCallback).
    StepCopies step(SequenceAppend const* appends, int32_t count);

    //! Writes to out[g] the pages step(appends, count) would take from group g (new pages and copy-on-write pages)
    //! less the pages its window releases would make available (those no other sequence holds), for every group
    //! g < numGroups(); changes nothing. A value above counts(g).free + counts(g).cached means the step would run out
    //! of pages in g. Throws what step() throws for invalid input (never OutOfMemoryError), and InvalidArgumentError
    //! for a null `out`.
    void pagesNeeded(SequenceAppend const* appends, int32_t count, int64_t* out) const;
    //! Returns whether step(appends, count) would succeed; changes nothing. Returns false exactly when step() would
    //! throw OutOfMemoryError; throws what step() throws for invalid input.
    bool canStep(SequenceAppend const* appends, int32_t count) const;
    //! Returns the copies of the latest step() or append() (what it returned, or would have returned when the eviction
    //! callback threw); empty lists before the first. Valid until the next step() or append().
    StepCopies lastCopies() const noexcept;

    //! Returns a new sequence holding the same pages as `parent` (each one more holder), with its length, its hash
    //! chain and its salt; with state layers, in a state slot of its own, a copy of the parent's state queued for the
    //! next step (class comment, "State slots"). Throws InvalidArgumentError for an unknown parent, when maxSequences
    //! are alive, or when the free slots left are held until the next step.
    SequenceId fork(SequenceId parent);

    //! Lets go of every page of `sequence` (a registered page left with no holder becomes cached, others free), frees
    //! its state slot (dropping a queued copy into it; held until the next step when a queued copy reads it) and
    //! forgets it. Throws InvalidArgumentError for an unknown
    //! sequence (never created, or freed already).
    void free(SequenceId sequence);

    //! Returns the state slot of `sequence` (class comment, "State slots"), or -1 when the layout has no state layers.
    //! Throws InvalidArgumentError for an unknown sequence.
    int32_t stateSlot(SequenceId sequence) const;
    //! Writes to out[i] the state slot of sequences[i] for i in [0, count) (-1 each without state layers): the slot
    //! table of a batch, one int32 per row (vLLM's state_indices), to copy to the device for the step's kernels. The
    //! table is host memory; the runtime uploads it to a buffer of maxBatchSize int32 at a fixed address (e.g. from
    //! pinned memory with cudaMemcpyAsync) so a captured graph keeps reading it. Throws InvalidArgumentError for a
    //! negative count, null pointers with count > 0 or an unknown sequence (naming its index); `out` is then
    //! untouched.
    void stateSlots(SequenceId const* sequences, int32_t count, int32_t* out) const;
    //! Returns the state copies queued by forks, checkpointState() and adoptPrefix() since the last successful step()
    //! or append(), which the next one returns (StepCopies::stateCopies()); valid until the next call that queues or
    //! drops one (fork(), free(), adoptPrefix(), checkpointState(), step(), append()).
    std::vector<StateSlotCopy> const& pendingStateCopies() const noexcept;

    //! Returns the next length, greater than the sequence's, at which the manager asks for its state to be saved
    //! (class comment, "State checkpoints"): a multiple of tokensPerPage within maxSequenceLength, or -1 when it asks
    //! for none (always -1 without checkpoints). A runtime ends the sequence's prefill chunk there (or before it), runs
    //! the step, and then calls checkpointState(). Throws InvalidArgumentError for an unknown sequence.
    int32_t checkpointBoundary(SequenceId sequence) const;
    //! Tells the manager that the sequence's state slot holds (or, once the queued copies into it ran, will hold) the
    //! state after its length tokens, and asks it to keep that state as the checkpoint of the sequence's prefix: queues
    //! the copy into a checkpoint slot (taking an empty one, else the clock's choice) for the next step. Returns true
    //! when the prefix has a checkpoint now (made, or there already), false when none could be kept (no checkpoints,
    //! the last page not registered in the carrier group, every checkpoint slot read or filled by a queued copy).
    //! Throws InvalidArgumentError for an unknown sequence, a layout without state layers, or a length that is 0 or
    //! not a multiple of tokensPerPage; nothing changes then.
    bool checkpointState(SequenceId sequence);
    //! Returns the state slot holding the checkpoint of the prefix whose last page has `hash` (adoptable or still
    //! filling), or -1.
    int32_t checkpointSlot(PageHash const& hash) const noexcept;
    //! Returns the number of checkpoints held.
    int32_t numCheckpoints() const noexcept;

    //! Returns whether `sequence` is alive.
    bool contains(SequenceId sequence) const noexcept;
    //! Returns the sequence's length in tokens. Throws InvalidArgumentError for an unknown sequence.
    int32_t length(SequenceId sequence) const;
    //! Returns the sequence's page entries in `group` (its length's pages, kUNUSED_PAGE_ENTRY for those a window
    //! released) and its length, as PageTableBuffers::build takes them. Entries cover the whole length in every
    //! group, but a table counts only resident pages against its width, so the group's pagesPerSequence is wide
    //! enough for a windowed group as for a full one (StepArgumentBuffers builds every group's table at that width).
    //! The pointer stays valid until the sequence
    //! changes or is freed. Throws InvalidArgumentError for an unknown sequence, OutOfRangeError for a bad group.
    SequencePages pages(SequenceId sequence, int32_t group) const;

    //! Drops the content of up to `count` cached pages of `group`, in the order taking pages evicts them (least
    //! recently released first; a hybrid cache's cuts as the class comment says), calling the eviction callback and
    //! counting them in stats().evictedPages, making them free; returns how many it dropped.
    //! Throws OutOfRangeError for a bad group, InvalidArgumentError for a negative count; an exception from the
    //! eviction callback propagates after every page was dropped (EvictionCallback).
    int32_t evictCached(int32_t group, int32_t count);
    //! Sets the function called for each evicted page (empty: none).
    void setEvictionCallback(EvictionCallback callback);

    //! The retention priority of a page that no call raised.
    static constexpr int32_t kDEFAULT_RETENTION_PRIORITY = 35;
    //! The highest retention priority; the lowest is 0.
    static constexpr int32_t kMAX_RETENTION_PRIORITY = 100;
    //! Sets a retention priority on every page `sequence` holds, in every group, that has a token in
    //! [firstToken, endToken) (pages a window released are skipped). A page's priority is the highest set on it by its
    //! holders since it was last free, kDEFAULT_RETENTION_PRIORITY while none was (so a priority below the default
    //! holds only where no holder set a higher one). A page keeps its priority when it becomes cached (that is, as its
    //! last holder left it), and a sequence that adopts it from the cache finds it so; it is unset again when the page
    //! becomes free (released unregistered, or evicted). Cached pages are evicted lowest priority first, least recently
    //! released first within one priority (the class comment's order, level by level); in a windowed group of a hybrid
    //! cache, anchoring comes first: pages no cut needs go before anchored ones whatever their priorities, and a
    //! dropped cut's pages go first within their priority.
    //!
    //! With `durationMs` (>= 0, not kNO_DURATION) the priority holds for that many milliseconds of the options' clock
    //! from this call, as TensorRT-LLM's durations do; then the page has the priority it would have without it. A page
    //! keeps one such timed priority beside the others: the highest set (an equal one set later extends it; a lower one
    //! set while a higher one holds is dropped). A duration's end takes effect at the start of the next step(),
    //! append() or evictCached(): a cached page whose priority that changes moves to its new priority as the most
    //! recently released there. Throws InvalidArgumentError for an unknown sequence, a priority outside [0,
    //! kMAX_RETENTION_PRIORITY], a durationMs outside [0, kMAX_RETENTION_DURATION_MS] other than kNO_DURATION, or a
    //! range not within [0, length(sequence)] (an empty range is allowed and changes nothing); nothing changes then.
    //! Allocates nothing.
    void setRetention(
        SequenceId sequence, int32_t firstToken, int32_t endToken, int32_t priority, int64_t durationMs = kNO_DURATION);
    //! setRetention's durationMs for a priority without an end.
    static constexpr int64_t kNO_DURATION = -1;
    //! The longest retention duration: a year.
    static constexpr int64_t kMAX_RETENTION_DURATION_MS = int64_t{365} * 24 * 3600 * 1000;
    //! Returns the retention priority of `page` of `group` (see setRetention; a duration that has ended counts until
    //! the next step(), append() or evictCached()). Throws OutOfRangeError for a bad group or page.
    int32_t retentionPriority(int32_t group, int32_t page) const;

    //! Hands over the KV events recorded since the last call (PageManagerOptions::recordEvents; none otherwise): `out`
    //! is cleared and then holds them, in the order they happened, and the manager keeps `out`'s old buffers for the
    //! next ones (KVEventBatch). Called after each step(), one batch a step. The events, all of medium GPU:
    //! - AllBlocksCleared, once, first: a new manager holds nothing, whatever an earlier process on the same endpoint
    //!   said.
    //! - Stored, when pages are registered (step(), append(), and pages a tiered cache brings back): one event per
    //!   group and run of consecutive pages of one sequence newly registered in that group, with their hashes, the
    //!   hash of the page before the run (none for the sequence's first page), their token ids (tokensPerPage a
    //!   page) and, per page, the sequence's salt (its first page only) and the page's extra keys.
    //! - Removed, when a cached page is evicted (taken for reuse or by evictCached()); consecutive evictions of one
    //!   group form one event.
    //! A page registered under a hash another page of its group holds already is not stored again. The calls that
    //! record events reserve the room they need before they change anything; the buffers grow to the largest batch
    //! and are then reused (a salt longer than any its row had before is copied into a larger buffer at create() and
    //! fork()). Throws nothing.
    void takeEvents(KVEventBatch& out) noexcept;

    //! Returns the page counts of `group`. Throws OutOfRangeError for a bad group.
    PageGroupCounts counts(int32_t group) const;
    //! Returns the prefix and copy-on-write counters.
    PageManagerStats stats() const noexcept;
    //! Returns the prefix hits of each tenant (salt) seen, in the order their first sequence was created: each salt
    //! is kept once, up to kMAX_TENANTS of them; sequences of later new salts count in one last entry marked
    //! `other`. Allocates the snapshot.
    std::vector<PrefixTenantStats> tenantStats() const;
    //! Distinct salts counted apart by tenantStats().
    static constexpr int32_t kMAX_TENANTS = 256;
    //! Sets every counter of stats() and tenantStats() to 0 (the tenants seen stay listed).
    void resetStats() noexcept;

    //! Returns normally when the state is consistent; throws std::logic_error describing the first broken invariant:
    //! every page is free xor used xor cached; a page's reference count equals the number of entries that hold it
    //! across live sequences; free pages appear once in the free list, unanchored cached pages once in the LRU list,
    //! and exactly the registered pages have a hash, each hash once in its group's cache; no sequence holds more pages
    //! of a windowed group than the group allows; in a hybrid cache, cuts hang on registered full-attention pages, each
    //! page's anchors are the cut windows that hold it, a window's pages are registered, its last under its cut's hash,
    //! and anchored cached pages are off the LRU list; the rows (state slots) of no live sequence are listed once, free
    //! or held; queued state copies fill distinct slots of live fork children, each from the slot of a live sequence or
    //! a held one that no copy fills. Linear time; allocates scratch memory.
    void checkInvariants() const;

    //! Returns the number of page groups (as in the cache's layout).
    int32_t numGroups() const noexcept;
    //! Returns the layout the manager was sized from.
    KVCacheLayout const& layout() const noexcept;
    //! Returns the most sequences alive at once.
    int32_t maxSequences() const noexcept;
    //! Returns the number of live sequences.
    int32_t numSequences() const noexcept;
    //! Returns the hasher of page contents (its algorithm and seed).
    PageHasher const& hasher() const noexcept;

private:
    friend class detail::PageManagerInternal;
    struct State;
    std::unique_ptr<State> mState;
};

} // namespace kvcache::rt
