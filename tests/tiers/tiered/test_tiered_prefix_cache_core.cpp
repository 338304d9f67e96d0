// The tiered prefix cache's decisions (src/tiers/tiered/tiered_prefix_cache_core.h), host only, over a model of the
// bytes: every device and host page holds one value a token slot, the identity of the prompt prefix (tokens and extra
// keys) that token closes, and the model mover applies offloads, onboards and copies in the order the core asks for
// them. The runtime's kernels are modelled too: after each step the appended tokens' values are written into the
// sequence's pages. So a page offloaded after it was overwritten, onboarded into the wrong page, a run's host page
// given up before it was read or a copy run before the offload shows as a wrong value in a sequence's page or in a host
// page. Checked: the order of offloads and copies, runs onboarded in one call a group whatever maxTokensPerStep is, the
// last prompt token left to compute, least-recently-used host pages, a windowed group's own tier (only the window at a
// run's end is needed), pages the device still has held rather than onboarded, a run cut where the device runs out of
// pages, extra keys, refusals that change nothing, a failed offload, and random operations with every check after each.

#include "tiers/tiered/tiered_prefix_cache_core.h"

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/paging/page_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"

namespace kvcache::rt::detail
{
namespace
{

using test::throwsNaming;

constexpr int32_t kP = 4;
constexpr uint64_t kPOISON = 0xDEADDEADDEADDEADULL;

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
    };
    Kind kind;
    int32_t group;
    //! (page, host page), (source, destination) or (host page, disk page).
    std::vector<std::pair<int32_t, int32_t>> pairs;
};

