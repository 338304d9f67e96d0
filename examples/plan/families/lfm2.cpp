#include <fmt/format.h>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! Returns, for each model layer, whether it attends by full_attn_idxs (LFM2 without layer_types: 0-indexed attention
//! layers); nothing when absent. Throws ModelConfigError for an index outside the model.
std::optional<std::vector<bool>> listedAttentionLayers(ConfigReader const& reader, int32_t numLayers)
{
    Json const* indices = reader.find("full_attn_idxs");
    if (indices == nullptr)
    {
        return std::nullopt;
    }
    std::string const field = reader.name("full_attn_idxs");
    if (!indices->is_array())
    {
        throw reader.bad(field, *indices, "a list of layer indices");
    }
    std::vector<bool> attention(static_cast<size_t>(numLayers), false);
    for (size_t i = 0; i < indices->size(); ++i)
    {
        int32_t const layer = reader.integer((*indices)[i], fmt::format("{}[{}]", field, i), 0);
        if (layer >= numLayers)
        {
            throw ModelConfigError(fmt::format("{}: field {}[{}] is {}; the model has {} layers (0-indexed)",
                reader.source(), field, i, layer, numLayers));
        }
        attention[static_cast<size_t>(layer)] = true;
    }
    return attention;
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
    std::vector<StateLayerDescription> layers;
    for (int32_t const layer : layersWithoutAttention(context))
    {
        layers.push_back({layer, "short_conv", {{"conv", {hiddenSize, kernel - 1}, false}}});
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
