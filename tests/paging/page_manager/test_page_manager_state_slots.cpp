// Host tests of the state slots of a PageManager whose layout has state layers (the "State slots" paragraph of
// kvcache/paging/page_manager.h): the slot order worked out by hand, the fork copies queued and handed out by the next
// step, a random run against a small model of the header's rules written here, and misuse refused with nothing
// changed. The random run also moves a value per slot through the copies, as a runtime moves the states, and checks
// that every sequence ends up reading its own history whatever slots it went through.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/paging/page_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
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

using CopyList = std::vector<std::pair<int32_t, int32_t>>;

//! A Mamba2-like state layer: a conv state and an SSM state.
std::vector<StateLayerConfig> stateLayers()
{
    return {StateLayerConfig{
        {StateTensorConfig{"conv", {8, 3}, DataType::kHALF}, StateTensorConfig{"ssm", {2, 4, 4}, DataType::kFLOAT}}}};
}

//! One full-attention layer, 4 tokens a page, 64 tokens a sequence, `maxBatchSize` sequences, one state layer and 2
//! checkpoint slots (none without state layers).
KVCacheConfig slotConfig(int32_t maxBatchSize, bool withState = true)
{
    ConfigBuilder builder({{1, 8}});
    builder.maxBatchSize(maxBatchSize).maxSequenceLength(64).tokensPerPage(4).maxTokensPerStep(4);
    if (withState)
    {
        builder.stateLayers(stateLayers()).numCheckpointSlots(2);
    }
    return builder;
}

PageManagerOptions options(int32_t maxSequences = 0)
{
    return test::seededOptions(maxSequences, 3);
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

//! Appends one token to each of `sequences` in one step and returns its state copies.
CopyList stepOne(PageManager& manager, std::vector<SequenceId> const& sequences, int32_t token = 1)
{
    std::vector<SequenceAppend> appends;
    for (SequenceId const id : sequences)
    {
        appends.push_back(SequenceAppend{id, &token, 1});
    }
    return pairsOf(manager.step(appends.data(), static_cast<int32_t>(appends.size())).stateCopies());
}

//! Creates a sequence and expects it to be handed state slot `slot`.
SequenceId createInSlot(PageManager& manager, int32_t slot)
{
    SequenceId const id = manager.create();
    EXPECT_EQ(manager.stateSlot(id), slot) << "sequence " << id;
    return id;
}

TEST(StateSlots, HandedOutInOrderAndReused)
{
    PageManager manager(slotConfig(4), options());
    ASSERT_EQ(manager.layout().numStateSlots, 6); // 4 sequences + 2 checkpoints
    SequenceId const a = createInSlot(manager, 0);
    SequenceId const b = createInSlot(manager, 1);
    SequenceId const c = createInSlot(manager, 2);
    manager.free(b);
    manager.free(a);
    // The most recently freed first: a's slot, then b's, then the unused 3.
    SequenceId const d = createInSlot(manager, 0);
    SequenceId const e = createInSlot(manager, 1);
    SequenceId const f = createInSlot(manager, 3);
    // Checkpoint slots 4 and 5 are never handed out: all four sequence slots are taken.
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { manager.create(); }, {"create", "maxSequences is 4"}));
    std::vector<SequenceId> const batch = {f, c, d, e};
    std::vector<int32_t> table(4, -7);
    manager.stateSlots(batch.data(), 4, table.data());
    EXPECT_EQ(table, (std::vector<int32_t>{3, 2, 0, 1}));
    manager.checkInvariants();
}

TEST(StateSlots, ForkQueuesACopyTheNextStepHandsOut)
{
    PageManager manager(slotConfig(4), options());
    SequenceId const a = manager.create();
    EXPECT_TRUE(stepOne(manager, {a}).empty());
    SequenceId const b = manager.fork(a);
    EXPECT_EQ(manager.stateSlot(b), 1);
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{0, 1}}));
    // The fork shares pages and copies no page: the state copy is the only one.
    StepCopies const copies = manager.step(nullptr, 0);
    EXPECT_TRUE(copies.empty());
    EXPECT_EQ(copies.size(), 0);
    EXPECT_EQ(pairsOf(copies.stateCopies()), (CopyList{{0, 1}}));
    EXPECT_EQ(pairsOf(manager.lastCopies().stateCopies()), (CopyList{{0, 1}}));
    EXPECT_TRUE(manager.pendingStateCopies().empty());
    manager.checkInvariants();
    // Handed out once: the next step has none.
    EXPECT_TRUE(stepOne(manager, {a, b}).empty());
    EXPECT_TRUE(manager.lastCopies().stateCopies().empty());
}