//! Device and host pages as values, changed in the order the core calls; refuses what HostTier and copyPages refuse.
class ModelMover final : public TierMover
{
public:
    ModelMover(KVCacheLayout const& layout, std::vector<int64_t> const& numHostPages,
        std::vector<int64_t> const& numDiskPages = {})
    {
        for (size_t g = 0; g < layout.groups.size(); ++g)
        {
            device.emplace_back(static_cast<size_t>(layout.groups[g].numPages), PageData(kP, 0));
            host.emplace_back(static_cast<size_t>(numHostPages[g]), PageData(kP, 0));
            disk.emplace_back(numDiskPages.empty() ? 0 : static_cast<size_t>(numDiskPages[g]), PageData(kP, kPOISON));
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

    void spill(int32_t group, int32_t hostPage, int32_t diskPage) override
    {
        calls.push_back(MoverCall{MoverCall::kSPILL, group, {{hostPage, diskPage}}});
        if (failNextSpill)
        {
            failNextSpill = false;
            throw Error("the model's disk is full");
        }
        disk.at(static_cast<size_t>(group)).at(static_cast<size_t>(diskPage)) = hostPageAt(group, hostPage);
    }
    void restore(int32_t group, int32_t diskPage, int32_t hostPage) override
    {
        calls.push_back(MoverCall{MoverCall::kRESTORE, group, {{hostPage, diskPage}}});
        if (failRestores > 0)
        {
            --failRestores;
            throw InvalidArgumentError("the model's disk page does not read back");
        }
        hostPageAt(group, hostPage) = disk.at(static_cast<size_t>(group)).at(static_cast<size_t>(diskPage));
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
PageManagerOptions managerOptions(int32_t maxSequences)
{
    PageManagerOptions options;
    options.maxSequences = maxSequences;
    std::array<uint8_t, 32> seed{};
    seed[0] = 7;
    options.hashSeed = seed;
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
        std::vector<int64_t> const& numDiskPages = {})
        : manager(config, managerOptions(maxSequences))
        , mover(manager.layout(), numHostPages, numDiskPages)
        , core(manager, numHostPages, numDiskPages)
    {
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
    //! step (the runtime's kernels); returns false, leaving the rest, when a step would run out of pages.
    bool prefill(SequenceId sequence)
    {
        Script const& script = scripts.at(sequence);
        for (int32_t length = manager.length(sequence); length < static_cast<int32_t>(script.tokens.size());
             length = manager.length(sequence))
        {
            int32_t const count = std::min(stepTokens(), static_cast<int32_t>(script.tokens.size()) - length);
            std::vector<PageExtraKey> const keys = keysIn(script, length, length + count);
            SequenceAppend const append{
                sequence, script.tokens.data() + length, count, keys.data(), static_cast<int32_t>(keys.size())};
            if (!manager.canStep(&append, 1))
            {
                return false;
            }
            core.step(mover, &append, 1);
            compute(sequence, length, length + count);
        }
        return true;
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
        return {};
    }
    //! Everything checked at once.
    std::string check()
    {
        std::string failure = checkPages();
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
};

//! `count` tokens from `first` on.
std::vector<int32_t> tokenRun(int32_t first, int32_t count)
{
    std::vector<int32_t> tokens;
    for (int32_t i = 0; i < count; ++i)
    {
        tokens.push_back(first + 7 * i);
    }
    return tokens;
}

//! One group, kP tokens a page, sequences of `maxLength` tokens (numPages >= maxLength / kP).
KVCacheConfig oneGroup(int32_t numPages, int32_t stepTokens, int32_t maxLength = 32)
{
    return test::ConfigBuilder({{1, 8}})
        .maxBatchSize(1)
        .maxSequenceLength(maxLength)
        .tokensPerPage(kP)
        .maxTokensPerStep(stepTokens)
        .numPages(numPages);
}

//! Full attention (group 0) and a window of 6 tokens (group 1).
KVCacheConfig fullAndWindowed(int32_t stepTokens, std::vector<int32_t> numPagesPerGroup = {})
{
    return test::ConfigBuilder({{1, 8, 6}, {1, 8}})
        .maxBatchSize(2)
        .maxSequenceLength(32)
        .tokensPerPage(kP)
        .maxTokensPerStep(stepTokens)
        .numPagesPerGroup(std::move(numPagesPerGroup));
}

//! Full attention (group 0) and windows of 6 and 10 tokens (groups 1 and 2), as models with two window sizes have.
KVCacheConfig fullAndTwoWindows()
{
    return test::ConfigBuilder({{1, 8, 6}, {1, 8}, {1, 8, 10}})
        .maxBatchSize(2)
        .maxSequenceLength(32)
        .tokensPerPage(kP)
        .maxTokensPerStep(8)
        .numPagesPerGroup({20, 14, 16});
}

TEST(TieredPrefixCacheCoreTest, EvictedPagesGoToTheHostBeforeTheStepsCopiesCanOverwriteThem)
{
    Simulation sim(oneGroup(4, 16, 16), {8}, 4);
    // Two cached pages of a donor, then a sequence with a partial page on the two free pages, forked.
    SequenceId const donor = sim.serve({tokenRun(100, 8), {}}).first;
    sim.release(donor);
    SequenceId const parent = sim.serve({tokenRun(500, 6), {}}).first;
    ASSERT_EQ(sim.manager.counts(0).free, 0);
    SequenceId const child = sim.manager.fork(parent);
    sim.scripts[child] = sim.scripts.at(parent);
    sim.mover.calls.clear();
    // The child's first token goes to a fresh copy of the shared partial page: the page comes from evicting a donor
    // page, whose bytes must reach the host before the copy lands on it.
    sim.scripts[child].tokens.push_back(9999);
    ASSERT_TRUE(sim.prefill(child));
    ASSERT_EQ(sim.mover.calls.size(), 2u);
    EXPECT_EQ(sim.mover.calls[0].kind, MoverCall::kOFFLOAD);
    EXPECT_EQ(sim.mover.calls[1].kind, MoverCall::kCOPY);
    EXPECT_EQ(sim.mover.calls[0].pairs[0].first, sim.mover.calls[1].pairs[0].second)
        << "the evicted page is the copy's";
    EXPECT_EQ(sim.check(), "");
    EXPECT_EQ(sim.core.stats().offloadedPages, 1);
}

TEST(TieredPrefixCacheCoreTest, AnAdmissionOnboardsTheHostsRunInOneCallWhateverMaxTokensPerStepIs)
{
    Simulation sim(oneGroup(16, 8), {16}, 4);
    Script const prompt{tokenRun(1, 5 * kP + 1), {}};
    sim.release(sim.serve(prompt).first);
    EXPECT_EQ(sim.check(), "");
    EXPECT_EQ(sim.core.evictCached(sim.mover, 0, 16), 5);
    EXPECT_EQ(sim.core.stats().offloadedPages, 5);
    EXPECT_EQ(sim.check(), "");
    sim.mover.poisonDevice();
    sim.mover.calls.clear();
    sim.core.resetStats();

    auto const [second, admission] = sim.admit(prompt);
    EXPECT_EQ(admission.deviceTokens, 0);
    EXPECT_EQ(admission.hostTokens, 5 * kP);
    EXPECT_EQ(admission.computeTokens, 1);
    EXPECT_EQ(sim.manager.length(second), 5 * kP);
    // maxTokensPerStep 8 is two pages; the run is adopted whole, its five pages onboarded in one call.
    std::vector<size_t> onboards;
    for (MoverCall const& call : sim.mover.calls)
    {
        EXPECT_EQ(call.kind, MoverCall::kONBOARD);
        onboards.push_back(call.pairs.size());
    }
    EXPECT_EQ(onboards, (std::vector<size_t>{5}));
    EXPECT_EQ(sim.check(), "") << "every onboarded page holds the prompt's values";
    ASSERT_TRUE(sim.prefill(second));
    EXPECT_EQ(sim.check(), "");
    TieredPrefixCacheStats const stats = sim.core.stats();
    EXPECT_EQ(stats.admissions, 1);
    EXPECT_EQ(stats.queryTokens, 5 * kP + 1);
    EXPECT_EQ(stats.hostHitTokens, 5 * kP);
    EXPECT_EQ(stats.deviceHitTokens, 0);
    EXPECT_EQ(stats.missedTokens, 1);
    EXPECT_EQ(stats.onboardedPages, 5);

    // The onboarded pages were registered: the device serves the next request. Then the two pages freed first (the
    // prompt's last ones) leave the device again, which still finds them on the host, so nothing is copied.
    sim.release(second);
    auto const third = sim.admit(prompt);
    EXPECT_EQ(third.second.deviceTokens, 5 * kP);
    EXPECT_EQ(third.second.hostTokens, 0);
    sim.release(third.first);
    sim.mover.calls.clear();
    EXPECT_EQ(sim.core.evictCached(sim.mover, 0, 2), 2);
    EXPECT_TRUE(sim.mover.calls.empty());
    EXPECT_EQ(sim.core.stats().alreadyOnHostPages, 2);
    auto const fourth = sim.admit(prompt);
    EXPECT_EQ(fourth.second.deviceTokens, 3 * kP);
    EXPECT_EQ(fourth.second.hostTokens, 2 * kP);
    EXPECT_EQ(fourth.second.computeTokens, 1);
    EXPECT_EQ(sim.check(), "");
    EXPECT_EQ(sim.core.stats().deviceHitTokens, 8 * kP);
}

TEST(TieredPrefixCacheCoreTest, TheLastPromptTokenIsLeftToCompute)
{
    Simulation sim(oneGroup(16, 32), {16}, 4);
    Script const prompt{tokenRun(3, 4 * kP), {}};
    sim.serveThenEvict(prompt);
    TieredAdmission const admission = sim.admit(prompt).second;
    EXPECT_EQ(admission.hostTokens, 3 * kP);
    EXPECT_EQ(admission.computeTokens, kP);
    // A prompt of one token and an empty one: nothing to look up.
    EXPECT_EQ(sim.admit({{3}, {}}).second.computeTokens, 1);
    EXPECT_EQ(sim.admit({{}, {}}).second.computeTokens, 0);
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCoreTest, AFullHostTierKeepsTheNewestEvictionsAndGivesUpLeastRecentlyUsedHostPages)
{
    Simulation sim(oneGroup(16, 32), {3}, 4);
    Script const prompt{tokenRun(1, 5 * kP + 1), {}};
    sim.release(sim.serve(prompt).first);
    // The manager evicts the prompt's last page first (free() releases it first): of five new pages, the tier of three
    // keeps the last three evicted, the prompt's first three pages.
    EXPECT_EQ(sim.core.evictCached(sim.mover, 0, 16), 5);
    EXPECT_EQ(sim.core.stats().droppedPages, 2);
    EXPECT_EQ(sim.core.stats().offloadedPages, 3);
    std::vector<int32_t> held = sim.hostPagesOf(0, prompt.tokens, 5);
    EXPECT_GE(held[0], 0);
    EXPECT_GE(held[1], 0);
    EXPECT_GE(held[2], 0);
    EXPECT_EQ(held[3], -1);
    EXPECT_EQ(held[4], -1);
    // In the order inserted (page 2, 1, 0 of the prompt): two more evictions give up pages 2 and 1.
    Script const other{tokenRun(900, 2 * kP + 1), {}};
    sim.release(sim.serve(other).first);
    sim.core.evictCached(sim.mover, 0, 16);
    EXPECT_EQ(sim.core.stats().evictedHostPages, 2);
    held = sim.hostPagesOf(0, prompt.tokens, 3);
    EXPECT_GE(held[0], 0);
    EXPECT_EQ(held[1], -1);
    EXPECT_EQ(held[2], -1);
    EXPECT_EQ(sim.check(), "");
    TieredAdmission const admission = sim.admit(prompt).second;
    EXPECT_EQ(admission.hostTokens, kP);
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCoreTest, AnAdmissionsOwnEvictionsNeverTakeTheHostPagesOfItsRun)
{
    // Four device pages, a tier of two host pages holding the prompt's two pages.
    Simulation sim(oneGroup(4, 16, 16), {2}, 4);
    Script const prompt{tokenRun(1, 2 * kP + 1), {}};
    sim.serveThenEvict(prompt);
    ASSERT_EQ(sim.core.hostMap(0).size(), 2);
    // Three cached pages of another prompt and one free page: the admission's two pages evict one of them, whose
    // offload finds both host pages pinned by the run and is dropped, not written over the run before it is read.
    sim.release(sim.serve({tokenRun(700, 3 * kP), {}}).first);
    ASSERT_EQ(sim.manager.counts(0).cached, 3);
    sim.mover.poisonDevice();
    TieredAdmission const admission = sim.admit(prompt).second;
    EXPECT_EQ(admission.hostTokens, 2 * kP);
    EXPECT_EQ(sim.core.stats().droppedPages, 1);
    EXPECT_EQ(sim.check(), "");
}

//! The first page a window of 6 tokens (fullAndWindowed's) needs before token `position`.
int32_t firstWindowPage(int32_t position)
{
    return std::max(0, position - 6 + 1) / kP;
}

TEST(TieredPrefixCacheCoreTest, AWindowedGroupOnboardsOnlyTheWindowAtTheRunsEnd)
{
    for (int32_t const stepTokens : {4, 32})
    {
        SCOPED_TRACE("maxTokensPerStep " + std::to_string(stepTokens));
        Simulation sim(fullAndWindowed(stepTokens), {16, 16}, 4);
        ASSERT_EQ(sim.numGroups(), 2);
        ASSERT_EQ(sim.manager.layout().groups[1].slidingWindow, 6);
        Script const prompt{tokenRun(1, 6 * kP + 1), {}};
        sim.serveThenEvict(prompt);
        ASSERT_EQ(sim.check(), "");
        sim.mover.poisonDevice();
        auto const [sequence, admission] = sim.admit(prompt);
        EXPECT_EQ(admission.hostTokens, 6 * kP);
        // Six pages in full attention, and in the windowed group the pages of the window before token 24 (4 and 5);
        // its earlier entries are unused, as a window that moved past them leaves them.
        int32_t const window = firstWindowPage(6 * kP);
        EXPECT_EQ(sim.core.stats().onboardedPages, 6 + (6 - window));
        SequencePages const windowed = sim.manager.pages(sequence, 1);
        for (int32_t p = 0; p < 6; ++p)
        {
            EXPECT_EQ(windowed.pages[p] >= 0, p >= window) << "windowed entry " << p;
        }
        EXPECT_EQ(sim.check(), "");
        ASSERT_TRUE(sim.prefill(sequence));
        sim.release(sequence);
        // The run's pages are registered: a longer prompt adopts them from the device.
        Script longer = prompt;
        longer.tokens.resize(7 * kP + 1, 42);
        EXPECT_GE(sim.serve(longer).second.deviceTokens, 6 * kP);
        EXPECT_EQ(sim.check(), "");
    }
}

TEST(TieredPrefixCacheCoreTest, AWindowedGroupsTierNeedsToHoldOnlyTheWindow)
{
    // A windowed tier of two host pages: evicting the windowed group while the prompt's cut anchors its window, the
    // window's pages go last, and the tier keeps them.
    Simulation sim(fullAndWindowed(32), {16, 2}, 4);
    Script const prompt{tokenRun(1, 6 * kP + 1), {}};
    sim.release(sim.serve(prompt).first);
    sim.core.evictCached(sim.mover, 1, sim.manager.counts(1).cached);
    sim.core.evictCached(sim.mover, 0, sim.manager.counts(0).cached);
    std::vector<int32_t> const held = sim.hostPagesOf(1, prompt.tokens, 6);
    int32_t const window = firstWindowPage(6 * kP);
    for (int32_t p = 0; p < 6; ++p)
    {
        ASSERT_EQ(held[static_cast<size_t>(p)] >= 0, p >= window) << "windowed page " << p << " on the host";
    }
    sim.mover.poisonDevice();
    auto const [sequence, admission] = sim.admit(prompt);
    EXPECT_EQ(admission.hostTokens, 6 * kP);
    EXPECT_EQ(sim.check(), "");
    ASSERT_TRUE(sim.prefill(sequence));
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCoreTest, PagesTheDeviceStillHasAreHeldNotOnboarded)
{
    // The windowed group lost the prompt's pages and the full-attention group kept them: the device alone serves
    // nothing (no window), and the admission holds the cached full-attention pages and onboards only the window.
    Simulation sim(fullAndWindowed(32), {16, 16}, 4);
    Script const prompt{tokenRun(1, 6 * kP + 1), {}};
    SequenceId const first = sim.serve(prompt).first;
    std::vector<int32_t> const fullPages(sim.manager.pages(first, 0).pages, sim.manager.pages(first, 0).pages + 6);
    sim.release(first);
    sim.core.evictCached(sim.mover, 1, sim.manager.counts(1).cached);
    ASSERT_EQ(sim.manager.counts(1).cached, 0);
    ASSERT_GE(sim.manager.counts(0).cached, 6);
    for (PageData& page : sim.mover.device[1])
    {
        std::fill(page.begin(), page.end(), kPOISON);
    }
    sim.mover.calls.clear();
    sim.core.resetStats();
    auto const [sequence, admission] = sim.admit(prompt);
    EXPECT_EQ(admission.deviceTokens, 0);
    EXPECT_EQ(admission.hostTokens, 6 * kP);
    ASSERT_EQ(sim.mover.calls.size(), 1u);
    EXPECT_EQ(sim.mover.calls[0].kind, MoverCall::kONBOARD);
    EXPECT_EQ(sim.mover.calls[0].group, 1);
    EXPECT_EQ(sim.mover.calls[0].pairs.size(), static_cast<size_t>(6 - firstWindowPage(6 * kP)));
    SequencePages const full = sim.manager.pages(sequence, 0);
    EXPECT_EQ(std::vector<int32_t>(full.pages, full.pages + 6), fullPages) << "the cached pages, held";
    EXPECT_EQ(sim.check(), "");
    // The device now has the window as well: the same prompt adopts the run from the device alone.
    auto const again = sim.admit(prompt);
    EXPECT_EQ(again.second.deviceTokens, 6 * kP);
    EXPECT_EQ(sim.check(), "");
    sim.manager.checkInvariants();
}

TEST(TieredPrefixCacheCoreTest, ARunEndsAtTheFirstFullAttentionPageFoundNowhere)
{
    Simulation sim(fullAndWindowed(8), {3, 16}, 4);
    Script const prompt{tokenRun(1, 6 * kP + 1), {}};
    sim.serveThenEvict(prompt);
    // Computed from the maps: the run ends where the full-attention group's tier first lacks a page.
    int32_t expected = 0;
    std::vector<int32_t> const full = sim.hostPagesOf(0, prompt.tokens, 6);
    while (expected < 6 && full[static_cast<size_t>(expected)] >= 0)
    {
        ++expected;
    }
    // The full-attention group's tier of three host pages keeps the last three pages it evicted, the prompt's first
    // three (free() releases the last page first); the windowed tier holds the window before them.
    ASSERT_EQ(expected, 3);
    std::vector<int32_t> const windowed = sim.hostPagesOf(1, prompt.tokens, 6);
    for (int32_t p = firstWindowPage(expected * kP); p < expected; ++p)
    {
        ASSERT_GE(windowed[static_cast<size_t>(p)], 0) << "windowed page " << p;
    }
    sim.mover.poisonDevice();
    EXPECT_EQ(sim.admit(prompt).second.hostTokens, expected * kP);
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCoreTest, ARunStopsWhereTheDeviceRunsOutOfPages)
{
    Simulation sim(oneGroup(8, 4), {8}, 4);
    Script const prompt{tokenRun(1, 5 * kP + 1), {}};
    sim.serveThenEvict(prompt);
    SequenceId const holder = sim.serve({tokenRun(300, 5 * kP), {}}).first;
    ASSERT_EQ(sim.manager.counts(0).free, 3);
    auto const [sequence, admission] = sim.admit(prompt);
    EXPECT_EQ(admission.hostTokens, 3 * kP);
    EXPECT_EQ(admission.computeTokens, 2 * kP + 1);
    EXPECT_EQ(sim.manager.length(sequence), 3 * kP);
    EXPECT_EQ(sim.check(), "");
    sim.release(holder);
    ASSERT_TRUE(sim.prefill(sequence));
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCoreTest, ARunIsAdoptedInWholePagesWhenStepsAreShorterThanAPage)
{
    Simulation sim(oneGroup(16, 3), {16}, 4);
    Script const prompt{tokenRun(1, 3 * kP + 2), {}};
    sim.serveThenEvict(prompt);
    sim.mover.poisonDevice();
    sim.mover.calls.clear();
    auto const [sequence, admission] = sim.admit(prompt);
    EXPECT_EQ(admission.hostTokens, 3 * kP);
    EXPECT_EQ(sim.mover.count(MoverCall::kONBOARD), 1);
    EXPECT_EQ(sim.core.stats().onboardedPages, 3);
    EXPECT_EQ(sim.check(), "");
    ASSERT_TRUE(sim.prefill(sequence));
    EXPECT_EQ(sim.check(), "");

    // One page left on the device: the run is its first page.
    Simulation tight(oneGroup(4, 3, 16), {16}, 4);
    tight.serveThenEvict(prompt);
    SequenceId const holder = tight.serve({tokenRun(300, 3 * kP), {}}).first;
    ASSERT_EQ(tight.manager.counts(0).free, 1);
    tight.mover.poisonDevice();
    tight.scripts.erase(holder); // poisoned: its pages are no longer checked
    auto const cut = tight.admit(prompt);
    EXPECT_EQ(cut.second.hostTokens, kP);
    EXPECT_EQ(tight.check(), "");
}

TEST(TieredPrefixCacheCoreTest, ExtraKeysTakePartInTheHostLookup)
{
    Simulation sim(oneGroup(16, 8), {16}, 4);
    Script prompt{tokenRun(1, 4 * kP + 1), {{kP + 1, PageHash{0x1234, 0x5678}}}};
    sim.serveThenEvict(prompt);
    sim.mover.poisonDevice();
    auto const same = sim.admit(prompt);
    EXPECT_EQ(same.second.hostTokens, 4 * kP);
    EXPECT_EQ(sim.check(), "");
    // Another key in page 1: only page 0 is the same page.
    Script other = prompt;
    other.keys[0].key.lo = 0x4321;
    auto const different = sim.admit(other);
    EXPECT_EQ(different.second.deviceTokens + different.second.hostTokens, kP);
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCoreTest, DirectEvictionsAreOffloadedByTheNextCallBeforeItsPagesAreReused)
{
    Simulation sim(oneGroup(4, 16, 16), {8}, 4);
    Script const prompt{tokenRun(1, 3 * kP), {}};
    sim.release(sim.serve(prompt).first);
    EXPECT_EQ(sim.manager.evictCached(0, 4), 3);
    EXPECT_EQ(sim.core.numPendingEvictions(), 3);
    sim.mover.calls.clear();
    // A step that takes the freed pages: the offload comes first.
    SequenceId const sequence = sim.serve({tokenRun(400, 4 * kP), {}}).first;
    ASSERT_FALSE(sim.mover.calls.empty());
    EXPECT_EQ(sim.mover.calls[0].kind, MoverCall::kOFFLOAD);
    EXPECT_EQ(sim.core.numPendingEvictions(), 0);
    EXPECT_EQ(sim.check(), "");
    sim.release(sequence);
    sim.core.evictCached(sim.mover, 0, 4);
    sim.mover.poisonDevice();
    EXPECT_EQ(sim.admit(prompt).second.hostTokens, 2 * kP);
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCoreTest, AFailedOffloadLeavesNoHostPageClaimingItsPages)
{
    Simulation sim(oneGroup(16, 32), {8}, 4);
    Script const prompt{tokenRun(1, 3 * kP + 1), {}};
    sim.release(sim.serve(prompt).first);
    sim.mover.failNextOffload = true;
    EXPECT_THROW(sim.core.evictCached(sim.mover, 0, 16), CudaError);
    EXPECT_EQ(sim.core.hostMap(0).size(), 0);
    EXPECT_EQ(sim.core.hostMap(0).numFree(), 8);
    EXPECT_EQ(sim.core.stats().offloadedPages, 0);
    EXPECT_EQ(sim.check(), "");
    EXPECT_EQ(sim.admit(prompt).second.hostTokens, 0);
}

//! Evicts every cached page of group 0 one page at a time (one offload each), so that a full host tier gives up its
//! least recently used host page for each new one.
void evictOneByOne(Simulation& sim)
{
    while (sim.manager.counts(0).cached > 0)
    {
        sim.core.evictCached(sim.mover, 0, 1);
    }
}

TEST(TieredPrefixCacheCoreTest, HostPagesGivenUpGoToTheDiskAndComeBackForARun)
{
    // A host tier of five pages and a disk tier of sixteen. Prompt A's five pages go to the host (its last page first,
    // as free() releases them); prompt B's four then take the host pages of A's pages 4, 3, 2 and 1, which go to disk.
    Simulation sim(oneGroup(16, 8), {5}, 4, {16});
    Script const a{tokenRun(1, 5 * kP + 1), {}};
    Script const b{tokenRun(500, 4 * kP + 1), {}};
    sim.release(sim.serve(a).first);
    evictOneByOne(sim);
    sim.release(sim.serve(b).first);
    evictOneByOne(sim);
    EXPECT_EQ(sim.core.stats().spilledPages, 4);
    EXPECT_EQ(sim.core.stats().evictedHostPages, 4);
    std::vector<int32_t> const onHost = sim.hostPagesOf(0, a.tokens, 5);
    EXPECT_GE(onHost[0], 0);
    for (int32_t p = 1; p < 5; ++p)
    {
        EXPECT_EQ(onHost[static_cast<size_t>(p)], -1) << "page " << p;
        EXPECT_GE(sim.core.diskMap(0)->find(sim.hashesOf(a.tokens, 5)[static_cast<size_t>(p)]), 0) << "page " << p;
    }
    EXPECT_EQ(sim.check(), "");
    sim.mover.poisonDevice();
    sim.mover.calls.clear();
    sim.core.resetStats();

    // A's admission reads its four disk pages into host pages (B's, given up and spilled in turn), then onboards all
    // five in one call.
    auto const [sequence, admission] = sim.admit(a);
    EXPECT_EQ(admission.hostTokens, 5 * kP);
    TieredPrefixCacheStats const stats = sim.core.stats();
    EXPECT_EQ(stats.restoredPages, 4);
    EXPECT_EQ(stats.spilledPages, 4) << "B's pages, whose host pages the restores took";
    EXPECT_EQ(stats.onboardedPages, 5);
    EXPECT_EQ(stats.diskFailures, 0);
    EXPECT_EQ(sim.mover.count(MoverCall::kRESTORE), 4);
    EXPECT_EQ(sim.mover.count(MoverCall::kONBOARD), 1);
    EXPECT_EQ(sim.mover.calls.back().kind, MoverCall::kONBOARD) << "every restore before the onboard";
    EXPECT_EQ(sim.check(), "");
    ASSERT_TRUE(sim.prefill(sequence));
    EXPECT_EQ(sim.check(), "");
    // B comes back from the disk the same way.
    sim.release(sequence);
    auto const again = sim.admit(b);
    EXPECT_EQ(again.second.hostTokens, 4 * kP);
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCoreTest, ADiskPageThatDoesNotReadBackEndsTheRunAndIsDropped)
{
    Simulation sim(oneGroup(16, 8), {5}, 4, {16});
    Script const a{tokenRun(1, 5 * kP + 1), {}};
    sim.release(sim.serve(a).first);
    evictOneByOne(sim);
    sim.release(sim.serve({tokenRun(500, 4 * kP + 1), {}}).first);
    evictOneByOne(sim);
    sim.mover.poisonDevice();
    sim.core.resetStats();
    // The first restore (page 1) fails: the run is page 0, on the host.
    sim.mover.failRestores = 1;
    auto const [sequence, admission] = sim.admit(a);
    EXPECT_EQ(admission.hostTokens, kP);
    EXPECT_EQ(sim.core.stats().diskFailures, 1);
    EXPECT_EQ(sim.core.diskMap(0)->find(sim.hashesOf(a.tokens, 2)[1]), -1) << "the page that failed is dropped";
    EXPECT_EQ(sim.manager.length(sequence), kP);
    EXPECT_EQ(sim.check(), "");
    ASSERT_TRUE(sim.prefill(sequence));
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCoreTest, ADiskPageThatCannotBeWrittenIsCountedAndTheStepGoesOn)
{
    Simulation sim(oneGroup(16, 8), {1}, 4, {4});
    Script const a{tokenRun(1, 2 * kP + 1), {}};
    sim.release(sim.serve(a).first);
    sim.mover.failNextSpill = true;
    evictOneByOne(sim);
    // Page 1 went to the host first; page 0 took its host page, and page 1's spill failed.
    EXPECT_EQ(sim.core.stats().diskFailures, 1);
    EXPECT_EQ(sim.core.stats().spilledPages, 0);
    EXPECT_EQ(sim.core.diskMap(0)->size(), 0);
    EXPECT_EQ(sim.check(), "");
    EXPECT_EQ(sim.admit(a).second.hostTokens, kP);
    EXPECT_EQ(sim.check(), "");
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

Observed observe(Simulation const& sim)
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

TEST(TieredPrefixCacheCoreTest, BadCallsAreRefusedNamingTheArgumentAndChangeNothing)
{
    Simulation sim(oneGroup(8, 8), {8}, 3);
    Script const prompt{tokenRun(1, 5 * kP + 1), {}};
    SequenceId const busy = sim.serve(prompt).first;
    ASSERT_EQ(sim.manager.counts(0).free, 2);
    Observed const before = observe(sim);

    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { sim.core.admit(sim.mover, busy, prompt.tokens.data(), 5, nullptr, 0); }, {"21 tokens", "empty"}));
    SequenceId const fresh = sim.manager.create();
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { sim.core.admit(sim.mover, fresh, prompt.tokens.data(), 33, nullptr, 0); }, {"count is 33", "[0, 32]"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { sim.core.admit(sim.mover, fresh, nullptr, 4, nullptr, 0); }, {"tokens is null", "count 4"}));
    PageExtraKey const unordered[] = {{6, {}}, {2, {}}};
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { sim.core.admit(sim.mover, fresh, prompt.tokens.data(), 13, unordered, 2); }, {"extra"}));
    sim.manager.free(fresh);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { sim.core.admit(sim.mover, fresh, prompt.tokens.data(), 4, nullptr, 0); }, {std::to_string(fresh)}));

    std::vector<int32_t> const many(9, 1);
    SequenceAppend const tooLong{busy, many.data(), 9, nullptr, 0};
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { sim.core.step(sim.mover, &tooLong, 1); }, {"9", "8"}));
    SequenceId const other = sim.manager.create();
    std::vector<int32_t> const eight(8, 5);
    SequenceAppend const outOfPages[] = {{busy, eight.data(), 8, nullptr, 0}, {other, eight.data(), 8, nullptr, 0}};
    EXPECT_TRUE(throwsNaming<OutOfMemoryError>([&] { sim.core.step(sim.mover, outOfPages, 2); }, {"group 0"}));
    sim.manager.free(other);
    EXPECT_TRUE(throwsNaming<OutOfRangeError>([&] { sim.core.evictCached(sim.mover, 1, 1); }, {"group", "1"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { sim.core.evictCached(sim.mover, 0, -1); }, {"-1"}));
    EXPECT_TRUE(
        throwsNaming<OutOfRangeError>([&] { sim.core.hostMap(3, "where"); }, {"where", "group is 3", "[0, 1)"}));
    EXPECT_TRUE(observe(sim) == before);
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCoreTest, BadSizesAndLayoutsAreRefusedBeforeTheManagerIsTouched)
{
    KVCacheConfig const config = fullAndWindowed(8);
    PageManager manager(config, managerOptions(2));
    KVCacheLayout const& layout = manager.layout();
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { checkNumHostPages(layout, {4}); }, {"numHostPages has 1 entries", "one per page group (2)"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] {
            checkNumHostPages(layout, {4, 0});
        },
        {"numHostPages[1] is 0", "[1, 2147483647]", "sliding window of 6 tokens"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] {
            checkNumHostPages(layout, {int64_t{1} << 31, 4});
        },
        {"numHostPages[0] is 2147483648", "full attention"}));

    // A failed construction leaves the manager's callback alone.
    int32_t evictions = 0;
    manager.setEvictionCallback([&](int32_t, int32_t, PageHash) { ++evictions; });
    EXPECT_THROW(TieredPrefixCacheCore(manager, {4, -1}), InvalidArgumentError);
    SequenceId const sequence = manager.create();
    std::vector<int32_t> const tokens = tokenRun(1, 8);
    manager.append({sequence, tokens.data(), 8});
    manager.free(sequence);
    manager.evictCached(0, 8);
    EXPECT_EQ(evictions, 2);
    {
        // And a core's destruction clears it: these evictions reach no one.
        TieredPrefixCacheCore const core(manager, {4, 4});
    }
    SequenceId const again = manager.create();
    manager.append({again, tokens.data(), 8});
    manager.free(again);
    EXPECT_EQ(manager.evictCached(0, 8), 2);
    EXPECT_EQ(evictions, 2);

    KVCacheLayout const same = computeLayout(config);
    EXPECT_NO_THROW(checkSameLayout(same, layout));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { checkSameLayout(computeLayout(oneGroup(8, 8)), layout); }, {"the number of page groups", "2", "1"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] {
            checkSameLayout(computeLayout(fullAndWindowed(8, {20, 10})), layout);
        },
        {"group 0 numPages"}));
    KVCacheConfig otherType = config;
    otherType.kvCacheType = DataType::kFLOAT;
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { checkSameLayout(computeLayout(otherType), layout); }, {"group 0's page geometry"}));
    KVCacheConfig otherPages = oneGroup(8, 8);
    otherPages.tokensPerPage = 8;
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&]
        { checkSameLayout(computeLayout(otherPages), computeLayout(oneGroup(8, 8))); },
        {"tokensPerPage", "8", "4"}));
}

