#pragma once

// The driver of the randomised page manager test (tests/paging/page_manager/test_page_manager_random.cpp): one run of
// random operations on a PageManager and on the independent model (page_manager_model.h) side by side, from a fixed
// seed, each operation's outcome and everything observable compared after it, with a tally of what the run reached.
// Uses the library's internal detail::PageManagerInternal (adoptRun).

#include "paging/page_manager/page_manager_internal.h"

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_manager.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <map>
#include <numeric>
#include <ostream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/page_manager_model.h"
#include "support/page_manager_snapshot.h"

namespace kvcache::test::random_run
{

//! The runs' shapes: tokens a page, the longest sequence, sequences at once, prompt families, operations of a run
//! (KVCACHE_RANDOM_OPERATIONS aside) and the default period of checkInvariants().
constexpr int32_t kTOKENS_PER_PAGE = 4;
constexpr int32_t kMAX_LENGTH = 32;
constexpr int32_t kMAX_SEQUENCES = 6;
constexpr int32_t kFAMILIES = 3;
constexpr int64_t kOPERATIONS_PER_RUN = 260000;
constexpr int64_t kINVARIANT_PERIOD = 64;

//! Returns the operations of each run: KVCACHE_RANDOM_OPERATIONS when set, else kOPERATIONS_PER_RUN; -1 for a value
//! that is not a positive integer.
inline int64_t operationsPerRun()
{
    char const* const text = std::getenv("KVCACHE_RANDOM_OPERATIONS");
    if (text == nullptr || *text == '\0')
    {
        return kOPERATIONS_PER_RUN;
    }
    char* end = nullptr;
    errno = 0;
    long long const value = std::strtoll(text, &end, 10);
    return errno != 0 || *end != '\0' || value <= 0 ? -1 : static_cast<int64_t>(value);
}

//! A config and the options of one run.
struct RunSpec
{
    char const* name;
    rt::KVCacheConfig config;
    rt::PageHashAlgorithm algorithm;
    uint32_t seed;
    //! checkInvariants() every this many operations.
    int64_t invariantPeriod = kINVARIANT_PERIOD;
    //! This run's share of the operations (the invariant check after every operation costs more).
    int64_t operationsDivisor = 1;
    //! Percent of operations that are setRetention() calls (0: none, and the other operations' draws as without it).
    int32_t retentionPercent = 0;
};

//! Prints a run by its name (test names and failure messages).
inline void PrintTo(RunSpec const& spec, std::ostream* out)
{
    *out << spec.name << " (seed " << spec.seed << ")";
}

//! What happened, for comparing a call with the model's prediction.
inline ModelOutcome outcomeOf(std::exception const* error)
{
    if (error == nullptr)
    {
        return ModelOutcome::kOK;
    }
    if (dynamic_cast<rt::OutOfMemoryError const*>(error) != nullptr)
    {
        return ModelOutcome::kOUT_OF_MEMORY;
    }
    if (dynamic_cast<rt::OutOfRangeError const*>(error) != nullptr)
    {
        return ModelOutcome::kOUT_OF_RANGE;
    }
    if (dynamic_cast<rt::InvalidArgumentError const*>(error) != nullptr)
    {
        return ModelOutcome::kINVALID_ARGUMENT;
    }
    return static_cast<ModelOutcome>(-1);
}

//! The tokens and extra keys a sequence will append, position by position.
struct Script
{
    std::vector<int32_t> tokens;
    std::vector<rt::PageExtraKey> keys; //!< sorted by position
};

//! One randomised run: a manager, the model and the generator; run() returns an empty string or the first failure.
class RandomRun
{
public:
    explicit RandomRun(RunSpec const& spec)
        : mSpec(spec)
        , mRandom(spec.seed)
        , mManager(spec.config, options())
        , mModel(shapes(), kTOKENS_PER_PAGE, kMAX_LENGTH, mManager.layout().maxTokensPerStep, kMAX_SEQUENCES, true,
              rt::PageHasher(spec.algorithm, seed()))
    {
        mManager.setEvictionCallback(
            [this](int32_t group, int32_t page, rt::PageHash hash) {
                mEvicted.push_back({group, page, hash});
            });
        for (int32_t f = 0; f < kFAMILIES; ++f)
        {
            Script family;
            for (int32_t i = 0; i < kMAX_LENGTH; ++i)
            {
                family.tokens.push_back(static_cast<int32_t>(mRandom() % 50000));
            }
            // Family 1 carries a multimodal-like key in its second and fifth pages.
            if (f == 1)
            {
                family.keys = {{5, rt::PageHash{0x1234, 0x5678}}, {17, rt::PageHash{0x9abc, 0xdef0}}};
            }
            mFamilies.push_back(family);
        }
    }

