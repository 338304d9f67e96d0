#pragma once

#include "kvcache/paging/page_manager.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! What a PageManager knows of one sequence slot.
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
    //! Extra keys of the partial last page.
    std::vector<PageExtraKey> pendingKeys;
    //! Step stamp, to refuse a sequence listed twice in one step.
    mutable uint64_t stepStamp = 0;
};

//! The sequences of a PageManager: slots reused through a free stack, ids tagged with the slot's generation so that
//! an id is never reused, and per slot its page entries in each group and the tokens of its partial last page.
class SequenceTable
{
public:
    SequenceTable() = default;
    //! Returns a table of `maxSequences` slots of `maxEntries` entries in each of `numGroups` groups; throws
    //! std::bad_alloc.
    SequenceTable(int32_t maxSequences, int32_t maxEntries, int32_t numGroups, int32_t tokensPerPage);

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

    //! Returns the slot of a live sequence, or -1.
    int32_t findSlot(SequenceId id) const noexcept
    {
        if (id >= 0)
        {
            int64_t const slot = id & 0xffffffffLL;
            uint32_t const generation = static_cast<uint32_t>(static_cast<uint64_t>(id) >> 32);
            if (slot < mMaxSequences)
            {
                SequenceState const& sequence = mSlots[static_cast<size_t>(slot)];
                if (sequence.alive && sequence.generation == generation)
                {
                    return static_cast<int32_t>(slot);
                }
            }
        }
        return -1;
    }
    //! Returns the slot of a live sequence; throws InvalidArgumentError naming `what` otherwise.
    int32_t slotOf(SequenceId id, char const* what) const
    {
        int32_t const slot = findSlot(id);
        if (slot < 0)
        {
            failUnknown(id, what);
        }
        return slot;
    }
    //! Returns the slot of an id already checked live.
    static int32_t slotOfLive(SequenceId id) noexcept
    {
        return static_cast<int32_t>(id & 0xffffffffLL);
    }
    //! Returns the id of the live sequence in `slot`.
    SequenceId idOf(int32_t slot) const noexcept
    {
        return static_cast<SequenceId>(
            (static_cast<uint64_t>(mSlots[static_cast<size_t>(slot)].generation) << 32) | static_cast<uint64_t>(slot));
    }

    SequenceState& operator[](int32_t slot) noexcept
    {
        return mSlots[static_cast<size_t>(slot)];
    }
    SequenceState const& operator[](int32_t slot) const noexcept
    {
        return mSlots[static_cast<size_t>(slot)];
    }
    //! Returns the entries of `slot` in `group`: maxEntries of them.
    int32_t* entries(int32_t group, int32_t slot) noexcept
    {
        return mEntries.data() + (int64_t{group} * mMaxSequences + slot) * mMaxEntries;
    }
    int32_t const* entries(int32_t group, int32_t slot) const noexcept
    {
        return mEntries.data() + (int64_t{group} * mMaxSequences + slot) * mMaxEntries;
    }
    //! Returns the tokens of the partial last page of `slot`: tokensPerPage of them.
    int32_t* partial(int32_t slot) noexcept
    {
        return mPartialTokens.data() + int64_t{slot} * mTokensPerPage;
    }

    //! Returns the slot of a new empty sequence; throws InvalidArgumentError naming `what` when every slot is taken.
    int32_t take(char const* what);
    //! Forgets the sequence in `slot` (its entries must be released already), retiring its id.
    void release(int32_t slot) noexcept;
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
    std::vector<SequenceState> mSlots;
    //! Group g, slot s owns [(g * maxSequences + s) * maxEntries, ... + maxEntries).
    std::vector<int32_t> mEntries;
    //! Slot s owns [s * tokensPerPage, (s + 1) * tokensPerPage).
    std::vector<int32_t> mPartialTokens;
    std::vector<int32_t> mFreeSlots;
    int32_t mNumSequences = 0;
    mutable uint64_t mStepCounter = 0;
};

} // namespace kvcache::rt
