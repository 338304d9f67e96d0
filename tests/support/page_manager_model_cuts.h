#pragma once

// The page manager model's cuts of a hybrid cache (page_manager_model_class.h): how many cuts anchor a page, the
// eviction that drops cuts while a windowed group has only anchored pages cached (the clock and its target), and
// making and dropping a cut.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "support/page_manager_model_class.h"

namespace kvcache::test
{

inline int32_t PageManagerModel::anchors(Group const& group, int32_t page) const
{
    size_t const g = static_cast<size_t>(&group - mGroups.data());
    int32_t count = 0;
    for (Cut const& cut : mCuts)
    {
        count += static_cast<int32_t>(std::count(cut.window[g].begin(), cut.window[g].end(), page));
    }
    return count;
}

inline int32_t PageManagerModel::evictNext(int32_t g)
{
    while (mGroups[static_cast<size_t>(g)].lru.empty())
    {
        auto const neverAdopted = [](Cut const& cut) { return !cut.adopted; };
        int32_t const numNeverAdopted = static_cast<int32_t>(std::count_if(mCuts.begin(), mCuts.end(), neverAdopted));
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

inline void PageManagerModel::makeCut(std::vector<rt::PageHash> const& hashes, int32_t pages, bool adopted)
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
            std::optional<int32_t> const page = lookup(mGroups[static_cast<size_t>(g)], hashes[static_cast<size_t>(p)]);
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
        int32_t const numNeverAdopted =
            static_cast<int32_t>(std::count_if(mCuts.begin(), mCuts.end(), [](Cut const& c) { return !c.adopted; }));
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

inline void PageManagerModel::dropCut(size_t c)
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

} // namespace kvcache::test
