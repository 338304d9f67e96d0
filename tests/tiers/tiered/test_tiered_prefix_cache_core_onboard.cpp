// The tiered prefix cache's onboarding (host only): runs onboarded in one call a group whatever maxTokensPerStep is,
// the last prompt token left to compute, an admission's own evictions sparing its run, a run cut where the device runs
// out of pages or adopted in whole pages, and extra keys in the host lookup.
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

} // namespace
} // namespace kvcache::rt::detail
