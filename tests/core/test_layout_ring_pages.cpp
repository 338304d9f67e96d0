// The pages a sliding-window layer keeps a sequence (no GPU), against the model's formula and a brute-force simulation
// of every step start, and edge cases worked out by hand.
// The layers, configs and model check they share are tests/support/group_layouts.h.

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/group_layouts.h"

namespace kvcache::rt
{
namespace
{

using namespace group_layouts;

//! A full layer and a layer of window `window`: group 1 is the window's.
KVCacheConfig fullAndWindow(int32_t sequence, int32_t pageSize, int32_t window, int32_t step)
{
    return test::ConfigBuilder({kvLayer(2, 4), kvLayer(1, 8, window)})
        .maxSequenceLength(sequence)
        .tokensPerPage(pageSize)
        .maxTokensPerStep(step)
        .build();
}

//! Returns `values` without those outside [lo, hi], sorted and without repeats.
std::vector<int32_t> within(std::vector<int64_t> const& values, int64_t lo, int64_t hi)
{
    std::vector<int32_t> kept;
    for (int64_t const value : values)
    {
        if (value >= lo && value <= hi)
        {
            kept.push_back(static_cast<int32_t>(value));
        }
    }
    std::sort(kept.begin(), kept.end());
    kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
    return kept;
}

TEST(RingPages, SweepMatchesTheModelAndBoundsTheSimulation)
{
    int64_t checked = 0;
    int64_t exact = 0;     // library == simulation
    int64_t slack = 0;     // library == simulation + 1
    int64_t belowFull = 0; // a ring shorter than a full-length slot
    for (int32_t const sequence : {1, 2, 3, 7, 64, 100, 127, 128, 129, 333, 1000, 1024, 2049, 8192})
    {
        for (int32_t shift = 0; shift <= 10; ++shift)
        {
            int32_t const pageSize = int32_t{1} << shift;
            int64_t const fullPages = pagesFor(sequence, pageSize);
            int64_t const s = sequence;
            int64_t const p = pageSize;
            for (int32_t const window : within({1, 2, 3, p - 1, p, p + 1, 2 * p + 5, s / 2, s - 1, s, s + 1, 3 * s}, 1,
                     std::numeric_limits<int32_t>::max()))
            {
                for (int32_t const step : within({0, 1, 2, p - 1, p, s / 3, s - 1, s}, 0, s))
                {
                    std::string const where = "S " + std::to_string(sequence) + ", P " + std::to_string(pageSize)
                        + ", W " + std::to_string(window) + ", C " + std::to_string(step);
                    KVCacheConfig const config = fullAndWindow(sequence, pageSize, window, step);
                    KVCacheLayout const layout = computeLayout(config);
                    test::LayoutModel const model = test::modelLayout(config);
                    ASSERT_EQ(layout.groups.size(), 2U) << where;
                    int64_t const pages = layout.groups[1].pagesPerSequence;
                    ASSERT_EQ(pages, model.groups[1].pagesPerSequence) << where;
                    ASSERT_EQ(layout.groups[0].pagesPerSequence, fullPages) << where;
                    int64_t const stepTokens = step == 0 ? sequence : step;
                    ASSERT_EQ(layout.maxTokensPerStep, stepTokens) << where;
                    int64_t const simulated = test::residentPagesBySimulation(window, stepTokens, sequence, pageSize);
                    ASSERT_LE(simulated, pages) << where;
                    ASSERT_LE(pages, simulated + 1) << where;
                    ASSERT_LE(pages, fullPages) << where;
                    ++checked;
                    exact += pages == simulated ? 1 : 0;
                    slack += pages == simulated + 1 ? 1 : 0;
                    belowFull += pages < fullPages ? 1 : 0;
                }
            }
        }
    }
    // The sweep reaches both ends of the bound and many rings shorter than a full slot.
    EXPECT_GT(checked, 8000);
    EXPECT_GT(exact, 5000);
    EXPECT_GT(slack, 400);
    EXPECT_GT(belowFull, 1500);
}

TEST(RingPages, DefaultStepIsTheWholeSequence)
{
    // maxTokensPerStep 0 resolves to maxSequenceLength: the same pages as a step of S tokens, which is a full slot.
    for (int32_t const window : {1, 100, 5000})
    {
        KVCacheLayout const byDefault = computeLayout(fullAndWindow(1000, 64, window, 0));
        KVCacheLayout const wholePrompt = computeLayout(fullAndWindow(1000, 64, window, 1000));
        EXPECT_EQ(byDefault.maxTokensPerStep, 1000);
        EXPECT_EQ(byDefault.groups[1].pagesPerSequence, wholePrompt.groups[1].pagesPerSequence);
        EXPECT_EQ(byDefault.groups[1].pagesPerSequence, 16) << "window " << window; // ceil(1000 / 64)
    }
}

//! One window-page case worked out by hand: the library's pages and the simulation's.
struct WindowCase
{
    int32_t sequence;
    int32_t pageSize;
    int32_t window;
    int32_t step;
    int64_t pages;
    int64_t simulated;
};

TEST(RingPages, EdgeCasesByHand)
{
    std::vector<WindowCase> const cases{
        // W 1, C 1: min(64, ceil(1 / 128) + 1) = 2; a step touches one token, one page.
        {8192, 128, 1, 1, 2, 1},
        // W 1, C 8192: min(64, ceil(8192 / 128) + 1 = 65) = 64, a full-length cache.
        {8192, 128, 1, 8192, 64, 64},
        // W = S: min(16, ceil(1000 / 64) + 1 = 17) = 16; W > S caps the same way.
        {1000, 64, 1000, 1, 16, 16},
        {1000, 64, 4000, 1, 16, 16},
        // P 1: W - 1 + C = 12 tokens, ceil(12 / 1) + 1 = 13 pages; one-token pages never split a span, so 12 suffice.
        {100, 1, 10, 3, 13, 12},
        // P 1, W 1, C 1: 2 pages for the one token a step touches.
        {100, 1, 1, 1, 2, 1},
        // W 129, C 128: 256 tokens, ceil(256 / 128) + 1 = 3; starting mid-page they do cover 3 pages.
        {8192, 128, 129, 128, 3, 3},
        // W 2, C 128: 129 tokens, ceil(129 / 128) + 1 = 3; 129 tokens never cover more than 2 pages of 128.
        {8192, 128, 2, 128, 3, 2},
        // S shorter than a page: everything fits in the one page a full slot has.
        {5, 1024, 3, 2, 1, 1},
    };
    for (WindowCase const& c : cases)
    {
        SCOPED_TRACE("S " + std::to_string(c.sequence) + ", P " + std::to_string(c.pageSize) + ", W "
            + std::to_string(c.window) + ", C " + std::to_string(c.step));
        KVCacheLayout const layout = computeLayout(fullAndWindow(c.sequence, c.pageSize, c.window, c.step));
        EXPECT_EQ(layout.groups.at(1).pagesPerSequence, c.pages);
        EXPECT_EQ(layout.groups.at(1).slotTokens, c.pages * c.pageSize);
        EXPECT_EQ(test::residentPagesBySimulation(c.window, c.step, c.sequence, c.pageSize), c.simulated);
    }
}

TEST(RingPages, AWindowAsLongAsTheSequenceIsStillItsOwnGroup)
{
    // Window 1000 of S 1000 keeps 16 pages like full attention, but its page ids are a separate space.
    KVCacheLayout const layout = computeLayout(fullAndWindow(1000, 64, 1000, 1));
    ASSERT_EQ(layout.groups.size(), 2U);
    EXPECT_EQ(layout.groups[0].slidingWindow, 0);
    EXPECT_EQ(layout.groups[1].slidingWindow, 1000);
    EXPECT_EQ(layout.groups[1].pagesPerSequence, layout.groups[0].pagesPerSequence);
    EXPECT_EQ(layout.layers[1].group, 1);
}

} // namespace
} // namespace kvcache::rt
