// Transfer descriptors: the matching (address, bytes, device) lists that move a sequence's pages between two caches,
// in the order of the page anatomy's parts, with page sizes and tensor-parallel head slices remapped.

#include "kvcache/dist/transfer_descriptors.h"

#include "core/layout/page_anatomy.h"

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_table.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace kvcache::rt
{
namespace
{

//! The bytes one token of one head takes in one half of `entry`: page halves are token-major, [P, H, ...].
int64_t tokenHeadBytes(detail::PageEntry const& entry, PageGeometry const& geometry)
{
    int64_t const heads = geometry.layers[static_cast<size_t>(entry.layer)].numKVHeads;
    return entry.halfBytes / (int64_t{geometry.tokensPerPage} * heads);
}

//! Appends a range pair, merged into the previous pair when both sides continue it and it is not before `floor` (the
//! first range of the current layer: ranges of two layers never merge, so each layer can be waited on alone).
void appendRange(TransferDescriptors& out, size_t floor, MemoryRange local, MemoryRange remote)
{
    if (out.local.size() > floor)
    {
        MemoryRange& lastLocal = out.local.back();
        MemoryRange& lastRemote = out.remote.back();
        if (lastLocal.address + lastLocal.bytes == local.address
            && lastRemote.address + lastRemote.bytes == remote.address && lastLocal.device == local.device
            && lastRemote.device == remote.device)
        {
            lastLocal.bytes += local.bytes;
            lastRemote.bytes += remote.bytes;
            return;
        }
    }
    out.local.push_back(local);
    out.remote.push_back(remote);
}

void checkPages(char const* name, int32_t const* pages, int32_t count, int32_t needed, int32_t numPages)
{
    if (pages == nullptr && count > 0)
    {
        throw InvalidArgumentError(fmt::format("transferDescriptors: {} is null and its count {}", name, count));
    }
    if (count < needed)
    {
        throw InvalidArgumentError(
            fmt::format("transferDescriptors: {} holds {} pages; the tokens need {}", name, count, needed));
    }
    for (int32_t i = 0; i < needed; ++i)
    {
        int32_t const page = pages[i];
        if (page != kUNUSED_PAGE_ENTRY && (page < 0 || page >= numPages))
        {
            throw OutOfRangeError(
                fmt::format("transferDescriptors: {}[{}] is page {}, outside [0, {})", name, i, page, numPages));
        }
    }
}

int32_t pagesFor(int64_t tokens, int32_t tokensPerPage)
{
    return static_cast<int32_t>((tokens + tokensPerPage - 1) / tokensPerPage);
}

//! Throws InvalidArgumentError, naming `caller`, for no remotes, a remote whose pages of `group` cannot move to or from
//! the local cache's (transferMismatch's reason), or remotes of different page sizes.
void checkRemotes(char const* caller, TransferDescription const& local, std::vector<TransferDescription> const& remotes,
    int32_t group)
{
    if (remotes.empty())
    {
        throw InvalidArgumentError(fmt::format("{}: remotes is empty; give at least one remote cache", caller));
    }
    for (size_t r = 0; r < remotes.size(); ++r)
    {
        std::string const why = transferMismatch(local, remotes[r], group);
        if (!why.empty())
        {
            throw InvalidArgumentError(fmt::format("{}: remotes[{}]: {}", caller, r, why));
        }
    }
    int32_t const first = remotes.front().groups[static_cast<size_t>(group)].geometry.tokensPerPage;
    for (TransferDescription const& remote : remotes)
    {
        int32_t const tokensPerPage = remote.groups[static_cast<size_t>(group)].geometry.tokensPerPage;
        if (tokensPerPage != first)
        {
            throw InvalidArgumentError(fmt::format("{}: the remotes' tokensPerPage differ ({} and {}); "
                                                   "one remote page list serves ranks of one page size",
                caller, first, tokensPerPage));
        }
    }
}

//! Per layer of `group` and local head, the remote it comes from: the first in `remotes` that holds it. Throws
//! InvalidArgumentError, naming `caller`, for a local head no remote holds.
std::vector<std::vector<int32_t>> headSources(char const* caller, TransferDescription const& local,
    std::vector<TransferDescription> const& remotes, int32_t group)
{
    TransferGroup const& mine = local.groups[static_cast<size_t>(group)];
    size_t const numLayers = mine.geometry.layers.size();
    std::vector<std::vector<int32_t>> source(numLayers);
    for (size_t l = 0; l < numLayers; ++l)
    {
        int32_t const heads = mine.geometry.layers[l].numKVHeads;
        source[l].assign(static_cast<size_t>(heads), -1);
        for (int32_t h = 0; h < heads; ++h)
        {
            int64_t const head = int64_t{mine.layers[l].firstHead} + h;
            for (size_t r = 0; r < remotes.size() && source[l][static_cast<size_t>(h)] < 0; ++r)
            {
                TransferGroup const& theirs = remotes[r].groups[static_cast<size_t>(group)];
                int64_t const first = theirs.layers[l].firstHead;
                if (head >= first && head < first + theirs.geometry.layers[l].numKVHeads)
                {
                    source[l][static_cast<size_t>(h)] = static_cast<int32_t>(r);
                }
            }
            if (source[l][static_cast<size_t>(h)] < 0)
            {
                throw InvalidArgumentError(
                    fmt::format("{}: group {} layer {}: no remote holds model head {}, which the local cache holds",
                        caller, group, l, head));
            }
        }
    }
    return source;
}

} // namespace

std::vector<TransferDescriptors> transferDescriptors(TransferDescription const& local, int32_t const* localPages,
    int32_t numLocalPages, std::vector<TransferDescription> const& remotes, int32_t const* remotePages,
    int32_t numRemotePages, int32_t group, int32_t numTokens)
{
    checkRemotes("transferDescriptors", local, remotes, group);
    if (numTokens < 0)
    {
        throw InvalidArgumentError(fmt::format("transferDescriptors: numTokens is {}; it must be >= 0", numTokens));
    }
    TransferGroup const& mine = local.groups[static_cast<size_t>(group)];
    PageGeometry const& geometry = mine.geometry;
    detail::PageAnatomy const anatomy = detail::pageAnatomy(geometry);
    int32_t const localTokensPerPage = geometry.tokensPerPage;
    int32_t const remoteTokensPerPage = remotes.front().groups[static_cast<size_t>(group)].geometry.tokensPerPage;
    checkPages("localPages", localPages, numLocalPages, pagesFor(numTokens, localTokensPerPage), mine.numPages);
    for (TransferDescription const& remote : remotes)
    {
        checkPages("remotePages", remotePages, numRemotePages, pagesFor(numTokens, remoteTokensPerPage),
            remote.groups[static_cast<size_t>(group)].numPages);
    }
    size_t const numLayers = geometry.layers.size();
    std::vector<std::vector<int32_t>> const source = headSources("transferDescriptors", local, remotes, group);

    int32_t const run = std::min(localTokensPerPage, remoteTokensPerPage);
    int64_t const runs = (int64_t{numTokens} + run - 1) / run;
    std::vector<TransferDescriptors> result(remotes.size());
    // Where each run of tokens lies on both sides (page, first token in it), the same for every part and half; runs
    // of a page a window released on either side are left out, and runs that continue the one before on both sides
    // join it.
    struct Run
    {
        int32_t localPage;
        int32_t localToken;
        int32_t remotePage;
        int32_t remoteToken;
        int64_t tokens; //!< consecutive runs whose bytes follow each other on both sides are one, this long
    };
    std::vector<Run> places;
    places.reserve(static_cast<size_t>(runs));
    for (int64_t c = 0; c < runs; ++c)
    {
        int64_t const token = c * run;
        Run const place{localPages[token / localTokensPerPage], static_cast<int32_t>(token % localTokensPerPage),
            remotePages[token / remoteTokensPerPage], static_cast<int32_t>(token % remoteTokensPerPage), run};
        if (place.localPage == kUNUSED_PAGE_ENTRY || place.remotePage == kUNUSED_PAGE_ENTRY)
        {
            continue;
        }
        // A page half is [tokensPerPage, heads, bytes] and page p + 1's half follows page p's, so a token's bytes sit
        // at (page * tokensPerPage + token) token rows into the pool half, on each side.
        auto const row = [](int32_t page, int32_t first, int32_t tokensPerPage)
        { return int64_t{page} * tokensPerPage + first; };
        if (!places.empty())
        {
            Run& last = places.back();
            if (row(last.localPage, last.localToken, localTokensPerPage) + last.tokens
                    == row(place.localPage, place.localToken, localTokensPerPage)
                && row(last.remotePage, last.remoteToken, remoteTokensPerPage) + last.tokens
                    == row(place.remotePage, place.remoteToken, remoteTokensPerPage))
            {
                last.tokens += run;
                continue;
            }
        }
        places.push_back(place);
    }
    // Room for one range per run, part half and remote: the most there are when heads are whole and nothing merges.
    int64_t halves = 0;
    for (detail::PageEntry const& entry : anatomy.entries)
    {
        halves += entry.halves;
    }
    for (TransferDescriptors& ranges : result)
    {
        ranges.local.reserve(places.size() * static_cast<size_t>(halves));
        ranges.remote.reserve(places.size() * static_cast<size_t>(halves));
        ranges.layerEnds.reserve(numLayers);
    }
    for (size_t l = 0; l < numLayers; ++l)
    {
        for (size_t r = 0; r < remotes.size(); ++r)
        {
            TransferGroup const& theirs = remotes[r].groups[static_cast<size_t>(group)];
            int64_t const localHeads = geometry.layers[l].numKVHeads;
            int64_t const remoteHeads = theirs.geometry.layers[l].numKVHeads;
            // This remote's head runs: [first, end) as local head indices, all taken from it.
            std::vector<std::pair<int64_t, int64_t>> headRuns;
            for (int64_t h = 0; h < localHeads; ++h)
            {
                if (source[l][static_cast<size_t>(h)] != static_cast<int32_t>(r))
                {
                    continue;
                }
                if (!headRuns.empty() && headRuns.back().second == h)
                {
                    ++headRuns.back().second;
                }
                else
                {
                    headRuns.emplace_back(h, h + 1);
                }
            }
            size_t const floor = result[r].local.size();
            int64_t const headShift = int64_t{mine.layers[l].firstHead} - theirs.layers[l].firstHead;
            bool const wholeHeads = headRuns.size() == 1 && headRuns[0].second - headRuns[0].first == localHeads
                && localHeads == remoteHeads;
            for (size_t e = 0; e < anatomy.entries.size(); ++e)
            {
                detail::PageEntry const& entry = anatomy.entries[e];
                if (entry.layer != static_cast<int32_t>(l) || headRuns.empty())
                {
                    continue;
                }
                int64_t const unit = tokenHeadBytes(entry, geometry);
                int64_t const localHalf = entry.halfBytes;
                int64_t const remoteHalf = int64_t{remoteTokensPerPage} * remoteHeads * unit;
                for (int32_t half = 0; half < entry.halves; ++half)
                {
                    uint64_t const localPool =
                        mine.poolBases[e] + static_cast<uint64_t>(int64_t{half} * mine.numPages * localHalf);
                    uint64_t const remotePool =
                        theirs.poolBases[e] + static_cast<uint64_t>(int64_t{half} * theirs.numPages * remoteHalf);
                    for (Run const& place : places)
                    {
                        int64_t const localToken = place.localToken;
                        int64_t const remoteToken = place.remoteToken;
                        uint64_t const localStart =
                            localPool + static_cast<uint64_t>(int64_t{place.localPage} * localHalf);
                        uint64_t const remoteStart =
                            remotePool + static_cast<uint64_t>(int64_t{place.remotePage} * remoteHalf);
                        if (wholeHeads)
                        {
                            auto const bytes = static_cast<uint64_t>(place.tokens * localHeads * unit);
                            appendRange(result[r], floor,
                                {localStart + static_cast<uint64_t>(localToken * localHeads * unit), bytes,
                                    local.device},
                                {remoteStart + static_cast<uint64_t>(remoteToken * remoteHeads * unit), bytes,
                                    remotes[r].device});
                            continue;
                        }
                        for (int64_t t = 0; t < place.tokens; ++t)
                        {
                            for (auto const& [first, end] : headRuns)
                            {
                                auto const bytes = static_cast<uint64_t>((end - first) * unit);
                                int64_t const localOffset = ((localToken + t) * localHeads + first) * unit;
                                int64_t const remoteOffset =
                                    ((remoteToken + t) * remoteHeads + first + headShift) * unit;
                                appendRange(result[r], floor,
                                    {localStart + static_cast<uint64_t>(localOffset), bytes, local.device},
                                    {remoteStart + static_cast<uint64_t>(remoteOffset), bytes, remotes[r].device});
                            }
                        }
                    }
                }
            }
            result[r].layerEnds.push_back(static_cast<int64_t>(result[r].local.size()));
        }
    }
    return result;
}

PreparedDescriptors preparedDescriptors(
    TransferDescription const& description, int32_t group, int32_t tokensPerDescriptor)
{
    if (group < 0 || static_cast<size_t>(group) >= description.groups.size())
    {
        throw OutOfRangeError(fmt::format(
            "preparedDescriptors: group {} is outside the description's {} groups", group, description.groups.size()));
    }
    TransferGroup const& mine = description.groups[static_cast<size_t>(group)];
    int32_t const tokensPerPage = mine.geometry.tokensPerPage;
    if (tokensPerDescriptor < 1 || tokensPerPage % tokensPerDescriptor != 0)
    {
        throw InvalidArgumentError(fmt::format(
            "preparedDescriptors: tokensPerDescriptor is {}; it must be >= 1 and divide the group's tokensPerPage {}",
            tokensPerDescriptor, tokensPerPage));
    }
    detail::PageAnatomy const anatomy = detail::pageAnatomy(mine.geometry);
    if (mine.poolBases.size() != anatomy.entries.size())
    {
        throw InvalidArgumentError(
            fmt::format("preparedDescriptors: group {} has {} pool bases; its pages have {} parts", group,
                mine.poolBases.size(), anatomy.entries.size()));
    }
    PreparedDescriptors result;
    result.numPages = mine.numPages;
    result.descriptorsPerPage = tokensPerPage / tokensPerDescriptor;
    int64_t const count = int64_t{mine.numPages} * result.descriptorsPerPage;
    for (size_t l = 0; l < mine.geometry.layers.size(); ++l)
    {
        for (size_t e = 0; e < anatomy.entries.size(); ++e)
        {
            detail::PageEntry const& entry = anatomy.entries[e];
            if (entry.layer != static_cast<int32_t>(l))
            {
                continue;
            }
            for (int32_t half = 0; half < entry.halves; ++half)
            {
                uint64_t const pool =
                    mine.poolBases[e] + static_cast<uint64_t>(int64_t{half} * mine.numPages * entry.halfBytes);
                result.blocks.push_back({pool, static_cast<uint64_t>(entry.halfBytes / result.descriptorsPerPage),
                    description.device, count});
            }
        }
        result.layerEnds.push_back(static_cast<int64_t>(result.blocks.size()));
    }
    return result;
}

PreparedPlan preparedPlan(
    TransferDescription const& local, std::vector<TransferDescription> const& remotes, int32_t group)
{
    checkRemotes("preparedPlan", local, remotes, group);
    std::vector<std::vector<int32_t>> const source = headSources("preparedPlan", local, remotes, group);
    TransferGroup const& mine = local.groups[static_cast<size_t>(group)];
    PreparedPlan plan;
    plan.tokensPerDescriptor = std::min(
        mine.geometry.tokensPerPage, remotes.front().groups[static_cast<size_t>(group)].geometry.tokensPerPage);
    for (size_t l = 0; l < source.size(); ++l)
    {
        // Whole when one remote gives every head and holds no others: then its heads are the local ones, in order,
        // and a page half's tokens are the same bytes on both sides.
        int32_t const r = source[l].empty() ? -1 : source[l].front();
        bool whole = r >= 0 && std::all_of(source[l].begin(), source[l].end(), [r](int32_t s) { return s == r; });
        if (whole)
        {
            TransferLayer const& theirs = remotes[static_cast<size_t>(r)].groups[static_cast<size_t>(group)].layers[l];
            int32_t const theirHeads =
                remotes[static_cast<size_t>(r)].groups[static_cast<size_t>(group)].geometry.layers[l].numKVHeads;
            whole = theirs.firstHead == mine.layers[l].firstHead && theirHeads == mine.geometry.layers[l].numKVHeads;
        }
        plan.layerSources.push_back(whole ? r : -1);
    }
    return plan;
}

namespace
{

void checkSlots(char const* name, int32_t const* slots, int32_t count, int32_t numStateSlots)
{
    if (slots == nullptr && count > 0)
    {
        throw InvalidArgumentError(fmt::format("stateTransferDescriptors: {} is null and the count {}", name, count));
    }
    for (int32_t i = 0; i < count; ++i)
    {
        if (slots[i] < 0 || slots[i] >= numStateSlots)
        {
            throw OutOfRangeError(fmt::format(
                "stateTransferDescriptors: {}[{}] is slot {}, outside [0, {})", name, i, slots[i], numStateSlots));
        }
    }
}

} // namespace

TransferDescriptors stateTransferDescriptors(TransferDescription const& local, int32_t const* localSlots,
    TransferDescription const& remote, int32_t const* remoteSlots, int32_t count)
{
    std::string const mismatch = stateTransferMismatch(local, remote);
    if (!mismatch.empty())
    {
        throw InvalidArgumentError("stateTransferDescriptors: " + mismatch);
    }
    if (count < 0)
    {
        throw InvalidArgumentError(fmt::format("stateTransferDescriptors: count is {}; it must be >= 0", count));
    }
    checkSlots("localSlots", localSlots, count, local.numStateSlots);
    checkSlots("remoteSlots", remoteSlots, count, remote.numStateSlots);
    TransferDescriptors result;
    for (size_t l = 0; l < local.stateLayers.size(); ++l)
    {
        size_t const floor = result.local.size();
        for (size_t t = 0; t < local.stateLayers[l].tensors.size(); ++t)
        {
            TransferStateTensor const& mine = local.stateLayers[l].tensors[t];
            TransferStateTensor const& theirs = remote.stateLayers[l].tensors[t];
            auto const bytes = static_cast<uint64_t>(mine.slotBytes);
            for (int32_t i = 0; i < count; ++i)
            {
                appendRange(result, floor,
                    {mine.base + static_cast<uint64_t>(localSlots[i]) * bytes, bytes, local.device},
                    {theirs.base + static_cast<uint64_t>(remoteSlots[i]) * bytes, bytes, remote.device});
            }
        }
        result.layerEnds.push_back(static_cast<int64_t>(result.local.size()));
    }
    return result;
}

PreparedDescriptors preparedStateDescriptors(TransferDescription const& description)
{
    PreparedDescriptors result;
    if (description.stateLayers.empty())
    {
        return result;
    }
    result.numPages = description.numStateSlots;
    result.descriptorsPerPage = 1;
    for (TransferStateLayer const& layer : description.stateLayers)
    {
        for (TransferStateTensor const& tensor : layer.tensors)
        {
            result.blocks.push_back({tensor.base, static_cast<uint64_t>(tensor.slotBytes), description.device,
                int64_t{description.numStateSlots}});
        }
        result.layerEnds.push_back(static_cast<int64_t>(result.blocks.size()));
    }
    return result;
}

} // namespace kvcache::rt
