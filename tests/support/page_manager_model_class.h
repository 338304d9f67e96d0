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
//
// This header holds the class: its state and its calls, declared. The calls are defined one concern a header
// (page_manager_model_pages.h, _sequences.h, _cuts.h, _retention.h); include page_manager_model.h, which includes them
// all.

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_manager.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
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
    rt::PageGroupCounts counts(int32_t g) const;

    //! Returns the pages of a windowed group `g` a sequence needs before its token `position` (the entries from
    //! which on stay): tokens more than W - 1 before `position` are out of the window.
    int32_t firstNeededPage(int32_t g, int64_t position) const;

    //! Returns the hash of one page of tokens in the model's encoding of extra keys (those among `keys` that fall in
    //! [start, start + P)).
    rt::PageHash hashPage(
        rt::PageHash parent, int32_t const* tokens, int64_t start, rt::PageExtraKey const* keys, int32_t numKeys) const;

    // Operations: each validates first and changes nothing unless it returns kOK --------------------------------

    //! create(): `id` is the id the manager returned (ids are the manager's to choose).
    ModelOutcome create(rt::SequenceId id, void const* salt, size_t saltBytes);

    //! Predicts whether create() succeeds without changing anything.
    ModelOutcome checkCreate(void const* salt, size_t saltBytes) const;

    //! adoptPrefix(); `*adopted` receives the result.
    ModelOutcome adoptPrefix(rt::SequenceId id, int32_t const* tokens, int32_t count, rt::PageExtraKey const* keys,
        int32_t numKeys, int32_t* adopted);

    //! step(); on kOUT_OF_MEMORY lastShortage() names the group and the counts.
    ModelOutcome step(rt::SequenceAppend const* appends, int32_t count);

    //! fork(): `child` is the id the manager returned.
    ModelOutcome fork(rt::SequenceId parent, rt::SequenceId child);

    //! Predicts whether fork() succeeds without changing anything.
    ModelOutcome checkFork(rt::SequenceId parent) const;

    //! free().
    ModelOutcome free(rt::SequenceId id);

    //! setRetention(): every page the sequence holds with a token in [firstToken, endToken) gets `priority` when none
    //! was set on it or it is higher; with a duration, as its timed priority, ending at now() + durationMs.
    ModelOutcome setRetention(rt::SequenceId id, int32_t firstToken, int32_t endToken, int32_t priority,
        int64_t durationMs = rt::PageManager::kNO_DURATION);

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
    void expireRetention();

    //! evictCached(); `*dropped` receives the result.
    ModelOutcome evictCached(int32_t g, int32_t count, int32_t* dropped);

    //! detail::PageManagerInternal::adoptRun of the next `pages` whole pages of `tokens` (the sequence's tokens from
    //! its length on; `keys` those in them) for a sequence that holds whole pages only and prefix caching on: returns
    //! false, changing nothing, when a group lacks the free and cached pages for its fresh pages; else adopts the run
    //! and writes each group's fresh (entry, page) pairs to `*fresh`. A run page a group needs (every page in full
    //! attention, the window before the run's end in a windowed group) is its registered page when there is one, held,
    //! else a fresh page registered under the page's hash; out-of-window entries are released first. Cuts as
    //! adoptPrefix leaves them for the sequence, then the run's own.
    bool adoptRun(rt::SequenceId id, int32_t const* tokens, int32_t pages, rt::PageExtraKey const* keys,
        int32_t numKeys, std::vector<std::vector<std::pair<int32_t, int32_t>>>* fresh);

    //! Forgets the queued copies (as a caller does once it ran them).
    void clearCopies();

private:
    static bool keysValid(rt::PageExtraKey const* keys, int32_t numKeys, int64_t begin, int64_t end);

    int64_t pagesFor(int64_t tokens) const;

    static std::pair<uint64_t, uint64_t> keyOf(rt::PageHash hash);

    static std::optional<int32_t> lookup(Group const& group, rt::PageHash hash);

    void registerPage(Group& group, int32_t page, rt::PageHash hash);

    void release(Group& group, int32_t page);

    //! Drops the content of the first page of the lowest retention priority on the list and returns it (in no list).
    int32_t evictOldest(int32_t g);

    //! Removes the cached `page` from whichever of the group's cached lists holds it.
    static void unlist(Group& group, int32_t page);

    //! Returns how many cuts have `page` of `group` in a window.
    int32_t anchors(Group const& group, int32_t page) const;

    //! Evicts the cached page of group `g` that goes first and returns it (in no list): the front of its list, after
    //! dropping cuts while only anchored pages are cached; a full-attention page takes its cut with it, and what was
    //! dropped there is forgotten. The cut dropped: the one made first of those never adopted while there are more of
    //! them than the target; else the clock's: from the hand on, a positive count is lowered and the cut moves behind
    //! the others, the first at 0 goes. What is dropped is remembered at its full-attention page.
    int32_t evictNext(int32_t g);

    //! Makes the cut of `pages` whole pages of the chain `hashes` unless it exists, and counts an adoption of it when
    //! `adopted`; none when the full-attention page or a window page is not registered.
    void makeCut(std::vector<rt::PageHash> const& hashes, int32_t pages, bool adopted = false);

    //! Drops cut `c`: its window pages left cached with no anchor go to the front of their group's list, the window's
    //! last page first.
    void dropCut(size_t c);

    int32_t take(int32_t g);

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
