#pragma once

// The page-sized pieces of one page id as the cache lays them out (addresses from LayerRef, sizes from the layout):
// each layer's data page of each half, then, for a quantization with scale pools, each layer's scale page of each
// half, in the order a host page holds them (docs/layout.md, "Host pages"). The benchmarks move these one at a time
// for their per-page baselines, and read them back for their checks. No GoogleTest: benchmarks use it.

#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/layer_ref.h"

#include <cstdint>
#include <vector>

namespace kvcache::test
{

//! What a page segment holds: a half's data page or its scale page.
enum class SegmentPart : int32_t
{
    kK,
    kV,
    kKScales,
    kVScales,
};

//! Returns "K", "V", "K scales" or "V scales", for messages.
inline char const* segmentPartName(SegmentPart part) noexcept
{
    switch (part)
    {
    case SegmentPart::kK: return "K";
    case SegmentPart::kV: return "V";
    case SegmentPart::kKScales: return "K scales";
    case SegmentPart::kVScales: return "V scales";
    }
    return "unknown";
}

//! One contiguous page-sized piece of a page id: one layer's data page or scale page of one half.
struct PageSegment
{
    char* address;
    int64_t bytes;
    int32_t layer;
    SegmentPart part;
};

//! Returns the segments of page `page` of page group `group` in `cache`: every layer's K data page then its V data page
//! (a latent layer: K only), layer by layer; then, when the cache keeps scale pools (kFP8_PER_TOKEN_HEAD, kNVFP4),
//! every layer's K scale page then V scale page in the same order. Their bytes add up to the group's bytesPerPage,
//! and laid end to end they are what a host page of the group holds for `page`. Does not check its arguments.
inline std::vector<PageSegment> pageSegments(rt::KVCacheManager const& cache, int32_t group, int32_t page)
{
    std::vector<PageSegment> segments;
    std::vector<int32_t> const& layers = cache.group(group).layers;
    for (int32_t const layer : layers)
    {
        rt::LayerRef const ref = cache.layerRef(layer);
        int64_t const bytes = ref.pageStride * ref.elementBytes;
        segments.push_back({static_cast<char*>(ref.kAddress(page, 0, 0)), bytes, layer, SegmentPart::kK});
        if (ref.vPool != nullptr)
        {
            segments.push_back({static_cast<char*>(ref.vAddress(page, 0, 0)), bytes, layer, SegmentPart::kV});
        }
    }
    for (int32_t const layer : layers)
    {
        rt::LayerRef const ref = cache.layerRef(layer);
        if (ref.kScalePool == nullptr)
        {
            continue;
        }
        int64_t const bytes = cache.layout().layers[static_cast<size_t>(layer)].scalePageBytes;
        int64_t const offset = ref.scaleOffset(page, 0, 0) * ref.scaleElementBytes;
        segments.push_back({static_cast<char*>(ref.kScalePool) + offset, bytes, layer, SegmentPart::kKScales});
        if (ref.vScalePool != nullptr)
        {
            segments.push_back({static_cast<char*>(ref.vScalePool) + offset, bytes, layer, SegmentPart::kVScales});
        }
    }
    return segments;
}

} // namespace kvcache::test
