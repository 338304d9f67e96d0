#include "kvcache/paging/kv_events.h"

#include <algorithm>
#include <utility>

namespace kvcache::rt
{

char const* toString(KVEventMedium medium) noexcept
{
    switch (medium)
    {
    case KVEventMedium::kGPU: return "GPU";
    case KVEventMedium::kCPU: return "CPU";
    case KVEventMedium::kDISK: return "DISK";
    }
    return "unknown";
}

void KVEventBatch::clear() noexcept
{
    mEvents.clear();
    mHashes.clear();
    mTokens.clear();
    mPageKeys.clear();
    mKeyBytes.clear();
}

void KVEventBatch::reserve(size_t events, size_t hashes, size_t tokens)
{
    mEvents.reserve(events);
    mHashes.reserve(hashes);
    mPageKeys.reserve(hashes);
    mTokens.reserve(tokens);
}

namespace
{

template <typename T>
void reserveMoreOf(std::vector<T>& buffer, size_t more)
{
    size_t const wanted = buffer.size() + more;
    if (wanted > buffer.capacity())
    {
        buffer.reserve(std::max(wanted, 2 * buffer.capacity()));
    }
}

} // namespace

void KVEventBatch::reserveMore(size_t events, size_t hashes, size_t tokens, size_t keyBytes)
{
    reserveMoreOf(mEvents, events);
    reserveMoreOf(mHashes, hashes);
    reserveMoreOf(mPageKeys, hashes);
    reserveMoreOf(mTokens, tokens);
    reserveMoreOf(mKeyBytes, keyBytes);
}

void KVEventBatch::swap(KVEventBatch& other) noexcept
{
    mEvents.swap(other.mEvents);
    mHashes.swap(other.mHashes);
    mTokens.swap(other.mTokens);
    mPageKeys.swap(other.mPageKeys);
    mKeyBytes.swap(other.mKeyBytes);
}

void KVEventBatch::append(KVEventBatch const& other)
{
    auto const hashBase = static_cast<int64_t>(mHashes.size());
    auto const tokenBase = static_cast<int64_t>(mTokens.size());
    auto const keyBase = static_cast<int64_t>(mKeyBytes.size());
    for (KVEvent event : other.mEvents)
    {
        event.firstHash += hashBase;
        event.firstToken += tokenBase;
        mEvents.push_back(event);
    }
    mHashes.insert(mHashes.end(), other.mHashes.begin(), other.mHashes.end());
    mTokens.insert(mTokens.end(), other.mTokens.begin(), other.mTokens.end());
    if (!other.mPageKeys.empty())
    {
        padPageKeys(static_cast<size_t>(hashBase));
        for (KVEventPageKeys keys : other.mPageKeys)
        {
            keys.offset += keyBase;
            mPageKeys.push_back(keys);
        }
    }
    mKeyBytes.insert(mKeyBytes.end(), other.mKeyBytes.begin(), other.mKeyBytes.end());
}

// The recording calls build each element in place, field by field, and take hashes by reference: an element built on
// the stack, or a hash passed in two registers, is stored there in narrower pieces and read back at once in one wide
// load, which the processor cannot forward from the stores and waits for.

void KVEventBatch::padPageKeys(size_t count)
{
    if (mPageKeys.size() < count)
    {
        mPageKeys.resize(count, KVEventPageKeys{static_cast<int64_t>(mKeyBytes.size()), 0, 0});
    }
}

KVEvent& KVEventBatch::addEvent(KVEventType type, KVEventMedium medium, int32_t group)
{
    KVEvent& event = mEvents.emplace_back();
    event.type = type;
    event.medium = medium;
    event.group = group;
    event.firstHash = static_cast<int64_t>(mHashes.size());
    event.firstToken = static_cast<int64_t>(mTokens.size());
    return event;
}

void KVEventBatch::addHash(PageHash const& hash)
{
    mHashes.push_back(hash);
}

void KVEventBatch::addAllCleared()
{
    addEvent(KVEventType::kALL_CLEARED, KVEventMedium::kGPU, 0);
}

void KVEventBatch::addRemoved(int32_t group, KVEventMedium medium, PageHash const& hash)
{
    bool const merge = !mEvents.empty() && mEvents.back().type == KVEventType::kREMOVED && mEvents.back().group == group
        && mEvents.back().medium == medium;
    KVEvent& event = merge ? mEvents.back() : addEvent(KVEventType::kREMOVED, medium, group);
    addHash(hash);
    ++event.numHashes;
}

void KVEventBatch::beginStored(int32_t group, KVEventMedium medium, int32_t tokensPerPage, PageHash const* parent)
{
    KVEvent& event = addEvent(KVEventType::kSTORED, medium, group);
    event.tokensPerPage = tokensPerPage;
    if (parent != nullptr)
    {
        event.hasParent = true;
        event.parent = *parent;
    }
}

void KVEventBatch::addStoredPage(
    PageHash const& hash, int32_t const* tokens, uint8_t const* keys, int32_t saltBytes, int32_t numKeys)
{
    KVEvent& event = mEvents.back();
    addHash(hash);
    ++event.numHashes;
    if (tokens != nullptr)
    {
        mTokens.insert(mTokens.end(), tokens, tokens + event.tokensPerPage);
        event.numTokens += event.tokensPerPage;
    }
    auto const keyBytes = static_cast<size_t>(saltBytes) + size_t{20} * static_cast<size_t>(numKeys);
    if (keyBytes == 0 && !event.hasKeys)
    {
        // Entries only from an event's first page with keys on: the rest of pageKeys() is never read.
        return;
    }
    padPageKeys(mHashes.size() - 1);
    KVEventPageKeys& entry = mPageKeys.emplace_back();
    entry.offset = static_cast<int64_t>(mKeyBytes.size());
    entry.saltBytes = saltBytes;
    entry.numKeys = numKeys;
    if (keyBytes > 0)
    {
        mKeyBytes.insert(mKeyBytes.end(), keys, keys + keyBytes);
        event.hasKeys = true;
    }
}

} // namespace kvcache::rt
