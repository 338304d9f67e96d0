// State layers of hybrid models in kvcache-plan: which layers keep a state and what one sequence's state takes, read
// from published configs of nine families (models/ and inline), the text and JSON output, and the named errors. Every
// size is worked out by hand in the comment above its assertion.

#include "test_support.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvcache::plan
{
namespace
{

using namespace test_support;

//! The model layer of each state layer.
std::vector<int32_t> stateModelLayers(ModelDescription const& model)
{
    std::vector<int32_t> layers;
    for (StateLayerDescription const& layer : model.stateLayers)
    {
        layers.push_back(layer.modelLayer);
    }
    return layers;
}

//! The model layers 0 .. count - 1 that are not in `skipped`.
std::vector<int32_t> layersExcept(int32_t count, std::vector<int32_t> const& skipped)
{
    std::vector<int32_t> layers;
    for (int32_t i = 0; i < count; ++i)
    {
        if (std::find(skipped.begin(), skipped.end(), i) == skipped.end())
        {
            layers.push_back(i);
        }
    }
    return layers;
}

//! Plans `fixture` at batch 1, so that the state bytes are one sequence's.
Plan onePlan(std::string const& fixture, std::vector<std::string> extra = {})
{
    std::vector<std::string> args = {"--config", modelPath(fixture), "--batch", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return planFor(args);
}

TEST(StatePlan, QwenNextGatedDeltaNet)
{
    Plan const plan = onePlan("qwen3-next-80b-a3b-instruct.json");
    // full_attention_interval 4: layers 3, 7, ..., 47 attend; the other 36 are gated delta net layers.
    std::vector<int32_t> const attention = {3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47};
    EXPECT_EQ(plan.model.attentionLayers, attention);
    EXPECT_EQ(stateModelLayers(plan.model), layersExcept(48, attention));
    // conv [2 x 16 x 128 + 32 x 128, 4 - 1] = [8192, 3] bfloat16 = 49,152 bytes; recurrent [32, 128, 128] float32 =
    // 2,097,152 bytes; 2,146,304 a layer, 36 layers = 77,266,944 bytes a sequence.
    ASSERT_EQ(plan.layout.stateLayers.size(), 36U);
    rt::StateLayerLayout const& layer = plan.layout.stateLayers[0];
    EXPECT_EQ(layer.tensors[0].shape, (std::vector<int64_t>{8192, 3}));
    EXPECT_EQ(layer.tensors[0].dataType, rt::DataType::kBF16);
    EXPECT_EQ(layer.tensors[1].shape, (std::vector<int64_t>{32, 128, 128}));
    EXPECT_EQ(layer.tensors[1].dataType, rt::DataType::kFLOAT);
    EXPECT_EQ(layer.slotBytes, 2146304);
    EXPECT_EQ(plan.layout.stateBytesPerSlot, 77266944);
    // Attention: 12 layers x 2 halves x 2 heads x 256 x 2 bytes = 24,576 bytes a token.
    EXPECT_EQ(plan.layout.bytesPerPage / plan.layout.tokensPerPage, 24576);

    // --state-dtype bfloat16 halves the recurrent state only: 49,152 + 1,048,576 = 1,097,728 a layer, x 36.
    Plan const half = onePlan("qwen3-next-80b-a3b-instruct.json", {"--state-dtype", "bfloat16"});
    EXPECT_EQ(half.layout.stateLayers[0].tensors[1].dataType, rt::DataType::kBF16);
    EXPECT_EQ(half.layout.stateLayers[0].tensors[0].dataType, rt::DataType::kBF16);
    EXPECT_EQ(half.layout.stateBytesPerSlot, 39518208);
}

TEST(StatePlan, QwenNextDefaultsOfItsConfigClass)
{
    // Qwen3NextConfig's defaults: full_attention_interval 4, kernel 4, 16 key heads and 32 value heads of 128.
    ModelDescription const model = parseHuggingFaceConfig(R"({"model_type": "qwen3_next", "num_hidden_layers": 8,
        "num_key_value_heads": 2, "head_dim": 256})",
        "inline.json");
    EXPECT_EQ(model.attentionLayers, (std::vector<int32_t>{3, 7}));
    EXPECT_EQ(stateModelLayers(model), (std::vector<int32_t>{0, 1, 2, 4, 5, 6}));
    ASSERT_EQ(model.stateLayers[0].tensors.size(), 2U);
    EXPECT_EQ(model.stateLayers[0].tensors[0].shape, (std::vector<int64_t>{8192, 3}));
    EXPECT_EQ(model.stateLayers[0].tensors[1].shape, (std::vector<int64_t>{32, 128, 128}));
    EXPECT_TRUE(firstNoteMentions(model, "full_attention_interval 4"));
}

TEST(StatePlan, QwenThreeFiveUnderTextConfig)
{
    Plan const plan = onePlan("qwen3.5-35b-a3b.json");
    // 40 layers, every 4th attends: 10 attention layers, 30 gated delta net layers of the Qwen3-Next shape:
    // 30 x 2,146,304 = 64,389,120 bytes a sequence; 10 x 2 x 2 x 256 x 2 = 20,480 attention bytes a token.
    EXPECT_EQ(plan.model.attentionLayers.size(), 10U);
    EXPECT_EQ(plan.model.stateLayers.size(), 30U);
    EXPECT_EQ(plan.model.stateLayers[0].kind, "gated_delta_net");
    EXPECT_EQ(plan.layout.stateBytesPerSlot, 64389120);
    EXPECT_EQ(plan.layout.bytesPerPage / plan.layout.tokensPerPage, 20480);
    EXPECT_EQ(plan.model.dataTypeName, "bfloat16"); // text_config's dtype: the conv windows' type
}

TEST(StatePlan, NemotronHPatternWithInfinity)
{
    // The file holds time_step_limit [0.0, Infinity], which standard JSON does not allow.
    Plan const plan = onePlan("nemotron-h-8b-base-8k.json");
    // "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-": * at 7, 18, 29, 40; 24 M layers; '-' layers keep nothing.
    EXPECT_EQ(plan.model.attentionLayers, (std::vector<int32_t>{7, 18, 29, 40}));
    std::vector<int32_t> const mamba = {
        0, 2, 4, 6, 9, 11, 13, 15, 17, 20, 22, 24, 26, 28, 31, 33, 35, 37, 39, 42, 44, 46, 48, 50};
    EXPECT_EQ(stateModelLayers(plan.model), mamba);
    // conv [128 x 64 + 2 x 8 x 128, 3] = [10240, 3] bfloat16 = 61,440 bytes; SSM [128, 64, 128] float32 = 4,194,304;
    // 4,255,744 a layer, x 24 = 102,137,856 bytes a sequence.
    EXPECT_EQ(plan.layout.stateLayers[0].tensors[0].shape, (std::vector<int64_t>{10240, 3}));
    EXPECT_EQ(plan.layout.stateLayers[0].tensors[1].shape, (std::vector<int64_t>{128, 64, 128}));
    EXPECT_EQ(plan.layout.stateBytesPerSlot, 102137856);
    // Attention: 4 x 2 x 8 x 128 x 2 = 16,384 bytes a token.
    EXPECT_EQ(plan.layout.bytesPerPage / plan.layout.tokensPerPage, 16384);
}

TEST(StatePlan, BambaAttentionIndices)
{
    Plan const plan = onePlan("bamba-9b.json");
    EXPECT_EQ(plan.model.attentionLayers, (std::vector<int32_t>{9, 18, 27}));
    EXPECT_EQ(stateModelLayers(plan.model), layersExcept(32, {9, 18, 27}));
    // d_inner 2 x 4096 = 8192 = 128 heads x 64. conv [8192 + 2 x 1 x 128, 3] = [8448, 3] bfloat16 = 50,688 bytes;
    // SSM [128, 64, 128] float32 = 4,194,304; 4,244,992 a layer, x 29 = 123,104,768 bytes a sequence.
    EXPECT_EQ(plan.layout.stateLayers[0].tensors[0].shape, (std::vector<int64_t>{8448, 3}));
    EXPECT_EQ(plan.layout.stateBytesPerSlot, 123104768);
    // Attention: 3 x 2 x 8 x (4096 / 32 = 128) x 2 = 12,288 bytes a token.
    EXPECT_EQ(plan.layout.bytesPerPage / plan.layout.tokensPerPage, 12288);
}

TEST(StatePlan, GraniteHybridLayerTypes)
{
    // Granite-4.0-H-Tiny's Mamba2 sizes (hidden 1536, 48 heads of 64, one group, state 128, kernel 4) over a short
    // layer list.
    std::string const json = R"({"model_type": "granitemoehybrid", "torch_dtype": "bfloat16", "hidden_size": 1536,
        "num_hidden_layers": 6, "num_attention_heads": 12, "num_key_value_heads": 4,
        "layer_types": ["mamba", "mamba", "attention", "mamba", "mamba", "attention"],
        "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4,
        "mamba_expand": 2})";
    Plan const plan = planFor({"--config", writeTempFile("granite.json", json), "--batch", "1"});
    EXPECT_EQ(plan.model.attentionLayers, (std::vector<int32_t>{2, 5}));
    EXPECT_EQ(stateModelLayers(plan.model), (std::vector<int32_t>{0, 1, 3, 4}));
    // conv [3072 + 2 x 128, 3] = [3328, 3] bfloat16 = 19,968 bytes; SSM [48, 64, 128] float32 = 1,572,864;
    // 1,592,832 a layer, x 4 = 6,371,328.
    EXPECT_EQ(plan.layout.stateBytesPerSlot, 6371328);
}

