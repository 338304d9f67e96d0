#include <fmt/format.h>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! Layers between full-attention layers for a config that leaves sliding_window_pattern out: the default of
//! transformers' Gemma3TextConfig.
constexpr int32_t kGEMMA3_DEFAULT_WINDOW_PATTERN = 6;

//! Gemma-3 without sliding_window_pattern: every 6th layer full.
bool gemma3DefaultPattern(AttentionContext& context)
{
    for (std::string_view const type : {"gemma3", "gemma3_text"})
    {
        if (context.types.is(type))
        {
            applyWindowPattern(context, kGEMMA3_DEFAULT_WINDOW_PATTERN,
                fmt::format("no sliding_window_pattern, so the {} default {}", type, kGEMMA3_DEFAULT_WINDOW_PATTERN));
            return true;
        }
    }
    return false;
}

//! Gemma-2 without layer_types: even layers slide, odd layers are full.
bool gemma2AlternatingLayers(AttentionContext& context)
{
    if (!context.types.is("gemma2"))
    {
        return false;
    }
    requireWindow(context, "Gemma-2 layers alternate sliding and full attention");
    fillKinds(context, [](int32_t i) { return i % 2 == 0 ? AttentionKind::kSLIDING : AttentionKind::kFULL; });
    context.notes.push_back(
        fmt::format("Gemma-2 without layer_types: even layers (0, 2, ...) slide over {}, odd layers are full",
            windowText(context)));
    return true;
}

bool gemmaAttention(AttentionContext& context)
{
    return gemma3DefaultPattern(context) || gemma2AlternatingLayers(context);
}

} // namespace

//! Gemma-2 and Gemma-3: sliding-window layers between full-attention ones, in a fixed pattern when the config has no
//! layer_types. Gemma-3 fields a config leaves out take transformers' Gemma3TextConfig defaults: 26 layers, 8 attention
//! heads, 4 KV heads, head_dim 256 (not hidden_size / num_attention_heads) and sliding_window 4096.
ModelFamily gemmaFamily()
{
    // Gemma3Config reads text_config as a Gemma3TextConfig, so the defaults hold there too. Only the fields the cache
    // depends on; sliding_window_pattern's default 6 is the rule above.
    return {"Gemma", {}, nullptr, &gemmaAttention, nullptr,
        FieldDefaults{{"gemma3", "gemma3_text"}, "Gemma3TextConfig", {},
            {{"num_hidden_layers", Json(26)}, {"num_attention_heads", Json(8)}, {"num_key_value_heads", Json(4)},
                {"head_dim", Json(256)}, {"sliding_window", Json(4096)}}}};
}

} // namespace kvcache::plan::families
