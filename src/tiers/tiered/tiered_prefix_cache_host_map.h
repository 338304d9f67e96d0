#pragma once

// One page group's host pages in a TieredPrefixCache: which page hash each host page holds, and which host page to
// give up when a new page must be kept and none is free (least recently used first). Host only, no CUDA; nothing
// allocated after construction.

#include "paging/parts/cached_page_list.h"
#include "paging/parts/prefix/page_hash_table.h"

#include "kvcache/paging/kv_events.h"
#include "kvcache/paging/page_hash.h"

#include <cstdint>
#include <limits>
#include <vector>

namespace kvcache::rt::detail
{

//! A map from page hash to the host page holding that page's bytes, over host pages [0, numHostPages()), of which
//! [0, numUsable()) may be handed out (a HostTier pins its memory in the background: usable grows, never shrinks).
//!
//! A host page is free (usable, holding nothing), mapped (holding the bytes of one hash) or not yet usable. A mapped
//! host page is pinned while its pin count is above 0: pinned host pages are being read or written by a transfer the
//! caller is putting together and are never given up. Unpinned mapped host pages are kept in least recently used
//! order; pinning takes one out of that order and the last unpin puts it back as the most recent (a pin is a use).
//!
//! insert() takes, in this order: a released host page (the most recently released first), a never used one (in
//! ascending order), else the least recently used unpinned host page, whose hash is dropped. Every call checks its
//! arguments before changing anything and throws InvalidArgumentError (naming the host page or hash, its state and
//! the rule) when they break a rule. Not thread-safe.
class HostPageMap
{
public:
    //! Marks "no host page".
    static constexpr int32_t kNONE = -1;

    //! What insert() did.
    struct Insertion
    {
        //! The host page now holding the hash, or kNONE when every usable host page is pinned.
        int32_t hostPage = kNONE;
        //! Whether the host page held another hash, dropped to make room.
        bool evicted = false;
        //! That hash (when evicted).
        PageHash evictedHash = {};
    };

    //! A map of `numHostPages` host pages, none usable yet. Throws InvalidArgumentError for numHostPages outside
    //! [1, INT32_MAX], std::bad_alloc.
    explicit HostPageMap(int64_t numHostPages);

    //! Makes host pages [0, usable) usable: the new ones become free, after the released ones. Throws
    //! InvalidArgumentError for usable below numUsable() or above numHostPages().
    void setUsable(int64_t usable);

    //! Returns the host page holding `hash`, or kNONE.
    int32_t find(PageHash hash) const noexcept
    {
        return mTable.find(hash);
    }
    //! Makes the mapped host page `hostPage` the most recently used (a pinned one keeps its pins: unpin() does that).
    //! Throws InvalidArgumentError for a host page that is not mapped.
    void touch(int32_t hostPage);
    //! Adds a pin to the mapped host page `hostPage`. Throws InvalidArgumentError for a host page that is not mapped.
    void pin(int32_t hostPage)
    {
        // Inline: an admission pins and unpins every page of its run.
        if (!mapped(hostPage) || mPins[static_cast<size_t>(hostPage)] == kMAX_PINS)
        {
            failPin(hostPage);
        }
        if (mPins[static_cast<size_t>(hostPage)]++ == 0)
        {
            mLru.unlink(hostPage);
        }
    }
    //! Removes a pin from `hostPage`; the last one makes it the most recently used. Throws InvalidArgumentError for a
    //! host page that is not pinned.
    void unpin(int32_t hostPage)
    {
        if (pinCount(hostPage) == 0)
        {
            failUnpin(hostPage);
        }
        if (--mPins[static_cast<size_t>(hostPage)] == 0)
        {
            mLru.pushNewest(hostPage);
        }
    }

    //! Maps `hash`, which must be absent, to a host page (see the class comment for which) and makes it the most
    //! recently used; returns kNONE (changing nothing) when no usable host page is free or unpinned. Throws
    //! InvalidArgumentError for a hash already mapped.
    Insertion insert(PageHash hash);
    //! Drops the hash of the mapped, unpinned host page `hostPage`, which becomes free (the first insert() takes it).
    //! Throws InvalidArgumentError for a host page that is not mapped or is pinned.
    void erase(int32_t hostPage);

