#pragma once

// The page manager model's pages (page_manager_model_class.h): each group's counts, the window a sequence needs, page
// hashes in the model's encoding of extra keys, the cache looked up by hash, a page's holders, taking a page (a free
// one, else the cached page that goes first) and evicting cached pages in retention priority order.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "support/page_manager_model_class.h"

namespace kvcache::test
{

inline rt::PageGroupCounts PageManagerModel::counts(int32_t g) const
{
    Group const& group = mGroups.at(static_cast<size_t>(g));
    rt::PageGroupCounts counts;
    counts.numPages = group.numPages;
    counts.free = static_cast<int32_t>(group.freeStack.size());
    counts.cached = static_cast<int32_t>(group.lru.size() + group.anchoredCached.size());
    counts.anchored = static_cast<int32_t>(group.anchoredCached.size());
    for (int32_t const refs : group.refCount)
    {
        counts.used += refs > 0 ? 1 : 0;
        counts.shared += refs > 1 ? 1 : 0;
    }
    return counts;
}

inline int32_t PageManagerModel::firstNeededPage(int32_t g, int64_t position) const
{
    int64_t const window = mGroups.at(static_cast<size_t>(g)).slidingWindow;
    if (window == 0)
    {
        return 0;
    }
    int64_t page = 0;
    // Page p holds tokens [p * P, (p + 1) * P); it is out of the window when its last token is before
    // position - (W - 1).
    while ((page + 1) * mTokensPerPage - 1 < position - (window - 1))
    {
        ++page;
    }
    return static_cast<int32_t>(page);
}

inline rt::PageHash PageManagerModel::hashPage(
    rt::PageHash parent, int32_t const* tokens, int64_t start, rt::PageExtraKey const* keys, int32_t numKeys) const
{
    std::vector<uint8_t> bytes;
    for (int32_t k = 0; k < numKeys; ++k)
    {
        if (keys[k].position >= start && keys[k].position < start + mTokensPerPage)
        {
            // Absolute position as 8 bytes, then hi, then lo: deliberately not the library's layout.
            int64_t const position = keys[k].position;
            uint8_t record[24];
            std::memcpy(record, &position, 8);
            std::memcpy(record + 8, &keys[k].key.hi, 8);
            std::memcpy(record + 16, &keys[k].key.lo, 8);
            bytes.insert(bytes.end(), record, record + 24);
        }
    }
    return mHasher.next(parent, tokens, mTokensPerPage, bytes.empty() ? nullptr : bytes.data(), bytes.size());
}

inline bool PageManagerModel::keysValid(rt::PageExtraKey const* keys, int32_t numKeys, int64_t begin, int64_t end)
{
    if (numKeys < 0 || (numKeys > 0 && keys == nullptr))
    {
        return false;
    }
    for (int32_t k = 0; k < numKeys; ++k)
    {
        if (keys[k].position < begin || keys[k].position >= end || (k > 0 && keys[k].position < keys[k - 1].position))
        {
            return false;
        }
    }
    return true;
}

inline int64_t PageManagerModel::pagesFor(int64_t tokens) const
{
    return (tokens + mTokensPerPage - 1) / mTokensPerPage;
}

inline std::pair<uint64_t, uint64_t> PageManagerModel::keyOf(rt::PageHash hash)
{
    return {hash.lo, hash.hi};
}

inline std::optional<int32_t> PageManagerModel::lookup(Group const& group, rt::PageHash hash)
{
    auto found = group.cache.find(keyOf(hash));
    if (found == group.cache.end())
    {
        return std::nullopt;
    }
    return found->second;
}

inline void PageManagerModel::registerPage(Group& group, int32_t page, rt::PageHash hash)
{
    if (!lookup(group, hash).has_value())
    {
        group.cache[keyOf(hash)] = page;
        group.registered[static_cast<size_t>(page)] = 1;
        group.hash[static_cast<size_t>(page)] = hash;
    }
}

inline void PageManagerModel::release(Group& group, int32_t page)
{
    int32_t& refs = group.refCount[static_cast<size_t>(page)];
    if (refs <= 0)
    {
        throw std::logic_error("model: released a page with no holder");
    }
    if (--refs == 0)
    {
        if (group.registered[static_cast<size_t>(page)] != 0)
        {
            (anchors(group, page) > 0 ? group.anchoredCached : group.lru).push_back(page);
        }
        else
        {
            group.freeStack.push_back(page);
            group.unsetPriority(page);
        }
    }
}

inline int32_t PageManagerModel::take(int32_t g)
{
    Group& group = mGroups[static_cast<size_t>(g)];
    int32_t page = 0;
    if (!group.freeStack.empty())
    {
        page = group.freeStack.back();
        group.freeStack.pop_back();
    }
    else if (!group.lru.empty() || !group.anchoredCached.empty())
    {
        page = evictNext(g);
    }
    else
    {
        throw std::logic_error("model: took a page from an empty group");
    }
    group.refCount[static_cast<size_t>(page)] = 1;
    return page;
}

inline int32_t PageManagerModel::evictOldest(int32_t g)
{
    Group& group = mGroups[static_cast<size_t>(g)];
    auto chosen = group.lru.begin();
    for (auto it = group.lru.begin(); it != group.lru.end(); ++it)
    {
        if (group.priorityOf(*it) < group.priorityOf(*chosen))
        {
            chosen = it;
        }
    }
    int32_t const page = *chosen;
    group.lru.erase(chosen);
    group.unsetPriority(page);
    rt::PageHash const hash = group.hash[static_cast<size_t>(page)];
    mEvictions.push_back(ModelEviction{g, page, hash});
    group.cache.erase(keyOf(hash));
    group.registered[static_cast<size_t>(page)] = 0;
    group.hash[static_cast<size_t>(page)] = rt::PageHash{};
    ++mStats.evictedPages;
    return page;
}

inline void PageManagerModel::unlist(Group& group, int32_t page)
{
    std::vector<int32_t>& list =
        std::find(group.lru.begin(), group.lru.end(), page) != group.lru.end() ? group.lru : group.anchoredCached;
    list.erase(std::find(list.begin(), list.end(), page));
}

inline ModelOutcome PageManagerModel::evictCached(int32_t g, int32_t count, int32_t* dropped)
{
    if (g < 0 || g >= numGroups())
    {
        return ModelOutcome::kOUT_OF_RANGE;
    }
    if (count < 0)
    {
        return ModelOutcome::kINVALID_ARGUMENT;
    }
    expireRetention();
    Group& group = mGroups[static_cast<size_t>(g)];
    *dropped = 0;
    while (*dropped < count && !(group.lru.empty() && group.anchoredCached.empty()))
    {
        int32_t const page = evictNext(g);
        mGroups[static_cast<size_t>(g)].freeStack.push_back(page);
        ++*dropped;
    }
    return ModelOutcome::kOK;
}

inline void PageManagerModel::clearCopies()
{
    for (Group& group : mGroups)
    {
        group.copies.clear();
    }
}

} // namespace kvcache::test