TEST(StatePlan, FalconHOneRunsMambaBesideAttention)
{
    // Falcon-H1-0.5B's sizes (hidden 1024, 8 heads, 2 KV heads of 64, mamba_d_ssm 1536 = 24 heads of 64, one group,
    // state 128, kernel 4) over 4 layers; every layer attends and keeps a Mamba2 state.
    std::string const base = R"("model_type": "falcon_h1", "torch_dtype": "bfloat16", "hidden_size": 1024,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
        "mamba_n_heads": 24, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4,
        "mamba_expand": 2)";
    Plan const plan = planFor(
        {"--config", writeTempFile("falcon_h1.json", "{" + base + R"(, "mamba_d_ssm": 1536})"), "--batch", "1"});
    EXPECT_EQ(plan.model.attentionLayers, (std::vector<int32_t>{0, 1, 2, 3}));
    EXPECT_EQ(stateModelLayers(plan.model), (std::vector<int32_t>{0, 1, 2, 3}));
    // conv [1536 + 2 x 128, 3] = [1792, 3] bfloat16 = 10,752 bytes; SSM [24, 64, 128] float32 = 786,432;
    // 797,184 a layer, x 4 = 3,188,736.
    EXPECT_EQ(plan.layout.stateBytesPerSlot, 3188736);
    // mamba_d_ssm 1500 is not 24 x 64: inconsistent.
    std::string const message = configErrorOf("{" + base + R"(, "mamba_d_ssm": 1500})");
    for (std::string const word : {"mamba_n_heads", "mamba_d_head", "1536", "mamba_d_ssm 1500", "inconsistent"})
    {
        EXPECT_NE(message.find(word), std::string::npos) << message;
    }
}

