#pragma once

// The tests' own model of the layout, written from the design document's formulas without the library's code: pages
// are counted one at a time, element sizes are written out by hand, sizes are summed layer by layer.

#include "kvcache/data_type.h"
#include "kvcache/kv_cache_config.h"
#include "kvcache/layer_ref.h"

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace kvcache::test
{

//! Returns the element size of a KV cache type, written out by hand; throws std::invalid_argument for another type.
inline int64_t elementBytesByHand(rt::DataType type)
{
    switch (type)
    {
    case rt::DataType::kFLOAT: return 4;
    case rt::DataType::kHALF:
    case rt::DataType::kBF16: return 2;
    case rt::DataType::kFP8_E4M3:
    case rt::DataType::kFP8_E5M2:
    case rt::DataType::kINT8:
    case rt::DataType::kUINT8: return 1;
    case rt::DataType::kINT32:
    case rt::DataType::kINT64: break;
    }
    throw std::invalid_argument("not a KV cache type");
}

//! One layer of the model. Element counts are per half (K or V).
struct ModelLayer
{
    int64_t numKVHeads = 0;
    int64_t headDim = 0;
    int64_t tokenElems = 0; //!< H * D: one token of one half
    int64_t pageElems = 0;
    int64_t pageBytes = 0;
    int64_t halfElems = 0;
    int64_t halfBytes = 0;
    int64_t layerBytes = 0;
};

//! The model of a whole cache.
struct LayoutModel
{
    int64_t maxBatchSize = 0;
    int64_t tokensPerPage = 0;
    int64_t pagesPerSlot = 0;
    int64_t capPadded = 0;
    int64_t minPages = 0;
    int64_t numPages = 0;
    int64_t elementBytes = 0;
    std::vector<ModelLayer> layers;
    int64_t cacheBytes = 0;
    int64_t bytesPerPage = 0; //!< K and V of one page id across all layers

    //! Returns the byte offset of pool element (kv, page, token, head, dim) from the start of `layer`'s buffer.
    int64_t poolByteOffset(int32_t layer, int64_t kv, int64_t page, int64_t token, int64_t head, int64_t dim) const
    {
        ModelLayer const& m = layers.at(static_cast<size_t>(layer));
        int64_t const element = kv * m.halfElems + page * m.pageElems + token * m.tokenElems + head * m.headDim + dim;
        return element * elementBytes;
    }
    //! Returns the LayerRef of `layer` for a buffer at `base`, filled from the model: what KVCacheManager::layerRef
    //! should return when the layer's buffer starts there.
    rt::LayerRef layerRef(int32_t layer, void* base) const
    {
        ModelLayer const& m = layers.at(static_cast<size_t>(layer));
        rt::LayerRef ref;
        ref.kPool = base;
        ref.vPool = static_cast<char*>(base) + m.halfBytes;
        ref.pageStride = m.pageElems;
        ref.tokenStride = m.tokenElems;
        ref.headStride = m.headDim;
        ref.elementBytes = static_cast<int32_t>(elementBytes);
        ref.numPages = static_cast<int32_t>(numPages);
        ref.tokensPerPage = static_cast<int32_t>(tokensPerPage);
        ref.numKVHeads = static_cast<int32_t>(m.numKVHeads);
        ref.headDim = static_cast<int32_t>(m.headDim);
        return ref;
    }
    //! Returns the page that holds position `position` of slot `slot` in the slot view.
    int64_t slotPage(int64_t slot, int64_t position) const
    {
        return slot * pagesPerSlot + position / tokensPerPage;
    }
};

//! Models `config` (which must hold a KV cache type).
inline LayoutModel modelLayout(rt::KVCacheConfig const& config)
{
    LayoutModel model;
    model.maxBatchSize = config.maxBatchSize;
    model.tokensPerPage = config.tokensPerPage;
    // Add pages to a slot until they hold the longest sequence.
    while (model.pagesPerSlot * model.tokensPerPage < config.maxSequenceLength)
    {
        ++model.pagesPerSlot;
    }
    model.capPadded = model.pagesPerSlot * model.tokensPerPage;
    for (int32_t slot = 0; slot < config.maxBatchSize; ++slot)
    {
        model.minPages += model.pagesPerSlot;
    }
    model.numPages = config.numPages == 0 ? model.minPages : config.numPages;
    model.elementBytes = elementBytesByHand(config.kvCacheType);
    for (rt::KVLayerConfig const& layer : config.layerConfigs)
    {
        ModelLayer m;
        m.numKVHeads = layer.numKVHeads;
        m.headDim = layer.headDim;
        m.tokenElems = m.numKVHeads * m.headDim;
        m.pageElems = model.tokensPerPage * m.tokenElems;
        m.pageBytes = m.pageElems * model.elementBytes;
        m.halfElems = model.numPages * m.pageElems;
        m.halfBytes = m.halfElems * model.elementBytes;
        m.layerBytes = 2 * m.halfBytes;
        model.cacheBytes += m.layerBytes;
        model.bytesPerPage += 2 * m.pageBytes;
        model.layers.push_back(m);
    }
    return model;
}

} // namespace kvcache::test