    //! Runs `operations` operations.
    std::string run(int64_t operations)
    {
        for (mOperation = 0; mOperation < operations; ++mOperation)
        {
            std::string failure = oneOperation();
            if (failure.empty())
            {
                failure = compare();
            }
            if (failure.empty() && mOperation % mSpec.invariantPeriod == 0)
            {
                try
                {
                    mManager.checkInvariants();
                }
                catch (std::exception const& error)
                {
                    failure = std::string("checkInvariants: ") + error.what();
                }
            }
            if (!failure.empty())
            {
                std::ostringstream text;
                text << mSpec.name << " seed " << mSpec.seed << ", operation " << mOperation << " (" << mLast
                     << "): " << failure;
                return text.str();
            }
        }
        return {};
    }

    //! Returns how many of each outcome the run saw (so a run that never runs out of pages is noticed).
    std::map<std::string, int64_t> const& tally() const
    {
        mTally["cuts dropped for pages"] = mModel.cutsDroppedForPages();
        mTally["cuts dropped with their page"] = mModel.cutsDroppedWithCarrier();
        return mTally;
    }

private:
    static std::array<uint8_t, 32> seed()
    {
        std::array<uint8_t, 32> bytes{};
        std::iota(bytes.begin(), bytes.end(), uint8_t{42});
        return bytes;
    }

    rt::PageManagerOptions options() const
    {
        rt::PageManagerOptions o;
        o.maxSequences = kMAX_SEQUENCES;
        o.hashAlgorithm = mSpec.algorithm;
        o.hashSeed = seed();
        // Retention durations run on the model's clock, which the operations move on.
        o.clock = [this] { return mModel.now(); };
        return o;
    }

    std::vector<PageManagerModel::GroupShape> shapes() const
    {
        std::vector<PageManagerModel::GroupShape> list;
        for (rt::KVPageGroupLayout const& group : mManager.layout().groups)
        {
            list.push_back({group.slidingWindow, group.numPages});
        }
        return list;
    }

    int32_t uniform(int32_t low, int32_t high) // [low, high]
    {
        return std::uniform_int_distribution<int32_t>(low, high)(mRandom);
    }

    std::vector<rt::SequenceId> live() const
    {
        std::vector<rt::SequenceId> ids;
        for (auto const& entry : mModel.sequences())
        {
            ids.push_back(entry.first);
        }
        return ids;
    }

    //! A live sequence (or, one time in 50, one that is not).
    rt::SequenceId pick()
    {
        std::vector<rt::SequenceId> const ids = live();
        if (ids.empty() || uniform(0, 49) == 0)
        {
            return mDead.empty() || uniform(0, 1) == 0
                ? (rt::SequenceId{777} << 32) + 3
                : mDead[static_cast<size_t>(uniform(0, static_cast<int32_t>(mDead.size()) - 1))];
        }
        return ids[static_cast<size_t>(uniform(0, static_cast<int32_t>(ids.size()) - 1))];
    }

    //! Runs `call` and checks its outcome against `expected`; returns the failure or an empty string.
    template <typename Call>
    std::string expectOutcome(ModelOutcome expected, Call&& call)
    {
        ModelOutcome got = ModelOutcome::kOK;
        std::string message;
        try
        {
            call();
        }
        catch (std::exception const& error)
        {
            got = outcomeOf(&error);
            message = error.what();
        }
        static char const* const names[] = {"ok", "InvalidArgumentError", "OutOfRangeError", "OutOfMemoryError"};
        ++mTally[names[static_cast<int32_t>(expected)]];
        if (got != expected)
        {
            int32_t const g = static_cast<int32_t>(got);
            return std::string("outcome ") + (g >= 0 && g < 4 ? names[g] : "another exception") + " (" + message
                + "), expected " + names[static_cast<int32_t>(expected)];
        }
        if (expected == ModelOutcome::kOUT_OF_MEMORY)
        {
            PageManagerModel::Shortage const& shortage = *mModel.lastShortage();
            for (std::string const& word : {"group " + std::to_string(shortage.group), std::to_string(shortage.needed),
                     std::to_string(shortage.available)})
            {
                if (message.find(word) == std::string::npos)
                {
                    return "the OutOfMemoryError \"" + message + "\" does not name \"" + word + "\"";
                }
            }
        }
        return {};
    }

