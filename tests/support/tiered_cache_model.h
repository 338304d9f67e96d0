#pragma once

// A model of the bytes under the tiered prefix cache's decisions (src/tiers/tiered/tiered_prefix_cache_core.h), for
// host-only tests: every device and host page holds one value a token slot, the identity of the prompt prefix (tokens
// and extra keys) that token closes, and the model mover applies offloads, onboards and copies in the order the core
// asks for them. The runtime's kernels are modelled too: after each step the appended tokens' values are written into
// the sequence's pages. So a page offloaded after it was overwritten, onboarded into the wrong page, a run's host page
// given up before it was read or a copy run before the offload shows as a wrong value in a sequence's page or in a host
// page. With state layers, every state slot and host state holds one value too, the value of the position whose state
// it is: the modelled kernels check that a sequence's slot holds the state after its last token before they write the
// next, so a checkpoint restored from the wrong slot, a host state onboarded into the wrong slot or offloaded after it
// was overwritten shows as a wrong state.

#include "tiers/tiered/tiered_prefix_cache_core.h"

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/paging/page_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/config_builder.h"

// Inside the core's namespace, as the tests that use it are, so that the model names the core's types as they do.
namespace kvcache::rt::detail::tiered_model
{

inline constexpr int32_t kP = 4;

inline constexpr uint64_t kPOISON = 0xDEADDEADDEADDEADULL;

//! One value a token slot of a page.
using PageData = std::vector<uint64_t>;

//! A call the core made to its mover.
struct MoverCall
{
    enum Kind
    {
        kOFFLOAD,
        kONBOARD,
        kCOPY,
        kSPILL,
        kRESTORE,
        kOFFLOAD_STATES,
        kONBOARD_STATES,
    };
    Kind kind;
    int32_t group;
    //! (page, host page), (source, destination), (host page, disk page) or (state slot, host state).
    std::vector<std::pair<int32_t, int32_t>> pairs;
};

//! Device and host pages as values, changed in the order the core calls; refuses what HostTier and copyPages refuse.
class ModelMover final : public TierMover
{
public:
    ModelMover(KVCacheLayout const& layout, std::vector<int64_t> const& numHostPages,
        std::vector<int64_t> const& numDiskPages = {}, int64_t numHostStates = 0)
        : states(static_cast<size_t>(layout.numStateSlots), kPOISON)
        , hostStates(static_cast<size_t>(numHostStates), kPOISON)
    {
        for (size_t g = 0; g < layout.groups.size(); ++g)
        {
            device.emplace_back(static_cast<size_t>(layout.groups[g].numPages), PageData(kP, 0));
            host.emplace_back(static_cast<size_t>(numHostPages[g]), PageData(kP, 0));
            disk.emplace_back(numDiskPages.empty() ? 0 : static_cast<size_t>(numDiskPages[g]), PageData(kP, kPOISON));
            diskStates.emplace_back(numDiskPages.empty() ? 0 : static_cast<size_t>(numDiskPages[g]), kPOISON);
            usable.push_back(numHostPages[g]);
        }
    }

