#pragma once

// The tests' own model of the layout, written from the design document's formulas without the library's code: pages
// are counted one at a time, element sizes are written out by hand, sizes are summed layer by layer.

#include "kvcache/core/data_type.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/memory/layer_ref.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>
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
    int64_t storedDim = 0;  //!< elements of one head as stored: D, or D / 2 bytes for NVFP4
    int64_t tokenElems = 0; //!< H * storedDim: one token of one half
    int64_t pageElems = 0;
    int64_t pageBytes = 0;
    int64_t halfElems = 0;
    int64_t halfBytes = 0;
    int64_t layerBytes = 0;
    int64_t numHalves = 2;     //!< 1 for a latent layer
    int64_t slidingWindow = 0; //!< 0 for full attention
    int64_t group = 0;
    int64_t pagesPerSequence = 0;
    int64_t slotTokens = 0; //!< tokens of one slot: pagesPerSequence * tokensPerPage
    int64_t numPages = 0;   //!< the group's
    //! Scale bytes of one page of one half: P * H * 4 (FP8 per token-head), P * H * D / 16 (NVFP4), else 0.
    int64_t scalePageBytes = 0;
    int64_t scaleHalfBytes = 0; //!< numPages * scalePageBytes: V scales start this far into the scale pool
    int64_t scaleBytes = 0;     //!< numHalves * scaleHalfBytes: the scale pool
};

//! One page group of the model: the layers of one window (0: full attention).
struct ModelGroup
{
    std::vector<int32_t> layers;
    int64_t slidingWindow = 0;
    int64_t pagesPerSequence = 0;
    int64_t minPages = 0;
    int64_t numPages = 0;
    int64_t bytesPerPage = 0;
};

//! Returns the most pages one sequence of up to `maxSequenceLength` tokens ever needs resident at once in a layer of
//! window `window` (0: full attention) when up to `stepTokens` tokens arrive in a step, found by trying every step
//! start: a step from token a reads back to a - (window - 1) and writes up to a + stepTokens - 1.
inline int64_t residentPagesBySimulation(
    int64_t window, int64_t stepTokens, int64_t maxSequenceLength, int64_t tokensPerPage)
{
    int64_t most = 0;
    for (int64_t a = 0; a < maxSequenceLength; ++a)
    {
        int64_t const first = window == 0 ? 0 : std::max<int64_t>(0, a - (window - 1));
        int64_t const last = std::min(maxSequenceLength - 1, a + stepTokens - 1);
        most = std::max(most, last / tokensPerPage - first / tokensPerPage + 1);
    }
    return most;
}

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
    rt::KVQuantization quantization = rt::KVQuantization::kNONE;
    std::vector<ModelLayer> layers;
    int64_t cacheBytes = 0;
    int64_t bytesPerPage = 0; //!< every half of one page id across all layers
    std::vector<ModelGroup> groups;

    //! Returns the byte offset of pool element (kv, page, token, head, dim) from the start of `layer`'s buffer.
    int64_t poolByteOffset(int32_t layer, int64_t kv, int64_t page, int64_t token, int64_t head, int64_t dim) const
    {
        ModelLayer const& m = layers.at(static_cast<size_t>(layer));
        int64_t const element = kv * m.halfElems + page * m.pageElems + token * m.tokenElems + head * m.storedDim + dim;
        return element * elementBytes;
    }
    //! Returns the LayerRef of `layer` for a buffer at `base`, filled from the model: what KVCacheManager::layerRef
    //! should return when the layer's buffer starts there and, with scale pools, its scale pool at `scaleBase`.
    rt::LayerRef layerRef(int32_t layer, void* base, void* scaleBase = nullptr) const
    {
        ModelLayer const& m = layers.at(static_cast<size_t>(layer));
        rt::LayerRef ref;
        ref.kPool = base;
        ref.vPool = m.numHalves == 2 ? static_cast<char*>(base) + m.halfBytes : nullptr;
        ref.pageStride = m.pageElems;
        ref.tokenStride = m.tokenElems;
        ref.headStride = m.storedDim;
        ref.elementBytes = static_cast<int32_t>(elementBytes);
        ref.numPages = static_cast<int32_t>(m.numPages);
        ref.tokensPerPage = static_cast<int32_t>(tokensPerPage);
        ref.numKVHeads = static_cast<int32_t>(m.numKVHeads);
        ref.headDim = static_cast<int32_t>(m.headDim);
        if (m.scalePageBytes > 0)
        {
            // Float32 scales, one a head, for FP8 per token-head; FP8 E4M3 scales, one a 16 values, for NVFP4.
            bool const tokenHead = quantization == rt::KVQuantization::kFP8_PER_TOKEN_HEAD;
            ref.kScalePool = scaleBase;
            ref.vScalePool = m.numHalves == 2 ? static_cast<char*>(scaleBase) + m.scaleHalfBytes : nullptr;
            ref.scaleElementBytes = tokenHead ? 4 : 1;
            ref.scalesPerHead = tokenHead ? 1 : static_cast<int32_t>(m.headDim / 16);
        }
        return ref;
    }
    //! Returns the page that holds position `position` of slot `slot` in the slot view of a group-0 layer.
    int64_t slotPage(int64_t slot, int64_t position) const
    {
        return slot * pagesPerSlot + position / tokensPerPage;
    }
    //! Returns the page and in-page token that hold token `token` of slot `slot` in `layer`'s slot view: a ring of
    //! slotTokens tokens for a windowed layer.
    std::pair<int64_t, int64_t> slotPosition(int32_t layer, int64_t slot, int64_t token) const
    {
        ModelLayer const& m = layers.at(static_cast<size_t>(layer));
        int64_t const ring = token % m.slotTokens;
        return {slot * m.pagesPerSequence + ring / tokensPerPage, ring % tokensPerPage};
    }
};

