#include "kvcache/paging/page_manager.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvcache::rt
{
namespace
{

constexpr int32_t kNONE = -1;

//! Ceil(a / b) for a >= 0, b > 0, in 64 bits.
int64_t ceilDiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

//! Open-addressing map from page hash to page id, sized once: linear probing over a power-of-two table at most half
//! full, deletion by backward shift (no tombstones, so lookups stay short however long the cache churns).
class PageHashTable
{
public:
    PageHashTable() = default;
    explicit PageHashTable(int32_t maxEntries)
    {
        size_t capacity = 16;
        while (capacity < static_cast<size_t>(maxEntries) * 2)
        {
            capacity *= 2;
        }
        mSlots.assign(capacity, Slot{});
        mMask = capacity - 1;
    }

    //! Returns the page registered under `hash`, or kNONE.
    int32_t find(PageHash hash) const noexcept
    {
        for (size_t i = home(hash);; i = (i + 1) & mMask)
        {
            Slot const& slot = mSlots[i];
            if (slot.page == kNONE)
            {
                return kNONE;
            }
            if (slot.hash == hash)
            {
                return slot.page;
            }
        }
    }

    //! Registers `page` under `hash` unless the hash is present; returns whether it registered (one probe run).
    bool insertIfAbsent(PageHash hash, int32_t page) noexcept
    {
        size_t i = home(hash);
        for (; mSlots[i].page != kNONE; i = (i + 1) & mMask)
        {
            if (mSlots[i].hash == hash)
            {
                return false;
            }
        }
        mSlots[i] = Slot{hash, page};
        ++mSize;
        return true;
    }

    //! Starts loading the slot where a lookup of `hash` begins, so that lookups of a batch of hashes overlap.
    void prefetch(PageHash hash) const noexcept
    {
        __builtin_prefetch(&mSlots[home(hash)]);
    }

    //! Removes `hash`, which must be present.
    void erase(PageHash hash) noexcept
    {
        size_t i = home(hash);
        while (!(mSlots[i].hash == hash && mSlots[i].page != kNONE))
        {
            i = (i + 1) & mMask;
        }
        // Backward shift: move later entries of the probe run into the hole when their home allows it.
        size_t hole = i;
        for (size_t j = (i + 1) & mMask; mSlots[j].page != kNONE; j = (j + 1) & mMask)
        {
            size_t const want = home(mSlots[j].hash);
            bool const movable = hole <= j ? (want <= hole || want > j) : (want <= hole && want > j);
            if (movable)
            {
                mSlots[hole] = mSlots[j];
                hole = j;
            }
        }
        mSlots[hole] = Slot{};
        --mSize;
    }

    int32_t size() const noexcept
    {
        return mSize;
    }

private:
    struct Slot
    {
        PageHash hash = {};
        int32_t page = kNONE;
    };
    size_t home(PageHash hash) const noexcept
    {
        return static_cast<size_t>(hash.lo ^ (hash.hi >> 17)) & mMask;
    }

    std::vector<Slot> mSlots;
    size_t mMask = 0;
    int32_t mSize = 0;
};

} // namespace

//! One page group's pages: reference counts, the free stack, the LRU list of cached pages and the hash table.
struct PageGroupState
{
    int32_t slidingWindow = 0;
    int32_t pagesPerSequence = 0;
    int32_t numPages = 0;
    std::vector<int32_t> refCount;
    std::vector<PageHash> hash;
    std::vector<uint8_t> registered;
    std::vector<int32_t> freeStack;
    int32_t numFree = 0;
    //! Cached pages, least recently released at lruHead.
    std::vector<int32_t> lruPrev;
    std::vector<int32_t> lruNext;
    int32_t lruHead = kNONE;
    int32_t lruTail = kNONE;
    int32_t numCached = 0;
    int32_t numShared = 0;
    PageHashTable cache;
    std::vector<PageCopy> copies;
    //! Per-page scratch for step()'s exact page count; all zero between calls.
    std::vector<int32_t> scratch;
    //! Entries of every sequence slot: slot s owns [s * maxEntries, (s + 1) * maxEntries).
    std::vector<int32_t> entries;
};

struct SequenceState
{
    uint32_t generation = 0;
    bool alive = false;
    int32_t length = 0;
    PageHash root = {};
    //! The hash of the last full page (root when there is none).
    PageHash lastHash = {};
    //! Per group, the first entry still held (entries before it were released by a window).
    std::vector<int32_t> firstHeld;
    //! Extra keys of the partial last page.
    std::vector<PageExtraKey> pendingKeys;
    //! Step stamp, to refuse a sequence listed twice in one step.
    uint64_t stepStamp = 0;
};

struct PageManager::State
{
    KVCacheLayout layout;
    PageManagerOptions options;
    PageHasher hasher;
    int32_t maxSequenceLength = 0;
    int32_t tokensPerPage = 0;
    //! tokensPerPage is a power of two: shifts and masks instead of divisions on the per-token paths.
    int32_t pageShift = 0;
    int64_t pageMask = 0;
    int32_t maxTokensPerStep = 0;
    int32_t maxEntries = 0;
    int32_t maxSequences = 0;
    std::vector<PageGroupState> groups;
    std::vector<SequenceState> sequences;
    //! Tokens of each slot's partial last page: slot s owns [s * tokensPerPage, (s + 1) * tokensPerPage).
    std::vector<int32_t> partialTokens;
    std::vector<int32_t> freeSlots;
    int32_t numSequences = 0;
    uint64_t stepCounter = 0;
    PageManagerStats stats;
    EvictionCallback onEvict;
    //! Scratch: prompt page hashes for adoptPrefix, the page each group has cached under them (kNONE: not looked
    //! up, a windowed group's), extra-key bytes of one page.
    std::vector<PageHash> promptHashes;
    std::vector<int32_t> promptPages;
    std::vector<uint8_t> keyBytes;

    State(KVCacheConfig const& config, PageManagerOptions const& opts)
        : layout(computeLayout(config))
        , options(opts)
        , hasher(opts.hashSeed ? PageHasher(opts.hashAlgorithm, *opts.hashSeed) : PageHasher(opts.hashAlgorithm))
    {
        if (layout.groups.empty())
        {
            throw InvalidArgumentError("PageManager: config.numLayers is 0; it must be at least 1 (a cache without "
                                       "layers has no pages to manage)");
        }
        if (opts.maxSequences < 0)
        {
            throw InvalidArgumentError(fmt::format(
                "PageManager: options.maxSequences is {}; it must be >= 0 (0 means maxBatchSize)", opts.maxSequences));
        }
        maxSequenceLength = config.maxSequenceLength;
        tokensPerPage = layout.tokensPerPage;
        while ((int32_t{1} << pageShift) < tokensPerPage)
        {
            ++pageShift;
        }
        pageMask = tokensPerPage - 1;
        maxTokensPerStep = layout.maxTokensPerStep;
        maxEntries = static_cast<int32_t>(ceilDiv(maxSequenceLength, tokensPerPage));
        maxSequences = opts.maxSequences > 0 ? opts.maxSequences : layout.maxBatchSize;
        int64_t const entryCount = int64_t{maxSequences} * maxEntries;
        groups.resize(layout.groups.size());
        for (size_t g = 0; g < groups.size(); ++g)
        {
            KVPageGroupLayout const& source = layout.groups[g];
            PageGroupState& group = groups[g];
            group.slidingWindow = source.slidingWindow;
            group.pagesPerSequence = source.pagesPerSequence;
            group.numPages = source.numPages;
            size_t const n = static_cast<size_t>(source.numPages);
            group.refCount.assign(n, 0);
            group.hash.assign(n, PageHash{});
            group.registered.assign(n, 0);
            group.freeStack.resize(n);
            // Page 0 on top, so a new manager hands out 0, 1, 2, ...
            for (int32_t i = 0; i < source.numPages; ++i)
            {
                group.freeStack[static_cast<size_t>(i)] = source.numPages - 1 - i;
            }
            group.numFree = source.numPages;
            group.lruPrev.assign(n, kNONE);
            group.lruNext.assign(n, kNONE);
            if (opts.enablePrefixCaching)
            {
                group.cache = PageHashTable(source.numPages);
            }
            group.scratch.assign(n, 0);
            group.entries.assign(static_cast<size_t>(entryCount), kUNUSED_PAGE_ENTRY);
            group.copies.reserve(static_cast<size_t>(maxSequences));
        }
        sequences.resize(static_cast<size_t>(maxSequences));
        for (SequenceState& sequence : sequences)
        {
            sequence.firstHeld.assign(groups.size(), 0);
            sequence.pendingKeys.reserve(4);
        }
        partialTokens.assign(static_cast<size_t>(int64_t{maxSequences} * tokensPerPage), 0);
        freeSlots.resize(static_cast<size_t>(maxSequences));
        for (int32_t i = 0; i < maxSequences; ++i)
        {
            freeSlots[static_cast<size_t>(i)] = maxSequences - 1 - i;
        }
        promptHashes.reserve(static_cast<size_t>(maxEntries));
        promptPages.reserve(static_cast<size_t>(maxEntries) * groups.size());
        keyBytes.reserve(static_cast<size_t>(tokensPerPage) * 20);
    }

    int32_t* entriesOf(PageGroupState& group, int32_t slot) noexcept
    {
        return group.entries.data() + int64_t{slot} * maxEntries;
    }
    int32_t const* entriesOf(PageGroupState const& group, int32_t slot) const noexcept
    {
        return group.entries.data() + int64_t{slot} * maxEntries;
    }
    //! Pages that `tokens` tokens fill, the last possibly partial.
    int64_t pagesFor(int64_t tokens) const noexcept
    {
        return (tokens + pageMask) >> pageShift;
    }
    int32_t* partialOf(int32_t slot) noexcept
    {
        return partialTokens.data() + int64_t{slot} * tokensPerPage;
    }

    //! Returns the slot of a live sequence, or kNONE.
    int32_t findSlot(SequenceId id) const noexcept
    {
        if (id >= 0)
        {
            int64_t const slot = id & 0xffffffffLL;
            uint32_t const generation = static_cast<uint32_t>(static_cast<uint64_t>(id) >> 32);
            if (slot < maxSequences)
            {
                SequenceState const& sequence = sequences[static_cast<size_t>(slot)];
                if (sequence.alive && sequence.generation == generation)
                {
                    return static_cast<int32_t>(slot);
                }
            }
        }
        return kNONE;
    }

    //! Returns the slot of a live sequence; throws InvalidArgumentError naming `what` otherwise.
    int32_t slotOf(SequenceId id, char const* what) const
    {
        int32_t const slot = findSlot(id);
        if (slot != kNONE)
        {
            return slot;
        }
        throw InvalidArgumentError(fmt::format(
            "PageManager::{}: sequence {} is unknown (never created, or freed already); it must be a live sequence",
            what, id));
    }

    void checkGroup(int32_t group, char const* what) const
    {
        if (group < 0 || group >= static_cast<int32_t>(groups.size()))
        {
            throw OutOfRangeError(fmt::format(
                "PageManager::{}: group {} is out of range; it must be in [0, {})", what, group, groups.size()));
        }
    }

    int32_t takeSlot(char const* what)
    {
        if (numSequences == maxSequences)
        {
            throw InvalidArgumentError(fmt::format(
                "PageManager::{}: {} sequences are alive; maxSequences is {}", what, numSequences, maxSequences));
        }
        int32_t const slot = freeSlots[static_cast<size_t>(maxSequences - 1 - numSequences)];
        ++numSequences;
        SequenceState& sequence = sequences[static_cast<size_t>(slot)];
        sequence.alive = true;
        sequence.length = 0;
        sequence.pendingKeys.clear();
        std::fill(sequence.firstHeld.begin(), sequence.firstHeld.end(), 0);
        return slot;
    }

    SequenceId idOf(int32_t slot) const noexcept
    {
        return static_cast<SequenceId>((static_cast<uint64_t>(sequences[static_cast<size_t>(slot)].generation) << 32)
            | static_cast<uint64_t>(slot));
    }

    // Page states ------------------------------------------------------------------------------------------------

    void lruUnlink(PageGroupState& group, int32_t page) noexcept
    {
        int32_t const prev = group.lruPrev[static_cast<size_t>(page)];
        int32_t const next = group.lruNext[static_cast<size_t>(page)];
        (prev == kNONE ? group.lruHead : group.lruNext[static_cast<size_t>(prev)]) = next;
        (next == kNONE ? group.lruTail : group.lruPrev[static_cast<size_t>(next)]) = prev;
        group.lruPrev[static_cast<size_t>(page)] = kNONE;
        group.lruNext[static_cast<size_t>(page)] = kNONE;
        --group.numCached;
    }

    void lruPushBack(PageGroupState& group, int32_t page) noexcept
    {
        group.lruPrev[static_cast<size_t>(page)] = group.lruTail;
        group.lruNext[static_cast<size_t>(page)] = kNONE;
        (group.lruTail == kNONE ? group.lruHead : group.lruNext[static_cast<size_t>(group.lruTail)]) = page;
        group.lruTail = page;
        ++group.numCached;
    }

    //! Drops the content of the least recently released cached page and returns it, free (off every list).
    int32_t evictOne(int32_t groupIndex)
    {
        PageGroupState& group = groups[static_cast<size_t>(groupIndex)];
        int32_t const page = group.lruHead;
        lruUnlink(group, page);
        PageHash const hash = group.hash[static_cast<size_t>(page)];
        group.cache.erase(hash);
        group.registered[static_cast<size_t>(page)] = 0;
        ++stats.evictedPages;
        if (onEvict)
        {
            onEvict(groupIndex, page, hash);
        }
        return page;
    }

    //! Takes a page for a new holder: the most recently freed, else the least recently released cached one.
    //! The caller has checked that one is available.
    int32_t takePage(int32_t groupIndex)
    {
        PageGroupState& group = groups[static_cast<size_t>(groupIndex)];
        int32_t page = kNONE;
        if (group.numFree > 0)
        {
            page = group.freeStack[static_cast<size_t>(--group.numFree)];
        }
        else
        {
            page = evictOne(groupIndex);
        }
        group.refCount[static_cast<size_t>(page)] = 1;
        return page;
    }

    void retainPage(PageGroupState& group, int32_t page) noexcept
    {
        int32_t& count = group.refCount[static_cast<size_t>(page)];
        if (count == 0)
        {
            lruUnlink(group, page); // only cached pages are retained with no holder
        }
        else if (count == 1)
        {
            ++group.numShared;
        }
        ++count;
    }

    void releasePage(PageGroupState& group, int32_t page) noexcept
    {
        int32_t& count = group.refCount[static_cast<size_t>(page)];
        if (--count == 0)
        {
            if (group.registered[static_cast<size_t>(page)] != 0)
            {
                lruPushBack(group, page);
            }
            else
            {
                group.freeStack[static_cast<size_t>(group.numFree++)] = page;
            }
        }
        else if (count == 1)
        {
            --group.numShared;
        }
    }

    //! Registers a just-filled page under `hash` unless the hash is cached already (then it stays unregistered and is
    //! freed, not cached, when its holders let go).
    void registerPage(PageGroupState& group, int32_t page, PageHash hash) noexcept
    {
        if (group.cache.insertIfAbsent(hash, page))
        {
            group.hash[static_cast<size_t>(page)] = hash;
            group.registered[static_cast<size_t>(page)] = 1;
        }
    }

    // Hashing ------------------------------------------------------------------------------------------------------

    //! Returns the hash of the page [start, start + tokensPerPage) given its tokens and the extra keys among `keys`
    //! (sorted by position) that fall in it.
    PageHash hashPage(PageHash parent, int32_t const* tokens, int32_t start, PageExtraKey const* keys, int32_t numKeys)
    {
        keyBytes.clear();
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
                keyBytes.insert(keyBytes.end(), bytes, bytes + 20);
            }
        }
        return hasher.next(
            parent, tokens, tokensPerPage, keyBytes.empty() ? nullptr : keyBytes.data(), keyBytes.size());
    }

    // Validation ---------------------------------------------------------------------------------------------------

    void checkExtraKeys(char const* what, PageExtraKey const* keys, int32_t numKeys, int64_t begin, int64_t end) const
    {
        if (numKeys < 0 || (numKeys > 0 && keys == nullptr))
        {
            throw InvalidArgumentError(fmt::format(
                "PageManager::{}: numExtraKeys is {} with extraKeys {}; it must be >= 0, with extraKeys non-null when "
                "> 0",
                what, numKeys, keys == nullptr ? "null" : "non-null"));
        }
        for (int32_t k = 0; k < numKeys; ++k)
        {
            int64_t const position = keys[k].position;
            if (position < begin || position >= end)
            {
                throw InvalidArgumentError(
                    fmt::format("PageManager::{}: extraKeys[{}].position is {}; it must be in [{}, {})", what, k,
                        position, begin, end));
            }
            if (k > 0 && position < keys[k - 1].position)
            {
                throw InvalidArgumentError(
                    fmt::format("PageManager::{}: extraKeys[{}].position is {}, before extraKeys[{}].position {}; "
                                "extra keys must be sorted by position",
                        what, k, position, k - 1, keys[k - 1].position));
            }
        }
    }

    //! Returns the first entry a windowed group still needs when the next token is at `position`.
    int32_t firstNeeded(PageGroupState const& group, int64_t position) const noexcept
    {
        if (group.slidingWindow == 0)
        {
            return 0;
        }
        int64_t const firstToken = std::max<int64_t>(0, position - group.slidingWindow + 1);
        return static_cast<int32_t>(firstToken >> pageShift);
    }

    // Operations ---------------------------------------------------------------------------------------------------

    void step(SequenceAppend const* appends, int32_t count);
    int32_t adoptPrefix(int32_t slot, int32_t const* tokens, int32_t count, PageExtraKey const* keys, int32_t numKeys);

    int32_t hashNextPages(
        int32_t slot, int32_t const* tokens, int32_t count, PageHash* out, PageExtraKey const* keys, int32_t numKeys)
    {
        SequenceState const& sequence = sequences[static_cast<size_t>(slot)];
        if ((sequence.length & pageMask) != 0)
        {
            throw InvalidArgumentError(
                fmt::format("PageManager::hashNextPages: sequence {} has {} tokens; it must hold whole pages of {}",
                    idOf(slot), sequence.length, tokensPerPage));
        }
        int32_t const room = maxSequenceLength - sequence.length;
        if (count < 0 || count > room)
        {
            throw InvalidArgumentError(fmt::format("PageManager::hashNextPages: count is {}; it must be in [0, {}] "
                                                   "(maxSequenceLength {} less the sequence's {} tokens)",
                count, room, maxSequenceLength, sequence.length));
        }
        int32_t const pages = count / tokensPerPage;
        if ((count > 0 && tokens == nullptr) || (pages > 0 && out == nullptr))
        {
            throw InvalidArgumentError(fmt::format(
                "PageManager::hashNextPages: tokens is {} and out is {} with count {}; they must point to count token "
                "ids and count / tokensPerPage ({}) hashes",
                tokens == nullptr ? "null" : "non-null", out == nullptr ? "null" : "non-null", count, pages));
        }
        checkExtraKeys("hashNextPages", keys, numKeys, sequence.length, int64_t{sequence.length} + count);
        if (numKeys == 0)
        {
            hasher.chain(sequence.lastHash, tokens, pages, tokensPerPage, out);
            return pages;
        }
        PageHash parent = sequence.lastHash;
        for (int32_t p = 0; p < pages; ++p)
        {
            parent = hashPage(parent, tokens + int64_t{p} * tokensPerPage, sequence.length + p * tokensPerPage, keys,
                numKeys);
            out[p] = parent;
        }
        return pages;
    }
    void appendOne(SequenceAppend const& append, int32_t slot);
    void checkInvariants() const;
};

