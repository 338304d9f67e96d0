#include <fmt/format.h>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! LFM2 without layer_types: the attention layers full_attn_idxs lists (0-indexed).
std::optional<std::vector<bool>> listedAttentionLayers(ConfigReader const& reader, int32_t numLayers)
{
    return listedLayers(reader, "full_attn_idxs", numLayers);
}

//! LFM2's short convolution layers: every layer without attention. As vLLM's short_conv_state_shape sizes them (and
//! transformers' Lfm2ShortConv, a depthwise conv of conv_L_cache taps over hidden_size channels): conv {hidden_size,
//! conv_L_cache - 1}.
std::optional<std::vector<StateLayerDescription>> shortConvLayers(StateContext const& context)
{
    if (!context.types.isAny({"lfm2", "lfm2_moe"}))
    {
        return std::nullopt;
    }
    ConfigReader const& reader = context.reader;
    int64_t const hiddenSize = requiredInteger(reader, "hidden_size", 1, "the short convolution's channels");
    int64_t const kernel = requiredInteger(reader, "conv_L_cache", 2, "the short convolution's taps");
    // Tensor parallelism splits the channels (vLLM's short_conv_state_shape).
    std::vector<StateTensorDescription> const tensors = {splitTensor(
        "conv", {hiddenSize, kernel - 1}, false, {splitParts(hiddenSize, 1, reader.name("hidden_size"))})};
    std::vector<StateLayerDescription> layers;
    for (int32_t const layer : layersWithoutAttention(context))
    {
        layers.push_back({layer, "short_conv", tensors});
    }
    context.notes.push_back(fmt::format("short convolution: conv [{} {}, {} {} - 1]", reader.name("hidden_size"),
        hiddenSize, reader.name("conv_L_cache"), kernel));
    return layers;
}

} // namespace

//! LFM2: short convolution blocks (conv, a conv state, no KV cache) between attention layers, said by layer_types or
//! full_attn_idxs.
ModelFamily lfm2Family()
{
    return {"LFM2", {"conv"}, &listedAttentionLayers, nullptr, nullptr, {}, nullptr, &shortConvLayers};
}

} // namespace kvcache::plan::families
