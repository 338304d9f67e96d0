// The header of a page transfer: the geometry fingerprint, the hash of the host-held scales, and the comparison of the
// two sides' headers that decides whether pages may move.

#include "dist/transfer_header.h"

#include "core/fnv1a.h"
#include "core/layout/scale_support.h"

#include "kvcache/core/page_geometry.h"
#include "kvcache/dist/page_transfer.h"

#include <fmt/format.h>

#include <cstring>

namespace kvcache::rt
{
namespace
{

uint32_t bitsOf(float value) noexcept
{
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    return bits;
}

} // namespace

uint64_t geometryFingerprint(KVCacheLayout const& layout) noexcept
{
    // Version 3: the groups' page geometries, the one identity every page check uses.
    detail::Fnv1a hash;
    hash.add(uint32_t{3});
    hash.add(static_cast<uint32_t>(layout.groups.size()));
    for (size_t group = 0; group < layout.groups.size(); ++group)
    {
        hash.add(pageGeometryFingerprint(pageGeometry(layout, static_cast<int32_t>(group))));
    }
    return hash.value();
}

namespace detail
{

uint64_t hostScalesHash(KVCacheLayout const& layout, int32_t group, std::vector<LayerScales> const& scales) noexcept
{
    Fnv1a hash;
    if (!keepsHostScales(layout.quantization))
    {
        return hash.value();
    }
    for (int32_t const layer : layout.groups[static_cast<size_t>(group)].layers)
    {
        if (static_cast<size_t>(layer) >= scales.size())
        {
            break; // a caller's bug; the peer's hash then differs rather than this reading past the end
        }
        LayerScales const& layerScales = scales[static_cast<size_t>(layer)];
        hash.add(bitsOf(layerScales.k));
        if (layout.layers[static_cast<size_t>(layer)].kind != KVLayerKind::kLATENT)
        {
            hash.add(bitsOf(layerScales.v));
        }
    }
    return hash.value();
}

std::string headerMismatch(TransferHeader const& mine, TransferHeader const& theirs, int32_t peer)
{
    if (theirs.magic != kTRANSFER_HEADER_MAGIC)
    {
        return fmt::format("the peer's header starts with {:#x}, not {:#x}: it is not a kvcache page transfer",
            theirs.magic, kTRANSFER_HEADER_MAGIC);
    }
    if (theirs.quantization != mine.quantization)
    {
        return fmt::format("KVCacheConfig.quantization is {} ({}) here, {} ({}) at peer {}: the pages hold other "
                           "values or scales",
            kvQuantizationName(static_cast<KVQuantization>(mine.quantization)), mine.quantization,
            kvQuantizationName(static_cast<KVQuantization>(theirs.quantization)), theirs.quantization, peer);
    }
    if (theirs.group != mine.group || theirs.count != mine.count)
    {
        return fmt::format("group {} and count {} here, group {} and count {} at peer {}", mine.group, mine.count,
            theirs.group, theirs.count, peer);
    }
    if (theirs.fingerprint != mine.fingerprint)
    {
        return fmt::format("page geometry fingerprint of group {} is {:#018x} here, {:#018x} at peer {}: the group's "
                           "pages differ in layers, kinds, heads, head sizes, data type, tokens per page, window or "
                           "bytes",
            mine.group, mine.fingerprint, theirs.fingerprint, peer);
    }
    if (theirs.path != mine.path)
    {
        return fmt::format("TransferOptions.path {} here, {} at peer {}", mine.path, theirs.path, peer);
    }
    if (theirs.scalesHash != mine.scalesHash)
    {
        return fmt::format("the host-held layer scales (KVCacheManager::layerScales) of group {} differ: hash {:#018x} "
                           "here, {:#018x} at peer {}; pages quantized under one side's scales would read back wrong "
                           "under the other's",
            mine.group, mine.scalesHash, theirs.scalesHash, peer);
    }
    return {};
}

} // namespace detail
} // namespace kvcache::rt
