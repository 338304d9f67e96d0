// KV events of a PageManager (PageManagerOptions::recordEvents): the room a call's events take, reserved before the
// call changes anything, and the stored events of the pages a step entry or an adoptRun filled.
#include "paging/page_manager/page_manager_state.h"

#include <algorithm>

namespace kvcache::rt
{

void PageManager::takeEvents(KVEventBatch& out) noexcept
{
    out.clear();
    mState->events.swap(out);
}

void PageManager::State::setUpEvents(int32_t maxEntries)
{
    if (!recordsEvents())
    {
        return;
    }
    auto const entries = static_cast<size_t>(maxEntries);
    auto const groups = static_cast<size_t>(numGroups());
    auto const pageTokens = static_cast<size_t>(tokensPerPage);
    filled.hashes.reserve(entries);
    filled.tokens.reserve(entries);
    filled.partialTokens.resize(pageTokens);
    filled.keys.reserve(entries);
    filled.fresh.assign(groups * entries, 0);
    // A step's worth: every group stores what maxTokensPerStep fill and removes as many.
    size_t const stepPages = groups * (static_cast<size_t>(maxTokensPerStep) / pageTokens + 1);
    events.reserve(2 * stepPages + 1, 2 * stepPages, stepPages * pageTokens);
    prefix.setEventBatch(&events);
    events.addAllCleared();
}

void PageManager::State::reserveStepEvents(SequenceAppend const* appends, int32_t count, bool withKeys)
{
    size_t taken = 0;
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        taken += static_cast<size_t>(stepNeeded[static_cast<size_t>(g)]);
    }
    // Key bytes: a salt or extra keys ever given (keysSeen) make the step's entries worth a look; until then, a step
    // whose appends carry no key stores pages without any.
    keysSeen = keysSeen || withKeys;
    size_t keyBytes = 0;
    for (int32_t i = 0; i < count && keysSeen; ++i)
    {
        SequenceAppend const& append = appends[i];
        SequenceState const& sequence = sequences[SequenceTable::rowOfLive(append.sequence)];
        keyBytes +=
            sequence.salt.size() + 20 * (static_cast<size_t>(append.numExtraKeys) + sequence.pendingKeys.size());
    }
    auto const groups = static_cast<size_t>(numGroups());
    // Stored pages: at most each entry's filled pages in every group, all entries together at most the pages taken
    // plus one partial page an entry.
    size_t const stored = groups * static_cast<size_t>(count) + taken;
    events.reserveMore(
        taken + stored + 1, taken + stored, stored * static_cast<size_t>(tokensPerPage), groups * keyBytes);
    filled.keyBytes.reserve(keyBytes);
}

void PageManager::State::beginFilled(int32_t row, int32_t firstIndex)
{
    filled.firstIndex = firstIndex;
    filled.count = 0;
    filled.parent = sequences[row].lastHash;
    filled.hashes.clear();
    filled.tokens.clear();
    filled.keys.clear();
    filled.keyBytes.clear();
}

void PageManager::State::openFilled(int32_t row, PageHash const& hash, int32_t const* tokens)
{
    // Built in place, as KVEventBatch's elements are (kv_event_batch.cpp says why).
    KVEventPageKeys& keys = filled.keys.emplace_back();
    keys.offset = static_cast<int64_t>(filled.keyBytes.size());
    if (filled.firstIndex + filled.count == 0)
    {
        std::vector<uint8_t> const& salt = sequences[row].salt;
        keys.saltBytes = static_cast<int32_t>(salt.size());
        filled.keyBytes.insert(filled.keyBytes.end(), salt.begin(), salt.end());
    }
    filled.hashes.push_back(hash);
    filled.tokens.push_back(tokens);
    ++filled.count;
}

int32_t const* PageManager::State::keepPartialTokens(int32_t const* tokens) noexcept
{
    std::copy(tokens, tokens + tokensPerPage, filled.partialTokens.begin());
    return filled.partialTokens.data();
}

void PageManager::State::addFilled(
    int32_t row, PageHash const& hash, int32_t const* tokens, uint8_t const* keyBytes, size_t numKeyBytes)
{
    openFilled(row, hash, tokens);
    filled.keyBytes.insert(filled.keyBytes.end(), keyBytes, keyBytes + numKeyBytes);
    filled.keys.back().numKeys = static_cast<int32_t>(numKeyBytes / 20);
}

void PageManager::State::addFilled(
    int32_t row, PageHash const& hash, int32_t const* tokens, PageExtraKey const* keys, int32_t numKeys)
{
    int32_t const start = (filled.firstIndex + filled.count) * tokensPerPage;
    openFilled(row, hash, tokens);
    size_t const before = filled.keyBytes.size();
    PrefixCache::appendKeyBytes(keys, numKeys, start, tokensPerPage, filled.keyBytes);
    filled.keys.back().numKeys = static_cast<int32_t>((filled.keyBytes.size() - before) / 20);
}

void PageManager::State::recordFilled()
{
    auto const entries = static_cast<size_t>(sequences.maxEntries());
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        uint8_t* fresh = filled.fresh.data() + static_cast<size_t>(g) * entries;
        int32_t k = 0;
        while (k < filled.count)
        {
            if (fresh[k] == 0)
            {
                ++k;
                continue;
            }
            bool const hasParent = filled.firstIndex + k > 0;
            PageHash const parent = k == 0 ? filled.parent : filled.hashes[static_cast<size_t>(k - 1)];
            events.beginStored(g, KVEventMedium::kGPU, tokensPerPage, hasParent ? &parent : nullptr);
            for (; k < filled.count && fresh[k] != 0; ++k)
            {
                KVEventPageKeys const& keys = filled.keys[static_cast<size_t>(k)];
                events.addStoredPage(filled.hashes[static_cast<size_t>(k)], filled.tokens[static_cast<size_t>(k)],
                    filled.keyBytes.data() + keys.offset, keys.saltBytes, keys.numKeys);
                fresh[k] = 0;
            }
        }
    }
    filled.count = 0;
}

} // namespace kvcache::rt
