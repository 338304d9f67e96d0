#pragma once

// The page manager model's sequence calls (page_manager_model_class.h): create(), adoptPrefix(), step(), fork(),
// free() and the tiered cache's adoptRun(), each validating first and changing nothing unless it returns kOK.

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "support/page_manager_model_class.h"

namespace kvcache::test
{

inline ModelOutcome PageManagerModel::create(rt::SequenceId id, void const* salt, size_t saltBytes)
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

inline ModelOutcome PageManagerModel::checkCreate(void const* salt, size_t saltBytes) const
{
    return static_cast<int32_t>(mSequences.size()) >= mMaxSequences || (salt == nullptr && saltBytes > 0)
        ? ModelOutcome::kINVALID_ARGUMENT
        : ModelOutcome::kOK;
}

inline ModelOutcome PageManagerModel::adoptPrefix(rt::SequenceId id, int32_t const* tokens, int32_t count,
    rt::PageExtraKey const* keys, int32_t numKeys, int32_t* adopted)
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

inline ModelOutcome PageManagerModel::step(rt::SequenceAppend const* appends, int32_t count)
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

inline ModelOutcome PageManagerModel::fork(rt::SequenceId parent, rt::SequenceId child)
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

inline ModelOutcome PageManagerModel::checkFork(rt::SequenceId parent) const
{
    return mSequences.count(parent) == 0 || static_cast<int32_t>(mSequences.size()) >= mMaxSequences
        ? ModelOutcome::kINVALID_ARGUMENT
        : ModelOutcome::kOK;
}

inline ModelOutcome PageManagerModel::free(rt::SequenceId id)
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

inline bool PageManagerModel::adoptRun(rt::SequenceId id, int32_t const* tokens, int32_t pages,
    rt::PageExtraKey const* keys, int32_t numKeys, std::vector<std::vector<std::pair<int32_t, int32_t>>>* fresh)
{
    Sequence& sequence = mSequences.at(id);
    int32_t const first = sequence.length / mTokensPerPage;
    int32_t const end = first + pages;
    std::vector<rt::PageHash> hashes;
    rt::PageHash parent = sequence.pageHashes.empty() ? sequence.root : sequence.pageHashes.back();
    for (int32_t p = 0; p < pages; ++p)
    {
        parent =
            hashPage(parent, tokens + int64_t{p} * mTokensPerPage, int64_t{first + p} * mTokensPerPage, keys, numKeys);
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

} // namespace kvcache::test
