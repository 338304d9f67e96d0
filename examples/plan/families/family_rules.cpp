#include <fmt/format.h>

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
