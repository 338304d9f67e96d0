// The header of a page transfer: the geometry fingerprint, the hash of the host-held scales, and the comparison of the
// two sides' headers that decides whether pages may move.

#include "dist/transfer_header.h"

#include "core/scale_support.h"

#include "kvcache/core/page_geometry.h"
#include "kvcache/dist/page_transfer.h"

#include <fmt/format.h>

#include <cstring>

namespace kvcache::rt
{
namespace
{

constexpr uint64_t kFNV_OFFSET_BASIS = 14695981039346656037ull;
constexpr uint64_t kFNV_PRIME = 1099511628211ull;

//! Folds the four bytes of `value`, least significant first, into the FNV-1a `hash`.
void fnv(uint64_t& hash, uint32_t value) noexcept
{
    for (int shift = 0; shift < 32; shift += 8)
    {
        hash ^= (value >> shift) & 0xFFu;
        hash *= kFNV_PRIME;
    }
}

void fnv(uint64_t& hash, int32_t value) noexcept
{
    fnv(hash, static_cast<uint32_t>(value));
}

uint32_t bitsOf(float value) noexcept
{
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    return bits;
}

} // namespace

uint64_t geometryFingerprint(KVCacheLayout const& layout) noexcept
{
    uint64_t hash = kFNV_OFFSET_BASIS;
    // Version 2 added the quantization: pages of equal shapes under another quantization hold other values (FP8 per
    // tensor against plain FP8) or other scale bytes, so they must not move between the two.
    fnv(hash, 2);
    fnv(hash, static_cast<int32_t>(layout.layers.size()));
    fnv(hash, static_cast<int32_t>(layout.dataType));
    fnv(hash, static_cast<int32_t>(layout.elementBytes));
    fnv(hash, layout.tokensPerPage);
    fnv(hash, static_cast<int32_t>(layout.groups.size()));
    fnv(hash, static_cast<int32_t>(layout.quantization));
    for (KVLayerLayout const& layer : layout.layers)
    {
        // What a page holds of the layer (PageGeometry's layer fields), then where the layer's pages live.
        PageLayerGeometry const page = pageLayerGeometry(layer);
        fnv(hash, static_cast<int32_t>(page.kind));
        fnv(hash, page.numKVHeads);
        fnv(hash, page.headDim);
        fnv(hash, layer.slidingWindow);
        fnv(hash, layer.group);
    }
    return hash;
}

namespace detail
{

uint64_t hostScalesHash(KVCacheLayout const& layout, int32_t group, std::vector<LayerScales> const& scales) noexcept
{
    uint64_t hash = kFNV_OFFSET_BASIS;
    if (!keepsHostScales(layout.quantization))
    {
        return hash;
    }
    for (int32_t const layer : layout.groups[static_cast<size_t>(group)].layers)
    {
        if (static_cast<size_t>(layer) >= scales.size())
        {
            break; // a caller's bug; the peer's hash then differs rather than this reading past the end
        }
        LayerScales const& layerScales = scales[static_cast<size_t>(layer)];
        fnv(hash, bitsOf(layerScales.k));
        if (layout.layers[static_cast<size_t>(layer)].kind != KVLayerKind::kLATENT)
        {
            fnv(hash, bitsOf(layerScales.v));
        }
    }
    return hash;
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
    if (theirs.fingerprint != mine.fingerprint)
    {
        return fmt::format("geometry fingerprint {:#018x} here, {:#018x} at peer {}: the caches differ in layers, "
                           "kinds, heads, dims, dtype or tokensPerPage",
            mine.fingerprint, theirs.fingerprint, peer);
    }
    if (theirs.group != mine.group || theirs.count != mine.count)
    {
        return fmt::format("group {} and count {} here, group {} and count {} at peer {}", mine.group, mine.count,
            theirs.group, theirs.count, peer);
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