    std::string newSequence()
    {
        Script script = mFamilies[static_cast<size_t>(uniform(0, kFAMILIES - 1))];
        int32_t const diverge = uniform(0, 2 * kMAX_LENGTH);
        for (int32_t i = diverge; i < kMAX_LENGTH; ++i)
        {
            script.tokens[static_cast<size_t>(i)] = uniform(0, 3); // few values: some divergent pages still match
        }
        static char const kSALT[] = "tenant";
        int32_t const saltKind = uniform(0, 99);
        void const* salt = saltKind < 10 ? kSALT : nullptr;
        size_t const saltBytes = saltKind < 10 || saltKind == 99 ? sizeof(kSALT) : 0;
        mLast = "create";
        ModelOutcome const expected = mModel.checkCreate(salt, saltBytes);
        rt::SequenceId id = -1;
        std::string failure = expectOutcome(expected, [&] { id = mManager.create({salt, saltBytes}); });
        if (failure.empty() && expected == ModelOutcome::kOK)
        {
            mModel.create(id, salt, saltBytes);
            if (!mEverSeen.insert(id).second)
            {
                return "create() returned id " + std::to_string(id) + ", given out before";
            }
            mScripts[id] = script;
        }
        return failure;
    }

    std::string adopt()
    {
        return adoptPrefixOf(pick(), uniform(0, kMAX_LENGTH));
    }

    //! adoptPrefix() of `count` tokens of the sequence's script (rarely an invalid count) against the model.
    std::string adoptPrefixOf(rt::SequenceId id, int32_t count)
    {
        Script const& script = scriptOf(id);
        std::vector<rt::PageExtraKey> keys;
        for (rt::PageExtraKey const& key : script.keys)
        {
            if (key.position < count)
            {
                keys.push_back(key);
            }
        }
        int32_t const* tokens = script.tokens.data();
        if (uniform(0, 99) == 0)
        {
            count = kMAX_LENGTH + 1; // invalid
            tokens = mLong.data();
        }
        mLast = "adoptPrefix(" + std::to_string(id) + ", " + std::to_string(count) + " tokens)";
        int32_t expectedLength = -1;
        ModelOutcome const expected =
            mModel.adoptPrefix(id, tokens, count, keys.data(), static_cast<int32_t>(keys.size()), &expectedLength);
        int32_t got = -1;
        std::string failure = expectOutcome(expected,
            [&] { got = mManager.adoptPrefix(id, tokens, count, keys.data(), static_cast<int32_t>(keys.size())); });
        if (expectedLength > 0)
        {
            ++mTally["adoptPrefix hits"];
        }
        if (failure.empty() && expected == ModelOutcome::kOK && got != expectedLength)
        {
            failure = "adoptPrefix returned " + std::to_string(got) + ", expected " + std::to_string(expectedLength);
        }
        return failure;
    }

