// step() and append(): validation, the exact page count (also pagesNeeded() and canStep()), window releases, page
// taking with copy-on-write, and the hashing and registration of the pages a step fills.
#include "paging/page_manager/page_manager_state.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace kvcache::rt
{

void PageManager::State::checkExtraKeys(
    char const* what, PageExtraKey const* keys, int32_t numKeys, int64_t begin, int64_t end) const
{
    if (numKeys < 0 || (numKeys > 0 && keys == nullptr))
    {
        throw InvalidArgumentError(fmt::format(
            "PageManager::{}: numExtraKeys is {} with extraKeys {}; it must be >= 0, with extraKeys non-null when > 0",
            what, numKeys, keys == nullptr ? "null" : "non-null"));
    }
    for (int32_t k = 0; k < numKeys; ++k)
    {
        int64_t const position = keys[k].position;
        if (position < begin || position >= end)
        {
            throw InvalidArgumentError(
                fmt::format("PageManager::{}: extraKeys[{}].position is {}; it must be in [{}, {})", what, k, position,
                    begin, end));
        }
        if (k > 0 && position < keys[k - 1].position)
        {
            throw InvalidArgumentError(
                fmt::format("PageManager::{}: extraKeys[{}].position is {}, before extraKeys[{}].position {}; extra "
                            "keys must be sorted by position",
                    what, k, position, k - 1, keys[k - 1].position));
        }
    }
}

bool PageManager::State::checkStep(SequenceAppend const* appends, int32_t count) const
{
    if (count < 0 || (count > 0 && appends == nullptr))
    {
        throw InvalidArgumentError(fmt::format(
            "PageManager::step: count is {} with appends {}; it must be >= 0, with appends non-null when > 0", count,
            appends == nullptr ? "null" : "non-null"));
    }
    uint64_t const stamp = sequences.nextStamp();
    bool withKeys = false;
    for (int32_t i = 0; i < count; ++i)
    {
        SequenceAppend const& append = appends[i];
        SequenceState const& sequence = sequences[sequences.rowOf(append.sequence, "step")];
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
        if (append.numExtraKeys != 0)
        {
            checkExtraKeys("step", append.extraKeys, append.numExtraKeys, sequence.length,
                int64_t{sequence.length} + append.count);
            withKeys = true;
        }
    }
    return withKeys;
}

namespace
{

//! Calls f(entries, length, firstHeld, firstKept) for each entry of a step that appends tokens: the sequence's entries
//! in `group`, its length, its first held entry and the first one the group's window keeps.
template <typename Policy, typename F>
void forEachAppending(Policy const& policy, SequenceTable const& sequences, int32_t group,
    SequenceAppend const* appends, int32_t count, F&& f)
{
    for (int32_t i = 0; i < count; ++i)
    {
        if (appends[i].count == 0)
        {
            continue;
        }
        int32_t const row = SequenceTable::rowOfLive(appends[i].sequence);
        int64_t const length = sequences[row].length;
        int32_t const first = sequences[row].firstHeld[static_cast<size_t>(group)];
        f(appends[i], sequences.entries(group, row), length, first, std::max(first, policy.firstNeeded(length)));
    }
}

//! The exact page count of one group for a step: pages taken (new, copy-on-write) and pages its window releases make
//! available, through the pool's scratch counters (all zero again on return). `Policy` is the group's kind.
template <typename Policy>
void countGroup(Policy const& policy, PagePool const& pool, SequenceTable const& sequences, int32_t group,
    SequenceAppend const* appends, int32_t count, int64_t pageMask, int32_t pageShift, int64_t& needed,
    int64_t& released)
{
    int32_t* const scratch = pool.scratch.data();
    // Pass 1: count holders appending to each shared partial page and releases of each page.
    forEachAppending(policy, sequences, group, appends, count,
        [&](SequenceAppend const& append, int32_t const* entries, int64_t length, int32_t first, int32_t firstKept)
        {
            needed += ((length + append.count + pageMask) >> pageShift) - ((length + pageMask) >> pageShift);
            for (int32_t e = first; e < firstKept; ++e)
            {
                ++scratch[entries[e]];
            }
            if ((length & pageMask) != 0)
            {
                int32_t const last = entries[(length - 1) >> pageShift];
                if (pool.holders(last) > 1)
                {
                    // Marked apart from releases: a partial last page is never out of the window.
                    scratch[last] += 1 << 20;
                }
            }
        });
    // Pass 2: a page released by all its holders becomes available; k of r holders appending to a shared partial
    // page need k copies, or k - 1 when all of them do (the last finds the page its own).
    forEachAppending(policy, sequences, group, appends, count,
        [&](SequenceAppend const&, int32_t const* entries, int64_t length, int32_t first, int32_t firstKept)
        {
            for (int32_t e = first; e < firstKept; ++e)
            {
                int32_t& mark = scratch[entries[e]];
                if (mark != 0)
                {
                    released += mark == pool.holders(entries[e]) ? 1 : 0;
                    mark = 0;
                }
            }
            if ((length & pageMask) != 0)
            {
                int32_t const last = entries[(length - 1) >> pageShift];
                int32_t& mark = scratch[last];
                if (mark != 0)
                {
                    int32_t const writers = mark >> 20;
                    needed += writers < pool.holders(last) ? writers : writers - 1;
                    mark = 0;
                }
            }
        });
}

} // namespace

void PageManager::State::countStep(
    SequenceAppend const* appends, int32_t count, int64_t* needed, int64_t* released) const
{
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        needed[g] = 0;
        released[g] = 0;
        policies[static_cast<size_t>(g)].visit(
            [&](auto const& policy)
            {
                countGroup(policy, pools[static_cast<size_t>(g)], sequences, g, appends, count, pageMask, pageShift,
                    needed[g], released[g]);
            });
    }
}