    //! Records in `events` (null: none) a stored event of `group` and `medium` (tokensPerPage a page, no parent, no
    //! token ids) for each hash insert() maps, and a removal for each hash it or erase() drops; never throws.
    void setEventBatch(KVEventBatch* events, int32_t group, KVEventMedium medium, int32_t tokensPerPage) noexcept
    {
        mEvents = events;
        mEventGroup = group;
        mEventMedium = medium;
        mEventTokensPerPage = tokensPerPage;
    }

    //! Returns the host pages the map is sized for.
    int32_t numHostPages() const noexcept
    {
        return static_cast<int32_t>(mPins.size());
    }
    //! Returns the usable host pages.
    int32_t numUsable() const noexcept
    {
        return mUsable;
    }
    //! Returns the mapped host pages.
    int32_t size() const noexcept
    {
        return mTable.size();
    }
    //! Returns the usable host pages holding nothing.
    int32_t numFree() const noexcept
    {
        return static_cast<int32_t>(mReleased.size()) + (mUsable - mNextUnused);
    }
    //! Returns the mapped host pages with at least one pin.
    int32_t numPinned() const noexcept
    {
        return size() - mLru.size();
    }
    //! Returns how many insert() calls in a row would succeed now: free plus unpinned mapped host pages.
    int32_t numAvailable() const noexcept
    {
        return numFree() + mLru.size();
    }
    //! Returns whether `hostPage` holds a hash (false outside [0, numHostPages())).
    bool mapped(int32_t hostPage) const noexcept
    {
        return hostPage >= 0 && hostPage < numHostPages() && mMapped[static_cast<size_t>(hostPage)] != 0;
    }
    //! Returns the hash the mapped host page `hostPage` holds. Throws InvalidArgumentError for one not mapped.
    PageHash hashOf(int32_t hostPage) const;
    //! Returns the pins of `hostPage` (0 outside [0, numHostPages())).
    int32_t pinCount(int32_t hostPage) const noexcept
    {
        return hostPage >= 0 && hostPage < numHostPages() ? mPins[static_cast<size_t>(hostPage)] : 0;
    }
    //! Returns the unpinned mapped host pages, least recently used first. Allocates.
    std::vector<int32_t> leastRecentFirst() const;

    //! Returns normally when the state is consistent; throws std::logic_error naming the first broken rule: every
    //! host page below numUsable() is free xor mapped, none above is either; the table maps exactly the mapped host
    //! pages' hashes, each to its host page; exactly the unpinned mapped host pages are in the LRU order, once. Linear
    //! time; allocates.
    void checkInvariants() const;

private:
    static constexpr int32_t kMAX_PINS = std::numeric_limits<int32_t>::max();

    //! Throws InvalidArgumentError naming `what` when `hostPage` is not mapped.
    void checkMapped(char const* what, int32_t hostPage) const;
    //! Throw pin()'s and unpin()'s InvalidArgumentError for `hostPage`.
    [[noreturn]] void failPin(int32_t hostPage) const;
    [[noreturn]] void failUnpin(int32_t hostPage) const;

    PageHashTable mTable;
    CachedPageList mLru;
    //! Per host page: its hash (meaningful when mapped), its pins, whether it is mapped.
    std::vector<PageHash> mHashes;
    std::vector<int32_t> mPins;
    std::vector<uint8_t> mMapped;
    //! Released host pages, the most recent last; never used ones are [mNextUnused, mUsable).
    std::vector<int32_t> mReleased;
    int32_t mNextUnused = 0;
    int32_t mUsable = 0;
    KVEventBatch* mEvents = nullptr;
    int32_t mEventGroup = 0;
    KVEventMedium mEventMedium = KVEventMedium::kCPU;
    int32_t mEventTokensPerPage = 0;
};

} // namespace kvcache::rt::detail
