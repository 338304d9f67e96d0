// The config reader on the published model configs in models/, one family each.
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

// ---- config.json fixtures ----

TEST(HuggingFaceConfig, LlamaFixtureIsUniform)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("llama-3.1-8b-like.json"));
    EXPECT_EQ(model.numModelLayers, 32);
    // No head_dim in the file: hidden_size 4096 / 32 attention heads = 128.
    EXPECT_EQ(headShapes(model), uniformHeads(32, 8, 128));
    ASSERT_EQ(model.attentionLayers.size(), 32u);
    EXPECT_EQ(model.attentionLayers.front(), 0);
    EXPECT_EQ(model.attentionLayers.back(), 31);
    EXPECT_EQ(model.dataTypeName, "bfloat16");
    EXPECT_NE(model.name.find("LlamaForCausalLM"), std::string::npos);
}

TEST(HuggingFaceConfig, OpenElmFixtureHasPerLayerHeads)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("openelm-like.json"));
    EXPECT_EQ(model.numModelLayers, 6);
    EXPECT_EQ(model.attentionLayers, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
    EXPECT_EQ(headShapes(model),
        (std::vector<std::pair<int32_t, int32_t>>{{3, 64}, {3, 64}, {4, 64}, {4, 64}, {5, 64}, {5, 64}}));
    EXPECT_EQ(model.dataTypeName, "float32");
}

TEST(HuggingFaceConfig, QwenNextFixtureKeepsOnlyFullAttentionLayers)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("qwen3-next-like.json"));
    EXPECT_EQ(model.numModelLayers, 48);
    // Every fourth layer is full_attention; the other three are linear_attention.
    EXPECT_EQ(model.attentionLayers, (std::vector<int32_t>{3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47}));
    EXPECT_EQ(headShapes(model), uniformHeads(12, 2, 256));
    EXPECT_EQ(model.dataTypeName, "bfloat16");
}

TEST(HuggingFaceConfig, JambaFixtureUsesPeriodAndOffset)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("jamba-like.json"));
    EXPECT_EQ(model.numModelLayers, 32);
    // Layer i is attention when i % 8 == 4.
    EXPECT_EQ(model.attentionLayers, (std::vector<int32_t>{4, 12, 20, 28}));
    EXPECT_EQ(headShapes(model), uniformHeads(4, 8, 128));
}

TEST(HuggingFaceConfig, TextConfigAndLayerKinds)
{
    ModelDescription const model = parseHuggingFaceConfig(R"({
        "architectures": ["SomeVisionModel"], "torch_dtype": "float16",
        "text_config": {"num_hidden_layers": 6, "num_key_value_heads": 2, "head_dim": 64, "sliding_window": 512,
            "attention_chunk_size": 256,
            "layer_types": ["sliding_attention", "full_attention", "mamba", "attention", "conv",
                "chunked_attention"]}})",
        "inline.json");
    EXPECT_EQ(model.numModelLayers, 6);
    EXPECT_EQ(model.attentionLayers, (std::vector<int32_t>{0, 1, 3, 5}));
    EXPECT_EQ(headShapes(model), uniformHeads(4, 2, 64));
    // A chunked layer is planned as a window of its chunk size.
    EXPECT_EQ(windows(model), (std::vector<int32_t>{512, 0, 0, 256}));
    EXPECT_EQ(model.attentionKinds,
        (std::vector<AttentionKind>{
            AttentionKind::kSLIDING, AttentionKind::kFULL, AttentionKind::kFULL, AttentionKind::kCHUNKED}));
    EXPECT_EQ(model.dataTypeName, "float16"); // from the top level, as text_config has none
}

TEST(HuggingFaceConfig, FallbacksForKVHeadsAndDtype)
{
    // No num_key_value_heads: every attention head has its own K and V.
    ModelDescription const model = parseHuggingFaceConfig(
        R"({"num_hidden_layers": 2, "num_attention_heads": 12, "hidden_size": 768, "dtype": "float32",
            "text_config": null})",
        "inline.json");
    EXPECT_EQ(headShapes(model), uniformHeads(2, 12, 64)); // 768 / 12
    EXPECT_EQ(model.dataTypeName, "float32");
}

// ---- sliding windows, chunked attention and latent layers in config.json ----