StepCopies PageManager::State::step(SequenceAppend const* appends, int32_t count)
{
    bool const withKeys = checkStep(appends, count);
    countStep(appends, count, stepNeeded.data(), stepReleased.data());
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        PagePool const& pool = pools[static_cast<size_t>(g)];
        int64_t const available = pool.available() + stepReleased[static_cast<size_t>(g)];
        if (stepNeeded[static_cast<size_t>(g)] > available)
        {
            throw OutOfMemoryError(fmt::format(
                "PageManager::step: page group {} needs {} pages for this step and has {} available ({} free, {} "
                "cached, {} released by the step); nothing was appended",
                g, stepNeeded[static_cast<size_t>(g)], available, pool.pages.numFree(), pool.numCached(),
                stepReleased[static_cast<size_t>(g)]));
        }
    }
    if (recordsEvents())
    {
        reserveStepEvents(appends, count, withKeys);
    }
    // Checked and reserved: from here the step runs to the end. Durations that have ended go first, so that this
    // step's evictions see the priorities of now.
    expireRetention();
    for (std::vector<PageCopy>& list : copies)
    {
        list.clear();
    }
    takeStateCopies();
    // Window releases of every entry first, so that a page one sequence releases can serve another in this step.
    for (int32_t i = 0; i < count && anyWindowed; ++i)
    {
        if (appends[i].count != 0)
        {
            releaseOutOfWindow(SequenceTable::rowOfLive(appends[i].sequence));
        }
    }
    for (int32_t i = 0; i < count; ++i)
    {
        appendOne(appends[i], SequenceTable::rowOfLive(appends[i].sequence));
    }
    StepCopies const result(copies.data(), numGroups(), &stateCopies);
    prefix.notifyEvictions();
    return result;
}

void PageManager::State::releaseOutOfWindow(int32_t row)
{
    SequenceState& sequence = sequences[row];
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        GroupPolicy const& policy = policies[static_cast<size_t>(g)];
        if (!policy.windowed())
        {
            continue;
        }
        int32_t* entries = sequences.entries(g, row);
        int32_t& first = sequence.firstHeld[static_cast<size_t>(g)];
        int32_t const firstKept = std::max(first, policy.firstNeeded(sequence.length));
        for (; first < firstKept; ++first)
        {
            releasePage(g, entries[first]);
            entries[first] = kUNUSED_PAGE_ENTRY;
        }
    }
}

void PageManager::State::appendOne(SequenceAppend const& append, int32_t row)
{
    if (append.count == 0)
    {
        return;
    }
    SequenceState& sequence = sequences[row];
    int64_t const length = sequence.length;
    int32_t const oldPages = static_cast<int32_t>(pagesFor(length));
    int32_t const newPages = static_cast<int32_t>(pagesFor(length + append.count));
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        int32_t* entries = sequences.entries(g, row);
        if ((length & pageMask) != 0)
        {
            int32_t& last = entries[oldPages - 1];
            if (pools[static_cast<size_t>(g)].holders(last) > 1)
            {
                int32_t const fresh = takePage(g);
                copies[static_cast<size_t>(g)].push_back(PageCopy{last, fresh});
                ++copyOnWritePages;
                releasePage(g, last);
                last = fresh;
            }
        }
        for (int32_t e = oldPages; e < newPages; ++e)
        {
            entries[e] = takePage(g);
        }
    }
    if (prefix.enabled())
    {
        registerFilledPages(append, row);
    }
    sequence.length = static_cast<int32_t>(length + append.count);
}

