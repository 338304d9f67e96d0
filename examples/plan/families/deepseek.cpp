#include <fmt/format.h>

#include <limits>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! Multi-head latent attention (kv_lora_rank and qk_rope_head_dim): one latent of kv_lora_rank + qk_rope_head_dim
//! values a token and layer, K only; nothing when neither field is present.
std::optional<std::vector<rt::KVLayerConfig>> latentLayers(
    ConfigReader const& reader, int32_t numLayers, std::vector<std::string>& notes)
{
    std::optional<int32_t> const rank = reader.optionalInteger("kv_lora_rank", 1);
    std::optional<int32_t> const rope = reader.optionalInteger("qk_rope_head_dim", 1);
    if (rank.has_value() != rope.has_value())
    {
        std::string_view const given = rank ? "kv_lora_rank" : "qk_rope_head_dim";
        std::string_view const absent = rank ? "qk_rope_head_dim" : "kv_lora_rank";
        throw ModelConfigError(fmt::format("{}: field {} is {} but {} is missing; multi-head latent attention caches "
                                           "kv_lora_rank + qk_rope_head_dim values per token, so both are needed",
            reader.source(), reader.name(given), rank ? *rank : *rope, reader.name(absent)));
    }
    if (!rank)
    {
        return std::nullopt;
    }
    int64_t const width = int64_t{*rank} + *rope;
    if (width > std::numeric_limits<int32_t>::max())
    {
        throw ModelConfigError(fmt::format("{}: {} + {} = {} is over the int32 limit", reader.source(),
            reader.name("kv_lora_rank"), reader.name("qk_rope_head_dim"), width));
    }
    notes.push_back(fmt::format("multi-head latent attention: {} {} + {} {} = one latent of {} values per token and "
                                "layer, K only (num_key_value_heads and the head dims describe the decompressed heads, "
                                "not the cache)",
        reader.name("kv_lora_rank"), *rank, reader.name("qk_rope_head_dim"), *rope, width));
    return std::vector<rt::KVLayerConfig>(
        static_cast<size_t>(numLayers), rt::KVLayerConfig{1, static_cast<int32_t>(width), 0, rt::KVLayerKind::kLATENT});
}

} // namespace

//! DeepSeek-V2 and V3 (and Kimi-K2): multi-head latent attention, one latent a layer.
ModelFamily deepseekFamily()
{
    return {"DeepSeek", {}, nullptr, nullptr, &latentLayers};
}

} // namespace kvcache::plan::families
