#include <fmt/format.h>

#include "families/family.h"

namespace kvcache::plan::families
{
namespace
{

//! Falcon's KV heads, as transformers' FalconConfig and FalconAttention define them: num_kv_heads (default
//! num_attention_heads) with new_decoder_architecture (Falcon-40B, -180B), else one shared K and V head with
//! multi_query (Falcon-7B), else one per attention head; head_dim is hidden_size / num_attention_heads.
std::optional<std::vector<rt::KVLayerConfig>> falconLayers(
    ConfigReader const& reader, int32_t numLayers, std::vector<std::string>& notes)
{
    // A Falcon model_type always has both (FalconConfig's defaults fill them in); another config with only one of
    // them (GPTBigCode's multi_query) is not read by this rule.
    if (reader.find("multi_query") == nullptr || reader.find("new_decoder_architecture") == nullptr)
    {
        return std::nullopt;
    }
    std::optional<bool> const newArchitecture = reader.optionalBool("new_decoder_architecture");
    std::optional<bool> const multiQuery = reader.optionalBool("multi_query");
    std::optional<int32_t> const numHeads = reader.optionalInteger("num_attention_heads", 1);
    if (!numHeads)
    {
        throw reader.missing("num_attention_heads", "Falcon's attention heads (n_head)");
    }
    int32_t const headDim = headDimFromHiddenSize(reader);
    int32_t kvHeads = *numHeads;
    if (*newArchitecture)
    {
        kvHeads = reader.optionalInteger("num_kv_heads", 1).value_or(*numHeads);
        notes.push_back(fmt::format("Falcon, {} true: {} = {} KV heads of {} / {} = {}",
            reader.name("new_decoder_architecture"), reader.name("num_kv_heads"), kvHeads, reader.name("hidden_size"),
            reader.name("num_attention_heads"), headDim));
    }
    else if (*multiQuery)
    {
        kvHeads = 1;
        notes.push_back(fmt::format("Falcon, {} true: one K and V head shared by the {} attention heads, of {} / {} = "
                                    "{}",
            reader.name("multi_query"), *numHeads, reader.name("hidden_size"), reader.name("num_attention_heads"),
            headDim));
    }
    else
    {
        notes.push_back(fmt::format("Falcon, multi_query and new_decoder_architecture false: one K and V head per "
                                    "attention head, {} x {}",
            *numHeads, headDim));
    }
    return std::vector<rt::KVLayerConfig>(static_cast<size_t>(numLayers), rt::KVLayerConfig{kvHeads, headDim});
}

} // namespace

//! Falcon: multi-query attention (Falcon-7B) or grouped KV heads (new_decoder_architecture), read with the names and
//! defaults of transformers' FalconConfig (n_layer, n_head, n_head_kv and n_embed are other names; multi_query
//! defaults to true, new_decoder_architecture to false).
ModelFamily falconFamily()
{
    return {"Falcon", {}, nullptr, nullptr, &falconLayers,
        FieldDefaults{{"falcon", "RefinedWebModel", "RefinedWeb"}, "FalconConfig",
            {{"num_hidden_layers", "n_layer"}, {"num_attention_heads", "n_head"}, {"num_kv_heads", "n_head_kv"},
                {"hidden_size", "n_embed"}},
            {{"multi_query", Json(true)}, {"new_decoder_architecture", Json(false)}}}};
}

} // namespace kvcache::plan::families
