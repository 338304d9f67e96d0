#pragma once

#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_manager.h"
#include "kvcache/tiers/host_tier.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvcache::rt
{

//! How large a TieredPrefixCache's host tiers are and how they pin and stage their memory.
struct TieredPrefixCacheOptions
{
    //! Host pages of each page group's tier, one entry per group of the cache, each in [1, INT32_MAX]. Every group
    //! needs a tier, windowed groups included: a run brought back from the host needs, in a windowed group, the pages
    //! of the window at the run's end.
    std::vector<int64_t> numHostPages = {};
    //! A third tier on disk: a directory (made when missing) where host pages the host tiers give up are written,
    //! one sequence file a page (group<g>-page<d>.kvseq), and read back by admissions; empty for none. Its index is
    //! in memory: the tier lives as long as the TieredPrefixCache, which removes its files on destruction. One
    //! TieredPrefixCache a directory at a time (two would write the same file names).
    std::string diskDirectory = {};
    //! Disk pages of each page group's tier with a diskDirectory, one entry per group, each in [1, INT32_MAX]; empty
    //! without one.
    std::vector<int64_t> numDiskPages = {};
    //! How each tier pins its memory and stages copy-engine transfers (one setting for every tier; each tier
    //! allocates its own staging buffer).
    HostTierOptions hostTier = {};
    //! Host states for the state checkpoints of a cache with state layers (PageManager's "State checkpoints"), in
    //! [0, INT32_MAX]; 0 (the default) for none. They are the host states of the checkpoint group's tier (the first
    //! full-attention group's, else group 0's); leave hostTier.numHostStates at 0. A checkpoint goes to the host with
    //! its carrier page (one host state a checkpoint, keyed by that page's hash) and comes back with a run ending
    //! there. Above 0 only when the manager keeps checkpoints (state layers, checkpoint slots, prefix caching).
    int64_t numHostStates = 0;
    //! Device pages evicted with a retention priority under this one (PageManager::setRetention) are not copied to
    //! the host; in [0, PageManager::kMAX_RETENTION_PRIORITY], 0 (the default) copies every page.
    int32_t minOffloadPriority = 0;
};

//! What one TieredPrefixCache::admit() found for a prompt of `count` tokens: the sequence now holds
//! deviceTokens + hostTokens tokens, and the runtime appends (step()) and computes the other computeTokens.
struct TieredAdmission
{
    //! Tokens adopted from pages cached on the device (PageManager::adoptPrefix).
    int32_t deviceTokens = 0;
    //! Tokens after those, in a run brought back with pages from the host tiers (onboarded into fresh pages
    //! registered under the same hashes); the run's pages the device still had are held, not copied.
    int32_t hostTokens = 0;
    //! count - deviceTokens - hostTokens: at least 1 for a prompt of at least one token.
    int32_t computeTokens = 0;
};

//! A TieredPrefixCache's counters since construction (or resetStats()).
struct TieredPrefixCacheStats
{
    //! admit() calls that succeeded, and the prompt tokens they were given.
    int64_t admissions = 0;
    int64_t queryTokens = 0;
    //! Prompt tokens found on the device, found on the host, and found nowhere (left to compute): the three add up to
    //! queryTokens.
    int64_t deviceHitTokens = 0;
    int64_t hostHitTokens = 0;
    int64_t missedTokens = 0;
    //! Evicted device pages copied to a host page, all groups.
    int64_t offloadedPages = 0;
    //! Evicted device pages whose hash a host page held already (nothing to copy; it becomes the most recent), all
    //! groups.
    int64_t alreadyOnHostPages = 0;
    //! Evicted device pages the host tier could not take (every usable host page pinned by the same call), dropped.
    int64_t droppedPages = 0;
    //! Host pages whose page was dropped, least recently used first, to make room for an offload, all groups.
    int64_t evictedHostPages = 0;
    //! Host pages copied into fresh device pages by admissions, all groups (a run's pages the device had are not).
    int64_t onboardedPages = 0;
    //! Disk tier (TieredPrefixCacheOptions::diskDirectory), all groups: host pages written to disk pages when the host
    //! tier gave them up; those whose hash a disk page held already (nothing written; it becomes the most recent);
    //! disk pages given up, least recently used first, to make room; disk pages read back into host pages by
    //! admissions; and disk pages that could not be written or read back (an I/O error, a file changed on disk or
    //! written under other host-held scales): such a page is simply not on the disk tier.
    int64_t spilledPages = 0;
    int64_t alreadyOnDiskPages = 0;
    int64_t evictedDiskPages = 0;
    int64_t restoredPages = 0;
    int64_t diskFailures = 0;
    //! Of hostHitTokens, tokens whose page some group read back from the disk tier for the admission.
    int64_t diskHitTokens = 0;
    //! State checkpoints (TieredPrefixCacheOptions::numHostStates): checkpoints of evicted carrier pages copied to a
    //! host state; those dropped because no host state was free (at the offload, or when a disk page read back held
    //! one) or because the evicting step handed out their save; host states released because their carrier page's
    //! host page was given up; host states copied back into a checkpoint slot by admissions; and with a disk tier,
    //! host states written to disk with their carrier page, and read back with it.
    int64_t offloadedStates = 0;
    int64_t droppedStates = 0;
    int64_t releasedStates = 0;
    int64_t onboardedStates = 0;
    int64_t spilledStates = 0;
    int64_t restoredStates = 0;
};

//! A two-tier prefix cache: a PageManager's cached device pages, and pinned host memory (one HostTier per page group)
//! that keeps the pages the device evicts. It owns the wiring a runtime would otherwise write around
//! PageManager::setEvictionCallback, HostTier::offload and onboard, and PageManager::hashNextPages:
//!
//! - Offload (step(), and admit() and evictCached()). The manager's eviction callback only records (group, page,
//!   hash); once the manager call returns, the evicted pages go to host pages in one HostTier::offload a group,
//!   enqueued on the call's stream before anything else the call enqueues and before whatever the runtime enqueues
//!   there afterwards (the step's kernels, which may overwrite the pages). A page whose hash a host page holds already
//!   is not copied again, nor is a page evicted with a retention priority under minOffloadPriority
//!   (PageManager::setRetention). When a group's tier has no free host page, the least recently used host page is given
//!   up (evictedHostPages); host pages an onboard of the same call reads are pinned and never given up.
//! - Onboard (admit()). A prompt first adopts what the device holds (PageManager::adoptPrefix); the hashes of the
//!   following whole pages (PageManager::hashNextPages) are then looked up on the device and in each group's tier,
//!   and the longest run (at most count - 1 tokens in all, so that the runtime computes the last prompt token) whose
//!   every needed page one of them holds is taken: in a full-attention group every page of the run, in a windowed
//!   group the pages of the window before the run's end (the earlier ones are not taken, as a window that moved past
//!   them leaves them). The run is adopted whole, in one manager call whatever maxTokensPerStep is: each page the
//!   device has is held (as adoptPrefix holds it), each other one is a fresh page registered under its hash, so later
//!   prompts adopt it from the device. The evictions that made room are offloaded first, then each group's host pages
//!   are onboarded into its fresh pages in one HostTier::onboard, on the stream; those host pages are pinned until
//!   then. When the device cannot give a run's fresh pages (free and cached pages less those the run holds), the
//!   longest shorter run it can is taken.
//! - Hybrid caches: a prefix whose full-attention pages are still cached on the device but whose window a windowed
//!   group evicted (the smaller group evicts sooner) is served by holding the former and onboarding the window only.
//! - State checkpoints (state layers; TieredPrefixCacheOptions::numHostStates). A run must end at a checkpoint, as
//!   PageManager::adoptPrefix's prefix must: the device's, or one the host holds. When an evicted carrier page that
//!   holds a saved checkpoint goes to a host page, the checkpoint's state slot goes to a free host state in the same
//!   offload, after the pages (HostTier::offloadStates), keyed by the page's hash; with none free, or when the
//!   evicting step itself hands out the checkpoint's save (the slot gets its bytes only when the runtime runs that
//!   step's state copies), the checkpoint is dropped (droppedStates). A host state lives as long as its carrier page's
//!   host page; a host page written to disk takes its host state into the same file (saveSequence with a state), and
//!   reading it back brings it into a free host state (none free: the page comes back alone, droppedStates). An
//!   admission whose run ends at a host checkpoint onboards it into a
//!   checkpoint slot (taken as PageManager::checkpointState takes one), which becomes the device's checkpoint, and the
//!   restore into the sequence's slot is queued as adoptPrefix queues it (StepCopies::stateCopies of the next step).
//! - Disk (TieredPrefixCacheOptions::diskDirectory, optional). A host page a full host tier gives up is first written
//!   to a disk page of its group (a one-page sequence file, on the host, after the host page's transfers are done),
//!   unless a disk page holds its hash already; a full disk tier gives up its least recently used disk page. An
//!   admission's run may take pages from the disk too: before the run is adopted, each such page is read into a host
//!   page of its own (synchronously, on the host; pinned like the run's other host pages) and then onboarded as
//!   those are. A disk page that cannot be written or read back whole (an I/O error, a file changed on disk, other
//!   host-held scales since) is not on the tier and counts in diskFailures: the run stops before it, nothing fails.
//!   Disk writes and reads are synchronous on the host, in the call that gives a host page up or admits the run
//!   (docs/benchmarks.md, case j: about 3 ms to write and 0.65 ms to read a 2 MiB page on the CI machine's disk).
//!
//! Ordering: everything is enqueued on the stream a call is given, in the order above; the runtime enqueues the
//! step's kernels (which read onboarded pages and write new ones) on that stream after the call, or orders them after
//! it. The host tiers' own tracking orders transfers on different streams that touch one host page. Every step,
//! append and eviction of the manager must go through this class (it sets the manager's eviction callback, replacing
//! any other, and clears it on destruction); the manager's other calls (create, fork, free, pages, canStep, ...) are
//! the runtime's to make directly. An eviction made by a direct PageManager::evictCached is offloaded by the next call
//! of this class, which is still before any step can reuse the page.
//!
//! Errors: every call checks its arguments before it changes anything (the manager's own checks included) and throws
//! InvalidArgumentError or OutOfRangeError naming the field, the value and the limit; a rejected call enqueues
//! nothing and changes neither the manager, the host tiers nor the counters. A CudaError from a transfer leaves the
//! device's and the host pages' contents unspecified (the sequence of the call keeps its pages): treat the device as
//! failed. A third tier of sequence files is not part of this class: saveSequence/loadSequence work on a HostTier
//! directly.
//!
//! Not thread-safe: one owner at a time, like the PageManager. Move-constructible, not copyable; the cache and the
//! manager must outlive it and stay where they are (not moved from).
class TieredPrefixCache
{
public:
    //! Wires `pages` (sized from `cache`'s layout) to one HostTier per page group of `cache` (options.numHostPages[g]
    //! host pages each) and sets the manager's eviction callback. Throws InvalidArgumentError when the manager's
    //! layout differs from the cache's (naming the group and the field), when numHostPages has another number of
    //! entries than the cache has groups or an entry outside [1, INT32_MAX] (naming numHostPages[g], the value and the
    //! limit), the same for a non-empty numDiskPages, when only one of diskDirectory and numDiskPages is given or the
    //! directory cannot be made, and what HostTier's constructor throws (OutOfMemoryError, CudaError); nothing is
    //! changed then (a directory made stays).
    TieredPrefixCache(KVCacheManager const& cache, PageManager& pages, TieredPrefixCacheOptions const& options);
    //! Clears the manager's eviction callback, waits for the tiers' transfers and frees their memory; never throws.
    //! Evictions recorded but not offloaded yet (a direct evictCached) are lost.
    ~TieredPrefixCache();
    //! Takes over `other`'s tiers and wiring; `other` may then only be destroyed. (No move assignment: the object
    //! assigned to would clear the callback of a manager it no longer serves.)
    TieredPrefixCache(TieredPrefixCache&& other) noexcept;
    TieredPrefixCache& operator=(TieredPrefixCache&&) = delete;
    TieredPrefixCache(TieredPrefixCache const&) = delete;
    TieredPrefixCache& operator=(TieredPrefixCache const&) = delete;

    //! Admits the prompt `tokens[0, count)` into the empty sequence `sequence`: adopts the device's cached prefix,
    //! then onboards what the host tiers hold of the following pages (see the class comment), enqueuing the transfers
    //! on `stream`. Returns how many tokens came from each tier and how many the runtime must still compute; the
    //! sequence's length is then count - computeTokens, and the runtime appends tokens[length, count) with step().
    //! extraKeys as PageManager::adoptPrefix takes them (positions in [0, count), ascending). Throws what
    //! PageManager::adoptPrefix throws for bad arguments (InvalidArgumentError: an unknown or non-empty sequence, a
    //! count outside [0, maxSequenceLength], null pointers, extra keys out of order or range) and InvalidArgumentError
    //! for a stream that is capturing a graph (host-list transfers query events), before changing anything; CudaError
    //! from a transfer.
    TieredAdmission admit(SequenceId sequence, int32_t const* tokens, int32_t count, cudaStream_t stream,
        PageExtraKey const* extraKeys = nullptr, int32_t numExtraKeys = 0);

    //! PageManager::step(appends, count), then on `stream`: the offload of the pages it evicted, then its copies
    //! (copy-on-write, copyPages in each group). Returns the copies, already enqueued (for information; valid until
    //! the manager's next step). The runtime enqueues the step's kernels on `stream` after this call. Throws what
    //! PageManager::step throws (InvalidArgumentError, OutOfMemoryError naming the group) and InvalidArgumentError for
    //! a capturing stream, before changing anything; CudaError from a transfer or copy.
    StepCopies step(SequenceAppend const* appends, int32_t count, cudaStream_t stream);

    //! PageManager::evictCached(group, count), then the offload of the pages it evicted on `stream`; returns how many
    //! it evicted. Throws what PageManager::evictCached throws (OutOfRangeError for a bad group, InvalidArgumentError
    //! for a negative count) and InvalidArgumentError for a capturing stream, before changing anything; CudaError.
    int32_t evictCached(int32_t group, int32_t count, cudaStream_t stream);

    //! Hands over the KV events since the last call when the manager records them (PageManagerOptions::recordEvents;
    //! none otherwise): `out` is cleared, then holds the manager's events (PageManager::takeEvents, medium GPU)
    //! followed by the host tiers' (medium CPU) and the disk tier's (medium DISK), each in the order it happened. A
    //! host or disk page that starts holding a hash is one stored event (that hash, no parent: the pages a tier keeps
    //! are no chain; no token ids: the tier never sees them, and the same hash was stored on the GPU with its tokens);
    //! one given up, or dropped after a failed write or read, is a removal. Call it after each step, one batch a step.
    //! Throws std::bad_alloc when the host and disk events cannot be appended (`out` then holds the manager's, and
    //! the others are handed over by the next call).
    void takeEvents(KVEventBatch& out);

    //! Returns the counters.
    TieredPrefixCacheStats stats() const noexcept;
    //! Sets every counter to 0.
    void resetStats() noexcept;

    //! Returns the number of page groups (one host tier each).
    int32_t numGroups() const noexcept;
    //! Returns the host tier of `group` (its host pages belong to this class: read them, e.g. with saveSequence, but
    //! never allocate or release them). Throws OutOfRangeError for a group outside [0, numGroups()).
    HostTier& hostTier(int32_t group) const;
    //! Returns the host pages of `group` holding a page now. Throws OutOfRangeError for a bad group.
    int32_t numHostPagesHeld(int32_t group) const;
    //! Returns the host page of `group` holding the page of `hash`, or -1. Throws OutOfRangeError for a bad group.
    int32_t findHostPage(int32_t group, PageHash hash) const;
    //! Returns the disk pages of `group` holding a page now (0 without a disk tier). Throws OutOfRangeError for a bad
    //! group.
    int32_t numDiskPagesHeld(int32_t group) const;
    //! Returns the disk page of `group` holding the page of `hash` (its file: diskDirectory/group<g>-page<d>.kvseq), or
    //! -1 (also without a disk tier). Throws OutOfRangeError for a bad group.
    int32_t findDiskPage(int32_t group, PageHash hash) const;

    //! Returns the host states holding a checkpoint now (TieredPrefixCacheOptions::numHostStates).
    int32_t numHostStatesHeld() const noexcept;
    //! Returns the host state (of hostTier(checkpointGroup())) holding the checkpoint keyed by `hash` (the hash of its
    //! prefix's last page), or -1.
    int32_t findHostState(PageHash hash) const noexcept;
    //! Returns the group whose pages carry state checkpoints and whose tier holds the host states, or -1 when the
    //! manager keeps no checkpoints.
    int32_t checkpointGroup() const noexcept;

    //! Returns normally when the bookkeeping is consistent (each group's hash -> host page map and its least recently
    //! used order; no host page left pinned between calls); throws std::logic_error naming the first broken rule.
    //! Linear time; allocates.
    void checkInvariants() const;

private:
    struct Impl;
    std::unique_ptr<Impl> mImpl;
};

} // namespace kvcache::rt
