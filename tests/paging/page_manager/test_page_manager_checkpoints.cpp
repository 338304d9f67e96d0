// Host tests of the state checkpoints of a PageManager (the "State checkpoints" paragraph of
// kvcache/paging/page_manager.h): the boundaries asked for, saves and restores worked out by hand, the clock that
// reuses checkpoint slots, checkpoints dropped with their carrier page, and misuse refused with nothing changed. A
// random run against a model of the header's rules is in test_page_manager_checkpoints_random.cpp.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/paging/page_manager.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/error_matchers.h"
#include "support/page_manager_inputs.h"
#include "support/state_checkpoint_inputs.h"

namespace kvcache::rt
{
namespace
{

using test::checkpointConfig;
using test::checkpointOptions;
using test::pairsOf;
using test::prefixHash;
using test::throwsNaming;
using test::tokensFrom;

using CopyList = test::SlotCopyPairs;
using Tokens = test::TokenList;

constexpr int32_t kPAGE = test::kCHECKPOINT_TOKENS_PER_PAGE;

Tokens concat(Tokens a, Tokens const& b)
{
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

//! Appends tokens[from, to) to `id` in one step; returns the step's state copies.
CopyList appendRange(PageManager& manager, SequenceId id, Tokens const& tokens, int32_t from, int32_t to)
{
    SequenceAppend const append{id, tokens.data() + from, to - from};
    return pairsOf(manager.append(append).stateCopies());
}

//! A request served as a runtime serves it: adoptPrefix(), the prompt appended up to each boundary asked for, the
//! state checkpointed there, the rest appended, then freed. Returns what adoptPrefix() adopted.
int32_t serve(PageManager& manager, Tokens const& prompt)
{
    SequenceId const id = manager.create();
    int32_t const count = static_cast<int32_t>(prompt.size());
    int32_t length = manager.adoptPrefix(id, prompt.data(), count);
    int32_t const adopted = length;
    while (length < count)
    {
        int32_t const boundary = manager.checkpointBoundary(id);
        int32_t const end = boundary > length && boundary < count ? boundary : count;
        appendRange(manager, id, prompt, length, end);
        length = end;
        if (length == boundary)
        {
            manager.checkpointState(id);
        }
    }
    manager.step(nullptr, 0); // hands the save out
    manager.free(id);
    return adopted;
}

TEST(StateCheckpoints, ThePromptsLastWholePageIsSavedAndRestored)
{
    PageManager manager(checkpointConfig(4, 2, 64), checkpointOptions());
    Tokens const prompt = tokensFrom(100, 18);
    SequenceId const a = manager.create();
    EXPECT_EQ(manager.adoptPrefix(a, prompt.data(), 18), 0);
    // (18 - 1) / 4 = 4 whole pages before the last token.
    EXPECT_EQ(manager.checkpointBoundary(a), 16);
    appendRange(manager, a, prompt, 0, 16);
    EXPECT_TRUE(manager.checkpointState(a));
    // Slot 0 (a's) into slot 4, the first checkpoint slot (maxBatchSize 4).
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{0, 4}}));
    EXPECT_EQ(manager.numCheckpoints(), 1);
    EXPECT_EQ(manager.checkpointSlot(prefixHash(manager, prompt, 4)), 4);
    EXPECT_EQ(manager.checkpointSlot(prefixHash(manager, prompt, 3)), -1);
    EXPECT_EQ(manager.checkpointBoundary(a), -1);
    // Made again: nothing more queued.
    EXPECT_TRUE(manager.checkpointState(a));
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{0, 4}}));
    manager.checkInvariants();

    // Its copy not handed out yet, the checkpoint is not adoptable.
    SequenceId const b = manager.create();
    EXPECT_EQ(manager.adoptPrefix(b, prompt.data(), 18), 0);
    EXPECT_EQ(appendRange(manager, a, prompt, 16, 18), (CopyList{{0, 4}}));

    SequenceId const c = manager.create();
    EXPECT_EQ(manager.stateSlot(c), 2);
    EXPECT_EQ(manager.adoptPrefix(c, prompt.data(), 18), 16);
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{4, 2}}));
    manager.checkInvariants();
    EXPECT_EQ(appendRange(manager, c, prompt, 16, 18), (CopyList{{4, 2}}));
    PageManagerStats const stats = manager.stats();
    EXPECT_EQ(stats.checkpointsSaved, 1);
    EXPECT_EQ(stats.checkpointsRestored, 1);
    EXPECT_EQ(stats.checkpointsDropped, 0);
    EXPECT_EQ(stats.prefixHitTokens, 16);
    manager.checkInvariants();
}

