#include <fmt/format.h>

#include <algorithm>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! Returns hybrid_override_pattern, one character a layer, after checking its length and characters.
std::string readPattern(ConfigReader const& reader, int32_t numLayers)
{
    Json const* pattern = reader.find("hybrid_override_pattern");
    std::string const field = reader.name("hybrid_override_pattern");
    if (pattern == nullptr)
    {
        throw reader.missing("hybrid_override_pattern",
            "one block kind a layer: M (Mamba2), * (attention), - (MLP), "
            "E (MoE)");
    }
    if (!pattern->is_string())
    {
        throw reader.bad(field, *pattern, "a string of one block kind a layer");
    }
    std::string const text = pattern->get<std::string>();
    if (text.size() != static_cast<size_t>(numLayers))
    {
        throw ModelConfigError(fmt::format("{}: field {} has {} characters; it must have one a layer, {} = {}",
            reader.source(), field, text.size(), reader.name("num_hidden_layers"), numLayers));
    }
    for (size_t i = 0; i < text.size(); ++i)
    {
        if (text[i] != 'M' && text[i] != '*' && text[i] != '-' && text[i] != 'E')
        {
            throw ModelConfigError(fmt::format("{}: field {}[{}] is '{}', a block kind kvcache-plan does not know; "
                                               "known: M (Mamba2), * (attention), - (MLP), E (MoE)",
                reader.source(), field, i, text[i]));
        }
    }
    return text;
}

//! Nemotron-H: the '*' layers of hybrid_override_pattern attend (full attention); the others keep no KV cache.
bool patternAttention(AttentionContext& context)
{
    if (!context.types.is("nemotron_h"))
    {
        return false;
    }
    std::string const pattern = readPattern(context.reader, context.numLayers);
    int32_t attending = 0;
    for (char const block : pattern)
    {
        bool const attends = block == '*';
        attending += attends ? 1 : 0;
        context.attention.kinds.push_back(attends ? std::optional{AttentionKind::kFULL} : std::nullopt);
    }
    context.notes.push_back(fmt::format("{}: {} attention layers (*), {} Mamba2 layers (M); MLP (-) and MoE (E) "
                                        "layers keep no cache",
        context.reader.name("hybrid_override_pattern"), attending, std::count(pattern.begin(), pattern.end(), 'M')));
    return true;
}

//! Nemotron-H's Mamba2 layers: the 'M' layers of hybrid_override_pattern, sized by mamba2State from mamba_num_heads,
//! mamba_head_dim, n_groups, ssm_state_size and conv_kernel (transformers' NemotronHMamba2Mixer; its intermediate
//! size is mamba_num_heads * mamba_head_dim, which is not always expand * hidden_size).
std::optional<std::vector<StateLayerDescription>> patternMamba2Layers(StateContext const& context)
{
    if (!context.types.is("nemotron_h"))
    {
        return std::nullopt;
    }
    ConfigReader const& reader = context.reader;
    std::string const pattern = readPattern(reader, context.numLayers);
    int64_t const numHeads = requiredInteger(reader, "mamba_num_heads", 1, "Mamba2 heads");
    int64_t const headDim = requiredInteger(reader, "mamba_head_dim", 1, "the Mamba2 head size");
    int64_t const numGroups = requiredInteger(reader, "n_groups", 1, "Mamba2 groups of B and C");
    int64_t const stateSize = requiredInteger(reader, "ssm_state_size", 1, "the SSM state size");
    int64_t const kernel = requiredInteger(reader, "conv_kernel", 2, "the conv kernel");
    std::string const headsField = reader.name("mamba_num_heads");
    std::string const groupsField = reader.name("n_groups");
    std::vector<StateLayerDescription> layers;
    for (int32_t i = 0; i < context.numLayers; ++i)
    {
        if (pattern[static_cast<size_t>(i)] == 'M')
        {
            layers.push_back(mamba2State(i, numHeads, headDim, numGroups, stateSize, kernel, headsField, groupsField));
        }
    }
    context.notes.push_back(fmt::format("Mamba2: conv [{} x {} + 2 x {} x {}, {} - 1], SSM [{}, {}, {}] ({}, {}, {}, "
                                        "{}, {})",
        numHeads, headDim, numGroups, stateSize, kernel, numHeads, headDim, stateSize, reader.name("mamba_num_heads"),
        reader.name("mamba_head_dim"), reader.name("n_groups"), reader.name("ssm_state_size"),
        reader.name("conv_kernel")));
    return layers;
}

} // namespace

//! Nemotron-H (and Nemotron Nano 2, Nemotron 3): hybrid_override_pattern says each layer's block, Mamba2 (M),
//! attention (*), MLP (-) or MoE (E). n_groups and conv_kernel are also read as mamba_n_groups and mamba_d_conv.
ModelFamily nemotronHFamily()
{
    return {"Nemotron-H", {}, nullptr, &patternAttention, nullptr,
        FieldDefaults{
            {"nemotron_h"}, "NemotronHConfig", {{"n_groups", "mamba_n_groups"}, {"conv_kernel", "mamba_d_conv"}}, {}},
        nullptr, &patternMamba2Layers, {"hybrid_override_pattern"}};
}

} // namespace kvcache::plan::families