    //! A run of whole pages of the sequence's script adopted through detail::PageManagerInternal (hashNextPages,
    //! then adoptRun), against the model's adoptRun. Only calls adoptRun accepts: its refusals are tested on their own.
    std::string adoptRun()
    {
        rt::SequenceId const id = pick();
        if (!mModel.contains(id) || mModel.sequence(id).length % kTOKENS_PER_PAGE != 0)
        {
            return {};
        }
        if (mModel.sequence(id).length == 0 && uniform(0, 1) == 0)
        {
            // As a tiered admission does: the device's prefix first (which leaves the sequence cuts to make where its
            // pages reach them), then a run after it.
            std::string const failure = adoptPrefixOf(id, uniform(1, kMAX_LENGTH));
            if (!failure.empty() || mModel.sequence(id).length % kTOKENS_PER_PAGE != 0)
            {
                return failure;
            }
        }
        int32_t const length = mModel.sequence(id).length;
        int32_t const room = (kMAX_LENGTH - length) / kTOKENS_PER_PAGE;
        if (room == 0)
        {
            return {};
        }
        int32_t const pages = uniform(1, room);
        Script const& script = scriptOf(id);
        std::vector<rt::PageExtraKey> keys;
        for (rt::PageExtraKey const& key : script.keys)
        {
            if (key.position >= length && key.position < length + pages * kTOKENS_PER_PAGE)
            {
                keys.push_back(key);
            }
        }
        int32_t const* tokens = script.tokens.data() + length;
        mLast = "adoptRun(" + std::to_string(id) + ", " + std::to_string(pages) + " pages after "
            + std::to_string(length) + " tokens)";
        std::vector<std::vector<std::pair<int32_t, int32_t>>> expectedFresh;
        bool const expectedFits =
            mModel.adoptRun(id, tokens, pages, keys.data(), static_cast<int32_t>(keys.size()), &expectedFresh);
        std::vector<rt::PageHash> hashes(static_cast<size_t>(pages));
        std::vector<std::vector<rt::detail::FreshPage>> fresh;
        bool fits = false;
        std::string failure = expectOutcome(ModelOutcome::kOK,
            [&]
            {
                rt::detail::NextPageHashes const known = rt::detail::PageManagerInternal::hashNextPages(mManager, id,
                    tokens, pages * kTOKENS_PER_PAGE, hashes.data(), keys.data(), static_cast<int32_t>(keys.size()));
                fits = rt::detail::PageManagerInternal::adoptRun(mManager, known, pages, fresh);
            });
        if (!failure.empty())
        {
            return failure;
        }
        if (fits != expectedFits)
        {
            return std::string("adoptRun returned ") + (fits ? "true" : "false") + ", expected the other";
        }
        if (!fits)
        {
            ++mTally["adoptRun out of pages"];
            return {};
        }
        ++mTally["adoptRun runs"];
        for (size_t g = 0; g < expectedFresh.size(); ++g)
        {
            std::vector<std::pair<int32_t, int32_t>> got;
            for (rt::detail::FreshPage const& page : fresh.at(g))
            {
                got.emplace_back(page.index, page.page);
            }
            if (got != expectedFresh[g])
            {
                return "adoptRun's fresh pages of group " + std::to_string(g) + " differ from the model's";
            }
            mTally["adoptRun fresh pages"] += static_cast<int64_t>(got.size());
        }
        return {};
    }

    Script const& scriptOf(rt::SequenceId id)
    {
        auto found = mScripts.find(id);
        return found == mScripts.end() ? mFamilies[0] : found->second;
    }

    //! Fills `append` for `id` with a random count (rarely an invalid one) and its script's tokens and keys.
    void fillAppend(rt::SequenceId id, rt::SequenceAppend& append, std::vector<rt::PageExtraKey>& keys)
    {
        int32_t const length = mModel.contains(id) ? mModel.sequence(id).length : 0;
        int32_t const step = mManager.layout().maxTokensPerStep;
        int32_t count = uniform(0, 40) == 0 ? step + 1 : uniform(0, step);
        if (length + count > kMAX_LENGTH && uniform(0, 9) != 0)
        {
            count = kMAX_LENGTH - length;
        }
        Script const& script = scriptOf(id);
        append.sequence = id;
        append.count = count;
        append.tokens = length + count <= kMAX_LENGTH ? script.tokens.data() + length : mLong.data();
        // Keys of pages this append completes only.
        int32_t const completeEnd = (length + count) / kTOKENS_PER_PAGE * kTOKENS_PER_PAGE;
        keys.clear();
        for (rt::PageExtraKey const& key : script.keys)
        {
            if (key.position >= length && key.position < completeEnd)
            {
                keys.push_back(key);
            }
        }
        append.extraKeys = keys.data();
        append.numExtraKeys = static_cast<int32_t>(keys.size());
    }

    std::string step(int32_t entries)
    {
        std::vector<rt::SequenceId> ids = live();
        std::shuffle(ids.begin(), ids.end(), mRandom);
        ids.resize(std::min<size_t>(ids.size(), static_cast<size_t>(entries)));
        if (ids.empty() || uniform(0, 99) == 0)
        {
            ids.push_back(pick()); // possibly repeated or unknown
        }
        std::vector<rt::SequenceAppend> appends(ids.size());
        std::vector<std::vector<rt::PageExtraKey>> keys(ids.size());
        mLast = "step(";
        for (size_t i = 0; i < ids.size(); ++i)
        {
            fillAppend(ids[i], appends[i], keys[i]);
            mLast +=
                std::to_string(ids[i]) + " +" + std::to_string(appends[i].count) + (i + 1 < ids.size() ? ", " : "");
        }
        mLast += ")";
        int32_t const count = static_cast<int32_t>(appends.size());
        ModelOutcome const expected = mModel.step(appends.data(), count);
        return expectOutcome(expected,
            [&]
            {
                if (count == 1 && uniform(0, 1) == 0)
                {
                    mCopies.add(mManager.append(appends[0]));
                }
                else
                {
                    mCopies.add(mManager.step(appends.data(), count));
                }
            });
    }

