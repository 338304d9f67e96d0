// Prefix reuse across the parts: adoptPrefix() (hash the prompt, look its pages up in every group, hold them),
// hashNextPages(), and adoptRun() (a run of pages each group has or fills fresh from another tier).
#include "paging/page_manager/page_manager_state.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvcache::rt
{

int32_t PageManager::State::adoptPrefix(
    int32_t row, int32_t const* tokens, int32_t count, PageExtraKey const* keys, int32_t numKeys)
{
    SequenceState& sequence = sequences[row];
    if (sequence.length != 0)
    {
        throw InvalidArgumentError(fmt::format("PageManager::adoptPrefix: sequence {} has {} tokens; it must be empty",
            sequences.idOf(row), sequence.length));
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
    prefixQueryTokens += count;
    tenantStats(sequence.tenant).queryTokens += count;
    // The cuts a sequence waits for are those of the last prompt it was offered (an empty sequence may be offered
    // several).
    sequence.promptBoundary = 0;
    sequence.matchBoundary = 0;
    if (!prefix.enabled() || count <= tokensPerPage)
    {
        return 0;
    }
    int32_t const maxPages = (count - 1) / tokensPerPage;
    int32_t const groups = numGroups();
    // Hash page by page while every full-attention group has the page cached.
    promptHashes.clear();
    promptPages.clear();
    PageHash parent = sequence.root;
    // Without extra keys, pages are hashed a chunk at a time through chain() (its fastest path) and their table
    // rows prefetched, so the lookups' cache misses overlap. A chunk holds about 256 tokens, bounding the hashing
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
                prefix.hasher().chain(parent, tokens + int64_t{p} * tokensPerPage, chunk, tokensPerPage, chained);
                for (int32_t c = 0; c < chunk; ++c)
                {
                    for (int32_t g = 0; g < groups; ++g)
                    {
                        prefix.prefetch(g, chained[c]);
                    }
                }
            }
            hash = chained[inChunk];
        }
        else
        {
            hash = prefix.hashPage(parent, tokens + int64_t{p} * tokensPerPage, p * tokensPerPage, keys, numKeys);
        }
        bool found = true;
        for (int32_t g = 0; g < groups; ++g)
        {
            bool const windowed = policies[static_cast<size_t>(g)].windowed();
            int32_t const page = windowed ? PageHashTable::kNONE_PAGE : prefix.find(g, hash);
            if (!windowed && page == PageHashTable::kNONE_PAGE)
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
    int32_t const found = static_cast<int32_t>(promptHashes.size());
    int32_t pages = 0;
    int32_t checkpoint = -1;
    if (!stateSlots)
    {
        pages = windowedServedPages();
    }
    else if (checkpoints.enabled()
        && std::none_of(pendingStateCopies.begin(), pendingStateCopies.end(),
            [row](StateSlotCopy const& copy) { return copy.src == row; }))
    {
        // The state must be restored too: the longest prefix with a checkpoint. Not into a slot a queued copy reads.
        pages = checkpointedPages(found, checkpoint);
    }
    if (cuts.enabled() || checkpoints.enabled())
    {
        // Cuts and checkpoints where later requests are likeliest to resume: this prompt's own whole pages (a repeat
        // of it) and the run the full-attention group has (a prefix others share), each once the sequence's pages
        // reach it; the prefix adopted now is one too (below).
        sequence.promptBoundary = maxPages > pages ? maxPages : 0;
        sequence.matchBoundary = found > pages ? found : 0;
    }
    if (cuts.enabled())
    {
        std::copy(promptHashes.begin(), promptHashes.begin() + pages, sequences.hashes(row));
    }
    if (pages == 0)
    {
        return 0;
    }
    for (int32_t g = 0; g < groups; ++g)
    {
        PagePool& pool = pools[static_cast<size_t>(g)];
        int32_t* entries = sequences.entries(g, row);
        int32_t const first = policies[static_cast<size_t>(g)].firstAdopted(pages, tokensPerPage);
        for (int32_t p = first; p < pages; ++p)
        {
            int32_t page = promptPages[static_cast<size_t>(p) * static_cast<size_t>(groups) + static_cast<size_t>(g)];
            if (page == PageHashTable::kNONE_PAGE)
            {
                page = prefix.find(g, promptHashes[static_cast<size_t>(p)]);
            }
            pool.hold(page);
            entries[p] = page;
        }
        sequence.firstHeld[static_cast<size_t>(g)] = first;
    }
    sequence.length = pages * tokensPerPage;
    sequence.lastHash = promptHashes[static_cast<size_t>(pages - 1)];
    prefixHitTokens += sequence.length;
    tenantStats(sequence.tenant).deviceHitTokens += sequence.length;
    makeCut(row, pages, true);
    if (checkpoint >= 0)
    {
        restoreCheckpoint(row, checkpoint);
    }
    return sequence.length;
}

bool PageManager::State::windowedServes(int32_t pages) const
{
    for (int32_t g = 0; g < numGroups(); ++g)
    {
        GroupPolicy const& policy = policies[static_cast<size_t>(g)];
        if (!policy.windowed())
        {
            continue;
        }
        for (int32_t p = policy.firstAdopted(pages, tokensPerPage); p < pages; ++p)
        {
            if (prefix.find(g, promptHashes[static_cast<size_t>(p)]) == PageHashTable::kNONE_PAGE)
            {
                return false;
            }
        }
    }
    return true;
}

int32_t PageManager::State::windowedServedPages() const
{
    // Windowed groups need only the pages covering the window before the first token to compute: the longest length
    // all of them can serve.
    int32_t pages = static_cast<int32_t>(promptHashes.size());
    while (pages > 0 && !windowedServes(pages))
    {
        --pages;
    }
    return pages;
}

int32_t PageManager::State::runCheckpoint(int32_t row, PageHash hash, bool hostState, bool& fromHost) const
{
    fromHost = false;
    // As adoptPrefix(): the state must be restored with the pages, and not into a slot a queued copy reads.
    if (!checkpoints.enabled()
        || std::any_of(pendingStateCopies.begin(), pendingStateCopies.end(),
            [row](StateSlotCopy const& copy) { return copy.src == row; }))
    {
        return -1;
    }
    int32_t const carrier = prefix.find(checkpoints.carrierGroup, hash);
    int32_t const index =
        carrier == PageHashTable::kNONE_PAGE ? -1 : checkpoints.byCarrier[static_cast<size_t>(carrier)];
    if (index >= 0)
    {
        // One still filling is adoptable after the step that hands its save out; the host's copy would be a second.
        return checkpoints.adoptable(index) ? index : -1;
    }
    if (!hostState)
    {
        return -1;
    }
    // The host's state goes into a checkpoint slot, taken (takeCheckpointSlot()) once the run's pages fit.
    fromHost = true;
    return 0;
}

bool PageManager::State::adoptRun(int32_t row, detail::NextPageHashes const& known, int32_t pages,
    std::vector<std::vector<detail::FreshPage>>& fresh, bool hostState, int32_t& fillSlot)
{
    fillSlot = -1;
    bool fromHost = false;
    int32_t checkpoint = -1;
    if (stateSlots)
    {
        // Pages without the state after their last token serve nothing: the run ends at a checkpoint, the device's
        // or the host's (onboarded into a checkpoint slot).
        checkpoint = runCheckpoint(row, known.hashes[pages - 1], hostState, fromHost);
        if (checkpoint < 0)
        {
            return false;
        }
    }
    SequenceState& sequence = sequences[row];
    int32_t const first = known.firstPage;
    int32_t const end = first + pages;
    int32_t const groups = numGroups();
    // Each group's registered page of each needed run page, looked up once (promptPages, adoptPrefix's scratch, holds
    // them group after group), and whether the group can give the rest.
    promptPages.assign(static_cast<size_t>(pages) * static_cast<size_t>(groups), PageHashTable::kNONE_PAGE);
    for (int32_t g = 0; g < groups; ++g)
    {
        PagePool const& pool = pools[static_cast<size_t>(g)];
        int32_t const window = policies[static_cast<size_t>(g)].firstAdopted(end, tokensPerPage);
        int32_t const needed = std::max(first, window);
        int32_t* const found = promptPages.data() + static_cast<size_t>(g) * static_cast<size_t>(pages) - first;
        int64_t taken = 0;
        int64_t available = pool.available();
        for (int32_t p = needed; p < end; ++p)
        {
            found[p] = prefix.find(g, known.hashes[p - first]);
            if (found[p] == PageHashTable::kNONE_PAGE)
            {
                ++taken;
            }
            else if (pool.holders(found[p]) == 0)
            {
                --available; // cached now, held by the run
            }
        }
        // Pages of the adopted prefix out of the new window are released first: available when this was their holder.
        int32_t const* entries = sequences.entries(g, row);
        for (int32_t e = sequence.firstHeld[static_cast<size_t>(g)]; e < std::min(first, window); ++e)
        {
            available += pool.holders(entries[e]) == 1 ? 1 : 0;
        }
        if (taken > available)
        {
            return false;
        }
    }
    if (fromHost)
    {
        // Taken before any page, so that nothing changed when every slot is busy; the run's pages evicted below are
        // not its own (held first), so no eviction drops what this slot is about to hold.
        checkpoint = takeCheckpointSlot();
        if (checkpoint < 0)
        {
            return false;
        }
    }
    fresh.resize(static_cast<size_t>(groups));
    bool const record = recordsEvents();
    if (record)
    {
        // Each group stores at most the run's pages and evicts as many; the keys of every page, salt first.
        auto const runPages = static_cast<size_t>(pages) * static_cast<size_t>(groups);
        size_t const keyBytes = sequence.salt.size() + 20 * static_cast<size_t>(std::max(0, known.numExtraKeys));
        events.reserveMore(
            2 * runPages + 1, 2 * runPages, runPages * static_cast<size_t>(tokensPerPage), keyBytes * groups);
        filled.keyBytes.reserve(keyBytes);
        beginFilled(row, first);
        for (int32_t p = first; p < end; ++p)
        {
            addFilled(row, known.hashes[p - first],
                known.tokens != nullptr ? known.tokens + int64_t{p - first} * tokensPerPage : nullptr, known.extraKeys,
                known.numExtraKeys);
        }
    }
    for (int32_t g = 0; g < groups; ++g)
    {
        PagePool& pool = pools[static_cast<size_t>(g)];
        std::vector<detail::FreshPage>& taken = fresh[static_cast<size_t>(g)];
        taken.clear();
        int32_t* entries = sequences.entries(g, row);
        int32_t const window = policies[static_cast<size_t>(g)].firstAdopted(end, tokensPerPage);
        int32_t& held = sequence.firstHeld[static_cast<size_t>(g)];
        // Released before anything is taken, as a step releases its windows' pages before it takes new ones.
        for (; held < std::min(first, window); ++held)
        {
            releasePage(g, entries[held]);
            entries[held] = kUNUSED_PAGE_ENTRY;
        }
        held = std::max(held, window);
        int32_t const needed = std::max(first, window);
        std::fill(entries + first, entries + needed, kUNUSED_PAGE_ENTRY);
        int32_t const* const found = promptPages.data() + static_cast<size_t>(g) * static_cast<size_t>(pages) - first;
        // The group's own pages are held before any page is taken: taking evicts cached pages, never a held one.
        for (int32_t p = needed; p < end; ++p)
        {
            entries[p] = found[p];
            if (found[p] != PageHashTable::kNONE_PAGE)
            {
                pool.hold(found[p]);
            }
        }
        for (int32_t p = needed; p < end; ++p)
        {
            if (found[p] == PageHashTable::kNONE_PAGE)
            {
                int32_t const page = takePage(g);
                if (prefix.registerPage(g, page, known.hashes[p - first]) && record)
                {
                    markFresh(g, p - first);
                }
                entries[p] = page;
                taken.push_back(detail::FreshPage{p, page});
            }
        }
    }
    sequence.length = end * tokensPerPage;
    sequence.lastHash = known.hashes[pages - 1];
    if (cuts.enabled())
    {
        std::copy(known.hashes, known.hashes + pages, sequences.hashes(row) + first);
        // The cuts adoptPrefix() left for the sequence's pages to reach, where the run passed them, and the run's own.
        for (int32_t const cut : {sequence.matchBoundary, sequence.promptBoundary})
        {
            if (cut > first && cut < end)
            {
                makeCut(row, cut);
            }
        }
        makeCut(row, end, true);
    }
    if (stateSlots)
    {
        if (fromHost)
        {
            // The caller fills the slot on its stream before anything reads it (the restore below is handed out by
            // the next step): adoptable at once.
            int32_t const carrier = sequences.entries(checkpoints.carrierGroup, row)[end - 1];
            StateCheckpoints::Slot& slot = checkpoints.slots[static_cast<size_t>(checkpoint)];
            slot.pages = end;
            slot.hash = known.hashes[pages - 1];
            slot.carrier = carrier;
            slot.filling = false;
            checkpoints.kept.add(checkpoint, carrier);
            checkpoints.byCarrier[static_cast<size_t>(carrier)] = checkpoint;
            ++checkpoints.held;
            fillSlot = checkpoints.firstSlot + checkpoint;
        }
        restoreCheckpoint(row, checkpoint);
    }
    if (record)
    {
        recordFilled();
    }
    prefix.notifyEvictions();
    return true;
}

int32_t PageManager::State::hashNextPages(
    int32_t row, int32_t const* tokens, int32_t count, PageHash* out, PageExtraKey const* keys, int32_t numKeys)
{
    SequenceState const& sequence = sequences[row];
    if ((sequence.length & pageMask) != 0)
    {
        throw InvalidArgumentError(
            fmt::format("PageManager::hashNextPages: sequence {} has {} tokens; it must hold whole pages of {}",
                sequences.idOf(row), sequence.length, tokensPerPage));
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
            "PageManager::hashNextPages: tokens is {} and out is {} with count {}; they must point to count token ids "
            "and count / tokensPerPage ({}) hashes",
            tokens == nullptr ? "null" : "non-null", out == nullptr ? "null" : "non-null", count, pages));
    }
    checkExtraKeys("hashNextPages", keys, numKeys, sequence.length, int64_t{sequence.length} + count);
    if (numKeys == 0)
    {
        prefix.hasher().chain(sequence.lastHash, tokens, pages, tokensPerPage, out);
        return pages;
    }
    PageHash parent = sequence.lastHash;
    for (int32_t p = 0; p < pages; ++p)
    {
        parent = prefix.hashPage(
            parent, tokens + int64_t{p} * tokensPerPage, sequence.length + p * tokensPerPage, keys, numKeys);
        out[p] = parent;
    }
    return pages;
}

} // namespace kvcache::rt
