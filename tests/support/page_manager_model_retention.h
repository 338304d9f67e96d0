#pragma once

// The page manager model's retention priorities (page_manager_model_class.h): setRetention() with and without a
// duration, and the durations' ends, which move a cached page whose priority changes to the newest end of its list.

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "support/page_manager_model_class.h"

namespace kvcache::test
{

inline ModelOutcome PageManagerModel::setRetention(
    rt::SequenceId id, int32_t firstToken, int32_t endToken, int32_t priority, int64_t durationMs)
{
    auto found = mSequences.find(id);
    bool const timedSet = durationMs != rt::PageManager::kNO_DURATION;
    if (found == mSequences.end() || priority < 0 || priority > rt::PageManager::kMAX_RETENTION_PRIORITY
        || (timedSet && (durationMs < 0 || durationMs > rt::PageManager::kMAX_RETENTION_DURATION_MS)) || firstToken < 0
        || firstToken > endToken || endToken > found->second.length)
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

inline void PageManagerModel::expireRetention()
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

} // namespace kvcache::test
