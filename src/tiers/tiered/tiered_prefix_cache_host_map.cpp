// The hash -> host page map of one page group of a TieredPrefixCache, with its least-recently-used order.
#include "tiers/tiered/tiered_prefix_cache_host_map.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <limits>
#include <stdexcept>

namespace kvcache::rt::detail
{

HostPageMap::HostPageMap(int64_t numHostPages)
{
    if (numHostPages < 1 || numHostPages > std::numeric_limits<int32_t>::max())
    {
        throw InvalidArgumentError(fmt::format("HostPageMap: numHostPages is {}; it must be in [1, {}]", numHostPages,
            std::numeric_limits<int32_t>::max()));
    }
    auto const count = static_cast<int32_t>(numHostPages);
    mTable = PageHashTable(count);
    mLru = CachedPageList(count);
    mHashes.assign(static_cast<size_t>(count), PageHash{});
    mPins.assign(static_cast<size_t>(count), 0);
    mMapped.assign(static_cast<size_t>(count), 0);
    mReleased.reserve(static_cast<size_t>(count));
}

void HostPageMap::setUsable(int64_t usable)
{
    if (usable < mUsable || usable > numHostPages())
    {
        throw InvalidArgumentError(
            fmt::format("HostPageMap::setUsable: usable is {}; it must be in [{}, {}] (usable host pages never shrink)",
                usable, mUsable, numHostPages()));
    }
    mUsable = static_cast<int32_t>(usable);
}

void HostPageMap::checkMapped(char const* what, int32_t hostPage) const
{
    if (!mapped(hostPage))
    {
        throw InvalidArgumentError(fmt::format("HostPageMap::{}: host page {} holds no page; it must be a mapped host "
                                               "page of [0, {}) ({} usable)",
            what, hostPage, numHostPages(), mUsable));
    }
}

PageHash HostPageMap::hashOf(int32_t hostPage) const
{
    checkMapped("hashOf", hostPage);
    return mHashes[static_cast<size_t>(hostPage)];
}

void HostPageMap::touch(int32_t hostPage)
{
    checkMapped("touch", hostPage);
    if (mPins[static_cast<size_t>(hostPage)] == 0)
    {
        mLru.unlink(hostPage);
        mLru.pushNewest(hostPage);
    }
}

void HostPageMap::failPin(int32_t hostPage) const
{
    checkMapped("pin", hostPage);
    throw InvalidArgumentError(
        fmt::format("HostPageMap::pin: host page {} has {} pins, the most it can have", hostPage, kMAX_PINS));
}

void HostPageMap::failUnpin(int32_t hostPage) const
{
    throw InvalidArgumentError(
        fmt::format("HostPageMap::unpin: host page {} has no pin; only a pinned host page of [0, {}) can be unpinned",
            hostPage, numHostPages()));
}

HostPageMap::Insertion HostPageMap::insert(PageHash hash)
{
    int32_t const present = mTable.find(hash);
    if (present != kNONE)
    {
        throw InvalidArgumentError(fmt::format(
            "HostPageMap::insert: hash {:016x}{:016x} is held by host page {} already; a hash is mapped once", hash.hi,
            hash.lo, present));
    }
    Insertion result;
    if (mEvents != nullptr)
    {
        // Room first, so that a full buffer fails before anything changes: a removal and a stored page at most.
        mEvents->reserveMore(2, 2, 0, 0);
    }
    if (!mReleased.empty())
    {
        result.hostPage = mReleased.back();
        mReleased.pop_back();
    }
    else if (mNextUnused < mUsable)
    {
        result.hostPage = mNextUnused++;
    }
    else if (mLru.size() > 0)
    {
        result.hostPage = mLru.popOldest();
        result.evicted = true;
        result.evictedHash = mHashes[static_cast<size_t>(result.hostPage)];
        mTable.erase(result.evictedHash);
        mMapped[static_cast<size_t>(result.hostPage)] = 0;
    }
    else
    {
        return result;
    }
    auto const index = static_cast<size_t>(result.hostPage);
    mHashes[index] = hash;
    mMapped[index] = 1;
    mTable.insertIfAbsent(hash, result.hostPage);
    mLru.pushNewest(result.hostPage);
    if (mEvents != nullptr)
    {
        if (result.evicted)
        {
            mEvents->addRemoved(mEventGroup, mEventMedium, result.evictedHash);
        }
        mEvents->beginStored(mEventGroup, mEventMedium, mEventTokensPerPage, nullptr);
        mEvents->addStoredPage(hash, nullptr, nullptr, 0, 0);
    }
    return result;
}

void HostPageMap::erase(int32_t hostPage)
{
    checkMapped("erase", hostPage);
    if (mPins[static_cast<size_t>(hostPage)] != 0)
    {
        throw InvalidArgumentError(fmt::format("HostPageMap::erase: host page {} has {} pins; a pinned host page "
                                               "cannot be dropped",
            hostPage, mPins[static_cast<size_t>(hostPage)]));
    }
    if (mEvents != nullptr)
    {
        mEvents->reserveMore(1, 1, 0, 0);
        mEvents->addRemoved(mEventGroup, mEventMedium, mHashes[static_cast<size_t>(hostPage)]);
    }
    mLru.unlink(hostPage);
    mTable.erase(mHashes[static_cast<size_t>(hostPage)]);
    mMapped[static_cast<size_t>(hostPage)] = 0;
    mReleased.push_back(hostPage);
}

std::vector<int32_t> HostPageMap::leastRecentFirst() const
{
    std::vector<int32_t> order;
    order.reserve(static_cast<size_t>(mLru.size()));
    for (int32_t page = mLru.oldest(); page != CachedPageList::kNONE; page = mLru.next(page))
    {
        order.push_back(page);
    }
    return order;
}

void HostPageMap::checkInvariants() const
{
    auto fail = [](std::string const& what) { throw std::logic_error("HostPageMap: " + what); };
    std::vector<uint8_t> isFree(static_cast<size_t>(numHostPages()), 0);
    if (mNextUnused > mUsable || mUsable > numHostPages())
    {
        fail(fmt::format(
            "never used host pages start at {} but {} of {} are usable", mNextUnused, mUsable, numHostPages()));
    }
    for (int32_t const page : mReleased)
    {
        if (page < 0 || page >= mNextUnused || isFree[static_cast<size_t>(page)] != 0)
        {
            fail(fmt::format("released host page {} is outside [0, {}) or released twice", page, mNextUnused));
        }
        isFree[static_cast<size_t>(page)] = 1;
    }
    for (int32_t page = mNextUnused; page < mUsable; ++page)
    {
        isFree[static_cast<size_t>(page)] = 1;
    }
    int32_t mappedCount = 0;
    int32_t unpinned = 0;
    for (int32_t page = 0; page < numHostPages(); ++page)
    {
        auto const index = static_cast<size_t>(page);
        bool const isMapped = mMapped[index] != 0;
        if (isMapped && (isFree[index] != 0 || page >= mNextUnused))
        {
            fail(fmt::format("host page {} is mapped and free, or mapped but never handed out", page));
        }
        if (!isMapped && mPins[index] != 0)
        {
            fail(fmt::format("host page {} holds nothing but has {} pins", page, mPins[index]));
        }
        if (page < mUsable && !isMapped && isFree[index] == 0)
        {
            fail(fmt::format("usable host page {} is neither free nor mapped", page));
        }
        if (isMapped)
        {
            ++mappedCount;
            unpinned += mPins[index] == 0 ? 1 : 0;
            if (mTable.find(mHashes[index]) != page)
            {
                fail(fmt::format("the table does not map host page {}'s hash to it", page));
            }
        }
    }
    if (mappedCount != mTable.size())
    {
        fail(fmt::format("{} host pages are mapped but the table holds {} hashes", mappedCount, mTable.size()));
    }
    int32_t listed = 0;
    for (int32_t page = mLru.oldest(); page != CachedPageList::kNONE; page = mLru.next(page))
    {
        if (!mapped(page) || mPins[static_cast<size_t>(page)] != 0 || ++listed > unpinned)
        {
            fail(fmt::format("host page {} is in the LRU order but is not an unpinned mapped host page, or is listed "
                             "twice",
                page));
        }
    }
    if (listed != unpinned || mLru.size() != unpinned)
    {
        fail(fmt::format("{} unpinned mapped host pages but {} in the LRU order", unpinned, listed));
    }
}

} // namespace kvcache::rt::detail