void PageManager::State::step(SequenceAppend const* appends, int32_t count)
{
    if (count < 0 || (count > 0 && appends == nullptr))
    {
        throw InvalidArgumentError(fmt::format(
            "PageManager::step: count is {} with appends {}; it must be >= 0, with appends non-null when > 0", count,
            appends == nullptr ? "null" : "non-null"));
    }
    // Every entry is checked before anything changes.
    uint64_t const stamp = ++stepCounter;
    for (int32_t i = 0; i < count; ++i)
    {
        SequenceAppend const& append = appends[i];
        int32_t const slot = slotOf(append.sequence, "step");
        SequenceState& sequence = sequences[static_cast<size_t>(slot)];
        if (sequence.stepStamp == stamp)
        {
            throw InvalidArgumentError(fmt::format(
                "PageManager::step: appends[{}].sequence {} is listed twice; a sequence appends once a step", i,
                append.sequence));
        }
        sequence.stepStamp = stamp;
        if (append.count < 0 || append.count > maxTokensPerStep)
        {
            throw InvalidArgumentError(
                fmt::format("PageManager::step: appends[{}].count is {}; it must be in [0, {}] (maxTokensPerStep)", i,
                    append.count, maxTokensPerStep));
        }
        if (int64_t{sequence.length} + append.count > maxSequenceLength)
        {
            throw InvalidArgumentError(fmt::format(
                "PageManager::step: appends[{}] takes sequence {} to {} tokens ({} + {}); it must stay within {} "
                "(maxSequenceLength)",
                i, append.sequence, int64_t{sequence.length} + append.count, sequence.length, append.count,
                maxSequenceLength));
        }
        if (append.count > 0 && append.tokens == nullptr)
        {
            throw InvalidArgumentError(fmt::format(
                "PageManager::step: appends[{}].tokens is null with count {}; it must point to count token ids", i,
                append.count));
        }
        checkExtraKeys(
            "step", append.extraKeys, append.numExtraKeys, sequence.length, int64_t{sequence.length} + append.count);
    }
    // Exact page count per group: new pages and copy-on-write pages needed, against free, cached and released ones.
    for (size_t g = 0; g < groups.size(); ++g)
    {
        PageGroupState& group = groups[g];
        int64_t needed = 0;
        int64_t released = 0;
        // Pass 1: count holders appending to each shared partial page and releases of each page.
        for (int32_t i = 0; i < count; ++i)
        {
            SequenceAppend const& append = appends[i];
            if (append.count == 0)
            {
                continue;
            }
            int32_t const slot = static_cast<int32_t>(append.sequence & 0xffffffffLL);
            SequenceState const& sequence = sequences[static_cast<size_t>(slot)];
            int32_t const* entries = entriesOf(group, slot);
            int64_t const length = sequence.length;
            needed += pagesFor(length + append.count) - pagesFor(length);
            int32_t const first = sequence.firstHeld[g];
            int32_t const firstKept = std::max(first, firstNeeded(group, length));
            for (int32_t e = first; e < firstKept; ++e)
            {
                ++group.scratch[static_cast<size_t>(entries[e])];
            }
            if ((length & pageMask) != 0)
            {
                int32_t const last = entries[(length - 1) >> pageShift];
                if (group.refCount[static_cast<size_t>(last)] > 1)
                {
                    // Marked apart from releases: a partial last page is never out of the window.
                    group.scratch[static_cast<size_t>(last)] += 1 << 20;
                }
            }
        }
        // Pass 2: a page released by all its holders becomes available; k of r holders appending to a shared partial
        // page need k copies, or k - 1 when all of them do (the last finds the page its own).
        for (int32_t i = 0; i < count; ++i)
        {
            SequenceAppend const& append = appends[i];
            if (append.count == 0)
            {
                continue;
            }
            int32_t const slot = static_cast<int32_t>(append.sequence & 0xffffffffLL);
            SequenceState const& sequence = sequences[static_cast<size_t>(slot)];
            int32_t const* entries = entriesOf(group, slot);
            int64_t const length = sequence.length;
            int32_t const first = sequence.firstHeld[g];
            int32_t const firstKept = std::max(first, firstNeeded(group, length));
            for (int32_t e = first; e < firstKept; ++e)
            {
                int32_t& mark = group.scratch[static_cast<size_t>(entries[e])];
                if (mark != 0)
                {
                    released += mark == group.refCount[static_cast<size_t>(entries[e])] ? 1 : 0;
                    mark = 0;
                }
            }
            if ((length & pageMask) != 0)
            {
                int32_t const last = entries[(length - 1) >> pageShift];
                int32_t& mark = group.scratch[static_cast<size_t>(last)];
                if (mark != 0)
                {
                    int32_t const writers = mark >> 20;
                    needed += writers < group.refCount[static_cast<size_t>(last)] ? writers : writers - 1;
                    mark = 0;
                }
            }
        }
        int64_t const available = int64_t{group.numFree} + group.numCached + released;
        if (needed > available)
        {
            throw OutOfMemoryError(fmt::format(
                "PageManager::step: page group {} needs {} pages for this step and has {} available ({} free, {} "
                "cached, {} released by the step); nothing was appended",
                g, needed, available, group.numFree, group.numCached, released));
        }
    }
    // Window releases of every entry first, so that a page one sequence releases can serve another in this step.
    for (int32_t i = 0; i < count; ++i)
    {
        if (appends[i].count == 0)
        {
            continue;
        }
        int32_t const slot = static_cast<int32_t>(appends[i].sequence & 0xffffffffLL);
        SequenceState& sequence = sequences[static_cast<size_t>(slot)];
        for (size_t g = 0; g < groups.size(); ++g)
        {
            PageGroupState& group = groups[g];
            int32_t* entries = entriesOf(group, slot);
            int32_t& first = sequence.firstHeld[g];
            int32_t const firstKept = std::max(first, firstNeeded(group, sequence.length));
            for (; first < firstKept; ++first)
            {
                releasePage(group, entries[first]);
                entries[first] = kUNUSED_PAGE_ENTRY;
            }
        }
    }
    for (int32_t i = 0; i < count; ++i)
    {
        appendOne(appends[i], static_cast<int32_t>(appends[i].sequence & 0xffffffffLL));
    }
}