TEST(StatePlan, JambaMambaOne)
{
    Plan const plan = onePlan("jamba-like.json");
    // attn_layer_period 8, offset 4: layers 4, 12, 20, 28 attend; the other 28 are Mamba layers. mamba_expand is
    // JambaConfig's default 2: d_inner 8192. conv [8192, 3] bfloat16 = 49,152 bytes; SSM [8192, 16] float32 = 524,288;
    // 573,440 a layer, x 28 = 16,056,320.
    EXPECT_EQ(stateModelLayers(plan.model), layersExcept(32, {4, 12, 20, 28}));
    EXPECT_EQ(plan.model.stateLayers[0].kind, "mamba");
    EXPECT_EQ(plan.layout.stateLayers[0].tensors[1].shape, (std::vector<int64_t>{8192, 16}));
    EXPECT_EQ(plan.layout.stateBytesPerSlot, 16056320);
}

TEST(StatePlan, LfmShortConvolutions)
{
    Plan const plan = onePlan("lfm2-1.2b.json");
    EXPECT_EQ(plan.model.attentionLayers, (std::vector<int32_t>{2, 5, 8, 10, 12, 14}));
    // 10 conv layers of [2048, 3 - 1] bfloat16 = 8,192 bytes: 81,920 a sequence, no recurrent state.
    EXPECT_EQ(stateModelLayers(plan.model), layersExcept(16, {2, 5, 8, 10, 12, 14}));
    EXPECT_EQ(plan.layout.stateLayers[0].tensors.size(), 1U);
    EXPECT_EQ(plan.layout.stateBytesPerSlot, 81920);
    // full_attn_idxs alone says the same.
    ModelDescription const model = parseHuggingFaceConfig(R"({"model_type": "lfm2", "hidden_size": 2048,
        "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 8, "conv_L_cache": 3,
        "full_attn_idxs": [1, 3]})",
        "inline.json");
    EXPECT_EQ(model.attentionLayers, (std::vector<int32_t>{1, 3}));
    EXPECT_EQ(stateModelLayers(model), (std::vector<int32_t>{0, 2}));
}