TEST(StateCheckpoints, WhereAMatchEndsWithoutOneASaveIsAskedFor)
{
    PageManager manager(checkpointConfig(4, 4, 64), checkpointOptions());
    Tokens const first = tokensFrom(0, 24);
    EXPECT_EQ(serve(manager, first), 0); // saved at 20: (24 - 1) / 4 = 5 pages
    EXPECT_EQ(manager.numCheckpoints(), 1);
    // Shares 3 pages (12 tokens) with the first; no checkpoint there.
    Tokens const second = concat(Tokens(first.begin(), first.begin() + 12), tokensFrom(500, 10));
    SequenceId const b = manager.create();
    EXPECT_EQ(manager.adoptPrefix(b, second.data(), 22), 0);
    EXPECT_EQ(manager.checkpointBoundary(b), 12);
    appendRange(manager, b, second, 0, 12);
    EXPECT_TRUE(manager.checkpointState(b));
    // Then the prompt's own: (22 - 1) / 4 = 5 pages.
    EXPECT_EQ(manager.checkpointBoundary(b), 20);
    appendRange(manager, b, second, 12, 22);
    // A third prompt with the shared 12 tokens hits the checkpoint made where the match ended.
    Tokens const third = concat(Tokens(first.begin(), first.begin() + 12), tokensFrom(900, 7));
    EXPECT_EQ(serve(manager, third), 12);
    // The first prompt again: its own checkpoint at 20.
    EXPECT_EQ(serve(manager, first), 20);
    manager.checkInvariants();
}

TEST(StateCheckpoints, EveryNPagesWithinTheLongestSequence)
{
    PageManager manager(checkpointConfig(2, 2, 64), checkpointOptions(3));
    SequenceId const a = manager.create();
    EXPECT_EQ(manager.checkpointBoundary(a), 12);
    Tokens const prompt = tokensFrom(7, 64);
    EXPECT_EQ(manager.adoptPrefix(a, prompt.data(), 6), 0);
    EXPECT_EQ(manager.checkpointBoundary(a), 4); // the prompt's page, before the interval's 12
    appendRange(manager, a, prompt, 0, 4);
    EXPECT_EQ(manager.checkpointBoundary(a), 12);
    appendRange(manager, a, prompt, 4, 12);
    EXPECT_EQ(manager.checkpointBoundary(a), 24);
    appendRange(manager, a, prompt, 12, 50);
    EXPECT_EQ(manager.checkpointBoundary(a), 60);
    appendRange(manager, a, prompt, 50, 60);
    EXPECT_EQ(manager.checkpointBoundary(a), -1); // 72 is past maxSequenceLength 64
}

TEST(StateCheckpoints, EvictingTheCarrierPageDropsTheCheckpoint)
{
    PageManager manager(checkpointConfig(2, 2, 64), checkpointOptions());
    Tokens const prompt = tokensFrom(40, 9);
    EXPECT_EQ(serve(manager, prompt), 0);
    EXPECT_EQ(manager.checkpointSlot(prefixHash(manager, prompt, 2)), 2);
    EXPECT_EQ(manager.counts(0).cached, 2);
    // The later page is evicted first (released first): page 1 carries the checkpoint.
    EXPECT_EQ(manager.evictCached(0, 1), 1);
    EXPECT_EQ(manager.numCheckpoints(), 0);
    EXPECT_EQ(manager.checkpointSlot(prefixHash(manager, prompt, 2)), -1);
    EXPECT_EQ(manager.stats().checkpointsDropped, 1);
    manager.checkInvariants();
    // Page 0 is still cached, but has no checkpoint: nothing is adopted.
    SequenceId const b = manager.create();
    EXPECT_EQ(manager.adoptPrefix(b, prompt.data(), 9), 0);
    manager.checkInvariants();
}