void PageManager::State::appendOne(SequenceAppend const& append, int32_t slot)
{
    if (append.count == 0)
    {
        return;
    }
    SequenceState& sequence = sequences[static_cast<size_t>(slot)];
    int64_t const length = sequence.length;
    int64_t const newLength = length + append.count;
    int32_t const oldPages = static_cast<int32_t>(pagesFor(length));
    int32_t const newPages = static_cast<int32_t>(pagesFor(newLength));
    for (size_t g = 0; g < groups.size(); ++g)
    {
        PageGroupState& group = groups[g];
        int32_t* entries = entriesOf(group, slot);
        if ((length & pageMask) != 0)
        {
            int32_t& last = entries[oldPages - 1];
            if (group.refCount[static_cast<size_t>(last)] > 1)
            {
                int32_t const fresh = takePage(static_cast<int32_t>(g));
                group.copies.push_back(PageCopy{last, fresh});
                ++stats.copyOnWritePages;
                releasePage(group, last);
                last = fresh;
            }
        }
        for (int32_t e = oldPages; e < newPages; ++e)
        {
            entries[e] = takePage(static_cast<int32_t>(g));
        }
    }
    if (options.enablePrefixCaching)
    {
        // Tokens gather in the partial-page buffer; each page that fills is hashed and registered in every group.
        int32_t* partial = partialOf(slot);
        int64_t position = length;
        int32_t consumed = 0;
        while (consumed < append.count)
        {
            int32_t const inPage = static_cast<int32_t>(position & pageMask);
            int32_t const take = std::min(tokensPerPage - inPage, append.count - consumed);
            int32_t const* pageTokens = partial;
            if (inPage == 0 && take == tokensPerPage)
            {
                pageTokens = append.tokens + consumed;
            }
            else
            {
                std::memcpy(partial + inPage, append.tokens + consumed, static_cast<size_t>(take) * sizeof(int32_t));
            }
            position += take;
            consumed += take;
            if ((position & pageMask) != 0)
            {
                break;
            }
            int32_t const start = static_cast<int32_t>(position - tokensPerPage);
            PageHash hash{};
            if (sequence.pendingKeys.empty())
            {
                hash = hashPage(sequence.lastHash, pageTokens, start, append.extraKeys, append.numExtraKeys);
            }
            else
            {
                // Keys given with earlier appends of this page come first (their positions are smaller).
                for (int32_t k = 0; k < append.numExtraKeys; ++k)
                {
                    if (append.extraKeys[k].position < position)
                    {
                        sequence.pendingKeys.push_back(append.extraKeys[k]);
                    }
                }
                hash = hashPage(sequence.lastHash, pageTokens, start, sequence.pendingKeys.data(),
                    static_cast<int32_t>(sequence.pendingKeys.size()));
                sequence.pendingKeys.clear();
            }
            sequence.lastHash = hash;
            int32_t const pageIndex = start >> pageShift;
            for (PageGroupState& group : groups)
            {
                registerPage(group, entriesOf(group, slot)[pageIndex], hash);
            }
        }
        // Keys of the new partial page wait for it to fill.
        for (int32_t k = 0; k < append.numExtraKeys; ++k)
        {
            if (append.extraKeys[k].position >= newLength - (newLength & pageMask) && (newLength & pageMask) != 0)
            {
                sequence.pendingKeys.push_back(append.extraKeys[k]);
            }
        }
    }
    sequence.length = static_cast<int32_t>(newLength);
}

