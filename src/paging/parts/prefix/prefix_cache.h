#pragma once

#include "paging/parts/page_pool.h"
#include "paging/parts/prefix/page_hash_table.h"

#include "kvcache/paging/kv_events.h"
#include "kvcache/paging/page_manager.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! The prefix cache of a PageManager: per group, the hash table of registered pages and each page's hash; the hashing
//! of page contents (with extra keys); eviction of a group's oldest cached page, whose callback calls are held back
//! until the manager is consistent again (notifyEvictions()).
class PrefixCache
{
public:
    PrefixCache() = default;
    //! Returns a cache for groups of `numPages` pages each, hashing with `hasher`; `enabled` false registers nothing.
    //! Throws std::bad_alloc.
    PrefixCache(std::vector<int32_t> const& numPages, PageHasher hasher, bool enabled, int32_t tokensPerPage);

    //! Returns whether pages are registered at all.
    bool enabled() const noexcept
    {
        return mEnabled;
    }
    PageHasher const& hasher() const noexcept
    {
        return mHasher;
    }

    //! Returns the page of `group` registered under `hash`, or PageHashTable::kNONE_PAGE.
    int32_t find(int32_t group, PageHash hash) const noexcept
    {
        return mGroups[static_cast<size_t>(group)].table.find(hash);
    }
    //! Starts loading the table row of `hash` in `group`.
    void prefetch(int32_t group, PageHash hash) const noexcept
    {
        mGroups[static_cast<size_t>(group)].table.prefetch(hash);
    }
    //! Returns whether `page` of `group` is registered (its hash kept when its last holder lets go).
    bool isRegistered(int32_t group, int32_t page) const noexcept
    {
        return mGroups[static_cast<size_t>(group)].registered[static_cast<size_t>(page)] != 0;
    }
    //! Returns the hash `page` of `group` was registered under (meaningful only while registered).
    PageHash hashOf(int32_t group, int32_t page) const noexcept
    {
        return mGroups[static_cast<size_t>(group)].hash[static_cast<size_t>(page)];
    }
    //! Returns the number of hashes registered in `group`.
    int32_t numRegistered(int32_t group) const noexcept
    {
        return mGroups[static_cast<size_t>(group)].table.size();
    }

    //! Registers a just-filled page under `hash` unless the hash is registered already (then the page stays
    //! unregistered and becomes free, not cached, when its holders let go); returns whether it registered it.
    bool registerPage(int32_t group, int32_t page, PageHash hash) noexcept
    {
        Group& state = mGroups[static_cast<size_t>(group)];
        if (state.table.insertIfAbsent(hash, page))
        {
            state.hash[static_cast<size_t>(page)] = hash;
            state.registered[static_cast<size_t>(page)] = 1;
            return true;
        }
        return false;
    }

    //! Drops the content of the cached page of `pool` that goes first (the lowest priority's oldest) (group `group`):
    //! off the cached list, its hash unregistered, its callback call queued for notifyEvictions(). Returns the page,
    //! kept in pool.pages; the pool must have a cached page.
    int32_t evictOldest(int32_t group, PagePool& pool) noexcept
    {
        Group& state = mGroups[static_cast<size_t>(group)];
        int32_t const priority = pool.priorityOf(pool.cached.oldest());
        int32_t const page = pool.popOldest();
        PageHash const& hash = state.hash[static_cast<size_t>(page)];
        state.table.erase(hash);
        state.registered[static_cast<size_t>(page)] = 0;
        ++mEvictedPages;
        if (mEvents != nullptr)
        {
            // Within capacity: the manager reserves room for a call's removals before it changes anything.
            mEvents->addRemoved(group, KVEventMedium::kGPU, hash);
        }
        if (mOnEvict)
        {
            // Within capacity: only registered pages are evicted, and a call evicts each page at most once.
            mPending.push_back(Eviction{group, page, hash, priority});
        }
        return page;
    }

    //! Returns the hash of the page [start, start + tokensPerPage) given its tokens and the extra keys among `keys`
    //! (sorted by position) that fall in it.
    PageHash hashPage(PageHash parent, int32_t const* tokens, int32_t start, PageExtraKey const* keys, int32_t numKeys);
    //! Returns the extra-key bytes the last hashPage() call mixed in (empty when none).
    std::vector<uint8_t> const& lastKeyBytes() const noexcept
    {
        return mKeyBytes;
    }
    //! Appends to `out` the extra-key bytes of the page [start, start + tokensPerPage): 20 for each key of `keys`
    //! (sorted by position) in it, as PageManager's class comment gives them.
    static void appendKeyBytes(
        PageExtraKey const* keys, int32_t numKeys, int32_t start, int32_t tokensPerPage, std::vector<uint8_t>& out);
    //! Records each eviction's removal in `events` (null: none); the caller keeps room for them in its buffers.
    void setEventBatch(KVEventBatch* events) noexcept
    {
        mEvents = events;
    }

    //! Sets the function called for each evicted page.
    void setCallback(EvictionCallback callback)
    {
        mOnEvict = std::move(callback);
    }
    //! Calls the callback for every eviction queued since the last call, in eviction order, and forgets them. When a
    //! call throws, the others are still made and the first exception is rethrown at the end.
    void notifyEvictions();
    //! Returns, while the callback runs, the retention priority the page it is called for had when it was evicted.
    int32_t notifyingPriority() const noexcept
    {
        return mNotifyingPriority;
    }
    //! Records, for the callback call of the page evictOldest() just evicted, the state slot holding the checkpoint
    //! that page carried (the bytes stay there until the caller's next writes are enqueued).
    void markEvictedState(int32_t stateSlot) noexcept
    {
        if (mOnEvict && !mPending.empty())
        {
            mPending.back().stateSlot = stateSlot;
        }
    }
    //! Returns, while the callback runs, the state slot markEvictedState() recorded for its page, or -1.
    int32_t notifyingStateSlot() const noexcept
    {
        return mNotifyingStateSlot;
    }
    //! Returns the pages evicted since construction or resetEvictedPages().
    int64_t evictedPages() const noexcept
    {
        return mEvictedPages;
    }
    void resetEvictedPages() noexcept
    {
        mEvictedPages = 0;
    }

private:
    struct Group
    {
        PageHashTable table;
        std::vector<PageHash> hash;
        std::vector<uint8_t> registered;
    };
    //! An eviction whose callback call is pending.
    struct Eviction
    {
        int32_t group = 0;
        int32_t page = 0;
        PageHash hash = {};
        int32_t priority = 0;
        //! The state slot holding the checkpoint the page carried (markEvictedState()), or -1.
        int32_t stateSlot = -1;
    };

    std::vector<Group> mGroups;
    PageHasher mHasher;
    bool mEnabled = false;
    int32_t mTokensPerPage = 0;
    EvictionCallback mOnEvict;
    KVEventBatch* mEvents = nullptr;
    //! Sized to every page of every group: one call never evicts a page twice without it being taken in between,
    //! and a taken page is evicted again only by a later call.
    std::vector<Eviction> mPending;
    int64_t mEvictedPages = 0;
    int32_t mNotifyingPriority = PageManager::kDEFAULT_RETENTION_PRIORITY;
    int32_t mNotifyingStateSlot = -1;
    //! Extra-key bytes of one page.
    std::vector<uint8_t> mKeyBytes;
};

} // namespace kvcache::rt