TEST(StateCheckpoints, TheClockKeepsWhatIsHit)
{
    // Two checkpoint slots, 4 and 5; prompts of one page and a token, saved at 4.
    PageManager manager(checkpointConfig(2, 2, 64), checkpointOptions());
    Tokens const a = tokensFrom(1000, 5);
    Tokens const b = tokensFrom(2000, 5);
    Tokens const c = tokensFrom(3000, 5);
    Tokens const d = tokensFrom(4000, 5);
    auto const slotOf = [&](Tokens const& tokens) { return manager.checkpointSlot(prefixHash(manager, tokens, 1)); };
    EXPECT_EQ(serve(manager, a), 0);
    EXPECT_EQ(serve(manager, b), 0);
    EXPECT_EQ(slotOf(a), 2);
    EXPECT_EQ(slotOf(b), 3);
    EXPECT_EQ(serve(manager, a), 4); // a hit: a's count 1
    // The hand at a lowers it to 0 and reuses b's slot, although b was made after a.
    EXPECT_EQ(serve(manager, c), 0);
    EXPECT_EQ(slotOf(a), 2);
    EXPECT_EQ(slotOf(b), -1);
    EXPECT_EQ(slotOf(c), 3);
    // The hand is back at a, now at 0.
    EXPECT_EQ(serve(manager, d), 0);
    EXPECT_EQ(slotOf(a), -1);
    EXPECT_EQ(slotOf(c), 3);
    EXPECT_EQ(slotOf(d), 2);
    EXPECT_EQ(manager.stats().checkpointsDropped, 2);
    manager.checkInvariants();
}

TEST(StateCheckpoints, ASlotAQueuedCopyReadsOrFillsIsNotReused)
{
    PageManager manager(checkpointConfig(4, 1, 64), checkpointOptions());
    Tokens const a = tokensFrom(10, 5);
    Tokens const b = tokensFrom(20, 5);
    SequenceId const x = manager.create();
    SequenceId const y = manager.create();
    std::vector<SequenceAppend> const both = {{x, a.data(), 4}, {y, b.data(), 4}};
    manager.step(both.data(), 2);
    EXPECT_TRUE(manager.checkpointState(x));
    EXPECT_FALSE(manager.checkpointState(y)); // the one slot is being filled
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{0, 4}}));
    EXPECT_EQ(pairsOf(manager.step(nullptr, 0).stateCopies()), (CopyList{{0, 4}}));
    SequenceId const z = manager.create();
    EXPECT_EQ(manager.adoptPrefix(z, a.data(), 5), 4);
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{4, 2}}));
    EXPECT_FALSE(manager.checkpointState(y)); // the slot is read
    EXPECT_EQ(manager.numCheckpoints(), 1);
    manager.checkInvariants();
    manager.step(nullptr, 0);
    // Read no more: the hand lowers a's count (1, from the hit) and then reuses the slot.
    EXPECT_TRUE(manager.checkpointState(y));
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{1, 4}}));
    EXPECT_EQ(manager.checkpointSlot(prefixHash(manager, a, 1)), -1);
    EXPECT_EQ(manager.checkpointSlot(prefixHash(manager, b, 1)), 4);
    manager.checkInvariants();
}

TEST(StateCheckpoints, RestoresAndForksShareTheQueueSafely)
{
    PageManager manager(checkpointConfig(4, 2, 64), checkpointOptions());
    Tokens const prompt = tokensFrom(50, 9);
    EXPECT_EQ(serve(manager, prompt), 0); // saved at 8, in slot 4
    SequenceId const a = manager.create();
    SequenceId const b = manager.fork(a);
    ASSERT_EQ(manager.stateSlot(a), 0);
    ASSERT_EQ(manager.stateSlot(b), 1);
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{0, 1}}));
    // b's copy reads a's slot: a restore into it would fill a slot a copy reads.
    EXPECT_EQ(manager.adoptPrefix(a, prompt.data(), 9), 0);
    // b waits for a's state; the checkpoint's replaces it.
    EXPECT_EQ(manager.adoptPrefix(b, prompt.data(), 9), 8);
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{4, 1}}));
    // A fork of b reads where b's state is: the checkpoint.
    SequenceId const c = manager.fork(b);
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{4, 1}, {4, 2}}));
    // So does a checkpoint of it (there already: nothing queued).
    EXPECT_TRUE(manager.checkpointState(c));
    manager.checkInvariants();
    manager.free(b);
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{4, 2}}));
    manager.checkInvariants();
    EXPECT_EQ(pairsOf(manager.step(nullptr, 0).stateCopies()), (CopyList{{4, 2}}));
    manager.checkInvariants();
}