int32_t PageManager::State::adoptPrefix(
    int32_t slot, int32_t const* tokens, int32_t count, PageExtraKey const* keys, int32_t numKeys)
{
    SequenceState& sequence = sequences[static_cast<size_t>(slot)];
    if (sequence.length != 0)
    {
        throw InvalidArgumentError(fmt::format(
            "PageManager::adoptPrefix: sequence {} has {} tokens; it must be empty", idOf(slot), sequence.length));
    }
    if (count < 0 || count > maxSequenceLength)
    {
        throw InvalidArgumentError(
            fmt::format("PageManager::adoptPrefix: count is {}; it must be in [0, {}] (maxSequenceLength)", count,
                maxSequenceLength));
    }
    if (count > 0 && tokens == nullptr)
    {
        throw InvalidArgumentError(fmt::format(
            "PageManager::adoptPrefix: tokens is null with count {}; it must point to count token ids", count));
    }
    checkExtraKeys("adoptPrefix", keys, numKeys, 0, count);
    stats.prefixQueryTokens += count;
    if (!options.enablePrefixCaching || count <= tokensPerPage)
    {
        return 0;
    }
    int32_t const maxPages = (count - 1) / tokensPerPage;
    // Hash page by page while every full-attention group has the page cached.
    promptHashes.clear();
    promptPages.clear();
    PageHash parent = sequence.root;
    int32_t numWindowed = 0;
    for (PageGroupState const& group : groups)
    {
        numWindowed += group.slidingWindow != 0 ? 1 : 0;
    }
    // Without extra keys, pages are hashed a chunk at a time through chain() (its fastest path) and their table
    // slots prefetched, so the lookups' cache misses overlap. A chunk holds about 256 tokens, bounding the hashing
    // wasted past the first miss.
    constexpr int32_t kMAX_CHAIN_PAGES = 32;
    int32_t const chainPages = std::clamp(256 / tokensPerPage, 1, kMAX_CHAIN_PAGES);
    PageHash chained[kMAX_CHAIN_PAGES];
    for (int32_t p = 0; p < maxPages; ++p)
    {
        PageHash hash{};
        if (numKeys == 0)
        {
            int32_t const inChunk = p % chainPages;
            if (inChunk == 0)
            {
                int32_t const chunk = std::min(chainPages, maxPages - p);
                hasher.chain(parent, tokens + int64_t{p} * tokensPerPage, chunk, tokensPerPage, chained);
                for (int32_t c = 0; c < chunk; ++c)
                {
                    for (PageGroupState const& group : groups)
                    {
                        group.cache.prefetch(chained[c]);
                    }
                }
            }
            hash = chained[inChunk];
        }
        else
        {
            hash = hashPage(parent, tokens + int64_t{p} * tokensPerPage, p * tokensPerPage, keys, numKeys);
        }
        bool found = true;
        for (PageGroupState const& group : groups)
        {
            int32_t const page = group.slidingWindow == 0 ? group.cache.find(hash) : kNONE;
            if (group.slidingWindow == 0 && page == kNONE)
            {
                found = false;
                break;
            }
            promptPages.push_back(page);
        }
        if (!found)
        {
            break;
        }
        promptHashes.push_back(hash);
        parent = hash;
    }
    // Windowed groups need only the pages covering the window before the first token to compute: the longest length
    // all of them can serve.
    int32_t pages = static_cast<int32_t>(promptHashes.size());
    for (; pages > 0 && numWindowed > 0; --pages)
    {
        bool served = true;
        for (PageGroupState const& group : groups)
        {
            if (group.slidingWindow == 0)
            {
                continue;
            }
            for (int32_t p = firstNeeded(group, int64_t{pages} * tokensPerPage); p < pages && served; ++p)
            {
                served = group.cache.find(promptHashes[static_cast<size_t>(p)]) != kNONE;
            }
            if (!served)
            {
                break;
            }
        }
        if (served)
        {
            break;
        }
    }
    if (pages == 0)
    {
        return 0;
    }
    for (size_t g = 0; g < groups.size(); ++g)
    {
        PageGroupState& group = groups[g];
        int32_t* entries = entriesOf(group, slot);
        int32_t const first = firstNeeded(group, int64_t{pages} * tokensPerPage);
        for (int32_t p = first; p < pages; ++p)
        {
            int32_t page = promptPages[static_cast<size_t>(p) * groups.size() + g];
            if (page == kNONE)
            {
                page = group.cache.find(promptHashes[static_cast<size_t>(p)]);
            }
            retainPage(group, page);
            entries[p] = page;
        }
        sequence.firstHeld[g] = first;
    }
    sequence.length = pages * tokensPerPage;
    sequence.lastHash = promptHashes[static_cast<size_t>(pages - 1)];
    stats.prefixHitTokens += sequence.length;
    return sequence.length;
}

