#include "kvcache/core/page_geometry.h"

#include "core/fnv1a.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <string_view>

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
    // The fields pageGeometryDifference compares, without building its message.
    return a.dataType == b.dataType && a.quantization == b.quantization && a.tokensPerPage == b.tokensPerPage
        && a.slidingWindow == b.slidingWindow && a.layers == b.layers && a.bytesPerPage == b.bytesPerPage;
}

bool operator!=(PageGeometry const& a, PageGeometry const& b) noexcept
{
    return !(a == b);
}

namespace
{

//! Returns "" when `a == b`, else "<field> is <a> in <aName> and <b> in <bName>".
template <typename T>
std::string differs(std::string_view field, T const& a, T const& b, char const* aName, char const* bName)
{
    return a == b ? std::string() : fmt::format("{} is {} in {} and {} in {}", field, a, aName, b, bName);
}

} // namespace

std::string pageGeometryDifference(PageGeometry const& a, PageGeometry const& b, char const* aName, char const* bName)
{
    std::string difference = differs("quantization", std::string(kvQuantizationName(a.quantization)),
        std::string(kvQuantizationName(b.quantization)), aName, bName);
    if (difference.empty())
    {
        difference = differs(
            "dataType", std::string(dataTypeName(a.dataType)), std::string(dataTypeName(b.dataType)), aName, bName);
    }
    if (difference.empty())
    {
        difference = differs("tokensPerPage", a.tokensPerPage, b.tokensPerPage, aName, bName);
    }
    if (difference.empty())
    {
        difference = differs("slidingWindow", a.slidingWindow, b.slidingWindow, aName, bName);
    }
    if (difference.empty())
    {
        difference = differs("the number of layers", a.layers.size(), b.layers.size(), aName, bName);
    }
    for (size_t i = 0; i < a.layers.size() && difference.empty(); ++i)
    {
        PageLayerGeometry const& x = a.layers[i];
        PageLayerGeometry const& y = b.layers[i];
        difference = differs(fmt::format("layers[{}].kind", i), static_cast<int32_t>(x.kind),
            static_cast<int32_t>(y.kind), aName, bName);
        if (difference.empty())
        {
            difference = differs(fmt::format("layers[{}].numKVHeads", i), x.numKVHeads, y.numKVHeads, aName, bName);
        }
        if (difference.empty())
        {
            difference = differs(fmt::format("layers[{}].headDim", i), x.headDim, y.headDim, aName, bName);
        }
    }
    if (difference.empty())
    {
        difference = differs("bytesPerPage", a.bytesPerPage, b.bytesPerPage, aName, bName);
    }
    return difference;
}

uint64_t pageGeometryFingerprint(PageGeometry const& geometry) noexcept
{
    detail::Fnv1a hash;
    hash.add(static_cast<uint32_t>(geometry.dataType));
    hash.add(static_cast<uint32_t>(geometry.quantization));
    hash.add(static_cast<uint32_t>(geometry.tokensPerPage));
    hash.add(static_cast<uint32_t>(geometry.slidingWindow));
    hash.add(static_cast<uint32_t>(geometry.layers.size()));
    for (PageLayerGeometry const& layer : geometry.layers)
    {
        hash.add(static_cast<uint32_t>(layer.kind));
        hash.add(static_cast<uint32_t>(layer.numKVHeads));
        hash.add(static_cast<uint32_t>(layer.headDim));
    }
    hash.add(static_cast<uint64_t>(geometry.bytesPerPage));
    return hash.value();
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
