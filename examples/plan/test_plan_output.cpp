// kvcache-plan's text and JSON output and the program's exit codes.
#include "test_support.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace kvcache::plan
{
namespace
{

using namespace test_support;

// ---- formatting and the program ----

TEST(Format, BytesAndSizes)
{
    EXPECT_EQ(formatBytes(0), "0");
    EXPECT_EQ(formatBytes(999), "999");
    EXPECT_EQ(formatBytes(1000), "1,000");
    EXPECT_EQ(formatBytes(8589934592), "8,589,934,592");
    EXPECT_EQ(formatSize(1023), "1023 B");
    EXPECT_EQ(formatSize(1024), "1.00 KiB");
    EXPECT_EQ(formatSize(1610612736), "1.50 GiB");
    EXPECT_EQ(formatSize(8589934592), "8.00 GiB");
}

TEST(Format, IdenticalLayersShareARowUnlessPerLayer)
{
    std::string const grouped = formatPlan(planFor({}), false);
    EXPECT_NE(grouped.find("\n  0-31  "), std::string::npos) << grouped;
    EXPECT_EQ(grouped.find("\n  31  "), std::string::npos) << grouped;

    std::string const perLayer = formatPlan(planFor({}), true);
    EXPECT_EQ(perLayer.find("0-31"), std::string::npos) << perLayer;
    for (int layer : {0, 17, 31})
    {
        EXPECT_NE(perLayer.find("\n  " + std::to_string(layer) + " "), std::string::npos) << layer;
    }
}

TEST(Format, ShowsShapesAndModelLayers)
{
    std::string const text = formatPlan(planFor({"--config", modelPath("qwen3-next-like.json")}), false);
    EXPECT_NE(text.find("[2, 8, 8192, 2, 256]"), std::string::npos) << text;  // slot view
    EXPECT_NE(text.find("[2, 512, 128, 2, 256]"), std::string::npos) << text; // pool view
    EXPECT_NE(text.find("12 attention layers of 48"), std::string::npos) << text;
    EXPECT_NE(text.find("3, 7, ..., 47"), std::string::npos) << text;
}

TEST(Format, ShowsGroupsAndTheSaving)
{
    std::string const text = formatPlan(steppedPlan("gemma-3-27b-it.json"), false);
    EXPECT_NE(text.find("52 sliding (window 1024), 10 full"), std::string::npos) << text;
    EXPECT_NE(text.find("sliding_window_pattern"), std::string::npos) << text; // how the config was read
    EXPECT_NE(text.find("2 page groups"), std::string::npos) << text;
    EXPECT_NE(text.find("0-61 except 5, 11, ..., 59"), std::string::npos) << text; // the sliding layers
    EXPECT_NE(text.find("[2, 8, 3200, 16, 128]"), std::string::npos) << text;      // slot view: 25 pages of 128
    EXPECT_NE(text.find("[2, 200, 128, 16, 128]"), std::string::npos) << text;     // pool view
    EXPECT_NE(text.find("total     16,273,899,520 bytes (15.16 GiB)"), std::string::npos) << text;
    // 33,285,996,544 - 16,273,899,520 = 17,012,097,024, 51.1% of the full-length plan.
    EXPECT_NE(text.find("saving    17,012,097,024 bytes (15.84 GiB, 51.1%)"), std::string::npos) << text;
}

TEST(Format, StepZeroSaysWhat2048WouldSave)
{
    std::string const text = formatPlan(planFor({"--config", modelPath("gpt-oss-20b.json")}), false);
    EXPECT_NE(text.find("--step-tokens 0"), std::string::npos) << text;
    // 3,221,225,472 - 2,063,597,568 = 1,157,627,904, 35.9%.
    EXPECT_NE(text.find("--step-tokens 2048"), std::string::npos) << text;
    EXPECT_NE(text.find("saving 1,157,627,904 bytes"), std::string::npos) << text;
}

TEST(Format, LatentLayersAreKOnly)
{
    std::string const text = formatPlan(steppedPlan("deepseek-v3.json"), false);
    EXPECT_NE(text.find("1 x 576 latent"), std::string::npos) << text;
    EXPECT_NE(text.find("[1, 8, 8192, 1, 576]"), std::string::npos) << text; // slot view: one half
    EXPECT_NE(text.find("[1, 512, 128, 1, 576]"), std::string::npos) << text;
    EXPECT_NE(text.find("kv_lora_rank 512 + qk_rope_head_dim 64"), std::string::npos) << text;
    EXPECT_NE(text.find("total     4,605,345,792 bytes (4.29 GiB)"), std::string::npos) << text;
}

TEST(Format, BudgetWithSeveralGroupsGivesSequencesAndPagesPerGroup)
{
    std::string const text = formatPlan(
        planFor({"--config", modelPath("gpt-oss-20b.json"), "--step-tokens", "2048", "--budget", "10GiB"}), false);
    EXPECT_NE(
        text.find("41 full-length sequences in every group: group 0 2,624 pages, group 1 738 pages"), std::string::npos)
        << text;
}

TEST(Format, JsonHasEveryField)
{
    Plan const plan = planFor({"--config", modelPath("gpt-oss-20b.json"), "--step-tokens", "2048"});
    nlohmann::json const json = nlohmann::json::parse(formatPlanJson(plan));
    EXPECT_EQ(json.at("tokensPerPage"), 128);
    EXPECT_EQ(json.at("maxBatchSize"), 8);
    EXPECT_EQ(json.at("maxSequenceLength"), 8192);
    EXPECT_EQ(json.at("maxTokensPerStep"), 2048);
    EXPECT_EQ(json.at("dtype"), "bfloat16");
    EXPECT_EQ(json.at("totalBytes"), 2063597568);
    EXPECT_EQ(json.at("quantization"), "none");
    EXPECT_EQ(json.at("scaleBytes"), 0);
    EXPECT_FALSE(json.contains("budget"));
    ASSERT_EQ(json.at("groups").size(), 2u);
    nlohmann::json const& window = json.at("groups")[1];
    EXPECT_EQ(window.at("index"), 1);
    EXPECT_EQ(window.at("slidingWindow"), 128);
    EXPECT_EQ(window.at("pagesPerSequence"), 18);
    EXPECT_EQ(window.at("numPages"), 144);
    EXPECT_EQ(window.at("layers"), nlohmann::json({0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22}));
    ASSERT_EQ(json.at("layers").size(), 24u);
    nlohmann::json const& layer = json.at("layers")[0];
    EXPECT_EQ(layer, nlohmann::json::parse(R"({"index": 0, "kind": "kv", "numKVHeads": 8, "headDim": 64,
        "slidingWindow": 128, "group": 1, "slotTokens": 2304, "numPages": 144, "bytes": 37748736, "scaleBytes": 0,
        "bytesPerTokenHeadHalf": 128})"));
    EXPECT_TRUE(layer.at("bytes").is_number_integer());
    EXPECT_EQ(json.at("layers")[1].at("slotTokens"), 8192); // 64 pages * 128

    nlohmann::json const latent = nlohmann::json::parse(formatPlanJson(steppedPlan("deepseek-v3.json")));
    EXPECT_EQ(latent.at("layers")[60].at("kind"), "latent");
    EXPECT_EQ(latent.at("layers")[60].at("numKVHeads"), 1);
    EXPECT_EQ(latent.at("layers")[60].at("headDim"), 576);

    nlohmann::json const budget = nlohmann::json::parse(formatPlanJson(
        planFor({"--config", modelPath("gpt-oss-20b.json"), "--step-tokens", "2048", "--budget", "10GiB"})));
    EXPECT_EQ(budget.at("budget"), nlohmann::json::parse(R"({"bytes": 10737418240, "sequences": 41,
        "numPagesPerGroup": [2624, 738], "cacheBytes": 10575937536})"));
}

TEST(Format, QuantizedFormatsNameTheirScalesInTextAndJson)
{
    // The issue's example, NVFP4: 32 layers; per layer 2 * 4096 * 128 * 8 = 2^23 entries of 64 data bytes
    // (536,870,912) and 8 scale bytes (67,108,864); scales in all 32 * 67,108,864 = 2,147,483,648 bytes of
    // 2^28 * 72 = 19,327,352,832 (11.1%).
    Plan const nvfp4 = planFor({"--kv-dtype", "nvfp4", "--batch", "64"});
    nlohmann::json const json = nlohmann::json::parse(formatPlanJson(nvfp4));
    EXPECT_EQ(json.at("dtype"), "uint8");
    EXPECT_EQ(json.at("quantization"), "nvfp4");
    EXPECT_EQ(json.at("totalBytes"), 19327352832);
    EXPECT_EQ(json.at("scaleBytes"), 2147483648);
    nlohmann::json const& layer = json.at("layers")[31];
    EXPECT_EQ(layer.at("bytes"), 536870912);
    EXPECT_EQ(layer.at("scaleBytes"), 67108864);
    EXPECT_EQ(layer.at("bytesPerTokenHeadHalf"), 72); // D/2 + D/16

    std::string const text = formatPlan(nvfp4, false);
    EXPECT_NE(text.find("  quant     nvfp4: "), std::string::npos) << text;
    EXPECT_NE(text.find("72 bytes a token, head and half"), std::string::npos) << text;
    EXPECT_NE(text.find("[2, 4096, 128, 8, 64]"), std::string::npos) << text; // pool view of D / 2 bytes
    EXPECT_NE(text.find("19,327,352,832 bytes (18.00 GiB) in 32 layer buffers and 32 scale pools"), std::string::npos)
        << text;
    EXPECT_NE(text.find("scales    2,147,483,648 bytes (2.00 GiB) of the total: 11.1%"), std::string::npos) << text;
    EXPECT_NE(text.find("603,979,776"), std::string::npos) << text; // a layer's row: 536,870,912 + 67,108,864

    // Per token-head: 2^28 * 132 = 35,433,480,192 bytes; scales 2^28 * 4 = 1,073,741,824.
    nlohmann::json const tokenHead =
        nlohmann::json::parse(formatPlanJson(planFor({"--kv-dtype", "fp8-token-head", "--batch", "64"})));
    EXPECT_EQ(tokenHead.at("quantization"), "fp8_per_token_head");
    EXPECT_EQ(tokenHead.at("totalBytes"), 35433480192);
    EXPECT_EQ(tokenHead.at("scaleBytes"), 1073741824);
    EXPECT_EQ(tokenHead.at("layers")[0].at("bytesPerTokenHeadHalf"), 132); // D + 4

    // Per tensor: scales live on the host, no scale bytes; D bytes an entry.
    Plan const perTensor = planFor({"--kv-dtype", "fp8"});
    std::string const perTensorText = formatPlan(perTensor, false);
    EXPECT_NE(perTensorText.find("  quant     fp8_per_tensor: "), std::string::npos) << perTensorText;
    EXPECT_EQ(perTensorText.find("scale pools"), std::string::npos) << perTensorText;
    EXPECT_EQ(nlohmann::json::parse(formatPlanJson(perTensor)).at("scaleBytes"), 0);

    // Unquantized plans print no quantization line.
    EXPECT_EQ(formatPlan(planFor({"--kv-dtype", "bf16"}), false).find("quant "), std::string::npos);
}

TEST(Program, DefaultPrintsTotals)
{
    ProgramResult const result = runProgram({"--budget", "40GiB"});
    EXPECT_EQ(result.status, 0);
    EXPECT_TRUE(result.err.empty()) << result.err;
    EXPECT_NE(result.out.find("8,589,934,592 bytes (8.00 GiB)"), std::string::npos) << result.out;
    EXPECT_NE(result.out.find("2,560 pages"), std::string::npos) << result.out;
}

TEST(Program, HelpListsFlagsAndConfigFields)
{
    ProgramResult const result = runProgram({"--help"});
    EXPECT_EQ(result.status, 0);
    for (char const* text : {"--batch", "--seq-len", "--dtype", "--page-size", "--pages", "--budget", "--layers",
             "--kv-heads", "--head-dim", "--layer-heads", "--config", "--per-layer", "--step-tokens", "--json", "--tp",
             "num_key_value_heads", "layer_types", "attn_layer_period", "text_config", "torch_dtype", "sliding_window",
             "sliding_window_pattern", "use_sliding_window", "max_window_layers", "attention_chunk_size",
             "no_rope_layers", "kv_lora_rank", "qk_rope_head_dim", "num_kv_shared_layers", "cross_attention_layers",
             "multi_query", "n_embd", "Gemma3TextConfig", "at most 65536"})
    {
        EXPECT_NE(result.out.find(text), std::string::npos) << text;
    }
}

TEST(Program, BadInputExitsWithTwo)
{
    for (std::vector<std::string> const& args : std::vector<std::vector<std::string>>{{"--batch", "8x"},
             {"--config", modelPath("no-such-model.json")}, {"--page-size", "100"}, {"--pages", "3"}})
    {
        ProgramResult const result = runProgram(args);
        EXPECT_EQ(result.status, kEXIT_BAD_INPUT) << args.front();
        EXPECT_TRUE(result.out.empty()) << result.out;
        EXPECT_NE(result.err.find("kvcache-plan: "), std::string::npos) << result.err;
        EXPECT_NE(result.err.find(args.back()), std::string::npos) << result.err;
    }
}

TEST(Program, StepTokensShowsWindowedSizes)
{
    // The issue's check: gpt-oss-20b and Gemma-3-27B at their windowed size, DeepSeek-V3 at 576 values x 1 head, K
    // only.
    std::vector<std::pair<std::string, std::string>> const cases = {
        {"gpt-oss-20b.json", "total     2,063,597,568 bytes (1.92 GiB) in 24 layer buffers"},
        {"gemma-3-27b-it.json", "total     16,273,899,520 bytes (15.16 GiB) in 62 layer buffers"},
        {"deepseek-v3.json", "total     4,605,345,792 bytes (4.29 GiB) in 61 layer buffers"},
    };
    for (auto const& [fixture, total] : cases)
    {
        ProgramResult const result = runProgram({"--config", modelPath(fixture), "--step-tokens", "2048"});
        EXPECT_EQ(result.status, 0) << result.err;
        EXPECT_NE(result.out.find(total), std::string::npos) << result.out;
    }
    ProgramResult const json = runProgram({"--config", modelPath("deepseek-v3.json"), "--json"});
    EXPECT_EQ(json.status, 0) << json.err;
    EXPECT_EQ(nlohmann::json::parse(json.out).at("totalBytes"), 4605345792);
}

TEST(Program, UnreadableConfigsExitWithTwoNamingTheField)
{
    std::vector<std::pair<std::string, std::string>> const cases = {
        {R"({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64,
            "layer_types": ["full_attention", "hybrid_attention"]})",
            "layer_types[1]"},
        {R"({"num_hidden_layers": 61, "num_key_value_heads": 128, "hidden_size": 7168, "num_attention_heads": 128,
            "kv_lora_rank": 512})",
            "qk_rope_head_dim"},
    };
    for (size_t i = 0; i < cases.size(); ++i)
    {
        std::string const path = writeTempFile("kvcache-plan-bad-" + std::to_string(i) + ".json", cases[i].first);
        ProgramResult const result = runProgram({"--config", path});
        EXPECT_EQ(result.status, kEXIT_BAD_INPUT) << result.out;
        EXPECT_TRUE(result.out.empty()) << result.out;
        EXPECT_NE(result.err.find(path), std::string::npos) << result.err;
        EXPECT_NE(result.err.find(cases[i].second), std::string::npos) << result.err;
    }
}

} // namespace
} // namespace kvcache::plan