    int64_t usableHostPages(int32_t group) const override
    {
        return usable.at(static_cast<size_t>(group));
    }
    void offload(int32_t group, HostTierEntry const* entries, int32_t count) override
    {
        if (failNextOffload)
        {
            failNextOffload = false;
            throw CudaError(cudaErrorLaunchFailure, "the model's offload failed");
        }
        MoverCall call = listed(MoverCall::kOFFLOAD, group, entries, count);
        for (auto const& [page, hostPage] : call.pairs)
        {
            hostPageAt(group, hostPage) = device.at(static_cast<size_t>(group)).at(static_cast<size_t>(page));
        }
        calls.push_back(std::move(call));
    }
    void onboard(int32_t group, HostTierEntry const* entries, int32_t count) override
    {
        MoverCall call = listed(MoverCall::kONBOARD, group, entries, count);
        for (auto const& [page, hostPage] : call.pairs)
        {
            device.at(static_cast<size_t>(group)).at(static_cast<size_t>(page)) = hostPageAt(group, hostPage);
        }
        calls.push_back(std::move(call));
    }
    void offloadStates(HostStateEntry const* entries, int32_t count) override
    {
        moveStates(MoverCall::kOFFLOAD_STATES, entries, count);
    }
    void onboardStates(HostStateEntry const* entries, int32_t count) override
    {
        moveStates(MoverCall::kONBOARD_STATES, entries, count);
    }
    //! Runs a step's state copies (the runtime's, before the step's kernels), all reading before any writes.
    void copyStates(std::vector<StateSlotCopy> const& copies)
    {
        std::vector<uint64_t> const before = states;
        for (StateSlotCopy const& copy : copies)
        {
            states.at(static_cast<size_t>(copy.dst)) = before.at(static_cast<size_t>(copy.src));
        }
    }
    //! Returns the calls of `kind`.
    std::vector<MoverCall> callsOf(MoverCall::Kind kind) const
    {
        std::vector<MoverCall> found;
        std::copy_if(
            calls.begin(), calls.end(), std::back_inserter(found), [&](MoverCall const& c) { return c.kind == kind; });
        return found;
    }
    void copy(int32_t group, PageCopy const* copies, int32_t count) override
    {
        MoverCall call{MoverCall::kCOPY, group, {}};
        std::vector<PageData>& pages = device.at(static_cast<size_t>(group));
        std::vector<PageData> const before = pages;
        for (int32_t i = 0; i < count; ++i)
        {
            call.pairs.emplace_back(copies[i].src, copies[i].dst);
            pages.at(static_cast<size_t>(copies[i].dst)) = before.at(static_cast<size_t>(copies[i].src));
        }
        calls.push_back(std::move(call));
    }

    void spill(int32_t group, int32_t hostPage, int32_t diskPage, int32_t hostState) override
    {
        calls.push_back(MoverCall{MoverCall::kSPILL, group, {{hostPage, diskPage}}});
        if (failNextSpill)
        {
            failNextSpill = false;
            throw Error("the model's disk is full");
        }
        disk.at(static_cast<size_t>(group)).at(static_cast<size_t>(diskPage)) = hostPageAt(group, hostPage);
        // A file holds a state only when one is written with it (a sequence file without one refuses to give one).
        diskStates.at(static_cast<size_t>(group)).at(static_cast<size_t>(diskPage)) =
            hostState >= 0 ? hostStates.at(static_cast<size_t>(hostState)) : kPOISON;
    }
    void restore(int32_t group, int32_t diskPage, int32_t hostPage, int32_t hostState) override
    {
        calls.push_back(MoverCall{MoverCall::kRESTORE, group, {{hostPage, diskPage}}});
        if (failRestores > 0)
        {
            --failRestores;
            throw InvalidArgumentError("the model's disk page does not read back");
        }
        hostPageAt(group, hostPage) = disk.at(static_cast<size_t>(group)).at(static_cast<size_t>(diskPage));
        if (hostState >= 0)
        {
            uint64_t const state = diskStates.at(static_cast<size_t>(group)).at(static_cast<size_t>(diskPage));
            if (state == kPOISON)
            {
                ADD_FAILURE() << "disk page " << diskPage << " of group " << group << " was written without a state";
            }
            hostStates.at(static_cast<size_t>(hostState)) = state;
        }
    }

    //! Sets every slot of every device page to kPOISON.
    void poisonDevice()
    {
        for (std::vector<PageData>& pages : device)
        {
            for (PageData& page : pages)
            {
                std::fill(page.begin(), page.end(), kPOISON);
            }
        }
    }
    //! Returns the number of calls of `kind`.
    int64_t count(MoverCall::Kind kind) const
    {
        return std::count_if(calls.begin(), calls.end(), [&](MoverCall const& call) { return call.kind == kind; });
    }

