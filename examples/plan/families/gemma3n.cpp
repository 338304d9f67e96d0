#include <fmt/format.h>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! num_kv_shared_layers N: the last N layers reuse the K and V of an earlier layer of their kind and keep no cache of
//! their own. A Gemma-3n config without it is refused: transformers fills in a default the planner does not assume.
void dropSharedKVLayers(AttentionContext& context)
{
    ConfigReader const& reader = context.reader;
    std::optional<int32_t> const shared = reader.optionalInteger("num_kv_shared_layers", 0);
    if (!shared)
    {
        if (context.types.isAny({"gemma3n", "gemma3n_text"}))
        {
            throw reader.missing("num_kv_shared_layers", "Gemma-3n's last layers that reuse earlier layers' KV cache");
        }
        return;
    }
    if (*shared >= context.numLayers)
    {
        throw ModelConfigError(fmt::format("{}: field {} is {}; it must be less than the {} layers, as the shared "
                                           "layers reuse the cache of earlier ones",
            reader.source(), reader.name("num_kv_shared_layers"), *shared, context.numLayers));
    }
    if (*shared == 0)
    {
        return;
    }
    int32_t const firstShared = context.numLayers - *shared;
    for (int32_t i = firstShared; i < context.numLayers; ++i)
    {
        context.attention.kinds[static_cast<size_t>(i)] = std::nullopt;
    }
    context.notes.push_back(fmt::format("{} {}: layers {}-{} reuse the KV cache of earlier layers and keep none of "
                                        "their own; only layers 0-{} are planned",
        reader.name("num_kv_shared_layers"), *shared, firstShared, context.numLayers - 1, firstShared - 1));
}

} // namespace

//! Gemma-3n: sliding and full layers by layer_types, and the last num_kv_shared_layers layers share earlier caches.
ModelFamily gemma3nFamily()
{
    return {"Gemma-3n", {}, nullptr, nullptr, nullptr, {}, &dropSharedKVLayers};
}

} // namespace kvcache::plan::families
