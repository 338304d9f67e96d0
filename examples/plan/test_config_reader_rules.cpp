// The config reader's layer rules on inline configs: patterns, defaults and precedence.
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

TEST(HuggingFaceConfig, LayerPatternRules)
{
    // Cohere2 style: every 4th layer is full.
    ModelDescription const cohere = parseHuggingFaceConfig(R"({"model_type": "cohere2", "num_hidden_layers": 8,
        "num_key_value_heads": 8, "head_dim": 128, "sliding_window": 4096, "sliding_window_pattern": 4})",
        "inline.json");
    EXPECT_EQ(windows(cohere), (std::vector<int32_t>{4096, 4096, 4096, 0, 4096, 4096, 4096, 0}));

    // Newer transformers save the pattern as _sliding_window_pattern.
    ModelDescription const underscored = parseHuggingFaceConfig(R"({"num_hidden_layers": 4, "num_key_value_heads": 1,
        "head_dim": 64, "sliding_window": 512, "_sliding_window_pattern": 2})",
        "inline.json");
    EXPECT_EQ(windows(underscored), (std::vector<int32_t>{512, 0, 512, 0}));

    // layer_types wins over a pattern.
    ModelDescription const typed = parseHuggingFaceConfig(R"({"num_hidden_layers": 3, "num_key_value_heads": 1,
        "head_dim": 64, "sliding_window": 512, "sliding_window_pattern": 2,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention"]})",
        "inline.json");
    EXPECT_EQ(windows(typed), (std::vector<int32_t>{0, 512, 512}));

    // use_sliding_window true: layers from max_window_layers on slide.
    ModelDescription const qwen = parseHuggingFaceConfig(R"({"model_type": "qwen2", "num_hidden_layers": 4,
        "num_key_value_heads": 2, "head_dim": 64, "sliding_window": 1000, "use_sliding_window": true,
        "max_window_layers": 2})",
        "inline.json");
    EXPECT_EQ(windows(qwen), (std::vector<int32_t>{0, 0, 1000, 1000}));

    // use_sliding_window false turns sliding_attention layers into full ones, whatever rule made them slide, and
    // then they need no sliding_window.
    ModelDescription const off = parseHuggingFaceConfig(R"({"num_hidden_layers": 2, "num_key_value_heads": 2,
        "head_dim": 64, "sliding_window": 1000, "use_sliding_window": false,
        "layer_types": ["sliding_attention", "full_attention"]})",
        "inline.json");
    EXPECT_EQ(windows(off), (std::vector<int32_t>{0, 0}));
    ModelDescription const offPattern = parseHuggingFaceConfig(R"({"num_hidden_layers": 2, "num_key_value_heads": 2,
        "head_dim": 64, "sliding_window": 1000, "sliding_window_pattern": 2, "use_sliding_window": false})",
        "inline.json");
    EXPECT_EQ(windows(offPattern), (std::vector<int32_t>{0, 0}));
    ModelDescription const offNoWindow = parseHuggingFaceConfig(R"({"num_hidden_layers": 2, "num_key_value_heads": 2,
        "head_dim": 64, "sliding_window": null, "use_sliding_window": false,
        "layer_types": ["sliding_attention", "full_attention"]})",
        "inline.json");
    EXPECT_EQ(windows(offNoWindow), (std::vector<int32_t>{0, 0}));

    // sliding_window null (Mistral-7B-v0.2 and later): full attention.
    ModelDescription const none = parseHuggingFaceConfig(R"({"num_hidden_layers": 2, "num_key_value_heads": 2,
        "head_dim": 64, "sliding_window": null})",
        "inline.json");
    EXPECT_EQ(windows(none), (std::vector<int32_t>{0, 0}));

    // An explicit no_rope_layers list: 1 = chunked, 0 = full.
    ModelDescription const llama4 = parseHuggingFaceConfig(R"({"text_config": {"model_type": "llama4_text",
        "num_hidden_layers": 4, "num_key_value_heads": 8, "head_dim": 128, "attention_chunk_size": 1024,
        "no_rope_layers": [1, 0, 0, 1]}})",
        "inline.json");
    EXPECT_EQ(windows(llama4), (std::vector<int32_t>{1024, 0, 0, 1024}));

    // Jamba's attention layers slide when the config says sliding_window and nothing else.
    ModelDescription const period = parseHuggingFaceConfig(R"({"num_hidden_layers": 4, "num_key_value_heads": 2,
        "head_dim": 64, "attn_layer_period": 2, "attn_layer_offset": 1, "sliding_window": 300})",
        "inline.json");
    EXPECT_EQ(period.attentionLayers, (std::vector<int32_t>{1, 3}));
    EXPECT_EQ(windows(period), (std::vector<int32_t>{300, 300}));

    // A latent layer can slide too.
    ModelDescription const latentWindow = parseHuggingFaceConfig(R"({"num_hidden_layers": 2, "kv_lora_rank": 256,
        "qk_rope_head_dim": 32, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 64})",
        "inline.json");
    EXPECT_EQ(headShapes(latentWindow), (std::vector<std::pair<int32_t, int32_t>>(2, {1, 288})));
    EXPECT_EQ(windows(latentWindow), (std::vector<int32_t>{64, 0}));
}

} // namespace
} // namespace kvcache::plan
