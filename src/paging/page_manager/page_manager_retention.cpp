// Retention priorities (PageManager::setRetention): the checks, each held page's priority raised, and the ends of
// durations. The order they give eviction lives in the pools' cached lists (page_pool.h, cached_page_list.h).
#include "paging/page_manager/page_manager_state.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <chrono>

namespace kvcache::rt
{

void PageManager::setRetention(
    SequenceId sequence, int32_t firstToken, int32_t endToken, int32_t priority, int64_t durationMs)
{
    State& s = *mState;
    int32_t const row = s.sequences.rowOf(sequence, "setRetention");
    if (priority < 0 || priority > kMAX_RETENTION_PRIORITY)
    {
        throw InvalidArgumentError(fmt::format(
            "PageManager::setRetention: priority is {}; it must be in [0, {}]", priority, kMAX_RETENTION_PRIORITY));
    }
    if (durationMs != kNO_DURATION && (durationMs < 0 || durationMs > kMAX_RETENTION_DURATION_MS))
    {
        throw InvalidArgumentError(fmt::format("PageManager::setRetention: durationMs is {}; it must be in [0, {}] or "
                                               "kNO_DURATION ({})",
            durationMs, kMAX_RETENTION_DURATION_MS, kNO_DURATION));
    }
    int32_t const length = s.sequences[row].length;
    if (firstToken < 0 || firstToken > endToken || endToken > length)
    {
        throw InvalidArgumentError(fmt::format("PageManager::setRetention: the range [firstToken, endToken) is [{}, "
                                               "{}); it must lie within [0, {}] (sequence {} has {} tokens)",
            firstToken, endToken, length, sequence, length));
    }
    if (firstToken == endToken)
    {
        return;
    }
    int64_t const endMs = durationMs == kNO_DURATION ? 0 : s.now() + durationMs;
    int32_t const firstEntry = firstToken >> s.pageShift;
    int32_t const lastEntry = (endToken - 1) >> s.pageShift;
    for (int32_t g = 0; g < s.numGroups(); ++g)
    {
        PagePool& pool = s.pools[static_cast<size_t>(g)];
        int32_t const* entries = s.sequences.entries(g, row);
        for (int32_t e = firstEntry; e <= lastEntry; ++e)
        {
            int32_t const page = entries[e];
            if (page == kUNUSED_PAGE_ENTRY)
            {
                continue;
            }
            if (durationMs == kNO_DURATION)
            {
                pool.raisePriority(page, priority);
            }
            else
            {
                pool.raiseTimedPriority(page, priority, endMs);
            }
        }
    }
}

int64_t PageManager::State::now() const
{
    if (options.clock)
    {
        return options.clock();
    }
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

void PageManager::State::expireRetention()
{
    bool any = false;
    for (PagePool const& pool : pools)
    {
        any = any || !pool.expiries.empty();
    }
    if (!any)
    {
        return;
    }
    int64_t const time = now();
    for (PagePool& pool : pools)
    {
        while (!pool.expiries.empty() && pool.expiries.timeOf(pool.expiries.top()) <= time)
        {
            pool.expireFirst();
        }
    }
}

int32_t PageManager::retentionPriority(int32_t group, int32_t page) const
{
    State const& s = *mState;
    s.checkGroup(group, "retentionPriority");
    int32_t const numPages = s.pools[static_cast<size_t>(group)].pages.numPages();
    if (page < 0 || page >= numPages)
    {
        throw OutOfRangeError(fmt::format(
            "PageManager::retentionPriority: page {} is out of range; it must be in [0, {})", page, numPages));
    }
    return s.pools[static_cast<size_t>(group)].priorityOf(page);
}

} // namespace kvcache::rt
