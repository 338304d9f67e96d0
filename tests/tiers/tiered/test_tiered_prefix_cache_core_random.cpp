// The tiered prefix cache under random operations (host only): admissions, prefills, decode steps, forks, frees and
// evictions, with every page and host page checked after each operation; with state layers, checkpoints saved where the
// manager asks, moved to host states and back, with every state a step reads checked.
// The model of device, host and disk pages the checks run over is tests/support/tiered_cache_model.h.

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/tiered_cache_model.h"

namespace kvcache::rt::detail
{
namespace
{

using namespace tiered_model;
using test::throwsNaming;

//! A run of random admissions, prefills, decode steps, forks, frees and evictions (through the core and, sometimes,
//! directly), host pages becoming usable over time and refused calls, with every check after each operation.
std::string randomRun(KVCacheConfig const& config, std::vector<int64_t> const& numHostPages,
    std::vector<int64_t> const& numDiskPages, int64_t numHostStates, uint32_t seed, int64_t operations,
    std::map<std::string, int64_t>& tally)
{
    constexpr int32_t kMAX_SEQUENCES = 5;
    Simulation sim(config, numHostPages, kMAX_SEQUENCES, numDiskPages, numHostStates);
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
        if (sim.stateful() && kind < 62)
        {
            // Rows whose slot a queued copy reads are held until a step hands the copy out: one makes room to create.
            sim.flushStateCopies();
        }
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
            StepCopies const copies = sim.core.step(sim.mover, &append, 1);
            sim.mover.copyStates(copies.stateCopies());
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
    // The statistics the run's paths must reach, by the names the tests ask for.
    static constexpr std::pair<char const*, int64_t TieredPrefixCacheStats::*> kCOUNTED_STATS[] = {
        {"offloaded pages", &TieredPrefixCacheStats::offloadedPages},
        {"already on host", &TieredPrefixCacheStats::alreadyOnHostPages},
        {"evicted host pages", &TieredPrefixCacheStats::evictedHostPages},
        {"onboarded pages", &TieredPrefixCacheStats::onboardedPages},
        {"spilled pages", &TieredPrefixCacheStats::spilledPages},
        {"restored pages", &TieredPrefixCacheStats::restoredPages},
        {"disk failures", &TieredPrefixCacheStats::diskFailures},
        {"offloaded states", &TieredPrefixCacheStats::offloadedStates},
        {"dropped states", &TieredPrefixCacheStats::droppedStates},
        {"released states", &TieredPrefixCacheStats::releasedStates},
        {"onboarded states", &TieredPrefixCacheStats::onboardedStates},
        {"spilled states", &TieredPrefixCacheStats::spilledStates},
        {"restored states", &TieredPrefixCacheStats::restoredStates},
    };
    TieredPrefixCacheStats const& stats = sim.core.stats();
    for (auto const& [name, field] : kCOUNTED_STATS)
    {
        tally[name] += stats.*field;
    }
    tally["onboards"] += sim.mover.count(MoverCall::kONBOARD);
    tally["copy-on-write copies"] += sim.mover.count(MoverCall::kCOPY);
    for (auto const& [name, count] : sim.eventTally)
    {
        tally["events: " + name] += count;
    }
    return {};
}

struct RandomCase
{
    char const* name;
    KVCacheConfig config;
    std::vector<int64_t> numHostPages;
    std::vector<int64_t> numDiskPages;
    int64_t numHostStates = 0;
};

//! One full-attention group of 40 pages (the least for 5 sequences), 5 sequences, one state layer and 3 checkpoint
//! slots.
KVCacheConfig withStateLayer(int32_t stepTokens)
{
    return test::ConfigBuilder({{1, 8}})
        .maxBatchSize(5)
        .maxSequenceLength(32)
        .tokensPerPage(kP)
        .maxTokensPerStep(stepTokens)
        .numPages(40)
        .stateLayers({StateLayerConfig{{StateTensorConfig{"ssm", {2, 4}, DataType::kFLOAT}}}})
        .numCheckpointSlots(3);
}

TEST(TieredPrefixCacheCoreTest, RandomOperationsKeepEveryPageRight)
{
    std::vector<RandomCase> const cases{
        {"one group, steps of two pages", oneGroup(20, 8), {10}, {}},
        {"one group, steps shorter than a page", oneGroup(16, 3), {6}, {}},
        {"full attention and a window", fullAndWindowed(8, {20, 14}), {12, 9}, {}},
        {"full attention and two windows", fullAndTwoWindows(), {12, 9, 6}, {}},
        {"one group and a disk tier", oneGroup(20, 8), {9}, {14}},
        {"full attention, a window and a disk tier", fullAndWindowed(8, {20, 14}), {10, 8}, {16, 12}},
        {"a state layer, host states", withStateLayer(8), {14}, {}, 3},
        {"a state layer, host states and a disk tier", withStateLayer(8), {10}, {16}, 4},
    };
    uint32_t seed = 1;
    for (RandomCase const& c : cases)
    {
        SCOPED_TRACE(c.name);
        std::map<std::string, int64_t> tally;
        for (int32_t run = 0; run < 3; ++run)
        {
            ASSERT_EQ(randomRun(c.config, c.numHostPages, c.numDiskPages, c.numHostStates, seed++, 6000, tally), "");
        }
        // The runs must have reached what they are for.
        for (char const* reached : {"host hits", "device hits", "offloaded pages", "already on host",
                 "evicted host pages", "onboarded pages", "copy-on-write copies"})
        {
            EXPECT_GT(tally[reached], 0) << reached;
        }
        // With state layers the pages are the minimum for every sequence at full length: a step always fits.
        if (c.numHostStates == 0)
        {
            EXPECT_GT(tally["steps out of pages"], 0);
        }
        EXPECT_GT(tally["onboarded runs adopted again"], 0);
        for (char const* reached :
            {"events: GPU stored", "events: GPU removed", "events: CPU stored", "events: CPU removed"})
        {
            EXPECT_GT(tally[reached], 0) << reached;
        }
        if (!c.numDiskPages.empty())
        {
            for (char const* reached :
                {"spilled pages", "restored pages", "disk failures", "events: DISK stored", "events: DISK removed"})
            {
                EXPECT_GT(tally[reached], 0) << reached;
            }
        }
        EXPECT_GT(tally["onboards"], 0);
        if (c.numHostStates > 0)
        {
            for (char const* reached : {"offloaded states", "dropped states", "released states", "onboarded states"})
            {
                EXPECT_GT(tally[reached], 0) << reached;
            }
            if (!c.numDiskPages.empty())
            {
                EXPECT_GT(tally["spilled states"], 0);
                EXPECT_GT(tally["restored states"], 0);
            }
        }
    }
}

} // namespace
} // namespace kvcache::rt::detail