    std::vector<std::vector<PageData>> device;
    std::vector<std::vector<PageData>> host;
    std::vector<std::vector<PageData>> disk;
    //! Per state slot and per host state: the value of the position whose state it holds.
    std::vector<uint64_t> states;
    std::vector<uint64_t> hostStates;
    //! Per group and disk page: the state written with the page, kPOISON for none.
    std::vector<std::vector<uint64_t>> diskStates;
    std::vector<int64_t> usable;
    std::vector<MoverCall> calls;
    bool failNextOffload = false;
    bool failNextSpill = false;
    //! Restores still to fail.
    int32_t failRestores = 0;

private:
    PageData& hostPageAt(int32_t group, int32_t hostPage)
    {
        if (hostPage < 0 || hostPage >= usable.at(static_cast<size_t>(group)))
        {
            ADD_FAILURE() << "host page " << hostPage << " of group " << group << " is not usable ("
                          << usable.at(static_cast<size_t>(group)) << " are)";
        }
        return host.at(static_cast<size_t>(group)).at(static_cast<size_t>(hostPage));
    }
    //! Copies each entry's state from its slot to its host state (kOFFLOAD_STATES) or back (kONBOARD_STATES).
    void moveStates(MoverCall::Kind kind, HostStateEntry const* entries, int32_t count)
    {
        MoverCall call{kind, -1, {}};
        for (int32_t i = 0; i < count; ++i)
        {
            call.pairs.emplace_back(entries[i].slot, entries[i].hostState);
            uint64_t& inSlot = states.at(static_cast<size_t>(entries[i].slot));
            uint64_t& onHost = hostStates.at(static_cast<size_t>(entries[i].hostState));
            if (kind == MoverCall::kOFFLOAD_STATES)
            {
                onHost = inSlot;
            }
            else
            {
                inSlot = onHost;
            }
        }
        calls.push_back(std::move(call));
    }
    //! The entries as pairs; a page or host page listed twice is a failure (HostTier refuses such a list).
    static MoverCall listed(MoverCall::Kind kind, int32_t group, HostTierEntry const* entries, int32_t count)
    {
        MoverCall call{kind, group, {}};
        std::map<int32_t, int32_t> pages;
        std::map<int32_t, int32_t> hostPages;
        for (int32_t i = 0; i < count; ++i)
        {
            if (++pages[entries[i].page] > 1 || ++hostPages[entries[i].hostPage] > 1)
            {
                ADD_FAILURE() << "entry " << i << " repeats page " << entries[i].page << " or host page "
                              << entries[i].hostPage;
            }
            call.pairs.emplace_back(entries[i].page, entries[i].hostPage);
        }
        return call;
    }
};

//! Returns options of `maxSequences` sequences and a fixed hash seed.
inline PageManagerOptions managerOptions(int32_t maxSequences)
{
    PageManagerOptions options;
    options.maxSequences = maxSequences;
    std::array<uint8_t, 32> seed{};
    seed[0] = 7;
    options.hashSeed = seed;
    // Every simulation checks the KV events against the pages each tier holds (Simulation::checkEvents).
    options.recordEvents = true;
    return options;
}

//! What a runtime knows of one of its sequences: the tokens it appends (the prompt first) and their extra keys.
struct Script
{
    std::vector<int32_t> tokens;
    std::vector<PageExtraKey> keys;
};

//! A PageManager, the model mover and the core under test, with a runtime's view of its sequences.
class Simulation
{
public:
    Simulation(KVCacheConfig const& config, std::vector<int64_t> const& numHostPages, int32_t maxSequences,
        std::vector<int64_t> const& numDiskPages = {}, int64_t numHostStates = 0)
        : manager(config, managerOptions(maxSequences))
        , mover(manager.layout(), numHostPages, numDiskPages, numHostStates)
        , core(manager, numHostPages, numDiskPages, numHostStates)
    {
    }
    bool stateful() const
    {
        return manager.layout().numStateSlots > 0;
    }

    int32_t numGroups() const
    {
        return manager.numGroups();
    }
    int32_t stepTokens() const
    {
        return manager.layout().maxTokensPerStep;
    }

