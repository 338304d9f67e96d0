// Host tests of the state checkpoints of a PageManager (the "State checkpoints" paragraph of
// kvcache/paging/page_manager.h): the boundaries asked for, saves and restores worked out by hand, the clock that
// reuses checkpoint slots, checkpoints dropped with their carrier page, a random run against a small model of the
// header's rules written here, and misuse refused with nothing changed.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/paging/page_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/page_manager_inputs.h"

namespace kvcache::rt
{
namespace
{

using test::ConfigBuilder;
using test::throwsNaming;
using test::tokensFrom;

using CopyList = std::vector<std::pair<int32_t, int32_t>>;
using Tokens = std::vector<int32_t>;

constexpr int32_t kPAGE = 4;
constexpr int32_t kMAX_LENGTH = 64;

std::vector<StateLayerConfig> stateLayers()
{
    return {StateLayerConfig{{StateTensorConfig{"ssm", {2, 4, 4}, DataType::kFLOAT}}}};
}

//! `layers` (default one full-attention layer), 4 tokens a page, 64 tokens a sequence, `maxBatchSize` sequences,
//! `numPages` pages (0: the minimum), one state layer and `checkpointSlots` checkpoint slots (no state layer when
//! negative).
KVCacheConfig checkpointConfig(
    int32_t maxBatchSize, int32_t checkpointSlots, int32_t numPages, std::vector<KVLayerConfig> layers = {{1, 8}})
{
    ConfigBuilder builder(std::move(layers));
    builder.maxBatchSize(maxBatchSize)
        .maxSequenceLength(kMAX_LENGTH)
        .tokensPerPage(kPAGE)
        .maxTokensPerStep(kMAX_LENGTH)
        .numPages(numPages);
    if (checkpointSlots >= 0)
    {
        builder.stateLayers(stateLayers()).numCheckpointSlots(checkpointSlots);
    }
    return builder;
}

PageManagerOptions options(int32_t intervalPages = 0, bool prefixCaching = true)
{
    PageManagerOptions o = test::seededOptions(0, 11, prefixCaching);
    o.checkpointIntervalPages = intervalPages;
    return o;
}

CopyList pairsOf(std::vector<StateSlotCopy> const& copies)
{
    CopyList pairs;
    for (StateSlotCopy const& copy : copies)
    {
        pairs.emplace_back(copy.src, copy.dst);
    }
    return pairs;
}

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

//! Returns the hash of the first `pages` whole pages of `tokens` without salt, from the manager's hasher.
PageHash prefixHash(PageManager const& manager, Tokens const& tokens, int32_t pages)
{
    std::vector<PageHash> hashes(static_cast<size_t>(pages));
    manager.hasher().chain(manager.hasher().root(nullptr, 0), tokens.data(), pages, kPAGE, hashes.data());
    return hashes.back();
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
    PageManager manager(checkpointConfig(4, 2, 64), options());
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
    PageManager manager(checkpointConfig(4, 4, 64), options());
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
    PageManager manager(checkpointConfig(2, 2, 64), options(3));
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
    PageManager manager(checkpointConfig(2, 2, 64), options());
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
    PageManager manager(checkpointConfig(2, 2, 64), options());
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
    PageManager manager(checkpointConfig(4, 1, 64), options());
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
    PageManager manager(checkpointConfig(4, 2, 64), options());
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
    PageManager manager(checkpointConfig(2, 2, 0, {{1, 8, 0}, {1, 8, 8}}), options());
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
        PageManager manager(checkpointConfig(2, prefixCaching ? 0 : 2, 64), options(2, prefixCaching));
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
    PageManager plain(checkpointConfig(2, -1, 64), options(2));
    Tokens const prompt = tokensFrom(5, 13);
    SequenceId const a = plain.create();
    EXPECT_EQ(plain.checkpointBoundary(a), -1);
    appendRange(plain, a, prompt, 0, 13);
    plain.free(a);
    EXPECT_EQ(plain.adoptPrefix(plain.create(), prompt.data(), 13), 12);
}

TEST(StateCheckpoints, MisuseIsRefusedAndChangesNothing)
{
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { PageManager manager(checkpointConfig(2, 2, 64), options(-1)); }, {"checkpointIntervalPages is -1"}));
    PageManager plain(checkpointConfig(2, -1, 64), options());
    SequenceId const p = plain.create();
    Tokens const prompt = tokensFrom(1, 13);
    appendRange(plain, p, prompt, 0, 8);
    EXPECT_TRUE(
        throwsNaming<InvalidArgumentError>([&] { plain.checkpointState(p); }, {"checkpointState", "no state layers"}));

