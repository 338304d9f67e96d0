#include "paging/parts/prefix/prefix_cache.h"

#include <cstring>
#include <exception>
#include <utility>

namespace kvcache::rt
{

PrefixCache::PrefixCache(std::vector<int32_t> const& numPages, PageHasher hasher, bool enabled, int32_t tokensPerPage)
    : mHasher(std::move(hasher))
    , mEnabled(enabled)
    , mTokensPerPage(tokensPerPage)
{
    size_t totalPages = 0;
    mGroups.resize(numPages.size());
    for (size_t g = 0; g < numPages.size(); ++g)
    {
        size_t const n = static_cast<size_t>(numPages[g]);
        Group& group = mGroups[g];
        group.hash.assign(n, PageHash{});
        group.registered.assign(n, 0);
        if (enabled)
        {
            group.table = PageHashTable(numPages[g]);
            totalPages += n;
        }
    }
    mPending.reserve(totalPages);
    mKeyBytes.reserve(static_cast<size_t>(tokensPerPage) * 20);
}

void PrefixCache::notifyEvictions()
{
    if (mPending.empty() || !mOnEvict)
    {
        mPending.clear();
        return;
    }
    std::exception_ptr first;
    for (Eviction const& eviction : mPending)
    {
        try
        {
            mNotifyingPriority = eviction.priority;
            mNotifyingStateSlot = eviction.stateSlot;
            mOnEvict(eviction.group, eviction.page, eviction.hash);
        }
        catch (...)
        {
            if (!first)
            {
                first = std::current_exception();
            }
        }
    }
    mPending.clear();
    mNotifyingPriority = PageManager::kDEFAULT_RETENTION_PRIORITY;
    mNotifyingStateSlot = -1;
    if (first)
    {
        std::rethrow_exception(first);
    }
}

void PrefixCache::appendKeyBytes(
    PageExtraKey const* keys, int32_t numKeys, int32_t start, int32_t tokensPerPage, std::vector<uint8_t>& out)
{
    for (int32_t k = 0; k < numKeys; ++k)
    {
        PageExtraKey const& key = keys[k];
        if (key.position >= start && key.position < start + tokensPerPage)
        {
            int32_t const offset = key.position - start;
            uint8_t bytes[20];
            std::memcpy(bytes, &offset, 4);
            std::memcpy(bytes + 4, &key.key.lo, 8);
            std::memcpy(bytes + 12, &key.key.hi, 8);
            out.insert(out.end(), bytes, bytes + 20);
        }
    }
}

PageHash PrefixCache::hashPage(
    PageHash parent, int32_t const* tokens, int32_t start, PageExtraKey const* keys, int32_t numKeys)
{
    mKeyBytes.clear();
    appendKeyBytes(keys, numKeys, start, mTokensPerPage, mKeyBytes);
    return mHasher.next(
        parent, tokens, mTokensPerPage, mKeyBytes.empty() ? nullptr : mKeyBytes.data(), mKeyBytes.size());
}

} // namespace kvcache::rt