TEST(StatePlan, KimiLinearKdaBesideLatentAttention)
{
    Plan const plan = onePlan("kimi-linear-48b-a3b-instruct.json");
    // full_attn_layers 4, 8, ..., 24, 27 (1-indexed) are model layers 3, 7, ..., 23, 26: latent, 512 + 64 = 576.
    EXPECT_EQ(plan.model.attentionLayers, (std::vector<int32_t>{3, 7, 11, 15, 19, 23, 26}));
    EXPECT_EQ(plan.config.layerConfigs[0].kind, rt::KVLayerKind::kLATENT);
    EXPECT_EQ(stateModelLayers(plan.model), layersExcept(27, {3, 7, 11, 15, 19, 23, 26}));
    // q, k and v convs [32 x 128, 3] bfloat16 = 24,576 bytes each; recurrent [32, 128, 128] float32 = 2,097,152;
    // 2,170,880 a layer, x 20 = 43,417,600. Attention: 7 x 576 x 2 = 8,064 bytes a token.
    EXPECT_EQ(plan.layout.stateLayers[0].tensors.size(), 4U);
    EXPECT_EQ(plan.layout.stateLayers[0].slotBytes, 2170880);
    EXPECT_EQ(plan.layout.stateBytesPerSlot, 43417600);
    EXPECT_EQ(plan.layout.bytesPerPage / plan.layout.tokensPerPage, 8064);
}

TEST(StatePlan, TextShowsBytesPerTokenAndPerSequence)
{
    ProgramResult const result = runProgram({"--config", modelPath("bamba-9b.json"), "--batch", "2"});
    ASSERT_EQ(result.status, 0) << result.err;
    // 2 slots x 123,104,768 = 246,209,536.
    for (std::string const text :
        {"29 mamba2 layers", "conv [8448, 3] bfloat16", "ssm [128, 64, 128]",
            "123,104,768 bytes (117.40 MiB) of state per sequence", "2 slots", "246,209,536", "per token 12,288 bytes"})
    {
        EXPECT_NE(result.out.find(text), std::string::npos) << text << "\n" << result.out;
    }
}

TEST(StatePlan, JsonAddsStateBytes)
{
    ProgramResult const result = runProgram({"--config", modelPath("lfm2-1.2b.json"), "--batch", "2", "--json"});
    ASSERT_EQ(result.status, 0) << result.err;
    nlohmann::json const json = nlohmann::json::parse(result.out);
    EXPECT_EQ(json["stateBytesPerSequence"], 81920);
    EXPECT_EQ(json["stateSlots"], 2);
    EXPECT_EQ(json["stateBytes"], 163840);            // 2 x 81,920: no tensor needs padding
    EXPECT_EQ(json["attentionBytesPerToken"], 12288); // 6 x 2 x 8 x 64 x 2
    for (nlohmann::json const& layer : json["layers"])
    {
        EXPECT_EQ(layer["stateBytes"], 0);
    }
    ASSERT_EQ(json["stateLayers"].size(), 10U);
    nlohmann::json const& first = json["stateLayers"][0];
    EXPECT_EQ(first["modelLayer"], 0);
    EXPECT_EQ(first["kind"], "short_conv");
    EXPECT_EQ(first["stateBytes"], 8192);
    EXPECT_EQ(first["tensors"][0]["shape"], (std::vector<int64_t>{2048, 2}));
    EXPECT_EQ(first["tensors"][0]["dtype"], "bfloat16");

    // A model without state layers prints none of these.
    ProgramResult const plain = runProgram({"--json"});
    ASSERT_EQ(plain.status, 0);
    nlohmann::json const plainJson = nlohmann::json::parse(plain.out);
    EXPECT_FALSE(plainJson.contains("stateBytesPerSequence"));
    EXPECT_FALSE(plainJson["layers"][0].contains("stateBytes"));
}