    PageManager manager(checkpointConfig(3, 2, 64), options());
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

// A random run against a model ---------------------------------------------------------------------------------------

//! The header's checkpoint rules, kept apart from the library, for a pool that never evicts a page: the whole-page
//! prefixes registered, the checkpoint slots (the prefix each holds, its count, whether it was restored or made again,
//! when it was made, whether a queued copy fills it, how many read it), the held slots in the clock's order from the
//! hand on, the target, what was dropped for each prefix, each sequence's tokens, source and boundaries, and the queue
//! of copies.
class CheckpointModel
{
public:
    CheckpointModel(int32_t numSlots, int32_t firstSlot, int32_t intervalPages)
        : mSlots(static_cast<size_t>(numSlots))
        , mFirstSlot(firstSlot)
        , mInterval(intervalPages)
        , mTarget(numSlots)
    {
    }

    void create(SequenceId id, int32_t row)
    {
        mSequences[id] = Sequence{{}, row, -1, 0, 0};
    }
    void fork(SequenceId parent, SequenceId child, int32_t row)
    {
        Sequence copy = mSequences.at(parent);
        int32_t const source = copy.source >= 0 ? copy.source : copy.row;
        copy.row = row;
        copy.source = source;
        mSequences[child] = copy;
        queue(source, row);
    }
    void free(SequenceId id)
    {
        Sequence const& sequence = mSequences.at(id);
        if (sequence.source >= 0)
        {
            dropCopyInto(sequence.row);
        }
        mSequences.erase(id);
    }
    int32_t adopt(SequenceId id, Tokens const& prompt)
    {
        Sequence& sequence = mSequences.at(id);
        int32_t const count = static_cast<int32_t>(prompt.size());
        sequence.promptEnd = 0;
        sequence.matchEnd = 0;
        if (count <= kPAGE)
        {
            return 0;
        }
        int32_t const maxPages = (count - 1) / kPAGE;
        int32_t found = 0;
        while (found < maxPages && mRegistered.count(Tokens(prompt.begin(), prompt.begin() + (found + 1) * kPAGE)) > 0)
        {
            ++found;
        }
        bool const read = std::any_of(mQueue.begin(), mQueue.end(),
            [&](std::pair<int32_t, int32_t> const& c) { return c.first == sequence.row; });
        int32_t pages = 0;
        int32_t slot = -1;
        for (int32_t k = found; k > 0 && !read && slot < 0; --k)
        {
            slot = slotOf(Tokens(prompt.begin(), prompt.begin() + k * kPAGE));
            if (slot >= 0 && mSlots[static_cast<size_t>(slot)].filling)
            {
                slot = -1;
            }
            pages = slot >= 0 ? k : 0;
        }
        sequence.promptEnd = maxPages > pages ? maxPages : 0;
        sequence.matchEnd = found > pages ? found : 0;
        if (pages == 0)
        {
            return 0;
        }
        sequence.tokens.assign(prompt.begin(), prompt.begin() + pages * kPAGE);
        if (sequence.source >= 0)
        {
            dropCopyInto(sequence.row);
        }
        Slot& s = mSlots[static_cast<size_t>(slot)];
        s.hits = std::min(s.hits + 1, 3);
        s.hit = true;
        sequence.source = mFirstSlot + slot;
        queue(sequence.source, sequence.row);
        return pages * kPAGE;
    }
    //! A successful step: the queue handed out, then the appends.
    CopyList step(std::vector<std::pair<SequenceId, Tokens>> const& appends)
    {
        for (auto const& [src, dst] : mQueue)
        {
            if (dst >= mFirstSlot)
            {
                mSlots[static_cast<size_t>(dst - mFirstSlot)].filling = false;
            }
            if (src >= mFirstSlot)
            {
                --mSlots[static_cast<size_t>(src - mFirstSlot)].reads;
            }
        }
        for (auto& [id, sequence] : mSequences)
        {
            sequence.source = -1;
        }
        CopyList taken;
        taken.swap(mQueue);
        for (auto const& [id, tokens] : appends)
        {
            Tokens& held = mSequences.at(id).tokens;
            held.insert(held.end(), tokens.begin(), tokens.end());
            for (size_t end = kPAGE; end <= held.size(); end += kPAGE)
            {
                mRegistered.insert(Tokens(held.begin(), held.begin() + static_cast<int64_t>(end)));
            }
        }
        return taken;
    }
    bool checkpoint(SequenceId id)
    {
        Sequence const& sequence = mSequences.at(id);
        if (slotOf(sequence.tokens) >= 0)
        {
            return true;
        }
        int32_t slot = -1;
        for (size_t c = 0; c < mSlots.size() && slot < 0; ++c)
        {
            slot =
                mSlots[c].prefix.empty() && !mSlots[c].filling && mSlots[c].reads == 0 ? static_cast<int32_t>(c) : -1;
        }
        auto const busy = [this](int32_t c)
        { return mSlots[static_cast<size_t>(c)].filling || mSlots[static_cast<size_t>(c)].reads > 0; };
        auto const numNeverHit = [this]
        {
            return static_cast<int32_t>(
                std::count_if(mSlots.begin(), mSlots.end(), [](Slot const& c) { return !c.prefix.empty() && !c.hit; }));
        };
        // While more checkpoints were never restored than the target, the one of them made first goes (none busy).
        if (slot < 0 && numNeverHit() > mTarget)
        {
            for (size_t c = 0; c < mSlots.size(); ++c)
            {
                Slot const& candidate = mSlots[c];
                if (!candidate.prefix.empty() && !candidate.hit && !busy(static_cast<int32_t>(c))
                    && (slot < 0 || candidate.made < mSlots[static_cast<size_t>(slot)].made))
                {
                    slot = static_cast<int32_t>(c);
                }
            }
        }
        // Else the clock: from the hand on, a busy slot is passed, a positive count lowered, the first at 0 reused.
        for (size_t step = 0; slot < 0 && step < mRing.size() * 4; ++step)
        {
            int32_t const at = mRing.front();
            mRing.erase(mRing.begin());
            mRing.push_back(at);
            Slot& s = mSlots[static_cast<size_t>(at)];
            if (busy(at))
            {
                continue;
            }
            if (s.hits > 0)
            {
                --s.hits;
                continue;
            }
            slot = at;
        }
        if (slot >= 0 && !mSlots[static_cast<size_t>(slot)].prefix.empty())
        {
            mDropped[mSlots[static_cast<size_t>(slot)].prefix] = mSlots[static_cast<size_t>(slot)].hit;
            mRing.erase(std::find(mRing.begin(), mRing.end(), slot));
            mSlots[static_cast<size_t>(slot)].prefix.clear();
        }
        if (slot < 0)
        {
            return false;
        }
        Slot& s = mSlots[static_cast<size_t>(slot)];
        // Made again after being dropped: as if restored; the target rises when it had never been, else falls below
        // the checkpoints never restored.
        bool again = false;
        auto const dropped = mDropped.find(sequence.tokens);
        if (dropped != mDropped.end())
        {
            mTarget = !dropped->second ? std::min(mTarget + 1, static_cast<int32_t>(mSlots.size()))
                                       : std::max(std::min(mTarget, numNeverHit()) - 1, 0);
            again = true;
            mDropped.erase(dropped);
        }
        s = Slot{sequence.tokens, 0, again, ++mMade, true, s.reads};
        mRing.push_back(slot);
        queue(sequence.source >= 0 ? sequence.source : sequence.row, mFirstSlot + slot);
        return true;
    }
    int32_t boundary(SequenceId id) const
    {
        Sequence const& sequence = mSequences.at(id);
        auto const length = static_cast<int32_t>(sequence.tokens.size());
        int32_t best = 1 << 30;
        for (int32_t const pages : {sequence.promptEnd, sequence.matchEnd})
        {
            if (pages * kPAGE > length)
            {
                best = std::min(best, pages * kPAGE);
            }
        }
        if (mInterval > 0)
        {
            best = std::min(best, (length / (mInterval * kPAGE) + 1) * mInterval * kPAGE);
        }
        return best <= kMAX_LENGTH ? best : -1;
    }
    CopyList const& queued() const
    {
        return mQueue;
    }
    int32_t held() const
    {
        return static_cast<int32_t>(
            std::count_if(mSlots.begin(), mSlots.end(), [](Slot const& s) { return !s.prefix.empty(); }));
    }
    //! The prefix each checkpoint slot holds (empty: none).
    std::vector<Tokens> prefixes() const
    {
        std::vector<Tokens> result;
        for (Slot const& s : mSlots)
        {
            result.push_back(s.prefix);
        }
        return result;
    }
    Tokens const& tokens(SequenceId id) const
    {
        return mSequences.at(id).tokens;
    }

private:
    struct Slot
    {
        Tokens prefix;
        int32_t hits = 0;
        bool hit = false;
        int64_t made = 0;
        bool filling = false;
        int32_t reads = 0;
    };
    struct Sequence
    {
        Tokens tokens;
        int32_t row = -1;
        int32_t source = -1;
        int32_t promptEnd = 0;
        int32_t matchEnd = 0;
    };
    int32_t slotOf(Tokens const& prefix) const
    {
        for (size_t c = 0; c < mSlots.size(); ++c)
        {
            if (!prefix.empty() && mSlots[c].prefix == prefix)
            {
                return static_cast<int32_t>(c);
            }
        }
        return -1;
    }
    void queue(int32_t src, int32_t dst)
    {
        if (src >= mFirstSlot)
        {
            ++mSlots[static_cast<size_t>(src - mFirstSlot)].reads;
        }
        mQueue.emplace_back(src, dst);
    }
    void dropCopyInto(int32_t row)
    {
        auto const found = std::find_if(
            mQueue.begin(), mQueue.end(), [row](std::pair<int32_t, int32_t> const& c) { return c.second == row; });
        if (found->first >= mFirstSlot)
        {
            --mSlots[static_cast<size_t>(found->first - mFirstSlot)].reads;
        }
        mQueue.erase(found);
        for (auto& [id, sequence] : mSequences)
        {
            sequence.source = sequence.row == row ? -1 : sequence.source;
        }
    }