    std::string fork()
    {
        rt::SequenceId const parent = pick();
        mLast = "fork(" + std::to_string(parent) + ")";
        ModelOutcome const expected = mModel.checkFork(parent);
        rt::SequenceId child = -1;
        std::string failure = expectOutcome(expected, [&] { child = mManager.fork(parent); });
        if (failure.empty() && expected == ModelOutcome::kOK)
        {
            mModel.fork(parent, child);
            if (!mEverSeen.insert(child).second)
            {
                return "fork() returned id " + std::to_string(child) + ", given out before";
            }
            mScripts[child] = scriptOf(parent);
        }
        return failure;
    }

    std::string free()
    {
        rt::SequenceId const id = pick();
        mLast = "free(" + std::to_string(id) + ")";
        ModelOutcome const expected = mModel.free(id);
        std::string failure = expectOutcome(expected, [&] { mManager.free(id); });
        if (expected == ModelOutcome::kOK)
        {
            mScripts.erase(id);
            mDead.push_back(id);
        }
        return failure;
    }

    //! setRetention() of a random range (rarely past the sequence) and priority (rarely out of range), half of them
    //! with a duration (rarely out of range); the clock moves on by 0 to 20 ms first.
    std::string retention()
    {
        mModel.setNow(mModel.now() + uniform(0, 20));
        rt::SequenceId const id = pick();
        int32_t const length = mModel.contains(id) ? mModel.sequence(id).length : 0;
        int32_t const first = uniform(0, 29) == 0 ? -1 : uniform(0, length);
        int32_t const end = uniform(0, 29) == 0 ? length + 1 : uniform(std::max(first, 0), length);
        static int32_t const priorities[] = {0, 10, 35, 35, 50, 100};
        int32_t const priority =
            uniform(0, 29) == 0 ? (uniform(0, 1) == 0 ? -1 : 101) : priorities[static_cast<size_t>(uniform(0, 5))];
        int64_t duration = rt::PageManager::kNO_DURATION;
        if (uniform(0, 1) == 0)
        {
            duration = uniform(0, 29) == 0 ? (uniform(0, 1) == 0 ? -5 : rt::PageManager::kMAX_RETENTION_DURATION_MS + 1)
                                           : uniform(0, 60);
        }
        mLast = "setRetention(" + std::to_string(id) + ", " + std::to_string(first) + ", " + std::to_string(end) + ", "
            + std::to_string(priority) + ", " + std::to_string(duration) + ") at " + std::to_string(mModel.now());
        ModelOutcome const expected = mModel.setRetention(id, first, end, priority, duration);
        if (expected == ModelOutcome::kOK && priority != rt::PageManager::kDEFAULT_RETENTION_PRIORITY && first < end)
        {
            ++mTally[duration == rt::PageManager::kNO_DURATION ? "retention raised" : "retention raised for a time"];
        }
        // The ends so far (they take effect in steps and evictions): how often a cached page changed priority.
        mTally["cached pages moved at a duration's end"] = mModel.expiredMoves();
        return expectOutcome(expected, [&] { mManager.setRetention(id, first, end, priority, duration); });
    }

    std::string evict()
    {
        int32_t const groups = mManager.numGroups();
        int32_t const group = uniform(0, 49) == 0 ? groups : uniform(0, groups - 1);
        int32_t const count = uniform(0, 49) == 0 ? -1 : uniform(0, 4);
        mLast = "evictCached(" + std::to_string(group) + ", " + std::to_string(count) + ")";
        int32_t expectedDropped = -1;
        ModelOutcome const expected = mModel.evictCached(group, count, &expectedDropped);
        int32_t got = -1;
        std::string failure = expectOutcome(expected, [&] { got = mManager.evictCached(group, count); });
        if (failure.empty() && expected == ModelOutcome::kOK && got != expectedDropped)
        {
            failure = "evictCached returned " + std::to_string(got) + ", expected " + std::to_string(expectedDropped);
        }
        return failure;
    }