TEST(HuggingFaceConfig, GptOssFixtureAlternatesSlidingAndFull)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("gpt-oss-20b.json"));
    EXPECT_EQ(model.numModelLayers, 24);
    EXPECT_EQ(headShapes(model), uniformHeads(24, 8, 64));
    // layer_types: sliding_attention, full_attention, ... from layer 0; sliding_window 128.
    EXPECT_EQ(windows(model), alternating<int32_t>(24, 128, 0));
    EXPECT_EQ(model.attentionKinds, alternating(24, AttentionKind::kSLIDING, AttentionKind::kFULL));
    EXPECT_EQ(model.dataTypeName, "bfloat16");
}

TEST(HuggingFaceConfig, Gemma2FixtureWithoutLayerTypesSlidesOnEvenLayers)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("gemma-2-9b-it.json"));
    EXPECT_EQ(model.numModelLayers, 42);
    EXPECT_EQ(headShapes(model), uniformHeads(42, 8, 256));
    EXPECT_EQ(windows(model), alternating<int32_t>(42, 4096, 0));
    EXPECT_TRUE(firstNoteMentions(model, "Gemma-2"));
}

TEST(HuggingFaceConfig, Gemma3FixtureIsGlobalEverySixthLayer)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("gemma-3-27b-it.json"));
    EXPECT_EQ(model.numModelLayers, 62);
    EXPECT_EQ(headShapes(model), uniformHeads(62, 16, 128));
    // The published file has no sliding_window_pattern: Gemma-3's default 6, so layers 5, 11, ..., 59 are full.
    std::vector<int32_t> expected(62, 1024);
    for (size_t i = 5; i < expected.size(); i += 6)
    {
        expected[i] = 0;
    }
    EXPECT_EQ(windows(model), expected);
    EXPECT_EQ(std::count(expected.begin(), expected.end(), 0), 10);
    EXPECT_EQ(model.dataTypeName, "bfloat16"); // top level; text_config has none
}

TEST(HuggingFaceConfig, MistralFixtureSlidesOnEveryLayer)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("mistral-7b-v0.1.json"));
    EXPECT_EQ(headShapes(model), uniformHeads(32, 8, 128)); // 4096 / 32 heads
    EXPECT_EQ(windows(model), std::vector<int32_t>(32, 4096));
}

TEST(HuggingFaceConfig, QwenFixtureWithSlidingOffKeepsFullCaches)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("qwen2.5-7b.json"));
    EXPECT_EQ(headShapes(model), uniformHeads(28, 4, 128)); // 3584 / 28 heads
    // sliding_window 131072 is in the file, but use_sliding_window is false.
    EXPECT_EQ(windows(model), std::vector<int32_t>(28, 0));
    EXPECT_TRUE(firstNoteMentions(model, "use_sliding_window is false"));
}

TEST(HuggingFaceConfig, DeepSeekFixtureIsOneLatentPerLayer)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("deepseek-v3.json"));
    EXPECT_EQ(model.numModelLayers, 61);
    // kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values, one "head"; not 128 KV heads x 56 (7168 / 128).
    EXPECT_EQ(headShapes(model), uniformHeads(61, 1, 576));
    for (rt::KVLayerConfig const& layer : model.layers)
    {
        EXPECT_EQ(layer.kind, rt::KVLayerKind::kLATENT);
        EXPECT_EQ(layer.slidingWindow, 0);
    }
}

TEST(HuggingFaceConfig, Llama4FixtureChunksThreeOfEveryFourLayers)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("llama-4-scout-17b-16e.json"));
    EXPECT_EQ(model.numModelLayers, 48);
    EXPECT_EQ(headShapes(model), uniformHeads(48, 8, 128));
    // no_rope_layers is empty: layers 3, 7, ..., 47 are full (NoPE), the others chunked by 8192.
    std::vector<int32_t> expected(48, 8192);
    std::vector<AttentionKind> kinds(48, AttentionKind::kCHUNKED);
    for (size_t i = 3; i < expected.size(); i += 4)
    {
        expected[i] = 0;
        kinds[i] = AttentionKind::kFULL;
    }
    EXPECT_EQ(windows(model), expected);
    EXPECT_EQ(model.attentionKinds, kinds);
}

} // namespace
} // namespace kvcache::plan
