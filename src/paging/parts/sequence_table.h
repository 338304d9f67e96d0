#pragma once

#include "kvcache/paging/page_manager.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! What a PageManager knows of one sequence row.
struct SequenceState
{
    uint32_t generation = 0;
    bool alive = false;
    int32_t length = 0;
    PageHash root = {};
    //! The hash of the last full page (root when there is none).
    PageHash lastHash = {};
    //! Per group, the first entry still held (entries before it were released by a window).
    std::vector<int32_t> firstHeld;
    //! The tenant of the sequence's salt (PageManager::State::tenants), or -1 for the bucket of other salts.
    int32_t tenant = -1;
    //! The salt the sequence was created with, kept only for KV events (PageManagerOptions::recordEvents).
    std::vector<uint8_t> salt;
    //! Extra keys of the partial last page.
    std::vector<PageExtraKey> pendingKeys;
    //! The prefix boundaries the sequence waits for (0: none): where a hybrid cache makes a cut (prefix_cuts.h) and
    //! state layers ask for a checkpoint (state_checkpoints.h) once the sequence holds this many whole pages: the
    //! prompt's whole pages before its last token and the longest run adoptPrefix() found in the full-attention group.
    int32_t promptBoundary = 0;
    int32_t matchBoundary = 0;
    //! With state layers, the slot a queued state copy fills this row's slot from (a fork child whose copy has not
    //! been handed out by a step yet), else -1.
    int32_t stateSource = -1;
    //! Step stamp, to refuse a sequence listed twice in one step.
    mutable uint64_t stepStamp = 0;
};

//! The sequences of a PageManager: rows reused through a free stack (0, 1, 2, ... first, then the most recently
//! released row first; a row released with `hold` only from returnHeldRows() on), ids tagged with the row's generation
//! so that an id is never reused, and per row its page entries in each group and the tokens of its partial last page. A
//! row is also its sequence's state slot.
class SequenceTable
{
public:
    SequenceTable() = default;
    //! Returns a table of `maxSequences` rows of `maxEntries` entries in each of `numGroups` groups, with the hash of
    //! every full page when `keepHashes` (a hybrid cache's cuts look their pages up by them); throws std::bad_alloc.
    SequenceTable(
        int32_t maxSequences, int32_t maxEntries, int32_t numGroups, int32_t tokensPerPage, bool keepHashes = false);

    int32_t maxSequences() const noexcept
    {
        return mMaxSequences;
    }
    int32_t maxEntries() const noexcept
    {
        return mMaxEntries;
    }
    int32_t numSequences() const noexcept
    {
        return mNumSequences;
    }

    //! Returns the row of a live sequence, or -1.
    int32_t findRow(SequenceId id) const noexcept
    {
        if (id >= 0)
        {
            int64_t const row = id & 0xffffffffLL;
            uint32_t const generation = static_cast<uint32_t>(static_cast<uint64_t>(id) >> 32);
            if (row < mMaxSequences)
            {
                SequenceState const& sequence = mRows[static_cast<size_t>(row)];
                if (sequence.alive && sequence.generation == generation)
                {
                    return static_cast<int32_t>(row);
                }
            }
        }
        return -1;
    }
    //! Returns the row of a live sequence; throws InvalidArgumentError naming `what` otherwise.
    int32_t rowOf(SequenceId id, char const* what) const
    {
        int32_t const row = findRow(id);
        if (row < 0)
        {
            failUnknown(id, what);
        }
        return row;
    }
    //! Returns the row of an id already checked live.
    static int32_t rowOfLive(SequenceId id) noexcept
    {
        return static_cast<int32_t>(id & 0xffffffffLL);
    }
    //! Returns the id of the live sequence in `row`.
    SequenceId idOf(int32_t row) const noexcept
    {
        return static_cast<SequenceId>(
            (static_cast<uint64_t>(mRows[static_cast<size_t>(row)].generation) << 32) | static_cast<uint64_t>(row));
    }

    SequenceState& operator[](int32_t row) noexcept
    {
        return mRows[static_cast<size_t>(row)];
    }
    SequenceState const& operator[](int32_t row) const noexcept
    {
        return mRows[static_cast<size_t>(row)];
    }
    //! Returns the entries of `row` in `group`: maxEntries of them.
    int32_t* entries(int32_t group, int32_t row) noexcept
    {
        return mEntries.data() + (int64_t{group} * mMaxSequences + row) * mMaxEntries;
    }
    int32_t const* entries(int32_t group, int32_t row) const noexcept
    {
        return mEntries.data() + (int64_t{group} * mMaxSequences + row) * mMaxEntries;
    }
    //! Returns the hashes of the full pages of `row`, in token order (maxEntries of them); only with keepHashes.
    PageHash* hashes(int32_t row) noexcept
    {
        return mHashes.data() + int64_t{row} * mMaxEntries;
    }
    PageHash const* hashes(int32_t row) const noexcept
    {
        return mHashes.data() + int64_t{row} * mMaxEntries;
    }
    //! Returns whether the table keeps page hashes.
    bool keepsHashes() const noexcept
    {
        return !mHashes.empty();
    }
    //! Returns the tokens of the partial last page of `row`: tokensPerPage of them.
    int32_t* partial(int32_t row) noexcept
    {
        return mPartialTokens.data() + int64_t{row} * mTokensPerPage;
    }

    //! Returns the row of a new empty sequence; throws InvalidArgumentError naming `what` when every row is taken or
    //! held.
    int32_t take(char const* what);
    //! Forgets the sequence in `row` (its entries must be released already), retiring its id; the row is free again
    //! at once, or, when `hold`, only at returnHeldRows().
    void release(int32_t row, bool hold = false) noexcept;
    //! Makes the held rows free, in the order they were released (the last released is taken first).
    void returnHeldRows() noexcept;
    //! Returns the free rows; take() hands out back() first.
    std::vector<int32_t> const& freeRows() const noexcept
    {
        return mFreeRows;
    }
    //! Returns the rows released with `hold`, oldest first.
    std::vector<int32_t> const& heldRows() const noexcept
    {
        return mHeldRows;
    }
    //! Returns a fresh stamp for a step's duplicate check.
    uint64_t nextStamp() const noexcept
    {
        return ++mStepCounter;
    }

private:
    //! Throws InvalidArgumentError for the unknown sequence `id`, naming `what`.
    [[noreturn]] static void failUnknown(SequenceId id, char const* what);

    int32_t mMaxSequences = 0;
    int32_t mMaxEntries = 0;
    int32_t mTokensPerPage = 0;
    std::vector<SequenceState> mRows;
    //! Group g, row s owns [(g * maxSequences + s) * maxEntries, ... + maxEntries).
    std::vector<int32_t> mEntries;
    //! Row s owns [s * tokensPerPage, (s + 1) * tokensPerPage).
    std::vector<int32_t> mPartialTokens;
    //! Row s owns [s * maxEntries, (s + 1) * maxEntries); empty without keepHashes.
    std::vector<PageHash> mHashes;
    //! Both reserved for maxSequences rows: a row is in one of them or alive.
    std::vector<int32_t> mFreeRows;
    std::vector<int32_t> mHeldRows;
    int32_t mNumSequences = 0;
    mutable uint64_t mStepCounter = 0;
};

} // namespace kvcache::rt
