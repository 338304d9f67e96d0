#include <fmt/format.h>

#include <utility>

#include "families/family.h"

namespace kvcache::plan::families
{

void requireWindow(AttentionContext const& context, std::string_view why)
{
    // With use_sliding_window false no layer slides, so a sliding layer needs no window.
    if (context.attention.slidingWindow == 0 && context.useSlidingWindow != false)
    {
        throw context.reader.missing("sliding_window", why);
    }
}

std::vector<bool> attentionLayers(ConfigReader const& reader, int32_t numLayers)
{
    for (ModelFamily const& family : modelFamilies())
    {
        if (family.attentionLayers == nullptr)
        {
            continue;
        }
        if (std::optional<std::vector<bool>> layers = family.attentionLayers(reader, numLayers))
        {
            return *std::move(layers);
        }
    }
    return std::vector<bool>(static_cast<size_t>(numLayers), true);
}

void applyWindowPattern(AttentionContext& context, int32_t period, std::string const& source)
{
    requireWindow(context, fmt::format("needed by sliding_window_pattern {}", period));
    fillKinds(
        context, [&](int32_t i) { return (i + 1) % period == 0 ? AttentionKind::kFULL : AttentionKind::kSLIDING; });
    context.notes.push_back(period == 1
            ? fmt::format("{}: every layer is a full-attention layer", source)
            : fmt::format("{}: every {} layer ({}, {}, ...) is full, the others slide over {}", source, ordinal(period),
                period - 1, 2 * period - 1, windowText(context)));
}

std::string windowText(AttentionContext const& context)
{
    return fmt::format("{} {}", context.reader.name("sliding_window"), context.attention.slidingWindow);
}

int32_t headDimFromHiddenSize(ConfigReader const& reader)
{
    std::optional<int32_t> const hiddenSize = reader.optionalInteger("hidden_size", 1);
    if (!hiddenSize)
    {
        throw reader.missing("head_dim", "or hidden_size and num_attention_heads");
    }
    std::optional<int32_t> const numHeads = reader.optionalInteger("num_attention_heads", 1);
    if (!numHeads)
    {
        throw reader.missing("num_attention_heads", "needed for head_dim = hidden_size / num_attention_heads");
    }
    if (*hiddenSize % *numHeads != 0)
    {
        throw ModelConfigError(fmt::format("{}: {} = {} is not a multiple of {} = {}, so head_dim is not whole; give "
                                           "head_dim",
            reader.source(), reader.name("hidden_size"), *hiddenSize, reader.name("num_attention_heads"), *numHeads));
    }
    return *hiddenSize / *numHeads;
}

std::optional<std::vector<bool>> listedLayers(ConfigReader const& reader, std::string_view field, int32_t numLayers)
{
    Json const* indices = reader.find(field);
    if (indices == nullptr)
    {
        return std::nullopt;
    }
    std::string const name = reader.name(field);
    if (!indices->is_array())
    {
        throw reader.bad(name, *indices, "a list of layer indices");
    }
    std::vector<bool> listed(static_cast<size_t>(numLayers), false);
    for (size_t i = 0; i < indices->size(); ++i)
    {
        int32_t const layer = reader.integer((*indices)[i], fmt::format("{}[{}]", name, i), 0);
        if (layer >= numLayers)
        {
            throw ModelConfigError(fmt::format("{}: field {}[{}] is {}; the model has {} layers (0-indexed)",
                reader.source(), name, i, layer, numLayers));
        }
        listed[static_cast<size_t>(layer)] = true;
    }
    return listed;
}

int32_t requiredInteger(ConfigReader const& reader, std::string_view field, int32_t minimum, std::string_view meaning)
{
    std::optional<int32_t> const value = reader.optionalInteger(field, minimum);
    if (!value)
    {
        throw reader.missing(field, meaning);
    }
    return *value;
}

StateTensorDescription splitTensor(
    std::string name, std::vector<int64_t> shape, bool recurrent, std::vector<rt::StateSplitSegment> segments)
{
    return {std::move(name), std::move(shape), recurrent, 0, std::move(segments)};
}

rt::StateSplitSegment splitParts(int64_t parts, int64_t partSize, std::string const& field, bool replicated)
{
    return {parts, partSize, replicated, field};
}

StateLayerDescription mamba2State(int32_t modelLayer, int64_t numHeads, int64_t headDim, int64_t numGroups,
    int64_t stateSize, int64_t convKernel, std::string const& headsField, std::string const& groupsField)
{
    // The conv channels are x (the heads), then B and C (the groups each); B and C go with the heads, and a single
    // group is copied to every GPU rather than split. Each factor is a positive int32, so every product stays far
    // below 2^63.
    bool const oneGroup = numGroups == 1;
    rt::StateSplitSegment const groups = splitParts(numGroups, stateSize, groupsField, oneGroup);
    return {modelLayer, "mamba2",
        {splitTensor("conv", {numHeads * headDim + 2 * numGroups * stateSize, convKernel - 1}, false,
             {splitParts(numHeads, headDim, headsField), groups, groups}),
            splitTensor("ssm", {numHeads, headDim, stateSize}, true, {splitParts(numHeads, 1, headsField)})}};
}

std::vector<int32_t> layersWithoutAttention(StateContext const& context)
{
    std::vector<int32_t> layers;
    for (int32_t i = 0; i < context.numLayers; ++i)
    {
        if (!context.kinds[static_cast<size_t>(i)])
        {
            layers.push_back(i);
        }
    }
    return layers;
}

std::string ordinal(int32_t n)
{
    int32_t const lastTwo = n % 100;
    char const* suffix = (lastTwo >= 11 && lastTwo <= 13) ? "th"
        : n % 10 == 1                                     ? "st"
        : n % 10 == 2                                     ? "nd"
        : n % 10 == 3                                     ? "rd"
                                                          : "th";
    return fmt::format("{}{}", n, suffix);
}

} // namespace kvcache::plan::families