TEST(StateSlots, ForkOfAWaitingChildReadsItsSource)
{
    PageManager manager(slotConfig(4), options());
    SequenceId const a = manager.create();
    SequenceId const b = manager.fork(a); // slot 1 from 0
    SequenceId const c = manager.fork(b); // b's state is still in slot 0
    SequenceId const d = manager.fork(c); // and c's too
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{0, 1}, {0, 2}, {0, 3}}));
    manager.checkInvariants();
    // Freeing a waiting child drops its copy only.
    manager.free(c);
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{0, 1}, {0, 3}}));
    manager.checkInvariants();
    EXPECT_EQ(stepOne(manager, {b, d}), (CopyList{{0, 1}, {0, 3}}));
    // Once handed out, a fork of b reads b's own slot.
    SequenceId const e = manager.fork(b);
    EXPECT_EQ(manager.stateSlot(e), 2);
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{1, 2}}));
    manager.checkInvariants();
}

TEST(StateSlots, AFreedSlotAQueuedCopyReadsIsHeldUntilTheStep)
{
    PageManager manager(slotConfig(4), options());
    SequenceId const a = manager.create();
    SequenceId const b = manager.create();
    SequenceId const c = manager.fork(a); // slot 2 from 0
    manager.free(a);                      // the copy still reads slot 0: held
    SequenceId const d = manager.fork(b); // slot 3, not the held 0
    EXPECT_EQ(manager.stateSlot(c), 2);
    EXPECT_EQ(manager.stateSlot(d), 3);
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{0, 2}, {1, 3}}));
    EXPECT_EQ(manager.numSequences(), 3);
    manager.checkInvariants();
    // One row is free by count, but it is held.
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { manager.create(); }, {"create", "3 sequences are alive", "1 rows", "held until the next step"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { manager.fork(b); }, {"fork", "held"}));
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{0, 2}, {1, 3}}));
    manager.checkInvariants();
    EXPECT_EQ(stepOne(manager, {c, d}), (CopyList{{0, 2}, {1, 3}}));
    // The step ran the copies that read slot 0: it is free again.
    createInSlot(manager, 0);
    manager.checkInvariants();
}

TEST(StateSlots, HeldSlotsComeBackInTheOrderFreed)
{
    PageManager manager(slotConfig(6), options());
    SequenceId const a = manager.create();
    SequenceId const b = manager.create();
    SequenceId const c = manager.create();
    manager.fork(a); // 3 from 0
    manager.fork(c); // 4 from 2
    manager.free(c); // held
    manager.free(b); // free: nothing reads it
    manager.free(a); // held
    manager.checkInvariants();
    createInSlot(manager, 1);
    manager.step(nullptr, 0);
    // Held 2 then 0 went on the free slots in that order: 0 is the most recently freed.
    createInSlot(manager, 0);
    createInSlot(manager, 2);
    createInSlot(manager, 5);
    manager.checkInvariants();
}

TEST(StateSlots, WithoutStateLayersThereAreNone)
{
    // Without state layers maxSequences may exceed maxBatchSize, every slot is -1 and forks queue nothing.
    PageManager manager(slotConfig(2, false), options(5));
    EXPECT_EQ(manager.layout().numStateSlots, 0);
    SequenceId const a = manager.create();
    SequenceId const b = manager.fork(a);
    SequenceId const c = manager.fork(b);
    EXPECT_EQ(manager.stateSlot(c), -1);
    std::vector<SequenceId> const batch = {a, b, c};
    std::vector<int32_t> table(3, 9);
    manager.stateSlots(batch.data(), 3, table.data());
    EXPECT_EQ(table, (std::vector<int32_t>{-1, -1, -1}));
    EXPECT_TRUE(manager.pendingStateCopies().empty());
    EXPECT_TRUE(stepOne(manager, {a, b, c}).empty());
    manager.checkInvariants();
}

TEST(StateSlots, ConstructionRefusesMoreSequencesThanSlots)
{
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { PageManager manager(slotConfig(3), options(4)); },
        {"maxSequences is 4", "state layers", "maxBatchSize 3"}));
    PageManager fewer(slotConfig(3), options(2));
    EXPECT_EQ(fewer.maxSequences(), 2);
    KVCacheLayout layout = computeLayout(slotConfig(3));
    layout.numStateSlots = 2;
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { PageManager manager(layout, options()); }, {"numStateSlots 2", "maxBatchSize 3"}));
}