void PageManager::State::checkInvariants() const
{
    auto fail = [](std::string const& message) { throw std::logic_error("PageManager invariant: " + message); };
    int32_t alive = 0;
    for (SequenceState const& sequence : sequences)
    {
        alive += sequence.alive ? 1 : 0;
    }
    if (alive != numSequences)
    {
        fail(fmt::format("{} live sequences, counted {}", alive, numSequences));
    }
    for (size_t g = 0; g < groups.size(); ++g)
    {
        PageGroupState const& group = groups[g];
        size_t const n = static_cast<size_t>(group.numPages);
        std::vector<int32_t> holders(n, 0);
        for (int32_t s = 0; s < maxSequences; ++s)
        {
            SequenceState const& sequence = sequences[static_cast<size_t>(s)];
            if (!sequence.alive)
            {
                continue;
            }
            int32_t const* entries = entriesOf(group, s);
            int32_t const numEntries = static_cast<int32_t>(ceilDiv(sequence.length, tokensPerPage));
            int32_t const first = sequence.firstHeld[g];
            if (first < 0 || (first > numEntries && numEntries > 0) || (numEntries == 0 && first != 0))
            {
                fail(fmt::format("group {} sequence slot {}: first held entry {} of {}", g, s, first, numEntries));
            }
            if (group.slidingWindow != 0 && numEntries - first > group.pagesPerSequence)
            {
                fail(fmt::format("group {} sequence slot {} holds {} pages; the window allows {}", g, s,
                    numEntries - first, group.pagesPerSequence));
            }
            for (int32_t e = 0; e < numEntries; ++e)
            {
                int32_t const page = entries[e];
                if (e < first)
                {
                    if (page != kUNUSED_PAGE_ENTRY)
                    {
                        fail(fmt::format("group {} sequence slot {} entry {} released but holds {}", g, s, e, page));
                    }
                    continue;
                }
                if (page < 0 || page >= group.numPages)
                {
                    fail(fmt::format("group {} sequence slot {} entry {} holds page {}", g, s, e, page));
                }
                ++holders[static_cast<size_t>(page)];
            }
        }
        std::vector<uint8_t> onFree(n, 0);
        for (int32_t i = 0; i < group.numFree; ++i)
        {
            int32_t const page = group.freeStack[static_cast<size_t>(i)];
            if (page < 0 || page >= group.numPages || onFree[static_cast<size_t>(page)] != 0)
            {
                fail(fmt::format("group {} free list entry {} is page {} (out of range or listed twice)", g, i, page));
            }
            onFree[static_cast<size_t>(page)] = 1;
        }
        std::vector<uint8_t> onLru(n, 0);
        int32_t lruCount = 0;
        int32_t previous = kNONE;
        for (int32_t page = group.lruHead; page != kNONE; page = group.lruNext[static_cast<size_t>(page)])
        {
            if (page < 0 || page >= group.numPages || onLru[static_cast<size_t>(page)] != 0 || lruCount > group.numPages
                || group.lruPrev[static_cast<size_t>(page)] != previous)
            {
                fail(fmt::format("group {} LRU list is broken at page {}", g, page));
            }
            onLru[static_cast<size_t>(page)] = 1;
            previous = page;
            ++lruCount;
        }
        if (previous != group.lruTail || lruCount != group.numCached)
        {
            fail(fmt::format("group {} LRU list holds {} pages, counted {}", g, lruCount, group.numCached));
        }
        int32_t registeredCount = 0;
        int32_t shared = 0;
        for (size_t p = 0; p < n; ++p)
        {
            int32_t const refs = group.refCount[p];
            bool const isRegistered = group.registered[p] != 0;
            if (refs != holders[p])
            {
                fail(fmt::format("group {} page {} has reference count {} and {} holders", g, p, refs, holders[p]));
            }
            int32_t const states = (refs > 0 ? 1 : 0) + onFree[p] + onLru[p];
            if (states != 1)
            {
                fail(fmt::format("group {} page {} is in {} states (used {}, free {}, cached {})", g, p, states, refs,
                    onFree[p], onLru[p]));
            }
            if ((onFree[p] != 0 && isRegistered) || (onLru[p] != 0 && !isRegistered))
            {
                fail(fmt::format(
                    "group {} page {}: registered {} but {}", g, p, isRegistered, onFree[p] != 0 ? "free" : "cached"));
            }
            if (isRegistered)
            {
                ++registeredCount;
                if (group.cache.find(group.hash[p]) != static_cast<int32_t>(p))
                {
                    fail(fmt::format("group {} page {} is registered but its hash maps to page {}", g, p,
                        group.cache.find(group.hash[p])));
                }
            }
            shared += refs > 1 ? 1 : 0;
        }
        if (registeredCount != group.cache.size())
        {
            fail(fmt::format(
                "group {} has {} registered pages and {} cached hashes", g, registeredCount, group.cache.size()));
        }
        if (shared != group.numShared)
        {
            fail(fmt::format("group {} has {} shared pages, counted {}", g, shared, group.numShared));
        }
    }
}

