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

TEST(HuggingFaceConfig, HostileNumbersAreNamedErrors)
{
    std::vector<std::pair<std::string, std::vector<std::string>>> const cases = {
        // A layer count that would size lists of 2^31 entries: refused against the limit before anything is sized.
        {R"({"num_hidden_layers": 2147483647, "num_key_value_heads": 8, "head_dim": 128})",
            {"inline.json", "field num_hidden_layers is 2147483647", "at most 65536 layers"}},
        {R"({"text_config": {"num_hidden_layers": 65537, "num_key_value_heads": 8, "head_dim": 128}})",
            {"text_config.num_hidden_layers is 65537", "65536"}},
        // Numbers past a double's range: the file and the field, not the JSON library's words alone.
        {R"({"num_hidden_layers": 1e400, "num_key_value_heads": 8, "head_dim": 128})",
            {"inline.json", "field num_hidden_layers is 1e400", "out of the range"}},
        {R"({"text_config": {"num_hidden_layers": 2, "num_kv_heads": [2, -1e400], "head_dim": 64}})",
            {"field text_config.num_kv_heads[1] is -1e400"}},
        {R"({"a": [1, [2, 3, {"b": [4, 1e999]}]]})", {"field a[1][2].b[1] is 1e999"}},
        // In range for a double, not for a count.
        {R"({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 1e300})", {"field head_dim is 1e+300"}},
        {R"({"num_hidden_layers": 2, "num_key_value_heads": 18446744073709551615, "head_dim": 64})",
            {"field num_key_value_heads"}},
        // Malformed JSON names where the parser was.
        {R"({"text_config": {"head_dim": 64,)", {"inline.json", "malformed JSON in field text_config"}},
        {"{\"a\": " + std::string(100, '[') + std::string(100, ']') + "}", {"field a[0]", "deeper", "64 levels"}},
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

TEST(HuggingFaceConfig, HostileValuesAreQuotedShort)
{
    // A million-entry list in the wrong place is named and cut, not printed whole.
    std::string list = "[1";
    for (int i = 0; i < 1000000; ++i)
    {
        list += ",1";
    }
    list += "]";
    std::string const message = configErrorOf(R"({"num_hidden_layers": )" + list + "}");
    EXPECT_NE(message.find("field num_hidden_layers is [1,1,1"), std::string::npos) << message.substr(0, 200);
    EXPECT_LT(message.size(), 400u);
}

TEST(HuggingFaceConfig, HostileFilesAndFlagsEndInNamedErrors)
{
    // An endless file is read up to the limit and refused, naming the path and the limit; exit status 2.
    ProgramResult const endless = runProgram({"--config", "/dev/zero"});
    EXPECT_EQ(endless.status, kEXIT_BAD_INPUT);
    EXPECT_NE(endless.err.find("/dev/zero: more than 16777216 bytes"), std::string::npos) << endless.err;

    std::string const path = writeTempFile("overflow.json", R"({"num_hidden_layers": 1e400})");
    ProgramResult const overflow = runProgram({"--config", path});
    EXPECT_EQ(overflow.status, kEXIT_BAD_INPUT);
    EXPECT_NE(overflow.err.find(path + ": field num_hidden_layers is 1e400"), std::string::npos) << overflow.err;

    // --layers and --layer-heads are bounded by the same limit as num_hidden_layers.
    EXPECT_NE(usageErrorOf({"--layers", "100000000"}).find("--layers expects a whole number in [1, 65536]"),
        std::string::npos);
    EXPECT_EQ(parseArguments({"--layers", "65536"}).numLayers, kMAX_MODEL_LAYERS);
    std::string heads = "1x1";
    for (int32_t i = 0; i < kMAX_MODEL_LAYERS; ++i)
    {
        heads += ",1x1";
    }
    EXPECT_NE(usageErrorOf({"--layer-heads", heads}).find("more than 65536 layers"), std::string::npos);
}

} // namespace
} // namespace kvcache::plan
