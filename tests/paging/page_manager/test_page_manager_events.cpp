// Host tests of a PageManager's KV events (PageManagerOptions::recordEvents): none when off; AllBlocksCleared first;
// stored events with hashes recomputed here from PageHasher, parents, token ids, the salt and extra keys; removals in
// eviction order; a page completed in the partial-page buffer keeps its tokens; a batch's extra keys stay at their
// hashes' indices (after removals, keyless pages, append() and clear()); and a random run whose events, applied to a
// set of hashes per group, give exactly the pages the manager has registered.

#include "paging/page_manager/page_manager_internal.h"

#include "kvcache/paging/kv_events.h"
#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_manager.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/page_manager_inputs.h"

namespace kvcache::rt
{
namespace
{

using test::tokensFrom;

constexpr int32_t kP = 4;

//! One full-attention group of `numPages` pages (at least 4), sequences of up to 16 tokens.
KVCacheConfig oneGroup(int32_t numPages)
{
    return test::ConfigBuilder({{1, 8}})
        .maxBatchSize(1)
        .maxSequenceLength(16)
        .tokensPerPage(kP)
        .maxTokensPerStep(16)
        .numPagesPerGroup({numPages});
}

PageManagerOptions eventOptions(int32_t maxSequences)
{
    PageManagerOptions options = test::seededOptions(maxSequences, 7);
    options.recordEvents = true;
    return options;
}

std::vector<PageHash> hashesOf(KVEventBatch const& batch, KVEvent const& event)
{
    auto const begin = batch.hashes().begin() + event.firstHash;
    return {begin, begin + event.numHashes};
}

TEST(PageManagerEvents, RecordsNothingWhenOff)
{
    PageManager manager(oneGroup(16), test::seededOptions(4, 7));
    std::vector<int32_t> const tokens = tokensFrom(10, 9);
    SequenceId const sequence = manager.create();
    manager.append({sequence, tokens.data(), 9, nullptr, 0});
    KVEventBatch batch;
    manager.takeEvents(batch);
    EXPECT_TRUE(batch.empty());
}

TEST(PageManagerEvents, StoredPagesCarryHashesParentsTokensSaltAndKeys)
{
    PageManager manager(oneGroup(16), eventOptions(4));
    KVEventBatch batch;
    manager.takeEvents(batch);
    ASSERT_EQ(batch.events().size(), 1u);
    EXPECT_EQ(batch.events()[0].type, KVEventType::kALL_CLEARED);

    // Salt "ab"; a key at position 5 (page 1, offset 1). 9 tokens: pages 0 and 1 fill, page 2 stays partial.
    uint8_t const salt[2] = {'a', 'b'};
    SequenceId const sequence = manager.create(SequenceOptions{salt, 2});
    std::vector<int32_t> const tokens = tokensFrom(100, 9);
    PageExtraKey const key{5, PageHash{0x1111, 0x2222}};
    manager.append({sequence, tokens.data(), 9, &key, 1});
    manager.takeEvents(batch);

    // The hashes, from PageHasher directly: page 1 mixes in its key's 20 bytes (offset 1, lo, hi).
    PageHasher const hasher(PageHashAlgorithm::kSHA256, test::consecutiveSeed(7));
    PageHash const root = hasher.root(salt, 2);
    PageHash const page0 = hasher.next(root, tokens.data(), kP, nullptr, 0);
    uint8_t keyBytes[20] = {1, 0, 0, 0, 0x11, 0x11, 0, 0, 0, 0, 0, 0, 0x22, 0x22, 0, 0, 0, 0, 0, 0};
    PageHash const page1 = hasher.next(page0, tokens.data() + kP, kP, keyBytes, 20);

    ASSERT_EQ(batch.events().size(), 1u);
    KVEvent const& stored = batch.events()[0];
    EXPECT_EQ(stored.type, KVEventType::kSTORED);
    EXPECT_EQ(stored.medium, KVEventMedium::kGPU);
    EXPECT_EQ(stored.group, 0);
    EXPECT_EQ(stored.tokensPerPage, kP);
    EXPECT_FALSE(stored.hasParent);
    EXPECT_TRUE(stored.hasKeys);
    EXPECT_EQ(hashesOf(batch, stored), (std::vector<PageHash>{page0, page1}));
    std::vector<int32_t> const storedTokens(
        batch.tokens().begin() + stored.firstToken, batch.tokens().begin() + stored.firstToken + stored.numTokens);
    EXPECT_EQ(storedTokens, std::vector<int32_t>(tokens.begin(), tokens.begin() + 2 * kP));
    KVEventPageKeys const keys0 = batch.pageKeys()[static_cast<size_t>(stored.firstHash)];
    KVEventPageKeys const keys1 = batch.pageKeys()[static_cast<size_t>(stored.firstHash + 1)];
    EXPECT_EQ(keys0.saltBytes, 2);
    EXPECT_EQ(keys0.numKeys, 0);
    EXPECT_EQ(std::memcmp(batch.keyBytes().data() + keys0.offset, salt, 2), 0);
    EXPECT_EQ(keys1.saltBytes, 0);
    EXPECT_EQ(keys1.numKeys, 1);
    EXPECT_EQ(std::memcmp(batch.keyBytes().data() + keys1.offset, keyBytes, 20), 0);

    // Three more tokens fill page 2: its parent is page 1, its tokens the partial page's and the new ones.
    std::vector<int32_t> const more = tokensFrom(200, 3);
    manager.append({sequence, more.data(), 3, nullptr, 0});
    manager.takeEvents(batch);
    ASSERT_EQ(batch.events().size(), 1u);
    KVEvent const& next = batch.events()[0];
    EXPECT_TRUE(next.hasParent);
    EXPECT_EQ(next.parent, page1);
    EXPECT_FALSE(next.hasKeys);
    std::vector<int32_t> const page2Tokens{108, 200, 201, 202};
    EXPECT_EQ(hashesOf(batch, next), (std::vector<PageHash>{hasher.next(page1, page2Tokens.data(), kP, nullptr, 0)}));
    EXPECT_EQ(std::vector<int32_t>(batch.tokens().begin(), batch.tokens().end()), page2Tokens);
}

TEST(PageManagerEvents, APageCompletedInThePartialPageKeepsItsTokensWhenTheAppendEndsInANewOne)
{
    // 3 tokens wait in the partial page; 6 more complete page 0 there, fill page 1 whole, and start page 2, whose
    // first token lands where page 0's first one waited.
    PageManager manager(oneGroup(16), eventOptions(4));
    KVEventBatch batch;
    manager.takeEvents(batch);
    SequenceId const sequence = manager.create();
    std::vector<int32_t> const first = tokensFrom(100, 3);
    manager.append({sequence, first.data(), 3, nullptr, 0});
    manager.takeEvents(batch);
    EXPECT_TRUE(batch.empty());
    std::vector<int32_t> const second = tokensFrom(200, 6);
    manager.append({sequence, second.data(), 6, nullptr, 0});
    manager.takeEvents(batch);

    std::vector<int32_t> const page0{100, 101, 102, 200};
    std::vector<int32_t> const page1{201, 202, 203, 204};
    PageHasher const hasher(PageHashAlgorithm::kSHA256, test::consecutiveSeed(7));
    PageHash const hash0 = hasher.next(hasher.root(nullptr, 0), page0.data(), kP, nullptr, 0);
    PageHash const hash1 = hasher.next(hash0, page1.data(), kP, nullptr, 0);
    ASSERT_EQ(batch.events().size(), 1u);
    KVEvent const& stored = batch.events()[0];
    EXPECT_EQ(stored.type, KVEventType::kSTORED);
    EXPECT_FALSE(stored.hasParent);
    EXPECT_EQ(hashesOf(batch, stored), (std::vector<PageHash>{hash0, hash1}));
    EXPECT_EQ(std::vector<int32_t>(batch.tokens().begin(), batch.tokens().end()),
        (std::vector<int32_t>{100, 101, 102, 200, 201, 202, 203, 204}));
}

TEST(KVEventBatch, KeysStayAtTheirHashesAfterRemovalsKeylessPagesAndAppend)
{
    // Removals and a keyless page before a page with keys, in a batch appended after one with a removal of its own:
    // each stored page with keys finds them at its hash's index, a keyless page of such an event none.
    uint8_t const keyBytes[20] = {3, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    std::vector<int32_t> const tokens = tokensFrom(40, 2 * kP);
    KVEventBatch part;
    part.addRemoved(0, KVEventMedium::kGPU, PageHash{1, 1});
    part.addRemoved(0, KVEventMedium::kGPU, PageHash{2, 2});
    part.beginStored(0, KVEventMedium::kGPU, kP, nullptr);
    part.addStoredPage(PageHash{3, 3}, tokens.data(), nullptr, 0, 0);
    part.addStoredPage(PageHash{4, 4}, tokens.data() + kP, keyBytes, 0, 1);
    part.beginStored(1, KVEventMedium::kGPU, kP, nullptr);
    part.addStoredPage(PageHash{5, 5}, tokens.data(), nullptr, 0, 0);

    KVEventBatch whole;
    whole.addRemoved(2, KVEventMedium::kCPU, PageHash{9, 9});
    whole.append(part);
    for (KVEventBatch const* batch : {&part, &whole})
    {
        ASSERT_EQ(batch->events().size(), part.events().size() + (batch == &whole ? 1 : 0));
        KVEvent const& keyed = batch->events()[batch->events().size() - 2];
        KVEvent const& keyless = batch->events().back();
        ASSERT_TRUE(keyed.hasKeys);
        EXPECT_FALSE(keyless.hasKeys);
        ASSERT_EQ(keyed.numHashes, 2);
        EXPECT_EQ(batch->hashes()[static_cast<size_t>(keyed.firstHash + 1)], (PageHash{4, 4}));
        ASSERT_GT(batch->pageKeys().size(), static_cast<size_t>(keyed.firstHash + 1));
        KVEventPageKeys const none = batch->pageKeys()[static_cast<size_t>(keyed.firstHash)];
        KVEventPageKeys const some = batch->pageKeys()[static_cast<size_t>(keyed.firstHash + 1)];
        EXPECT_EQ(none.saltBytes + none.numKeys, 0);
        EXPECT_EQ(some.saltBytes, 0);
        ASSERT_EQ(some.numKeys, 1);
        ASSERT_LE(static_cast<size_t>(some.offset) + 20, batch->keyBytes().size());
        EXPECT_EQ(std::memcmp(batch->keyBytes().data() + some.offset, keyBytes, 20), 0);
    }

    // Cleared, the batch records afresh: nothing of the keys or tokens before is left.
    whole.clear();
    whole.beginStored(0, KVEventMedium::kGPU, kP, nullptr);
    whole.addStoredPage(PageHash{6, 6}, tokens.data() + kP, nullptr, 0, 0);
    ASSERT_EQ(whole.events().size(), 1u);
    EXPECT_FALSE(whole.events()[0].hasKeys);
    EXPECT_EQ(whole.hashes(), (std::vector<PageHash>{PageHash{6, 6}}));
    EXPECT_EQ(whole.tokens(), std::vector<int32_t>(tokens.begin() + kP, tokens.end()));
    EXPECT_TRUE(whole.keyBytes().empty());
}

TEST(PageManagerEvents, EvictionsAreRemovedInEvictionOrderAndDuplicatesAreNotStoredTwice)
{
    // 4 pages: a prompt of 3 whole pages, freed, cached; a second copy of it registers nothing new.
    PageManager manager(oneGroup(4), eventOptions(2));
    KVEventBatch batch;
    manager.takeEvents(batch);
    std::vector<int32_t> const prompt = tokensFrom(1, 3 * kP);
    SequenceId const a = manager.create();
    manager.append({a, prompt.data(), 3 * kP, nullptr, 0});
    manager.takeEvents(batch);
    ASSERT_EQ(batch.events().size(), 1u);
    std::vector<PageHash> const promptHashes = hashesOf(batch, batch.events()[0]);
    ASSERT_EQ(promptHashes.size(), 3u);

    SequenceId const b = manager.create();
    manager.append({b, prompt.data(), 1, nullptr, 0});
    manager.takeEvents(batch);
    EXPECT_TRUE(batch.empty());

    // free() lets go of the last page first, so the prompt's pages are cached last to first and evicted so: 4 new
    // pages for c take the free page, then pages 2, 1, 0 of the prompt (b's partial page is held).
    manager.free(a);
    SequenceId const c = manager.create();
    std::vector<int32_t> const other = tokensFrom(500, 2 * kP + 1);
    manager.free(b);
    manager.append({c, other.data(), 2 * kP + 1, nullptr, 0});
    manager.takeEvents(batch);
    ASSERT_GE(batch.events().size(), 2u);
    KVEvent const& removed = batch.events()[0];
    EXPECT_EQ(removed.type, KVEventType::kREMOVED);
    EXPECT_EQ(hashesOf(batch, removed), (std::vector<PageHash>{promptHashes[2], promptHashes[1]}));
    EXPECT_EQ(batch.events()[1].type, KVEventType::kSTORED);
    EXPECT_EQ(batch.events()[1].numHashes, 2);
}

//! Applies `batch` to `cached` (per group, the hashes a router believes stored), failing on an event that does not
//! fit the model: a hash stored twice or removed without being stored.
void applyEvents(KVEventBatch const& batch, std::map<int32_t, std::set<std::pair<uint64_t, uint64_t>>>& cached)
{
    for (KVEvent const& event : batch.events())
    {
        if (event.type == KVEventType::kALL_CLEARED)
        {
            cached.clear();
            continue;
        }
        for (PageHash const hash : hashesOf(batch, event))
        {
            auto& group = cached[event.group];
            if (event.type == KVEventType::kSTORED)
            {
                ASSERT_TRUE(group.insert({hash.lo, hash.hi}).second) << "stored twice";
            }
            else
            {
                ASSERT_EQ(group.erase({hash.lo, hash.hi}), 1u) << "removed without being stored";
            }
        }
    }
}

TEST(PageManagerEvents, RandomRunEventsReconstructTheRegisteredPages)
{
    // Two groups, full attention and a window of 8 tokens (a hybrid cache with cuts), few pages so that eviction is
    // frequent; salts from a small set so that some prompts share pages.
    KVCacheConfig const config = test::ConfigBuilder({{1, 8}, {1, 8, 8}})
                                     .maxBatchSize(1)
                                     .maxSequenceLength(64)
                                     .tokensPerPage(kP)
                                     .maxTokensPerStep(16)
                                     .numPagesPerGroup({40, 24});
    PageManager manager(config, eventOptions(4));
    std::map<int32_t, std::set<std::pair<uint64_t, uint64_t>>> cached;
    KVEventBatch batch;
    std::mt19937 random(11);
    std::vector<SequenceId> live;
    int64_t stored = 0;
    int64_t removed = 0;
    for (int32_t operation = 0; operation < 4000; ++operation)
    {
        int32_t const choice = static_cast<int32_t>(random() % 10);
        if (live.size() < 4 && choice < 3)
        {
            uint8_t const salt = static_cast<uint8_t>(random() % 3);
            SequenceId const sequence = manager.create(SequenceOptions{&salt, salt == 0 ? size_t{0} : size_t{1}});
            std::vector<int32_t> const prompt = tokensFrom(static_cast<int32_t>(random() % 4) * 100, 20);
            int32_t const adopted = manager.adoptPrefix(sequence, prompt.data(), 20);
            int32_t const count = std::min(16, 20 - adopted);
            SequenceAppend const append{sequence, prompt.data() + adopted, count, nullptr, 0};
            if (manager.canStep(&append, 1))
            {
                manager.step(&append, 1);
            }
            live.push_back(sequence);
        }
        else if (!live.empty() && choice < 5)
        {
            size_t const index = random() % live.size();
            manager.free(live[index]);
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
        }
        else if (!live.empty() && choice < 6 && live.size() < 4)
        {
            live.push_back(manager.fork(live[random() % live.size()]));
        }
        else if (choice < 7)
        {
            manager.evictCached(static_cast<int32_t>(random() % 2), static_cast<int32_t>(random() % 3));
        }
        else if (!live.empty())
        {
            std::vector<SequenceAppend> appends;
            std::vector<std::vector<int32_t>> tokens;
            for (SequenceId const sequence : live)
            {
                int32_t const count =
                    std::min<int32_t>(static_cast<int32_t>(random() % 7), 64 - manager.length(sequence));
                tokens.push_back(tokensFrom(static_cast<int32_t>(random() % 3), count));
            }
            for (size_t i = 0; i < live.size(); ++i)
            {
                appends.push_back({live[i], tokens[i].data(), static_cast<int32_t>(tokens[i].size()), nullptr, 0});
            }
            if (manager.canStep(appends.data(), static_cast<int32_t>(appends.size())))
            {
                manager.step(appends.data(), static_cast<int32_t>(appends.size()));
            }
        }
        manager.takeEvents(batch);
        for (KVEvent const& event : batch.events())
        {
            (event.type == KVEventType::kSTORED ? stored : removed) += event.numHashes;
        }
        applyEvents(batch, cached);
        if (HasFatalFailure())
        {
            return;
        }
        for (int32_t g = 0; g < 2; ++g)
        {
            ASSERT_EQ(static_cast<int32_t>(cached[g].size()), detail::PageManagerInternal::numRegistered(manager, g))
                << "group " << g << " after operation " << operation;
            for (auto const& [lo, hi] : cached[g])
            {
                ASSERT_TRUE(detail::PageManagerInternal::hasPage(manager, g, PageHash{lo, hi}));
            }
        }
    }
    // The run exercised both kinds many times over.
    EXPECT_GT(stored, 1000);
    EXPECT_GT(removed, 1000);
}

} // namespace
} // namespace kvcache::rt
