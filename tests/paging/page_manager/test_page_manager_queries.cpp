// Host tests of what a runtime asks a PageManager before and around a step: pagesNeeded() and canStep() against
// what step() then does (random steps over a full-attention and a windowed group on pools small enough to run out),
// the layout constructor, and an eviction callback that throws (the manager stays consistent and counts right).

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/paging/page_manager.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/page_manager_snapshot.h"

namespace kvcache::rt
{
namespace
{

constexpr int32_t P = 4; //!< tokens a page

//! Returns a config of `layers`, 2 slots of `maxSequenceLength` tokens in pages of P, numPages at the minimum.
KVCacheConfig configOf(std::vector<KVLayerConfig> layers, int32_t maxSequenceLength, int32_t maxTokensPerStep)
{
    return test::ConfigBuilder(std::move(layers))
        .maxBatchSize(2)
        .maxSequenceLength(maxSequenceLength)
        .tokensPerPage(P)
        .maxTokensPerStep(maxTokensPerStep);
}

PageManagerOptions seededOptions(int32_t maxSequences)
{
    PageManagerOptions options;
    options.maxSequences = maxSequences;
    std::array<uint8_t, 32> seed{};
    std::iota(seed.begin(), seed.end(), uint8_t{3});
    options.hashSeed = seed;
    return options;
}

//! Free plus cached pages of every group: what a step draws from.
std::vector<int64_t> availableOf(PageManager const& manager)
{
    std::vector<int64_t> available;
    for (int32_t g = 0; g < manager.numGroups(); ++g)
    {
        available.push_back(int64_t{manager.counts(g).free} + manager.counts(g).cached);
    }
    return available;
}

TEST(PageManagerQueries, PagesNeededAndCanStepAgreeWithStepAndChangeNothing)
{
    // Group 0 full attention (16 pages), group 1 a window of 6 (8 pages): 6 sequences over pools sized for 2.
    KVCacheConfig const config = configOf({{1, 8}, {1, 8, 6}}, 32, 4);
    PageManager manager(computeLayout(config), seededOptions(6));
    std::mt19937 random(5);
    std::map<SequenceId, int32_t> live;
    int32_t refused = 0;
    int32_t taken = 0;
    test::CopyLog const noCopies;
    for (int32_t op = 0; op < 20000; ++op)
    {
        uint32_t const roll = static_cast<uint32_t>(random() % 10);
        if ((roll == 0 || live.empty()) && manager.numSequences() < manager.maxSequences())
        {
            SequenceId const id = manager.create();
            // Prompts from a few shared prefixes, so that adopted pages are shared and cached pages evicted.
            std::vector<int32_t> prompt(static_cast<size_t>(random() % 20));
            for (size_t i = 0; i < prompt.size(); ++i)
            {
                prompt[i] = static_cast<int32_t>(i) + 100 * static_cast<int32_t>(random() % 3);
            }
            live[id] = manager.adoptPrefix(id, prompt.data(), static_cast<int32_t>(prompt.size()));
            continue;
        }
        if (roll == 1 && !live.empty())
        {
            auto const victim = std::next(live.begin(), static_cast<long>(random() % live.size()));
            manager.free(victim->first);
            live.erase(victim);
            continue;
        }
        if (roll == 2 && !live.empty() && manager.numSequences() < manager.maxSequences())
        {
            SequenceId const parent = std::next(live.begin(), static_cast<long>(random() % live.size()))->first;
            live[manager.fork(parent)] = live[parent];
            continue;
        }
        std::vector<SequenceAppend> appends;
        std::vector<std::vector<int32_t>> tokens;
        tokens.reserve(live.size());
        for (auto const& [id, length] : live)
        {
            int32_t const count = std::min<int32_t>(static_cast<int32_t>(random() % 5), 32 - length);
            if (random() % 3 == 0)
            {
                continue;
            }
            tokens.emplace_back(static_cast<size_t>(count));
            std::iota(tokens.back().begin(), tokens.back().end(), length);
            appends.push_back({id, tokens.back().data(), count});
        }
        int32_t const count = static_cast<int32_t>(appends.size());
        std::vector<SequenceId> ids;
        for (auto const& entry : live)
        {
            ids.push_back(entry.first);
        }
        test::PageManagerSnapshot const before = test::snapshotOf(manager, ids, noCopies);
        std::vector<int64_t> const available = availableOf(manager);
        std::vector<int64_t> needed(static_cast<size_t>(manager.numGroups()), -999);
        manager.pagesNeeded(appends.data(), count, needed.data());
        bool const fits = manager.canStep(appends.data(), count);
        ASSERT_EQ(test::differenceOf(test::snapshotOf(manager, ids, noCopies), before), "") << "operation " << op;
        bool anyShort = false;
        for (size_t g = 0; g < needed.size(); ++g)
        {
            anyShort = anyShort || needed[g] > available[g];
        }
        ASSERT_EQ(fits, !anyShort) << "operation " << op;
        if (!fits)
        {
            ASSERT_THROW((void)manager.step(appends.data(), count), OutOfMemoryError) << "operation " << op;
            ASSERT_EQ(test::differenceOf(test::snapshotOf(manager, ids, noCopies), before), "") << "operation " << op;
            ++refused;
            continue;
        }
        ASSERT_NO_THROW((void)manager.step(appends.data(), count)) << "operation " << op;
        std::vector<int64_t> const after = availableOf(manager);
        for (size_t g = 0; g < needed.size(); ++g)
        {
            ASSERT_EQ(available[g] - after[g], needed[g]) << "operation " << op << ", group " << g;
        }
        for (SequenceAppend const& append : appends)
        {
            live[append.sequence] += append.count;
        }
        ++taken;
        if (op % 500 == 0)
        {
            ASSERT_NO_THROW(manager.checkInvariants());
        }
    }
    // Both outcomes were exercised.
    EXPECT_GT(refused, 100);
    EXPECT_GT(taken, 1000);
}

TEST(PageManagerQueries, InvalidInputStillThrows)
{
    PageManager manager(computeLayout(configOf({{1, 8}}, 32, 0)));
    SequenceId const id = manager.create();
    std::vector<int32_t> const t = {1, 2};
    std::vector<SequenceAppend> const twice = {{id, t.data(), 1}, {id, t.data(), 1}};
    EXPECT_THROW((void)manager.canStep(twice.data(), 2), InvalidArgumentError);
    int64_t out[1] = {-1};
    EXPECT_THROW(manager.pagesNeeded(twice.data(), 2, out), InvalidArgumentError);
    EXPECT_THROW(manager.pagesNeeded(twice.data(), 1, nullptr), InvalidArgumentError);
    std::vector<SequenceAppend> const unknown = {{id + 1, t.data(), 1}};
    EXPECT_THROW((void)manager.canStep(unknown.data(), 1), InvalidArgumentError);
    EXPECT_TRUE(manager.canStep(nullptr, 0));
    manager.pagesNeeded(twice.data(), 1, out);
    EXPECT_EQ(out[0], 1);
}

TEST(PageManagerQueries, TheLayoutConstructorMatchesTheConfigOne)
{
    KVCacheConfig const config = configOf({{1, 8}, {1, 8, 6}}, 30, 4);
    PageManager fromLayout(computeLayout(config), seededOptions(0));
    PageManager fromConfig(config, seededOptions(0));
    EXPECT_EQ(fromLayout.numGroups(), 2);
    EXPECT_EQ(fromLayout.maxSequences(), 2);
    SequenceId const a = fromLayout.create();
    SequenceId const b = fromConfig.create();
    std::vector<int32_t> tokens(30, 4);
    for (int32_t i = 0; i < 30; i += 3)
    {
        (void)fromLayout.append({a, tokens.data(), 3});
        (void)fromConfig.append({b, tokens.data(), 3});
    }
    ASSERT_EQ(a, b);
    test::CopyLog const none;
    EXPECT_EQ(test::differenceOf(test::snapshotOf(fromLayout, {a}, none), test::snapshotOf(fromConfig, {b}, none)), "");
    EXPECT_THROW((void)fromLayout.append({a, tokens.data(), 1}), InvalidArgumentError); // past maxSequenceLength 30
    KVCacheLayout empty;
    EXPECT_THROW(PageManager{empty}, InvalidArgumentError);
    KVCacheLayout noLength = computeLayout(config);
    noLength.maxSequenceLength = 0;
    EXPECT_THROW(PageManager{noLength}, InvalidArgumentError);
}

//! The eviction callback throws; after every call the manager must be whole: invariants, counts, the step done.
TEST(PageManagerEvictionCallback, AThrowingCallbackLeavesTheManagerConsistent)
{
    KVCacheConfig const config = configOf({{1, 8}}, 32, 0);
    PageManager manager(computeLayout(config), seededOptions(4)); // 16 pages
    std::vector<int32_t> evicted;
    manager.setEvictionCallback(
        [&](int32_t group, int32_t page, PageHash)
        {
            EXPECT_EQ(group, 0);
            evicted.push_back(page);
            throw std::runtime_error("callback failed");
        });
    std::vector<int32_t> prompt(32);
    std::iota(prompt.begin(), prompt.end(), 1000);
    SequenceId const donor = manager.create();
    (void)manager.append({donor, prompt.data(), 32}); // pages 0..7, all registered
    manager.free(donor);                              // 8 cached, oldest first: 7, 6, ..., 0
    ASSERT_EQ(manager.counts(0).cached, 8);
    std::vector<int32_t> other(32);
    std::iota(other.begin(), other.end(), 5000);
    SequenceId const filler = manager.create();
    (void)manager.append({filler, other.data(), 32}); // the 8 free pages
    ASSERT_EQ(manager.counts(0).free, 0);

    // One page a step, each evicting one cached page: the callback throws every time.
    SequenceId const writer = manager.create();
    std::vector<int32_t> const four = {1, 2, 3, 4};
    for (int32_t i = 1; i <= 6; ++i)
    {
        EXPECT_THROW((void)manager.append({writer, four.data(), 4}), std::runtime_error) << "step " << i;
        ASSERT_NO_THROW(manager.checkInvariants()) << "step " << i;
        PageGroupCounts const counts = manager.counts(0);
        EXPECT_EQ(counts.used, 8 + i) << "step " << i;
        EXPECT_EQ(counts.cached, 8 - i) << "step " << i;
        EXPECT_EQ(counts.free, 0) << "step " << i;
        EXPECT_EQ(manager.length(writer), 4 * i) << "step " << i;
        EXPECT_EQ(manager.stats().evictedPages, i) << "step " << i;
        ASSERT_EQ(evicted.size(), static_cast<size_t>(i));
        EXPECT_EQ(evicted.back(), 8 - i); // the donor's last page was released first
        EXPECT_EQ(manager.pages(writer, 0).pages[i - 1], evicted.back());
    }
    // The evicted pages' hashes are gone: an adopter finds the donor's first two pages (1 and 0, still cached), not
    // the third (page 2, evicted).
    SequenceId const adopter = manager.create();
    EXPECT_EQ(manager.adoptPrefix(adopter, prompt.data(), 32), 2 * P);
    EXPECT_EQ(manager.pages(adopter, 0).pages[0], 0);
    EXPECT_EQ(manager.pages(adopter, 0).pages[1], 1);
    manager.free(adopter);

    // A copy-on-write step that evicts: the step's copy is still there to run.
    manager.free(filler); // its 8 pages become cached (newest)
    SequenceId const partial = manager.create();
    EXPECT_THROW((void)manager.append({partial, four.data(), 2}), std::runtime_error); // evicts page 1
    EXPECT_EQ(manager.length(partial), 2);
    ASSERT_EQ(manager.counts(0).free, 0);
    SequenceId const child = manager.fork(partial);
    size_t const callsBefore = evicted.size();
    EXPECT_THROW((void)manager.append({child, four.data(), 1}), std::runtime_error);
    ASSERT_NO_THROW(manager.checkInvariants());
    ASSERT_EQ(manager.lastCopies()[0].size(), 1u);
    EXPECT_EQ(manager.lastCopies()[0][0].src, manager.pages(partial, 0).pages[0]);
    EXPECT_EQ(manager.lastCopies()[0][0].dst, manager.pages(child, 0).pages[0]);
    EXPECT_EQ(evicted.size(), callsBefore + 1);

    // evictCached: every page dropped, each one's callback called, the first exception rethrown.
    int32_t const cached = manager.counts(0).cached;
    int32_t const freeBefore = manager.counts(0).free;
    EXPECT_THROW((void)manager.evictCached(0, 3), std::runtime_error);
    EXPECT_EQ(evicted.size(), callsBefore + 4);
    ASSERT_NO_THROW(manager.checkInvariants());
    EXPECT_EQ(manager.counts(0).cached, cached - 3);
    EXPECT_EQ(manager.counts(0).free, freeBefore + 3);
    // The manager keeps working once the callback stops throwing.
    manager.setEvictionCallback({});
    EXPECT_EQ(manager.evictCached(0, 100), cached - 3);
    manager.free(writer);
    manager.free(partial);
    manager.free(child);
    ASSERT_NO_THROW(manager.checkInvariants());
    EXPECT_EQ(manager.counts(0).used, 0);
    EXPECT_EQ(manager.counts(0).free + manager.counts(0).cached, 16);
}

} // namespace
} // namespace kvcache::rt
