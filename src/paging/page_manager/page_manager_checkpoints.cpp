// State checkpoints of a layout with state layers (state_checkpoints.h, the "State checkpoints" paragraph of
// page_manager.h): which prefix adoptPrefix() can serve with a checkpoint, the restore it queues, the saves
// checkpointState() queues, the boundaries checkpointBoundary() asks for, the clock that reuses slots, and their
// invariants.
#include "paging/page_manager/page_manager_state.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace kvcache::rt
{

void PageManager::State::setUpCheckpoints()
{
    checkpoints.intervalPages = options.checkpointIntervalPages;
    if (!stateSlots || layout.numCheckpointSlots <= 0 || !options.enablePrefixCaching)
    {
        return;
    }
    int32_t carrier = 0;
    for (int32_t g = numGroups() - 1; g >= 0; --g)
    {
        carrier = policies[static_cast<size_t>(g)].windowed() ? carrier : g;
    }
    checkpoints.carrierGroup = carrier;
    checkpoints.firstSlot = layout.maxBatchSize;
    checkpoints.slots.assign(static_cast<size_t>(layout.numCheckpointSlots), StateCheckpoints::Slot{});
    checkpoints.kept = KeptBoundaries(layout.numCheckpointSlots, pools[static_cast<size_t>(carrier)].pages.numPages());
    checkpoints.byCarrier.assign(static_cast<size_t>(pools[static_cast<size_t>(carrier)].pages.numPages()), -1);
}

int32_t PageManager::State::checkpointedPages(int32_t pages, int32_t& index) const
{
    index = -1;
    int32_t const carrier = checkpoints.carrierGroup;
    bool const carrierWindowed = policies[static_cast<size_t>(carrier)].windowed();
    auto const groups = static_cast<size_t>(numGroups());
    for (int32_t k = pages; k > 0; --k)
    {
        // adoptPrefix() looked the full-attention pages up already; a windowed carrier's are looked up here.
        int32_t const page = carrierWindowed
            ? prefix.find(carrier, promptHashes[static_cast<size_t>(k - 1)])
            : promptPages[static_cast<size_t>(k - 1) * groups + static_cast<size_t>(carrier)];
        if (page == PageHashTable::kNONE_PAGE)
        {
            continue;
        }
        int32_t const found = checkpoints.byCarrier[static_cast<size_t>(page)];
        if (found >= 0 && checkpoints.adoptable(found) && windowedServes(k))
        {
            index = found;
            return k;
        }
    }
    return 0;
}

void PageManager::State::restoreCheckpoint(int32_t row, int32_t index) noexcept
{
    StateCheckpoints::Slot& slot = checkpoints.slots[static_cast<size_t>(index)];
    // A fork child still waiting for its parent's state gets the checkpoint's instead: one copy fills its slot. A
    // restore replaced (adoptRun extending adoptPrefix's prefix) counts once: the adoption restores one state.
    if (sequences[row].stateSource >= 0)
    {
        checkpoints.restored -= checkpoints.indexOfSlot(sequences[row].stateSource) >= 0 ? 1 : 0;
        dropCopyInto(row);
    }
    int32_t const source = checkpoints.firstSlot + index;
    sequences[row].stateSource = source;
    ++slot.reads;
    checkpoints.kept.hit(index);
    ++checkpoints.restored;
    // Reserved for maxSequences + numCheckpointSlots copies: this one fills a live row.
    pendingStateCopies.push_back(StateSlotCopy{source, row});
}

int32_t PageManager::State::takeCheckpointSlot() noexcept
{
    int32_t const size = checkpoints.size();
    if (checkpoints.held < size)
    {
        for (int32_t c = 0; c < size; ++c)
        {
            StateCheckpoints::Slot const& slot = checkpoints.slots[static_cast<size_t>(c)];
            if (slot.pages == 0 && !slot.filling && slot.reads == 0)
            {
                return c;
            }
        }
    }
    int32_t const c = checkpoints.kept.choose(
        [&](int32_t index)
        {
            StateCheckpoints::Slot const& slot = checkpoints.slots[static_cast<size_t>(index)];
            return slot.filling || slot.reads > 0;
        },
        [&](int32_t index) { return checkpoints.slots[static_cast<size_t>(index)].carrier; });
    if (c >= 0)
    {
        dropCheckpoint(c);
    }
    return c;
}

void PageManager::State::dropCheckpoint(int32_t index) noexcept
{
    StateCheckpoints::Slot& slot = checkpoints.slots[static_cast<size_t>(index)];
    checkpoints.byCarrier[static_cast<size_t>(slot.carrier)] = -1;
    slot.pages = 0;
    slot.hash = {};
    slot.carrier = -1;
    checkpoints.kept.remove(index);
    --checkpoints.held;
    ++checkpoints.dropped;
}

bool PageManager::State::checkpointState(int32_t row)
{
    SequenceState const& sequence = sequences[row];
    if (!stateSlots)
    {
        throw InvalidArgumentError(
            "PageManager::checkpointState: the layout has no state layers; there is no state to checkpoint");
    }
    if (sequence.length == 0 || (sequence.length & pageMask) != 0)
    {
        throw InvalidArgumentError(fmt::format("PageManager::checkpointState: sequence {} has {} tokens; it must hold "
                                               "whole pages of {} tokens, at least one",
            sequences.idOf(row), sequence.length, tokensPerPage));
    }
    if (!checkpoints.enabled())
    {
        return false;
    }
    int32_t const carrier = prefix.find(checkpoints.carrierGroup, sequence.lastHash);
    if (carrier == PageHashTable::kNONE_PAGE)
    {
        return false;
    }
    if (checkpoints.byCarrier[static_cast<size_t>(carrier)] >= 0)
    {
        return true;
    }
    int32_t const index = takeCheckpointSlot();
    if (index < 0)
    {
        return false;
    }
    StateCheckpoints::Slot& slot = checkpoints.slots[static_cast<size_t>(index)];
    slot.pages = sequence.length >> pageShift;
    slot.hash = sequence.lastHash;
    slot.carrier = carrier;
    slot.filling = true;
    checkpoints.kept.add(index, carrier);
    checkpoints.byCarrier[static_cast<size_t>(carrier)] = index;
    ++checkpoints.held;
    ++checkpoints.saved;
    // The state is where a queued copy into the sequence's slot reads it, when there is one (as fork() reads it).
    int32_t const source = sequence.stateSource >= 0 ? sequence.stateSource : row;
    int32_t const read = checkpoints.indexOfSlot(source);
    if (read >= 0)
    {
        ++checkpoints.slots[static_cast<size_t>(read)].reads;
    }
    // Reserved for maxSequences + numCheckpointSlots copies: this one fills a checkpoint slot no queued copy fills.
    pendingStateCopies.push_back(StateSlotCopy{source, checkpoints.firstSlot + index});
    return true;
}

int32_t PageManager::State::checkpointBoundary(int32_t row) const
{
    if (!checkpoints.enabled())
    {
        return -1;
    }
    SequenceState const& sequence = sequences[row];
    int64_t best = std::numeric_limits<int64_t>::max();
    for (int32_t const pages : {sequence.promptBoundary, sequence.matchBoundary})
    {
        int64_t const end = int64_t{pages} << pageShift;
        if (end > sequence.length)
        {
            best = std::min(best, end);
        }
    }
    if (checkpoints.intervalPages > 0)
    {
        int64_t const every = int64_t{checkpoints.intervalPages} << pageShift;
        best = std::min(best, (sequence.length / every + 1) * every);
    }
    return best <= maxSequenceLength ? static_cast<int32_t>(best) : -1;
}

namespace
{

[[noreturn]] void fail(std::string const& message)
{
    throw std::logic_error("PageManager invariant: " + message);
}

} // namespace

void PageManager::State::checkCheckpointInvariants() const
{
    if (!checkpoints.enabled())
    {
        if (checkpoints.size() != 0 || checkpoints.held != 0)
        {
            fail("checkpoints are held without state layers, checkpoint slots and prefix caching");
        }
        return;
    }
    // Reads and fills recounted from the queued copies.
    std::vector<int32_t> reads(static_cast<size_t>(checkpoints.size()), 0);
    std::vector<uint8_t> fills(static_cast<size_t>(checkpoints.size()), 0);
    for (StateSlotCopy const& copy : pendingStateCopies)
    {
        int32_t const read = checkpoints.indexOfSlot(copy.src);
        int32_t const target = checkpoints.indexOfSlot(copy.dst);
        if (read >= 0)
        {
            ++reads[static_cast<size_t>(read)];
        }
        if (target >= 0)
        {
            fills[static_cast<size_t>(target)] = 1;
        }
    }
    int32_t held = 0;
    int32_t const carrier = checkpoints.carrierGroup;
    for (int32_t c = 0; c < checkpoints.size(); ++c)
    {
        StateCheckpoints::Slot const& slot = checkpoints.slots[static_cast<size_t>(c)];
        int32_t const hits = checkpoints.kept.clock().hits(c);
        if (slot.reads != reads[static_cast<size_t>(c)] || slot.filling != (fills[static_cast<size_t>(c)] != 0)
            || hits < 0 || hits > HitClock::kMAX_HITS)
        {
            fail(fmt::format("checkpoint {} counts {} reads, filling {}, hits {}; the queued copies read it {} times "
                             "and fill it {}",
                c, slot.reads, slot.filling, hits, reads[static_cast<size_t>(c)], fills[static_cast<size_t>(c)]));
        }
        if (slot.pages == 0)
        {
            if (slot.reads != 0 || hits != 0)
            {
                fail(fmt::format("empty checkpoint slot {} is read or counts hits", c));
            }
            continue;
        }
        ++held;
        if (slot.carrier < 0 || slot.carrier >= static_cast<int32_t>(checkpoints.byCarrier.size())
            || checkpoints.byCarrier[static_cast<size_t>(slot.carrier)] != c
            || !prefix.isRegistered(carrier, slot.carrier) || !(prefix.hashOf(carrier, slot.carrier) == slot.hash))
        {
            fail(fmt::format("checkpoint {} of {} pages is carried by group {} page {}, which is not registered under "
                             "its hash or does not point back to it",
                c, slot.pages, carrier, slot.carrier));
        }
    }
    int32_t carried = 0;
    for (int32_t const index : checkpoints.byCarrier)
    {
        carried += index >= 0 ? 1 : 0;
    }
    if (checkpoints.kept.size() != held)
    {
        fail(fmt::format("{} checkpoints are held, {} on the clock", held, checkpoints.kept.size()));
    }
    for (size_t p = 0; p < checkpoints.byCarrier.size(); ++p)
    {
        if (checkpoints.kept.remembersDrop(static_cast<int32_t>(p))
            && (checkpoints.byCarrier[p] >= 0 || !prefix.isRegistered(carrier, static_cast<int32_t>(p))))
        {
            fail(fmt::format(
                "group {} page {} remembers a dropped checkpoint but carries one or is not registered", carrier, p));
        }
    }
    if (held != checkpoints.held || carried != held)
    {
        fail(fmt::format(
            "{} checkpoints are held, {} counted, {} carrier pages point to one", held, checkpoints.held, carried));
    }
}

int32_t PageManager::checkpointBoundary(SequenceId sequence) const
{
    return mState->checkpointBoundary(mState->sequences.rowOf(sequence, "checkpointBoundary"));
}

bool PageManager::checkpointState(SequenceId sequence)
{
    return mState->checkpointState(mState->sequences.rowOf(sequence, "checkpointState"));
}

int32_t PageManager::checkpointSlot(PageHash const& hash) const noexcept
{
    State const& s = *mState;
    if (!s.checkpoints.enabled())
    {
        return -1;
    }
    int32_t const page = s.prefix.find(s.checkpoints.carrierGroup, hash);
    int32_t const index = page == PageHashTable::kNONE_PAGE ? -1 : s.checkpoints.byCarrier[static_cast<size_t>(page)];
    return index >= 0 ? s.checkpoints.firstSlot + index : -1;
}

int32_t PageManager::numCheckpoints() const noexcept
{
    return mState->checkpoints.held;
}

} // namespace kvcache::rt