// Public interface ---------------------------------------------------------------------------------------------------

PageManager::PageManager(KVCacheConfig const& config, PageManagerOptions const& options)
    : mState(std::make_unique<State>(config, options))
{
}

PageManager::~PageManager() = default;
PageManager::PageManager(PageManager&&) noexcept = default;
PageManager& PageManager::operator=(PageManager&&) noexcept = default;

SequenceId PageManager::create(SequenceOptions const& options)
{
    State& s = *mState;
    if (options.salt == nullptr && options.saltBytes > 0)
    {
        throw InvalidArgumentError(
            fmt::format("PageManager::create: options.salt is null with saltBytes {}; it must point to saltBytes bytes",
                options.saltBytes));
    }
    PageHash const root = s.hasher.root(options.salt, options.saltBytes);
    int32_t const slot = s.takeSlot("create");
    SequenceState& sequence = s.sequences[static_cast<size_t>(slot)];
    sequence.root = root;
    sequence.lastHash = root;
    return s.idOf(slot);
}

int32_t PageManager::adoptPrefix(
    SequenceId sequence, int32_t const* tokens, int32_t count, PageExtraKey const* extraKeys, int32_t numExtraKeys)
{
    return mState->adoptPrefix(mState->slotOf(sequence, "adoptPrefix"), tokens, count, extraKeys, numExtraKeys);
}