PageHash PageManager::State::hashFilledPage(
    SequenceState& sequence, SequenceAppend const& append, int32_t const* pageTokens, int32_t start)
{
    if (sequence.pendingKeys.empty())
    {
        return prefix.hashPage(sequence.lastHash, pageTokens, start, append.extraKeys, append.numExtraKeys);
    }
    // Keys given with earlier appends of this page come first (their positions are smaller).
    for (int32_t k = 0; k < append.numExtraKeys; ++k)
    {
        if (append.extraKeys[k].position < int64_t{start} + tokensPerPage)
        {
            sequence.pendingKeys.push_back(append.extraKeys[k]);
        }
    }
    PageHash const hash = prefix.hashPage(sequence.lastHash, pageTokens, start, sequence.pendingKeys.data(),
        static_cast<int32_t>(sequence.pendingKeys.size()));
    sequence.pendingKeys.clear();
    return hash;
}

void PageManager::State::registerFilledPages(SequenceAppend const& append, int32_t row)
{
    // Tokens gather in the partial-page buffer; each page that fills is hashed and registered in every group. Whole
    // pages of an append without extra keys are hashed a chunk at a time through chain(), its fastest path.
    constexpr int32_t kCHAIN_PAGES = 32;
    PageHash chained[kCHAIN_PAGES];
    int32_t numChained = 0;
    int32_t nextChained = 0;
    SequenceState& sequence = sequences[row];
    int64_t const newLength = int64_t{sequence.length} + append.count;
    int32_t* partial = sequences.partial(row);
    int64_t position = sequence.length;
    int32_t consumed = 0;
    bool const record = recordsEvents();
    // Gathered from the first page the append fills: most decode appends fill none.
    bool gathering = false;
    while (consumed < append.count)
    {
        int32_t const inPage = static_cast<int32_t>(position & pageMask);
        int32_t const take = std::min(tokensPerPage - inPage, append.count - consumed);
        bool const whole = inPage == 0 && take == tokensPerPage;
        int32_t const* pageTokens = whole ? append.tokens + consumed : partial;
        if (!whole)
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
        int32_t const pageIndex = start >> pageShift;
        PageHash hash{};
        bool const fromChain = whole && append.numExtraKeys == 0 && sequence.pendingKeys.empty();
        if (fromChain)
        {
            if (nextChained == numChained)
            {
                // This page and the whole pages after it (the append is page-aligned from here on).
                numChained = std::min(kCHAIN_PAGES, 1 + (append.count - consumed) / tokensPerPage);
                nextChained = 0;
                prefix.hasher().chain(sequence.lastHash, pageTokens, numChained, tokensPerPage, chained);
            }
            hash = chained[nextChained++];
        }
        else
        {
            hash = hashFilledPage(sequence, append, pageTokens, start);
        }
        if (record && !gathering)
        {
            // Before lastHash moves on: it is the first filled page's parent.
            beginFilled(row, pageIndex);
            gathering = true;
        }
        sequence.lastHash = hash;
        if (record)
        {
            // A chained page has no extra keys; any other was hashed last, with its keys' bytes.
            std::vector<uint8_t> const& keyBytes = prefix.lastKeyBytes();
            // Only the first page can have been completed in the partial-page buffer, which the append's last
            // tokens may overwrite before the pages are recorded.
            int32_t const* const kept = whole ? pageTokens : keepPartialTokens(pageTokens);
            addFilled(row, hash, kept, fromChain ? nullptr : keyBytes.data(), fromChain ? 0 : keyBytes.size());
        }
        for (int32_t g = 0; g < numGroups(); ++g)
        {
            if (prefix.registerPage(g, sequences.entries(g, row)[pageIndex], hash) && record)
            {
                markFresh(g, filled.count - 1);
            }
        }
        if (cuts.enabled())
        {
            filledPage(row, pageIndex, hash);
        }
    }
    if (gathering)
    {
        recordFilled();
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

} // namespace kvcache::rt
