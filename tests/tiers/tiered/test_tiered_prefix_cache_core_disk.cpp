// The tiered prefix cache's disk tier (host only): host pages given up go to the disk and come back for a run, a disk
// page that does not read back ends the run and is dropped, and one that cannot be written is counted.
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
    EXPECT_EQ(stats.diskHitTokens, 4 * kP) << "pages 1 to 4 came from the disk, page 0 from the host";
    // The tenant (no salt) queried A, B and A again (21 + 17 + 21 tokens) and found A's pages the third time.
    std::vector<PrefixTenantStats> const tenants = sim.manager.tenantStats();
    ASSERT_EQ(tenants.size(), 1u);
    EXPECT_EQ(tenants[0].queryTokens, 59);
    EXPECT_EQ(tenants[0].deviceHitTokens, 0);
    EXPECT_EQ(tenants[0].hostHitTokens, kP);
    EXPECT_EQ(tenants[0].diskHitTokens, 4 * kP);
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

} // namespace
} // namespace kvcache::rt::detail
