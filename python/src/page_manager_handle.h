#pragma once

// The PageManager Python object (page_manager_binding.cpp) as the other binding files reach it: its manager, the
// scratch lists its host arguments are read into, and whether a TieredPrefixCache serves it.

#include <kvcache/paging/kv_events.h>
#include <kvcache/paging/page_manager.h>
#include <kvcache/tiers/prefix_counters.h>

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace kvcache::python
{

namespace nb = nanobind;

//! A PageManager and the scratch lists host arguments are read into (reused between calls).
struct PageManagerHandle
{
    PageManagerHandle(rt::KVCacheLayout const& layout, rt::PageManagerOptions const& options)
        : manager(layout, options)
    {
    }
    //! The eviction callback's owner: the manager's EvictionCallback only borrows it, so that the garbage collector
    //! sees this reference (pageManagerTraverse) and can break a cycle through it (pageManagerClear). Declared before
    //! the manager so that it outlives the manager's borrowed pointer.
    nb::object callback;
    rt::PageManager manager;
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<rt::PageExtraKey>> extraKeys;
    std::vector<rt::SequenceAppend> appends;
    //! take_events()'s batch, reused.
    rt::KVEventBatch events;
    //! True while a TieredPrefixCache serves the manager: it owns the eviction callback then, and every step and
    //! append must go through it, so the PageManager object refuses set_eviction_callback, step and append.
    bool servedByTiered = false;
};

//! Returns the PageManager object `pages` is; throws TypeError naming `field` otherwise.
PageManagerHandle& pageManagerArgument(nb::handle pages, char const* field);

//! Reads a page hash: a (lo, hi) tuple, as PageManager.hash_next_pages and the eviction callback give it. Throws
//! TypeError naming `hash` otherwise.
rt::PageHash hashArgument(nb::handle hash);

//! Reads one append (sequence, tokens, extra_keys) into scratch slot `slot` of `handle`; the result points into the
//! scratch lists and is valid until they are read into again. Throws TypeError / InvalidArgumentError naming the
//! argument.
rt::SequenceAppend appendOf(
    PageManagerHandle& handle, size_t slot, int64_t sequence, nb::handle tokens, nb::handle extraKeys);

//! Reads a step's appends, a sequence of (sequence, tokens[, extra_keys]), into handle.appends.
void appendsOf(PageManagerHandle& handle, nb::handle appends);

//! Takes the events of `source` into `out` (TieredPrefixCache::takeEvents) and returns true when `source` is a
//! TieredPrefixCache object; returns false, `out` untouched, otherwise.
bool takeTieredEvents(nb::handle source, rt::KVEventBatch& out);

//! Returns `batch` as a list of dicts, one an event, with vLLM's field names (kvcache/paging/kv_events.h).
nb::list kvEventsList(rt::KVEventBatch const& batch);

//! Returns `counters` as a dict (prometheus text aside).
nb::dict countersDict(rt::PrefixCacheCounters const& counters);

//! Returns a step's copies as one list of (src, dst) pairs per group.
std::vector<std::vector<std::pair<int32_t, int32_t>>> copyLists(rt::StepCopies const& copies);
//! Returns state slot copies as (source slot, destination slot) pairs.
std::vector<std::pair<int32_t, int32_t>> stateCopyList(std::vector<rt::StateSlotCopy> const& copies);

} // namespace kvcache::python
