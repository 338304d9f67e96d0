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
    for (KVEventPageKeys keys : other.mPageKeys)
    {
        keys.offset += keyBase;
        mPageKeys.push_back(keys);
    }
    mKeyBytes.insert(mKeyBytes.end(), other.mKeyBytes.begin(), other.mKeyBytes.end());
}

void KVEventBatch::addAllCleared()
{
    KVEvent event;
    event.type = KVEventType::kALL_CLEARED;
    event.firstHash = static_cast<int64_t>(mHashes.size());
    event.firstToken = static_cast<int64_t>(mTokens.size());
    mEvents.push_back(event);
}

void KVEventBatch::addRemoved(int32_t group, KVEventMedium medium, PageHash hash)
{
    bool const merge = !mEvents.empty() && mEvents.back().type == KVEventType::kREMOVED && mEvents.back().group == group
        && mEvents.back().medium == medium;
    if (!merge)
    {
        KVEvent event;
        event.type = KVEventType::kREMOVED;
        event.medium = medium;
        event.group = group;
        event.firstHash = static_cast<int64_t>(mHashes.size());
        event.firstToken = static_cast<int64_t>(mTokens.size());
        mEvents.push_back(event);
    }
    mHashes.push_back(hash);
    mPageKeys.push_back(KVEventPageKeys{static_cast<int64_t>(mKeyBytes.size()), 0, 0});
    ++mEvents.back().numHashes;
}

void KVEventBatch::beginStored(int32_t group, KVEventMedium medium, int32_t tokensPerPage, PageHash const* parent)
{
    KVEvent event;
    event.type = KVEventType::kSTORED;
    event.medium = medium;
    event.group = group;
    event.tokensPerPage = tokensPerPage;
    event.hasParent = parent != nullptr;
    event.parent = parent != nullptr ? *parent : PageHash{};
    event.firstHash = static_cast<int64_t>(mHashes.size());
    event.firstToken = static_cast<int64_t>(mTokens.size());
    mEvents.push_back(event);
}

void KVEventBatch::addStoredPage(
    PageHash hash, int32_t const* tokens, uint8_t const* keys, int32_t saltBytes, int32_t numKeys)
{
    KVEvent& event = mEvents.back();
    mHashes.push_back(hash);
    ++event.numHashes;
    if (tokens != nullptr)
    {
        mTokens.insert(mTokens.end(), tokens, tokens + event.tokensPerPage);
        event.numTokens += event.tokensPerPage;
    }
    auto const keyBytes = static_cast<size_t>(saltBytes) + size_t{20} * static_cast<size_t>(numKeys);
    mPageKeys.push_back(KVEventPageKeys{static_cast<int64_t>(mKeyBytes.size()), saltBytes, numKeys});
    if (keyBytes > 0)
    {
        mKeyBytes.insert(mKeyBytes.end(), keys, keys + keyBytes);
        event.hasKeys = true;
    }
}

} // namespace kvcache::rt
