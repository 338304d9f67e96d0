#include <fmt/format.h>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! Returns, for each model layer, whether it is a full-attention layer by full_attention_interval (Qwen3-Next and
//! Qwen3.5 without layer_types: layer i attends when (i + 1) is a multiple of the interval); nothing when absent.
std::optional<std::vector<bool>> intervalAttentionLayers(ConfigReader const& reader, int32_t numLayers)
{
    std::optional<int32_t> const interval = reader.optionalInteger("full_attention_interval", 1);
    if (!interval)
    {
        return std::nullopt;
    }
    std::vector<bool> attention(static_cast<size_t>(numLayers));
    for (int32_t i = 0; i < numLayers; ++i)
    {
        attention[static_cast<size_t>(i)] = (i + 1) % *interval == 0;
    }
    return attention;
}

//! Gated delta net layers (Qwen3-Next, Qwen3.5): every layer without attention. As vLLM's
//! gated_delta_net_state_shape and transformers' Qwen3NextGatedDeltaNet size them: a conv window over q, k and v,
//! {2 * Hk * Dk + Hv * Dv, kernel - 1}, and the recurrent state {Hv, Dk, Dv} (FLA's [N, H, K, V]).
std::optional<std::vector<StateLayerDescription>> gatedDeltaNetLayers(StateContext const& context)
{
    if (!context.types.isAny({"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}))
    {
        return std::nullopt;
    }
    ConfigReader const& reader = context.reader;
    int64_t const keyHeads = requiredInteger(reader, "linear_num_key_heads", 1, "gated delta net key heads");
    int64_t const keyDim = requiredInteger(reader, "linear_key_head_dim", 1, "gated delta net key head size");
    int64_t const valueHeads = requiredInteger(reader, "linear_num_value_heads", 1, "gated delta net value heads");
    int64_t const valueDim = requiredInteger(reader, "linear_value_head_dim", 1, "gated delta net value head size");
    int64_t const kernel = requiredInteger(reader, "linear_conv_kernel_dim", 2, "gated delta net conv kernel");
    int64_t const convDim = 2 * keyHeads * keyDim + valueHeads * valueDim;
    // Tensor parallelism splits the key and the value heads (vLLM's split of gated_delta_net_state_shape): the conv's
    // q, k and v channels each by their heads, the recurrent state by its value heads.
    rt::StateSplitSegment const keys = splitParts(keyHeads, keyDim, reader.name("linear_num_key_heads"));
    std::string const valueField = reader.name("linear_num_value_heads");
    std::vector<StateTensorDescription> const tensors = {
        splitTensor("conv", {convDim, kernel - 1}, false, {keys, keys, splitParts(valueHeads, valueDim, valueField)}),
        splitTensor("recurrent", {valueHeads, keyDim, valueDim}, true, {splitParts(valueHeads, 1, valueField)})};
    std::vector<StateLayerDescription> layers;
    for (int32_t const layer : layersWithoutAttention(context))
    {
        layers.push_back({layer, "gated_delta_net", tensors});
    }
    context.notes.push_back(fmt::format("gated delta net: conv [2 x {} x {} + {} x {}, {} - 1] = [{}, {}], recurrent "
                                        "[{}, {}, {}] ({}, {}, {}, {}, {})",
        keyHeads, keyDim, valueHeads, valueDim, kernel, convDim, kernel - 1, valueHeads, keyDim, valueDim,
        reader.name("linear_num_key_heads"), reader.name("linear_key_head_dim"), reader.name("linear_num_value_heads"),
        reader.name("linear_value_head_dim"), reader.name("linear_conv_kernel_dim")));
    return layers;
}

} // namespace

//! Qwen3-Next and Qwen3.5 (under text_config): gated delta net layers (linear_attention, a recurrent state) between
//! full-attention layers, said by layer_types or full_attention_interval. Qwen3-Next fields a config leaves out take
//! transformers' Qwen3NextConfig defaults.
ModelFamily qwenNextFamily()
{
    return {"Qwen3-Next", {"linear_attention"}, &intervalAttentionLayers, nullptr, nullptr,
        FieldDefaults{{"qwen3_next"}, "Qwen3NextConfig", {},
            {{"full_attention_interval", Json(4)}, {"linear_conv_kernel_dim", Json(4)},
                {"linear_key_head_dim", Json(128)}, {"linear_value_head_dim", Json(128)},
                {"linear_num_key_heads", Json(16)}, {"linear_num_value_heads", Json(32)}}},
        nullptr, &gatedDeltaNetLayers};
}

} // namespace kvcache::plan::families
