// The config reader on families whose configs need their own rules or their config class's names and defaults:
// Falcon, Gemma-3 without head_dim, Gemma-3n's shared KV layers, Llama-3.2-Vision's cross-attention layers, GPT-2.
// Every plan below uses the defaults: batch 8 x 8,192 tokens in pages of 128 (512 pages a layer half, 65,536 tokens),
// and --step-tokens 0, so sliding layers keep full-length caches too; bytes = layers x 2 (K and V) x KV heads x
// head_dim x bytes a value x 65,536 tokens.
#include "test_support.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvcache::plan
{
namespace
{

using namespace test_support;

//! Returns whether some note of `model` mentions every one of `fragments`.
bool someNoteMentions(ModelDescription const& model, std::vector<std::string> const& fragments)
{
    for (std::string const& note : model.notes)
    {
        bool all = true;
        for (std::string const& fragment : fragments)
        {
            all = all && note.find(fragment) != std::string::npos;
        }
        if (all)
        {
            return true;
        }
    }
    return false;
}

TEST(FamilyConfigs, FalconMultiQueryHasOneKVHead)
{
    Plan const plan = planFor({"--config", modelPath("falcon-7b.json")});
    // n_layer 32, n_head 71, multi_query true: one K and V head of 4544 / 71 = 64, not 71 of them.
    EXPECT_EQ(plan.model.numModelLayers, 32);
    EXPECT_EQ(headShapes(plan.model), uniformHeads(32, 1, 64));
    // 32 x 2 x 1 x 64 x 2 (bfloat16) x 65,536 = 536,870,912 bytes.
    EXPECT_EQ(plan.layout.cacheBytes, 536870912);
    EXPECT_TRUE(someNoteMentions(plan.model, {"multi_query", "one K and V head"}));
}

TEST(FamilyConfigs, FalconHeadsFollowTheConfigClass)
{
    // new_decoder_architecture: num_kv_heads (also spelt n_head_kv) KV heads; multi_query is then not read.
    ModelDescription const grouped = parseHuggingFaceConfig(R"({"model_type": "falcon", "num_hidden_layers": 2,
        "num_attention_heads": 128, "hidden_size": 8192, "new_decoder_architecture": true, "n_head_kv": 8})",
        "inline.json");
    EXPECT_EQ(headShapes(grouped), uniformHeads(2, 8, 64));
    // The same model under the names the current transformers file uses: still one KV head, not 71.
    ModelDescription const named = parseHuggingFaceConfig(R"({"model_type": "falcon", "num_hidden_layers": 32,
        "num_attention_heads": 71, "hidden_size": 4544, "multi_query": true, "new_decoder_architecture": false})",
        "inline.json");
    EXPECT_EQ(headShapes(named), uniformHeads(32, 1, 64));
    // multi_query left out: FalconConfig's default is true, so one KV head.
    ModelDescription const defaulted = parseHuggingFaceConfig(
        R"({"model_type": "falcon", "n_layer": 2, "n_head": 71, "n_embed": 4544})", "inline.json");
    EXPECT_EQ(headShapes(defaulted), uniformHeads(2, 1, 64));
    EXPECT_TRUE(firstNoteMentions(defaulted, "multi_query true"));
    // Both false: one KV head per attention head.
    ModelDescription const full = parseHuggingFaceConfig(R"({"model_type": "falcon", "n_layer": 2, "n_head": 16,
        "hidden_size": 1024, "multi_query": false, "new_decoder_architecture": false})",
        "inline.json");
    EXPECT_EQ(headShapes(full), uniformHeads(2, 16, 64));
    // An error names the field as the file spells it.
    EXPECT_NE(configErrorOf(R"({"model_type": "falcon", "n_layer": "32", "n_head": 71, "hidden_size": 4544})")
                  .find("field n_layer is \"32\""),
        std::string::npos);
}

TEST(FamilyConfigs, Gemma3WithoutHeadDimUsesTheFamilyDefault)
{
    Plan const plan = planFor({"--config", modelPath("gemma-3-12b-it.json")});
    // No head_dim: Gemma3TextConfig's 256, not hidden_size 3840 / 16 heads = 240.
    EXPECT_EQ(headShapes(plan.model), uniformHeads(48, 8, 256));
    // 48 x 2 x 8 x 256 x 2 (bfloat16) x 65,536 = 25,769,803,776 bytes.
    EXPECT_EQ(plan.layout.cacheBytes, 25769803776);
    EXPECT_TRUE(firstNoteMentions(plan.model, "text_config.head_dim 256"));
}