//! Models `config` (which must hold a KV cache type and, with several windows, per-group page counts or none).
inline LayoutModel modelLayout(rt::KVCacheConfig const& config)
{
    LayoutModel model;
    model.maxBatchSize = config.maxBatchSize;
    model.tokensPerPage = config.tokensPerPage;
    model.elementBytes = elementBytesByHand(config.kvCacheType);
    model.quantization = config.quantization;
    // Add pages to a slot until they hold the longest sequence.
    int64_t fullPages = 0;
    while (fullPages * model.tokensPerPage < config.maxSequenceLength)
    {
        ++fullPages;
    }
    int64_t const stepTokens = config.maxTokensPerStep == 0 ? config.maxSequenceLength : config.maxTokensPerStep;
    // Group 0 holds full attention (window 0), then one group per window, smallest first.
    std::vector<int64_t> windows;
    for (rt::KVLayerConfig const& layer : config.layerConfigs)
    {
        if (std::find(windows.begin(), windows.end(), layer.slidingWindow) == windows.end())
        {
            windows.push_back(layer.slidingWindow);
        }
    }
    std::sort(windows.begin(), windows.end());
    for (size_t g = 0; g < windows.size(); ++g)
    {
        ModelGroup group;
        group.slidingWindow = windows[g];
        group.pagesPerSequence = fullPages;
        if (windows[g] > 0)
        {
            int64_t const span = windows[g] - 1 + stepTokens;
            group.pagesPerSequence = std::min(fullPages, (span + model.tokensPerPage - 1) / model.tokensPerPage + 1);
        }
        for (int32_t slot = 0; slot < config.maxBatchSize; ++slot)
        {
            group.minPages += group.pagesPerSequence;
        }
        int64_t const asked = config.numPagesPerGroup.empty() ? config.numPages : config.numPagesPerGroup[g];
        group.numPages = asked == 0 ? group.minPages : asked;
        model.groups.push_back(group);
    }
    model.pagesPerSlot = model.groups.empty() ? fullPages : model.groups[0].pagesPerSequence;
    model.minPages = model.groups.empty() ? config.maxBatchSize * fullPages : model.groups[0].minPages;
    model.numPages =
        model.groups.empty() ? (config.numPages == 0 ? model.minPages : config.numPages) : model.groups[0].numPages;
    model.capPadded = model.groups.empty() ? fullPages * model.tokensPerPage : 0;
    for (size_t i = 0; i < config.layerConfigs.size(); ++i)
    {
        rt::KVLayerConfig const& layer = config.layerConfigs[i];
        ModelLayer m;
        m.numKVHeads = layer.numKVHeads;
        m.headDim = layer.headDim;
        m.numHalves = layer.kind == rt::KVLayerKind::kLATENT ? 1 : 2;
        m.slidingWindow = layer.slidingWindow;
        m.group = std::find(windows.begin(), windows.end(), layer.slidingWindow) - windows.begin();
        ModelGroup& group = model.groups[static_cast<size_t>(m.group)];
        m.pagesPerSequence = group.pagesPerSequence;
        m.slotTokens = m.pagesPerSequence * model.tokensPerPage;
        m.numPages = group.numPages;
        m.storedDim = config.quantization == rt::KVQuantization::kNVFP4 ? m.headDim / 2 : m.headDim;
        m.tokenElems = m.numKVHeads * m.storedDim;
        m.pageElems = model.tokensPerPage * m.tokenElems;
        m.pageBytes = m.pageElems * model.elementBytes;
        m.halfElems = m.numPages * m.pageElems;
        m.halfBytes = m.halfElems * model.elementBytes;
        m.layerBytes = m.numHalves * m.halfBytes;
        int64_t const tokenHeads = model.tokensPerPage * m.numKVHeads;
        m.scalePageBytes = config.quantization == rt::KVQuantization::kFP8_PER_TOKEN_HEAD ? tokenHeads * 4
            : config.quantization == rt::KVQuantization::kNVFP4 ? tokenHeads * (m.headDim / 16)
                                                                : 0;
        m.scaleHalfBytes = m.numPages * m.scalePageBytes;
        m.scaleBytes = m.numHalves * m.scaleHalfBytes;
        model.capPadded = std::max(model.capPadded, m.slotTokens);
        model.cacheBytes += m.layerBytes + m.scaleBytes;
        model.bytesPerPage += m.numHalves * (m.pageBytes + m.scalePageBytes);
        group.bytesPerPage += m.numHalves * (m.pageBytes + m.scalePageBytes);
        group.layers.push_back(static_cast<int32_t>(i));
        model.layers.push_back(m);
    }
    return model;
}

} // namespace kvcache::test