TEST(StateCheckpoints, EveryGroupMustServeThePrefix)
{
    // A full-attention group, a windowed group of 8 tokens (its window before token 12: pages 1 and 2) and a state
    // layer.
    PageManager manager(checkpointConfig(2, 2, 0, {{1, 8, 0}, {1, 8, 8}}), checkpointOptions());
    Tokens const prompt = tokensFrom(300, 13);
    EXPECT_EQ(serve(manager, prompt), 0);
    EXPECT_EQ(manager.numCheckpoints(), 1);
    EXPECT_EQ(serve(manager, prompt), 12);
    // The windowed group's pages gone, the checkpoint and the full-attention pages serve nothing.
    manager.evictCached(1, manager.counts(1).cached);
    EXPECT_EQ(manager.numCheckpoints(), 1);
    SequenceId const a = manager.create();
    EXPECT_EQ(manager.adoptPrefix(a, prompt.data(), 13), 0);
    manager.checkInvariants();
}

TEST(StateCheckpoints, WithoutCheckpointsStateLayersAdoptNothing)
{
    for (bool const prefixCaching : {true, false})
    {
        PageManager manager(checkpointConfig(2, prefixCaching ? 0 : 2, 64), checkpointOptions(2, prefixCaching));
        Tokens const prompt = tokensFrom(5, 13);
        SequenceId const a = manager.create();
        EXPECT_EQ(manager.checkpointBoundary(a), -1);
        appendRange(manager, a, prompt, 0, 12);
        EXPECT_FALSE(manager.checkpointState(a));
        EXPECT_TRUE(manager.pendingStateCopies().empty());
        appendRange(manager, a, prompt, 12, 13);
        manager.free(a);
        SequenceId const b = manager.create();
        EXPECT_EQ(manager.adoptPrefix(b, prompt.data(), 13), 0);
        EXPECT_EQ(manager.numCheckpoints(), 0);
        manager.checkInvariants();
    }
    // Without state layers, pages alone are adopted, as before.
    PageManager plain(checkpointConfig(2, -1, 64), checkpointOptions(2));
    Tokens const prompt = tokensFrom(5, 13);
    SequenceId const a = plain.create();
    EXPECT_EQ(plain.checkpointBoundary(a), -1);
    appendRange(plain, a, prompt, 0, 13);
    plain.free(a);
    EXPECT_EQ(plain.adoptPrefix(plain.create(), prompt.data(), 13), 12);
}

TEST(StateCheckpoints, MisuseIsRefusedAndChangesNothing)
{
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&]
        { PageManager manager(checkpointConfig(2, 2, 64), checkpointOptions(-1)); },
        {"checkpointIntervalPages is -1"}));
    PageManager plain(checkpointConfig(2, -1, 64), checkpointOptions());
    SequenceId const p = plain.create();
    Tokens const prompt = tokensFrom(1, 13);
    appendRange(plain, p, prompt, 0, 8);
    EXPECT_TRUE(
        throwsNaming<InvalidArgumentError>([&] { plain.checkpointState(p); }, {"checkpointState", "no state layers"}));

    PageManager manager(checkpointConfig(3, 2, 64), checkpointOptions());
    Tokens const a = tokensFrom(10, 9);
    EXPECT_EQ(serve(manager, a), 0);
    SequenceId const x = manager.create();
    SequenceId const gone = manager.create();
    manager.free(gone);
    SequenceId const y = manager.fork(x);
    CopyList const queued = pairsOf(manager.pendingStateCopies());
    PageManagerStats const before = manager.stats();
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { manager.checkpointState(x); }, {"checkpointState", "has 0 tokens", "whole pages of 4"}));
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), queued);
    appendRange(manager, x, a, 0, 5);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { manager.checkpointState(x); }, {"checkpointState", "has 5 tokens", "whole pages of 4"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { manager.checkpointState(gone); }, {"checkpointState", std::to_string(gone), "unknown"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { manager.checkpointBoundary(gone); }, {"checkpointBoundary", std::to_string(gone), "unknown"}));
    EXPECT_TRUE(manager.pendingStateCopies().empty()); // the append handed the fork's copy out
    EXPECT_EQ(manager.numCheckpoints(), 1);
    EXPECT_EQ(manager.stats().checkpointsSaved, before.checkpointsSaved);
    EXPECT_EQ(manager.length(y), 0);
    EXPECT_EQ(manager.checkpointSlot(PageHash{}), -1);
    manager.checkInvariants();
}

} // namespace
} // namespace kvcache::rt
