// The hash -> host page map of a TieredPrefixCache (src/tiers/tiered/tiered_prefix_cache_host_map.h), host only: which
// host page insert() takes (released ones most recent first, then never used ones ascending, then the least recently
// used unpinned one), pins, the refusals and that they change nothing, and random operations against an independent
// model (written from the class comment with standard containers) with the invariants checked after each.

#include "tiers/tiered/tiered_prefix_cache_host_map.h"

#include "kvcache/core/errors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <list>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/error_matchers.h"

namespace kvcache::rt::detail
{
namespace
{

using test::throwsNaming;

PageHash hashOfIndex(uint64_t index)
{
    return PageHash{index * 0x9E3779B97F4A7C15ULL + 1, index ^ 0xC2B2AE3D27D4EB4FULL};
}

//! Everything observable of a map, for "changed nothing" checks.
struct Snapshot
{
    std::vector<int32_t> lru;
    std::vector<int32_t> pins;
    std::vector<int32_t> found;
    int32_t size = 0;
    int32_t numFree = 0;
    int32_t numUsable = 0;

    bool operator==(Snapshot const& other) const
    {
        return lru == other.lru && pins == other.pins && found == other.found && size == other.size
            && numFree == other.numFree && numUsable == other.numUsable;
    }
};

Snapshot snapshot(HostPageMap const& map, int32_t hashes)
{
    Snapshot shot;
    shot.lru = map.leastRecentFirst();
    for (int32_t p = 0; p < map.numHostPages(); ++p)
    {
        shot.pins.push_back(map.pinCount(p));
    }
    for (int32_t h = 0; h < hashes; ++h)
    {
        shot.found.push_back(map.find(hashOfIndex(static_cast<uint64_t>(h))));
    }
    shot.size = map.size();
    shot.numFree = map.numFree();
    shot.numUsable = map.numUsable();
    return shot;
}

TEST(TieredHostPageMapTest, NeverUsedHostPagesGoInAscendingOrderAfterReleasedOnesMostRecentFirst)
{
    HostPageMap map(6);
    EXPECT_EQ(map.numFree(), 0);
    EXPECT_EQ(map.insert(hashOfIndex(0)).hostPage, HostPageMap::kNONE) << "no host page is usable yet";
    map.setUsable(4);
    for (int32_t h = 0; h < 4; ++h)
    {
        HostPageMap::Insertion const insertion = map.insert(hashOfIndex(static_cast<uint64_t>(h)));
        EXPECT_EQ(insertion.hostPage, h);
        EXPECT_FALSE(insertion.evicted);
    }
    map.erase(1);
    map.erase(3);
    map.setUsable(6);
    EXPECT_EQ(map.numFree(), 4);
    std::vector<int32_t> order;
    for (int32_t h = 10; h < 14; ++h)
    {
        order.push_back(map.insert(hashOfIndex(static_cast<uint64_t>(h))).hostPage);
    }
    EXPECT_EQ(order, (std::vector<int32_t>{3, 1, 4, 5}));
    EXPECT_EQ(map.find(hashOfIndex(1)), HostPageMap::kNONE);
    EXPECT_EQ(map.find(hashOfIndex(12)), 4);
    EXPECT_NO_THROW(map.checkInvariants());
}

TEST(TieredHostPageMapTest, AFullMapGivesUpTheLeastRecentlyUsedUnpinnedHostPage)
{
    HostPageMap map(3);
    map.setUsable(3);
    for (uint64_t h = 0; h < 3; ++h)
    {
        map.insert(hashOfIndex(h));
    }
    map.touch(0); // order now 1, 2, 0
    map.pin(1);   // 1 leaves the order: 2, 0
    HostPageMap::Insertion const first = map.insert(hashOfIndex(7));
    EXPECT_EQ(first.hostPage, 2);
    EXPECT_TRUE(first.evicted);
    EXPECT_EQ(first.evictedHash, hashOfIndex(2));
    EXPECT_EQ(map.leastRecentFirst(), (std::vector<int32_t>{0, 2}));
    map.unpin(1); // the last pin makes it the most recent: 0, 2, 1
    EXPECT_EQ(map.leastRecentFirst(), (std::vector<int32_t>{0, 2, 1}));
    EXPECT_EQ(map.insert(hashOfIndex(8)).hostPage, 0);
    EXPECT_EQ(map.find(hashOfIndex(0)), HostPageMap::kNONE);

    // Everything pinned: nothing is given up and nothing changes.
    for (int32_t p = 0; p < 3; ++p)
    {
        map.pin(p);
    }
    Snapshot const before = snapshot(map, 16);
    HostPageMap::Insertion const none = map.insert(hashOfIndex(9));
    EXPECT_EQ(none.hostPage, HostPageMap::kNONE);
    EXPECT_FALSE(none.evicted);
    EXPECT_TRUE(snapshot(map, 16) == before);
    EXPECT_EQ(map.numAvailable(), 0);
    EXPECT_NO_THROW(map.checkInvariants());
}

TEST(TieredHostPageMapTest, BadCallsNameTheHostPageOrHashAndChangeNothing)
{
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([] { HostPageMap(0); }, {"numHostPages", "0", "[1, 2147483647]"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [] { HostPageMap(int64_t{1} << 31); }, {"numHostPages", "2147483648", "2147483647"}));

    HostPageMap map(4);
    map.setUsable(3);
    map.insert(hashOfIndex(0));
    map.insert(hashOfIndex(1));
    map.pin(1);
    Snapshot const before = snapshot(map, 8);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { map.insert(hashOfIndex(1)); }, {"HostPageMap::insert", "host page 1", "already"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { map.touch(2); }, {"touch", "host page 2", "[0, 4)"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { map.pin(-1); }, {"pin", "host page -1"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { map.unpin(0); }, {"unpin", "host page 0", "no pin"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { map.erase(1); }, {"erase", "host page 1", "1 pins"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { map.erase(3); }, {"erase", "host page 3"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { map.hashOf(5); }, {"hashOf", "host page 5"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { map.setUsable(2); }, {"usable is 2", "[3, 4]"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { map.setUsable(5); }, {"usable is 5", "[3, 4]"}));
    EXPECT_TRUE(snapshot(map, 8) == before);
    EXPECT_NO_THROW(map.checkInvariants());
}

//! The map as its class comment describes it, on standard containers.
class MapModel
{
public:
    explicit MapModel(int32_t numHostPages)
        : mPins(static_cast<size_t>(numHostPages), 0)
    {
    }

    bool setUsable(int32_t usable)
    {
        if (usable < mUsable || usable > static_cast<int32_t>(mPins.size()))
        {
            return false;
        }
        mUsable = usable;
        return true;
    }
    int32_t find(uint64_t hash) const
    {
        auto const found = mHostPageOf.find(hash);
        return found == mHostPageOf.end() ? HostPageMap::kNONE : found->second;
    }
    bool mapped(int32_t hostPage) const
    {
        return mHashOf.count(hostPage) != 0;
    }
    bool touch(int32_t hostPage)
    {
        if (!mapped(hostPage))
        {
            return false;
        }
        if (mPins[static_cast<size_t>(hostPage)] == 0)
        {
            mLru.remove(hostPage);
            mLru.push_back(hostPage);
        }
        return true;
    }
    bool pin(int32_t hostPage)
    {
        if (!mapped(hostPage))
        {
            return false;
        }
        if (mPins[static_cast<size_t>(hostPage)]++ == 0)
        {
            mLru.remove(hostPage);
        }
        return true;
    }
    bool unpin(int32_t hostPage)
    {
        if (!mapped(hostPage) || mPins[static_cast<size_t>(hostPage)] == 0)
        {
            return false;
        }
        if (--mPins[static_cast<size_t>(hostPage)] == 0)
        {
            mLru.push_back(hostPage);
        }
        return true;
    }
    //! Returns (host page, evicted hash or -1), or nothing for a present hash.
    std::pair<bool, std::pair<int32_t, int64_t>> insert(uint64_t hash)
    {
        if (mHostPageOf.count(hash) != 0)
        {
            return {false, {}};
        }
        int32_t hostPage = HostPageMap::kNONE;
        int64_t evicted = -1;
        if (!mReleased.empty())
        {
            hostPage = mReleased.back();
            mReleased.pop_back();
        }
        else if (mNextUnused < mUsable)
        {
            hostPage = mNextUnused++;
        }
        else if (!mLru.empty())
        {
            hostPage = mLru.front();
            mLru.pop_front();
            evicted = static_cast<int64_t>(mHashOf.at(hostPage));
            mHostPageOf.erase(mHashOf.at(hostPage));
            mHashOf.erase(hostPage);
        }
        else
        {
            return {true, {HostPageMap::kNONE, -1}};
        }
        mHostPageOf[hash] = hostPage;
        mHashOf[hostPage] = hash;
        mLru.push_back(hostPage);
        return {true, {hostPage, evicted}};
    }
    bool erase(int32_t hostPage)
    {
        if (!mapped(hostPage) || mPins[static_cast<size_t>(hostPage)] != 0)
        {
            return false;
        }
        mLru.remove(hostPage);
        mHostPageOf.erase(mHashOf.at(hostPage));
        mHashOf.erase(hostPage);
        mReleased.push_back(hostPage);
        return true;
    }

    std::vector<int32_t> lru() const
    {
        return {mLru.begin(), mLru.end()};
    }
    int32_t pins(int32_t hostPage) const
    {
        return mPins[static_cast<size_t>(hostPage)];
    }
    int32_t size() const
    {
        return static_cast<int32_t>(mHashOf.size());
    }
    int32_t numFree() const
    {
        return static_cast<int32_t>(mReleased.size()) + mUsable - mNextUnused;
    }
    int32_t usable() const
    {
        return mUsable;
    }

private:
    std::map<uint64_t, int32_t> mHostPageOf;
    std::map<int32_t, uint64_t> mHashOf;
    std::list<int32_t> mLru;
    std::vector<int32_t> mPins;
    std::vector<int32_t> mReleased;
    int32_t mNextUnused = 0;
    int32_t mUsable = 0;
};

//! Runs `operations` random calls on a map of `numHostPages` host pages and the model; returns the first difference.
std::string randomRun(uint32_t seed, int32_t numHostPages, int64_t operations)
{
    std::mt19937 random(seed);
    int32_t const hashes = 3 * numHostPages + 2;
    HostPageMap map(numHostPages);
    MapModel model(numHostPages);
    std::uniform_int_distribution<int32_t> anyHash(0, hashes - 1);
    std::uniform_int_distribution<int32_t> anyHostPage(-1, numHostPages);
    std::map<std::string, int64_t> refused;
    for (int64_t op = 0; op < operations; ++op)
    {
        std::ostringstream what;
        bool threw = false;
        bool expectThrow = false;
        auto attempt = [&](auto&& call)
        {
            try
            {
                call();
            }
            catch (InvalidArgumentError const&)
            {
                threw = true;
            }
        };
        int32_t const kind = static_cast<int32_t>(random() % 100);
        if (kind < 4)
        {
            int32_t const usable = std::uniform_int_distribution<int32_t>(0, numHostPages + 1)(random);
            what << "setUsable(" << usable << ")";
            expectThrow = !model.setUsable(usable);
            attempt([&] { map.setUsable(usable); });
        }
        else if (kind < 40)
        {
            int32_t const hash = anyHash(random);
            what << "insert(hash " << hash << ")";
            auto const expected = model.insert(static_cast<uint64_t>(hash));
            expectThrow = !expected.first;
            HostPageMap::Insertion insertion;
            attempt([&] { insertion = map.insert(hashOfIndex(static_cast<uint64_t>(hash))); });
            if (!threw && expected.first)
            {
                int64_t const evicted = expected.second.second;
                bool const sameEvicted = evicted < 0
                    ? !insertion.evicted
                    : insertion.evicted && insertion.evictedHash == hashOfIndex(static_cast<uint64_t>(evicted));
                if (insertion.hostPage != expected.second.first || !sameEvicted)
                {
                    return what.str() + ": took host page " + std::to_string(insertion.hostPage) + ", the model "
                        + std::to_string(expected.second.first);
                }
            }
        }
        else
        {
            // A call on one host page: touch, pin, unpin or erase, on the map and on the model.
            int32_t const hostPage = anyHostPage(random);
            int32_t const call = kind < 55 ? 0 : kind < 70 ? 1 : kind < 85 ? 2 : 3;
            char const* const names[] = {"touch", "pin", "unpin", "erase"};
            what << names[call] << "(" << hostPage << ")";
            bool (MapModel::*const onModel[])(int32_t) = {
                &MapModel::touch, &MapModel::pin, &MapModel::unpin, &MapModel::erase};
            void (HostPageMap::*const onMap[])(int32_t) = {
                &HostPageMap::touch, &HostPageMap::pin, &HostPageMap::unpin, &HostPageMap::erase};
            expectThrow = !(model.*onModel[call])(hostPage);
            attempt([&] { (map.*onMap[call])(hostPage); });
        }
        std::string const at = "seed " + std::to_string(seed) + ", operation " + std::to_string(op) + " " + what.str();
        if (threw != expectThrow)
        {
            return at + (threw ? ": threw, the model accepts it" : ": accepted, the model refuses it");
        }
        refused[what.str().substr(0, what.str().find('('))] += threw ? 1 : 0;
        if (map.leastRecentFirst() != model.lru())
        {
            return at + ": the LRU order differs from the model's";
        }
        if (map.size() != model.size() || map.numFree() != model.numFree() || map.numUsable() != model.usable()
            || map.numPinned() + static_cast<int32_t>(model.lru().size()) != model.size())
        {
            return at + ": size " + std::to_string(map.size()) + ", free " + std::to_string(map.numFree())
                + " differ from the model's " + std::to_string(model.size()) + ", " + std::to_string(model.numFree());
        }
        for (int32_t p = 0; p < numHostPages; ++p)
        {
            if (map.pinCount(p) != model.pins(p) || map.mapped(p) != model.mapped(p))
            {
                return at + ": host page " + std::to_string(p) + "'s pins or mapping differ from the model's";
            }
        }
        for (int32_t h = 0; h < hashes; ++h)
        {
            if (map.find(hashOfIndex(static_cast<uint64_t>(h))) != model.find(static_cast<uint64_t>(h)))
            {
                return at + ": find(hash " + std::to_string(h) + ") differs from the model's";
            }
        }
        try
        {
            map.checkInvariants();
        }
        catch (std::exception const& error)
        {
            return at + ": " + error.what();
        }
    }
    // Every kind of call must have been refused sometimes, or the run did not reach the refusals.
    for (char const* call : {"setUsable", "insert", "touch", "pin", "unpin", "erase"})
    {
        if (refused[call] == 0)
        {
            return std::string("seed ") + std::to_string(seed) + ": no " + call + " was refused";
        }
    }
    return {};
}

TEST(TieredHostPageMapTest, RandomCallsMatchTheModel)
{
    uint32_t seed = 11;
    for (int32_t const numHostPages : {1, 2, 5, 16})
    {
        EXPECT_EQ(randomRun(seed++, numHostPages, 40000), "");
    }
}

} // namespace
} // namespace kvcache::rt::detail