TEST(StatePlan, ReadsNonFiniteNumbersOutsideStrings)
{
    ModelDescription const model = parseHuggingFaceConfig(R"({"num_hidden_layers": 1, "num_key_value_heads": 2,
        "head_dim": 64, "a": [Infinity, -Infinity, NaN], "b": "Infinity NaN", "torch_dtype": "float16"})",
        "inline.json");
    EXPECT_EQ(model.layers.size(), 1U);
    EXPECT_EQ(model.dataTypeName, "float16");
}

TEST(StatePlan, BadConfigsExitTwoNamingTheField)
{
    std::string const nemotron = R"("model_type": "nemotron_h", "num_hidden_layers": 3, "num_key_value_heads": 2,
        "head_dim": 64, "mamba_num_heads": 4, "mamba_head_dim": 8, "n_groups": 1, "ssm_state_size": 16,
        "conv_kernel": 4)";
    std::string const kimi = R"("model_type": "kimi_linear", "num_hidden_layers": 3, "kv_lora_rank": 64,
        "qk_rope_head_dim": 16)";
    std::vector<std::pair<std::string, std::vector<std::string>>> const cases = {
        {"{" + nemotron + R"(, "hybrid_override_pattern": "M*"})",
            {"hybrid_override_pattern", "2 characters", "num_hidden_layers = 3"}},
        {"{" + nemotron + R"(, "hybrid_override_pattern": "M*X"})", {"hybrid_override_pattern[2]", "'X'"}},
        {"{" + kimi + R"(, "linear_attn_config": {"full_attn_layers": [3], "kda_layers": [1, 3], "num_heads": 2,
            "head_dim": 8, "short_conv_kernel_size": 4}})",
            {"layer 2", "neither", "linear_attn_config.full_attn_layers"}},
        {"{" + kimi + R"(, "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2], "num_heads": 2,
            "head_dim": 8, "short_conv_kernel_size": 4}})",
            {"linear_attn_config.full_attn_layers[0]", "4", "3 layers"}},
        {"{" + kimi + R"(, "linear_attn_config": {"full_attn_layers": [3], "kda_layers": [1, 2], "num_heads": 2,
            "head_dim": 8}})",
            {"linear_attn_config.short_conv_kernel_size"}},
        {R"({"model_type": "qwen3_5_text", "num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 64,
            "full_attention_interval": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 8,
            "linear_num_value_heads": 2, "linear_value_head_dim": 8})",
            {"linear_conv_kernel_dim"}},
        {R"({"model_type": "bamba", "num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 64,
            "attn_layer_indices": [4]})",
            {"attn_layer_indices[0]", "4", "4 layers"}},
        {R"({"model_type": "lfm2", "num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64,
            "hidden_size": 128, "full_attn_idxs": [1], "conv_L_cache": 1})",
            {"conv_L_cache", "1"}},
    };
    for (auto const& [json, words] : cases)
    {
        ProgramResult const result = runProgram({"--config", writeTempFile("bad.json", json)});
        EXPECT_EQ(result.status, kEXIT_BAD_INPUT) << json;
        for (std::string const& word : words)
        {
            EXPECT_NE(result.err.find(word), std::string::npos) << word << "\n" << result.err;
        }
    }
}

TEST(StatePlan, RefusesStateDtypesItCannotPlan)
{
    std::string const message = usageErrorOf({"--state-dtype", "int8"});
    EXPECT_NE(message.find("--state-dtype"), std::string::npos) << message;
    EXPECT_NE(message.find("int8"), std::string::npos) << message;
}

} // namespace
} // namespace kvcache::plan
