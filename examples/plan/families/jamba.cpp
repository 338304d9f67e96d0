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

} // namespace

//! Jamba: one attention layer every attn_layer_period layers (at attn_layer_offset), Mamba blocks (mamba, mamba2 in
//! layer_types: a recurrent state) in between.
ModelFamily jambaFamily()
{
    return {"Jamba", {"mamba", "mamba2"}, &periodicAttentionLayers};
}

} // namespace kvcache::plan::families