//! A run of random admissions, prefills, decode steps, forks, frees and evictions (through the core and, sometimes,
//! directly), host pages becoming usable over time and refused calls, with every check after each operation.
std::string randomRun(KVCacheConfig const& config, std::vector<int64_t> const& numHostPages,
    std::vector<int64_t> const& numDiskPages, uint32_t seed, int64_t operations, std::map<std::string, int64_t>& tally)
{
    constexpr int32_t kMAX_SEQUENCES = 5;
    Simulation sim(config, numHostPages, kMAX_SEQUENCES, numDiskPages);
    std::mt19937 random(seed);
    for (int32_t g = 0; g < sim.numGroups(); ++g)
    {
        sim.mover.usable[static_cast<size_t>(g)] = 1;
    }
    int32_t const maxLength = sim.manager.layout().maxSequenceLength;
    std::vector<std::vector<int32_t>> families;
    for (int32_t f = 0; f < 3; ++f)
    {
        families.push_back(tokenRun(1000 * (f + 1), maxLength));
    }
    auto anyLive = [&]() -> SequenceId
    {
        auto it = sim.scripts.begin();
        std::advance(it, static_cast<long>(random() % sim.scripts.size()));
        return it->first;
    };
    for (int64_t op = 0; op < operations; ++op)
    {
        int32_t const kind = static_cast<int32_t>(random() % 100);
        std::string what;
        if (kind < 30 && sim.manager.numSequences() < kMAX_SEQUENCES)
        {
            what = "admission";
            Script script;
            std::vector<int32_t> const& family = families[random() % families.size()];
            int32_t const count = 1 + static_cast<int32_t>(random() % static_cast<uint32_t>(maxLength - 4));
            script.tokens.assign(family.begin(), family.begin() + count);
            if (random() % 4 == 0)
            {
                int32_t const diverge = static_cast<int32_t>(random() % static_cast<uint32_t>(count));
                script.tokens[static_cast<size_t>(diverge)] = static_cast<int32_t>(random() % 100);
            }
            auto const [sequence, admission] = sim.admit(script);
            if (admission.deviceTokens + admission.hostTokens + admission.computeTokens != count
                || admission.computeTokens < 1 || sim.manager.length(sequence) != count - admission.computeTokens)
            {
                return "admission " + std::to_string(op) + " returned tiers that do not add up";
            }
            tally["host hits"] += admission.hostTokens > 0 ? 1 : 0;
            tally["device hits"] += admission.deviceTokens > 0 ? 1 : 0;
            if (admission.hostTokens > 0 && sim.manager.numSequences() < kMAX_SEQUENCES)
            {
                // The run's pages are registered under the hashes a plain append gives them (the core passes on those
                // of its host lookup), or were the device's own: the same prompt adopts the whole run from the device,
                // in every group.
                SequenceId const probe = sim.manager.create();
                int32_t const adopted = sim.manager.adoptPrefix(
                    probe, script.tokens.data(), count, script.keys.data(), static_cast<int32_t>(script.keys.size()));
                sim.manager.free(probe);
                if (adopted < admission.deviceTokens + admission.hostTokens)
                {
                    return "admission " + std::to_string(op) + " onboarded " + std::to_string(admission.hostTokens)
                        + " tokens after " + std::to_string(admission.deviceTokens) + " but the device adopts only "
                        + std::to_string(adopted);
                }
                ++tally["onboarded runs adopted again"];
            }
            std::string const failure = sim.check();
            if (!failure.empty())
            {
                return "after admission " + std::to_string(op) + ": " + failure;
            }
            if (!sim.prefill(sequence))
            {
                sim.release(sequence);
                ++tally["prefills out of pages"];
            }
        }
        else if (kind < 55 && !sim.scripts.empty())
        {
            what = "decode step";
            SequenceId const sequence = anyLive();
            Script& script = sim.scripts.at(sequence);
            int32_t const length = sim.manager.length(sequence);
            int32_t const count = 1 + static_cast<int32_t>(random() % 3);
            if (length + count > maxLength)
            {
                sim.release(sequence);
                continue;
            }
            for (int32_t i = 0; i < count; ++i)
            {
                script.tokens.push_back(static_cast<int32_t>(random() % 50));
            }
            SequenceAppend const append{sequence, script.tokens.data() + length, count, nullptr, 0};
            if (!sim.manager.canStep(&append, 1))
            {
                Observed const before = observe(sim);
                bool const refused = throwsNaming<OutOfMemoryError>([&] { sim.core.step(sim.mover, &append, 1); });
                if (!refused || !(observe(sim) == before))
                {
                    return "step " + std::to_string(op) + " out of pages was not refused cleanly";
                }
                script.tokens.resize(static_cast<size_t>(length));
                ++tally["steps out of pages"];
                continue;
            }
            sim.core.step(sim.mover, &append, 1);
            sim.compute(sequence, length, length + count);
        }
        else if (kind < 62 && !sim.scripts.empty() && sim.manager.numSequences() < kMAX_SEQUENCES)
        {
            what = "fork";
            SequenceId const parent = anyLive();
            SequenceId const child = sim.manager.fork(parent);
            sim.scripts[child] = sim.scripts.at(parent);
        }
        else if (kind < 82 && !sim.scripts.empty())
        {
            what = "free";
            sim.release(anyLive());
        }
        else if (kind < 88)
        {
            what = "evictCached";
            auto const group = static_cast<int32_t>(random() % static_cast<uint32_t>(sim.numGroups()));
            sim.core.evictCached(sim.mover, group, 1 + static_cast<int32_t>(random() % 6));
        }
        else if (kind < 91)
        {
            what = "a direct evictCached";
            auto const group = static_cast<int32_t>(random() % static_cast<uint32_t>(sim.numGroups()));
            sim.manager.evictCached(group, 1 + static_cast<int32_t>(random() % 3));
        }
        else if (kind < 92 && !numDiskPages.empty())
        {
            what = "a disk failure to come";
            if (random() % 2 == 0)
            {
                sim.mover.failNextSpill = true;
            }
            else
            {
                sim.mover.failRestores = 1;
            }
        }
        else if (kind < 95)
        {
            what = "host pages pinned";
            auto const group = static_cast<size_t>(random() % static_cast<uint32_t>(sim.numGroups()));
            sim.mover.usable[group] = std::min(sim.mover.usable[group] + 1, numHostPages[group]);
        }
        else if (!sim.scripts.empty())
        {
            what = "a refused admission";
            SequenceId const busy = anyLive();
            if (sim.manager.length(busy) == 0)
            {
                continue;
            }
            Observed const before = observe(sim);
            Script const& script = sim.scripts.at(busy);
            bool const refused = throwsNaming<InvalidArgumentError>(
                [&] { sim.core.admit(sim.mover, busy, script.tokens.data(), 1, nullptr, 0); }, {"empty"});
            if (!refused || !(observe(sim) == before))
            {
                return "refused admission " + std::to_string(op) + " changed something";
            }
        }
        std::string failure = sim.check();
        if (failure.empty() && op % 16 == 0)
        {
            try
            {
                sim.manager.checkInvariants();
            }
            catch (std::exception const& error)
            {
                failure = error.what();
            }
        }
        if (!failure.empty())
        {
            return "seed " + std::to_string(seed) + ", operation " + std::to_string(op) + " (" + what + "): " + failure;
        }
    }
    TieredPrefixCacheStats const& stats = sim.core.stats();
    tally["offloaded pages"] += stats.offloadedPages;
    tally["already on host"] += stats.alreadyOnHostPages;
    tally["evicted host pages"] += stats.evictedHostPages;
    tally["onboarded pages"] += stats.onboardedPages;
    tally["spilled pages"] += stats.spilledPages;
    tally["restored pages"] += stats.restoredPages;
    tally["disk failures"] += stats.diskFailures;
    tally["onboards"] += sim.mover.count(MoverCall::kONBOARD);
    tally["copy-on-write copies"] += sim.mover.count(MoverCall::kCOPY);
    return {};
}

