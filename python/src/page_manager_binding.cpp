#include "bindings.h"
#include "cuda_arguments.h"
#include "page_manager_handle.h"
#include "typed_arguments.h"

#include <kvcache/core/errors.h>
#include <kvcache/paging/page_manager.h>

#include <fmt/format.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace kvcache::python
{
namespace
{

//! Reads extra keys: a sequence of (position, lo, hi), lo and hi the two 64-bit words of the key's hash.
void extraKeysOf(nb::handle keys, std::vector<rt::PageExtraKey>& out)
{
    out.clear();
    if (keys.is_none())
    {
        return;
    }
    requireIterable(keys, "extra_keys", "None or a sequence of (position, lo, hi) tuples");
    size_t index = 0;
    for (nb::handle key : keys)
    {
        std::string const field = fmt::format("extra_keys[{}]", index);
        std::tuple<int64_t, uint64_t, uint64_t> value;
        if (!nb::try_cast(key, value))
        {
            throwTypeError(key, field.c_str(), "a (position, lo, hi) tuple of ints, lo and hi in [0, 2**64)");
        }
        auto const [position, lo, hi] = value;
        out.push_back({toInt32(position, (field + " position").c_str()), {lo, hi}});
        ++index;
    }
}

} // namespace

nb::list kvEventsList(rt::KVEventBatch const& batch)
{
    auto const hashBytes = [](rt::PageHash hash)
    {
        char bytes[16];
        for (int i = 0; i < 8; ++i)
        {
            bytes[i] = static_cast<char>(hash.lo >> (8 * i));
            bytes[8 + i] = static_cast<char>(hash.hi >> (8 * i));
        }
        return nb::bytes(bytes, sizeof(bytes));
    };
    nb::list events;
    for (rt::KVEvent const& event : batch.events())
    {
        nb::dict item;
        if (event.type == rt::KVEventType::kALL_CLEARED)
        {
            item["type"] = "AllBlocksCleared";
            events.append(item);
            continue;
        }
        item["type"] = event.type == rt::KVEventType::kSTORED ? "BlockStored" : "BlockRemoved";
        item["medium"] = rt::toString(event.medium);
        item["group_idx"] = event.group;
        nb::list hashes;
        for (int64_t i = event.firstHash; i < event.firstHash + event.numHashes; ++i)
        {
            hashes.append(hashBytes(batch.hashes()[static_cast<size_t>(i)]));
        }
        item["block_hashes"] = hashes;
        if (event.type == rt::KVEventType::kSTORED)
        {
            item["parent_block_hash"] = event.hasParent ? nb::object(hashBytes(event.parent)) : nb::none();
            auto const first = batch.tokens().begin() + event.firstToken;
            item["token_ids"] = std::vector<int32_t>(first, first + event.numTokens);
            item["block_size"] = event.tokensPerPage;
            nb::object extraKeys = nb::none();
            if (event.hasKeys)
            {
                nb::list pages;
                for (int64_t i = event.firstHash; i < event.firstHash + event.numHashes; ++i)
                {
                    rt::KVEventPageKeys const& keys = batch.pageKeys()[static_cast<size_t>(i)];
                    if (keys.saltBytes == 0 && keys.numKeys == 0)
                    {
                        pages.append(nb::none());
                        continue;
                    }
                    auto const* bytes = reinterpret_cast<char const*>(batch.keyBytes().data() + keys.offset);
                    nb::list page;
                    if (keys.saltBytes > 0)
                    {
                        page.append(nb::bytes(bytes, static_cast<size_t>(keys.saltBytes)));
                        bytes += keys.saltBytes;
                    }
                    for (int32_t k = 0; k < keys.numKeys; ++k, bytes += 20)
                    {
                        page.append(nb::bytes(bytes, 20));
                    }
                    pages.append(page);
                }
                extraKeys = pages;
            }
            item["extra_keys"] = extraKeys;
        }
        events.append(item);
    }
    return events;
}

nb::dict countersDict(rt::PrefixCacheCounters const& counters)
{
    rt::TieredPrefixCacheStats const& tiers = counters.tiers;
    nb::dict result;
    result["prefix_query_tokens"] = counters.device.prefixQueryTokens;
    nb::dict hits;
    hits["device"] = counters.device.prefixHitTokens;
    nb::dict evicted;
    evicted["device"] = counters.device.evictedPages;
    if (counters.hasTiers)
    {
        hits["host"] = tiers.hostHitTokens - tiers.diskHitTokens;
        hits["disk"] = tiers.diskHitTokens;
        evicted["host"] = tiers.evictedHostPages;
        evicted["disk"] = tiers.evictedDiskPages;
        result["offloaded_pages"] = tiers.offloadedPages;
        result["onboarded_pages"] = tiers.onboardedPages;
        result["spilled_pages"] = tiers.spilledPages;
        result["restored_pages"] = tiers.restoredPages;
        result["disk_failures"] = tiers.diskFailures;
    }
    result["prefix_hit_tokens"] = hits;
    result["evicted_pages"] = evicted;
    result["copy_on_write_pages"] = counters.device.copyOnWritePages;
    nb::list tenants;
    for (rt::PrefixTenantStats const& tenant : counters.tenants)
    {
        nb::dict item;
        item["salt"] = nb::bytes(reinterpret_cast<char const*>(tenant.salt.data()), tenant.salt.size());
        item["other"] = tenant.other;
        item["query_tokens"] = tenant.queryTokens;
        item["device_hit_tokens"] = tenant.deviceHitTokens;
        item["host_hit_tokens"] = tenant.hostHitTokens;
        item["disk_hit_tokens"] = tenant.diskHitTokens;
        tenants.append(item);
    }
    result["tenants"] = tenants;
    return result;
}

rt::SequenceAppend appendOf(
    PageManagerHandle& handle, size_t slot, int64_t sequence, nb::handle tokens, nb::handle extraKeys)
{
    if (handle.tokens.size() <= slot)
    {
        handle.tokens.resize(slot + 1);
        handle.extraKeys.resize(slot + 1);
    }
    hostInt32s(tokens, handle.tokens[slot], "tokens", "token ids");
    extraKeysOf(extraKeys, handle.extraKeys[slot]);
    rt::SequenceAppend append;
    append.sequence = sequence;
    append.tokens = handle.tokens[slot].data();
    append.count = toInt32(static_cast<int64_t>(handle.tokens[slot].size()), "len(tokens)");
    append.extraKeys = handle.extraKeys[slot].data();
    append.numExtraKeys = toInt32(static_cast<int64_t>(handle.extraKeys[slot].size()), "len(extra_keys)");
    return append;
}

void appendsOf(PageManagerHandle& handle, nb::handle appends)
{
    handle.appends.clear();
    requireIterable(appends, "appends", "a sequence of (sequence, tokens[, extra_keys]) tuples");
    size_t slot = 0;
    for (nb::handle entry : appends)
    {
        if (!nb::isinstance<nb::tuple>(entry) && !nb::isinstance<nb::list>(entry))
        {
            throwTypeError(entry, fmt::format("appends[{}]", slot).c_str(), "a (sequence, tokens[, extra_keys]) tuple");
        }
        nb::sequence const fields = nb::borrow<nb::sequence>(entry);
        size_t const count = nb::len(fields);
        if (count < 2 || count > 3)
        {
            throw rt::InvalidArgumentError(
                fmt::format("appends[{}] has {} fields; expected (sequence, tokens[, extra_keys])", slot, count));
        }
        handle.appends.push_back(
            appendOf(handle, slot, intArgument(fields[0], fmt::format("appends[{}] sequence", slot).c_str()), fields[1],
                count == 3 ? fields[2] : nb::none()));
        ++slot;
    }
}

std::vector<std::pair<int32_t, int32_t>> stateCopyList(std::vector<rt::StateSlotCopy> const& copies)
{
    std::vector<std::pair<int32_t, int32_t>> pairs;
    pairs.reserve(copies.size());
    for (rt::StateSlotCopy const& copy : copies)
    {
        pairs.emplace_back(copy.src, copy.dst);
    }
    return pairs;
}

std::vector<std::vector<std::pair<int32_t, int32_t>>> copyLists(rt::StepCopies const& copies)
{
    std::vector<std::vector<std::pair<int32_t, int32_t>>> lists(static_cast<size_t>(copies.numGroups()));
    for (int32_t g = 0; g < copies.numGroups(); ++g)
    {
        for (rt::PageCopy const& copy : copies[g])
        {
            lists[static_cast<size_t>(g)].emplace_back(copy.src, copy.dst);
        }
    }
    return lists;
}

rt::PageHash hashArgument(nb::handle hash)
{
    std::tuple<uint64_t, uint64_t> value;
    if (!nb::try_cast(hash, value))
    {
        throwTypeError(hash, "hash", "a (lo, hi) tuple of ints, lo and hi in [0, 2**64)");
    }
    return rt::PageHash{std::get<0>(value), std::get<1>(value)};
}

PageManagerHandle& pageManagerArgument(nb::handle pages, char const* field)
{
    return *checkedCast<PageManagerHandle*>(pages, field, "a PageManager");
}

namespace
{

//! Returns the layout of a KVCacheManager (anything with a layout() method), a KVCacheLayout or a Config.
rt::KVCacheLayout layoutOf(nb::handle source)
{
    if (nb::isinstance<rt::KVCacheLayout>(source))
    {
        return nb::cast<rt::KVCacheLayout>(source);
    }
    if (nb::isinstance<rt::KVCacheConfig>(source))
    {
        return rt::computeLayout(nb::cast<rt::KVCacheConfig>(source));
    }
    if (nb::hasattr(source, "layout"))
    {
        return checkedCast<rt::KVCacheLayout>(source.attr("layout")(), "source.layout()", "a KVCacheLayout");
    }
    throw rt::InvalidArgumentError(fmt::format("PageManager: source is a {}; it must be a KVCacheManager, a "
                                               "KVCacheLayout or a Config",
        nb::type_name(source.type()).c_str()));
}

//! Returns the options the constructor's keywords give.
rt::PageManagerOptions optionsOf(int64_t maxSequences, bool prefixCaching, rt::PageHashAlgorithm algorithm,
    nb::handle seed, bool recordEvents, int64_t checkpointIntervalPages)
{
    rt::PageManagerOptions options;
    options.recordEvents = recordEvents;
    options.maxSequences = toInt32(maxSequences, "max_sequences");
    options.checkpointIntervalPages = toInt32(checkpointIntervalPages, "checkpoint_interval_pages");
    options.enablePrefixCaching = prefixCaching;
    options.hashAlgorithm = algorithm;
    if (!seed.is_none())
    {
        std::string const bytes = bytesArgument(seed, "hash_seed", "32 bytes or None");
        std::array<uint8_t, 32> value{};
        if (bytes.size() != value.size())
        {
            throw rt::InvalidArgumentError(
                fmt::format("hash_seed has {} bytes; it must have {}", bytes.size(), value.size()));
        }
        std::memcpy(value.data(), bytes.data(), value.size());
        options.hashSeed = value;
    }
    return options;
}

// The manager owns its eviction callback, which may refer back to the manager (a bound method, a closure): without
// these the cycle would never be collected.
int pageManagerTraverse(PyObject* self, visitproc visit, void* arg)
{
    // A heap type's instances own a reference to it.
    Py_VISIT(Py_TYPE(self));
    if (!nb::inst_ready(self))
    {
        return 0;
    }
    Py_VISIT(nb::inst_ptr<PageManagerHandle>(self)->callback.ptr());
    return 0;
}

int pageManagerClear(PyObject* self)
{
    if (nb::inst_ready(self))
    {
        PageManagerHandle* const handle = nb::inst_ptr<PageManagerHandle>(self);
        // A TieredPrefixCache serving the manager owns its callback (and holds no Python object in it).
        if (!handle->servedByTiered)
        {
            handle->manager.setEvictionCallback({});
        }
        // Dropped after the manager lets go of it, as the last reference can run arbitrary code.
        nb::object const callback = std::move(handle->callback);
    }
    return 0;
}

PyType_Slot gPageManagerSlots[] = {{Py_tp_traverse, reinterpret_cast<void*>(&pageManagerTraverse)},
    {Py_tp_clear, reinterpret_cast<void*>(&pageManagerClear)}, {0, nullptr}};

//! Throws InvalidArgumentError naming the call `what` while a TieredPrefixCache serves the manager: the tiered cache
//! owns the eviction callback and must make every step itself, offloading the pages a step evicts before the step's
//! kernels can overwrite them.
void refuseWhileServed(PageManagerHandle const& handle, char const* what, char const* instead)
{
    if (handle.servedByTiered)
    {
        throw rt::InvalidArgumentError(fmt::format("PageManager.{}: a TieredPrefixCache serves this manager and owns "
                                                   "its eviction callback and steps; {}",
            what, instead));
    }
}

//! Makes `callback` (a callable, or None for none) the manager's eviction callback.
void setEvictionCallback(PageManagerHandle& handle, nb::handle callback)
{
    refuseWhileServed(handle, "set_eviction_callback", "set one once the tiered cache is gone");
    if (callback.is_none())
    {
        handle.manager.setEvictionCallback({});
        handle.callback.reset();
        return;
    }
    if (!PyCallable_Check(callback.ptr()))
    {
        throwTypeError(callback, "callback", "a callable or None");
    }
    PyObject* const function = callback.ptr();
    handle.manager.setEvictionCallback(
        [function](int32_t group, int32_t page, rt::PageHash hash)
        {
            // Held for the call: the callback may replace itself.
            nb::object const held = nb::borrow(function);
            held(group, page, nb::make_tuple(hash.lo, hash.hi));
        });
    // Replaced after the manager stopped pointing at the old one.
    handle.callback = nb::borrow(callback);
}

} // namespace

void bindPageManager(nb::module_& m)
{
    nb::enum_<rt::PageHashAlgorithm>(m, "PageHashAlgorithm", "The hash of page contents.")
        .value("SHA256", rt::PageHashAlgorithm::kSHA256, "Collision resistant (the default).")
        .value("XXH3_128", rt::PageHashAlgorithm::kXXH3_128, "Faster; only for trusted prompts.");

    nb::class_<rt::PageGroupCounts>(m, "PageGroupCounts", "Pages of one page group, by state.")
        .def_ro("num_pages", &rt::PageGroupCounts::numPages)
        .def_ro("free", &rt::PageGroupCounts::free)
        .def_ro("used", &rt::PageGroupCounts::used)
        .def_ro("cached", &rt::PageGroupCounts::cached)
        .def_ro("shared", &rt::PageGroupCounts::shared);

    nb::class_<rt::PageManagerStats>(m, "PageManagerStats", "Prefix reuse and copy-on-write counters.")
        .def_ro("prefix_query_tokens", &rt::PageManagerStats::prefixQueryTokens)
        .def_ro("prefix_hit_tokens", &rt::PageManagerStats::prefixHitTokens)
        .def_ro("evicted_pages", &rt::PageManagerStats::evictedPages)
        .def_ro("copy_on_write_pages", &rt::PageManagerStats::copyOnWritePages)
        .def_ro("checkpoints_saved", &rt::PageManagerStats::checkpointsSaved,
            "State checkpoints made: copies into a checkpoint slot queued by checkpoint_state.")
        .def_ro("checkpoints_restored", &rt::PageManagerStats::checkpointsRestored,
            "State checkpoints restored by adopt_prefix.")
        .def_ro("checkpoints_dropped", &rt::PageManagerStats::checkpointsDropped,
            "State checkpoints dropped: their slot reused, or their carrier page evicted.");

    nb::class_<PageManagerHandle>(m, "PageManager", nb::type_slots(gPageManagerSlots), nb::is_weak_referenceable(),
        "The page lifecycle of one cache on the host: pages per sequence and group, forks with copy-on-write, prefix "
        "reuse through chained page hashes, LRU eviction. It never touches the GPU: run the copies step() returns "
        "with copy_pages before the step's kernels, and build PageTableBuffers from pages(sequence, group).")
        .def(
            "__init__",
            [](PageManagerHandle* self, LayoutSourceArgument const& source, int64_t maxSequences, bool prefixCaching,
                rt::PageHashAlgorithm algorithm, BytesArgument const& seed, bool recordEvents,
                int64_t checkpointIntervalPages)
            {
                new (self) PageManagerHandle(layoutOf(source),
                    optionsOf(maxSequences, prefixCaching, algorithm, seed, recordEvents, checkpointIntervalPages));
            },
            nb::arg("source"), nb::kw_only(), nb::arg("max_sequences") = 0, nb::arg("enable_prefix_caching") = true,
            nb::arg("hash_algorithm") = rt::PageHashAlgorithm::kSHA256, nb::arg("hash_seed") = nb::none(),
            nb::arg("record_events") = false, nb::arg("checkpoint_interval_pages") = 0,
            "Sized from `source`: a KVCacheManager (its layout()), a KVCacheLayout, or a Config (compute_layout); "
            "max_sequences 0 means the layout's max_batch_size; hash_seed: 32 bytes, or None for a random one; "
            "record_events: record KV events for take_events(); checkpoint_interval_pages: with state checkpoints, "
            "also ask for one every this many pages of a sequence (checkpoint_boundary), 0 for none but the "
            "prompt's and the match's. Raises InvalidArgumentError for max_sequences or checkpoint_interval_pages "
            "below 0.")
        .def(
            "create",
            [](PageManagerHandle& h, BytesArgument const& salt)
            {
                rt::SequenceOptions options;
                std::string bytes;
                if (!salt.is_none())
                {
                    bytes = bytesArgument(salt, "salt", "bytes or None");
                    options.salt = bytes.data();
                    options.saltBytes = bytes.size();
                }
                return h.manager.create(options);
            },
            nb::arg("salt") = nb::none(), "Returns a new empty sequence; `salt` (bytes) separates prefix reuse.")
        .def(
            "adopt_prefix",
            [](PageManagerHandle& h, int64_t sequence, PageIdsArgument const& tokens,
                ExtraKeysArgument const& extraKeys)
            {
                rt::SequenceAppend const prompt = appendOf(h, 0, sequence, tokens, extraKeys);
                return h.manager.adoptPrefix(
                    sequence, prompt.tokens, prompt.count, prompt.extraKeys, prompt.numExtraKeys);
            },
            nb::arg("sequence"), nb::arg("tokens"), nb::arg("extra_keys") = nb::none(),
            "Gives an empty sequence the longest cached prefix of `tokens` (whole pages, at most len(tokens) - 1 "
            "tokens); returns its length in tokens. With state layers the prefix must also end at a state "
            "checkpoint, whose restore (checkpoint slot to the sequence's slot) it queues (pending_state_copies); "
            "without checkpoint slots such a layout adopts nothing.")
        .def(
            "hash_next_pages",
            [](PageManagerHandle& h, int64_t sequence, PageIdsArgument const& tokens,
                ExtraKeysArgument const& extraKeys)
            {
                rt::SequenceAppend const next = appendOf(h, 0, sequence, tokens, extraKeys);
                std::vector<rt::PageHash> hashes(static_cast<size_t>(std::max(next.count, 0)));
                int32_t const pages = h.manager.hashNextPages(
                    sequence, next.tokens, next.count, hashes.data(), next.extraKeys, next.numExtraKeys);
                nb::list out;
                for (int32_t p = 0; p < pages; ++p)
                {
                    out.append(nb::make_tuple(hashes[static_cast<size_t>(p)].lo, hashes[static_cast<size_t>(p)].hi));
                }
                return nb::typed<nb::list, std::pair<uint64_t, uint64_t>>(std::move(out));
            },
            nb::arg("sequence"), nb::arg("tokens"), nb::arg("extra_keys") = nb::none(),
            "Returns, as (lo, hi) tuples, the hashes the full pages of `tokens` would be registered under if appended "
            "to the sequence now (its length a whole number of pages); the eviction callback reports the same hashes, "
            "so a prefix evicted to another tier can be found and onboarded.")
        .def(
            "append",
            [](PageManagerHandle& h, int64_t sequence, PageIdsArgument const& tokens,
                ExtraKeysArgument const& extraKeys)
            {
                refuseWhileServed(h, "append", "append with TieredPrefixCache.step([(sequence, tokens)])");
                rt::SequenceAppend const append = appendOf(h, 0, sequence, tokens, extraKeys);
                return copyLists(h.manager.append(append));
            },
            nb::arg("sequence"), nb::arg("tokens"), nb::arg("extra_keys") = nb::none(),
            "Appends tokens to one sequence (step() with one entry); returns its copies as step() does. Raises "
            "InvalidArgumentError while a TieredPrefixCache serves the manager (append through its step()).")
        .def(
            "step",
            [](PageManagerHandle& h, AppendsArgument const& appends)
            {
                refuseWhileServed(h, "step", "step with TieredPrefixCache.step");
                appendsOf(h, appends);
                return copyLists(h.manager.step(h.appends.data(), static_cast<int32_t>(h.appends.size())));
            },
            nb::arg("appends"),
            "Appends tokens to each listed sequence, all or nothing: appends is a list of (sequence, tokens[, "
            "extra_keys]). Returns the copies to run with copy_pages before the step's kernels: one list of (src, dst) "
            "per group, in order. Raises OutOfMemoryError naming the group, the pages needed and available, and "
            "InvalidArgumentError while a TieredPrefixCache serves the manager (step through it: it offloads the "
            "pages a step evicts before the step's kernels overwrite them).")
        .def(
            "pages_needed",
            [](PageManagerHandle& h, AppendsArgument const& appends)
            {
                appendsOf(h, appends);
                std::vector<int64_t> needed(static_cast<size_t>(h.manager.numGroups()));
                h.manager.pagesNeeded(h.appends.data(), static_cast<int32_t>(h.appends.size()), needed.data());
                return needed;
            },
            nb::arg("appends"),
            "Returns, per group, the pages step(appends) would take less those its window releases make available; "
            "changes nothing. Raises what step() raises for invalid input.")
        .def(
            "can_step",
            [](PageManagerHandle& h, AppendsArgument const& appends)
            {
                appendsOf(h, appends);
                return h.manager.canStep(h.appends.data(), static_cast<int32_t>(h.appends.size()));
            },
            nb::arg("appends"),
            "Returns whether step(appends) would succeed (False exactly when it would raise OutOfMemoryError); changes "
            "nothing.")
        .def(
            "fork", [](PageManagerHandle& h, int64_t parent) { return h.manager.fork(parent); }, nb::arg("parent"),
            "Returns a new sequence sharing every page of `parent`; with state layers, in a state slot of its own, a "
            "copy of the parent's state queued for the next step (last_state_copies() after it).")
        .def(
            "free", [](PageManagerHandle& h, int64_t sequence) { h.manager.free(sequence); }, nb::arg("sequence"),
            "Lets go of every page of `sequence`, frees its state slot and forgets it.")
        .def(
            "state_slot", [](PageManagerHandle const& h, int64_t sequence) { return h.manager.stateSlot(sequence); },
            nb::arg("sequence"),
            "Returns the state slot `sequence` holds from create or fork to free: an index into the first dimension "
            "of every state tensor [num_state_slots, ...], or -1 when the layout has no state layers.")
        .def(
            "state_slots",
            [](PageManagerHandle const& h, std::vector<int64_t> const& sequences)
            {
                std::vector<int32_t> slots(sequences.size());
                h.manager.stateSlots(
                    sequences.data(), toInt32(static_cast<int64_t>(sequences.size()), "sequences"), slots.data());
                return slots;
            },
            nb::arg("sequences"),
            "Returns the state slot of each sequence, in order: a batch's slot table (vLLM's state_indices), to copy "
            "into a fixed int32 device buffer the step's recurrent kernels read.")
        .def(
            "pending_state_copies",
            [](PageManagerHandle const& h) { return stateCopyList(h.manager.pendingStateCopies()); },
            "The state copies (source slot, destination slot) queued since the last step by fork, checkpoint_state "
            "(the sequence's slot into a checkpoint slot) and adopt_prefix (a checkpoint slot into the sequence's), "
            "which the next step hands out.")
        .def(
            "last_state_copies",
            [](PageManagerHandle const& h) { return stateCopyList(h.manager.lastCopies().stateCopies()); },
            "The state copies (source slot, destination slot) the latest step() or append() handed out: the forks, "
            "checkpoint saves and restores since the step before. Run them, in any order, before the step's "
            "kernels, in every state layer and tensor (slot dst of each [num_state_slots, ...] tensor takes slot "
            "src's bytes).")
        .def(
            "checkpoint_boundary",
            [](PageManagerHandle const& h, int64_t sequence) { return h.manager.checkpointBoundary(sequence); },
            nb::arg("sequence"),
            "Returns the next length, above the sequence's, at which the manager asks for its state to be saved: the "
            "end of the prompt's last whole page before its last token, the end of the run of pages adopt_prefix "
            "found cached past what it adopted, or the next multiple of checkpoint_interval_pages pages; -1 for none "
            "(always -1 without state layers, checkpoint slots or prefix caching). End the prefill chunk there, run "
            "the step, then call checkpoint_state. Raises InvalidArgumentError for an unknown sequence.")
        .def(
            "checkpoint_state",
            [](PageManagerHandle& h, int64_t sequence) { return h.manager.checkpointState(sequence); },
            nb::arg("sequence"),
            "Keeps the sequence's state after its length tokens (in its state slot once the queued copies into it "
            "ran) as the checkpoint of its prefix: queues the copy of its slot into a checkpoint slot for the next "
            "step (pending_state_copies), an empty slot first, else the one a clock of hit counts picks. Returns "
            "True when the prefix has a checkpoint now (made, or there already), False when none could be kept (no "
            "checkpoint slots or prefix caching, its last page not registered, every checkpoint slot read or filled "
            "by a queued copy). Raises InvalidArgumentError for an unknown sequence, a layout without state layers, "
            "or a length that is 0 or not whole pages, changing nothing.")
        .def(
            "checkpoint_slot",
            [](PageManagerHandle const& h, PageHashArgument const& hash)
            { return h.manager.checkpointSlot(hashArgument(hash)); },
            nb::arg("hash"),
            "Returns the state slot holding the checkpoint of the prefix whose last page has `hash` ((lo, hi), as "
            "hash_next_pages gives it), adoptable or still filling, or -1.")
        .def(
            "num_checkpoints", [](PageManagerHandle const& h) { return h.manager.numCheckpoints(); },
            "Returns the number of state checkpoints held.")
        .def(
            "contains", [](PageManagerHandle const& h, int64_t sequence) { return h.manager.contains(sequence); },
            nb::arg("sequence"))
        .def(
            "length", [](PageManagerHandle const& h, int64_t sequence) { return h.manager.length(sequence); },
            nb::arg("sequence"))
        .def(
            "pages",
            [](PageManagerHandle const& h, int64_t sequence, int64_t group)
            {
                rt::SequencePages const pages = h.manager.pages(sequence, toInt32(group, "group"));
                std::vector<int32_t> ids(pages.pages, pages.pages + pages.numPages);
                return std::make_pair(ids, pages.numTokens);
            },
            nb::arg("sequence"), nb::arg("group"),
            "Returns (page ids in token order, UNUSED_PAGE_ENTRY where a window released them; length in tokens): "
            "what PageTableBuffers.build takes.")
        .def(
            "last_copies", [](PageManagerHandle const& h) { return copyLists(h.manager.lastCopies()); },
            "The copies of the latest step() or append(), as it returned them (for a step whose eviction callback "
            "raised).")
        .def(
            "evict_cached",
            [](PageManagerHandle& h, int64_t group, int64_t count)
            { return h.manager.evictCached(toInt32(group, "group"), toInt32(count, "count")); },
            nb::arg("group"), nb::arg("count"),
            "Drops up to `count` cached pages of `group`; returns how many. With a TieredPrefixCache serving the "
            "manager, its next call offloads them (or call its evict_cached).")
        .def(
            "set_retention",
            [](PageManagerHandle& h, int64_t sequence, int64_t firstToken, int64_t endToken, int64_t priority,
                std::optional<int64_t> durationMs)
            {
                h.manager.setRetention(sequence, toInt32(firstToken, "first_token"), toInt32(endToken, "end_token"),
                    toInt32(priority, "priority"), durationMs.value_or(rt::PageManager::kNO_DURATION));
            },
            nb::arg("sequence"), nb::arg("first_token"), nb::arg("end_token"), nb::arg("priority"),
            nb::arg("duration_ms") = nb::none(),
            "Sets retention priority `priority` (0 to 100, default 35) on the pages `sequence` holds for tokens "
            "[first_token, end_token): a page's priority is the highest its holders set since it was last free, and "
            "cached pages are evicted lowest priority first, least recently released first within one. With "
            "duration_ms the priority holds that many milliseconds (steady clock), taking effect at the next step, "
            "append or evict_cached after it ends. Raises InvalidArgumentError for an unknown sequence, a priority "
            "outside [0, 100], a duration outside [0, one year] or a range past the sequence, changing nothing.")
        .def(
            "retention_priority",
            [](PageManagerHandle const& h, int64_t group, int64_t page)
            { return h.manager.retentionPriority(toInt32(group, "group"), toInt32(page, "page")); },
            nb::arg("group"), nb::arg("page"),
            "The retention priority of `page` of `group` (set_retention). Raises OutOfRangeError for a bad group or "
            "page.")
        .def(
            "set_eviction_callback",
            [](PageManagerHandle& h, EvictionCallbackArgument const& callback) { setEvictionCallback(h, callback); },
            nb::arg("callback").none(),
            "callback(group, page, (lo, hi)) for each evicted page, after the eviction completed; None removes it. "
            "What it raises propagates from the call that evicted (the first exception when it raises for several "
            "pages), the manager consistent and the call's other changes made. The manager takes part in garbage "
            "collection, so a callback that refers back to it does not keep it alive. Raises InvalidArgumentError "
            "while a TieredPrefixCache serves the manager (it owns the callback until it is destroyed).")
        .def(
            "counts",
            [](PageManagerHandle const& h, int64_t group) { return h.manager.counts(toInt32(group, "group")); },
            nb::arg("group"))
        .def("stats", [](PageManagerHandle const& h) { return h.manager.stats(); })
        .def("reset_stats", [](PageManagerHandle& h) { h.manager.resetStats(); })
        .def(
            "take_events",
            [](PageManagerHandle& h)
            {
                h.manager.takeEvents(h.events);
                return kvEventsList(h.events);
            },
            "The KV events recorded since the last call (record_events=True; none otherwise), in order, as dicts "
            "with vLLM's names: type ('BlockStored', 'BlockRemoved' or 'AllBlocksCleared'), medium, group_idx, "
            "block_hashes (16 bytes each), and for BlockStored parent_block_hash (bytes or None), token_ids, "
            "block_size and extra_keys (None, or per page None or a list of bytes: the salt on a sequence's first "
            "page, then each extra key's 20 bytes).")
        .def(
            "counters", [](PageManagerHandle const& h) { return countersDict(rt::snapshotCounters(h.manager)); },
            "One snapshot of the counters as a dict: prefix_query_tokens, prefix_hit_tokens (by tier), "
            "evicted_pages (by tier), copy_on_write_pages, and tenants (a list of dicts: salt, other, query_tokens, "
            "device_hit_tokens, host_hit_tokens, disk_hit_tokens).")
        .def(
            "prometheus_text",
            [](PageManagerHandle const& h, std::string const& prefix)
            { return rt::toPrometheusText(rt::snapshotCounters(h.manager), prefix); },
            nb::arg("prefix") = "kvcache",
            "The counters in Prometheus' text exposition format, every metric named <prefix>_..._total.")
        .def(
            "check_invariants", [](PageManagerHandle const& h) { h.manager.checkInvariants(); },
            "Raises RuntimeError describing the first broken invariant.")
        .def("num_groups", [](PageManagerHandle const& h) { return h.manager.numGroups(); })
        .def("layout", [](PageManagerHandle const& h) { return h.manager.layout(); })
        .def("max_sequences", [](PageManagerHandle const& h) { return h.manager.maxSequences(); })
        .def("num_sequences", [](PageManagerHandle const& h) { return h.manager.numSequences(); });
}

} // namespace kvcache::python
