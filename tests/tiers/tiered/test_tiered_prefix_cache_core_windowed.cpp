// The tiered prefix cache with windowed groups (host only): a windowed group onboards only the window at a run's end
// and its tier need hold only that window, pages the device still has are held rather than onboarded, and a run ends
// at the first full-attention page found nowhere.
// The model of device, host and disk pages the checks run over is tests/support/tiered_cache_model.h.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "support/tiered_cache_model.h"

namespace kvcache::rt::detail
{
namespace
{

using namespace tiered_model;

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

} // namespace
} // namespace kvcache::rt::detail
