#include "paging/parts/sequence_table.h"

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_table.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvcache::rt
{

SequenceTable::SequenceTable(
    int32_t maxSequences, int32_t maxEntries, int32_t numGroups, int32_t tokensPerPage, bool keepHashes)
    : mMaxSequences(maxSequences)
    , mMaxEntries(maxEntries)
    , mTokensPerPage(tokensPerPage)
{
    mRows.resize(static_cast<size_t>(maxSequences));
    for (SequenceState& sequence : mRows)
    {
        sequence.firstHeld.assign(static_cast<size_t>(numGroups), 0);
        sequence.pendingKeys.reserve(4);
    }
    mEntries.assign(static_cast<size_t>(int64_t{numGroups} * maxSequences * maxEntries), kUNUSED_PAGE_ENTRY);
    mPartialTokens.assign(static_cast<size_t>(int64_t{maxSequences} * tokensPerPage), 0);
    if (keepHashes)
    {
        mHashes.assign(static_cast<size_t>(int64_t{maxSequences} * maxEntries), PageHash{});
    }
    mFreeRows.resize(static_cast<size_t>(maxSequences));
    for (int32_t i = 0; i < maxSequences; ++i)
    {
        mFreeRows[static_cast<size_t>(i)] = maxSequences - 1 - i;
    }
    mHeldRows.reserve(static_cast<size_t>(maxSequences));
}

void SequenceTable::failUnknown(SequenceId id, char const* what)
{
    throw InvalidArgumentError(fmt::format(
        "PageManager::{}: sequence {} is unknown (never created, or freed already); it must be a live sequence", what,
        id));
}

int32_t SequenceTable::take(char const* what)
{
    if (mNumSequences == mMaxSequences)
    {
        throw InvalidArgumentError(fmt::format(
            "PageManager::{}: {} sequences are alive; maxSequences is {}", what, mNumSequences, mMaxSequences));
    }
    if (mFreeRows.empty())
    {
        throw InvalidArgumentError(fmt::format(
            "PageManager::{}: {} sequences are alive and the other {} rows (state slots) are held until the next step: "
            "state copies queued by forks read them; step first, or free a sequence",
            what, mNumSequences, mHeldRows.size()));
    }
    int32_t const row = mFreeRows.back();
    mFreeRows.pop_back();
    ++mNumSequences;
    SequenceState& sequence = mRows[static_cast<size_t>(row)];
    sequence.alive = true;
    sequence.length = 0;
    sequence.pendingKeys.clear();
    sequence.promptBoundary = 0;
    sequence.matchBoundary = 0;
    sequence.stateSource = -1;
    std::fill(sequence.firstHeld.begin(), sequence.firstHeld.end(), 0);
    return row;
}

void SequenceTable::release(int32_t row, bool hold) noexcept
{
    SequenceState& sequence = mRows[static_cast<size_t>(row)];
    sequence.alive = false;
    sequence.length = 0;
    // Ids stay non-negative: the generation wraps within 31 bits.
    sequence.generation = (sequence.generation + 1) & 0x7fffffffU;
    // Reserved for every row: no allocation.
    (hold ? mHeldRows : mFreeRows).push_back(row);
    --mNumSequences;
}

void SequenceTable::returnHeldRows() noexcept
{
    for (int32_t const row : mHeldRows)
    {
        mFreeRows.push_back(row);
    }
    mHeldRows.clear();
}

} // namespace kvcache::rt
