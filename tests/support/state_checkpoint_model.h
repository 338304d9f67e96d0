#pragma once

// The tests' model of a PageManager's state checkpoints (the "State checkpoints" paragraph of
// kvcache/paging/page_manager.h), written from the header's rules without the library's code, for a pool that never
// evicts a page. Prefixes are token lists, slots a vector searched linearly, the clock a vector from its hand on.

#include "kvcache/paging/page_manager.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "support/state_checkpoint_inputs.h"

namespace kvcache::test
{

//! The header's checkpoint rules (kvcache/paging/page_manager.h, "State checkpoints"), kept apart from the library, for
//! a pool that never evicts a page: the whole-page prefixes registered, the checkpoint slots (the prefix each holds,
//! its count, whether it was restored or made again, when it was made, whether a queued copy fills it, how many read
//! it), the held slots in the clock's order from the hand on, the target, what was dropped for each prefix, each
//! sequence's tokens, source and boundaries, and the queue of copies.
class CheckpointModel
{
public:
    //! `numSlots` checkpoint slots, the first at state slot `firstSlot`, a checkpoint every `intervalPages` pages (0:
    //! none), `tokensPerPage` tokens a page and `maxSequenceLength` a sequence.
    CheckpointModel(
        int32_t numSlots, int32_t firstSlot, int32_t intervalPages, int32_t tokensPerPage, int32_t maxSequenceLength)
        : mSlots(static_cast<size_t>(numSlots))
        , mFirstSlot(firstSlot)
        , mInterval(intervalPages)
        , mTokensPerPage(tokensPerPage)
        , mMaxSequenceLength(maxSequenceLength)
        , mTarget(numSlots)
    {
    }

    void create(rt::SequenceId id, int32_t row)
    {
        mSequences[id] = Sequence{{}, row, -1, 0, 0};
    }
    void fork(rt::SequenceId parent, rt::SequenceId child, int32_t row)
    {
        Sequence copy = mSequences.at(parent);
        int32_t const source = copy.source >= 0 ? copy.source : copy.row;
        copy.row = row;
        copy.source = source;
        mSequences[child] = copy;
        queue(source, row);
    }
    void free(rt::SequenceId id)
    {
        Sequence const& sequence = mSequences.at(id);
        if (sequence.source >= 0)
        {
            dropCopyInto(sequence.row);
        }
        mSequences.erase(id);
    }
    int32_t adopt(rt::SequenceId id, TokenList const& prompt)
    {
        Sequence& sequence = mSequences.at(id);
        int32_t const count = static_cast<int32_t>(prompt.size());
        sequence.promptEnd = 0;
        sequence.matchEnd = 0;
        if (count <= mTokensPerPage)
        {
            return 0;
        }
        int32_t const maxPages = (count - 1) / mTokensPerPage;
        int32_t found = 0;
        while (found < maxPages
            && mRegistered.count(TokenList(prompt.begin(), prompt.begin() + (found + 1) * mTokensPerPage)) > 0)
        {
            ++found;
        }
        bool const read = std::any_of(mQueue.begin(), mQueue.end(),
            [&](std::pair<int32_t, int32_t> const& c) { return c.first == sequence.row; });
        int32_t pages = 0;
        int32_t slot = -1;
        for (int32_t k = found; k > 0 && !read && slot < 0; --k)
        {
            slot = slotOf(TokenList(prompt.begin(), prompt.begin() + k * mTokensPerPage));
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
        sequence.tokens.assign(prompt.begin(), prompt.begin() + pages * mTokensPerPage);
        if (sequence.source >= 0)
        {
            dropCopyInto(sequence.row);
        }
        Slot& s = mSlots[static_cast<size_t>(slot)];
        s.hits = std::min(s.hits + 1, 3);
        s.hit = true;
        sequence.source = mFirstSlot + slot;
        queue(sequence.source, sequence.row);
        return pages * mTokensPerPage;
    }
    //! A successful step: the queue handed out, then the appends.
    SlotCopyPairs step(std::vector<std::pair<rt::SequenceId, TokenList>> const& appends)
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
        SlotCopyPairs taken;
        taken.swap(mQueue);
        for (auto const& [id, tokens] : appends)
        {
            TokenList& held = mSequences.at(id).tokens;
            held.insert(held.end(), tokens.begin(), tokens.end());
            for (size_t end = mTokensPerPage; end <= held.size(); end += mTokensPerPage)
            {
                mRegistered.insert(TokenList(held.begin(), held.begin() + static_cast<int64_t>(end)));
            }
        }
        return taken;
    }
    bool checkpoint(rt::SequenceId id)
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
    int32_t boundary(rt::SequenceId id) const
    {
        Sequence const& sequence = mSequences.at(id);
        auto const length = static_cast<int32_t>(sequence.tokens.size());
        int32_t best = 1 << 30;
        for (int32_t const pages : {sequence.promptEnd, sequence.matchEnd})
        {
            if (pages * mTokensPerPage > length)
            {
                best = std::min(best, pages * mTokensPerPage);
            }
        }
        if (mInterval > 0)
        {
            best = std::min(best, (length / (mInterval * mTokensPerPage) + 1) * mInterval * mTokensPerPage);
        }
        return best <= mMaxSequenceLength ? best : -1;
    }
    SlotCopyPairs const& queued() const
    {
        return mQueue;
    }
    int32_t held() const
    {
        return static_cast<int32_t>(
            std::count_if(mSlots.begin(), mSlots.end(), [](Slot const& s) { return !s.prefix.empty(); }));
    }
    //! The prefix each checkpoint slot holds (empty: none).
    std::vector<TokenList> prefixes() const
    {
        std::vector<TokenList> result;
        for (Slot const& s : mSlots)
        {
            result.push_back(s.prefix);
        }
        return result;
    }
    TokenList const& tokens(rt::SequenceId id) const
    {
        return mSequences.at(id).tokens;
    }

private:
    struct Slot
    {
        TokenList prefix;
        int32_t hits = 0;
        bool hit = false;
        int64_t made = 0;
        bool filling = false;
        int32_t reads = 0;
    };
    struct Sequence
    {
        TokenList tokens;
        int32_t row = -1;
        int32_t source = -1;
        int32_t promptEnd = 0;
        int32_t matchEnd = 0;
    };
    int32_t slotOf(TokenList const& prefix) const
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
    int32_t mTokensPerPage;
    int32_t mMaxSequenceLength;
    //! The held slots from the hand on.
    std::vector<int32_t> mRing;
    int32_t mTarget;
    int64_t mMade = 0;
    //! Per prefix whose checkpoint the clock dropped: whether it had been restored (or made again).
    std::map<TokenList, bool> mDropped;
    std::set<TokenList> mRegistered;
    std::map<rt::SequenceId, Sequence> mSequences;
    SlotCopyPairs mQueue;
};

} // namespace kvcache::test