    std::vector<Slot> mSlots;
    int32_t mFirstSlot;
    int32_t mInterval;
    //! The held slots from the hand on.
    std::vector<int32_t> mRing;
    int32_t mTarget;
    int64_t mMade = 0;
    //! Per prefix whose checkpoint the clock dropped: whether it had been restored (or made again).
    std::map<Tokens, bool> mDropped;
    std::set<Tokens> mRegistered;
    std::map<SequenceId, Sequence> mSequences;
    CopyList mQueue;
};

void randomRun(uint32_t seed, int32_t numSlots, int32_t intervalPages)
{
    SCOPED_TRACE(::testing::Message() << "seed " << seed << ", " << numSlots << " slots, every " << intervalPages);
    constexpr int32_t kBATCH = 4;
    PageManager manager(checkpointConfig(kBATCH, numSlots, 4096), options(intervalPages));
    CheckpointModel model(numSlots, kBATCH, intervalPages);
    std::mt19937 random(seed);
    // Three families of 40 tokens: prompts share their prefixes; suffixes from 2 tokens often coincide too.
    std::vector<Tokens> families;
    for (int32_t f = 0; f < 3; ++f)
    {
        families.push_back(tokensFrom(1000 * (f + 1), 40));
    }
    std::map<SequenceId, Tokens> prompts;
    std::vector<SequenceId> live;
    int64_t hits = 0;
    int64_t saves = 0;
    auto const check = [&]
    {
        ASSERT_EQ(pairsOf(manager.pendingStateCopies()), model.queued());
        ASSERT_EQ(manager.numCheckpoints(), model.held());
        std::vector<Tokens> const prefixes = model.prefixes();
        for (size_t c = 0; c < prefixes.size(); ++c)
        {
            if (!prefixes[c].empty())
            {
                auto const pages = static_cast<int32_t>(prefixes[c].size()) / kPAGE;
                ASSERT_EQ(
                    manager.checkpointSlot(prefixHash(manager, prefixes[c], pages)), kBATCH + static_cast<int32_t>(c));
            }
        }
        manager.checkInvariants();
    };
    for (int32_t op = 0; op < 2500; ++op)
    {
        int32_t const kind = static_cast<int32_t>(random() % 10);
        if (kind < 3 && manager.numSequences() < kBATCH)
        {
            SequenceId id = -1;
            try
            {
                id = manager.create();
            }
            catch (InvalidArgumentError const&)
            {
                continue; // the free rows are held until the next step
            }
            model.create(id, manager.stateSlot(id));
            Tokens prompt = families[random() % families.size()];
            prompt.resize(4 + random() % 37);
            for (auto extra = random() % 13; extra > 0; --extra)
            {
                prompt.push_back(static_cast<int32_t>(random() % 2));
            }
            int32_t const adopted = manager.adoptPrefix(id, prompt.data(), static_cast<int32_t>(prompt.size()));
            ASSERT_EQ(adopted, model.adopt(id, prompt));
            hits += adopted > 0 ? 1 : 0;
            prompts[id] = prompt;
            live.push_back(id);
        }
        else if (kind < 6 && !live.empty())
        {
            // A prefill chunk, or a decoded token past the prompt, ending at the boundary asked for when it comes
            // first; the state saved there.
            SequenceId const id = live[random() % live.size()];
            Tokens const& prompt = prompts.at(id);
            auto const length = static_cast<int32_t>(model.tokens(id).size());
            int32_t const boundary = manager.checkpointBoundary(id);
            ASSERT_EQ(boundary, model.boundary(id));
            int32_t end = length < static_cast<int32_t>(prompt.size())
                ? std::min(static_cast<int32_t>(prompt.size()), length + 1 + static_cast<int32_t>(random() % 16))
                : length + 1;
            end = boundary > length ? std::min(end, boundary) : end;
            if (end > kMAX_LENGTH)
            {
                continue;
            }
            Tokens chunk;
            for (int32_t t = length; t < end; ++t)
            {
                chunk.push_back(t < static_cast<int32_t>(prompt.size()) ? prompt[static_cast<size_t>(t)] : 7);
            }
            SequenceAppend const append{id, chunk.data(), static_cast<int32_t>(chunk.size())};
            ASSERT_EQ(pairsOf(manager.append(append).stateCopies()), model.step({{id, chunk}}));
            if (end == boundary)
            {
                bool const kept = manager.checkpointState(id);
                ASSERT_EQ(kept, model.checkpoint(id));
                saves += kept ? 1 : 0;
            }
        }
        else if (kind < 7 && !live.empty())
        {
            // A save at any whole page the runtime chooses.
            SequenceId const id = live[random() % live.size()];
            auto const length = static_cast<int32_t>(model.tokens(id).size());
            if (length > 0 && length % kPAGE == 0)
            {
                ASSERT_EQ(manager.checkpointState(id), model.checkpoint(id));
            }
        }
        else if (kind < 8 && !live.empty() && manager.numSequences() < kBATCH)
        {
            SequenceId const parent = live[random() % live.size()];
            SequenceId child = -1;
            try
            {
                child = manager.fork(parent);
            }
            catch (InvalidArgumentError const&)
            {
                continue;
            }
            model.fork(parent, child, manager.stateSlot(child));
            prompts[child] = prompts.at(parent);
            live.push_back(child);
        }
        else if (kind < 9 && !live.empty())
        {
            size_t const index = random() % live.size();
            manager.free(live[index]);
            model.free(live[index]);
            live.erase(live.begin() + static_cast<int64_t>(index));
        }
        else
        {
            ASSERT_EQ(pairsOf(manager.step(nullptr, 0).stateCopies()), model.step({}));
        }
        check();
        if (::testing::Test::HasFatalFailure())
        {
            return;
        }
    }
    // The run must have exercised what it checks.
    EXPECT_GT(hits, 20);
    EXPECT_GT(saves, 20);
    EXPECT_EQ(manager.stats().evictedPages, 0);
    EXPECT_EQ(manager.stats().checkpointsRestored, hits);
}

TEST(StateCheckpoints, RandomRunsFollowTheModel)
{
    for (uint32_t seed = 1; seed <= 3; ++seed)
    {
        randomRun(seed, 3, 0);
        randomRun(seed + 100, 1, 2);
        randomRun(seed + 200, 8, 5);
    }
}

} // namespace
} // namespace kvcache::rt
