#include <fmt/format.h>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! Returns, for each model layer, whether it keeps a KV cache, from attn_layer_period and attn_layer_offset; nothing
//! when they are absent.
std::optional<std::vector<bool>> periodicAttentionLayers(ConfigReader const& reader, int32_t numLayers)
{
    std::optional<int32_t> const period = reader.optionalInteger("attn_layer_period", 1);
    if (!period)
    {
        return std::nullopt;
    }
    std::optional<int32_t> const offset = reader.optionalInteger("attn_layer_offset", 0);
    if (!offset)
    {
        throw reader.missing("attn_layer_offset", "needed with attn_layer_period");
    }
    if (*offset >= *period)
    {
        throw ModelConfigError(fmt::format("{}: {} = {} must be less than {} = {}", reader.source(),
            reader.name("attn_layer_offset"), *offset, reader.name("attn_layer_period"), *period));
    }
    std::vector<bool> attention(static_cast<size_t>(numLayers));
    for (int32_t i = 0; i < numLayers; ++i)
    {
        attention[static_cast<size_t>(i)] = i % *period == *offset;
    }
    return attention;
}

//! Jamba's Mamba (v1) layers: every layer without attention. As transformers' JambaMambaMixer and vLLM's
//! mamba1_state_shape size them, with d_inner = mamba_expand * hidden_size: conv {d_inner, mamba_d_conv - 1} and SSM
//! {d_inner, mamba_d_state}.
std::optional<std::vector<StateLayerDescription>> mambaLayers(StateContext const& context)
{
    if (!context.types.is("jamba"))
    {
        return std::nullopt;
    }
    ConfigReader const& reader = context.reader;
    int64_t const hiddenSize = requiredInteger(reader, "hidden_size", 1, "d_inner = mamba_expand * hidden_size");
    int64_t const expand = requiredInteger(reader, "mamba_expand", 1, "d_inner = mamba_expand * hidden_size");
    int64_t const stateSize = requiredInteger(reader, "mamba_d_state", 1, "the SSM state size");
    int64_t const kernel = requiredInteger(reader, "mamba_d_conv", 2, "the conv kernel");
    int64_t const inner = expand * hiddenSize;
    // Tensor parallelism splits d_inner (vLLM's mamba1_state_shape).
    rt::StateSplitSegment const channels = splitParts(
        inner, 1, fmt::format("d_inner ({} x {})", reader.name("mamba_expand"), reader.name("hidden_size")));
    std::vector<StateTensorDescription> const tensors = {splitTensor("conv", {inner, kernel - 1}, false, {channels}),
        splitTensor("ssm", {inner, stateSize}, true, {channels})};
    std::vector<StateLayerDescription> layers;
    for (int32_t const layer : layersWithoutAttention(context))
    {
        layers.push_back({layer, "mamba", tensors});
    }
    context.notes.push_back(
        fmt::format("Mamba: d_inner = {} {} x {} {} = {}; conv [{}, {} - 1], SSM [{}, {}]", reader.name("mamba_expand"),
            expand, reader.name("hidden_size"), hiddenSize, inner, inner, kernel, inner, stateSize));
    return layers;
}

} // namespace

//! Jamba: one attention layer every attn_layer_period layers (at attn_layer_offset), Mamba blocks (mamba, mamba2 in
//! layer_types: a recurrent state) in between. Mamba fields a config leaves out take transformers' JambaConfig
//! defaults.
ModelFamily jambaFamily()
{
    return {"Jamba", {"mamba", "mamba2"}, &periodicAttentionLayers, nullptr, nullptr,
        FieldDefaults{{"jamba"}, "JambaConfig", {},
            {{"mamba_d_state", Json(16)}, {"mamba_d_conv", Json(4)}, {"mamba_expand", Json(2)}}},
        nullptr, &mambaLayers};
}

} // namespace kvcache::plan::families
