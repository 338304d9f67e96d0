#include <fmt/format.h>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! Bamba: the attention layers attn_layer_indices lists (0-indexed).
std::optional<std::vector<bool>> indexedAttentionLayers(ConfigReader const& reader, int32_t numLayers)
{
    return listedLayers(reader, "attn_layer_indices", numLayers);
}

//! The Mamba2 layers of Bamba, Granite-4.0-H (granitemoehybrid) and Falcon-H1, which share the mamba_* field names.
//! Bamba and Granite: every layer without attention, d_inner = mamba_expand * hidden_size. Falcon-H1 runs attention
//! and Mamba2 side by side in every layer, d_inner = mamba_d_ssm (or mamba_expand * hidden_size). mamba_d_head
//! "auto" is d_inner / mamba_n_heads, as BambaConfig reads it. The shapes are mamba2State's; d_inner must be
//! mamba_n_heads * mamba_d_head, or the config is inconsistent.
std::optional<std::vector<StateLayerDescription>> mamba2Layers(StateContext const& context)
{
    bool const parallel = context.types.is("falcon_h1");
    if (!parallel && !context.types.isAny({"bamba", "granitemoehybrid"}))
    {
        return std::nullopt;
    }
    ConfigReader const& reader = context.reader;
    int64_t const numHeads = requiredInteger(reader, "mamba_n_heads", 1, "Mamba2 heads");
    int64_t const numGroups = requiredInteger(reader, "mamba_n_groups", 1, "Mamba2 groups of B and C");
    int64_t const stateSize = requiredInteger(reader, "mamba_d_state", 1, "the SSM state size");
    int64_t const kernel = requiredInteger(reader, "mamba_d_conv", 2, "the conv kernel");
    std::string innerText;
    int64_t inner = 0;
    if (std::optional<int32_t> const ssm = parallel ? reader.optionalInteger("mamba_d_ssm", 1) : std::nullopt)
    {
        inner = *ssm;
        innerText = fmt::format("{} {}", reader.name("mamba_d_ssm"), inner);
    }
    else
    {
        int64_t const expand = requiredInteger(reader, "mamba_expand", 1, "d_inner = mamba_expand * hidden_size");
        int64_t const hiddenSize = requiredInteger(reader, "hidden_size", 1, "d_inner = mamba_expand * hidden_size");
        inner = expand * hiddenSize;
        innerText =
            fmt::format("{} {} x {} {}", reader.name("mamba_expand"), expand, reader.name("hidden_size"), hiddenSize);
    }
    int64_t headDim = 0;
    Json const* headField = reader.find("mamba_d_head");
    if (headField != nullptr && headField->is_string() && headField->get<std::string>() == "auto")
    {
        headDim = inner / numHeads;
    }
    else
    {
        headDim = requiredInteger(reader, "mamba_d_head", 1, "the Mamba2 head size");
    }
    if (numHeads * headDim != inner)
    {
        throw ModelConfigError(fmt::format("{}: {} {} x {} {} = {} is not d_inner = {} = {}; the Mamba2 sizes are "
                                           "inconsistent",
            reader.source(), reader.name("mamba_n_heads"), numHeads, reader.name("mamba_d_head"), headDim,
            numHeads * headDim, innerText, inner));
    }
    std::vector<int32_t> stateful;
    for (int32_t i = 0; i < context.numLayers; ++i)
    {
        if (parallel || !context.kinds[static_cast<size_t>(i)])
        {
            stateful.push_back(i);
        }
    }
    std::string const headsField = reader.name("mamba_n_heads");
    std::string const groupsField = reader.name("mamba_n_groups");
    std::vector<StateLayerDescription> layers;
    for (int32_t const layer : stateful)
    {
        layers.push_back(mamba2State(layer, numHeads, headDim, numGroups, stateSize, kernel, headsField, groupsField));
    }
    context.notes.push_back(fmt::format("Mamba2{}: d_inner {} = {} heads x {}; conv [{} + 2 x {} x {}, {} - 1], SSM "
                                        "[{}, {}, {}]",
        parallel ? " beside attention in every layer" : "", innerText, numHeads, headDim, inner, numGroups, stateSize,
        kernel, numHeads, headDim, stateSize));
    return layers;
}

} // namespace

//! Bamba, Granite-4.0-H and Falcon-H1: Mamba2 layers with the mamba_* field names. Bamba lists its attention layers in
//! attn_layer_indices, Granite-4.0-H in layer_types (mamba, attention); every Falcon-H1 layer attends.
ModelFamily mamba2Family()
{
    return {"Mamba2", {}, &indexedAttentionLayers, nullptr, nullptr, {}, nullptr, &mamba2Layers};
}

} // namespace kvcache::plan::families
