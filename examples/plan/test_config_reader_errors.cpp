// The config reader's errors: each names the file and the field, and configs it cannot read are refused.
#include "test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace kvcache::plan
{
namespace
{

using namespace test_support;

TEST(HuggingFaceConfig, ErrorsNameTheFileAndTheField)
{
    std::vector<std::pair<std::string, std::vector<std::string>>> const cases = {
        {R"({"num_hidden_layers": 2,)", {"inline.json", "malformed JSON"}},
        {R"([1, 2])", {"inline.json", "JSON object"}},
        {R"({"num_key_value_heads": 8, "head_dim": 128})", {"inline.json", "missing field num_hidden_layers"}},
        {R"({"text_config": {"head_dim": 64}})", {"missing field text_config.num_hidden_layers"}},
        {R"({"num_hidden_layers": 2, "head_dim": 64})", {"missing field num_key_value_heads"}},
        {R"({"num_hidden_layers": 2, "num_key_value_heads": 2})", {"missing field head_dim"}},
        {R"({"num_hidden_layers": 2, "num_key_value_heads": 2, "hidden_size": 64})",
            {"missing field num_attention_heads"}},
        {R"({"num_hidden_layers": "32", "num_key_value_heads": 8, "head_dim": 128})", {"num_hidden_layers", "\"32\""}},
        {R"({"num_hidden_layers": 3, "num_kv_heads": [2, 2], "head_dim": 64})",
            {"num_kv_heads", "lists 2 layers; the model has 3"}},
        {R"({"num_hidden_layers": 2, "num_kv_heads": [2, 0], "head_dim": 64})", {"num_kv_heads[1]", "0"}},
        {R"({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64, "layer_types": ["attention"]})",
            {"layer_types", "a list of 2 layer kinds"}},
        {R"({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64, "layer_types": ["mamba", "conv"]})",
            {"inline.json", "no KV cache"}},
        {R"({"num_hidden_layers": 8, "num_key_value_heads": 2, "head_dim": 64, "attn_layer_period": 4})",
            {"missing field attn_layer_offset"}},
        {R"({"num_hidden_layers": 8, "num_key_value_heads": 2, "head_dim": 64, "attn_layer_period": 4,
            "attn_layer_offset": 4})",
            {"attn_layer_offset", "attn_layer_period"}},
        {R"({"num_hidden_layers": 2, "num_attention_heads": 5, "hidden_size": 64})", {"hidden_size", "head_dim"}},
        {R"({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64, "torch_dtype": 16})",
            {"torch_dtype", "16"}},
    };
    for (auto const& [json, fragments] : cases)
    {
        std::string const message = configErrorOf(json);
        for (std::string const& fragment : fragments)
        {
            EXPECT_NE(message.find(fragment), std::string::npos) << "\"" << message << "\" lacks " << fragment;
        }
    }
}

TEST(HuggingFaceConfig, MissingFileNamesThePath)
{
    std::string const path = modelPath("no-such-model.json");
    try
    {
        loadHuggingFaceConfig(path);
        ADD_FAILURE() << "loaded a missing file";
    }
    catch (ModelConfigError const& error)
    {
        EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
    }
}

TEST(HuggingFaceConfig, ConfigsThePlannerCannotReadAreErrors)
{
    std::string const base = R"("num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64)";
    std::vector<std::pair<std::string, std::vector<std::string>>> const cases = {
        {"{" + base + R"(, "layer_types": ["full_attention", "hybrid_attention"]})",
            {"inline.json", "layer_types[1]", "\"hybrid_attention\"", "does not know"}},
        {R"({"num_hidden_layers": 2, "num_key_value_heads": 2, "kv_lora_rank": 512})",
            {"kv_lora_rank", "qk_rope_head_dim is missing"}},
        {R"({"num_hidden_layers": 2, "num_key_value_heads": 2, "qk_rope_head_dim": 64, "kv_lora_rank": null})",
            {"qk_rope_head_dim", "kv_lora_rank is missing"}},
        {R"({"text_config": {"num_hidden_layers": 2, "kv_lora_rank": 512}})",
            {"text_config.kv_lora_rank", "text_config.qk_rope_head_dim"}},
        {"{" + base + R"(, "layer_types": ["sliding_attention", "full_attention"]})",
            {"missing field sliding_window", "sliding_attention"}},
        {"{" + base + R"(, "layer_types": ["chunked_attention", "full_attention"]})",
            {"missing field attention_chunk_size"}},
        {"{" + base + R"(, "sliding_window_pattern": 6})", {"missing field sliding_window", "sliding_window_pattern"}},
        {"{" + base + R"(, "model_type": "gemma2"})", {"missing field sliding_window", "Gemma-2"}},
        {"{" + base + R"(, "sliding_window": 128, "use_sliding_window": "yes"})", {"use_sliding_window", "\"yes\""}},
        {"{" + base + R"(, "use_sliding_window": true})", {"missing field sliding_window", "use_sliding_window"}},
        {"{" + base + R"(, "attention_chunk_size": 8192})",
            {"attention_chunk_size", "8192", "which layers are chunked"}},
        {"{" + base + R"(, "attention_chunk_size": 8192, "sliding_window": 128, "model_type": "llama4_text"})",
            {"attention_chunk_size", "sliding_window", "both"}},
        {"{" + base + R"(, "attention_chunk_size": 8192, "no_rope_layers": [1, 2]})", {"no_rope_layers[1]", "2"}},
        {"{" + base + R"(, "attention_chunk_size": 8192, "no_rope_layers": [1]})",
            {"no_rope_layers", "lists 1 layers; the model has 2"}},
        {"{" + base + R"(, "hybrid_override_pattern": "M*"})", {"hybrid_override_pattern", "layer_types"}},
        {"{" + base + R"(, "block_types": ["recurrent", "attention"]})", {"block_types"}},
        {"{" + base + R"(, "sliding_window": -1})", {"sliding_window", "-1"}},
    };
    for (auto const& [json, fragments] : cases)
    {
        std::string const message = configErrorOf(json);
        for (std::string const& fragment : fragments)
        {
            EXPECT_NE(message.find(fragment), std::string::npos) << "\"" << message << "\" lacks " << fragment;
        }
    }
}

} // namespace
} // namespace kvcache::plan