    //! Creates a sequence for `script` and admits its tokens.
    std::pair<SequenceId, TieredAdmission> admit(Script const& script)
    {
        SequenceId const sequence = manager.create();
        scripts[sequence] = script;
        auto const count = static_cast<int32_t>(script.tokens.size());
        TieredAdmission const admission = core.admit(
            mover, sequence, script.tokens.data(), count, script.keys.data(), static_cast<int32_t>(script.keys.size()));
        return {sequence, admission};
    }
    //! Steps the rest of the sequence's script in, maxTokensPerStep at a time, writing the tokens' values after each
    //! step (the runtime's kernels); returns false, leaving the rest, when a step would run out of pages. With state
    //! layers a step ends at each checkpoint boundary the manager asks for, where the state is then checkpointed.
    bool prefill(SequenceId sequence)
    {
        Script const& script = scripts.at(sequence);
        for (int32_t length = manager.length(sequence); length < static_cast<int32_t>(script.tokens.size());
             length = manager.length(sequence))
        {
            int32_t count = std::min(stepTokens(), static_cast<int32_t>(script.tokens.size()) - length);
            int32_t const boundary = stateful() ? manager.checkpointBoundary(sequence) : -1;
            if (boundary > length)
            {
                count = std::min(count, boundary - length);
            }
            std::vector<PageExtraKey> const keys = keysIn(script, length, length + count);
            SequenceAppend const append{
                sequence, script.tokens.data() + length, count, keys.data(), static_cast<int32_t>(keys.size())};
            if (!manager.canStep(&append, 1))
            {
                return false;
            }
            StepCopies const copies = core.step(mover, &append, 1);
            mover.copyStates(copies.stateCopies());
            compute(sequence, length, length + count);
            if (length + count == boundary)
            {
                manager.checkpointState(sequence);
            }
        }
        return true;
    }
    //! A step of no sequence: hands out the queued state copies, which the runtime runs.
    void flushStateCopies()
    {
        StepCopies const copies = core.step(mover, nullptr, 0);
        mover.copyStates(copies.stateCopies());
    }
    //! Admits and prefills `script` and checks the pages (recording its pages' data); frees the sequence when it
    //! does not fit.
    std::pair<SequenceId, TieredAdmission> serve(Script const& script)
    {
        auto const [sequence, admission] = admit(script);
        if (!prefill(sequence))
        {
            release(sequence);
        }
        std::string const failure = checkPages();
        if (!failure.empty())
        {
            ADD_FAILURE() << "serving a prompt: " << failure;
        }
        return {sequence, admission};
    }
    void release(SequenceId sequence)
    {
        manager.free(sequence);
        scripts.erase(sequence);
    }
    //! Serves `script`, frees it and evicts every cached page of every group (to the host tiers); returns how many.
    int32_t serveThenEvict(Script const& script)
    {
        release(serve(script).first);
        int32_t evicted = 0;
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            evicted += core.evictCached(mover, g, manager.counts(g).cached);
        }
        return evicted;
    }
    //! Writes the values of positions [from, to) into the sequence's pages, as the step's kernels would.
    void compute(SequenceId sequence, int32_t from, int32_t to)
    {
        std::vector<uint64_t> const values = valuesOf(scripts.at(sequence));
        if (stateful())
        {
            // The kernels read the state after position from - 1 and leave the state after position to - 1.
            uint64_t& state = mover.states.at(static_cast<size_t>(manager.stateSlot(sequence)));
            if (from > 0 && state != values[static_cast<size_t>(from - 1)])
            {
                ADD_FAILURE() << "sequence " << sequence << " starts at " << from << " with the state of another "
                              << "position (" << std::hex << state << ")";
            }
            state = values[static_cast<size_t>(to - 1)];
        }
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            SequencePages const pages = manager.pages(sequence, g);
            for (int32_t position = from; position < to; ++position)
            {
                int32_t const page = pages.pages[position / kP];
                ASSERT_GE(page, 0) << "position " << position << " of group " << g << " has no page";
                mover.device[static_cast<size_t>(g)][static_cast<size_t>(page)][static_cast<size_t>(position % kP)] =
                    values[static_cast<size_t>(position)];
            }
        }
    }

    //! Returns the values of a script's positions: each identifies the tokens and keys up to and including it.
    static std::vector<uint64_t> valuesOf(Script const& script)
    {
        std::vector<uint64_t> values;
        uint64_t value = 0xCBF29CE484222325ULL;
        size_t key = 0;
        for (size_t position = 0; position < script.tokens.size(); ++position)
        {
            value = (value ^ static_cast<uint32_t>(script.tokens[position])) * 0x100000001B3ULL;
            for (; key < script.keys.size() && script.keys[key].position == static_cast<int32_t>(position); ++key)
            {
                value = (value ^ script.keys[key].key.lo ^ (script.keys[key].key.hi << 1)) * 0x100000001B3ULL;
            }
            values.push_back(value == kPOISON || value == 0 ? value + 1 : value);
        }
        return values;
    }
    static std::vector<PageExtraKey> keysIn(Script const& script, int32_t from, int32_t to)
    {
        std::vector<PageExtraKey> keys;
        for (PageExtraKey const& key : script.keys)
        {
            if (key.position >= from && key.position < to)
            {
                keys.push_back(key);
            }
        }
        return keys;
    }

    //! Checks every live sequence's pages hold its tokens' values, and records the data of its full pages' hashes.
    std::string checkPages()
    {
        PageHash const root = manager.hasher().root(nullptr, 0);
        for (auto const& [sequence, script] : scripts)
        {
            int32_t const length = manager.length(sequence);
            std::vector<uint64_t> const values = valuesOf(script);
            for (int32_t g = 0; g < numGroups(); ++g)
            {
                SequencePages const pages = manager.pages(sequence, g);
                for (int32_t position = 0; position < length; ++position)
                {
                    int32_t const page = pages.pages[position / kP];
                    if (page < 0)
                    {
                        continue; // released by a window
                    }
                    uint64_t const held = mover.device[static_cast<size_t>(g)][static_cast<size_t>(page)]
                                                      [static_cast<size_t>(position % kP)];
                    if (held != values[static_cast<size_t>(position)])
                    {
                        std::ostringstream text;
                        text << "sequence " << sequence << " group " << g << " position " << position << " (page "
                             << page << ") holds " << std::hex << held << ", not "
                             << values[static_cast<size_t>(position)];
                        return text.str();
                    }
                }
            }
            int32_t const fullPages = length / kP;
            if (script.keys.empty() && fullPages > 0)
            {
                std::vector<PageHash> hashes(static_cast<size_t>(fullPages));
                manager.hasher().chain(root, script.tokens.data(), fullPages, kP, hashes.data());
                for (int32_t p = 0; p < fullPages; ++p)
                {
                    dataOfHash[{hashes[static_cast<size_t>(p)].lo, hashes[static_cast<size_t>(p)].hi}] =
                        PageData(values.begin() + p * kP, values.begin() + (p + 1) * kP);
                }
            }
        }
        return {};
    }
    //! Checks every host page and disk page holding a known hash holds that page's data.
    std::string checkHostPages() const
    {
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            for (HostPageMap const* map : {&core.hostMap(g), core.diskMap(g)})
            {
                if (map == nullptr)
                {
                    continue;
                }
                bool const onDisk = map != &core.hostMap(g);
                for (int32_t const page : map->leastRecentFirst())
                {
                    PageHash const hash = map->hashOf(page);
                    auto const known = dataOfHash.find({hash.lo, hash.hi});
                    PageData const& held =
                        (onDisk ? mover.disk : mover.host)[static_cast<size_t>(g)][static_cast<size_t>(page)];
                    if (known != dataOfHash.end() && held != known->second)
                    {
                        return "group " + std::to_string(g) + (onDisk ? " disk page " : " host page ")
                            + std::to_string(page) + " does not hold the data of its hash";
                    }
                }
            }
        }
        if (HostPageMap const* states = core.stateMap())
        {
            for (int32_t const hostState : states->leastRecentFirst())
            {
                PageHash const hash = states->hashOf(hostState);
                auto const known = dataOfHash.find({hash.lo, hash.hi});
                if (known != dataOfHash.end()
                    && mover.hostStates.at(static_cast<size_t>(hostState)) != known->second.back())
                {
                    return "host state " + std::to_string(hostState) + " does not hold the state after its page";
                }
            }
        }
        return {};
    }
    //! Applies the KV events since the last call to `held` (per medium and group, the hashes a router believes held),
    //! and checks that they are exactly what the device registered and the host and disk maps hold.
    std::string checkEvents()
    {
        core.takeEvents(events);
        for (KVEvent const& event : events.events())
        {
            if (event.type == KVEventType::kALL_CLEARED)
            {
                eventHeld.clear();
                continue;
            }
            auto& set = eventHeld[{static_cast<int32_t>(event.medium), event.group}];
            for (int64_t h = event.firstHash; h < event.firstHash + event.numHashes; ++h)
            {
                PageHash const hash = events.hashes()[static_cast<size_t>(h)];
                std::string const medium = toString(event.medium);
                ++eventTally[medium + (event.type == KVEventType::kSTORED ? " stored" : " removed")];
                if (event.type == KVEventType::kSTORED ? !set.insert({hash.lo, hash.hi}).second
                                                       : set.erase({hash.lo, hash.hi}) != 1)
                {
                    return "a " + medium + " event of group " + std::to_string(event.group)
                        + (event.type == KVEventType::kSTORED ? " stores a hash held already"
                                                              : " removes a hash not held");
                }
            }
        }
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            auto const& device = eventHeld[{static_cast<int32_t>(KVEventMedium::kGPU), g}];
            if (static_cast<int32_t>(device.size()) != PageManagerInternal::numRegistered(manager, g))
            {
                return "group " + std::to_string(g) + ": the GPU events hold " + std::to_string(device.size())
                    + " hashes, the manager registered "
                    + std::to_string(PageManagerInternal::numRegistered(manager, g));
            }
            for (auto const& [lo, hi] : device)
            {
                if (!PageManagerInternal::hasPage(manager, g, PageHash{lo, hi}))
                {
                    return "group " + std::to_string(g) + ": a GPU event's hash is not registered";
                }
            }
            for (HostPageMap const* map : {&core.hostMap(g), core.diskMap(g)})
            {
                KVEventMedium const medium = map == &core.hostMap(g) ? KVEventMedium::kCPU : KVEventMedium::kDISK;
                auto const& tier = eventHeld[{static_cast<int32_t>(medium), g}];
                int32_t const size = map == nullptr ? 0 : map->size();
                bool same = static_cast<int32_t>(tier.size()) == size;
                for (auto const& [lo, hi] : tier)
                {
                    same = same && map != nullptr && map->find(PageHash{lo, hi}) != HostPageMap::kNONE;
                }
                if (!same)
                {
                    return "group " + std::to_string(g) + ": the " + toString(medium)
                        + " events differ from the tier's pages";
                }
            }
        }
        return {};
    }

    //! Everything checked at once.
    std::string check()
    {
        std::string failure = checkPages();
        if (failure.empty())
        {
            failure = checkEvents();
        }
        if (failure.empty())
        {
            failure = checkHostPages();
        }
        if (failure.empty())
        {
            try
            {
                core.checkInvariants();
            }
            catch (std::exception const& error)
            {
                failure = error.what();
            }
        }
        TieredPrefixCacheStats const& stats = core.stats();
        if (failure.empty() && stats.queryTokens != stats.deviceHitTokens + stats.hostHitTokens + stats.missedTokens)
        {
            failure = "the token counters do not add up to the query tokens";
        }
        return failure;
    }

    //! The hashes of the full pages of tokens[0, pages * kP).
    std::vector<PageHash> hashesOf(std::vector<int32_t> const& tokens, int32_t pages) const
    {
        std::vector<PageHash> hashes(static_cast<size_t>(pages));
        manager.hasher().chain(manager.hasher().root(nullptr, 0), tokens.data(), pages, kP, hashes.data());
        return hashes;
    }
    //! The host pages of group `group` holding the pages of `tokens`, in order (-1 where none does).
    std::vector<int32_t> hostPagesOf(int32_t group, std::vector<int32_t> const& tokens, int32_t pages) const
    {
        std::vector<int32_t> found;
        for (PageHash const& hash : hashesOf(tokens, pages))
        {
            found.push_back(core.hostMap(group).find(hash));
        }
        return found;
    }

    PageManager manager;
    ModelMover mover;
    TieredPrefixCacheCore core;
    std::map<SequenceId, Script> scripts;
    std::map<std::pair<uint64_t, uint64_t>, PageData> dataOfHash;
    KVEventBatch events;
    //! Per (medium, group), the hashes the events say are held; per medium and kind, the hashes events listed.
    std::map<std::pair<int32_t, int32_t>, std::set<std::pair<uint64_t, uint64_t>>> eventHeld;
    std::map<std::string, int64_t> eventTally;
};

