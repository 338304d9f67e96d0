#include <fmt/format.h>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! Returns a reader of linear_attn_config (Kimi Linear's KDA settings), or nothing when the config has none.
std::optional<ConfigReader> linearAttentionConfig(ConfigReader const& reader)
{
    Json const* object = reader.find("linear_attn_config");
    if (object == nullptr)
    {
        return std::nullopt;
    }
    if (!object->is_object())
    {
        throw reader.bad(reader.name("linear_attn_config"), *object, "an object");
    }
    return ConfigReader(*object, reader.source(), reader.name("linear_attn_config") + ".");
}

//! Returns, for each model layer, whether `field` of `linear` (1-indexed layer numbers) lists it.
std::vector<bool> oneIndexedLayers(ConfigReader const& linear, std::string_view field, int32_t numLayers)
{
    Json const* list = linear.find(field);
    if (list == nullptr)
    {
        throw linear.missing(field, "1-indexed layer numbers");
    }
    std::string const name = linear.name(field);
    if (!list->is_array())
    {
        throw linear.bad(name, *list, "a list of 1-indexed layer numbers");
    }
    std::vector<bool> listed(static_cast<size_t>(numLayers), false);
    for (size_t i = 0; i < list->size(); ++i)
    {
        int32_t const layer = linear.integer((*list)[i], fmt::format("{}[{}]", name, i), 1);
        if (layer > numLayers)
        {
            throw ModelConfigError(fmt::format("{}: field {}[{}] is {}; the model has {} layers, numbered from 1",
                linear.source(), name, i, layer, numLayers));
        }
        listed[static_cast<size_t>(layer - 1)] = true;
    }
    return listed;
}

//! Kimi Linear: the layers of linear_attn_config.full_attn_layers attend (MLA); nothing without linear_attn_config.
//! Every layer must be in exactly one of full_attn_layers and kda_layers.
std::optional<std::vector<bool>> kimiAttentionLayers(ConfigReader const& reader, int32_t numLayers)
{
    std::optional<ConfigReader> const linear = linearAttentionConfig(reader);
    if (!linear)
    {
        return std::nullopt;
    }
    std::vector<bool> const full = oneIndexedLayers(*linear, "full_attn_layers", numLayers);
    std::vector<bool> const kda = oneIndexedLayers(*linear, "kda_layers", numLayers);
    for (int32_t i = 0; i < numLayers; ++i)
    {
        if (full[static_cast<size_t>(i)] == kda[static_cast<size_t>(i)])
        {
            throw ModelConfigError(fmt::format("{}: layer {} (1-indexed) is in {} of {} and {}; each layer must be in "
                                               "exactly one",
                reader.source(), i + 1, full[static_cast<size_t>(i)] ? "both" : "neither",
                linear->name("full_attn_layers"), linear->name("kda_layers")));
        }
    }
    return full;
}

//! Kimi Linear's KDA layers (linear_attn_config.kda_layers). The model's KimiDeltaAttention keeps a short
//! convolution each for q, k and v over num_heads * head_dim channels ({num_heads * head_dim,
//! short_conv_kernel_size - 1} each; vLLM's kda_state_shape keeps the three as one [3 * num_heads * head_dim, ...],
//! the same bytes) and a recurrent state {num_heads, head_dim, head_dim} per sequence.
std::optional<std::vector<StateLayerDescription>> kdaLayers(StateContext const& context)
{
    if (!context.types.is("kimi_linear"))
    {
        return std::nullopt;
    }
    std::optional<ConfigReader> const linear = linearAttentionConfig(context.reader);
    if (!linear)
    {
        throw context.reader.missing("linear_attn_config", "Kimi Linear's KDA layers and sizes");
    }
    int64_t const numHeads = requiredInteger(*linear, "num_heads", 1, "KDA heads");
    int64_t const headDim = requiredInteger(*linear, "head_dim", 1, "the KDA head size");
    int64_t const kernel = requiredInteger(*linear, "short_conv_kernel_size", 2, "the KDA short convolution's taps");
    std::vector<bool> const kda = oneIndexedLayers(*linear, "kda_layers", context.numLayers);
    // Tensor parallelism splits the heads (vLLM's kda_state_shape): a conv's channels a head at a time.
    std::string const field = linear->name("num_heads");
    int64_t const channels = numHeads * headDim;
    std::vector<StateTensorDescription> const tensors = {
        splitTensor("q_conv", {channels, kernel - 1}, false, {splitParts(numHeads, headDim, field)}),
        splitTensor("k_conv", {channels, kernel - 1}, false, {splitParts(numHeads, headDim, field)}),
        splitTensor("v_conv", {channels, kernel - 1}, false, {splitParts(numHeads, headDim, field)}),
        splitTensor("recurrent", {numHeads, headDim, headDim}, true, {splitParts(numHeads, 1, field)})};
    std::vector<StateLayerDescription> layers;
    for (int32_t i = 0; i < context.numLayers; ++i)
    {
        if (kda[static_cast<size_t>(i)])
        {
            layers.push_back({i, "kda", tensors});
        }
    }
    context.notes.push_back(fmt::format("{}: 1-indexed layer numbers; KDA: q, k and v convs [{} x {}, {} - 1] each, "
                                        "recurrent [{}, {}, {}]",
        linear->name("kda_layers"), numHeads, headDim, kernel, numHeads, headDim, headDim));
    return layers;
}

} // namespace

//! Kimi Linear: KDA layers (a state per sequence) between MLA layers, listed 1-indexed in linear_attn_config.
ModelFamily kimiLinearFamily()
{
    return {"Kimi Linear", {}, &kimiAttentionLayers, nullptr, nullptr, {}, nullptr, &kdaLayers};
}

} // namespace kvcache::plan::families
