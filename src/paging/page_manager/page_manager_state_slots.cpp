// State slots of a layout with state layers (the "State slots" paragraph of page_manager.h): a sequence's slot is its
// row, so slots need no list of their own; what is kept here is the state copies forks queue for the next step, and
// the rows held back while those copies read them.
#include "paging/page_manager/page_manager_state.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvcache::rt
{

void PageManager::State::queueForkCopy(int32_t parentRow, int32_t row) noexcept
{
    // A parent whose own copy has not run yet has its state in that copy's source: read from there, so that no copy
    // reads a slot a queued copy fills.
    int32_t const parentSource = sequences[parentRow].stateSource;
    int32_t const source = parentSource >= 0 ? parentSource : parentRow;
    sequences[row].stateSource = source;
    int32_t const checkpoint = checkpoints.indexOfSlot(source);
    if (checkpoint >= 0)
    {
        ++checkpoints.slots[static_cast<size_t>(checkpoint)].reads;
    }
    // Reserved for maxSequences + numCheckpointSlots: each copy fills a distinct live row or checkpoint slot.
    pendingStateCopies.push_back(StateSlotCopy{source, row});
}

void PageManager::State::dropCopyInto(int32_t row) noexcept
{
    auto const found = std::find_if(pendingStateCopies.begin(), pendingStateCopies.end(),
        [row](StateSlotCopy const& copy) { return copy.dst == row; });
    if (found != pendingStateCopies.end())
    {
        int32_t const checkpoint = checkpoints.indexOfSlot(found->src);
        if (checkpoint >= 0)
        {
            --checkpoints.slots[static_cast<size_t>(checkpoint)].reads;
        }
        pendingStateCopies.erase(found);
    }
    sequences[row].stateSource = -1;
}

bool PageManager::State::freeState(int32_t row) noexcept
{
    if (sequences[row].stateSource >= 0)
    {
        // A waiting child: nothing reads its slot (forks and checkpoints of it read its source), so its copy goes and
        // the row is free.
        dropCopyInto(row);
        return false;
    }
    return std::any_of(pendingStateCopies.begin(), pendingStateCopies.end(),
        [row](StateSlotCopy const& copy) { return copy.src == row; });
}

void PageManager::State::takeStateCopies() noexcept
{
    for (StateSlotCopy const& copy : pendingStateCopies)
    {
        int32_t const target = checkpoints.indexOfSlot(copy.dst);
        if (target >= 0)
        {
            checkpoints.slots[static_cast<size_t>(target)].filling = false;
        }
        else
        {
            sequences[copy.dst].stateSource = -1;
        }
        int32_t const read = checkpoints.indexOfSlot(copy.src);
        if (read >= 0)
        {
            --checkpoints.slots[static_cast<size_t>(read)].reads;
        }
    }
    // Both reserved alike: the swap moves no element and keeps the capacities.
    stateCopies.swap(pendingStateCopies);
    pendingStateCopies.clear();
    // The copies that read the held rows run before this step's kernels: their slots may serve new sequences now.
    sequences.returnHeldRows();
}

void PageManager::State::checkSlotInvariants() const
{
    auto const fail = [](std::string const& message) { throw std::logic_error("PageManager invariant: " + message); };
    int32_t const maxSequences = sequences.maxSequences();
    // 0: alive (or not seen), 1: free, 2: held.
    std::vector<uint8_t> state(static_cast<size_t>(maxSequences), 0);
    auto const mark = [&](std::vector<int32_t> const& rows, uint8_t value, char const* what)
    {
        for (int32_t const row : rows)
        {
            if (row < 0 || row >= maxSequences || state[static_cast<size_t>(row)] != 0 || sequences[row].alive)
            {
                fail(fmt::format("{} row (state slot) {} is out of range, listed twice or alive", what, row));
            }
            state[static_cast<size_t>(row)] = value;
        }
    };
    mark(sequences.freeRows(), 1, "free");
    mark(sequences.heldRows(), 2, "held");
    int32_t const listed = static_cast<int32_t>(sequences.freeRows().size() + sequences.heldRows().size());
    if (listed != maxSequences - sequences.numSequences())
    {
        fail(fmt::format("{} rows are free or held and {} sequences alive; maxSequences is {}", listed,
            sequences.numSequences(), maxSequences));
    }
    // A live row's slot is its own, so slots are distinct. A copy fills a waiting child (a fork or a restore) from a
    // live sequence's slot, a held one or a checkpoint's, or a checkpoint slot (a save) from a sequence's; never from
    // a slot a copy fills: the list may run in any order.
    int32_t const numSlots = checkpoints.firstSlot + checkpoints.size();
    auto const inRange = [&](int32_t slot)
    { return (slot >= 0 && slot < maxSequences) || checkpoints.indexOfSlot(slot) >= 0; };
    std::vector<uint8_t> fills(static_cast<size_t>(std::max(numSlots, maxSequences)), 0);
    int32_t intoRows = 0;
    for (size_t c = 0; c < pendingStateCopies.size(); ++c)
    {
        StateSlotCopy const copy = pendingStateCopies[c];
        if (!stateSlots || !inRange(copy.src) || !inRange(copy.dst))
        {
            fail(fmt::format("queued state copy {} ({} -> {}) is out of range or the layout has no state layers", c,
                copy.src, copy.dst));
        }
        if (fills[static_cast<size_t>(copy.dst)]++ != 0)
        {
            fail(fmt::format("two queued state copies fill slot {}", copy.dst));
        }
        intoRows += copy.dst < maxSequences ? 1 : 0;
    }
    for (size_t c = 0; c < pendingStateCopies.size(); ++c)
    {
        StateSlotCopy const copy = pendingStateCopies[c];
        int32_t const fromCheckpoint = checkpoints.indexOfSlot(copy.src);
        int32_t const intoCheckpoint = checkpoints.indexOfSlot(copy.dst);
        bool const sourceOk = fromCheckpoint >= 0
            ? checkpoints.slots[static_cast<size_t>(fromCheckpoint)].pages > 0
            : sequences[copy.src].alive || state[static_cast<size_t>(copy.src)] == 2;
        bool const targetOk = intoCheckpoint >= 0
            ? fromCheckpoint < 0
            : sequences[copy.dst].alive && sequences[copy.dst].stateSource == copy.src;
        if (!sourceOk || !targetOk || fills[static_cast<size_t>(copy.src)] != 0)
        {
            fail(fmt::format("queued state copy {} ({} -> {}) fills a free slot, disagrees with the child's source, "
                             "reads a slot a copy fills or that is free, or copies a checkpoint into a checkpoint",
                c, copy.src, copy.dst));
        }
    }
    int32_t waiting = 0;
    for (int32_t row = 0; row < maxSequences; ++row)
    {
        waiting += sequences[row].alive && sequences[row].stateSource >= 0 ? 1 : 0;
    }
    // Each waiting child has one copy: the copies into rows fill distinct slots.
    if (waiting != intoRows)
    {
        fail(fmt::format(
            "{} sequences wait for a state copy; {} copies into their slots are queued", waiting, intoRows));
    }
    if (!pendingStateCopies.empty() || !sequences.heldRows().empty())
    {
        if (!stateSlots)
        {
            fail("state copies are queued or rows held without state layers");
        }
    }
}

std::vector<StateSlotCopy> const& StepCopies::stateCopies() const noexcept
{
    static std::vector<StateSlotCopy> const kNONE;
    return mStateCopies != nullptr ? *mStateCopies : kNONE;
}

int32_t PageManager::stateSlot(SequenceId sequence) const
{
    int32_t const row = mState->sequences.rowOf(sequence, "stateSlot");
    return mState->stateSlots ? row : -1;
}

void PageManager::stateSlots(SequenceId const* sequenceIds, int32_t count, int32_t* out) const
{
    State const& s = *mState;
    if (count < 0)
    {
        throw InvalidArgumentError(fmt::format("PageManager::stateSlots: count is {}; it must be >= 0", count));
    }
    if (count > 0 && (sequenceIds == nullptr || out == nullptr))
    {
        throw InvalidArgumentError(fmt::format(
            "PageManager::stateSlots: sequences or out is null with count {}; both must point to count values", count));
    }
    for (int32_t i = 0; i < count; ++i)
    {
        if (s.sequences.findRow(sequenceIds[i]) < 0)
        {
            throw InvalidArgumentError(fmt::format("PageManager::stateSlots: sequences[{}] is {}, unknown (never "
                                                   "created, or freed already); it must be a live sequence",
                i, sequenceIds[i]));
        }
    }
    for (int32_t i = 0; i < count; ++i)
    {
        out[i] = s.stateSlots ? SequenceTable::rowOfLive(sequenceIds[i]) : -1;
    }
}

std::vector<StateSlotCopy> const& PageManager::pendingStateCopies() const noexcept
{
    return mState->pendingStateCopies;
}

} // namespace kvcache::rt