TEST(StateSlots, MisuseIsRefusedAndChangesNothing)
{
    PageManager manager(slotConfig(3), options());
    SequenceId const a = manager.create();
    SequenceId const b = manager.fork(a);
    SequenceId const gone = manager.create();
    manager.free(gone);
    CopyList const queued = pairsOf(manager.pendingStateCopies());
    ASSERT_EQ(queued, (CopyList{{0, 1}}));

    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { manager.stateSlot(gone); }, {"stateSlot", std::to_string(gone), "unknown"}));
    std::vector<SequenceId> const batch = {a, b, gone};
    std::vector<int32_t> table(3, 9);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { manager.stateSlots(batch.data(), 3, table.data()); },
        {"stateSlots", "sequences[2]", std::to_string(gone)}));
    EXPECT_EQ(table, (std::vector<int32_t>{9, 9, 9})); // untouched
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { manager.stateSlots(batch.data(), -1, table.data()); }, {"stateSlots", "count is -1"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { manager.stateSlots(batch.data(), 2, nullptr); }, {"stateSlots", "null", "count 2"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { manager.stateSlots(nullptr, 1, table.data()); }, {"stateSlots", "null", "count 1"}));
    manager.stateSlots(nullptr, 0, nullptr); // nothing to write

    // A rejected step hands nothing out; the copies stay queued for the next one.
    int32_t const token = 5;
    std::vector<SequenceAppend> const badStep = {{a, &token, 1}, {gone, &token, 1}};
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { manager.step(badStep.data(), 2); }, {"unknown"}));
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), queued);
    EXPECT_TRUE(manager.lastCopies().stateCopies().empty());
    // A fork or free refused changes neither the slots nor the queue.
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { manager.fork(gone); }, {"fork", "unknown"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { manager.free(gone); }, {"free", "unknown"}));
    SequenceId const c = manager.fork(a);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { manager.fork(a); }, {"fork", "maxSequences is 3"}));
    EXPECT_EQ(pairsOf(manager.pendingStateCopies()), (CopyList{{0, 1}, {0, 2}}));
    EXPECT_EQ(manager.stateSlot(c), 2);
    EXPECT_EQ(manager.numSequences(), 3);
    manager.checkInvariants();
    EXPECT_EQ(stepOne(manager, {a}, token), (CopyList{{0, 1}, {0, 2}}));
}

//! The header's slot rules, kept apart from the library: free slots on a stack (back() taken first), slots held until
//! the next step, each live sequence's slot and the slot its queued copy reads, the queue in order.
class SlotModel
{
public:
    explicit SlotModel(int32_t maxSequences)
    {
        for (int32_t slot = maxSequences - 1; slot >= 0; --slot)
        {
            mFree.push_back(slot);
        }
    }
    bool full() const
    {
        return mFree.empty();
    }
    void create(SequenceId id)
    {
        mSlot[id] = take();
    }
    void fork(SequenceId parent, SequenceId child)
    {
        auto const waiting = mSource.find(parent);
        int32_t const source = waiting != mSource.end() ? waiting->second : mSlot.at(parent);
        mSlot[child] = take();
        mSource[child] = source;
        mQueue.emplace_back(source, mSlot[child]);
    }
    void free(SequenceId id)
    {
        int32_t const slot = mSlot.at(id);
        mSlot.erase(id);
        if (mSource.erase(id) > 0)
        {
            mQueue.erase(std::find_if(mQueue.begin(), mQueue.end(),
                [slot](std::pair<int32_t, int32_t> const& copy) { return copy.second == slot; }));
            mFree.push_back(slot);
            return;
        }
        bool const read = std::any_of(mQueue.begin(), mQueue.end(),
            [slot](std::pair<int32_t, int32_t> const& copy) { return copy.first == slot; });
        (read ? mHeld : mFree).push_back(slot);
    }
    //! A successful step: returns the queue and empties it; the held slots become free, oldest first.
    CopyList step()
    {
        CopyList taken;
        taken.swap(mQueue);
        mSource.clear();
        mFree.insert(mFree.end(), mHeld.begin(), mHeld.end());
        mHeld.clear();
        return taken;
    }
    int32_t slot(SequenceId id) const
    {
        return mSlot.at(id);
    }
    CopyList const& queue() const
    {
        return mQueue;
    }

private:
    int32_t take()
    {
        int32_t const slot = mFree.back();
        mFree.pop_back();
        return slot;
    }
    std::vector<int32_t> mFree;
    std::vector<int32_t> mHeld;
    std::map<SequenceId, int32_t> mSlot;
    std::map<SequenceId, int32_t> mSource;
    CopyList mQueue;
};

