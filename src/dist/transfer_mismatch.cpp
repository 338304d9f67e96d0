// Whether two caches' pages, and their state slots, can move between them: the first difference, named.

#include "core/layout/page_anatomy.h"
#include "core/layout/scale_support.h"
#include "dist/transfer_bits.h"

#include "kvcache/dist/transfer_descriptors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace kvcache::rt
{
namespace
{

//! The model's head count of a layer: what every rank's share adds up to.
int64_t modelHeads(PageLayerGeometry const& layer, TransferLayer const& share, int32_t tp)
{
    return int64_t{layer.numKVHeads} * tp / share.replicas;
}

} // namespace

std::string transferMismatch(TransferDescription const& local, TransferDescription const& remote, int32_t group)
{
    auto const groups = [](TransferDescription const& d) { return static_cast<int32_t>(d.groups.size()); };
    if (group < 0 || group >= groups(local) || group >= groups(remote))
    {
        return fmt::format("group {} is outside the local cache's {} groups or the remote cache's {}", group,
            groups(local), groups(remote));
    }
    TransferGroup const& mine = local.groups[static_cast<size_t>(group)];
    TransferGroup const& theirs = remote.groups[static_cast<size_t>(group)];
    if (mine.layers.size() != mine.geometry.layers.size() || theirs.layers.size() != theirs.geometry.layers.size())
    {
        return fmt::format("group {} describes {} and {} layers' shares for {} and {} layers", group,
            mine.layers.size(), theirs.layers.size(), mine.geometry.layers.size(), theirs.geometry.layers.size());
    }
    for (auto const* side : {&mine, &theirs})
    {
        size_t const parts = detail::pageAnatomy(side->geometry).entries.size();
        if (side->poolBases.size() != parts)
        {
            return fmt::format("group {} of the {} cache has {} pool bases; its pages have {} parts", group,
                side == &mine ? "local" : "remote", side->poolBases.size(), parts);
        }
    }
    // Compare what the pages mean with the page size and the heads held set aside: those may differ and are remapped.
    auto const comparable = [](TransferDescription const& side, TransferGroup const& g)
    {
        PageGeometry geometry = g.geometry;
        geometry.tokensPerPage = 0;
        geometry.bytesPerPage = 0;
        for (size_t i = 0; i < geometry.layers.size(); ++i)
        {
            geometry.layers[i].numKVHeads = static_cast<int32_t>(modelHeads(geometry.layers[i], g.layers[i], side.tp));
        }
        return geometry;
    };
    std::string const difference = pageGeometryDifference(
        comparable(local, mine), comparable(remote, theirs), "the local cache", "the remote cache");
    if (!difference.empty())
    {
        return difference + " (model heads: heads held times tp over replicas)";
    }
    int32_t const a = mine.geometry.tokensPerPage;
    int32_t const b = theirs.geometry.tokensPerPage;
    if (a < 1 || b < 1 || std::max(a, b) % std::min(a, b) != 0)
    {
        return fmt::format("tokensPerPage is {} in the local cache and {} in the remote cache; one must be a whole "
                           "multiple of the other",
            a, b);
    }
    if (detail::keepsHostScales(mine.geometry.quantization))
    {
        for (size_t i = 0; i < mine.layers.size(); ++i)
        {
            bool const hasV = mine.geometry.layers[i].kind != KVLayerKind::kLATENT;
            LayerScales const x = mine.layers[i].hostScales;
            LayerScales const y = theirs.layers[i].hostScales;
            if (detail::bitsOf(x.k) != detail::bitsOf(y.k) || (hasV && detail::bitsOf(x.v) != detail::bitsOf(y.v)))
            {
                return fmt::format(
                    "group {} layer {}'s host-held scales are k {} v {} in the local cache and k {} v {} "
                    "in the remote cache",
                    group, i, x.k, x.v, y.k, y.v);
            }
        }
    }
    return {};
}

std::string stateTransferMismatch(TransferDescription const& local, TransferDescription const& remote)
{
    if (local.tp != remote.tp || local.rank != remote.rank)
    {
        return fmt::format("the local cache is rank {} of tp {} and the remote cache rank {} of tp {}; state slots "
                           "move only between the same rank of the same tensor-parallel size",
            local.rank, local.tp, remote.rank, remote.tp);
    }
    if (local.stateLayers.size() != remote.stateLayers.size())
    {
        return fmt::format("the local cache has {} state layers and the remote cache {}", local.stateLayers.size(),
            remote.stateLayers.size());
    }
    for (size_t l = 0; l < local.stateLayers.size(); ++l)
    {
        std::vector<TransferStateTensor> const& mine = local.stateLayers[l].tensors;
        std::vector<TransferStateTensor> const& theirs = remote.stateLayers[l].tensors;
        if (mine.size() != theirs.size())
        {
            return fmt::format("state layer {} has {} tensors in the local cache and {} in the remote cache", l,
                mine.size(), theirs.size());
        }
        for (size_t t = 0; t < mine.size(); ++t)
        {
            if (mine[t].dataType != theirs[t].dataType)
            {
                return fmt::format("state layer {} tensor {}'s dataType is {} in the local cache and {} in the "
                                   "remote cache",
                    l, t, dataTypeName(mine[t].dataType), dataTypeName(theirs[t].dataType));
            }
            if (mine[t].shape != theirs[t].shape)
            {
                return fmt::format("state layer {} tensor {}'s shape is [{}] in the local cache and [{}] in the "
                                   "remote cache",
                    l, t, fmt::join(mine[t].shape, ", "), fmt::join(theirs[t].shape, ", "));
            }
        }
    }
    return {};
}

} // namespace kvcache::rt
