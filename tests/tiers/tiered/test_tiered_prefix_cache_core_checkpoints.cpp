// The tiered prefix cache's state checkpoints (host only): a checkpoint leaves the device with its carrier page into a
// host state and comes back with a run ending there, restored into the sequence's slot; no host state free drops it
// and shortens the run a later prompt gets; a host page given up releases its host state, after writing it to disk
// with the page when there is a disk tier, from which both come back; a save handed out by the step that evicts its
// page has no state to move yet; bad sizes are refused.
// The model of device, host and state values the checks run over is tests/support/tiered_cache_model.h.

#include "kvcache/core/errors.h"

#include <gtest/gtest.h>

#include <cstdint>
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
using Pairs = std::vector<std::pair<int32_t, int32_t>>;

//! One full-attention group of `numPages` pages, `sequences` sequences (state slots [0, sequences)), one state layer
//! and 2 checkpoint slots (the next two state slots).
KVCacheConfig hybrid(int32_t numPages, int32_t sequences = 2)
{
    return test::ConfigBuilder({{1, 8}})
        .maxBatchSize(sequences)
        .maxSequenceLength(32)
        .tokensPerPage(kP)
        .maxTokensPerStep(32)
        .numPages(numPages)
        .stateLayers({StateLayerConfig{{StateTensorConfig{"ssm", {2, 4}, DataType::kFLOAT}}}})
        .numCheckpointSlots(2);
}

//! Evicts every cached page of group 0 through the core.
int32_t evictAll(Simulation& sim)
{
    return sim.core.evictCached(sim.mover, 0, sim.manager.counts(0).cached);
}