//! `count` tokens from `first` on.
inline std::vector<int32_t> tokenRun(int32_t first, int32_t count)
{
    std::vector<int32_t> tokens;
    for (int32_t i = 0; i < count; ++i)
    {
        tokens.push_back(first + 7 * i);
    }
    return tokens;
}

//! One group, kP tokens a page, sequences of `maxLength` tokens (numPages >= maxLength / kP).
inline KVCacheConfig oneGroup(int32_t numPages, int32_t stepTokens, int32_t maxLength = 32)
{
    return test::ConfigBuilder({{1, 8}})
        .maxBatchSize(1)
        .maxSequenceLength(maxLength)
        .tokensPerPage(kP)
        .maxTokensPerStep(stepTokens)
        .numPages(numPages);
}

//! Full attention (group 0) and a window of 6 tokens (group 1).
inline KVCacheConfig fullAndWindowed(int32_t stepTokens, std::vector<int32_t> numPagesPerGroup = {})
{
    return test::ConfigBuilder({{1, 8, 6}, {1, 8}})
        .maxBatchSize(2)
        .maxSequenceLength(32)
        .tokensPerPage(kP)
        .maxTokensPerStep(stepTokens)
        .numPagesPerGroup(std::move(numPagesPerGroup));
}

//! Full attention (group 0) and windows of 6 and 10 tokens (groups 1 and 2), as models with two window sizes have.
inline KVCacheConfig fullAndTwoWindows()
{
    return test::ConfigBuilder({{1, 8, 6}, {1, 8}, {1, 8, 10}})
        .maxBatchSize(2)
        .maxSequenceLength(32)
        .tokensPerPage(kP)
        .maxTokensPerStep(8)
        .numPagesPerGroup({20, 14, 16});
}