struct RandomCase
{
    char const* name;
    KVCacheConfig config;
    std::vector<int64_t> numHostPages;
    std::vector<int64_t> numDiskPages;
};

TEST(TieredPrefixCacheCoreTest, RandomOperationsKeepEveryPageRight)
{
    std::vector<RandomCase> const cases{
        {"one group, steps of two pages", oneGroup(20, 8), {10}, {}},
        {"one group, steps shorter than a page", oneGroup(16, 3), {6}, {}},
        {"full attention and a window", fullAndWindowed(8, {20, 14}), {12, 9}, {}},
        {"full attention and two windows", fullAndTwoWindows(), {12, 9, 6}, {}},
        {"one group and a disk tier", oneGroup(20, 8), {9}, {14}},
        {"full attention, a window and a disk tier", fullAndWindowed(8, {20, 14}), {10, 8}, {16, 12}},
    };
    uint32_t seed = 1;
    for (RandomCase const& c : cases)
    {
        SCOPED_TRACE(c.name);
        std::map<std::string, int64_t> tally;
        for (int32_t run = 0; run < 3; ++run)
        {
            ASSERT_EQ(randomRun(c.config, c.numHostPages, c.numDiskPages, seed++, 6000, tally), "");
        }
        // The runs must have reached what they are for.
        for (char const* reached : {"host hits", "device hits", "offloaded pages", "already on host",
                 "evicted host pages", "onboarded pages", "steps out of pages", "copy-on-write copies"})
        {
            EXPECT_GT(tally[reached], 0) << reached;
        }
        EXPECT_GT(tally["onboarded runs adopted again"], 0);
        if (!c.numDiskPages.empty())
        {
            for (char const* reached : {"spilled pages", "restored pages", "disk failures"})
            {
                EXPECT_GT(tally[reached], 0) << reached;
            }
        }
        EXPECT_GT(tally["onboards"], 0);
    }
}

} // namespace
} // namespace kvcache::rt::detail
