#include "tiers/host_tier/host_page_layout.h"

#include "memory/cache/scale_support.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvcache::rt::detail
{

HostPageLayout hostPageLayout(KVCacheLayout const& layout, int32_t group)
{
    if (group < 0 || static_cast<size_t>(group) >= layout.groups.size())
    {
        throw OutOfRangeError(
            fmt::format("hostPageLayout: group is {}; groups are [0, {})", group, layout.groups.size()));
    }
    std::vector<int32_t> const& layers = layout.groups[static_cast<size_t>(group)].layers;
    bool const scaled = keepsScalePools(layout.quantization);
    HostPageLayout hostPage;
    hostPage.entryOffsets.reserve(layers.size() * (scaled ? 2 : 1));
    // One pass over the data entries, then one over the scale entries: the device table's order.
    auto const addEntries = [&](bool scales)
    {
        for (int32_t const index : layers)
        {
            KVLayerLayout const& layer = layout.layers[static_cast<size_t>(index)];
            int64_t const pageBytes = scales ? layer.scalePageBytes : layer.pageBytes;
            hostPage.entryOffsets.push_back(hostPage.hostPageBytes);
            hostPage.hostPageBytes += layer.numHalves * pageBytes;
            hostPage.pageHalves += layer.numHalves;
            hostPage.largestPageBytes = std::max(hostPage.largestPageBytes, pageBytes);
        }
    };
    addEntries(false);
    if (scaled)
    {
        addEntries(true);
    }
    return hostPage;
}

} // namespace kvcache::rt::detail