TEST(TieredPrefixCacheCheckpointsTest, ACheckpointGoesToTheHostWithItsPageAndComesBackWithTheRun)
{
    Simulation sim(hybrid(16), {16}, 2, {}, 4);
    Script const prompt{tokenRun(1, 5 * kP + 1), {}};
    std::vector<uint64_t> const values = Simulation::valuesOf(prompt);
    std::vector<PageHash> const hashes = sim.hashesOf(prompt.tokens, 5);
    // Served: the prompt's 5 whole pages end at a checkpoint, saved into checkpoint slot 0 (state slot 2).
    sim.release(sim.serve(prompt).first);
    ASSERT_EQ(sim.manager.numCheckpoints(), 1);
    EXPECT_EQ(sim.manager.checkpointSlot(hashes[4]), 2);
    EXPECT_EQ(sim.mover.states[2], values[5 * kP - 1]);
    EXPECT_EQ(sim.check(), "");

    // Evicted: the 5 pages go to host pages, then the checkpoint's slot to host state 0, in that order.
    sim.mover.calls.clear();
    EXPECT_EQ(evictAll(sim), 5);
    ASSERT_EQ(sim.mover.calls.size(), 2u);
    EXPECT_EQ(sim.mover.calls[0].kind, MoverCall::kOFFLOAD);
    EXPECT_EQ(sim.mover.calls[0].pairs.size(), 5u);
    EXPECT_EQ(sim.mover.calls[1].kind, MoverCall::kOFFLOAD_STATES);
    EXPECT_EQ(sim.mover.calls[1].pairs, (Pairs{{2, 0}}));
    EXPECT_EQ(sim.manager.numCheckpoints(), 0);
    ASSERT_NE(sim.core.stateMap(), nullptr);
    EXPECT_EQ(sim.core.stateMap()->find(hashes[4]), 0);
    EXPECT_EQ(sim.core.stateMap()->size(), 1);
    EXPECT_EQ(sim.mover.hostStates[0], values[5 * kP - 1]);
    EXPECT_EQ(sim.core.stats().offloadedStates, 1);
    EXPECT_EQ(sim.check(), "");

    // Device pages and every state slot poisoned: whatever the second request reads must come from the host.
    sim.mover.poisonDevice();
    std::fill(sim.mover.states.begin(), sim.mover.states.end(), kPOISON);
    sim.mover.calls.clear();
    auto const [second, admission] = sim.admit(prompt);
    EXPECT_EQ(admission.deviceTokens, 0);
    EXPECT_EQ(admission.hostTokens, 5 * kP);
    EXPECT_EQ(admission.computeTokens, 1);
    // The pages, then the host state into the first empty checkpoint slot (state slot 2).
    ASSERT_EQ(sim.mover.calls.size(), 2u);
    EXPECT_EQ(sim.mover.calls[0].kind, MoverCall::kONBOARD);
    EXPECT_EQ(sim.mover.calls[0].pairs.size(), 5u);
    EXPECT_EQ(sim.mover.calls[1].kind, MoverCall::kONBOARD_STATES);
    EXPECT_EQ(sim.mover.calls[1].pairs, (Pairs{{2, 0}}));
    EXPECT_EQ(sim.mover.states[2], values[5 * kP - 1]);
    // The checkpoint is the device's again, and its restore into the sequence's slot is queued.
    EXPECT_EQ(sim.manager.checkpointSlot(hashes[4]), 2);
    int32_t const slot = sim.manager.stateSlot(second);
    ASSERT_TRUE(slot == 0 || slot == 1);
    std::vector<StateSlotCopy> const queued = sim.manager.pendingStateCopies();
    ASSERT_EQ(queued.size(), 1u);
    EXPECT_EQ(queued[0].src, 2);
    EXPECT_EQ(queued[0].dst, slot);
    sim.manager.checkInvariants();
    // The step runs the restore, and the modelled kernel checks the slot holds the state after token 20.
    ASSERT_TRUE(sim.prefill(second));
    EXPECT_EQ(sim.mover.states[static_cast<size_t>(slot)], values[5 * kP]);
    EXPECT_EQ(sim.check(), "");
    TieredPrefixCacheStats const stats = sim.core.stats();
    EXPECT_EQ(stats.onboardedStates, 1);
    EXPECT_EQ(stats.hostHitTokens, 5 * kP);
    EXPECT_EQ(stats.droppedStates, 0);
    // The host keeps its copy (it goes with the host page).
    EXPECT_EQ(sim.core.stateMap()->find(hashes[4]), 0);

    // A third request finds the checkpoint on the device now.
    sim.release(second);
    auto const third = sim.admit(prompt);
    EXPECT_EQ(third.second.deviceTokens, 5 * kP);
    EXPECT_EQ(third.second.hostTokens, 0);
    ASSERT_TRUE(sim.prefill(third.first));
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCheckpointsTest, WithoutACheckpointAtItsEndTheRunIsNotAdopted)
{
    // No host states: the checkpoint goes with its page, and the host's pages serve nothing.
    Simulation sim(hybrid(16), {16}, 2);
    Script const prompt{tokenRun(1, 3 * kP + 1), {}};
    sim.serveThenEvict(prompt);
    EXPECT_EQ(sim.core.hostMap(0).size(), 3);
    EXPECT_EQ(sim.mover.count(MoverCall::kOFFLOAD_STATES), 0);
    EXPECT_EQ(sim.core.stateMap(), nullptr);
    auto const [sequence, admission] = sim.admit(prompt);
    EXPECT_EQ(admission.hostTokens, 0);
    EXPECT_EQ(admission.computeTokens, 3 * kP + 1);
    EXPECT_EQ(sim.manager.length(sequence), 0);
    EXPECT_EQ(sim.mover.count(MoverCall::kONBOARD), 0);
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCheckpointsTest, NoHostStateFreeDropsTheCheckpointAndShortensTheRun)
{
    Simulation sim(hybrid(16), {16}, 2, {}, 1);
    Script const shortPrompt{tokenRun(1, 2 * kP + 1), {}};
    Script const longPrompt{tokenRun(1, 5 * kP + 1), {}};
    std::vector<uint64_t> const values = Simulation::valuesOf(longPrompt);
    std::vector<PageHash> const hashes = sim.hashesOf(longPrompt.tokens, 5);
    // The short prompt's checkpoint (after 2 pages) takes the one host state.
    sim.serveThenEvict(shortPrompt);
    EXPECT_EQ(sim.core.stateMap()->find(hashes[1]), 0);
    // The long prompt adopts those 2 pages from the host, checkpoint included, and saves its own after 5 pages.
    auto const [first, admission] = sim.admit(longPrompt);
    EXPECT_EQ(admission.hostTokens, 2 * kP);
    ASSERT_TRUE(sim.prefill(first));
    sim.release(first);
    EXPECT_EQ(sim.manager.numCheckpoints(), 2);
    EXPECT_EQ(sim.check(), "");
    // Evicted: pages 0 and 1 are on the host already with their checkpoint; page 4's checkpoint finds no host state.
    sim.core.resetStats();
    sim.mover.calls.clear();
    EXPECT_EQ(evictAll(sim), 5);
    EXPECT_EQ(sim.core.stats().alreadyOnHostPages, 2);
    EXPECT_EQ(sim.core.stats().offloadedPages, 3);
    EXPECT_EQ(sim.core.stats().offloadedStates, 0);
    EXPECT_EQ(sim.core.stats().droppedStates, 1);
    EXPECT_EQ(sim.mover.count(MoverCall::kOFFLOAD_STATES), 0);
    EXPECT_EQ(sim.core.stateMap()->find(hashes[4]), -1);
    EXPECT_EQ(sim.core.hostMap(0).find(hashes[4]) >= 0, true);
    EXPECT_EQ(sim.check(), "");

    // The long prompt again: every page is on the host, but only page 1 ends at a checkpoint: a run of 2 pages.
    sim.mover.poisonDevice();
    std::fill(sim.mover.states.begin(), sim.mover.states.end(), kPOISON);
    sim.mover.calls.clear();
    auto const [second, again] = sim.admit(longPrompt);
    EXPECT_EQ(again.deviceTokens, 0);
    EXPECT_EQ(again.hostTokens, 2 * kP);
    EXPECT_EQ(again.computeTokens, 3 * kP + 1);
    std::vector<MoverCall> const onboards = sim.mover.callsOf(MoverCall::kONBOARD);
    ASSERT_EQ(onboards.size(), 1u);
    EXPECT_EQ(onboards[0].pairs.size(), 2u);
    EXPECT_EQ(sim.mover.callsOf(MoverCall::kONBOARD_STATES).at(0).pairs, (Pairs{{2, 0}}));
    EXPECT_EQ(sim.mover.states[2], values[2 * kP - 1]);
    ASSERT_TRUE(sim.prefill(second));
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCheckpointsTest, AHostPageGivenUpReleasesItsHostState)
{
    Simulation sim(hybrid(16), {3}, 2, {}, 2);
    Script const first{tokenRun(1, 2 * kP + 1), {}};
    Script const other{tokenRun(500, 3 * kP + 1), {}};
    std::vector<PageHash> const firstHashes = sim.hashesOf(first.tokens, 2);
    std::vector<PageHash> const otherHashes = sim.hashesOf(other.tokens, 3);
    sim.serveThenEvict(first);
    EXPECT_EQ(sim.core.hostMap(0).size(), 2);
    EXPECT_EQ(sim.core.stateMap()->find(firstHashes[1]), 0);
    // The other prompt's 3 pages need every host page: the first prompt's two are given up, and its host state with
    // them; the other's checkpoint then takes that host state (released ones are taken first).
    sim.serveThenEvict(other);
    EXPECT_EQ(sim.core.stats().evictedHostPages, 2);
    EXPECT_EQ(sim.core.stats().releasedStates, 1);
    EXPECT_EQ(sim.core.stats().offloadedStates, 2);
    EXPECT_EQ(sim.core.stateMap()->find(firstHashes[1]), -1);
    EXPECT_EQ(sim.core.stateMap()->find(otherHashes[2]), 0);
    EXPECT_EQ(sim.core.stateMap()->size(), 1);
    EXPECT_EQ(sim.check(), "");
    // The other prompt comes back from the host with its checkpoint; the first one is computed whole.
    auto const back = sim.admit(other);
    EXPECT_EQ(back.second.hostTokens, 3 * kP);
    ASSERT_TRUE(sim.prefill(back.first));
    sim.release(back.first);
    auto const gone = sim.admit(first);
    EXPECT_EQ(gone.second.hostTokens, 0);
    EXPECT_EQ(gone.second.deviceTokens, 0);
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCheckpointsTest, ACheckpointGoesToTheDiskWithItsPageAndComesBackWithTheRun)
{
    // 3 host pages, 8 disk pages, 2 host states.
    Simulation sim(hybrid(16), {3}, 2, {8}, 2);
    Script const prompt{tokenRun(1, 3 * kP + 1), {}};
    Script const other{tokenRun(500, 3 * kP + 1), {}};
    std::vector<uint64_t> const values = Simulation::valuesOf(prompt);
    std::vector<PageHash> const hashes = sim.hashesOf(prompt.tokens, 3);
    sim.serveThenEvict(prompt);
    EXPECT_EQ(sim.core.stateMap()->find(hashes[2]), 0);
    // The other prompt's 3 pages take every host page: the first prompt's go to disk pages 0-2, page 2 with its
    // checkpoint's state; the host state is then free for the other prompt's checkpoint.
    sim.serveThenEvict(other);
    TieredPrefixCacheStats stats = sim.core.stats();
    EXPECT_EQ(stats.spilledPages, 3);
    EXPECT_EQ(stats.spilledStates, 1);
    EXPECT_EQ(stats.releasedStates, 1);
    int32_t const diskPage = sim.core.diskMap(0)->find(hashes[2]);
    ASSERT_GE(diskPage, 0);
    EXPECT_EQ(sim.mover.diskStates[0][static_cast<size_t>(diskPage)], values[3 * kP - 1]);
    EXPECT_EQ(sim.mover.diskStates[0][static_cast<size_t>(sim.core.diskMap(0)->find(hashes[1]))], kPOISON)
        << "a page without a checkpoint is written alone";
    EXPECT_EQ(sim.core.stateMap()->find(hashes[2]), -1);
    EXPECT_EQ(sim.check(), "");

    // The first prompt again: its pages come back from the disk, page 2 with the state (into the host state the
    // other prompt's page 2 frees when its host page is given up for it), then onboarded into checkpoint slot 2.
    sim.mover.poisonDevice();
    std::fill(sim.mover.states.begin(), sim.mover.states.end(), kPOISON);
    std::fill(sim.mover.hostStates.begin(), sim.mover.hostStates.end(), kPOISON);
    sim.mover.calls.clear();
    auto const [sequence, admission] = sim.admit(prompt);
    EXPECT_EQ(admission.hostTokens, 3 * kP);
    stats = sim.core.stats();
    EXPECT_EQ(stats.restoredPages, 3);
    EXPECT_EQ(stats.restoredStates, 1);
    EXPECT_EQ(stats.diskHitTokens, 3 * kP);
    int32_t const hostState = sim.core.stateMap()->find(hashes[2]);
    ASSERT_GE(hostState, 0);
    EXPECT_EQ(sim.mover.callsOf(MoverCall::kONBOARD_STATES).at(0).pairs, (Pairs{{2, hostState}}));
    EXPECT_EQ(sim.mover.states[2], values[3 * kP - 1]);
    ASSERT_TRUE(sim.prefill(sequence));
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCheckpointsTest, ASaveTheEvictingStepHandsOutHasNoStateToOffloadYet)
{
    // 3 sequences of 8 pages at most: 24 pages, state slots 0-2, checkpoint slots 3 and 4.
    Simulation sim(hybrid(24, 3), {16}, 3, {}, 2);
    Script const full1{tokenRun(300, 8 * kP), {}};
    Script const full2{tokenRun(600, 8 * kP), {}};
    SequenceId const b = sim.serve(full1).first;
    SequenceId const c = sim.serve(full2).first;
    sim.flushStateCopies();
    // A reaches its checkpoint (3 pages) and is freed before any step hands its save out.
    Script const prompt{tokenRun(1, 3 * kP + 1), {}};
    std::vector<PageHash> const hashes = sim.hashesOf(prompt.tokens, 3);
    SequenceId const a = sim.admit(prompt).first;
    SequenceAppend const append{a, prompt.tokens.data(), 3 * kP, nullptr, 0};
    sim.core.step(sim.mover, &append, 1);
    sim.compute(a, 0, 3 * kP);
    ASSERT_EQ(sim.check(), "");
    ASSERT_TRUE(sim.manager.checkpointState(a));
    sim.release(a);
    sim.release(c);
    EXPECT_EQ(sim.manager.counts(0).free, 5);
    // D's first step hands the save out, then takes 8 pages: the 5 free and A's 3 (cached before C's), carrier
    // included. The save runs after the step, so the checkpoint has no state to offload: it goes, its pages do not.
    Script const other{tokenRun(900, 8 * kP), {}};
    SequenceId const d = sim.admit(other).first;
    sim.mover.calls.clear();
    SequenceAppend const fill{d, other.tokens.data(), 8 * kP, nullptr, 0};
    StepCopies const copies = sim.core.step(sim.mover, &fill, 1);
    ASSERT_EQ(copies.stateCopies().size(), 1u);
    EXPECT_EQ(copies.stateCopies()[0].dst, 3);
    EXPECT_EQ(sim.core.stats().droppedStates, 1);
    EXPECT_EQ(sim.mover.count(MoverCall::kOFFLOAD_STATES), 0);
    EXPECT_EQ(sim.core.stateMap()->size(), 0);
    EXPECT_GE(sim.core.hostMap(0).find(hashes[2]), 0);
    // B's and C's checkpoints (after 7 pages) filled both slots; A's save took slot 3 from one of them, and C's pages,
    // cached after A's, still carry the other.
    EXPECT_EQ(sim.manager.checkpointSlot(hashes[2]), -1);
    EXPECT_EQ(sim.manager.numCheckpoints(), 1);
    sim.mover.copyStates(copies.stateCopies());
    sim.compute(d, 0, 8 * kP);
    EXPECT_EQ(sim.check(), "");
    // Its pages come back from the host without a checkpoint: nothing is adopted.
    sim.release(d);
    EXPECT_EQ(sim.admit(prompt).second.hostTokens, 0);
    sim.release(b);
}

TEST(TieredPrefixCacheCheckpointsTest, HostStatesNeedCheckpointsAndASizeInRange)
{
    PageManager plain(oneGroup(16, 8), managerOptions(2));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { TieredPrefixCacheCore core(plain, {16}, {}, 4); }, {"numHostStates is 4", "state checkpoints"}));
    PageManager stateful(hybrid(16), managerOptions(2));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { TieredPrefixCacheCore core(stateful, {16}, {}, -1); }, {"numHostStates is -1", "[0, 2147483647]"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { TieredPrefixCacheCore core(stateful, {16}, {}, int64_t{1} << 31); }, {"numHostStates is 2147483648"}));
    // A refused construction leaves no callback behind: the manager evicts without one.
    TieredPrefixCacheCore core(stateful, {16}, {}, 1);
    EXPECT_EQ(core.checkpointGroup(), 0);
    EXPECT_EQ(core.stateMap()->numHostPages(), 1);
}

} // namespace
} // namespace kvcache::rt::detail