//! What a refused call must leave as it was.
struct Observed
{
    std::vector<int64_t> stats;
    size_t calls = 0;
    std::vector<std::vector<int32_t>> lru;
    std::vector<int32_t> counts;
    int64_t pending = 0;

    bool operator==(Observed const& other) const
    {
        return stats == other.stats && calls == other.calls && lru == other.lru && counts == other.counts
            && pending == other.pending;
    }
};

inline Observed observe(Simulation const& sim)
{
    TieredPrefixCacheStats const& s = sim.core.stats();
    Observed seen{{s.admissions, s.queryTokens, s.deviceHitTokens, s.hostHitTokens, s.missedTokens, s.offloadedPages,
                      s.alreadyOnHostPages, s.droppedPages, s.evictedHostPages, s.onboardedPages},
        sim.mover.calls.size(), {}, {}, sim.core.numPendingEvictions()};
    for (int32_t g = 0; g < sim.numGroups(); ++g)
    {
        seen.lru.push_back(sim.core.hostMap(g).leastRecentFirst());
        PageGroupCounts const counts = sim.manager.counts(g);
        seen.counts.insert(seen.counts.end(), {counts.free, counts.used, counts.cached, counts.shared});
    }
    return seen;
}

} // namespace kvcache::rt::detail::tiered_model