void PageManager::append(SequenceAppend const& append)
{
    mState->step(&append, 1);
}

void PageManager::step(SequenceAppend const* appends, int32_t count)
{
    mState->step(appends, count);
}

int32_t PageManager::hashNextPages(SequenceId sequence, int32_t const* tokens, int32_t count, PageHash* out,
    PageExtraKey const* extraKeys, int32_t numExtraKeys) const
{
    return mState->hashNextPages(
        mState->slotOf(sequence, "hashNextPages"), tokens, count, out, extraKeys, numExtraKeys);
}

SequenceId PageManager::fork(SequenceId parent)
{
    State& s = *mState;
    int32_t const parentSlot = s.slotOf(parent, "fork");
    int32_t const slot = s.takeSlot("fork");
    SequenceState const& from = s.sequences[static_cast<size_t>(parentSlot)];
    SequenceState& to = s.sequences[static_cast<size_t>(slot)];
    to.length = from.length;
    to.root = from.root;
    to.lastHash = from.lastHash;
    to.firstHeld = from.firstHeld;
    to.pendingKeys = from.pendingKeys;
    std::memcpy(s.partialOf(slot), s.partialOf(parentSlot), static_cast<size_t>(s.tokensPerPage) * sizeof(int32_t));
    int32_t const numEntries = static_cast<int32_t>(ceilDiv(from.length, s.tokensPerPage));
    for (size_t g = 0; g < s.groups.size(); ++g)
    {
        PageGroupState& group = s.groups[g];
        int32_t const* source = s.entriesOf(group, parentSlot);
        int32_t* target = s.entriesOf(group, slot);
        std::copy(source, source + numEntries, target);
        for (int32_t e = from.firstHeld[g]; e < numEntries; ++e)
        {
            s.retainPage(group, target[e]);
        }
    }
    return s.idOf(slot);
}

