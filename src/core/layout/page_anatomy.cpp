#include "core/layout/page_anatomy.h"

#include "core/layout/scale_support.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace kvcache::rt::detail
{
namespace
{

//! Returns the product of `factors`, or -1 when it leaves int64 (every factor is >= 0).
int64_t checkedProduct(std::initializer_list<int64_t> factors)
{
    int64_t product = 1;
    for (int64_t const factor : factors)
    {
        if (__builtin_mul_overflow(product, factor, &product))
        {
            return -1;
        }
    }
    return product;
}

} // namespace

PageAnatomy pageAnatomy(PageGeometry const& geometry)
{
    int64_t const elementBytes = dataTypeSize(geometry.dataType);
    bool const scaled = keepsScalePools(geometry.quantization);
    PageAnatomy anatomy;
    anatomy.entries.reserve(geometry.layers.size() * (scaled ? 2 : 1));
    // Data entries of every layer, then scale entries in the same order.
    for (PagePartKind const kind : {PagePartKind::kDATA, PagePartKind::kSCALES})
    {
        if (kind == PagePartKind::kSCALES && !scaled)
        {
            break;
        }
        for (size_t i = 0; i < geometry.layers.size(); ++i)
        {
            PageLayerGeometry const& layer = geometry.layers[i];
            int32_t const halves = layer.kind == KVLayerKind::kLATENT ? 1 : 2;
            // One head of one token of one half: its stored values (two per byte for NVFP4) or its page scales.
            int64_t const headBytes = kind == PagePartKind::kDATA
                ? (geometry.quantization == KVQuantization::kNVFP4 ? layer.headDim / 2 : layer.headDim) * elementBytes
                : scaleBytesPerTokenHead(geometry.quantization, layer.headDim);
            int64_t const halfBytes = checkedProduct({geometry.tokensPerPage, layer.numKVHeads, headBytes});
            int64_t const entryBytes = halfBytes < 0 ? -1 : checkedProduct({halves, halfBytes});
            int64_t end = 0;
            if (entryBytes < 0 || __builtin_add_overflow(anatomy.bytesPerPage, entryBytes, &end))
            {
                throw InvalidArgumentError(fmt::format("layers[{}] ({} halves x tokensPerPage {} x numKVHeads {} x {} "
                                                       "{} bytes per head (headDim {}, quantization {}), added to the "
                                                       "{} bytes before it) overflows 64-bit page sizes (limit {})",
                    i, halves, geometry.tokensPerPage, layer.numKVHeads, headBytes,
                    kind == PagePartKind::kDATA ? "data" : "scale", layer.headDim,
                    kvQuantizationName(geometry.quantization), anatomy.bytesPerPage,
                    std::numeric_limits<int64_t>::max()));
            }
            anatomy.entries.push_back(
                PageEntry{static_cast<int32_t>(i), kind, halves, halfBytes, anatomy.bytesPerPage});
            anatomy.bytesPerPage = end;
            anatomy.halves += halves;
            anatomy.largestHalfBytes = std::max(anatomy.largestHalfBytes, halfBytes);
        }
    }
    return anatomy;
}

PageAnatomy pageAnatomy(KVCacheLayout const& layout, int32_t group)
{
    return pageAnatomy(pageGeometry(layout, group));
}

StateSlotAnatomy stateSlotAnatomy(KVCacheLayout const& layout)
{
    // computeLayout already checked every sum here against int64 (stateBytesPerSlot).
    StateSlotAnatomy anatomy;
    for (size_t l = 0; l < layout.stateLayers.size(); ++l)
    {
        std::vector<StateTensorLayout> const& tensors = layout.stateLayers[l].tensors;
        for (size_t t = 0; t < tensors.size(); ++t)
        {
            anatomy.entries.push_back(StateSlotEntry{static_cast<int32_t>(l), static_cast<int32_t>(t),
                tensors[t].slotBytes, tensors[t].offsetBytes, anatomy.bytesPerSlot});
            anatomy.bytesPerSlot += tensors[t].slotBytes;
        }
    }
    return anatomy;
}

} // namespace kvcache::rt::detail
