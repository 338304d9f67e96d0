#include "memory/cache/attention_arguments.h"

#include "core/layout/scale_support.h"

namespace kvcache::rt::detail
{

namespace
{

//! Returns one half of layer `layer`'s scale pool at `at`: with `halves` > 0 as its first dimension, else without.
Tensor scaleView(KVCacheLayout const& layout, KVLayerLayout const& layer, void* at, int64_t halves)
{
    auto const tokensPerPage = int64_t{layout.tokensPerPage};
    if (layout.quantization == KVQuantization::kFP8_PER_TOKEN_HEAD)
    {
        Coords const shape = halves > 0 ? Coords{halves, layer.numPages, tokensPerPage, layer.numKVHeads}
                                        : Coords{layer.numPages, tokensPerPage, layer.numKVHeads};
        return Tensor(at, shape, DataType::kFLOAT, DeviceType::kGPU);
    }
    int64_t const blocks = layer.scalePageBytes / (tokensPerPage * layer.numKVHeads);
    Coords const shape = halves > 0 ? Coords{halves, layer.numPages, tokensPerPage, layer.numKVHeads, blocks}
                                    : Coords{layer.numPages, tokensPerPage, layer.numKVHeads, blocks};
    return Tensor(at, shape, DataType::kFP8_E4M3, DeviceType::kGPU);
}

} // namespace

Tensor scalePoolTensor(KVCacheLayout const& layout, int32_t layerIdx, void* scales)
{
    KVLayerLayout const& layer = layout.layers[static_cast<size_t>(layerIdx)];
    return scaleView(layout, layer, scales, layer.numHalves);
}

AttentionArguments attentionArgumentsOf(
    KVCacheLayout const& layout, int32_t layerIdx, LayerScales hostScales, void* scales)
{
    KVLayerLayout const& layer = layout.layers[static_cast<size_t>(layerIdx)];
    bool const hasV = layer.kind != KVLayerKind::kLATENT;
    AttentionArguments arguments;
    arguments.quantization = layout.quantization;
    if (keepsHostScales(layout.quantization))
    {
        arguments.kScale = hostScales.k;
        arguments.vScale = hasV ? hostScales.v : 1.0F;
    }
    if (keepsScalePools(layout.quantization))
    {
        arguments.kScalePool = scaleView(layout, layer, scales, 0);
        if (hasV)
        {
            // V's scales start one half's scale bytes after K's.
            arguments.vScalePool = scaleView(
                layout, layer, static_cast<char*>(scales) + int64_t{layer.numPages} * layer.scalePageBytes, 0);
        }
        arguments.tokenHeadScales = layout.quantization == KVQuantization::kFP8_PER_TOKEN_HEAD;
        arguments.tensorCoreDecode = true;
    }
    return arguments;
}

} // namespace kvcache::rt::detail