    std::string oneOperation()
    {
        if (mSpec.retentionPercent > 0 && uniform(0, 99) < mSpec.retentionPercent)
        {
            return retention();
        }
        int32_t const roll = uniform(0, 99);
        if (roll < 10)
        {
            return newSequence();
        }
        if (roll < 17)
        {
            return adopt();
        }
        if (roll < 20)
        {
            return adoptRun();
        }
        if (roll < 45)
        {
            return step(1);
        }
        if (roll < 63)
        {
            return step(uniform(2, kMAX_SEQUENCES));
        }
        if (roll < 71)
        {
            return fork();
        }
        if (roll < 85)
        {
            return free();
        }
        if (roll < 92)
        {
            return evict();
        }
        if (roll < 99)
        {
            mLast = "clearCopies";
            for (int32_t g = 0; g < mModel.numGroups(); ++g)
            {
                mTally["copies cleared"] += static_cast<int64_t>(mModel.group(g).copies.size());
            }
            mCopies.clear();
            mModel.clearCopies();
            return {};
        }
        mLast = "resetStats";
        mManager.resetStats();
        mModel.resetStats();
        return {};
    }

    //! Compares everything observable with the model.
    std::string compare()
    {
        std::string difference = differenceOf(snapshotOf(mManager, live(), mCopies), snapshotOf(mModel));
        if (!difference.empty())
        {
            return difference;
        }
        for (int32_t g = 0; g < mModel.numGroups(); ++g)
        {
            mTally["anchored cached pages"] += mModel.counts(g).anchored;
            // The snapshots compared every page's priority; count the cached ones that order eviction.
            PageManagerModel::Group const& group = mModel.group(g);
            for (int32_t const page : group.lru)
            {
                if (group.priorityOf(page) != rt::PageManager::kDEFAULT_RETENTION_PRIORITY)
                {
                    ++mTally["cached pages of another priority"];
                }
            }
        }
        std::vector<ModelEviction> const& expected = mModel.evictions();
        mTally["evictions"] += static_cast<int64_t>(expected.size());
        if (mEvicted.size() != expected.size())
        {
            return "the callback saw " + std::to_string(mEvicted.size()) + " evictions, expected "
                + std::to_string(expected.size());
        }
        for (size_t i = 0; i < expected.size(); ++i)
        {
            if (mEvicted[i].group != expected[i].group || mEvicted[i].page != expected[i].page)
            {
                return "eviction " + std::to_string(i) + " of group " + std::to_string(mEvicted[i].group) + " page "
                    + std::to_string(mEvicted[i].page) + ", expected group " + std::to_string(expected[i].group)
                    + " page " + std::to_string(expected[i].page);
            }
            // The model encodes extra keys its own way: its hashes map one to one onto the manager's.
            std::pair<uint64_t, uint64_t> const mine{expected[i].hash.lo, expected[i].hash.hi};
            std::pair<uint64_t, uint64_t> const theirs{mEvicted[i].hash.lo, mEvicted[i].hash.hi};
            auto const forward = mHashMap.emplace(mine, theirs).first;
            auto const backward = mHashMapBack.emplace(theirs, mine).first;
            if (forward->second != theirs || backward->second != mine)
            {
                return "eviction " + std::to_string(i) + " reported a hash that does not match the model's page";
            }
        }
        mEvicted.clear();
        mModel.clearEvictions();
        return {};
    }

    RunSpec mSpec;
    std::mt19937 mRandom;
    rt::PageManager mManager;
    PageManagerModel mModel;
    //! The copies mManager's steps returned since the last clear, compared with those the model queued.
    CopyLog mCopies;
    std::vector<Script> mFamilies;
    std::map<rt::SequenceId, Script> mScripts;
    std::vector<rt::SequenceId> mDead;
    std::set<rt::SequenceId> mEverSeen;
    std::vector<ModelEviction> mEvicted;
    std::map<std::pair<uint64_t, uint64_t>, std::pair<uint64_t, uint64_t>> mHashMap;
    std::map<std::pair<uint64_t, uint64_t>, std::pair<uint64_t, uint64_t>> mHashMapBack;
    mutable std::map<std::string, int64_t> mTally;
    std::vector<int32_t> const mLong = std::vector<int32_t>(2 * kMAX_LENGTH, 1);
    int64_t mOperation = 0;
    std::string mLast;
};

} // namespace kvcache::test::random_run
