#pragma once

// The tests' own model of the PageManager contract (kvcache/paging/page_manager.h), written from the header's text
// without the library's code: reference counts in vectors, the free pages on a stack, the cached pages in a vector in
// release order, each group's cache a std::map from hash to page, lists searched linearly. Hashes come from the same
// rt::PageHasher (same algorithm and seed); extra keys are fed to it in the model's own byte encoding, so a model
// hash equals the manager's only for pages without extra keys, and tests compare the rest through a one-to-one map.
// A hybrid cache's cuts (the header's "Hybrid caches" paragraph) are kept as records with their windows' page ids,
// their count and the order they were made in, in a vector in the clock's order from its hand on; the cut a windowed
// group drops is found by searching it, and whether a page is anchored too. What was dropped at a full-attention page
// is a std::map entry until the page is evicted. Retention priorities are a number per page; eviction searches the
// cached vector for the first page of the lowest.

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_manager.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kvcache::test
{

//! What the model predicts a call does.
enum class ModelOutcome : int32_t
{
    kOK = 0,
    kINVALID_ARGUMENT = 1, //!< rt::InvalidArgumentError, nothing changed
    kOUT_OF_RANGE = 2,     //!< rt::OutOfRangeError, nothing changed
    kOUT_OF_MEMORY = 3,    //!< rt::OutOfMemoryError, nothing changed
};

//! One call of the eviction callback.
struct ModelEviction
{
    int32_t group = 0;
    int32_t page = 0;
    rt::PageHash hash = {};
};

//! The reference model of one PageManager.
class PageManagerModel
{
public:
    //! Per-group inputs the model takes from the config: the window and the pool size.
    struct GroupShape
    {
        int32_t slidingWindow = 0;
        int32_t numPages = 0;
    };

    //! Pages of one group, by state, as the model keeps them.
    struct Group
    {
        int32_t slidingWindow = 0;
        int32_t numPages = 0;
        std::vector<int32_t> refCount;
        std::vector<uint8_t> registered;
        std::vector<rt::PageHash> hash;
        //! Free pages; back() is the most recently freed, taken first.
        std::vector<int32_t> freeStack;
        //! Cached pages no cut anchors, in release order (a dropped cut's at the front); the first of the lowest
        //! retention priority is evicted first.
        std::vector<int32_t> lru;
        //! Cached pages a cut anchors (windowed groups of a hybrid cache), in no order.
        std::vector<int32_t> anchoredCached;
        std::map<std::pair<uint64_t, uint64_t>, int32_t> cache;
        std::vector<rt::PageCopy> copies;
        //! Per page, the highest retention priority its holders set (setRetention) without a duration, -1 while none
        //! did (the default then) and again once free.
        std::vector<int32_t> priority;
        //! Per page, the timed priority in force (-1: none) and when it ends.
        std::vector<int32_t> timed;
        std::vector<int64_t> timedEnd;
        //! Returns the retention priority of `page`: the higher of the two it holds, the default when none.
        int32_t priorityOf(int32_t page) const
        {
            int32_t const set = std::max(priority[static_cast<size_t>(page)], timed[static_cast<size_t>(page)]);
            return set < 0 ? rt::PageManager::kDEFAULT_RETENTION_PRIORITY : set;
        }
        //! Unsets both priorities of a page that becomes free.
        void unsetPriority(int32_t page)
        {
            priority[static_cast<size_t>(page)] = -1;
            timed[static_cast<size_t>(page)] = -1;
        }
    };

    //! One live sequence.
    struct Sequence
    {
        int32_t length = 0;
        rt::PageHash root = {};
        //! Hash of every full page, in token order.
        std::vector<rt::PageHash> pageHashes;
        //! Tokens of the partial last page.
        std::vector<int32_t> partialTokens;
        //! Entries per group: page ids in token order, kUNUSED_PAGE_ENTRY where a window released one.
        std::vector<std::vector<int32_t>> entries;
        //! Cuts of a hybrid cache to make once the sequence holds this many whole pages (0: none).
        int32_t promptBoundary = 0;
        int32_t matchBoundary = 0;
    };

    //! A cut of a hybrid cache: `pages` whole pages, on page `fullPage` of the full-attention group; per group, the
    //! window pages it anchors in token order (none in the full-attention group).
    struct Cut
    {
        int32_t fullPage = 0;
        int32_t pages = 0;
        std::vector<std::vector<int32_t>> window;
        //! Its count on the clock; whether it was adopted (or made again after being dropped) since it was made; when
        //! it was made (cuts made earlier have smaller numbers).
        int32_t hits = 0;
        bool adopted = false;
        int64_t made = 0;
    };

    //! The OutOfMemoryError the model predicts: the first group short of pages.
    struct Shortage
    {
        int32_t group = 0;
        int64_t needed = 0;
        int64_t available = 0;
    };

    PageManagerModel(std::vector<GroupShape> const& groups, int32_t tokensPerPage, int32_t maxSequenceLength,
        int32_t maxTokensPerStep, int32_t maxSequences, bool prefixCaching, rt::PageHasher hasher)
        : mTokensPerPage(tokensPerPage)
        , mMaxSequenceLength(maxSequenceLength)
        , mMaxTokensPerStep(maxTokensPerStep)
        , mMaxSequences(maxSequences)
        , mPrefixCaching(prefixCaching)
        , mHasher(hasher)
    {
        for (GroupShape const& shape : groups)
        {
            Group group;
            group.slidingWindow = shape.slidingWindow;
            group.numPages = shape.numPages;
            group.refCount.assign(static_cast<size_t>(shape.numPages), 0);
            group.registered.assign(static_cast<size_t>(shape.numPages), 0);
            group.hash.assign(static_cast<size_t>(shape.numPages), rt::PageHash{});
            group.priority.assign(static_cast<size_t>(shape.numPages), -1);
            group.timed.assign(static_cast<size_t>(shape.numPages), -1);
            group.timedEnd.assign(static_cast<size_t>(shape.numPages), 0);
            // A new manager hands out 0, 1, 2, ...: page 0 on top of the stack.
            for (int32_t page = shape.numPages - 1; page >= 0; --page)
            {
                group.freeStack.push_back(page);
            }
            mGroups.push_back(std::move(group));
        }
        // Hybrid: prefix caching, a full-attention group (the first carries the cuts) and a windowed one.
        bool anyWindowed = false;
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            anyWindowed = anyWindowed || mGroups[static_cast<size_t>(g)].slidingWindow != 0;
            if (mGroups[static_cast<size_t>(g)].slidingWindow == 0 && mCutGroup < 0)
            {
                mCutGroup = g;
            }
        }
        if (!prefixCaching || !anyWindowed)
        {
            mCutGroup = -1;
        }
        mCutTarget = mCutGroup >= 0 ? mGroups[static_cast<size_t>(mCutGroup)].numPages : 0;
    }

    // Queries ------------------------------------------------------------------------------------------------------

    int32_t numGroups() const
    {
        return static_cast<int32_t>(mGroups.size());
    }
    Group const& group(int32_t g) const
    {
        return mGroups.at(static_cast<size_t>(g));
    }
    std::map<rt::SequenceId, Sequence> const& sequences() const
    {
        return mSequences;
    }
    bool contains(rt::SequenceId id) const
    {
        return mSequences.count(id) != 0;
    }
    Sequence const& sequence(rt::SequenceId id) const
    {
        return mSequences.at(id);
    }
    rt::PageManagerStats const& stats() const
    {
        return mStats;
    }
    void resetStats()
    {
        mStats = {};
    }
    std::vector<ModelEviction> const& evictions() const
    {
        return mEvictions;
    }
    void clearEvictions()
    {
        mEvictions.clear();
    }
    std::optional<Shortage> const& lastShortage() const
    {
        return mShortage;
    }
    //! The cuts, from the clock's hand on.
    std::vector<Cut> const& cuts() const
    {
        return mCuts;
    }
    //! The most cuts never adopted that the clock keeps before dropping the oldest of them first.
    int32_t cutTarget() const
    {
        return mCutTarget;
    }
    //! Cuts dropped so far because a windowed group needed a page, and because their full-attention page was evicted.
    int64_t cutsDroppedForPages() const
    {
        return mCutsDroppedForPages;
    }
    int64_t cutsDroppedWithCarrier() const
    {
        return mCutsDroppedWithCarrier;
    }

    //! Returns the counts of group `g`, counted page by page.
    rt::PageGroupCounts counts(int32_t g) const
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

    //! Returns the pages of a windowed group `g` a sequence needs before its token `position` (the entries from
    //! which on stay): tokens more than W - 1 before `position` are out of the window.
    int32_t firstNeededPage(int32_t g, int64_t position) const
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

    //! Returns the hash of one page of tokens in the model's encoding of extra keys (those among `keys` that fall in
    //! [start, start + P)).
    rt::PageHash hashPage(
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

    // Operations: each validates first and changes nothing unless it returns kOK --------------------------------

    //! create(): `id` is the id the manager returned (ids are the manager's to choose).
    ModelOutcome create(rt::SequenceId id, void const* salt, size_t saltBytes)
    {
        if (static_cast<int32_t>(mSequences.size()) >= mMaxSequences || (salt == nullptr && saltBytes > 0))
        {
            return ModelOutcome::kINVALID_ARGUMENT;
        }
        Sequence sequence;
        sequence.root = mHasher.root(salt, saltBytes);
        sequence.entries.assign(mGroups.size(), {});
        mSequences[id] = std::move(sequence);
        return ModelOutcome::kOK;
    }

    //! Predicts whether create() succeeds without changing anything.
    ModelOutcome checkCreate(void const* salt, size_t saltBytes) const
    {
        return static_cast<int32_t>(mSequences.size()) >= mMaxSequences || (salt == nullptr && saltBytes > 0)
            ? ModelOutcome::kINVALID_ARGUMENT
            : ModelOutcome::kOK;
    }

    //! adoptPrefix(); `*adopted` receives the result.
    ModelOutcome adoptPrefix(rt::SequenceId id, int32_t const* tokens, int32_t count, rt::PageExtraKey const* keys,
        int32_t numKeys, int32_t* adopted)
    {
        auto found = mSequences.find(id);
        if (found == mSequences.end() || found->second.length != 0 || count < 0 || count > mMaxSequenceLength
            || (count > 0 && tokens == nullptr) || !keysValid(keys, numKeys, 0, count))
        {
            return ModelOutcome::kINVALID_ARGUMENT;
        }
        Sequence& sequence = found->second;
        mStats.prefixQueryTokens += count;
        sequence.promptBoundary = 0;
        sequence.matchBoundary = 0;
        *adopted = 0;
        if (!mPrefixCaching || count == 0)
        {
            return ModelOutcome::kOK;
        }
        int32_t const maxWhole = (count - 1) / mTokensPerPage;
        std::vector<rt::PageHash> hashes;
        rt::PageHash parent = sequence.root;
        for (int32_t p = 0; p < maxWhole; ++p)
        {
            parent = hashPage(parent, tokens + int64_t{p} * mTokensPerPage, int64_t{p} * mTokensPerPage, keys, numKeys);
            hashes.push_back(parent);
        }
        // The run the full-attention groups have (a hybrid cache cuts there later).
        int32_t fullRun = 0;
        for (bool all = true; all && fullRun < maxWhole; fullRun += all ? 1 : 0)
        {
            for (int32_t g = 0; g < numGroups() && all; ++g)
            {
                all = mGroups[static_cast<size_t>(g)].slidingWindow != 0
                    || lookup(mGroups[static_cast<size_t>(g)], hashes[static_cast<size_t>(fullRun)]).has_value();
            }
        }
        // The longest n whose needed pages are cached in every group.
        int32_t n = maxWhole;
        for (; n > 0; --n)
        {
            bool all = true;
            for (int32_t g = 0; g < numGroups() && all; ++g)
            {
                for (int32_t p = firstNeededPage(g, int64_t{n} * mTokensPerPage); p < n && all; ++p)
                {
                    all = lookup(mGroups[static_cast<size_t>(g)], hashes[static_cast<size_t>(p)]).has_value();
                }
            }
            if (all)
            {
                break;
            }
        }
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            Group& group = mGroups[static_cast<size_t>(g)];
            int32_t const first = firstNeededPage(g, int64_t{n} * mTokensPerPage);
            std::vector<int32_t>& entries = sequence.entries[static_cast<size_t>(g)];
            for (int32_t p = 0; p < n; ++p)
            {
                if (p < first)
                {
                    entries.push_back(rt::kUNUSED_PAGE_ENTRY);
                    continue;
                }
                int32_t const page = *lookup(group, hashes[static_cast<size_t>(p)]);
                if (group.refCount[static_cast<size_t>(page)] == 0)
                {
                    unlist(group, page);
                }
                ++group.refCount[static_cast<size_t>(page)];
                entries.push_back(page);
            }
        }
        sequence.pageHashes.assign(hashes.begin(), hashes.begin() + n);
        sequence.length = n * mTokensPerPage;
        mStats.prefixHitTokens += sequence.length;
        *adopted = sequence.length;
        if (mCutGroup >= 0)
        {
            sequence.promptBoundary = maxWhole > n ? maxWhole : 0;
            sequence.matchBoundary = fullRun > n ? fullRun : 0;
            makeCut(sequence.pageHashes, n, true);
        }
        return ModelOutcome::kOK;
    }

    //! step(); on kOUT_OF_MEMORY lastShortage() names the group and the counts.
    ModelOutcome step(rt::SequenceAppend const* appends, int32_t count)
    {
        mShortage.reset();
        if (count < 0 || (count > 0 && appends == nullptr))
        {
            return ModelOutcome::kINVALID_ARGUMENT;
        }
        std::vector<rt::SequenceId> seen;
        for (int32_t i = 0; i < count; ++i)
        {
            rt::SequenceAppend const& a = appends[i];
            auto found = mSequences.find(a.sequence);
            if (found == mSequences.end() || std::find(seen.begin(), seen.end(), a.sequence) != seen.end())
            {
                return ModelOutcome::kINVALID_ARGUMENT;
            }
            seen.push_back(a.sequence);
            int64_t const length = found->second.length;
            if (a.count < 0 || a.count > mMaxTokensPerStep || length + a.count > mMaxSequenceLength
                || (a.count > 0 && a.tokens == nullptr)
                || !keysValid(a.extraKeys, a.numExtraKeys, length, length + a.count))
            {
                return ModelOutcome::kINVALID_ARGUMENT;
            }
        }
        // Pages the step needs and has, group by group, with the holders' counts changing as the entries go. An
        // entry of 0 tokens writes nothing and releases nothing. Every entry's out-of-window pages are released
        // before any page is taken, so a page released by all its holders serves the whole step.
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            Group const& group = mGroups[static_cast<size_t>(g)];
            std::map<int32_t, int32_t> refs;
            auto refsOf = [&](int32_t page) -> int32_t&
            {
                auto it = refs.find(page);
                if (it == refs.end())
                {
                    it = refs.emplace(page, group.refCount[static_cast<size_t>(page)]).first;
                }
                return it->second;
            };
            int64_t releasedToZero = 0;
            for (int32_t i = 0; i < count; ++i)
            {
                Sequence const& sequence = mSequences.at(appends[i].sequence);
                std::vector<int32_t> const& entries = sequence.entries[static_cast<size_t>(g)];
                int32_t const first = appends[i].count > 0 ? firstNeededPage(g, sequence.length) : 0;
                for (int32_t p = 0; p < first && p < static_cast<int32_t>(entries.size()); ++p)
                {
                    int32_t const page = entries[static_cast<size_t>(p)];
                    if (page != rt::kUNUSED_PAGE_ENTRY && --refsOf(page) == 0)
                    {
                        ++releasedToZero;
                    }
                }
            }
            int64_t needed = 0;
            for (int32_t i = 0; i < count; ++i)
            {
                rt::SequenceAppend const& a = appends[i];
                Sequence const& sequence = mSequences.at(a.sequence);
                std::vector<int32_t> const& entries = sequence.entries[static_cast<size_t>(g)];
                needed += pagesFor(sequence.length + a.count) - pagesFor(sequence.length);
                if (a.count > 0 && sequence.length % mTokensPerPage != 0)
                {
                    int32_t const last = entries.back();
                    if (refsOf(last) > 1)
                    {
                        --refsOf(last);
                        ++needed;
                    }
                }
            }
            int64_t const available =
                static_cast<int64_t>(group.freeStack.size() + group.lru.size() + group.anchoredCached.size())
                + releasedToZero;
            if (needed > available)
            {
                mShortage = Shortage{g, needed, available};
                return ModelOutcome::kOUT_OF_MEMORY;
            }
        }
        expireRetention();
        // The new full pages' hashes, per entry, before any group registers them.
        std::vector<std::vector<rt::PageHash>> newHashes(static_cast<size_t>(count));
        for (int32_t i = 0; i < count && mPrefixCaching; ++i)
        {
            rt::SequenceAppend const& a = appends[i];
            Sequence const& sequence = mSequences.at(a.sequence);
            std::vector<int32_t> tokens = sequence.partialTokens;
            tokens.insert(tokens.end(), a.tokens, a.tokens + a.count);
            int64_t const pageStart = int64_t{sequence.length} / mTokensPerPage * mTokensPerPage;
            rt::PageHash parent = sequence.pageHashes.empty() ? sequence.root : sequence.pageHashes.back();
            for (int64_t offset = 0; offset + mTokensPerPage <= static_cast<int64_t>(tokens.size());
                 offset += mTokensPerPage)
            {
                parent = hashPage(parent, tokens.data() + offset, pageStart + offset, a.extraKeys, a.numExtraKeys);
                newHashes[static_cast<size_t>(i)].push_back(parent);
            }
        }
        // Releases of every entry (list order, groups ascending, pages ascending) ...
        for (int32_t i = 0; i < count; ++i)
        {
            Sequence& sequence = mSequences.at(appends[i].sequence);
            for (int32_t g = 0; g < numGroups() && appends[i].count > 0; ++g)
            {
                std::vector<int32_t>& entries = sequence.entries[static_cast<size_t>(g)];
                int32_t const first = firstNeededPage(g, sequence.length);
                for (int32_t p = 0; p < first && p < static_cast<int32_t>(entries.size()); ++p)
                {
                    if (entries[static_cast<size_t>(p)] != rt::kUNUSED_PAGE_ENTRY)
                    {
                        release(mGroups[static_cast<size_t>(g)], entries[static_cast<size_t>(p)]);
                        entries[static_cast<size_t>(p)] = rt::kUNUSED_PAGE_ENTRY;
                    }
                }
            }
        }
        // ... then entry by entry: in each group the shared partial page replaced and the new pages taken, then the
        // pages that became full registered in every group.
        for (int32_t i = 0; i < count; ++i)
        {
            rt::SequenceAppend const& a = appends[i];
            Sequence& sequence = mSequences.at(a.sequence);
            if (a.count == 0)
            {
                continue;
            }
            for (int32_t g = 0; g < numGroups(); ++g)
            {
                Group& group = mGroups[static_cast<size_t>(g)];
                std::vector<int32_t>& entries = sequence.entries[static_cast<size_t>(g)];
                if (sequence.length % mTokensPerPage != 0)
                {
                    int32_t const last = entries.back();
                    if (group.refCount[static_cast<size_t>(last)] > 1)
                    {
                        int32_t const fresh = take(g);
                        group.copies.push_back(rt::PageCopy{last, fresh});
                        release(group, last);
                        entries.back() = fresh;
                        ++mStats.copyOnWritePages;
                    }
                }
                int64_t const newPages = pagesFor(sequence.length + a.count) - pagesFor(sequence.length);
                for (int64_t n = 0; n < newPages; ++n)
                {
                    entries.push_back(take(g));
                }
            }
            std::vector<rt::PageHash> const& hashes = newHashes[static_cast<size_t>(i)];
            int64_t const firstFull = sequence.length / mTokensPerPage;
            std::vector<rt::PageHash> known = sequence.pageHashes;
            for (size_t h = 0; h < hashes.size(); ++h)
            {
                for (int32_t g = 0; g < numGroups(); ++g)
                {
                    Group& group = mGroups[static_cast<size_t>(g)];
                    registerPage(
                        group, sequence.entries[static_cast<size_t>(g)][static_cast<size_t>(firstFull) + h], hashes[h]);
                }
                // A cut the sequence waits for is made as soon as the page that completes it is registered.
                known.push_back(hashes[h]);
                int32_t const whole = static_cast<int32_t>(known.size());
                if (mCutGroup >= 0 && (whole == sequence.promptBoundary || whole == sequence.matchBoundary))
                {
                    makeCut(known, whole);
                }
            }
        }
        for (int32_t i = 0; i < count; ++i)
        {
            rt::SequenceAppend const& a = appends[i];
            Sequence& sequence = mSequences.at(a.sequence);
            std::vector<rt::PageHash> const& hashes = newHashes[static_cast<size_t>(i)];
            sequence.pageHashes.insert(sequence.pageHashes.end(), hashes.begin(), hashes.end());
            sequence.partialTokens.insert(sequence.partialTokens.end(), a.tokens, a.tokens + a.count);
            sequence.length += a.count;
            sequence.partialTokens.erase(
                sequence.partialTokens.begin(), sequence.partialTokens.end() - sequence.length % mTokensPerPage);
        }
        return ModelOutcome::kOK;
    }

    //! fork(): `child` is the id the manager returned.
    ModelOutcome fork(rt::SequenceId parent, rt::SequenceId child)
    {
        ModelOutcome const outcome = checkFork(parent);
        if (outcome != ModelOutcome::kOK)
        {
            return outcome;
        }
        Sequence copy = mSequences.at(parent);
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            for (int32_t const page : copy.entries[static_cast<size_t>(g)])
            {
                if (page != rt::kUNUSED_PAGE_ENTRY)
                {
                    ++mGroups[static_cast<size_t>(g)].refCount[static_cast<size_t>(page)];
                }
            }
        }
        mSequences[child] = std::move(copy);
        return ModelOutcome::kOK;
    }

    //! Predicts whether fork() succeeds without changing anything.
    ModelOutcome checkFork(rt::SequenceId parent) const
    {
        return mSequences.count(parent) == 0 || static_cast<int32_t>(mSequences.size()) >= mMaxSequences
            ? ModelOutcome::kINVALID_ARGUMENT
            : ModelOutcome::kOK;
    }

    //! free().
    ModelOutcome free(rt::SequenceId id)
    {
        auto found = mSequences.find(id);
        if (found == mSequences.end())
        {
            return ModelOutcome::kINVALID_ARGUMENT;
        }
        if (mCutGroup >= 0)
        {
            makeCut(found->second.pageHashes, found->second.length / mTokensPerPage);
        }
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            std::vector<int32_t> const& entries = found->second.entries[static_cast<size_t>(g)];
            for (auto it = entries.rbegin(); it != entries.rend(); ++it)
            {
                if (*it != rt::kUNUSED_PAGE_ENTRY)
                {
                    release(mGroups[static_cast<size_t>(g)], *it);
                }
            }
        }
        mSequences.erase(found);
        return ModelOutcome::kOK;
    }

    //! setRetention(): every page the sequence holds with a token in [firstToken, endToken) gets `priority` when none
    //! was set on it or it is higher; with a duration, as its timed priority, ending at now() + durationMs.
    ModelOutcome setRetention(rt::SequenceId id, int32_t firstToken, int32_t endToken, int32_t priority,
        int64_t durationMs = rt::PageManager::kNO_DURATION)
    {
        auto found = mSequences.find(id);
        bool const timedSet = durationMs != rt::PageManager::kNO_DURATION;
        if (found == mSequences.end() || priority < 0 || priority > rt::PageManager::kMAX_RETENTION_PRIORITY
            || (timedSet && (durationMs < 0 || durationMs > rt::PageManager::kMAX_RETENTION_DURATION_MS))
            || firstToken < 0 || firstToken > endToken || endToken > found->second.length)
        {
            return ModelOutcome::kINVALID_ARGUMENT;
        }
        for (int32_t token = firstToken; token < endToken; ++token)
        {
            for (size_t g = 0; g < mGroups.size(); ++g)
            {
                int32_t const page = found->second.entries[g][static_cast<size_t>(token / mTokensPerPage)];
                if (page == rt::kUNUSED_PAGE_ENTRY)
                {
                    continue;
                }
                Group& group = mGroups[g];
                size_t const at = static_cast<size_t>(page);
                if (!timedSet)
                {
                    group.priority[at] = std::max(group.priority[at], priority);
                }
                else if (group.timed[at] < priority)
                {
                    group.timed[at] = priority;
                    group.timedEnd[at] = mNow + durationMs;
                }
                else if (group.timed[at] == priority)
                {
                    group.timedEnd[at] = std::max(group.timedEnd[at], mNow + durationMs);
                }
            }
        }
        return ModelOutcome::kOK;
    }

    //! The clock of retention durations (PageManagerOptions::clock), in milliseconds.
    int64_t now() const
    {
        return mNow;
    }
    void setNow(int64_t ms)
    {
        mNow = ms;
    }
    //! Cached pages moved to another priority by a duration's end, since construction.
    int64_t expiredMoves() const
    {
        return mExpiredMoves;
    }
    //! Drops the timed priorities that have ended, group by group, each group's by (end, page); a page on the list
    //! whose priority that changes becomes the newest there.
    void expireRetention()
    {
        for (Group& group : mGroups)
        {
            std::vector<std::pair<int64_t, int32_t>> ended;
            for (int32_t page = 0; page < group.numPages; ++page)
            {
                size_t const at = static_cast<size_t>(page);
                if (group.timed[at] >= 0 && group.timedEnd[at] <= mNow)
                {
                    ended.emplace_back(group.timedEnd[at], page);
                }
            }
            std::sort(ended.begin(), ended.end());
            for (auto const& [end, page] : ended)
            {
                int32_t const before = group.priorityOf(page);
                group.timed[static_cast<size_t>(page)] = -1;
                auto listed = std::find(group.lru.begin(), group.lru.end(), page);
                if (listed != group.lru.end() && group.priorityOf(page) != before)
                {
                    group.lru.erase(listed);
                    group.lru.push_back(page);
                    ++mExpiredMoves;
                }
            }
        }
    }

    //! evictCached(); `*dropped` receives the result.
    ModelOutcome evictCached(int32_t g, int32_t count, int32_t* dropped)
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

    //! detail::PageManagerInternal::adoptRun of the next `pages` whole pages of `tokens` (the sequence's tokens from
    //! its length on; `keys` those in them) for a sequence that holds whole pages only and prefix caching on: returns
    //! false, changing nothing, when a group lacks the free and cached pages for its fresh pages; else adopts the run
    //! and writes each group's fresh (entry, page) pairs to `*fresh`. A run page a group needs (every page in full
    //! attention, the window before the run's end in a windowed group) is its registered page when there is one, held,
    //! else a fresh page registered under the page's hash; out-of-window entries are released first. Cuts as
    //! adoptPrefix leaves them for the sequence, then the run's own.
    bool adoptRun(rt::SequenceId id, int32_t const* tokens, int32_t pages, rt::PageExtraKey const* keys,
        int32_t numKeys, std::vector<std::vector<std::pair<int32_t, int32_t>>>* fresh)
    {
        Sequence& sequence = mSequences.at(id);
        int32_t const first = sequence.length / mTokensPerPage;
        int32_t const end = first + pages;
        std::vector<rt::PageHash> hashes;
        rt::PageHash parent = sequence.pageHashes.empty() ? sequence.root : sequence.pageHashes.back();
        for (int32_t p = 0; p < pages; ++p)
        {
            parent = hashPage(
                parent, tokens + int64_t{p} * mTokensPerPage, int64_t{first + p} * mTokensPerPage, keys, numKeys);
            hashes.push_back(parent);
        }
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            Group const& group = mGroups[static_cast<size_t>(g)];
            int32_t const window = firstNeededPage(g, int64_t{end} * mTokensPerPage);
            int64_t taken = 0;
            int64_t available =
                static_cast<int64_t>(group.freeStack.size() + group.lru.size() + group.anchoredCached.size());
            for (int32_t p = std::max(first, window); p < end; ++p)
            {
                std::optional<int32_t> const page = lookup(group, hashes[static_cast<size_t>(p - first)]);
                taken += page.has_value() ? 0 : 1;
                available -= page.has_value() && group.refCount[static_cast<size_t>(*page)] == 0 ? 1 : 0;
            }
            std::vector<int32_t> const& entries = sequence.entries[static_cast<size_t>(g)];
            for (int32_t e = 0; e < std::min(first, window); ++e)
            {
                int32_t const page = entries[static_cast<size_t>(e)];
                available += page != rt::kUNUSED_PAGE_ENTRY && group.refCount[static_cast<size_t>(page)] == 1 ? 1 : 0;
            }
            if (taken > available)
            {
                return false;
            }
        }
        fresh->assign(static_cast<size_t>(numGroups()), {});
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            Group& group = mGroups[static_cast<size_t>(g)];
            int32_t const window = firstNeededPage(g, int64_t{end} * mTokensPerPage);
            std::vector<int32_t>& entries = sequence.entries[static_cast<size_t>(g)];
            for (int32_t e = 0; e < std::min(first, window); ++e)
            {
                if (entries[static_cast<size_t>(e)] != rt::kUNUSED_PAGE_ENTRY)
                {
                    release(group, entries[static_cast<size_t>(e)]);
                    entries[static_cast<size_t>(e)] = rt::kUNUSED_PAGE_ENTRY;
                }
            }
            entries.resize(static_cast<size_t>(end), rt::kUNUSED_PAGE_ENTRY);
            std::vector<int32_t> missing;
            for (int32_t p = std::max(first, window); p < end; ++p)
            {
                std::optional<int32_t> const page = lookup(group, hashes[static_cast<size_t>(p - first)]);
                if (!page.has_value())
                {
                    missing.push_back(p);
                    continue;
                }
                if (group.refCount[static_cast<size_t>(*page)] == 0)
                {
                    unlist(group, *page);
                }
                ++group.refCount[static_cast<size_t>(*page)];
                entries[static_cast<size_t>(p)] = *page;
            }
            for (int32_t const p : missing)
            {
                int32_t const page = take(g);
                registerPage(group, page, hashes[static_cast<size_t>(p - first)]);
                entries[static_cast<size_t>(p)] = page;
                (*fresh)[static_cast<size_t>(g)].emplace_back(p, page);
            }
        }
        sequence.pageHashes.insert(sequence.pageHashes.end(), hashes.begin(), hashes.end());
        sequence.length = end * mTokensPerPage;
        if (mCutGroup >= 0)
        {
            for (int32_t const cut : {sequence.matchBoundary, sequence.promptBoundary})
            {
                if (cut > first && cut < end)
                {
                    makeCut(sequence.pageHashes, cut);
                }
            }
            makeCut(sequence.pageHashes, end, true);
        }
        return true;
    }

    //! Forgets the queued copies (as a caller does once it ran them).
    void clearCopies()
    {
        for (Group& group : mGroups)
        {
            group.copies.clear();
        }
    }

