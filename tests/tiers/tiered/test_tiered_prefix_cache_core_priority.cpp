// The tiered prefix cache's minimum offload priority (host only): device pages evicted with a retention priority under
// it (PageManager::setRetention) are not copied to the host, and a page evicted again under it before the offload ran
// loses its older record. The model of device, host and disk pages the checks run over is
// tests/support/tiered_cache_model.h.

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "support/tiered_cache_model.h"

namespace kvcache::rt::detail
{
namespace
{

using namespace tiered_model;

TEST(TieredPrefixCacheCoreTest, PagesEvictedUnderTheMinimumPriorityAreNotOffloaded)
{
    Simulation sim(oneGroup(16, 32), {8}, 4);
    sim.core.setMinOffloadPriority(50);
    Script const first{tokenRun(1, 2 * kP + 1), {}};
    Script const second{tokenRun(900, 2 * kP + 1), {}};
    SequenceId const a = sim.serve(first).first;
    sim.manager.setRetention(a, 0, kP, 80); // page 0 at 80, page 1 at the default 35
    sim.release(a);
    SequenceId const b = sim.serve(second).first;
    sim.manager.setRetention(b, 0, 2 * kP, 60);
    sim.release(b);
    // Evicted lowest priority first: first's page 1 (35, not offloaded), second's pages 1 and 0 (60), first's page 0
    // (80).
    EXPECT_EQ(sim.core.evictCached(sim.mover, 0, 16), 4);
    EXPECT_EQ(sim.core.stats().offloadedPages, 3);
    std::vector<int32_t> const firstHeld = sim.hostPagesOf(0, first.tokens, 2);
    EXPECT_GE(firstHeld[0], 0);
    EXPECT_EQ(firstHeld[1], -1);
    std::vector<int32_t> const secondHeld = sim.hostPagesOf(0, second.tokens, 2);
    EXPECT_GE(secondHeld[0], 0);
    EXPECT_GE(secondHeld[1], 0);
    EXPECT_EQ(sim.check(), "");
    sim.mover.poisonDevice();
    EXPECT_EQ(sim.admit(first).second.hostTokens, kP);
    EXPECT_EQ(sim.check(), "");
}

TEST(TieredPrefixCacheCoreTest, APageEvictedAgainUnderTheMinimumPriorityLosesItsOlderRecord)
{
    for (int32_t const minimum : {0, 50})
    {
        Simulation sim(oneGroup(4, 16, 16), {8}, 4);
        sim.core.setMinOffloadPriority(minimum);
        SequenceId const kept = sim.serve({tokenRun(1, kP + 1), {}}).first;
        sim.manager.setRetention(kept, 0, kP, 90);
        sim.release(kept); // its page 0 cached at 90, its partial page free
        EXPECT_EQ(sim.manager.evictCached(0, 4), 1);
        EXPECT_EQ(sim.core.numPendingEvictions(), 1);
        // Past the tiered cache: the page freed last is taken, filled, registered and evicted again at the default.
        SequenceId const direct = sim.manager.create();
        std::vector<int32_t> const tokens = tokenRun(500, kP);
        sim.manager.append({direct, tokens.data(), kP});
        sim.manager.free(direct);
        EXPECT_EQ(sim.manager.evictCached(0, 4), 1);
        // At 0 the record now names the new bytes; at 50 they are not offloaded and the old ones are gone.
        EXPECT_EQ(sim.core.numPendingEvictions(), minimum == 0 ? 1 : 0) << "minimum " << minimum;
        sim.core.evictCached(sim.mover, 0, 0);
        EXPECT_EQ(sim.core.stats().offloadedPages, minimum == 0 ? 1 : 0) << "minimum " << minimum;
        EXPECT_EQ(sim.hostPagesOf(0, tokenRun(1, kP), 1)[0], -1);
        EXPECT_EQ(sim.check(), "") << "minimum " << minimum;
    }
}

} // namespace
} // namespace kvcache::rt::detail
