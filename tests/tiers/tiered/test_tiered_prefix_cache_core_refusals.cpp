// The tiered prefix cache's refusals (host only): bad calls name their argument and change nothing, and bad sizes and
// layouts are refused before the page manager is touched.
// The model of device, host and disk pages the checks run over is tests/support/tiered_cache_model.h.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/error_matchers.h"
#include "support/tiered_cache_model.h"

namespace kvcache::rt::detail
{
namespace
{

using namespace tiered_model;
using test::throwsNaming;

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

} // namespace
} // namespace kvcache::rt::detail
