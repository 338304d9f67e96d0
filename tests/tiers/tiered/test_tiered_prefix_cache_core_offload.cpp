// The tiered prefix cache's offloads (host only): evicted pages reach the host before the step's copies can overwrite
// them, a full host tier gives up its least recently used host pages, direct evictions are offloaded by the next call,
// and a failed offload leaves no host page claiming its pages.
// The model of device, host and disk pages the checks run over is tests/support/tiered_cache_model.h.

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "support/tiered_cache_model.h"

namespace kvcache::rt::detail
{
namespace
{

using namespace tiered_model;

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

} // namespace
} // namespace kvcache::rt::detail
