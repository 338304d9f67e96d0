#include "plan_internal.h"

#include <fmt/format.h>

#include <algorithm>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! Llama-4 leaves no_rope_layers empty: then every no_rope_layer_interval-th layer (default 4) is a full-attention
//! (NoPE) layer and the others are chunked.
constexpr int32_t kLLAMA4_DEFAULT_NOPE_INTERVAL = 4;

//! Reads Llama-4's no_rope_layers (1: RoPE and chunked attention, 0: NoPE and full attention); an empty or absent list
//! means transformers' default, every no_rope_layer_interval-th layer full. Returns whether each layer is chunked.
std::vector<bool> readChunkedLayers(AttentionContext& context)
{
    ConfigReader const& reader = context.reader;
    int32_t const numLayers = context.numLayers;
    int32_t const chunkSize = context.attention.chunkSize;
    std::string const field = reader.name("no_rope_layers");
    std::vector<bool> chunked(static_cast<size_t>(numLayers), false);
    Json const* list = reader.find("no_rope_layers");
    if (list != nullptr && !list->is_array())
    {
        throw reader.bad(field, *list, fmt::format("a list of {} entries, 1 (chunked) or 0 (full)", numLayers));
    }
    if (list != nullptr && !list->empty())
    {
        if (list->size() != static_cast<size_t>(numLayers))
        {
            throw ModelConfigError(fmt::format(
                "{}: field {} lists {} layers; the model has {}", reader.source(), field, list->size(), numLayers));
        }
        for (size_t i = 0; i < list->size(); ++i)
        {
            Json const& entry = (*list)[i];
            bool const one = entry == Json(1) || entry == Json(true);
            if (!one && entry != Json(0) && entry != Json(false))
            {
                throw reader.bad(fmt::format("{}[{}]", field, i), entry, "1 (chunked attention) or 0 (full attention)");
            }
            chunked[i] = one;
        }
        context.notes.push_back(fmt::format("{}: layers marked 1 use RoPE and chunked attention (attention_chunk_size "
                                            "{}), layers marked 0 are NoPE full-attention layers",
            field, chunkSize));
        return chunked;
    }
    if (!context.types.is("llama4") && !context.types.is("llama4_text"))
    {
        throw ModelConfigError(fmt::format("{}: field {} is {}, but neither layer_types nor no_rope_layers says which "
                                           "layers are chunked",
            reader.source(), reader.name("attention_chunk_size"), chunkSize));
    }
    int32_t const interval =
        reader.optionalInteger("no_rope_layer_interval", 1).value_or(kLLAMA4_DEFAULT_NOPE_INTERVAL);
    for (int32_t i = 0; i < numLayers; ++i)
    {
        chunked[static_cast<size_t>(i)] = (i + 1) % interval != 0;
    }
    context.notes.push_back(fmt::format("{} empty: Llama-4's default, every {} layer ({}, {}, ...) is a NoPE "
                                        "full-attention layer, the others use chunked attention (attention_chunk_size "
                                        "{})",
        field, ordinal(interval), interval - 1, 2 * interval - 1, chunkSize));
    return chunked;
}

//! attention_chunk_size: chunked layers and NoPE full-attention layers, as no_rope_layers says.
bool llama4ChunkedLayers(AttentionContext& context)
{
    LayerAttention const& attention = context.attention;
    if (attention.chunkSize == 0)
    {
        return false;
    }
    ConfigReader const& reader = context.reader;
    if (attention.slidingWindow != 0)
    {
        throw ModelConfigError(fmt::format("{}: fields {} ({}) and {} ({}) are both set and there is no layer_types to "
                                           "say which layers use which",
            reader.source(), reader.name("attention_chunk_size"), attention.chunkSize, reader.name("sliding_window"),
            attention.slidingWindow));
    }
    std::vector<bool> const chunked = readChunkedLayers(context);
    fillKinds(context,
        [&](int32_t i) { return chunked[static_cast<size_t>(i)] ? AttentionKind::kCHUNKED : AttentionKind::kFULL; });
    return true;
}

//! Llama-3.2-Vision (mllama): the layers cross_attention_layers lists attend to the image's tokens, whose fixed-size
//! cache the runtime keeps apart from the token cache, so they are not planned. An mllama config without the list is
//! refused: transformers fills in a default the planner does not assume.
void dropCrossAttentionLayers(AttentionContext& context)
{
    ConfigReader const& reader = context.reader;
    std::string const field = reader.name("cross_attention_layers");
    Json const* list = reader.find("cross_attention_layers");
    if (list == nullptr)
    {
        if (context.types.isAny({"mllama", "mllama_text_model"}))
        {
            throw reader.missing("cross_attention_layers", "the layers that attend to image tokens");
        }
        return;
    }
    if (!list->is_array() || list->size() >= static_cast<size_t>(context.numLayers))
    {
        throw reader.bad(field, *list, fmt::format("a list of fewer than {} layer indices", context.numLayers));
    }
    std::vector<int32_t> crossLayers;
    for (size_t i = 0; i < list->size(); ++i)
    {
        int32_t const layer = reader.integer((*list)[i], fmt::format("{}[{}]", field, i), 0);
        if (layer >= context.numLayers || !context.attention.kinds[static_cast<size_t>(layer)])
        {
            throw reader.bad(fmt::format("{}[{}]", field, i), (*list)[i],
                fmt::format("the index of an attention layer below {}, listed once", context.numLayers));
        }
        crossLayers.push_back(layer);
        context.attention.kinds[static_cast<size_t>(layer)] = std::nullopt;
    }
    std::sort(crossLayers.begin(), crossLayers.end());
    context.notes.push_back(fmt::format("{} {}: cross-attention layers attend to image tokens, a fixed-size cache the "
                                        "runtime keeps apart; not planned as token caches",
        field, detail::formatRuns(crossLayers)));
}

} // namespace

//! Llama: full attention in every layer (the generic rules), Llama-4's chunked attention with NoPE layers, and
//! Llama-3.2-Vision's cross-attention layers, which keep no token cache.
ModelFamily llamaFamily()
{
    return {"Llama", {}, nullptr, &llama4ChunkedLayers, nullptr, {}, &dropCrossAttentionLayers};
}

} // namespace kvcache::plan::families