void PageManager::free(SequenceId id)
{
    State& s = *mState;
    int32_t const slot = s.slotOf(id, "free");
    SequenceState& sequence = s.sequences[static_cast<size_t>(slot)];
    int32_t const numEntries = static_cast<int32_t>(ceilDiv(sequence.length, s.tokensPerPage));
    for (size_t g = 0; g < s.groups.size(); ++g)
    {
        PageGroupState& group = s.groups[g];
        int32_t* entries = s.entriesOf(group, slot);
        for (int32_t e = numEntries - 1; e >= sequence.firstHeld[g]; --e)
        {
            s.releasePage(group, entries[e]);
        }
        std::fill(entries, entries + numEntries, kUNUSED_PAGE_ENTRY);
    }
    sequence.alive = false;
    sequence.length = 0;
    // Ids stay non-negative: the generation wraps within 31 bits.
    sequence.generation = (sequence.generation + 1) & 0x7fffffffU;
    s.freeSlots[static_cast<size_t>(s.maxSequences - s.numSequences)] = slot;
    --s.numSequences;
}

bool PageManager::contains(SequenceId sequence) const noexcept
{
    return mState->findSlot(sequence) != kNONE;
}

int32_t PageManager::length(SequenceId sequence) const
{
    return mState->sequences[static_cast<size_t>(mState->slotOf(sequence, "length"))].length;
}

SequencePages PageManager::pages(SequenceId sequence, int32_t group) const
{
    State const& s = *mState;
    int32_t const slot = s.slotOf(sequence, "pages");
    s.checkGroup(group, "pages");
    int32_t const length = s.sequences[static_cast<size_t>(slot)].length;
    return SequencePages{s.entriesOf(s.groups[static_cast<size_t>(group)], slot),
        static_cast<int32_t>(ceilDiv(length, s.tokensPerPage)), length};
}

std::vector<PageCopy> const& PageManager::copies(int32_t group) const
{
    mState->checkGroup(group, "copies");
    return mState->groups[static_cast<size_t>(group)].copies;
}

void PageManager::clearCopies() noexcept
{
    for (PageGroupState& group : mState->groups)
    {
        group.copies.clear();
    }
}

int32_t PageManager::evictCached(int32_t group, int32_t count)
{
    State& s = *mState;
    s.checkGroup(group, "evictCached");
    if (count < 0)
    {
        throw InvalidArgumentError(fmt::format("PageManager::evictCached: count is {}; it must be >= 0", count));
    }
    PageGroupState& state = s.groups[static_cast<size_t>(group)];
    int32_t evicted = 0;
    while (evicted < count && state.numCached > 0)
    {
        int32_t const page = s.evictOne(group);
        state.freeStack[static_cast<size_t>(state.numFree++)] = page;
        ++evicted;
    }
    return evicted;
}

void PageManager::setEvictionCallback(EvictionCallback callback)
{
    mState->onEvict = std::move(callback);
}

PageGroupCounts PageManager::counts(int32_t group) const
{
    mState->checkGroup(group, "counts");
    PageGroupState const& state = mState->groups[static_cast<size_t>(group)];
    PageGroupCounts result;
    result.numPages = state.numPages;
    result.free = state.numFree;
    result.cached = state.numCached;
    result.used = state.numPages - state.numFree - state.numCached;
    result.shared = state.numShared;
    return result;
}

PageManagerStats PageManager::stats() const noexcept
{
    return mState->stats;
}

void PageManager::resetStats() noexcept
{
    mState->stats = PageManagerStats{};
}

void PageManager::checkInvariants() const
{
    mState->checkInvariants();
}

int32_t PageManager::numGroups() const noexcept
{
    return static_cast<int32_t>(mState->groups.size());
}

KVCacheLayout const& PageManager::layout() const noexcept
{
    return mState->layout;
}

int32_t PageManager::maxSequences() const noexcept
{
    return mState->maxSequences;
}

int32_t PageManager::numSequences() const noexcept
{
    return mState->numSequences;
}

PageHasher const& PageManager::hasher() const noexcept
{
    return mState->hasher;
}

} // namespace kvcache::rt