TEST(FamilyConfigs, Gemma3TextConfigTakesTheFamilyDefaults)
{
    Plan const plan = planFor({"--config", modelPath("gemma-3-4b-it.json")});
    // text_config gives 34 layers and sliding_window 1024 only: 8 heads, 4 KV heads and head_dim 256 are defaults.
    EXPECT_EQ(headShapes(plan.model), uniformHeads(34, 4, 256));
    std::vector<int32_t> expected(34, 1024);
    for (size_t i = 5; i < expected.size(); i += 6)
    {
        expected[i] = 0;
    }
    EXPECT_EQ(windows(plan.model), expected);
    // 34 x 2 x 4 x 256 x 2 (bfloat16) x 65,536 = 9,126,805,504 bytes.
    EXPECT_EQ(plan.layout.cacheBytes, 9126805504);
    EXPECT_TRUE(firstNoteMentions(plan.model, "text_config.num_key_value_heads 4"));
    EXPECT_TRUE(firstNoteMentions(plan.model, "Gemma3TextConfig"));
}

TEST(FamilyConfigs, Gemma3nSharedKVLayersKeepNoCache)
{
    Plan const plan = planFor({"--config", modelPath("gemma-3n-like.json")});
    // 35 layers, the last 15 reuse earlier layers' K and V: layers 0-19 keep a cache, 4 of them full (4, 9, 14, 19).
    EXPECT_EQ(plan.model.numModelLayers, 35);
    std::vector<int32_t> kept;
    for (int32_t i = 0; i < 20; ++i)
    {
        kept.push_back(i);
    }
    EXPECT_EQ(plan.model.attentionLayers, kept);
    EXPECT_EQ(headShapes(plan.model), uniformHeads(20, 2, 256));
    // 20 x 2 x 2 x 256 x 2 (bfloat16) x 65,536 = 2,684,354,560 bytes.
    EXPECT_EQ(plan.layout.cacheBytes, 2684354560);
    std::string const text = formatPlan(plan, false);
    EXPECT_NE(text.find("20 attention layers of 35"), std::string::npos) << text;
    EXPECT_NE(text.find("num_kv_shared_layers 15: layers 20-34 reuse"), std::string::npos) << text;

    EXPECT_NE(configErrorOf(R"({"model_type": "gemma3n_text", "num_hidden_layers": 2, "num_key_value_heads": 2,
        "head_dim": 64})")
                  .find("missing field num_kv_shared_layers"),
        std::string::npos);
    EXPECT_NE(configErrorOf(R"({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64,
        "num_kv_shared_layers": 2})")
                  .find("num_kv_shared_layers is 2"),
        std::string::npos);
}

TEST(FamilyConfigs, VisionCrossAttentionLayersAreNotTokenCaches)
{
    Plan const plan = planFor({"--config", modelPath("llama-3.2-11b-vision-like.json")});
    // 40 layers; 3, 8, ..., 38 are cross-attention layers: 32 token caches of 8 x (4096 / 32 = 128).
    EXPECT_EQ(plan.model.numModelLayers, 40);
    ASSERT_EQ(plan.model.attentionLayers.size(), 32u);
    for (int32_t const layer : plan.model.attentionLayers)
    {
        EXPECT_NE(layer % 5, 3) << layer;
    }
    EXPECT_EQ(headShapes(plan.model), uniformHeads(32, 8, 128));
    // 32 x 2 x 8 x 128 x 2 (bfloat16) x 65,536 = 8,589,934,592 bytes.
    EXPECT_EQ(plan.layout.cacheBytes, 8589934592);
    EXPECT_TRUE(someNoteMentions(plan.model, {"text_config.cross_attention_layers 3, 8, ..., 38", "image tokens"}));

    std::string const base = R"("num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 64)";
    EXPECT_NE(configErrorOf("{" + base + R"(, "model_type": "mllama"})").find("missing field cross_attention_layers"),
        std::string::npos);
    EXPECT_NE(configErrorOf("{" + base + R"(, "cross_attention_layers": [1, 4]})").find("cross_attention_layers[1]"),
        std::string::npos);
    EXPECT_NE(configErrorOf("{" + base + R"(, "cross_attention_layers": [1, 1]})").find("cross_attention_layers[1]"),
        std::string::npos);
}

TEST(FamilyConfigs, Gpt2NamesAreRead)
{
    Plan const plan = planFor({"--config", modelPath("gpt2.json")});
    // n_layer 12, n_head 12 (one KV head each), n_embd 768 / 12 = 64.
    EXPECT_EQ(headShapes(plan.model), uniformHeads(12, 12, 64));
    EXPECT_EQ(windows(plan.model), std::vector<int32_t>(12, 0));
    // 12 x 2 x 12 x 64 x 2 (float16: no torch_dtype) x 65,536 = 2,415,919,104 bytes.
    EXPECT_EQ(plan.layout.cacheBytes, 2415919104);
    // The other names belong to the family: without model_type gpt2, n_layer is not read.
    EXPECT_NE(configErrorOf(R"({"n_layer": 12, "n_head": 12, "n_embd": 768})").find("missing field num_hidden_layers"),
        std::string::npos);
}

} // namespace
} // namespace kvcache::plan
