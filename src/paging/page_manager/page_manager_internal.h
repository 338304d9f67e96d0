#pragma once

// What the library's own layers reach in a PageManager beyond its public calls: the hashes of a sequence's next pages
// with what a run adopted by them needs, and that adoption, which gives a sequence a run of pages each group has on the
// device or fills fresh from another tier (the tiered prefix cache's host pages), hashed once. Not installed: a runtime
// cannot pass hashes of its own.

#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_manager.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt::detail
{

//! Hashes of the pages [firstPage, firstPage + count) of `sequence`, as hashNextPages() computed them when the sequence
//! held firstPage whole pages and the hash of its last full page (its root when none) was `parent`.
struct NextPageHashes
{
    SequenceId sequence = -1;
    PageHash parent = {};
    int32_t firstPage = 0;
    int32_t count = 0;
    PageHash const* hashes = nullptr;
    //! The tokens and extra keys they were hashed from (count * tokensPerPage tokens; keys at absolute positions),
    //! for the KV events of the pages a run registers; tokens may be null (events then carry no token ids).
    int32_t const* tokens = nullptr;
    PageExtraKey const* extraKeys = nullptr;
    int32_t numExtraKeys = 0;
};

//! A page adoptRun() took fresh: the sequence's entry `index` in the group is `page`, registered under the run's hash
//! of that index; its bytes are the caller's to fill before a kernel reads it.
struct FreshPage
{
    int32_t index = 0;
    int32_t page = 0;
};

class PageManagerInternal
{
public:
    //! PageManager::hashNextPages(sequence, tokens, count, out, extraKeys, numExtraKeys), returning with the hashes
    //! written to out what adoptRun() needs to take them (count: how many were written). Throws what hashNextPages
    //! throws.
    static NextPageHashes hashNextPages(PageManager const& manager, SequenceId sequence, int32_t const* tokens,
        int32_t count, PageHash* out, PageExtraKey const* extraKeys, int32_t numExtraKeys);

    //! Returns whether `group` (checked by the caller) has a page registered under `hash`, held or cached.
    static bool hasPage(PageManager const& manager, int32_t group, PageHash hash) noexcept;
    //! Adds tokens found on a host tier and on a disk tier for `sequence` (live, checked by the caller) to its
    //! tenant's counters (PageManager::tenantStats).
    static void addTenantHits(
        PageManager& manager, SequenceId sequence, int64_t hostTokens, int64_t diskTokens) noexcept;
    //! Returns, inside the eviction callback, the retention priority (PageManager::setRetention) the page it is called
    //! for had when it was evicted.
    static int32_t evictedPriority(PageManager const& manager) noexcept;
    //! Returns, inside the eviction callback, the state slot holding the checkpoint the page it is called for carried
    //! (saved, not filling), or -1. The slot's bytes stay until the caller enqueues its next writes: a checkpoint
    //! save or restore is a state copy the next step hands out, and adoptRun's fill is the caller's own. Within a
    //! step, though, a slot among the step's own state copies' destinations (a save it hands out) gets its bytes only
    //! when those copies run.
    static int32_t evictedStateSlot(PageManager const& manager) noexcept;
    //! Returns the group whose pages carry state checkpoints, or -1 when the manager keeps none (no state layers, no
    //! checkpoint slots or no prefix caching).
    static int32_t checkpointGroup(PageManager const& manager) noexcept;
    //! Returns whether the manager has state layers.
    static bool hasStateLayers(PageManager const& manager) noexcept;
    //! Returns whether a checkpoint keyed by `hash` is adoptable now (saved, its save handed out).
    static bool hasCheckpoint(PageManager const& manager, PageHash hash) noexcept;
    //! Returns whether the manager records KV events (PageManagerOptions::recordEvents).
    static bool recordsEvents(PageManager const& manager) noexcept;
    //! Writes to `out` (cleared first) the hashes registered in `group` (checked by the caller), by page id.
    static void registeredHashes(PageManager const& manager, int32_t group, std::vector<PageHash>& out);
    //! Returns the number of hashes registered in `group` (checked by the caller), held or cached pages.
    static int32_t numRegistered(PageManager const& manager, int32_t group) noexcept;
    //! Returns the first page a sequence of `pages` whole pages needs in `group` (checked by the caller): 0 for full
    //! attention, the window's first page for a sliding window.
    static int32_t firstNeededPage(PageManager const& manager, int32_t group, int32_t pages) noexcept;

    //! Extends known.sequence by the pages [known.firstPage, known.firstPage + pages) of `known`, as adoptPrefix()
    //! would if every group had them cached: in each group, every page the sequence then needs (all of them in full
    //! attention; in a windowed group, those of the window before the new length) is the group's page registered under
    //! its hash when there is one (held, as adoptPrefix holds it), else a fresh page registered under that hash and
    //! listed in fresh[g] (resized to the groups, in index order); a windowed group's pages out of the new window, the
    //! adopted prefix's included, are released (before fresh pages are taken) and its entries before the window are
    //! kUNUSED_PAGE_ENTRY. The sequence then holds known.firstPage + pages whole pages; the cuts of a hybrid cache are
    //! made as adoptPrefix makes them. Returns false, changing nothing, when a group lacks the free and cached pages
    //! for its fresh pages.
    //!
    //! With state layers the run must end at a checkpoint, as adoptPrefix's prefix does: the device's checkpoint keyed
    //! by the run's last hash when it is adoptable; else, when `hostState` says the caller holds that state on another
    //! tier, a checkpoint slot taken as checkpointState takes one (an empty one, else the clock's choice, its
    //! checkpoint dropped), made the checkpoint of the run's last page at once, and written to `*fillSlot`: the caller
    //! fills that state slot on its stream before anything reads it. The restore into the sequence's slot is queued
    //! as adoptPrefix queues it (replacing adoptPrefix's restore, if any). Returns false, changing nothing, when there
    //! is no such checkpoint, when the checkpoint keyed by that hash is still filling, when every checkpoint slot is
    //! read or filled by a queued copy, when a queued copy reads the sequence's slot, or when the manager keeps no
    //! checkpoints. `*fillSlot` (when given) is -1 unless a slot is to be filled.
    //!
    //! Throws InvalidArgumentError, before changing anything, when prefix caching is off, when the sequence does not
    //! hold exactly known.firstPage whole pages ending in known.parent's hash, or when pages is outside
    //! [1, known.count]; after the change is complete, what the eviction callback throws.
    static bool adoptRun(PageManager& manager, NextPageHashes const& known, int32_t pages,
        std::vector<std::vector<FreshPage>>& fresh, bool hostState = false, int32_t* fillSlot = nullptr);
};

} // namespace kvcache::rt::detail
