// The library's own access to a PageManager: hashNextPages() with what a run adopted by its hashes needs, and that
// adoption's checks.
#include "paging/page_manager/page_manager_internal.h"

#include "paging/page_manager/page_manager_state.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

namespace kvcache::rt::detail
{

NextPageHashes PageManagerInternal::hashNextPages(PageManager const& manager, SequenceId sequence,
    int32_t const* tokens, int32_t count, PageHash* out, PageExtraKey const* extraKeys, int32_t numExtraKeys)
{
    PageManager::State& s = *manager.mState;
    int32_t const row = s.sequences.rowOf(sequence, "hashNextPages");
    NextPageHashes known;
    known.count = s.hashNextPages(row, tokens, count, out, extraKeys, numExtraKeys);
    known.sequence = sequence;
    known.parent = s.sequences[row].lastHash;
    known.firstPage = s.sequences[row].length >> s.pageShift;
    known.hashes = out;
    known.tokens = tokens;
    known.extraKeys = extraKeys;
    known.numExtraKeys = numExtraKeys;
    return known;
}

bool PageManagerInternal::hasPage(PageManager const& manager, int32_t group, PageHash hash) noexcept
{
    return manager.mState->prefix.find(group, hash) != PageHashTable::kNONE_PAGE;
}

void PageManagerInternal::registeredHashes(PageManager const& manager, int32_t group, std::vector<PageHash>& out)
{
    PageManager::State const& s = *manager.mState;
    out.clear();
    for (int32_t page = 0; page < s.pools[static_cast<size_t>(group)].pages.numPages(); ++page)
    {
        if (s.prefix.isRegistered(group, page))
        {
            out.push_back(s.prefix.hashOf(group, page));
        }
    }
}

void PageManagerInternal::addTenantHits(
    PageManager& manager, SequenceId sequence, int64_t hostTokens, int64_t diskTokens) noexcept
{
    PageManager::State& s = *manager.mState;
    PrefixTenantStats& stats = s.tenantStats(s.sequences[SequenceTable::rowOfLive(sequence)].tenant);
    stats.hostHitTokens += hostTokens;
    stats.diskHitTokens += diskTokens;
}

int32_t PageManagerInternal::evictedPriority(PageManager const& manager) noexcept
{
    return manager.mState->prefix.notifyingPriority();
}

int32_t PageManagerInternal::evictedStateSlot(PageManager const& manager) noexcept
{
    return manager.mState->prefix.notifyingStateSlot();
}

int32_t PageManagerInternal::checkpointGroup(PageManager const& manager) noexcept
{
    return manager.mState->checkpoints.carrierGroup;
}

bool PageManagerInternal::hasStateLayers(PageManager const& manager) noexcept
{
    return manager.mState->stateSlots;
}

bool PageManagerInternal::hasCheckpoint(PageManager const& manager, PageHash hash) noexcept
{
    PageManager::State const& s = *manager.mState;
    if (!s.checkpoints.enabled())
    {
        return false;
    }
    int32_t const page = s.prefix.find(s.checkpoints.carrierGroup, hash);
    int32_t const index = page == PageHashTable::kNONE_PAGE ? -1 : s.checkpoints.byCarrier[static_cast<size_t>(page)];
    return index >= 0 && s.checkpoints.adoptable(index);
}

bool PageManagerInternal::recordsEvents(PageManager const& manager) noexcept
{
    return manager.mState->recordsEvents();
}

int32_t PageManagerInternal::numRegistered(PageManager const& manager, int32_t group) noexcept
{
    return manager.mState->prefix.numRegistered(group);
}

int32_t PageManagerInternal::firstNeededPage(PageManager const& manager, int32_t group, int32_t pages) noexcept
{
    PageManager::State const& s = *manager.mState;
    return s.policies[static_cast<size_t>(group)].firstAdopted(pages, s.tokensPerPage);
}

bool PageManagerInternal::adoptRun(PageManager& manager, NextPageHashes const& known, int32_t pages,
    std::vector<std::vector<FreshPage>>& fresh, bool hostState, int32_t* fillSlot)
{
    PageManager::State& s = *manager.mState;
    int32_t const row = s.sequences.rowOf(known.sequence, "adoptRun");
    SequenceState const& sequence = s.sequences[row];
    if (!s.prefix.enabled())
    {
        throw InvalidArgumentError(
            "PageManager::adoptRun: prefix caching is off; a run is adopted by its hashes (enablePrefixCaching)");
    }
    if (int64_t{sequence.length} != int64_t{known.firstPage} * s.tokensPerPage || sequence.lastHash != known.parent)
    {
        throw InvalidArgumentError(fmt::format("PageManager::adoptRun: sequence {} has {} tokens; the run's hashes "
                                               "continue {} whole pages of {} tokens ({} tokens) and their hash chain",
            known.sequence, sequence.length, known.firstPage, s.tokensPerPage,
            int64_t{known.firstPage} * s.tokensPerPage));
    }
    if (pages < 1 || pages > known.count || known.hashes == nullptr)
    {
        throw InvalidArgumentError(fmt::format(
            "PageManager::adoptRun: pages is {}; it must be in [1, {}] (the pages hashed)", pages, known.count));
    }
    // Written before the eviction callback runs: a callback that throws leaves the caller a slot to fill.
    int32_t unused = -1;
    return s.adoptRun(row, known, pages, fresh, hostState, fillSlot != nullptr ? *fillSlot : unused);
}

} // namespace kvcache::rt::detail
