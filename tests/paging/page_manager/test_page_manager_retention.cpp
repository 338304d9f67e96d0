// Host tests of retention priorities (PageManager::setRetention): eviction orders worked out by hand from the header's
// rule (lowest priority first, least recently released first within one; anchoring first in a windowed group of a
// hybrid cache), run beside the independent model (tests/support/page_manager_model.h), which checks every page id,
// eviction and priority; and every rejection for its type, its message and a snapshot left as it was.

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/page_manager_inputs.h"
#include "support/page_manager_model.h"
#include "support/page_manager_pair.h"

namespace kvcache::rt
{
namespace
{

using test::ConfigBuilder;
using test::expectRejected;
using test::throwsNaming;
using test::tokensFrom;
using Pair = test::PageManagerPair;
using test::evictedPages;

constexpr int32_t P = 4; //!< tokens a page
constexpr int32_t kDEFAULT = PageManager::kDEFAULT_RETENTION_PRIORITY;

//! One full-attention layer, 4 tokens a page, 32 tokens a sequence, 2 slots: 16 pages.
KVCacheConfig singleGroupConfig()
{
    return ConfigBuilder({{1, 8}}).maxBatchSize(2).maxSequenceLength(32).tokensPerPage(P);
}

//! Full attention (group 0, 16 pages) and a window of 6 tokens (group 1, 16 pages), 4 tokens a step: a cut of 3
//! pages anchors the windowed entries 1 and 2.
KVCacheConfig smallHybrid()
{
    return ConfigBuilder({{1, 8}, {1, 8, 6}})
        .maxBatchSize(2)
        .maxSequenceLength(32)
        .tokensPerPage(P)
        .maxTokensPerStep(4)
        .numPagesPerGroup({16, 16});
}

PageManagerOptions optionsWith(int32_t maxSequences)
{
    return test::seededOptions(maxSequences, 5, true);
}

//! Returns the retention priority of each of `pages` in `group`.
std::vector<int32_t> prioritiesOf(PageManager const& manager, int32_t group, std::vector<int32_t> const& pages)
{
    std::vector<int32_t> out;
    for (int32_t const page : pages)
    {
        out.push_back(manager.retentionPriority(group, page));
    }
    return out;
}

TEST(Retention, LowestPriorityIsEvictedFirstThenLeastRecentlyReleased)
{
    Pair pair(singleGroupConfig(), optionsWith(4));
    SequenceId const a = pair.createWith(tokensFrom(0, 8));   // pages 0, 1
    SequenceId const b = pair.createWith(tokensFrom(100, 8)); // pages 2, 3
    SequenceId const c = pair.createWith(tokensFrom(200, 8)); // pages 4, 5
    EXPECT_EQ(prioritiesOf(pair.manager, 0, {0, 1, 2, 3, 4, 5}), std::vector<int32_t>(6, kDEFAULT));

    pair.retain(a, 0, 8, 80);  // pages 0, 1
    pair.retain(c, 4, 5, 10);  // token 4 only: page 5
    pair.retain(c, 0, 1, 100); // token 0: page 4
    EXPECT_EQ(prioritiesOf(pair.manager, 0, {0, 1, 2, 3, 4, 5}), (std::vector<int32_t>{80, 80, 35, 35, 100, 10}));

    // Released last page first: A gives 1, 0; B 3, 2; C 5, 4. Without priorities the order would be 1 0 3 2 5 4.
    pair.free(a);
    pair.free(b);
    pair.free(c);
    EXPECT_EQ(pair.manager.counts(0).cached, 6);
    EXPECT_EQ(pair.evict(0, 6), 6);
    EXPECT_EQ(evictedPages(pair, 0), (std::vector<int32_t>{5, 3, 2, 1, 0, 4}));
    EXPECT_EQ(prioritiesOf(pair.manager, 0, {0, 1, 2, 3, 4, 5}), std::vector<int32_t>(6, kDEFAULT));
}

TEST(Retention, TakingAPageEvictsTheLowestPriority)
{
    // 4 pages: one slot of 16 tokens.
    Pair pair(
        ConfigBuilder({{1, 8}}).maxBatchSize(1).maxSequenceLength(16).tokensPerPage(P).numPages(4), optionsWith(4));
    SequenceId const a = pair.createWith(tokensFrom(0, 8));   // pages 0, 1
    SequenceId const b = pair.createWith(tokensFrom(100, 8)); // pages 2, 3
    pair.retain(a, 0, 8, 60);
    pair.free(a);                                              // cached at 60: 1, 0
    pair.free(b);                                              // cached at 35: 3, 2
    SequenceId const c = pair.createWith(tokensFrom(300, 12)); // takes 3, 2, then 1 (the oldest at 60)
    EXPECT_EQ(pair.pages(c), (std::vector<int32_t>{3, 2, 1}));
    EXPECT_EQ(evictedPages(pair, 0), (std::vector<int32_t>{3, 2, 1}));
    // Taken pages start at the default.
    EXPECT_EQ(prioritiesOf(pair.manager, 0, {3, 2, 1, 0}), (std::vector<int32_t>{35, 35, 35, 60}));
}

TEST(Retention, APageHasTheHighestPriorityOfItsHoldersAndKeepsItWhenCachedAndAdopted)
{
    Pair pair(singleGroupConfig(), optionsWith(4));
    SequenceId const a = pair.createWith(tokensFrom(0, 10)); // pages 0, 1 full, 2 partial
    SequenceId const child = pair.fork(a);
    pair.retain(a, 0, 4, 90);      // page 0
    pair.retain(child, 0, 8, 20);  // pages 0 (stays 90: 20 is lower) and 1 (20: none was set, below the default)
    pair.retain(child, 8, 10, 70); // the shared partial page 2
    EXPECT_EQ(prioritiesOf(pair.manager, 0, {0, 1, 2}), (std::vector<int32_t>{90, 20, 70}));
    pair.free(a);
    pair.free(child);
    // Page 2 was partial, never registered: free again, at the default. Pages 1 and 0 are cached at 20 and 90.
    EXPECT_EQ(pair.manager.counts(0).cached, 2);
    EXPECT_EQ(prioritiesOf(pair.manager, 0, {0, 1, 2}), (std::vector<int32_t>{90, 20, 35}));

    // Adopting the prefix takes the cached pages with their priorities.
    SequenceId const again = pair.create();
    EXPECT_EQ(pair.adopt(again, tokensFrom(0, 9)), 8);
    EXPECT_EQ(pair.pages(again), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(prioritiesOf(pair.manager, 0, {0, 1}), (std::vector<int32_t>{90, 20}));
    pair.free(again);
    SequenceId const other = pair.createWith(tokensFrom(500, 4)); // page 2 (most recently freed)
    pair.free(other);                                             // cached at 35: between 1 (20) and 0 (90)
    EXPECT_EQ(pair.evict(0, 3), 3);
    EXPECT_EQ(evictedPages(pair, 0), (std::vector<int32_t>{1, 2, 0}));
}

// In a windowed group of a hybrid cache anchoring comes first: pages no cut needs go before a cut's window whatever
// their priorities; a dropped cut's pages go first within their priority, the window's last page first.
TEST(Retention, AHybridCacheEvictsUnanchoredPagesFirstThenByPriority)
{
    Pair pair(smallHybrid(), optionsWith(4));
    auto prompt = [&](SequenceId id, int32_t first)
    {
        std::vector<int32_t> taken;
        for (int32_t at = 0; at < 12; at += 4)
        {
            pair.append(id, tokensFrom(first + at, 4));
            taken.push_back(pair.manager.pages(id, 1).pages[at / 4]);
        }
        return taken;
    };
    SequenceId const a = pair.create();
    std::vector<int32_t> const wa = prompt(a, 0);
    SequenceId const b = pair.create();
    std::vector<int32_t> const wb = prompt(b, 100);
    std::vector<int32_t> const fa = {0, 1, 2};
    std::vector<int32_t> const fb = {3, 4, 5};
    ASSERT_EQ(pair.pages(a, 0), fa);
    ASSERT_EQ(pair.pages(b, 0), fb);
    pair.retain(a, 0, 12, 100);
    pair.free(a); // cut of 3 pages on full page 2; windowed entries 1, 2 anchored, entry 0 cached at 100
    pair.free(b); // cut on full page 5; entry 0 cached at 35
    EXPECT_EQ(pair.manager.counts(1).anchored, 4);

    EXPECT_EQ(pair.evict(1, 6), 6);
    EXPECT_EQ(evictedPages(pair, 1), (std::vector<int32_t>{wb[0], wa[0], wa[2], wa[1], wb[2], wb[1]}));
    // The full-attention group: B's pages (35) before A's (100), each in release order.
    EXPECT_EQ(pair.evict(0, 6), 6);
    EXPECT_EQ(evictedPages(pair, 0), (std::vector<int32_t>{fb[2], fb[1], fb[0], fa[2], fa[1], fa[0]}));
}

TEST(Retention, ADurationEndsAtTheNextEvictionAndTheCachedPageMovesToItsNewPriority)
{
    Pair pair(singleGroupConfig(), optionsWith(4));
    SequenceId const a = pair.createWith(tokensFrom(0, 8));   // pages 0, 1
    SequenceId const b = pair.createWith(tokensFrom(100, 8)); // pages 2, 3
    pair.model.setNow(1000);
    pair.retain(a, 0, 8, 80, 100); // until 1100
    pair.retain(b, 0, 8, 60);
    pair.retain(a, 0, 4, 70, 500); // lower than the 80 in force: dropped
    pair.retain(a, 4, 8, 80, 50);  // equal, ending earlier: 1100 stays
    EXPECT_EQ(prioritiesOf(pair.manager, 0, {0, 1, 2, 3}), (std::vector<int32_t>{80, 80, 60, 60}));
    pair.free(a); // releases 1, then 0
    pair.free(b); // 3, then 2

    // Before the end nothing moves: the lowest priority is B's 60, its oldest page 3.
    pair.model.setNow(1099);
    EXPECT_EQ(pair.evict(0, 1), 1);
    EXPECT_EQ(evictedPages(pair, 0), (std::vector<int32_t>{3}));
    // The duration has ended, but a priority read still shows it until the next eviction or step.
    pair.model.setNow(1100);
    EXPECT_EQ(prioritiesOf(pair.manager, 0, {0, 1, 2}), (std::vector<int32_t>{80, 80, 60}));
    // Now A's pages are at the default again, below B's 60, moved there in the order of their ends (page 0 first,
    // ties by page id): 0, 1, then 2.
    EXPECT_EQ(pair.evict(0, 3), 3);
    EXPECT_EQ(evictedPages(pair, 0), (std::vector<int32_t>{3, 0, 1, 2}));
    EXPECT_EQ(prioritiesOf(pair.manager, 0, {0, 1, 2, 3}), std::vector<int32_t>(4, kDEFAULT));
}

TEST(Retention, BadInputIsRefusedWithNamedErrorsAndChangesNothing)
{
    Pair pair(singleGroupConfig(), optionsWith(4));
    PageManager& m = pair.manager;
    SequenceId const a = pair.createWith(tokensFrom(0, 10));
    pair.retain(a, 0, 4, 50);
    SequenceId const gone = pair.create();
    pair.free(gone);

    expectRejected<InvalidArgumentError>(pair, [&] { m.setRetention(a, 0, 4, 101); }, {"priority", "101", "100"});
    expectRejected<InvalidArgumentError>(pair, [&] { m.setRetention(a, 0, 4, -1); }, {"priority", "-1", "100"});
    expectRejected<InvalidArgumentError>(
        pair, [&] { m.setRetention(a, 0, 4, 90, -2); }, {"durationMs", "-2", "kNO_DURATION"});
    expectRejected<InvalidArgumentError>(pair,
        [&] { m.setRetention(a, 0, 4, 90, PageManager::kMAX_RETENTION_DURATION_MS + 1); },
        {"durationMs", std::to_string(PageManager::kMAX_RETENTION_DURATION_MS + 1)});
    expectRejected<InvalidArgumentError>(
        pair, [&] { m.setRetention(a, 0, 11, 90); }, {"firstToken", "endToken", "11", "10"});
    expectRejected<InvalidArgumentError>(pair, [&] { m.setRetention(a, -1, 4, 90); }, {"firstToken", "-1"});
    expectRejected<InvalidArgumentError>(pair, [&] { m.setRetention(a, 6, 5, 90); }, {"firstToken", "[6, 5)"});
    expectRejected<InvalidArgumentError>(
        pair, [&] { m.setRetention(gone, 0, 0, 90); }, {"setRetention", std::to_string(gone), "unknown"});
    expectRejected<InvalidArgumentError>(
        pair, [&] { m.setRetention(SequenceId{12345}, 0, 0, 90); }, {"setRetention", "12345", "unknown"});
    expectRejected<OutOfRangeError>(pair, [&] { (void)m.retentionPriority(1, 0); }, {"retentionPriority", "group"});
    expectRejected<OutOfRangeError>(pair, [&] { (void)m.retentionPriority(0, 16); }, {"retentionPriority", "16"});
    EXPECT_EQ(m.retentionPriority(0, 0), 50);

    // An empty range and the bounds themselves are accepted.
    pair.retain(a, 10, 10, 100);
    pair.retain(a, 0, 0, 0);
    EXPECT_EQ(prioritiesOf(m, 0, {0, 1, 2}), (std::vector<int32_t>{50, 35, 35}));
    pair.retain(a, 9, 10, PageManager::kMAX_RETENTION_PRIORITY);
    pair.retain(a, 0, 10, 0); // only page 1, where none was set, takes it
    EXPECT_EQ(prioritiesOf(m, 0, {0, 1, 2}), (std::vector<int32_t>{50, 0, 100}));
}

} // namespace
} // namespace kvcache::rt