private:
    static bool keysValid(rt::PageExtraKey const* keys, int32_t numKeys, int64_t begin, int64_t end)
    {
        if (numKeys < 0 || (numKeys > 0 && keys == nullptr))
        {
            return false;
        }
        for (int32_t k = 0; k < numKeys; ++k)
        {
            if (keys[k].position < begin || keys[k].position >= end
                || (k > 0 && keys[k].position < keys[k - 1].position))
            {
                return false;
            }
        }
        return true;
    }

    int64_t pagesFor(int64_t tokens) const
    {
        return (tokens + mTokensPerPage - 1) / mTokensPerPage;
    }

    static std::pair<uint64_t, uint64_t> keyOf(rt::PageHash hash)
    {
        return {hash.lo, hash.hi};
    }

    static std::optional<int32_t> lookup(Group const& group, rt::PageHash hash)
    {
        auto found = group.cache.find(keyOf(hash));
        if (found == group.cache.end())
        {
            return std::nullopt;
        }
        return found->second;
    }

    void registerPage(Group& group, int32_t page, rt::PageHash hash)
    {
        if (!lookup(group, hash).has_value())
        {
            group.cache[keyOf(hash)] = page;
            group.registered[static_cast<size_t>(page)] = 1;
            group.hash[static_cast<size_t>(page)] = hash;
        }
    }

    void release(Group& group, int32_t page)
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

    //! Drops the content of the first page of the lowest retention priority on the list and returns it (in no list).
    int32_t evictOldest(int32_t g)
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

    //! Removes the cached `page` from whichever of the group's cached lists holds it.
    static void unlist(Group& group, int32_t page)
    {
        std::vector<int32_t>& list =
            std::find(group.lru.begin(), group.lru.end(), page) != group.lru.end() ? group.lru : group.anchoredCached;
        list.erase(std::find(list.begin(), list.end(), page));
    }

    //! Returns how many cuts have `page` of `group` in a window.
    int32_t anchors(Group const& group, int32_t page) const
    {
        size_t const g = static_cast<size_t>(&group - mGroups.data());
        int32_t count = 0;
        for (Cut const& cut : mCuts)
        {
            count += static_cast<int32_t>(std::count(cut.window[g].begin(), cut.window[g].end(), page));
        }
        return count;
    }

    //! Evicts the cached page of group `g` that goes first and returns it (in no list): the front of its list, after
    //! dropping cuts while only anchored pages are cached; a full-attention page takes its cut with it, and what was
    //! dropped there is forgotten. The cut dropped: the one made first of those never adopted while there are more of
    //! them than the target; else the clock's: from the hand on, a positive count is lowered and the cut moves behind
    //! the others, the first at 0 goes. What is dropped is remembered at its full-attention page.
    int32_t evictNext(int32_t g)
    {
        while (mGroups[static_cast<size_t>(g)].lru.empty())
        {
            auto const neverAdopted = [](Cut const& cut) { return !cut.adopted; };
            int32_t const numNeverAdopted =
                static_cast<int32_t>(std::count_if(mCuts.begin(), mCuts.end(), neverAdopted));
            size_t chosen = 0;
            if (numNeverAdopted > mCutTarget)
            {
                for (size_t c = 0; c < mCuts.size(); ++c)
                {
                    if (!mCuts[c].adopted && (mCuts[chosen].adopted || mCuts[c].made < mCuts[chosen].made))
                    {
                        chosen = c;
                    }
                }
            }
            else
            {
                while (mCuts.at(0).hits > 0)
                {
                    Cut passed = mCuts.front();
                    mCuts.erase(mCuts.begin());
                    --passed.hits;
                    mCuts.push_back(std::move(passed));
                }
            }
            mDroppedAt[mCuts[chosen].fullPage] = mCuts[chosen].adopted ? kDROPPED_ADOPTED : kDROPPED_NEVER_ADOPTED;
            dropCut(chosen);
            ++mCutsDroppedForPages;
        }
        int32_t const page = evictOldest(g);
        if (g == mCutGroup)
        {
            mDroppedAt.erase(page);
            for (size_t c = 0; c < mCuts.size(); ++c)
            {
                if (mCuts[c].fullPage == page)
                {
                    dropCut(c);
                    ++mCutsDroppedWithCarrier;
                    break;
                }
            }
        }
        return page;
    }

    //! Makes the cut of `pages` whole pages of the chain `hashes` unless it exists, and counts an adoption of it when
    //! `adopted`; none when the full-attention page or a window page is not registered.
    void makeCut(std::vector<rt::PageHash> const& hashes, int32_t pages, bool adopted = false)
    {
        if (pages <= 0)
        {
            return;
        }
        std::optional<int32_t> const carrier =
            lookup(mGroups[static_cast<size_t>(mCutGroup)], hashes[static_cast<size_t>(pages - 1)]);
        if (!carrier)
        {
            return;
        }
        for (Cut& existing : mCuts)
        {
            if (existing.fullPage == *carrier)
            {
                if (adopted)
                {
                    existing.adopted = true;
                    existing.hits = std::min(existing.hits + 1, 3);
                }
                return;
            }
        }
        Cut cut{*carrier, pages, std::vector<std::vector<int32_t>>(mGroups.size())};
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            if (mGroups[static_cast<size_t>(g)].slidingWindow == 0)
            {
                continue;
            }
            for (int32_t p = firstNeededPage(g, int64_t{pages} * mTokensPerPage); p < pages; ++p)
            {
                std::optional<int32_t> const page =
                    lookup(mGroups[static_cast<size_t>(g)], hashes[static_cast<size_t>(p)]);
                if (!page)
                {
                    return;
                }
                cut.window[static_cast<size_t>(g)].push_back(*page);
            }
        }
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            Group& group = mGroups[static_cast<size_t>(g)];
            for (int32_t const page : cut.window[static_cast<size_t>(g)])
            {
                auto listed = std::find(group.lru.begin(), group.lru.end(), page);
                if (listed != group.lru.end())
                {
                    group.lru.erase(listed);
                    group.anchoredCached.push_back(page);
                }
            }
        }
        // A cut dropped at this page before and made again counts as adopted, and moves the target: up by one when it
        // had never been adopted, else to one below the cuts never adopted (at least 0).
        auto const dropped = mDroppedAt.find(*carrier);
        if (dropped != mDroppedAt.end())
        {
            int32_t const numNeverAdopted = static_cast<int32_t>(
                std::count_if(mCuts.begin(), mCuts.end(), [](Cut const& c) { return !c.adopted; }));
            mCutTarget = dropped->second == kDROPPED_NEVER_ADOPTED
                ? std::min(mCutTarget + 1, mGroups[static_cast<size_t>(mCutGroup)].numPages)
                : std::max(std::min(mCutTarget, numNeverAdopted) - 1, 0);
            cut.adopted = true;
            mDroppedAt.erase(dropped);
        }
        cut.made = ++mCutsMade;
        if (adopted)
        {
            cut.adopted = true;
            cut.hits = 1;
        }
        mCuts.push_back(std::move(cut));
    }

    //! Drops cut `c`: its window pages left cached with no anchor go to the front of their group's list, the window's
    //! last page first.
    void dropCut(size_t c)
    {
        Cut const cut = mCuts.at(c);
        mCuts.erase(mCuts.begin() + static_cast<std::ptrdiff_t>(c));
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            Group& group = mGroups[static_cast<size_t>(g)];
            std::vector<int32_t> front;
            std::vector<int32_t> const& window = cut.window[static_cast<size_t>(g)];
            for (auto it = window.rbegin(); it != window.rend(); ++it)
            {
                auto kept = std::find(group.anchoredCached.begin(), group.anchoredCached.end(), *it);
                if (kept != group.anchoredCached.end() && anchors(group, *it) == 0)
                {
                    group.anchoredCached.erase(kept);
                    front.push_back(*it);
                }
            }
            group.lru.insert(group.lru.begin(), front.begin(), front.end());
        }
    }

    int32_t take(int32_t g)
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

    int32_t mTokensPerPage;
    int32_t mMaxSequenceLength;
    int32_t mMaxTokensPerStep;
    int32_t mMaxSequences;
    bool mPrefixCaching;
    rt::PageHasher mHasher;
    std::vector<Group> mGroups;
    int64_t mNow = 0;
    int64_t mExpiredMoves = 0;
    std::map<rt::SequenceId, Sequence> mSequences;
    rt::PageManagerStats mStats;
    std::vector<ModelEviction> mEvictions;
    std::optional<Shortage> mShortage;
    //! The full-attention group cuts hang on; -1 when the cache is not hybrid.
    int32_t mCutGroup = -1;
    //! The cuts, from the clock's hand on.
    std::vector<Cut> mCuts;
    int64_t mCutsMade = 0;
    int32_t mCutTarget = 0;
    //! Per full-attention page whose cut the clock dropped, while the page keeps its content: whether it had been
    //! adopted.
    static constexpr int32_t kDROPPED_NEVER_ADOPTED = 1;
    static constexpr int32_t kDROPPED_ADOPTED = 2;
    std::map<int32_t, int32_t> mDroppedAt;
    int64_t mCutsDroppedForPages = 0;
    int64_t mCutsDroppedWithCarrier = 0;
};

} // namespace kvcache::test