//! A random run: creates, forks, frees and steps of random batches, each checked against SlotModel, with one value
//! per slot moved as a runtime moves states: a step's copies run last to first (any order must do), then each new
//! sequence's slot is set to 0, then each stepped sequence's value becomes value * 31 + token. Every sequence must then
//! read its own history (its parent's at the fork, then its own tokens), however its slots were reused.
void randomRun(uint32_t seed, int32_t maxBatchSize, int32_t maxSequences)
{
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    PageManager manager(slotConfig(maxBatchSize), options(maxSequences));
    SlotModel model(manager.maxSequences());
    std::mt19937 random(seed);
    std::vector<uint64_t> slotValue(static_cast<size_t>(manager.layout().numStateSlots), 0xdeadU);
    std::map<SequenceId, uint64_t> history;
    std::vector<SequenceId> live;
    std::vector<SequenceId> fresh; // created since the last step: the runtime sets their state after the copies
    int64_t copiesSeen = 0;
    int64_t heldRefusals = 0; // refused while fewer than maxSequences were alive: the rest held
    for (int32_t op = 0; op < 3000; ++op)
    {
        int32_t const kind = static_cast<int32_t>(random() % 10);
        if (kind < 4 && model.full() && !live.empty())
        {
            // No free slot (every row alive, or the rest held): refused, nothing changed.
            int32_t const alive = manager.numSequences();
            heldRefusals += alive < manager.maxSequences() ? 1 : 0;
            ASSERT_THROW(kind < 2 ? manager.create() : manager.fork(live.front()), InvalidArgumentError);
            ASSERT_EQ(manager.numSequences(), alive);
        }
        else if (kind < 2)
        {
            SequenceId const id = manager.create();
            model.create(id);
            live.push_back(id);
            fresh.push_back(id);
            history[id] = 0;
        }
        else if (kind < 4 && !live.empty())
        {
            SequenceId const parent = live[random() % live.size()];
            if (manager.length(parent) < 60)
            {
                SequenceId const child = manager.fork(parent);
                model.fork(parent, child);
                live.push_back(child);
                history[child] = history.at(parent);
                // A fork of a sequence not stepped yet is new too: its state is set after the copies.
                if (std::find(fresh.begin(), fresh.end(), parent) != fresh.end())
                {
                    fresh.push_back(child);
                }
            }
        }
        else if (kind < 6 && !live.empty())
        {
            size_t const index = random() % live.size();
            SequenceId const id = live[index];
            manager.free(id);
            model.free(id);
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
            fresh.erase(std::remove(fresh.begin(), fresh.end(), id), fresh.end());
            history.erase(id);
        }
        else
        {
            std::vector<SequenceId> batch;
            for (SequenceId const id : live)
            {
                if (random() % 2 == 0 && manager.length(id) < 60)
                {
                    batch.push_back(id);
                }
            }
            std::vector<int32_t> tokens(batch.size());
            std::vector<SequenceAppend> appends;
            for (size_t i = 0; i < batch.size(); ++i)
            {
                tokens[i] = static_cast<int32_t>(random() % 1000);
                appends.push_back(SequenceAppend{batch[i], &tokens[i], 1});
            }
            if (!manager.canStep(appends.data(), static_cast<int32_t>(appends.size())))
            {
                continue;
            }
            CopyList const copies =
                pairsOf(manager.step(appends.data(), static_cast<int32_t>(appends.size())).stateCopies());
            ASSERT_EQ(copies, model.step()) << "op " << op;
            copiesSeen += static_cast<int64_t>(copies.size());
            for (auto copy = copies.rbegin(); copy != copies.rend(); ++copy)
            {
                slotValue[static_cast<size_t>(copy->second)] = slotValue[static_cast<size_t>(copy->first)];
            }
            for (SequenceId const id : fresh)
            {
                slotValue[static_cast<size_t>(manager.stateSlot(id))] = 0;
            }
            fresh.clear();
            std::vector<int32_t> table(batch.size());
            manager.stateSlots(batch.data(), static_cast<int32_t>(batch.size()), table.data());
            for (size_t i = 0; i < batch.size(); ++i)
            {
                uint64_t& value = slotValue[static_cast<size_t>(table[i])];
                value = value * 31 + static_cast<uint64_t>(tokens[i]);
                history[batch[i]] = history[batch[i]] * 31 + static_cast<uint64_t>(tokens[i]);
            }
            for (SequenceId const id : live)
            {
                ASSERT_EQ(slotValue[static_cast<size_t>(manager.stateSlot(id))], history.at(id))
                    << "op " << op << " sequence " << id;
            }
        }
        ASSERT_EQ(pairsOf(manager.pendingStateCopies()), model.queue()) << "op " << op;
        for (SequenceId const id : live)
        {
            ASSERT_EQ(manager.stateSlot(id), model.slot(id)) << "op " << op;
            ASSERT_LT(manager.stateSlot(id), maxBatchSize);
        }
        manager.checkInvariants();
    }
    // The run must have exercised the copies.
    EXPECT_GT(copiesSeen, 50);
    EXPECT_GT(heldRefusals, 0);
}

TEST(StateSlots, RandomOperationsAgainstAModel)
{
    for (uint32_t seed = 1; seed <= 6; ++seed)
    {
        randomRun(seed, 6, 0);
        randomRun(seed + 100, 8, 5); // fewer sequences than slots
    }
}

} // namespace
} // namespace kvcache::rt
