// Host tests of group-coordinated prefix caching in hybrid caches (kvcache/paging/page_manager.h, "Hybrid caches"): a
// prompt repeated after churn is adopted as on the full-attention twin; windowed pages no cut needs, and the windows of
// a cut whose full-attention page went, are evicted before a live cut's window; a windowed group short of pages drops
// the cut the clock chooses, so an adopted cut outlives a flood of cuts never adopted, and once an adopted cut was
// dropped and made again, cuts never adopted go first; caches that are not hybrid make no cuts; misuse is refused as
// before. The small cases run beside the independent model (tests/support/page_manager_model.h), which checks every
// page id and eviction.

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/page_manager_inputs.h"
#include "support/page_manager_model.h"
#include "support/page_manager_pair.h"

namespace kvcache::rt
{
namespace
{

using test::ConfigBuilder;
using test::expectRejected;
using test::tokensFrom;
using Pair = test::PageManagerPair;
using test::evictedPages;

constexpr int32_t kU = kUNUSED_PAGE_ENTRY;
constexpr int32_t P = 4; //!< tokens a page in the small configs

PageManagerOptions optionsWith(int32_t maxSequences, bool prefixCaching = true)
{
    return test::seededOptions(maxSequences, 11, prefixCaching);
}

//! Full attention (group 0, 16 pages) and a window of 6 tokens (group 1) with 4 tokens a step: a sequence holds at
//! most min(8, ceil((6 - 1 + 4) / 4) + 1) = 4 windowed pages; a cut of k >= 2 pages needs windowed entries
//! floor((4k - 5) / 4) .. k - 1, the last 2 pages. Group 1 has `windowedPages` pages.
KVCacheConfig smallHybrid(int32_t windowedPages)
{
    return ConfigBuilder({{1, 8}, {1, 8, 6}})
        .maxBatchSize(2)
        .maxSequenceLength(32)
        .tokensPerPage(P)
        .maxTokensPerStep(4)
        .numPagesPerGroup({16, windowedPages});
}

//! Appends `tokens` to `id` 4 at a time (the config's maxTokensPerStep), as a chunked prefill does. Returns the page
//! each entry of group 1 (the windowed group of smallHybrid; group 0 in a one-group cache) held when taken: a window
//! releases them later.
std::vector<int32_t> appendInChunks(Pair& pair, SequenceId id, std::vector<int32_t> const& tokens)
{
    std::vector<int32_t> taken;
    for (size_t at = 0; at < tokens.size(); at += 4)
    {
        pair.append(id,
            std::vector<int32_t>(tokens.begin() + static_cast<std::ptrdiff_t>(at),
                tokens.begin() + static_cast<std::ptrdiff_t>(std::min(at + 4, tokens.size()))));
        SequencePages const pages = pair.manager.pages(id, std::min(1, pair.manager.numGroups() - 1));
        for (int32_t e = static_cast<int32_t>(taken.size()); e < pages.numPages; ++e)
        {
            taken.push_back(pages.pages[e]);
        }
    }
    return taken;
}

// The scenario: a prompt of 100 and one of 194 tokens are served, then twelve unrelated requests churn the
// cache, then both prompts come again. The twin keeps every full-attention page (its pool holds all of them); the
// hybrid model has the same full-attention pool and a windowed pool of 160 pages, too small for the churn's 300-odd
// windowed pages, so per-group LRU loses the prompts' windows and adopts nothing. Their cuts keep them.
TEST(HybridCache, RepeatsAfterChurnAdoptWhatTheFullAttentionTwinAdopts)
{
    constexpr int32_t kP = 16;
    auto hybridConfig = []
    {
        return ConfigBuilder({{1, 8}, {1, 8, 128}})
            .maxBatchSize(1)
            .maxSequenceLength(512)
            .tokensPerPage(kP)
            .maxTokensPerStep(64)
            .numPagesPerGroup({512, 160});
    };
    KVCacheConfig const twinConfig =
        ConfigBuilder({{1, 8}, {1, 8}}).maxBatchSize(1).maxSequenceLength(512).tokensPerPage(kP).numPages(512);
    PageManager hybrid(hybridConfig(), optionsWith(2));
    PageManager twin(twinConfig, optionsWith(2));
    ASSERT_EQ(hybrid.numGroups(), 2);
    ASSERT_EQ(twin.numGroups(), 1);

    // One request: adoptPrefix, the rest of the prompt in chunks of 64, `output` decode steps, free. Returns the hit.
    auto serve = [](PageManager& manager, std::vector<int32_t> const& prompt, int32_t output)
    {
        SequenceId const id = manager.create();
        int32_t const count = static_cast<int32_t>(prompt.size());
        int32_t const hit = manager.adoptPrefix(id, prompt.data(), count);
        for (int32_t at = hit; at < count; at += 64)
        {
            manager.append({id, prompt.data() + at, std::min(64, count - at)});
        }
        for (int32_t i = 0; i < output; ++i)
        {
            int32_t const token = 900'000 + i;
            manager.append({id, &token, 1});
        }
        manager.checkInvariants();
        manager.free(id);
        manager.checkInvariants();
        return hit;
    };
    std::vector<int32_t> const a = tokensFrom(1000, 100);
    std::vector<int32_t> const b = tokensFrom(5000, 194);
    for (PageManager* manager : {&hybrid, &twin})
    {
        EXPECT_EQ(serve(*manager, a, 40), 0);
        EXPECT_EQ(serve(*manager, b, 40), 0);
        for (int32_t churn = 0; churn < 12; ++churn)
        {
            EXPECT_EQ(serve(*manager, tokensFrom(100'000 * (churn + 1), 384), 16), 0);
        }
    }
    EXPECT_GT(hybrid.stats().evictedPages, 0); // the churn did push pages out of the windowed group
    EXPECT_EQ(twin.stats().evictedPages, 0);   // and none out of the twin's
    EXPECT_GT(hybrid.counts(1).anchored, 0);
    // The twin adopts the whole pages before each prompt's last token: 99 / 16 = 6 pages, 193 / 16 = 12 pages.
    int32_t const twinA = serve(twin, a, 1);
    int32_t const twinB = serve(twin, b, 1);
    EXPECT_EQ(twinA, 96);
    EXPECT_EQ(twinB, 192);
    int32_t const hybridA = serve(hybrid, a, 1);
    SequenceId const again = hybrid.create();
    int32_t const hybridB = hybrid.adoptPrefix(again, b.data(), static_cast<int32_t>(b.size()));
    EXPECT_GT(hybridA, 0);
    EXPECT_GT(hybridB, 0);
    EXPECT_LE(std::abs(hybridA - twinA), kP);
    EXPECT_LE(std::abs(hybridB - twinB), kP);
    // The adopted windowed entries start at the window before token 192: (192 - 127) / 16 = page 4.
    SequencePages const windowed = hybrid.pages(again, 1);
    ASSERT_EQ(windowed.numPages, hybridB / kP);
    for (int32_t e = 0; e < windowed.numPages; ++e)
    {
        EXPECT_EQ(windowed.pages[e] == kU, e < 4) << "entry " << e;
    }
    hybrid.checkInvariants();
}

// Windowed pages deep inside a prefix (released as the window passed, needed by no cut) go before a cut's window,
// even when they were released later: with per-group LRU the window would go first.
TEST(HybridCache, WindowedPagesNoCutNeedsAreEvictedBeforeACutsWindow)
{
    Pair pair(smallHybrid(8), optionsWith(4));
    std::vector<int32_t> const prompt = tokensFrom(0, 21);
    SequenceId const a = pair.create();
    EXPECT_EQ(pair.adopt(a, prompt), 0); // nothing cached; a cut waits at (21 - 1) / 4 = 5 pages
    std::vector<int32_t> const aWindowed = appendInChunks(pair, a, prompt);
    ASSERT_EQ(aWindowed.size(), 6u);
    pair.free(a); // the cut of 5 pages anchors windowed entries 3 and 4; entries 0..2 are cached without anchor
    EXPECT_EQ(pair.manager.counts(1).cached, 5);
    EXPECT_EQ(pair.manager.counts(1).anchored, 2);

    // d, never freed, takes 7 windowed pages over its life (at most 4 at once): the 3 free ones, then a's entries 0..2,
    // then its own entry 0, which its window released after a's window was cached: per-group LRU would have taken
    // a's entry 4 instead.
    SequenceId const d = pair.create();
    std::vector<int32_t> const dTokens = tokensFrom(500, 28);
    int32_t const dFirst = appendInChunks(pair, d, dTokens).at(0);
    EXPECT_EQ(evictedPages(pair, 1), (std::vector<int32_t>{aWindowed[0], aWindowed[1], aWindowed[2], dFirst}));

    // The prompt is still adoptable: 20 tokens, windowed entries 3 and 4 being a's.
    SequenceId const b = pair.create();
    EXPECT_EQ(pair.adopt(b, prompt), 20);
    EXPECT_EQ(pair.pages(b, 1), (std::vector<int32_t>{kU, kU, kU, aWindowed[3], aWindowed[4]}));
}

// Evicting the full-attention page a cut hangs on drops the cut; its windowed pages then go before older windowed
// pages that are cached without anchor, the window's last page first.
TEST(HybridCache, AWindowWhoseFullAttentionPageWentIsEvictedFirst)
{
    Pair pair(smallHybrid(8), optionsWith(4));
    // c, alive, leaves deep windowed pages cached without anchor.
    SequenceId const c = pair.create();
    appendInChunks(pair, c, tokensFrom(700, 16));
    EXPECT_EQ(pair.manager.counts(1).cached, 1);
    EXPECT_EQ(pair.manager.counts(1).anchored, 0);
    std::vector<int32_t> const prompt = tokensFrom(0, 13);
    SequenceId const a = pair.create();
    EXPECT_EQ(pair.adopt(a, prompt), 0);
    std::vector<int32_t> const aWindowed = appendInChunks(pair, a, prompt);
    std::vector<int32_t> const aFull = pair.pages(a, 0);
    // One cut of 3 pages (the prompt's whole pages before its last token, made again by free()): on full page
    // aFull[2], anchoring windowed entries 1 and 2 (the window before token 12); entry 0 is cached without anchor.
    pair.free(a);
    EXPECT_EQ(pair.manager.counts(1).anchored, 2);
    // The full-attention group evicts its least recently released page: a's last, the cut's.
    EXPECT_EQ(pair.evict(0, 1), 1);
    ASSERT_EQ(evictedPages(pair, 0), (std::vector<int32_t>{aFull[2]}));
    EXPECT_EQ(pair.manager.counts(1).anchored, 0);
    // The windowed group now evicts a's window, last page first, before c's older page and a's entry 0.
    EXPECT_EQ(pair.evict(1, 2), 2);
    EXPECT_EQ(evictedPages(pair, 1), (std::vector<int32_t>{aWindowed[2], aWindowed[1]}));
}

// A windowed group whose cached pages are all anchored drops the cut the clock chooses: the cuts joined it in the order
// made, and adopting a prefix counts a hit on its cut, which the hand lowers and passes.
TEST(HybridCache, AWindowedGroupShortOfPagesDropsTheCutTheClockChooses)
{
    Pair pair(smallHybrid(8), optionsWith(4));
    std::vector<int32_t> const first = tokensFrom(0, 9);    // a cut of 2 pages: windowed entries 0 and 1
    std::vector<int32_t> const second = tokensFrom(300, 9); // the same
    std::vector<int32_t> const third = tokensFrom(600, 9);  // the same
    for (std::vector<int32_t> const* prompt : {&first, &second, &third})
    {
        SequenceId const s = pair.create();
        EXPECT_EQ(pair.adopt(s, *prompt), 0);
        appendInChunks(pair, s, *prompt);
        pair.free(s);
    }
    // Six windowed pages, all anchored by three cuts; two free.
    EXPECT_EQ(pair.manager.counts(1).cached, 6);
    EXPECT_EQ(pair.manager.counts(1).anchored, 6);
    EXPECT_EQ(pair.manager.counts(1).free, 2);
    // Adopting the first prompt counts a hit on its cut.
    SequenceId const reader = pair.create();
    EXPECT_EQ(pair.adopt(reader, first), 8);
    pair.free(reader);
    // A sequence of 16 tokens takes 4 windowed pages: 2 free, then the hand lowers the first prompt's count to 0 and
    // drops the second prompt's cut, whose window is evicted, last page first.
    SequenceId const d = pair.create();
    appendInChunks(pair, d, tokensFrom(900, 16));
    EXPECT_EQ(evictedPages(pair, 1).size(), 2u);
    SequenceId const probe = pair.create();
    EXPECT_EQ(pair.adopt(probe, second), 0);
    pair.free(probe);
    for (std::vector<int32_t> const* kept : {&first, &third})
    {
        SequenceId const s = pair.create();
        EXPECT_EQ(pair.adopt(s, *kept), 8);
        pair.free(s);
    }
}

//! smallHybrid's groups with a full-attention pool large enough never to evict a page in the tests below, and 8
//! windowed pages: a prompt of 9 tokens makes a cut of 2 pages anchoring 2 windowed pages, so 4 cuts fill the group.
KVCacheConfig floodHybrid()
{
    return ConfigBuilder({{1, 8}, {1, 8, 6}})
        .maxBatchSize(2)
        .maxSequenceLength(32)
        .tokensPerPage(P)
        .maxTokensPerStep(4)
        .numPagesPerGroup({64, 8});
}

//! One request of 9 tokens: adoptPrefix, the rest in chunks of 4, free. Returns what adoptPrefix found.
int32_t serveNine(Pair& pair, std::vector<int32_t> const& prompt)
{
    SequenceId const s = pair.create();
    int32_t const hit = pair.adopt(s, prompt);
    appendInChunks(pair, s, std::vector<int32_t>(prompt.begin() + hit, prompt.end()));
    pair.free(s);
    return hit;
}

//! Returns whether `prompt`'s 8 tokens are adoptable: a probe sequence offered the prompt and freed before it appends
//! a token (its adoption counts a hit on the prefix's cut and makes no other).
bool adoptable(Pair& pair, std::vector<int32_t> const& prompt)
{
    SequenceId const probe = pair.create();
    int32_t const hit = pair.adopt(probe, prompt);
    pair.free(probe);
    return hit == 8;
}

// Serves h three times (nothing, then 8 tokens adopted each time), then `count` flood prompts of 9 tokens that share
// nothing; returns the flood prompts.
std::vector<std::vector<int32_t>> serveHotThenFlood(Pair& pair, std::vector<int32_t> const& h, int32_t count)
{
    EXPECT_EQ(serveNine(pair, h), 0);
    EXPECT_EQ(serveNine(pair, h), 8);
    EXPECT_EQ(serveNine(pair, h), 8);
    std::vector<std::vector<int32_t>> flood;
    for (int32_t j = 1; j <= count; ++j)
    {
        flood.push_back(tokensFrom(1000 * j, 9));
        EXPECT_EQ(serveNine(pair, flood.back()), 0) << "flood prompt " << j;
    }
    return flood;
}

// A cut adopted twice outlives a flood of cuts never adopted. Worked out by hand: each prompt of 9 tokens holds 3
// windowed pages at its end and leaves a cut of 2 pages whose 2 windowed pages stay anchored (the third is free again);
// the third flood prompt's last page finds h's, j1's and j2's windows and its own first two pages filling the group,
// where dropping the least recently made cut would drop h's. The clock has h at the hand with a count of 2 and the
// flood's cuts behind it in the order made; from the third prompt on, each drops one cut for its last page: the hand
// lowers h to 1 and drops j1 (at j3), drops j2 (j4) and j3 (j5), lowers h to 0 and drops j4 (j6), drops j5 (j7) and
// j6 (j8). h's cut would go at the ninth.
TEST(HybridCache, ACutAdoptedTwiceOutlivesAFloodOfCutsNeverAdopted)
{
    Pair pair(floodHybrid(), optionsWith(4));
    std::vector<int32_t> const h = tokensFrom(0, 9);
    std::vector<std::vector<int32_t>> const flood = serveHotThenFlood(pair, h, 8);
    EXPECT_EQ(pair.model.cutsDroppedForPages(), 6);
    EXPECT_EQ(pair.manager.counts(1).anchored, 6);
    EXPECT_TRUE(adoptable(pair, h));
    for (int32_t j = 1; j <= 8; ++j)
    {
        EXPECT_EQ(adoptable(pair, flood[static_cast<size_t>(j - 1)]), j >= 7) << "flood prompt " << j;
    }
}

// Once a cut that was adopted is dropped and made again, the clock keeps fewer cuts never adopted than it has (its
// target, which starts at the full-attention pages, falls below their count), so they go first, oldest first, and
// the adopted cut stays however long the flood. Worked out by hand from the test above: the ninth flood prompt drops
// h's cut (count 0 at the hand), its window's last page first, so h's first windowed page is still cached. h served
// again adopts that one page (a prefix of one page needs only it), which makes and hits a cut of 1 page, and makes
// its cut of 2 pages again once its sequence holds 2 pages: the target falls to the 3 cuts never adopted (j7, j8,
// j9) less one. Then each flood prompt, its own cut made, has 3 never adopted for its last page and drops the oldest.
TEST(HybridCache, CutsNeverAdoptedGoFirstOnceAnAdoptedCutWasDroppedTooSoon)
{
    Pair pair(floodHybrid(), optionsWith(4));
    std::vector<int32_t> const h = tokensFrom(0, 9);
    std::vector<std::vector<int32_t>> flood = serveHotThenFlood(pair, h, 9);
    EXPECT_EQ(pair.model.cutsDroppedForPages(), 7);
    EXPECT_EQ(pair.model.cutTarget(), 64);
    EXPECT_EQ(serveNine(pair, h), 4);
    EXPECT_EQ(pair.model.cutTarget(), 2);
    for (int32_t j = 10; j <= 30; ++j)
    {
        flood.push_back(tokensFrom(1000 * j, 9));
        EXPECT_EQ(serveNine(pair, flood.back()), 0);
    }
    EXPECT_TRUE(adoptable(pair, h));
    // The two cuts made last, never adopted, are kept beside h's; the others went, oldest first.
    for (int32_t j = 1; j <= 30; ++j)
    {
        EXPECT_EQ(adoptable(pair, flood[static_cast<size_t>(j - 1)]), j >= 29) << "flood prompt " << j;
    }
}

// A cache of one group, of windowed groups only, or without prefix caching anchors nothing, whatever it serves.
TEST(HybridCache, CachesThatAreNotHybridMakeNoCuts)
{
    KVCacheConfig const windowedOnly = ConfigBuilder({{1, 8, 6}, {1, 8, 10}})
                                           .maxBatchSize(2)
                                           .maxSequenceLength(32)
                                           .tokensPerPage(P)
                                           .maxTokensPerStep(4);
    KVCacheConfig const oneGroup = ConfigBuilder({{1, 8}}).maxBatchSize(2).maxSequenceLength(32).tokensPerPage(P);
    struct Case
    {
        char const* name;
        KVCacheConfig config;
        bool prefixCaching;
    };
    for (Case const& c : {Case{"windowed only", windowedOnly, true}, Case{"one group", oneGroup, true},
             Case{"hybrid without prefix caching", smallHybrid(8), false}})
    {
        SCOPED_TRACE(c.name);
        Pair pair(c.config, optionsWith(4, c.prefixCaching));
        std::vector<int32_t> const prompt = tokensFrom(0, 21);
        SequenceId const a = pair.create();
        EXPECT_EQ(pair.adopt(a, prompt), 0);
        appendInChunks(pair, a, prompt);
        pair.free(a);
        for (int32_t g = 0; g < pair.manager.numGroups(); ++g)
        {
            EXPECT_EQ(pair.manager.counts(g).anchored, 0) << "group " << g;
        }
        EXPECT_TRUE(pair.model.cuts().empty());
    }
}

// Bad input is refused as in any cache, naming field, value and limit, and changes nothing, cuts included; a step
// short of pages counts anchored pages as available (they are, once their cuts go) and names them among the cached.
TEST(HybridCache, MisuseIsRefusedNamingItAndChangesNothing)
{
    Pair pair(smallHybrid(8), optionsWith(3));
    std::vector<int32_t> const prompt = tokensFrom(0, 13);
    SequenceId const a = pair.create();
    EXPECT_EQ(pair.adopt(a, prompt), 0);
    appendInChunks(pair, a, prompt);
    pair.free(a);
    ASSERT_GT(pair.manager.counts(1).anchored, 0);
    SequenceId const b = pair.create();
    std::vector<int32_t> const t = tokensFrom(40, 8);
    PageManager& m = pair.manager;
    expectRejected<OutOfRangeError>(pair, [&] { (void)m.evictCached(2, 1); }, {"group 2", "[0, 2)"});
    expectRejected<InvalidArgumentError>(pair, [&] { (void)m.evictCached(1, -1); }, {"count", "-1", ">= 0"});
    expectRejected<OutOfRangeError>(pair, [&] { (void)m.counts(-1); }, {"group -1"});
    std::vector<int32_t> const long33(33, 1);
    expectRejected<InvalidArgumentError>(
        pair, [&] { (void)m.adoptPrefix(b, long33.data(), 33); }, {"count", "33", "[0, 32]"});
    expectRejected<InvalidArgumentError>(pair, [&] { m.append({b, t.data(), 5}); }, {"count", "5", "[0, 4]"});
    pair.append(b, tokensFrom(40, 1));
    expectRejected<InvalidArgumentError>(pair, [&] { (void)m.adoptPrefix(b, t.data(), 8); }, {"1 tokens", "empty"});
    pair.free(b);
    // b, c and d hold 2 windowed pages each: the 5 free ones and a's unanchored entry 0; a's window (2 pages) is all
    // that is cached. A step of 3 new pages is refused naming the group, the need and the 2 cached pages available.
    std::vector<SequenceId> holders;
    for (int32_t i = 0; i < 3; ++i)
    {
        holders.push_back(pair.create());
        appendInChunks(pair, holders.back(), tokensFrom(100 + 10 * i, 8));
    }
    ASSERT_EQ(m.counts(1).free, 0);
    ASSERT_EQ(m.counts(1).cached, 2);
    ASSERT_EQ(m.counts(1).anchored, 2);
    std::vector<SequenceAppend> const three = {
        {holders[0], t.data(), 4}, {holders[1], t.data(), 4}, {holders[2], t.data(), 4}};
    EXPECT_FALSE(m.canStep(three.data(), 3));
    expectRejected<OutOfMemoryError>(
        pair, [&] { m.step(three.data(), 3); }, {"group 1", "needs 3 pages", "2 available", "2 cached"});
    // Two new pages fit: a's cut is dropped and its window taken, last page first.
    std::vector<SequenceAppend> const two(three.begin(), three.begin() + 2);
    EXPECT_TRUE(m.canStep(two.data(), 2));
    pair.step(two);
    EXPECT_EQ(evictedPages(pair, 1).size(), 3u);
    EXPECT_EQ(m.counts(1).anchored, 0);
    pair.expectMatch();
}

} // namespace
} // namespace kvcache::rt
