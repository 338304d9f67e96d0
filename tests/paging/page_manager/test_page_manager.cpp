// Host tests of the page lifecycle (kvcache/paging/page_manager.h): each operation against page ids worked out by hand
// from the header's allocation order and against the independent model (tests/support/page_manager_model.h), every
// rejection for its type, its message and a full snapshot left as it was, copy-on-write, prefix reuse, eviction order,
// windowed groups and the page lists handed to the page table builder.

#include "paging/page_table/page_table_build.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/page_manager_inputs.h"
#include "support/page_manager_model.h"
#include "support/page_manager_pair.h"
#include "support/page_manager_snapshot.h"

namespace kvcache::rt
{
namespace
{

using test::ConfigBuilder;
using test::expectRejected;
using test::ModelOutcome;
using test::PageManagerModel;
using test::throwsNaming;
using test::tokensFrom;

constexpr int32_t kU = kUNUSED_PAGE_ENTRY;
constexpr int32_t P = 4; //!< tokens a page in every config here

std::array<uint8_t, 32> testSeed()
{
    return test::consecutiveSeed(7);
}

//! One full-attention layer, 4 tokens a page, 32 tokens a sequence (8 pages), 2 slots: 16 pages unless given.
KVCacheConfig singleGroupConfig(int32_t numPages = 0)
{
    return ConfigBuilder({{1, 8}}).maxBatchSize(2).maxSequenceLength(32).tokensPerPage(P).numPages(numPages);
}

//! A full-attention layer (group 0) and a layer of window 6 (group 1) with 4 tokens a step: group 1 keeps
//! min(8, ceil((6 - 1 + 4) / 4) + 1) = 4 pages a sequence; 16 and 8 pages unless given.
KVCacheConfig windowedConfig(std::vector<int32_t> numPagesPerGroup = {})
{
    return ConfigBuilder({{1, 8}, {1, 8, 6}})
        .maxBatchSize(2)
        .maxSequenceLength(32)
        .tokensPerPage(P)
        .maxTokensPerStep(4)
        .numPagesPerGroup(std::move(numPagesPerGroup));
}

PageManagerOptions optionsWith(int32_t maxSequences, bool prefixCaching = true)
{
    return test::seededOptions(maxSequences, 7, prefixCaching);
}

using Pair = test::PageManagerPair;

std::vector<int32_t> copyPairs(std::vector<PageCopy> const& copies)
{
    std::vector<int32_t> flat;
    for (PageCopy const& copy : copies)
    {
        flat.insert(flat.end(), {copy.src, copy.dst});
    }
    return flat;
}

TEST(PageManager, AppendFillsPagesInTokenOrderAcrossBoundaries)
{
    Pair pair(singleGroupConfig(), optionsWith(4));
    SequenceId const a = pair.create();
    EXPECT_EQ(pair.manager.length(a), 0);
    EXPECT_TRUE(pair.pages(a).empty());
    pair.append(a, tokensFrom(100, 3));
    EXPECT_EQ(pair.pages(a), (std::vector<int32_t>{0}));
    pair.append(a, tokensFrom(103, 2)); // crosses into the second page
    EXPECT_EQ(pair.pages(a), (std::vector<int32_t>{0, 1}));
    pair.append(a, tokensFrom(105, 4)); // 9 tokens: a third page holding one
    EXPECT_EQ(pair.pages(a), (std::vector<int32_t>{0, 1, 2}));
    SequencePages const pages = pair.manager.pages(a, 0);
    EXPECT_EQ(pages.numTokens, 9);
    EXPECT_EQ(pair.manager.length(a), 9);
    SequenceId const b = pair.create();
    pair.append(b, tokensFrom(0, 8)); // exactly two pages: no partial one
    EXPECT_EQ(pair.pages(b), (std::vector<int32_t>{3, 4}));
    PageGroupCounts const counts = pair.manager.counts(0);
    EXPECT_EQ(counts.numPages, 16);
    EXPECT_EQ(counts.used, 5);
    EXPECT_EQ(counts.free, 11);
    EXPECT_EQ(counts.cached, 0);
    EXPECT_EQ(counts.shared, 0);
    EXPECT_EQ(pair.manager.numSequences(), 2);
}

TEST(PageManager, ForkSharesPagesAndTheFirstWriterCopiesTheSharedPartialPage)
{
    Pair pair(singleGroupConfig(), optionsWith(4));
    SequenceId const a = pair.create();
    pair.append(a, tokensFrom(10, 6)); // pages 0 (full) and 1 (2 tokens)
    SequenceId const b = pair.fork(a);
    EXPECT_NE(a, b);
    EXPECT_EQ(pair.pages(b), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(pair.manager.length(b), 6);
    EXPECT_EQ(pair.manager.counts(0).shared, 2);
    EXPECT_EQ(pair.manager.counts(0).used, 2);

    pair.append(b, {77}); // b writes the shared partial page: b moves to page 2, one copy 1 -> 2
    EXPECT_EQ(pair.pages(b), (std::vector<int32_t>{0, 2}));
    EXPECT_EQ(pair.pages(a), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(copyPairs(pair.copies.group(0)), (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(pair.manager.stats().copyOnWritePages, 1);
    EXPECT_EQ(pair.manager.counts(0).shared, 1);

    pair.append(a, {78}); // a is now page 1's only holder: it writes in place
    EXPECT_EQ(pair.pages(a), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(pair.copies.group(0).size(), 1u);
    EXPECT_EQ(pair.manager.stats().copyOnWritePages, 1);

    pair.append(a, tokensFrom(0, 3)); // fills page 1 and takes page 3; the shared full page 0 is never copied
    EXPECT_EQ(pair.pages(a), (std::vector<int32_t>{0, 1, 3}));
    EXPECT_EQ(pair.copies.group(0).size(), 1u);
    pair.copies.clear();
    pair.model.clearCopies();
    EXPECT_TRUE(pair.copies.group(0).empty());
    pair.expectMatch();
}

TEST(PageManager, ForkAtAPageBoundaryNeedsNoCopy)
{
    Pair pair(singleGroupConfig(), optionsWith(4));
    SequenceId const a = pair.create();
    pair.append(a, tokensFrom(0, 8));
    SequenceId const b = pair.fork(a);
    pair.append(b, {1});
    pair.append(a, {2});
    EXPECT_EQ(pair.pages(b), (std::vector<int32_t>{0, 1, 2}));
    EXPECT_EQ(pair.pages(a), (std::vector<int32_t>{0, 1, 3}));
    EXPECT_TRUE(pair.copies.group(0).empty());
    EXPECT_EQ(pair.manager.stats().copyOnWritePages, 0);
}

TEST(PageManager, StepCountsCopyOnWriteOnlyForHoldersStillSharing)
{
    // Page 1 is shared by a, b and c; exactly 2 pages are left. Appending to all three in one step needs 2 copies
    // (a and b move, c is then the only holder and writes in place), so it must succeed.
    Pair pair(singleGroupConfig(), optionsWith(5));
    SequenceId const a = pair.create();
    pair.append(a, tokensFrom(0, 6)); // pages 0, 1
    SequenceId const b = pair.fork(a);
    SequenceId const c = pair.fork(a);
    SequenceId const filler = pair.create();
    pair.append(filler, tokensFrom(50, 32)); // pages 2..9
    SequenceId const filler2 = pair.create();
    pair.append(filler2, tokensFrom(90, 16)); // pages 10..13: 14, 15 free
    ASSERT_EQ(pair.manager.counts(0).free, 2);
    std::vector<int32_t> const t = {5};
    pair.step({{a, t.data(), 1}, {b, t.data(), 1}, {c, t.data(), 1}});
    EXPECT_EQ(pair.pages(a), (std::vector<int32_t>{0, 14}));
    EXPECT_EQ(pair.pages(b), (std::vector<int32_t>{0, 15}));
    EXPECT_EQ(pair.pages(c), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(copyPairs(pair.copies.group(0)), (std::vector<int32_t>{1, 14, 1, 15}));
    EXPECT_EQ(pair.manager.stats().copyOnWritePages, 2);
}

TEST(PageManager, FreeOfAForkKeepsTheOtherHolderAndFreeOrderIsLastPageFirst)
{
    Pair pair(singleGroupConfig(), optionsWith(4, false));
    SequenceId const a = pair.create();
    pair.append(a, tokensFrom(0, 10)); // pages 0, 1, 2
    SequenceId const b = pair.fork(a);
    pair.free(b);
    EXPECT_FALSE(pair.manager.contains(b));
    EXPECT_EQ(pair.pages(a), (std::vector<int32_t>{0, 1, 2}));
    EXPECT_EQ(pair.manager.counts(0).shared, 0);
    EXPECT_EQ(pair.manager.counts(0).used, 3);
    pair.free(a);
    EXPECT_EQ(pair.manager.counts(0).free, 16);
    // Released 2, 1, 0: 0 is the most recently freed, then 1, 2, then the untouched 3, 4, ...
    SequenceId const c = pair.create();
    pair.append(c, tokensFrom(0, 16));
    EXPECT_EQ(pair.pages(c), (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(PageManager, FreedPagesAreTakenMostRecentlyFreedFirst)
{
    Pair pair(singleGroupConfig(), optionsWith(4, false));
    SequenceId const a = pair.create();
    pair.append(a, tokensFrom(0, 4)); // page 0
    SequenceId const b = pair.create();
    pair.append(b, tokensFrom(0, 4)); // page 1
    SequenceId const c = pair.create();
    pair.append(c, tokensFrom(0, 4)); // page 2
    pair.free(a);
    pair.free(c);
    SequenceId const d = pair.create();
    pair.append(d, tokensFrom(0, 12));
    EXPECT_EQ(pair.pages(d), (std::vector<int32_t>{2, 0, 3}));
}

//! Returns the hashes of the whole pages of `tokens` without extra keys, chained by hand from the hasher.
std::vector<PageHash> chainByHand(
    PageHasher const& hasher, std::vector<int32_t> const& tokens, void const* salt = nullptr, size_t saltBytes = 0)
{
    std::vector<PageHash> hashes;
    PageHash parent = hasher.root(salt, saltBytes);
    for (size_t start = 0; start + P <= tokens.size(); start += P)
    {
        parent = hasher.next(parent, tokens.data() + start, P, nullptr, 0);
        hashes.push_back(parent);
    }
    return hashes;
}

TEST(PageManager, ASecondSequenceAdoptsTheWholeCachedPagesBeforeTheLastPromptToken)
{
    Pair pair(singleGroupConfig(), optionsWith(4));
    std::vector<int32_t> const prompt = tokensFrom(200, 10);
    SequenceId const a = pair.create();
    EXPECT_EQ(pair.adopt(a, prompt), 0);
    pair.append(a, prompt); // pages 0, 1 full and registered, 2 partial
    pair.free(a);           // 2 is free; 1 then 0 become cached
    EXPECT_EQ(pair.manager.counts(0).cached, 2);
    EXPECT_EQ(pair.manager.counts(0).free, 14);

    SequenceId const b = pair.create();
    EXPECT_EQ(pair.adopt(b, prompt), 8); // (10 - 1) / 4 = 2 whole pages
    EXPECT_EQ(pair.pages(b), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(pair.manager.length(b), 8);
    EXPECT_EQ(pair.manager.counts(0).cached, 0);
    EXPECT_EQ(pair.manager.stats().prefixQueryTokens, 20);
    EXPECT_EQ(pair.manager.stats().prefixHitTokens, 8);

    // A prompt of exactly 8 tokens: at most 7 may be adopted, so one page.
    SequenceId const c = pair.create();
    EXPECT_EQ(pair.adopt(c, std::vector<int32_t>(prompt.begin(), prompt.begin() + 8)), 4);
    EXPECT_EQ(pair.pages(c), (std::vector<int32_t>{0}));
    EXPECT_EQ(pair.manager.counts(0).shared, 1);
    // The rest of the prompt then fills page 1's position with a fresh page (the hash is already cached).
    pair.append(c, std::vector<int32_t>(prompt.begin() + 4, prompt.begin() + 8));
    EXPECT_EQ(pair.pages(c), (std::vector<int32_t>{0, 2}));
}

TEST(PageManager, PrefixReuseStopsAtADifferentSaltOrExtraKey)
{
    Pair pair(singleGroupConfig(), optionsWith(4));
    std::vector<int32_t> const prompt = tokensFrom(300, 13);
    std::vector<PageExtraKey> const keys = {{5, PageHash{11, 12}}};
    char const salt[] = "tenant-a";
    SequenceId const a = pair.create(salt, sizeof(salt));
    EXPECT_EQ(pair.adopt(a, prompt, keys), 0);
    pair.append(a, prompt, keys); // pages 0, 1, 2 full; key at token 5 is in page 1
    pair.free(a);

    SequenceId const unsalted = pair.create();
    EXPECT_EQ(pair.adopt(unsalted, prompt, keys), 0);
    char const other[] = "tenant-b";
    SequenceId const otherSalt = pair.create(other, sizeof(other));
    EXPECT_EQ(pair.adopt(otherSalt, prompt, keys), 0);

    SequenceId const sameSalt = pair.create(salt, sizeof(salt));
    std::vector<PageExtraKey> const otherKeys = {{5, PageHash{11, 13}}};
    EXPECT_EQ(pair.adopt(sameSalt, prompt, otherKeys), 4); // page 0 matches, page 1's key differs
    EXPECT_EQ(pair.pages(sameSalt), (std::vector<int32_t>{0}));
    pair.free(sameSalt);

    SequenceId const noKeys = pair.create(salt, sizeof(salt));
    EXPECT_EQ(pair.adopt(noKeys, prompt), 4);
    pair.free(noKeys);

    SequenceId const exact = pair.create(salt, sizeof(salt));
    EXPECT_EQ(pair.adopt(exact, prompt, keys), 12);
    EXPECT_EQ(pair.pages(exact), (std::vector<int32_t>{0, 1, 2}));
}

TEST(PageManager, CachedPagesAreEvictedLeastRecentlyReleasedFirstWithTheCallback)
{
    Pair pair(singleGroupConfig(), optionsWith(4));
    std::vector<int32_t> const first = tokensFrom(0, 8);
    std::vector<int32_t> const second = tokensFrom(1000, 4);
    SequenceId const a = pair.create();
    pair.append(a, first); // pages 0, 1
    SequenceId const b = pair.create();
    pair.append(b, second); // page 2
    pair.free(a);           // cached in release order: 1, 0
    pair.free(b);           // then 2
    EXPECT_EQ(pair.manager.counts(0).cached, 3);

    std::vector<PageHash> const hashesA = chainByHand(pair.manager.hasher(), first);
    std::vector<PageHash> const hashesB = chainByHand(pair.manager.hasher(), second);
    EXPECT_EQ(pair.evict(0, 2), 2);
    ASSERT_EQ(pair.evicted.size(), 2u);
    EXPECT_EQ(pair.evicted[0].page, 1);
    EXPECT_EQ(pair.evicted[0].hash, hashesA[1]);
    EXPECT_EQ(pair.evicted[1].page, 0);
    EXPECT_EQ(pair.evicted[1].hash, hashesA[0]);
    EXPECT_EQ(pair.manager.counts(0).cached, 1);
    EXPECT_EQ(pair.manager.stats().evictedPages, 2);

    // The evicted prefix is gone: nothing to adopt; the still cached page 2 is.
    SequenceId const c = pair.create();
    EXPECT_EQ(pair.adopt(c, tokensFrom(0, 9)), 0);
    SequenceId const d = pair.create();
    EXPECT_EQ(pair.adopt(d, tokensFrom(1000, 5)), 4);
    EXPECT_EQ(pair.pages(d), (std::vector<int32_t>{2}));
    EXPECT_EQ(pair.evict(0, 5), 0); // page 2 is used again: nothing cached
    EXPECT_EQ(pair.evicted.size(), 2u);
    (void)hashesB;
}

// The prefix hit on another tier: hashNextPages() gives, before anything is appended, the hashes the eviction
// callback later reports for those pages, and appending the tokens registers fresh pages under them again.
TEST(PageManager, HashNextPagesAreTheHashesAppendRegistersAndEvictionReports)
{
    Pair pair(singleGroupConfig(), optionsWith(4));
    std::vector<int32_t> const prompt = tokensFrom(500, 13);      // pages of 4: 0-3, 4-7, 8-11, one token left
    std::vector<PageExtraKey> const keys = {{5, PageHash{3, 4}}}; // in the second page, at offset 1
    char const salt[] = "tenant";
    PageHasher const& hasher = pair.manager.hasher();
    uint8_t keyBytes[20];
    int32_t const offset = 1;
    std::memcpy(keyBytes, &offset, 4);
    std::memcpy(keyBytes + 4, &keys[0].key.lo, 8);
    std::memcpy(keyBytes + 12, &keys[0].key.hi, 8);
    std::vector<PageHash> byHand(3);
    byHand[0] = hasher.next(hasher.root(salt, sizeof(salt)), prompt.data(), P, nullptr, 0);
    byHand[1] = hasher.next(byHand[0], prompt.data() + 4, P, keyBytes, sizeof(keyBytes));
    byHand[2] = hasher.next(byHand[1], prompt.data() + 8, P, nullptr, 0);

    SequenceId const a = pair.create(salt, sizeof(salt));
    std::vector<PageHash> next(4, PageHash{99, 99}); // poison: written entries must differ
    EXPECT_EQ(pair.manager.hashNextPages(a, prompt.data(), 13, next.data(), keys.data(), 1), 3);
    EXPECT_EQ(std::vector<PageHash>(next.begin(), next.begin() + 3), byHand);
    EXPECT_EQ(next[3], (PageHash{99, 99}));
    pair.append(a, prompt, keys);
    pair.free(a);
    EXPECT_EQ(pair.evict(0, 3), 3); // released last page first: evicted 2, 1, 0
    ASSERT_EQ(pair.evicted.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
    {
        EXPECT_EQ(pair.evicted[i].hash, byHand[2 - i]) << "eviction " << i;
    }

    // A new request of the same prompt finds nothing on the GPU; the hashes name the evicted pages; appending the
    // run found elsewhere registers fresh pages under them, so a third request adopts those.
    SequenceId const b = pair.create(salt, sizeof(salt));
    EXPECT_EQ(pair.adopt(b, prompt, keys), 0);
    std::fill(next.begin(), next.end(), PageHash{99, 99});
    EXPECT_EQ(pair.manager.hashNextPages(b, prompt.data(), 13, next.data(), keys.data(), 1), 3);
    EXPECT_EQ(std::vector<PageHash>(next.begin(), next.begin() + 3), byHand);
    pair.append(b, std::vector<int32_t>(prompt.begin(), prompt.begin() + 8), keys);
    std::vector<int32_t> const onboarded = pair.pages(b);
    pair.free(b);
    SequenceId const c = pair.create(salt, sizeof(salt));
    EXPECT_EQ(pair.adopt(c, prompt, keys), 8);
    EXPECT_EQ(pair.pages(c), onboarded);
    // After a prefix the chain continues from its last page; keys before the sequence's length are refused.
    EXPECT_EQ(pair.manager.hashNextPages(c, prompt.data() + 8, 5, next.data()), 1);
    EXPECT_EQ(next[0], byHand[2]);
    std::vector<PageExtraKey> const early = {{7, PageHash{1, 1}}};
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&]
        { (void)pair.manager.hashNextPages(c, prompt.data() + 8, 5, next.data(), early.data(), 1); },
        {"extraKeys[0].position", "7", "[8, 13)"}));
    // A partial last page, too many tokens, null pointers: refused, nothing written.
    SequenceId const d = pair.create();
    pair.append(d, tokensFrom(0, 2));
    std::fill(next.begin(), next.end(), PageHash{99, 99});
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { (void)pair.manager.hashNextPages(d, prompt.data(), 4, next.data()); }, {"2 tokens", "4"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { (void)pair.manager.hashNextPages(c, prompt.data(), 25, next.data()); }, {"25", "[0, 24]"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { (void)pair.manager.hashNextPages(c, prompt.data(), 4, nullptr); }, {"out is null"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { (void)pair.manager.hashNextPages(c, nullptr, 4, next.data()); }, {"tokens is null"}));
    EXPECT_EQ(next[0], (PageHash{99, 99}));
    EXPECT_EQ(pair.manager.hashNextPages(c, nullptr, 0, nullptr), 0);
    pair.expectMatch();
}

TEST(PageManager, TakingPagesEvictsCachedOnesOnlyWhenNoneIsFree)
{
    Pair pair(singleGroupConfig(), optionsWith(4));
    SequenceId const a = pair.create();
    pair.append(a, tokensFrom(0, 32)); // pages 0..7, all full
    SequenceId const b = pair.create();
    pair.append(b, tokensFrom(500, 28)); // pages 8..14
    pair.free(a);                        // cached, released 7 first ... 0 last
    EXPECT_EQ(pair.manager.counts(0).cached, 8);
    EXPECT_EQ(pair.manager.counts(0).free, 1);
    SequenceId const c = pair.create();
    pair.append(c, tokensFrom(900, 12)); // page 15 (free), then 7, 6 evicted
    EXPECT_EQ(pair.pages(c), (std::vector<int32_t>{15, 7, 6}));
    ASSERT_EQ(pair.evicted.size(), 2u);
    std::vector<PageHash> const hashes = chainByHand(pair.manager.hasher(), tokensFrom(0, 32));
    EXPECT_EQ(pair.evicted[0].group, 0);
    EXPECT_EQ(pair.evicted[0].page, 7);
    EXPECT_EQ(pair.evicted[0].hash, hashes[7]);
    EXPECT_EQ(pair.evicted[1].page, 6);
    EXPECT_EQ(pair.evicted[1].hash, hashes[6]);
    EXPECT_EQ(pair.manager.stats().evictedPages, 2);
    // The prompt's first 6 pages are still cached: a new sequence adopts them.
    SequenceId const d = pair.create();
    EXPECT_EQ(pair.adopt(d, tokensFrom(0, 32)), 24);
    EXPECT_EQ(pair.pages(d), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
}

TEST(PageManager, OutOfPagesNamesGroupNeededAndAvailableAndChangesNothing)
{
    Pair pair(windowedConfig(), optionsWith(6));
    // Group 1 has 8 pages; each sequence of 9 tokens holds 3 of them, so after two sequences 2 are left.
    SequenceId const a = pair.create();
    SequenceId const b = pair.create();
    SequenceId const c = pair.create();
    for (SequenceId const id : {a, b})
    {
        pair.append(id, tokensFrom(0, 4));
        pair.append(id, tokensFrom(4, 4));
        pair.append(id, tokensFrom(8, 1));
    }
    pair.append(c, tokensFrom(0, 1)); // 1 page each group: group 1 has 1 page left
    ASSERT_EQ(pair.manager.counts(1).free + pair.manager.counts(1).cached, 1);
    SequenceId const d = pair.create();
    SequenceId const e = pair.create();
    test::PageManagerSnapshot const before = pair.snapshot();
    std::vector<int32_t> const t = tokensFrom(0, 4);
    std::vector<SequenceAppend> const appends = {{d, t.data(), 4}, {e, t.data(), 4}, {c, t.data(), 3}};
    // Group 1 needs 2 pages (d, e; c stays in its page) and has 1; group 0 has enough.
    std::string message;
    EXPECT_TRUE(
        throwsNaming<OutOfMemoryError>([&] { pair.manager.step(appends.data(), 3); }, {"group", "1", "2"}, &message));
    EXPECT_EQ(pair.model.step(appends.data(), 3), ModelOutcome::kOUT_OF_MEMORY);
    ASSERT_TRUE(pair.model.lastShortage().has_value());
    EXPECT_EQ(pair.model.lastShortage()->group, 1);
    EXPECT_EQ(pair.model.lastShortage()->needed, 2);
    EXPECT_EQ(pair.model.lastShortage()->available, 1);
    EXPECT_NE(message.find("group 1"), std::string::npos) << message;
    EXPECT_EQ(test::differenceOf(pair.snapshot(), before), "");
    pair.expectMatch();
    // The same step without e fits, and the manager is usable.
    pair.step({{d, t.data(), 4}, {c, t.data(), 3}});
}

TEST(PageManager, AnEarlierEntryMayUseThePageALaterEntryOfTheStepReleases)
{
    // A step counts the pages it releases as available to all its entries, so every entry's out-of-window pages
    // must be released before any entry takes one. Group 1 (8 pages) is full; c needs one new page and releases
    // none, b, later in the list, releases one and needs none: the step succeeds and c gets the page b lets go of.
    Pair pair(windowedConfig(), optionsWith(6, false));
    SequenceId const a = pair.create();
    SequenceId const b = pair.create();
    SequenceId const c = pair.create();
    for (int32_t i = 0; i < 3; ++i)
    {
        pair.append(a, tokensFrom(0, 4));
        pair.append(b, tokensFrom(0, 4));
    }
    pair.append(b, tokensFrom(0, 1)); // b: 13 tokens, group 1 holds pages of tokens 4..12
    pair.append(c, tokensFrom(0, 4));
    pair.append(c, tokensFrom(0, 4)); // c: 8 tokens, 2 pages
    ASSERT_EQ(pair.manager.counts(1).free, 0);
    std::vector<int32_t> const bBefore = pair.pages(b, 1);
    std::vector<int32_t> const t = tokensFrom(0, 4);
    std::vector<SequenceAppend> const appends = {{c, t.data(), 4}, {b, t.data(), 1}};
    pair.step(appends);
    std::vector<int32_t> const cAfter = pair.pages(c, 1);
    ASSERT_EQ(cAfter.size(), 3u);
    EXPECT_EQ(cAfter[2], bBefore[1]); // b's page of tokens 4..7 left the window
    EXPECT_EQ(pair.pages(b, 1)[1], kU);
}

TEST(PageManager, AWindowedGroupReleasesPagesOutOfTheWindow)
{
    Pair pair(windowedConfig(), optionsWith(2, false));
    ASSERT_EQ(pair.manager.numGroups(), 2);
    ASSERT_EQ(pair.manager.layout().groups[1].pagesPerSequence, 4); // min(8, ceil(9 / 4) + 1)
    SequenceId const a = pair.create();
    // 4 tokens a step from length L: pages whose last token is before L - 5 are released first.
    for (int32_t length = 0; length < 32; length += 4)
    {
        pair.append(a, tokensFrom(length, 4));
        std::vector<int32_t> const entries = pair.pages(a, 1);
        ASSERT_EQ(static_cast<int32_t>(entries.size()), (length + 4) / P);
        int32_t released = 0;
        for (int32_t const page : entries)
        {
            released += page == kU ? 1 : 0;
        }
        // Released before this step: pages p with 4(p + 1) - 1 < length - 5.
        int32_t expectedReleased = 0;
        while (4 * (expectedReleased + 1) - 1 < length - 5)
        {
            ++expectedReleased;
        }
        EXPECT_EQ(released, expectedReleased) << "length " << length;
        EXPECT_LE(static_cast<int32_t>(entries.size()) - released, 4);
        EXPECT_EQ(pair.pages(a, 0).size(), entries.size()); // group 0 keeps every page
    }
    std::vector<int32_t> const last = pair.pages(a, 1);
    EXPECT_EQ(std::vector<int32_t>(last.begin(), last.begin() + 5), (std::vector<int32_t>(5, kU)));
    // Released pages went back to the free stack and were reused: group 1 never used more than 4 distinct ids.
    std::set<int32_t> const held(last.begin() + 5, last.end());
    EXPECT_EQ(held.size(), 3u);
    for (int32_t const page : held)
    {
        EXPECT_LT(page, 4);
    }
    EXPECT_EQ(pair.manager.counts(1).used, 3);
}

TEST(PageManager, OneTokenStepsNeverHoldMoreThanTheWindowsPages)
{
    Pair pair(windowedConfig(), optionsWith(2));
    SequenceId const a = pair.create();
    for (int32_t length = 0; length < 32; ++length)
    {
        pair.append(a, {length});
        std::vector<int32_t> const entries = pair.pages(a, 1);
        int32_t held = 0;
        for (int32_t const page : entries)
        {
            held += page == kU ? 0 : 1;
        }
        EXPECT_LE(held, pair.manager.layout().groups[1].pagesPerSequence);
    }
}

TEST(PageManager, AdoptPrefixInAWindowedGroupTakesOnlyTheWindowsPages)
{
    Pair pair(windowedConfig(), optionsWith(4));
    std::vector<int32_t> const prompt = tokensFrom(0, 21);
    SequenceId const a = pair.create();
    for (int32_t start = 0; start < 21; start += 4)
    {
        pair.append(a, std::vector<int32_t>(prompt.begin() + start, prompt.begin() + std::min(start + 4, 21)));
    }
    SequenceId const b = pair.create();
    // 5 whole pages (20 tokens); the window before token 20 reaches back to token 15: pages 3 and 4.
    EXPECT_EQ(pair.adopt(b, prompt), 20);
    std::vector<int32_t> const full = pair.pages(a, 0);
    ASSERT_EQ(full.size(), 6u);
    EXPECT_EQ(pair.pages(b, 0), std::vector<int32_t>(full.begin(), full.begin() + 5));
    std::vector<int32_t> const windowed = pair.pages(b, 1);
    ASSERT_EQ(windowed.size(), 5u);
    EXPECT_EQ(std::vector<int32_t>(windowed.begin(), windowed.begin() + 3), (std::vector<int32_t>(3, kU)));
    EXPECT_EQ(windowed[3], pair.pages(a, 1)[3]);
    EXPECT_EQ(windowed[4], pair.pages(a, 1)[4]);
}

TEST(PageManager, SequenceIdsAreNeverReused)
{
    Pair pair(singleGroupConfig(), optionsWith(2));
    std::set<SequenceId> seen;
    SequenceId const first = pair.create();
    seen.insert(first);
    pair.free(first);
    for (int32_t i = 0; i < 50; ++i)
    {
        SequenceId const id = pair.create();
        EXPECT_TRUE(seen.insert(id).second) << "id " << id << " reused";
        pair.free(id);
    }
    SequenceId const alive = pair.create();
    EXPECT_FALSE(pair.manager.contains(first));
    test::PageManagerSnapshot const before = pair.snapshot();
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { pair.manager.free(first); }, {std::to_string(first)}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { (void)pair.manager.length(first); }));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { (void)pair.manager.pages(first, 0); }));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { (void)pair.manager.fork(first); }));
    std::vector<int32_t> const t = {1};
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { pair.manager.append({first, t.data(), 1}); }));
    EXPECT_EQ(test::differenceOf(pair.snapshot(), before), "");
    EXPECT_TRUE(pair.manager.contains(alive));
}

//! Expects `call` to throw `Error` naming `words` and to leave `pair` as it was.
TEST(PageManager, RejectsBadArgumentsNamingThemAndChangesNothing)
{
    Pair pair(windowedConfig(), optionsWith(3));
    SequenceId const a = pair.create();
    for (int32_t length = 0; length < 28; length += 4)
    {
        pair.append(a, tokensFrom(length, 4));
    }
    pair.append(a, tokensFrom(28, 2)); // 30 tokens
    SequenceId const b = pair.create();
    SequenceId const freed = pair.create();
    pair.free(freed);
    std::vector<int32_t> const t = tokensFrom(0, 8);
    PageManager& m = pair.manager;

    // Unknown sequences everywhere.
    SequenceId const never = SequenceId{12345} << 32;
    expectRejected<InvalidArgumentError>(pair, [&] { m.free(never); }, {std::to_string(never)});
    expectRejected<InvalidArgumentError>(pair, [&] { m.free(freed); }, {std::to_string(freed)});
    expectRejected<InvalidArgumentError>(pair, [&] { m.append({freed, t.data(), 1}); }, {std::to_string(freed)});
    expectRejected<InvalidArgumentError>(pair, [&] { (void)m.adoptPrefix(never, t.data(), 4); }, {});
    // Appending past maxSequenceLength: 30 + 3 > 32.
    expectRejected<InvalidArgumentError>(pair, [&] { m.append({a, t.data(), 3}); }, {"32", "33"});
    // count > maxTokensPerStep (4) and negative.
    expectRejected<InvalidArgumentError>(pair, [&] { m.append({b, t.data(), 5}); }, {"5", "4"});
    expectRejected<InvalidArgumentError>(pair, [&] { m.append({b, t.data(), -1}); }, {"-1"});
    expectRejected<InvalidArgumentError>(pair, [&] { m.append({b, nullptr, 2}); }, {"null"});
    // A sequence twice in one step, even though each entry alone is fine.
    std::vector<SequenceAppend> const twice = {{b, t.data(), 1}, {a, t.data(), 1}, {b, t.data(), 1}};
    expectRejected<InvalidArgumentError>(pair, [&] { m.step(twice.data(), 3); }, {std::to_string(b)});
    // A bad second entry rejects the whole step, the valid first one included.
    std::vector<SequenceAppend> const badSecond = {{b, t.data(), 1}, {a, t.data(), 4}};
    expectRejected<InvalidArgumentError>(pair, [&] { m.step(badSecond.data(), 2); }, {});
    expectRejected<InvalidArgumentError>(pair, [&] { m.step(nullptr, 1); }, {});
    // Extra keys outside the appended positions [0, 2), out of order, or null.
    std::vector<PageExtraKey> const outside = {{2, PageHash{1, 1}}};
    expectRejected<InvalidArgumentError>(pair,
        [&] {
            m.append({b, t.data(), 2, outside.data(), 1});
        },
        {"position", "2"});
    std::vector<PageExtraKey> const unordered = {{1, PageHash{1, 1}}, {0, PageHash{2, 2}}};
    expectRejected<InvalidArgumentError>(pair, [&] { m.append({b, t.data(), 2, unordered.data(), 2}); }, {});
    expectRejected<InvalidArgumentError>(pair, [&] { m.append({b, t.data(), 2, nullptr, 1}); }, {});
    std::vector<PageExtraKey> const beforeStart = {{29, PageHash{1, 1}}};
    expectRejected<InvalidArgumentError>(pair,
        [&] {
            m.append({a, t.data(), 1, beforeStart.data(), 1});
        },
        {"29", "30"});
    // adoptPrefix: non-empty sequence, count outside [0, 32], null tokens, bad keys.
    expectRejected<InvalidArgumentError>(pair, [&] { (void)m.adoptPrefix(a, t.data(), 4); }, {});
    std::vector<int32_t> const long33(33, 1);
    expectRejected<InvalidArgumentError>(pair, [&] { (void)m.adoptPrefix(b, long33.data(), 33); }, {"33", "32"});
    expectRejected<InvalidArgumentError>(pair, [&] { (void)m.adoptPrefix(b, t.data(), -1); }, {"-1"});
    expectRejected<InvalidArgumentError>(pair, [&] { (void)m.adoptPrefix(b, nullptr, 4); }, {});
    std::vector<PageExtraKey> const past = {{8, PageHash{1, 1}}};
    expectRejected<InvalidArgumentError>(pair, [&] { (void)m.adoptPrefix(b, t.data(), 8, past.data(), 1); }, {"8"});
    // Bad groups and counts.
    expectRejected<OutOfRangeError>(pair, [&] { (void)m.pages(a, 2); }, {"2"});
    expectRejected<OutOfRangeError>(pair, [&] { (void)m.pages(a, -1); }, {"-1"});
    expectRejected<OutOfRangeError>(pair, [&] { (void)m.counts(2); }, {"2"});
    expectRejected<OutOfRangeError>(pair, [&] { (void)m.lastCopies()[5]; }, {"5"});
    expectRejected<OutOfRangeError>(pair, [&] { (void)m.evictCached(2, 1); }, {"2"});
    expectRejected<InvalidArgumentError>(pair, [&] { (void)m.evictCached(0, -3); }, {"-3"});
    // Salt: null with bytes.
    expectRejected<InvalidArgumentError>(pair, [&] { (void)m.create({nullptr, 4}); }, {"salt"});
    // Too many sequences: 2 alive, 3 allowed; a third is fine, a fourth (or a fork) is refused.
    SequenceId const c = pair.create();
    expectRejected<InvalidArgumentError>(pair, [&] { (void)m.create(); }, {"3"});
    expectRejected<InvalidArgumentError>(pair, [&] { (void)m.fork(a); }, {"3"});
    pair.free(c);
    pair.expectMatch();
}

TEST(PageManager, ConstructorRejectsBadOptionsAndConfigs)
{
    PageManagerOptions options = optionsWith(-1);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { PageManager manager(singleGroupConfig(), options); }, {"maxSequences", "-1"}));
    KVCacheConfig noLayers = ConfigBuilder({}).maxBatchSize(1).maxSequenceLength(32).tokensPerPage(P);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { PageManager manager(noLayers, optionsWith(1)); }));
    KVCacheConfig const badPages = ConfigBuilder({{1, 8}}).maxBatchSize(1).maxSequenceLength(32).tokensPerPage(3);
    EXPECT_TRUE(throwsNaming<InvalidConfigError>(
        [&] { PageManager manager(badPages, optionsWith(1)); }, {"tokensPerPage", "3"}));
    PageManager defaults(singleGroupConfig(), optionsWith(0));
    EXPECT_EQ(defaults.maxSequences(), 2); // the config's maxBatchSize
    EXPECT_EQ(defaults.numGroups(), 1);
    EXPECT_EQ(defaults.hasher().seed(), testSeed());
}

TEST(PageManager, PagesFeedThePageTableBuilder)
{
    Pair pair(windowedConfig(), optionsWith(2));
    SequenceId const a = pair.create();
    SequenceId const b = pair.create();
    for (int32_t i = 0; i < 6; ++i)
    {
        std::vector<int32_t> const t = tokensFrom(10 * i, 4);
        pair.step({{a, t.data(), 4}, {b, t.data(), i % 2 == 0 ? 3 : 4}});
        for (int32_t g = 0; g < 2; ++g)
        {
            SequencePages const sequences[2] = {pair.manager.pages(a, g), pair.manager.pages(b, g)};
            // A windowed group's list spans its whole length (released entries kUNUSED_PAGE_ENTRY), so its table
            // needs rows of the full-length page count, not the group's pagesPerSequence.
            int32_t const rowPages = 32 / P;
            detail::PageTableShape const shape = detail::makePageTableShape(2, rowPages, P);
            EXPECT_NO_THROW(detail::validateSequences(shape, sequences, 2)) << "group " << g << " step " << i;
            EXPECT_EQ(sequences[0].numTokens, pair.manager.length(a));
        }
    }
}

} // namespace
} // namespace kvcache::rt
