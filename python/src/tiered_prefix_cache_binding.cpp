// TieredPrefixCache (a PageManager's cached device pages and one HostTier per page group: admit, step, evict_cached),
// what an admission found and its counters.

#include "bindings.h"
#include "cuda_arguments.h"
#include "host_tier_handle.h"
#include "page_manager_handle.h"
#include "typed_arguments.h"
#include "write_binding.h"

#include <kvcache/core/errors.h>
#include <kvcache/tiers/tiered_prefix_cache.h>

#include <fmt/format.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace kvcache::python
{
namespace
{

//! Marks a PageManager object as served by a TieredPrefixCache while it lives: the object then refuses
//! set_eviction_callback, step and append, and a second tiered cache (a manager has one eviction callback, and a
//! tiered cache clears it when it goes).
class ServedMark
{
public:
    explicit ServedMark(PageManagerHandle& pages)
        : mPages(pages)
    {
        if (pages.servedByTiered)
        {
            throw rt::InvalidArgumentError("TieredPrefixCache: pages is served by another TieredPrefixCache; a page "
                                           "manager has one eviction callback, so one tiered cache at a time");
        }
        pages.servedByTiered = true;
    }
    ~ServedMark()
    {
        mPages.servedByTiered = false;
    }
    ServedMark(ServedMark const&) = delete;
    ServedMark& operator=(ServedMark const&) = delete;

private:
    PageManagerHandle& mPages;
};

//! A TieredPrefixCache and the KVCacheManager and PageManager objects it works on, which it keeps alive: they go after
//! it (declared first), so the tiered cache never outlives its cache or its manager, and the manager's callback is
//! cleared before the PageManager object is told it is no longer served.
class TieredHandle
{
public:
    TieredHandle(nb::handle cacheObject, CacheAccess cache, nb::handle pagesObject, PageManagerHandle& pages,
        rt::TieredPrefixCacheOptions const& options)
        : mCacheObject(nb::borrow(cacheObject))
        , mCache(cache)
        , mPagesObject(nb::borrow(pagesObject))
        , mPages(pages)
        , mServed(pages)
        , mTiered(*cache.manager, pages.manager, options)
    {
        // The manager calls the tiered cache's callback now: the Python callback it called before is dropped (last,
        // as dropping it may run arbitrary code).
        nb::object const replaced = std::move(pages.callback);
    }

    rt::TieredPrefixCache& tiered() noexcept
    {
        return mTiered;
    }
    //! The PageManager object's scratch lists take the calls' host arguments.
    PageManagerHandle& pages() noexcept
    {
        return mPages;
    }
    nb::handle cacheObject() const noexcept
    {
        return mCacheObject;
    }
    //! The stream a call runs on when it names none: the cache's.
    cudaStream_t cacheStream() const noexcept
    {
        return mCache.stream;
    }

private:
    nb::object mCacheObject;
    CacheAccess mCache;
    nb::object mPagesObject;
    PageManagerHandle& mPages;
    ServedMark mServed;
    rt::TieredPrefixCache mTiered;
};

using Self = nb::pointer_and_handle<TieredHandle>;

} // namespace

bool takeTieredEvents(nb::handle source, rt::KVEventBatch& out)
{
    TieredHandle* tiered = nullptr;
    if (!nb::try_cast(source, tiered) || tiered == nullptr)
    {
        return false;
    }
    tiered->tiered().takeEvents(out);
    return true;
}

namespace
{

//! Reads num_host_pages or num_disk_pages (`name`): a sequence of ints (or a 1-D int array), one entry per page group.
//! The entries' range is the C++ constructor's to check (it names numHostPages[g], the value and the limit).
std::vector<int64_t> pagesPerGroupArgument(nb::handle numPages, char const* name)
{
    requireIterable(numPages, name, "a sequence of ints, one per page group");
    std::vector<int64_t> result;
    for (nb::handle entry : numPages)
    {
        std::string const field = fmt::format("{}[{}]", name, result.size());
        result.push_back(intArgument(entry, field.c_str()));
    }
    return result;
}

} // namespace

void bindTieredPrefixCache(nb::module_& m)
{
    nb::class_<rt::TieredAdmission>(m, "TieredAdmission",
        "What TieredPrefixCache.admit found for a prompt: the sequence holds device_tokens + host_tokens tokens, and "
        "the runtime appends (step) and computes the other compute_tokens.")
        .def(nb::init<>(), "All zero.")
        .def_ro("device_tokens", &rt::TieredAdmission::deviceTokens,
            "Tokens adopted from pages cached on the device (PageManager.adopt_prefix).")
        .def_ro("host_tokens", &rt::TieredAdmission::hostTokens,
            "Tokens after those, onboarded from the host tiers into fresh pages registered under the same hashes.")
        .def_ro("compute_tokens", &rt::TieredAdmission::computeTokens,
            "len(tokens) - device_tokens - host_tokens: at least 1 for a prompt of at least one token.")
        .def("__repr__",
            [](rt::TieredAdmission const& a)
            {
                return fmt::format("TieredAdmission(device_tokens={}, host_tokens={}, compute_tokens={})",
                    a.deviceTokens, a.hostTokens, a.computeTokens);
            });

    nb::class_<rt::TieredPrefixCacheStats>(
        m, "TieredPrefixCacheStats", "A TieredPrefixCache's counters since construction (or reset_stats()).")
        .def(nb::init<>(), "All zero.")
        .def_ro("admissions", &rt::TieredPrefixCacheStats::admissions, "admit() calls that succeeded.")
        .def_ro("query_tokens", &rt::TieredPrefixCacheStats::queryTokens, "Prompt tokens those calls were given.")
        .def_ro("device_hit_tokens", &rt::TieredPrefixCacheStats::deviceHitTokens, "Prompt tokens found on the device.")
        .def_ro("host_hit_tokens", &rt::TieredPrefixCacheStats::hostHitTokens, "Prompt tokens found on the host.")
        .def_ro("missed_tokens", &rt::TieredPrefixCacheStats::missedTokens,
            "Prompt tokens found nowhere (left to compute); the three add up to query_tokens.")
        .def_ro("offloaded_pages", &rt::TieredPrefixCacheStats::offloadedPages,
            "Evicted device pages copied to a host page, all groups.")
        .def_ro("already_on_host_pages", &rt::TieredPrefixCacheStats::alreadyOnHostPages,
            "Evicted device pages whose hash a host page held already (nothing copied), all groups.")
        .def_ro("dropped_pages", &rt::TieredPrefixCacheStats::droppedPages,
            "Evicted device pages the host tier could not take, dropped.")
        .def_ro("evicted_host_pages", &rt::TieredPrefixCacheStats::evictedHostPages,
            "Host pages given up, least recently used first, to make room for an offload, all groups.")
        .def_ro("onboarded_pages", &rt::TieredPrefixCacheStats::onboardedPages,
            "Host pages copied into fresh device pages by admissions, all groups (a run's pages the device had are "
            "held, not copied).")
        .def_ro("spilled_pages", &rt::TieredPrefixCacheStats::spilledPages,
            "Disk tier: host pages written to disk pages when a host tier gave them up, all groups.")
        .def_ro("already_on_disk_pages", &rt::TieredPrefixCacheStats::alreadyOnDiskPages,
            "Disk tier: host pages given up whose hash a disk page held already (nothing written).")
        .def_ro("evicted_disk_pages", &rt::TieredPrefixCacheStats::evictedDiskPages,
            "Disk tier: disk pages given up, least recently used first, to make room.")
        .def_ro("restored_pages", &rt::TieredPrefixCacheStats::restoredPages,
            "Disk tier: disk pages read back into host pages by admissions.")
        .def_ro("disk_failures", &rt::TieredPrefixCacheStats::diskFailures,
            "Disk tier: disk pages that could not be written or read back (then not on the tier; nothing fails).")
        .def_ro("disk_hit_tokens", &rt::TieredPrefixCacheStats::diskHitTokens,
            "Disk tier: of host_hit_tokens, tokens whose page some group read back from the disk for the admission.")
        .def_ro("offloaded_states", &rt::TieredPrefixCacheStats::offloadedStates,
            "State checkpoints (num_host_states): checkpoints of evicted carrier pages copied to a host state.")
        .def_ro("dropped_states", &rt::TieredPrefixCacheStats::droppedStates,
            "State checkpoints: checkpoints of evicted carrier pages dropped, no host state being free (or their save "
            "being handed out by the very step that evicted the page).")
        .def_ro("released_states", &rt::TieredPrefixCacheStats::releasedStates,
            "State checkpoints: host states released because their carrier page's host page was given up.")
        .def_ro("onboarded_states", &rt::TieredPrefixCacheStats::onboardedStates,
            "State checkpoints: host states copied back into a checkpoint slot by admissions.")
        .def_ro("spilled_states", &rt::TieredPrefixCacheStats::spilledStates,
            "State checkpoints, disk tier: host states written to disk with their carrier page.")
        .def_ro("restored_states", &rt::TieredPrefixCacheStats::restoredStates,
            "State checkpoints, disk tier: states read back from disk into a host state with their carrier page.")
        .def("__repr__",
            [](rt::TieredPrefixCacheStats const& s)
            {
                return fmt::format("TieredPrefixCacheStats(admissions={}, query_tokens={}, device_hit_tokens={}, "
                                   "host_hit_tokens={}, missed_tokens={}, offloaded_pages={}, "
                                   "already_on_host_pages={}, dropped_pages={}, evicted_host_pages={}, "
                                   "onboarded_pages={}, spilled_pages={}, already_on_disk_pages={}, "
                                   "evicted_disk_pages={}, restored_pages={}, disk_failures={}, disk_hit_tokens={}, "
                                   "offloaded_states={}, dropped_states={}, released_states={}, onboarded_states={}, "
                                   "spilled_states={}, restored_states={})",
                    s.admissions, s.queryTokens, s.deviceHitTokens, s.hostHitTokens, s.missedTokens, s.offloadedPages,
                    s.alreadyOnHostPages, s.droppedPages, s.evictedHostPages, s.onboardedPages, s.spilledPages,
                    s.alreadyOnDiskPages, s.evictedDiskPages, s.restoredPages, s.diskFailures, s.diskHitTokens,
                    s.offloadedStates, s.droppedStates, s.releasedStates, s.onboardedStates, s.spilledStates,
                    s.restoredStates);
            });

    nb::class_<TieredHandle>(m, "TieredPrefixCache", nb::is_weak_referenceable(),
        "A two-tier prefix cache: a PageManager's cached device pages, and pinned host memory (one HostTier per page "
        "group) that keeps the pages the device evicts. It makes the two calls of a serving loop that touch pages: "
        "admit() (adopts the device's cached prefix, then the longest run of following whole pages, at most "
        "len(tokens) - 1 tokens, whose every needed page (all of them in full attention, the window at the run's end "
        "in a windowed group) the device or a group's host tier holds: the device's pages are held, the others "
        "onboarded into fresh pages) and step() "
        "(PageManager.step, then on the stream the offload of the pages it evicted, then its copies). Enqueue the "
        "step's kernels on the same stream after the call. It owns the manager's eviction callback while it lives "
        "(the PageManager object refuses set_eviction_callback, step and append then: every step goes through the "
        "tiered cache; create, fork, free, pages, can_step, ... stay the manager's). A rejected call raises before "
        "anything changes. It keeps its KVCacheManager and PageManager alive; destroying it waits for the tiers' "
        "transfers and clears the manager's callback. Calls hold the GIL (nothing they do waits on the GPU).")
        .def(
            "__init__",
            [](TieredHandle* self, nb::handle cache, nb::handle pages, nb::handle numHostPages, int64_t chunkBytes,
                bool preferGpuNumaNode, int64_t stagingBytes, nb::handle diskDirectory, nb::handle numDiskPages,
                int64_t minOffloadPriority, int64_t numHostStates)
            {
                CacheAccess const access = cacheAccess(cache);
                PageManagerHandle& manager = pageManagerArgument(pages, "pages");
                rt::TieredPrefixCacheOptions options;
                options.numHostPages = pagesPerGroupArgument(numHostPages, "num_host_pages");
                if (!diskDirectory.is_none())
                {
                    options.diskDirectory = pathArgument(diskDirectory, "disk_directory");
                }
                if (!numDiskPages.is_none())
                {
                    options.numDiskPages = pagesPerGroupArgument(numDiskPages, "num_disk_pages");
                }
                options.hostTier.chunkBytes = chunkBytes;
                options.hostTier.preferGpuNumaNode = preferGpuNumaNode;
                options.hostTier.stagingBytes = stagingBytes;
                options.minOffloadPriority = toInt32(minOffloadPriority, "min_offload_priority");
                options.numHostStates = numHostStates;
                new (self) TieredHandle(cache, access, pages, manager, options);
            },
            nb::arg("cache").none(), nb::arg("pages").none(), nb::arg("num_host_pages").none(), nb::kw_only(),
            nb::arg("chunk_bytes") = rt::HostTierOptions{}.chunkBytes,
            nb::arg("prefer_gpu_numa_node") = rt::HostTierOptions{}.preferGpuNumaNode,
            nb::arg("staging_bytes") = rt::HostTierOptions{}.stagingBytes, nb::arg("disk_directory") = nb::none(),
            nb::arg("num_disk_pages") = nb::none(), nb::arg("min_offload_priority") = 0, nb::arg("num_host_states") = 0,
            // Written out: cache, pages and num_host_pages take None only for the sake of its TypeError message.
            nb::sig(
                fmt::format("def __init__(self, cache: KVCacheManager, pages: PageManager, num_host_pages: "
                            "collections.abc.Sequence[int] | NDArray[typing.Any], *, {}, disk_directory: str | "
                            "os.PathLike[str] | None = None, num_disk_pages: collections.abc.Sequence[int] | "
                            "NDArray[typing.Any] | None = None, min_offload_priority: int = 0, num_host_states: int "
                            "= 0) -> None",
                    hostTierOptionParameters())
                    .c_str()),
            "Wires `pages` (a PageManager sized from cache.layout()) to one HostTier per page group of `cache` (a "
            "KVCacheManager): num_host_pages[g] host pages for group g, one entry per group, windowed groups included "
            "(a run brought back needs a windowed group's window). chunk_bytes, prefer_gpu_numa_node and "
            "staging_bytes are each tier's, as HostTier takes them. With disk_directory (a str or os.PathLike, made "
            "when missing) and num_disk_pages (one entry per group), host pages the host tiers give up go to disk "
            "pages there (a one-page sequence file each, removed with the tiered cache; one tiered cache a directory) "
            "and admissions read them back "
            "(see the C++ TieredPrefixCache). Device pages evicted with a retention priority under "
            "min_offload_priority (PageManager.set_retention; 0, the default, offloads every page) are not copied to "
            "the host. With num_host_states (a cache with state layers whose manager keeps state checkpoints), a "
            "checkpoint goes to a host state of the checkpoint group's tier with its carrier page and comes back with "
            "a run ending there, into a checkpoint slot whose restore the next step hands out (see the C++ "
            "TieredPrefixCache); without, a hybrid model's runs from the host end at checkpoints the device still has. "
            "Replaces the manager's eviction callback. Raises TypeError when "
            "cache is no KVCacheManager, pages no PageManager or num_host_pages no sequence of ints; "
            "InvalidArgumentError when the manager's layout is not the cache's (naming the group and the field), for "
            "num_host_pages with another number of entries than the cache has groups or an entry outside "
            "[1, 2**31 - 1], the same for num_disk_pages, min_offload_priority outside [0, 100], num_host_states "
            "outside [0, 2**31 - 1] or above 0 for a manager keeping no checkpoints, when only one of "
            "disk_directory and num_disk_pages is "
            "given or the directory cannot be made, and when another TieredPrefixCache serves `pages`; what HostTier "
            "raises "
            "(OutOfMemoryError, CudaError). The manager is left as it was then.")
        .def(
            "admit",
            [](TieredHandle& t, int64_t sequence, nb::handle tokens, nb::handle stream, nb::handle extraKeys)
            {
                rt::SequenceAppend const prompt = appendOf(t.pages(), 0, sequence, tokens, extraKeys);
                cudaStream_t const onStream = streamArgument(stream, t.cacheStream());
                return t.tiered().admit(
                    sequence, prompt.tokens, prompt.count, onStream, prompt.extraKeys, prompt.numExtraKeys);
            },
            nb::arg("sequence"), nb::arg("tokens").none(), nb::arg("stream") = nb::none(),
            nb::arg("extra_keys") = nb::none(),
            nb::sig("def admit(self, sequence: int, tokens: HostIds, stream: StreamLike | None = None, extra_keys: "
                    "collections.abc.Sequence[tuple[int, int, int]] | None = None) -> TieredAdmission"),
            "Admits the prompt `tokens` (a sequence of ints or a 1-D int array) into the empty sequence `sequence`: "
            "adopts the device's cached prefix, then the run of following whole pages the device, the host tiers and "
            "the disk tier hold between them (disk pages read back on the host first), onboarding what it takes, "
            "enqueuing the transfers on `stream` (default: the cache's). Returns a TieredAdmission; the sequence then "
            "holds len(tokens) - compute_tokens tokens, and the runtime appends the rest with step(). extra_keys as "
            "PageManager.adopt_prefix takes them ((position, lo, hi), positions ascending in [0, len(tokens))). "
            "Raises, before changing anything, InvalidArgumentError for an unknown or non-empty sequence, a prompt "
            "longer than max_sequence_length, extra keys out of order or range, or a stream capturing a graph; "
            "CudaError from a transfer.")
        .def(
            "step",
            [](TieredHandle& t, HostAppendsArgument const& appends, StreamArgument const& stream)
            {
                appendsOf(t.pages(), appends);
                cudaStream_t const onStream = streamArgument(stream, t.cacheStream());
                PageManagerHandle& pages = t.pages();
                return copyLists(
                    t.tiered().step(pages.appends.data(), static_cast<int32_t>(pages.appends.size()), onStream));
            },
            nb::arg("appends"), nb::arg("stream") = nb::none(),
            "PageManager.step(appends) (a list of (sequence, tokens[, extra_keys])), then on `stream` (default: the "
            "cache's) the offload of the pages it evicted, then its copies. Returns the copies, already enqueued, as "
            "PageManager.step does (one list of (src, dst) per group). Enqueue the step's kernels on `stream` after "
            "the call. Raises, before changing anything, what PageManager.step raises (InvalidArgumentError, "
            "OutOfMemoryError naming the group) and InvalidArgumentError for a capturing stream; CudaError from a "
            "transfer or copy.")
        .def(
            "evict_cached",
            [](TieredHandle& t, int64_t group, int64_t count, StreamArgument const& stream)
            {
                int32_t const g = toInt32(group, "group");
                int32_t const n = toInt32(count, "count");
                return t.tiered().evictCached(g, n, streamArgument(stream, t.cacheStream()));
            },
            nb::arg("group"), nb::arg("count"), nb::arg("stream") = nb::none(),
            "PageManager.evict_cached(group, count), then the offload of the pages it evicted on `stream` (default: "
            "the cache's); returns how many it evicted. Raises OutOfRangeError for a bad group, InvalidArgumentError "
            "for a negative count or a capturing stream, before changing anything.")
        .def(
            "stats", [](TieredHandle& t) { return t.tiered().stats(); }, "The counters (a TieredPrefixCacheStats).")
        .def(
            "reset_stats", [](TieredHandle& t) { t.tiered().resetStats(); }, "Sets every counter to 0.")
        .def(
            "take_events",
            [](TieredHandle& t)
            {
                t.tiered().takeEvents(t.pages().events);
                return kvEventsList(t.pages().events);
            },
            "PageManager.take_events(), then the host (medium 'CPU') and disk ('DISK') tiers' events: each hash a "
            "host or disk page starts holding is a BlockStored without parent or token ids, each one given up a "
            "BlockRemoved. Events are recorded when the PageManager was made with record_events=True.")
        .def(
            "counters",
            [](TieredHandle& t) { return countersDict(rt::snapshotCounters(t.pages().manager, &t.tiered())); },
            "PageManager.counters() with the host and disk tiers: prefix_hit_tokens and evicted_pages by tier "
            "(device, host, disk; disjoint), offloaded_pages, onboarded_pages, spilled_pages, restored_pages, "
            "disk_failures, and each tenant's host and disk hits.")
        .def(
            "prometheus_text",
            [](TieredHandle& t, std::string const& prefix)
            { return rt::toPrometheusText(rt::snapshotCounters(t.pages().manager, &t.tiered()), prefix); },
            nb::arg("prefix") = "kvcache",
            "counters() in Prometheus' text exposition format, every metric named <prefix>_..._total.")
        .def(
            "num_groups", [](TieredHandle& t) { return t.tiered().numGroups(); },
            "The number of page groups (one host tier each).")
        .def(
            "host_tier",
            [](Self self, int64_t group)
            {
                rt::HostTier& tier = self.p->tiered().hostTier(toInt32(group, "group"));
                return TierHandle(self.h, self.p->cacheObject(), tier);
            },
            nb::arg("group"),
            "The HostTier of page group `group`, lent: it keeps this tiered cache alive, and its host pages are the "
            "tiered cache's, so read them (host_page_view, onboard, save_sequence with find_host_page's host pages) "
            "but do not write, hand out or release them (offload, allocate_host_pages, release_host_pages and "
            "load_sequence refuse it). Raises OutOfRangeError for a group outside [0, num_groups()).")
        .def(
            "num_host_pages_held",
            [](TieredHandle& t, int64_t group) { return t.tiered().numHostPagesHeld(toInt32(group, "group")); },
            nb::arg("group"), "The host pages of `group` holding a page now. Raises OutOfRangeError for a bad group.")
        .def(
            "find_host_page",
            [](TieredHandle& t, int64_t group, PageHashArgument const& hash)
            {
                int32_t const g = toInt32(group, "group");
                return t.tiered().findHostPage(g, hashArgument(hash));
            },
            nb::arg("group"), nb::arg("hash"),
            "The host page of `group` holding the page of `hash` (a (lo, hi) tuple, as PageManager.hash_next_pages "
            "and the eviction callback give it), or -1. Raises OutOfRangeError for a bad group, TypeError for a hash "
            "that is no such tuple.")
        .def(
            "num_disk_pages_held",
            [](TieredHandle& t, int64_t group) { return t.tiered().numDiskPagesHeld(toInt32(group, "group")); },
            nb::arg("group"),
            "The disk pages of `group` holding a page now (0 without a disk tier). Raises OutOfRangeError for a bad "
            "group.")
        .def(
            "find_disk_page",
            [](TieredHandle& t, int64_t group, PageHashArgument const& hash)
            {
                int32_t const g = toInt32(group, "group");
                return t.tiered().findDiskPage(g, hashArgument(hash));
            },
            nb::arg("group"), nb::arg("hash"),
            "The disk page of `group` holding the page of `hash` (its file: disk_directory/group<g>-page<d>.kvseq), "
            "or -1 (also without a disk tier). Raises as find_host_page.")
        .def(
            "num_host_states_held", [](TieredHandle& t) { return t.tiered().numHostStatesHeld(); },
            "The host states holding a state checkpoint now (num_host_states).")
        .def(
            "find_host_state",
            [](TieredHandle& t, PageHashArgument const& hash) { return t.tiered().findHostState(hashArgument(hash)); },
            nb::arg("hash"),
            "The host state (of host_tier(checkpoint_group())) holding the checkpoint keyed by `hash` (the hash of its "
            "prefix's last page, a (lo, hi) tuple), or -1. Raises TypeError for a hash that is no such tuple.")
        .def(
            "checkpoint_group", [](TieredHandle& t) { return t.tiered().checkpointGroup(); },
            "The page group whose pages carry state checkpoints and whose tier holds the host states, or -1 when the "
            "manager keeps none.")
        .def(
            "check_invariants", [](TieredHandle& t) { t.tiered().checkInvariants(); },
            "Raises RuntimeError naming the first broken rule of the bookkeeping (each group's hash -> host page map "
            "and its least recently used order; no host page left pinned between calls); linear time.");
}

} // namespace kvcache::python
