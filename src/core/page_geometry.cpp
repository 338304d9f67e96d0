#include "kvcache/core/page_geometry.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

namespace kvcache::rt
{

bool operator==(PageLayerGeometry const& a, PageLayerGeometry const& b) noexcept
{
    return a.kind == b.kind && a.numKVHeads == b.numKVHeads && a.headDim == b.headDim;
}

bool operator!=(PageLayerGeometry const& a, PageLayerGeometry const& b) noexcept
{
    return !(a == b);
}

bool operator==(PageGeometry const& a, PageGeometry const& b) noexcept
{
    return a.dataType == b.dataType && a.quantization == b.quantization && a.tokensPerPage == b.tokensPerPage
        && a.slidingWindow == b.slidingWindow && a.layers == b.layers && a.bytesPerPage == b.bytesPerPage;
}

bool operator!=(PageGeometry const& a, PageGeometry const& b) noexcept
{
    return !(a == b);
}

PageLayerGeometry pageLayerGeometry(KVLayerLayout const& layer) noexcept
{
    return PageLayerGeometry{layer.kind, layer.numKVHeads, layer.headDim};
}

PageGeometry pageGeometry(KVCacheLayout const& layout, int32_t group)
{
    if (group < 0 || static_cast<size_t>(group) >= layout.groups.size())
    {
        throw OutOfRangeError(
            fmt::format("pageGeometry: group is {}; groups are [0, {})", group, layout.groups.size()));
    }
    KVPageGroupLayout const& groupLayout = layout.groups[static_cast<size_t>(group)];
    PageGeometry geometry;
    geometry.dataType = layout.dataType;
    geometry.quantization = layout.quantization;
    geometry.tokensPerPage = layout.tokensPerPage;
    geometry.slidingWindow = groupLayout.slidingWindow;
    geometry.bytesPerPage = groupLayout.bytesPerPage;
    for (int32_t const layer : groupLayout.layers)
    {
        geometry.layers.push_back(pageLayerGeometry(layout.layers[static_cast<size_t>(layer)]));
    }
    return geometry;
}

} // namespace kvcache::rt
