#include "model_config.h"
#include "plan.h"
#include "plan_options.h"

#include "kvcache/errors.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace kvcache::plan
{
namespace
{

std::string modelPath(std::string const& file)
{
    return std::string(KVCACHE_PLAN_MODELS_DIR) + "/" + file;
}

//! Head shapes as (H, D) pairs, so a whole model compares in one assertion.
std::vector<std::pair<int32_t, int32_t>> headShapes(ModelDescription const& model)
{
    std::vector<std::pair<int32_t, int32_t>> shapes;
    for (rt::KVLayerConfig const& layer : model.layers)
    {
        shapes.emplace_back(layer.numKVHeads, layer.headDim);
    }
    return shapes;
}

//! The sliding window of each cache layer (0 for full attention).
std::vector<int32_t> windows(ModelDescription const& model)
{
    std::vector<int32_t> values;
    for (rt::KVLayerConfig const& layer : model.layers)
    {
        values.push_back(layer.slidingWindow);
    }
    return values;
}

//! `count` entries alternating `even`, `odd`, starting with `even`.
template <typename T>
std::vector<T> alternating(size_t count, T even, T odd)
{
    std::vector<T> values;
    for (size_t i = 0; i < count; ++i)
    {
        values.push_back(i % 2 == 0 ? even : odd);
    }
    return values;
}

//! pagesPerSequence and numPages of each page group, as pairs.
std::vector<std::pair<int32_t, int32_t>> groupPages(Plan const& plan)
{
    std::vector<std::pair<int32_t, int32_t>> pages;
    for (rt::KVPageGroupLayout const& group : plan.layout.groups)
    {
        pages.emplace_back(group.pagesPerSequence, group.numPages);
    }
    return pages;
}

std::vector<int32_t> groupWindows(Plan const& plan)
{
    std::vector<int32_t> values;
    for (rt::KVPageGroupLayout const& group : plan.layout.groups)
    {
        values.push_back(group.slidingWindow);
    }
    return values;
}

std::vector<int64_t> layerBytes(Plan const& plan)
{
    std::vector<int64_t> bytes;
    for (rt::KVLayerLayout const& layer : plan.layout.layers)
    {
        bytes.push_back(layer.layerBytes);
    }
    return bytes;
}

Plan planFor(std::vector<std::string> const& args)
{
    PlanOptions const options = parseArguments(args);
    return makePlan(resolveModel(options), options);
}

struct ProgramResult
{
    int status;
    std::string out;
    std::string err;
};

ProgramResult runProgram(std::vector<std::string> const& args)
{
    std::ostringstream out;
    std::ostringstream err;
    int const status = runPlanProgram(args, out, err);
    return {status, out.str(), err.str()};
}

//! Returns the message of the UsageError that parsing `args` throws, or fails the test.
std::string usageErrorOf(std::vector<std::string> const& args)
{
    try
    {
        parseArguments(args);
    }
    catch (UsageError const& error)
    {
        return error.what();
    }
    ADD_FAILURE() << "no UsageError for the arguments";
    return {};
}

//! Writes `text` to a file of that name in the test's temporary folder and returns its path.
std::string writeTempFile(std::string const& name, std::string const& text)
{
    std::string const path = ::testing::TempDir() + name;
    std::ofstream(path) << text;
    return path;
}

//! The fixtures at batch 8, 8192 tokens, 128 tokens per page and 2048 tokens a step.
Plan steppedPlan(std::string const& fixture)
{
    return planFor({"--config", modelPath(fixture), "--batch", "8", "--seq-len", "8192", "--page-size", "128",
        "--step-tokens", "2048"});
}

//! Returns the message of the ModelConfigError that parsing `json` throws, or fails the test.
std::string configErrorOf(std::string const& json)
{
    try
    {
        parseHuggingFaceConfig(json, "inline.json");
    }
    catch (ModelConfigError const& error)
    {
        return error.what();
    }
    ADD_FAILURE() << "no ModelConfigError for " << json;
    return {};
}

// ---- byte sizes ----

TEST(ParseByteSize, BinaryUnitsArePowersOf1024)
{
    EXPECT_EQ(parseByteSize("--budget", "2KiB"), 2048);          // 2 * 1024
    EXPECT_EQ(parseByteSize("--budget", "512MiB"), 536870912);   // 512 * 1,048,576
    EXPECT_EQ(parseByteSize("--budget", "40GiB"), 42949672960);  // 40 * 1,073,741,824
    EXPECT_EQ(parseByteSize("--budget", "1TiB"), 1099511627776); // 1024^4
    EXPECT_EQ(parseByteSize("--budget", "1gib"), 1073741824);    // units ignore case
    EXPECT_EQ(parseByteSize("--budget", "3 MiB"), 3145728);      // a space before the unit is allowed
}

TEST(ParseByteSize, DecimalUnitsArePowersOf1000)
{
    EXPECT_EQ(parseByteSize("--budget", "7KB"), 7000);
    EXPECT_EQ(parseByteSize("--budget", "3MB"), 3000000);
    EXPECT_EQ(parseByteSize("--budget", "80GB"), 80000000000);
    EXPECT_EQ(parseByteSize("--budget", "2.5TB"), 2500000000000);
}

TEST(ParseByteSize, PlainBytesAndFractions)
{
    EXPECT_EQ(parseByteSize("--budget", "123456"), 123456);
    EXPECT_EQ(parseByteSize("--budget", "10B"), 10);
    EXPECT_EQ(parseByteSize("--budget", "1.5GiB"), 1610612736); // 1,073,741,824 + 536,870,912
    EXPECT_EQ(parseByteSize("--budget", "0.5KiB"), 512);
    EXPECT_EQ(parseByteSize("--budget", "0.001KiB"), 1); // 1.024 bytes rounds down
    EXPECT_EQ(parseByteSize("--budget", "1.5B"), 1);
}

TEST(ParseByteSize, LargestSizeFitsAndOneMoreOverflows)
{
    // 8,388,607 * 2^40 = 2^63 - 2^40 fits int64; 8,388,608 * 2^40 = 2^63 does not.
    EXPECT_EQ(parseByteSize("--budget", "8388607TiB"), 9223370937343148032);
    EXPECT_THROW(parseByteSize("--budget", "8388608TiB"), UsageError);
}

TEST(ParseByteSize, BadSizesNameTheFlagAndTheValue)
{
    for (char const* text :
        {"", "GiB", "-1GiB", "12XB", "1.2.3GiB", "1e3", "1.", ".5GiB", "99999999999TiB", "1.1234567GiB", "5 G"})
    {
        try
        {
            parseByteSize("--budget", text);
            ADD_FAILURE() << "accepted \"" << text << "\"";
        }
        catch (UsageError const& error)
        {
            std::string const message = error.what();
            EXPECT_NE(message.find("--budget"), std::string::npos) << message;
            EXPECT_NE(message.find(std::string("\"") + text + "\""), std::string::npos) << message;
        }
    }
}

// ---- flags ----

TEST(ParseArguments, DefaultsWithoutFlags)
{
    PlanOptions const options = parseArguments({});
    EXPECT_EQ(options.maxBatchSize, 8);
    EXPECT_EQ(options.maxSequenceLength, 8192);
    EXPECT_EQ(options.tokensPerPage, 128);
    EXPECT_EQ(options.numPages, 0);
    EXPECT_EQ(options.maxTokensPerStep, 0);
    EXPECT_FALSE(options.json);
    EXPECT_FALSE(options.dataType.has_value());
    EXPECT_FALSE(options.budgetBytes.has_value());
    EXPECT_FALSE(options.perLayer);
    EXPECT_FALSE(options.help);
    EXPECT_TRUE(options.configPath.empty());
    EXPECT_TRUE(options.layerHeads.empty());
}

TEST(ParseArguments, EveryCacheFlagInBothForms)
{
    PlanOptions const options = parseArguments({"--batch", "4", "--seq-len=1000", "--dtype", "fp8_e5m2",
        "--page-size=64", "--pages", "100", "--budget=2GiB", "--per-layer", "--step-tokens", "512", "--json"});
    EXPECT_EQ(options.maxBatchSize, 4);
    EXPECT_EQ(options.maxSequenceLength, 1000);
    EXPECT_EQ(options.dataType, rt::DataType::kFP8_E5M2);
    EXPECT_EQ(options.tokensPerPage, 64);
    EXPECT_EQ(options.numPages, 100);
    EXPECT_EQ(options.budgetBytes, 2147483648); // 2 * 1,073,741,824
    EXPECT_TRUE(options.perLayer);
    EXPECT_EQ(options.maxTokensPerStep, 512);
    EXPECT_TRUE(options.json);
    EXPECT_EQ(parseArguments({"--step-tokens=0"}).maxTokensPerStep, 0);
}

TEST(ParseArguments, EveryDtypeName)
{
    std::vector<std::pair<char const*, rt::DataType>> const names = {{"float32", rt::DataType::kFLOAT},
        {"float16", rt::DataType::kHALF}, {"bfloat16", rt::DataType::kBF16}, {"fp8_e4m3", rt::DataType::kFP8_E4M3},
        {"fp8_e5m2", rt::DataType::kFP8_E5M2}, {"int8", rt::DataType::kINT8}, {"uint8", rt::DataType::kUINT8}};
    for (auto const& [name, type] : names)
    {
        EXPECT_EQ(parseArguments({"--dtype", name}).dataType, type) << name;
    }
}

TEST(ParseArguments, ModelFlags)
{
    PlanOptions const uniform = parseArguments({"--layers", "80", "--kv-heads", "4", "--head-dim=96"});
    EXPECT_EQ(uniform.numLayers, 80);
    EXPECT_EQ(uniform.numKVHeads, 4);
    EXPECT_EQ(uniform.headDim, 96);

    PlanOptions const list = parseArguments({"--layer-heads", "8x128, 8X128,2x64"});
    ASSERT_EQ(list.layerHeads.size(), 3u);
    EXPECT_EQ(list.layerHeads[1].numKVHeads, 8);
    EXPECT_EQ(list.layerHeads[1].headDim, 128);
    EXPECT_EQ(list.layerHeads[2].numKVHeads, 2);
    EXPECT_EQ(list.layerHeads[2].headDim, 64);

    EXPECT_EQ(parseArguments({"--config", "x.json"}).configPath, "x.json");
    EXPECT_TRUE(parseArguments({"--help"}).help);
    EXPECT_TRUE(parseArguments({"-h"}).help);
}

TEST(ParseArguments, BadFlagsNameTheFlagAndTheValue)
{
    std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> const cases = {
        {{"--batch", "0"}, {"--batch", "\"0\""}},
        {{"--batch", "abc"}, {"--batch", "\"abc\""}},
        {{"--batch", "2147483648"}, {"--batch", "\"2147483648\""}},
        {{"--seq-len=-5"}, {"--seq-len", "\"-5\""}},
        {{"--pages", "-1"}, {"--pages", "\"-1\""}},
        {{"--batch"}, {"--batch", "needs a value"}},
        {{"--dtype", "fp16"}, {"--dtype", "\"fp16\"", "bfloat16"}},
        {{"--dtype", "int32"}, {"--dtype", "\"int32\""}},
        {{"--budget", "lots"}, {"--budget", "\"lots\""}},
        {{"--layer-heads", "8x"}, {"--layer-heads", "\"8x\""}},
        {{"--layer-heads", "8x128,0x64"}, {"--layer-heads", "\"0x64\""}},
        {{"--layer-heads", "8x128,,2x64"}, {"--layer-heads", "entry 1"}},
        {{"--frob", "1"}, {"\"--frob\""}},
        {{"stray"}, {"\"stray\""}},
        {{"--per-layer=yes"}, {"--per-layer", "\"yes\""}},
        {{"--step-tokens", "-1"}, {"--step-tokens", "\"-1\""}},
        {{"--step-tokens", "2k"}, {"--step-tokens", "\"2k\""}},
        {{"--json=1"}, {"--json", "\"1\""}},
        {{"--config", "a.json", "--layer-heads", "8x128"}, {"--config", "--layer-heads"}},
        {{"--config", "a.json", "--kv-heads", "4"}, {"--kv-heads", "--config"}},
        {{"--layer-heads", "8x128", "--layers", "4"}, {"--layers", "--layer-heads"}},
    };
    for (auto const& [args, fragments] : cases)
    {
        std::string const message = usageErrorOf(args);
        for (std::string const& fragment : fragments)
        {
            EXPECT_NE(message.find(fragment), std::string::npos) << "\"" << message << "\" lacks " << fragment;
        }
    }
}

// ---- config.json fixtures ----

TEST(HuggingFaceConfig, LlamaFixtureIsUniform)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("llama-3.1-8b-like.json"));
    EXPECT_EQ(model.numModelLayers, 32);
    // No head_dim in the file: hidden_size 4096 / 32 attention heads = 128.
    EXPECT_EQ(headShapes(model), (std::vector<std::pair<int32_t, int32_t>>(32, {8, 128})));
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
    EXPECT_EQ(headShapes(model), (std::vector<std::pair<int32_t, int32_t>>(12, {2, 256})));
    EXPECT_EQ(model.dataTypeName, "bfloat16");
}

TEST(HuggingFaceConfig, JambaFixtureUsesPeriodAndOffset)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("jamba-like.json"));
    EXPECT_EQ(model.numModelLayers, 32);
    // Layer i is attention when i % 8 == 4.
    EXPECT_EQ(model.attentionLayers, (std::vector<int32_t>{4, 12, 20, 28}));
    EXPECT_EQ(headShapes(model), (std::vector<std::pair<int32_t, int32_t>>(4, {8, 128})));
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
    EXPECT_EQ(headShapes(model), (std::vector<std::pair<int32_t, int32_t>>(4, {2, 64})));
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
    EXPECT_EQ(headShapes(model), (std::vector<std::pair<int32_t, int32_t>>(2, {12, 64}))); // 768 / 12
    EXPECT_EQ(model.dataTypeName, "float32");
}

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

// ---- sliding windows, chunked attention and latent layers in config.json ----

TEST(HuggingFaceConfig, GptOssFixtureAlternatesSlidingAndFull)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("gpt-oss-20b.json"));
    EXPECT_EQ(model.numModelLayers, 24);
    EXPECT_EQ(headShapes(model), (std::vector<std::pair<int32_t, int32_t>>(24, {8, 64})));
    // layer_types: sliding_attention, full_attention, ... from layer 0; sliding_window 128.
    EXPECT_EQ(windows(model), alternating<int32_t>(24, 128, 0));
    EXPECT_EQ(model.attentionKinds, alternating(24, AttentionKind::kSLIDING, AttentionKind::kFULL));
    EXPECT_EQ(model.dataTypeName, "bfloat16");
}

TEST(HuggingFaceConfig, Gemma2FixtureWithoutLayerTypesSlidesOnEvenLayers)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("gemma-2-9b-it.json"));
    EXPECT_EQ(model.numModelLayers, 42);
    EXPECT_EQ(headShapes(model), (std::vector<std::pair<int32_t, int32_t>>(42, {8, 256})));
    EXPECT_EQ(windows(model), alternating<int32_t>(42, 4096, 0));
    ASSERT_FALSE(model.notes.empty());
    EXPECT_NE(model.notes.front().find("Gemma-2"), std::string::npos) << model.notes.front();
}

TEST(HuggingFaceConfig, Gemma3FixtureIsGlobalEverySixthLayer)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("gemma-3-27b-it.json"));
    EXPECT_EQ(model.numModelLayers, 62);
    EXPECT_EQ(headShapes(model), (std::vector<std::pair<int32_t, int32_t>>(62, {16, 128})));
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
    EXPECT_EQ(headShapes(model), (std::vector<std::pair<int32_t, int32_t>>(32, {8, 128}))); // 4096 / 32 heads
    EXPECT_EQ(windows(model), std::vector<int32_t>(32, 4096));
}

TEST(HuggingFaceConfig, QwenFixtureWithSlidingOffKeepsFullCaches)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("qwen2.5-7b.json"));
    EXPECT_EQ(headShapes(model), (std::vector<std::pair<int32_t, int32_t>>(28, {4, 128}))); // 3584 / 28 heads
    // sliding_window 131072 is in the file, but use_sliding_window is false.
    EXPECT_EQ(windows(model), std::vector<int32_t>(28, 0));
    ASSERT_FALSE(model.notes.empty());
    EXPECT_NE(model.notes.front().find("use_sliding_window is false"), std::string::npos) << model.notes.front();
}

TEST(HuggingFaceConfig, DeepSeekFixtureIsOneLatentPerLayer)
{
    ModelDescription const model = loadHuggingFaceConfig(modelPath("deepseek-v3.json"));
    EXPECT_EQ(model.numModelLayers, 61);
    // kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values, one "head"; not 128 KV heads x 56 (7168 / 128).
    EXPECT_EQ(headShapes(model), (std::vector<std::pair<int32_t, int32_t>>(61, {1, 576})));
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
    EXPECT_EQ(headShapes(model), (std::vector<std::pair<int32_t, int32_t>>(48, {8, 128})));
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

// ---- plans, against sizes worked out by hand ----

TEST(MakePlan, DefaultModel)
{
    Plan const plan = planFor({"--budget", "40GiB"});
    EXPECT_EQ(plan.config.kvCacheType, rt::DataType::kHALF);
    EXPECT_EQ(plan.layout.capPadded, 8192);  // 8192 is already a multiple of 128
    EXPECT_EQ(plan.layout.pagesPerSlot, 64); // 8192 / 128
    EXPECT_EQ(plan.layout.minPages, 512);    // 8 sequences * 64 pages
    EXPECT_EQ(plan.layout.numPages, 512);
    // 2 * 512 pages * 128 tokens * 8 heads * 128 dims * 2 bytes = 268,435,456 per layer.
    EXPECT_EQ(layerBytes(plan), std::vector<int64_t>(32, 268435456));
    EXPECT_EQ(plan.layout.cacheBytes, 8589934592); // 32 * 268,435,456 = 8 GiB
    // 32 layers * 2 halves * 128 tokens * 8 heads * 128 dims * 2 bytes = 16,777,216 per page id.
    EXPECT_EQ(plan.layout.bytesPerPage, 16777216);
    EXPECT_EQ(plan.budgetPages, 2560); // 42,949,672,960 / 16,777,216 = 2560 exactly
}

TEST(MakePlan, LlamaFixtureAtLongContext)
{
    Plan const plan = planFor(
        {"--config", modelPath("llama-3.1-8b-like.json"), "--batch", "2", "--seq-len", "131072", "--budget", "80GB"});
    EXPECT_EQ(plan.config.kvCacheType, rt::DataType::kBF16); // torch_dtype
    EXPECT_EQ(plan.layout.minPages, 2048);                   // 2 * 131072 / 128
    // 2 * 2048 pages * 128 tokens * 8 heads * 128 dims * 2 bytes = 1,073,741,824 per layer.
    EXPECT_EQ(layerBytes(plan), std::vector<int64_t>(32, 1073741824));
    EXPECT_EQ(plan.layout.cacheBytes, 34359738368); // 32 GiB
    // 80,000,000,000 / 16,777,216 = 4768.37: 4768 * 16,777,216 = 79,993,765,888 fits, 4769 pages do not.
    EXPECT_EQ(plan.budgetPages, 4768);
}

TEST(MakePlan, OpenElmFixtureWithPerLayerHeads)
{
    Plan const plan =
        planFor({"--config", modelPath("openelm-like.json"), "--batch", "1", "--seq-len", "2048", "--budget", "1GiB"});
    EXPECT_EQ(plan.config.kvCacheType, rt::DataType::kFLOAT); // torch_dtype float32: 4 bytes
    EXPECT_EQ(plan.layout.minPages, 16);                      // 1 * 2048 / 128
    // 2 * 16 pages * 128 tokens * H * 64 dims * 4 bytes = H * 1,048,576.
    EXPECT_EQ(layerBytes(plan), (std::vector<int64_t>{3145728, 3145728, 4194304, 4194304, 5242880, 5242880}));
    EXPECT_EQ(plan.layout.cacheBytes, 25165824); // (3+3+4+4+5+5) * 1,048,576
    // Per page id: 2 * 128 tokens * 64 dims * 4 bytes * (3+3+4+4+5+5) heads = 65,536 * 24 = 1,572,864.
    EXPECT_EQ(plan.layout.bytesPerPage, 1572864);
    // 1,073,741,824 / 1,572,864 = 682.67: 682 pages.
    EXPECT_EQ(plan.budgetPages, 682);
}

TEST(MakePlan, QwenNextFixtureCountsOnlyAttentionLayers)
{
    Plan const plan = planFor({"--config", modelPath("qwen3-next-like.json"), "--budget", "10GiB"});
    EXPECT_EQ(plan.config.numAttentionLayers, 12);
    // 2 * 512 pages * 128 tokens * 2 heads * 256 dims * 2 bytes = 134,217,728 per layer.
    EXPECT_EQ(layerBytes(plan), std::vector<int64_t>(12, 134217728));
    EXPECT_EQ(plan.layout.cacheBytes, 1610612736); // 12 * 134,217,728 = 1.5 GiB
    // 12 layers * 2 * 128 * 2 * 256 * 2 bytes = 3,145,728 per page id.
    EXPECT_EQ(plan.layout.bytesPerPage, 3145728);
    // 10,737,418,240 / 3,145,728 = 3413.33: 3413 pages.
    EXPECT_EQ(plan.budgetPages, 3413);
}

TEST(MakePlan, JambaFixtureWithRetainedPagesAndSmallPages)
{
    Plan const plan = planFor({"--config", modelPath("jamba-like.json"), "--seq-len", "4000", "--page-size", "64",
        "--pages", "1000", "--dtype", "fp8_e4m3", "--budget", "500MiB"});
    EXPECT_EQ(plan.layout.pagesPerSlot, 63); // ceil(4000 / 64) = 62.5 rounded up
    EXPECT_EQ(plan.layout.capPadded, 4032);  // 63 * 64
    EXPECT_EQ(plan.layout.minPages, 504);    // 8 * 63
    EXPECT_EQ(plan.layout.numPages, 1000);
    // 2 * 1000 pages * 64 tokens * 8 heads * 128 dims * 1 byte = 131,072,000 per layer.
    EXPECT_EQ(layerBytes(plan), std::vector<int64_t>(4, 131072000));
    EXPECT_EQ(plan.layout.cacheBytes, 524288000); // 4 * 131,072,000 = 500 MiB
    // 4 layers * 2 * 64 * 8 * 128 * 1 byte = 524,288 per page id; 524,288,000 / 524,288 = 1000 pages.
    EXPECT_EQ(plan.budgetPages, 1000);
}

TEST(MakePlan, LayerHeadsList)
{
    Plan const plan =
        planFor({"--layer-heads", "8x128,8x128,2x64", "--dtype", "float32", "--batch", "2", "--seq-len", "300"});
    EXPECT_EQ(plan.layout.capPadded, 384); // 300 rounded up to 3 pages of 128
    EXPECT_EQ(plan.layout.minPages, 6);    // 2 * 3
    // 2 * 6 * 128 * 8 * 128 * 4 = 6,291,456; 2 * 6 * 128 * 2 * 64 * 4 = 786,432.
    EXPECT_EQ(layerBytes(plan), (std::vector<int64_t>{6291456, 6291456, 786432}));
    EXPECT_EQ(plan.layout.cacheBytes, 13369344); // 2 * 6,291,456 + 786,432
    // 2 * (2 * 128 * 8 * 128 * 4) + 2 * 128 * 2 * 64 * 4 = 2 * 1,048,576 + 131,072.
    EXPECT_EQ(plan.layout.bytesPerPage, 2228224);
    EXPECT_EQ(plan.budgetPages, 0); // no budget given
}

TEST(MakePlan, UniformFlags)
{
    Plan const big = planFor({"--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--batch", "1", "--seq-len",
        "131072", "--dtype", "fp8_e4m3"});
    // 2 * 1024 pages * 128 tokens * 8 * 128 * 1 byte = 268,435,456; 80 layers = 21,474,836,480 (20 GiB).
    EXPECT_EQ(layerBytes(big), std::vector<int64_t>(80, 268435456));
    EXPECT_EQ(big.layout.cacheBytes, 21474836480);

    // Only --kv-heads: the built-in's 32 layers and head_dim 128 stay.
    Plan const narrow = planFor({"--kv-heads", "4"});
    // 2 * 512 * 128 * 4 * 128 * 2 bytes = 134,217,728.
    EXPECT_EQ(layerBytes(narrow), std::vector<int64_t>(32, 134217728));
}

TEST(MakePlan, DtypeFromConfigNeedsAKnownName)
{
    ModelDescription model = modelFromLayers("m", {{2, 64}});
    model.dataTypeName = "float8_e4m3fn";
    EXPECT_THROW(makePlan(model, PlanOptions{}), ModelConfigError);
    PlanOptions options;
    options.dataType = rt::DataType::kINT8;
    EXPECT_EQ(makePlan(model, options).config.kvCacheType, rt::DataType::kINT8);
}

TEST(MakePlan, LibraryRejectsBadCacheConfigs)
{
    EXPECT_THROW(planFor({"--page-size", "100"}), rt::InvalidConfigError); // not a power of two
    EXPECT_THROW(planFor({"--pages", "511"}), rt::InvalidConfigError);     // below the minimum 8 * 64 = 512
}

// ---- windowed, chunked and latent plans at batch 8, 8192 tokens, 128 tokens per page, 2048 tokens a step ----
// A windowed layer keeps min(ceil(8192 / 128), ceil((W - 1 + 2048) / 128) + 1) = min(64, ...) pages a sequence.

TEST(MakePlan, GptOssWindowKeepsEighteenPages)
{
    Plan const plan = steppedPlan("gpt-oss-20b.json");
    EXPECT_EQ(plan.config.kvCacheType, rt::DataType::kBF16);
    EXPECT_EQ(plan.layout.maxTokensPerStep, 2048);
    // Window 128: ceil((127 + 2048) / 128) + 1 = ceil(16.99) + 1 = 18 pages, 8 * 18 = 144; full: 64 and 512.
    EXPECT_EQ(groupWindows(plan), (std::vector<int32_t>{0, 128}));
    EXPECT_EQ(groupPages(plan), (std::vector<std::pair<int32_t, int32_t>>{{64, 512}, {18, 144}}));
    EXPECT_EQ(plan.layout.groups[0].layers, (std::vector<int32_t>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}));
    EXPECT_EQ(plan.layout.groups[1].capacity, 2304); // 18 * 128
    // Per page and layer: 2 * 128 tokens * 8 heads * 64 dims * 2 bytes = 262,144.
    // Full layers 512 * 262,144 = 134,217,728; windowed 144 * 262,144 = 37,748,736.
    EXPECT_EQ(layerBytes(plan), alternating<int64_t>(24, 37748736, 134217728));
    EXPECT_EQ(plan.layout.cacheBytes, 2063597568); // 12 * 134,217,728 + 12 * 37,748,736
    EXPECT_EQ(plan.fullLengthBytes, 3221225472);   // 24 * 134,217,728 = 3 GiB
    EXPECT_FALSE(plan.stepSuggestion.has_value()); // --step-tokens was given
}

TEST(MakePlan, Gemma2WindowKeepsFortyNinePages)
{
    Plan const plan = steppedPlan("gemma-2-9b-it.json");
    // Window 4096: ceil((4095 + 2048) / 128) + 1 = ceil(47.99) + 1 = 49 pages, 8 * 49 = 392.
    EXPECT_EQ(groupPages(plan), (std::vector<std::pair<int32_t, int32_t>>{{64, 512}, {49, 392}}));
    // Per page and layer: 2 * 128 * 8 heads * 256 dims * 2 bytes = 1,048,576.
    // Full 512 * 1,048,576 = 536,870,912; windowed 392 * 1,048,576 = 411,041,792.
    EXPECT_EQ(layerBytes(plan), alternating<int64_t>(42, 411041792, 536870912));
    EXPECT_EQ(plan.layout.cacheBytes, 19906166784); // 21 * (536,870,912 + 411,041,792)
    EXPECT_EQ(plan.fullLengthBytes, 22548578304);   // 42 * 536,870,912 = 21 GiB
}

TEST(MakePlan, Gemma3WindowKeepsTwentyFivePages)
{
    Plan const plan = steppedPlan("gemma-3-27b-it.json");
    // Window 1024: ceil((1023 + 2048) / 128) + 1 = ceil(23.99) + 1 = 25 pages, 8 * 25 = 200.
    EXPECT_EQ(groupWindows(plan), (std::vector<int32_t>{0, 1024}));
    EXPECT_EQ(groupPages(plan), (std::vector<std::pair<int32_t, int32_t>>{{64, 512}, {25, 200}}));
    EXPECT_EQ(plan.layout.groups[0].layers, (std::vector<int32_t>{5, 11, 17, 23, 29, 35, 41, 47, 53, 59}));
    // Per page and layer: 2 * 128 * 16 heads * 128 dims * 2 bytes = 1,048,576.
    // 10 full layers * 512 MiB = 5,368,709,120; 52 windowed * 200 MiB = 10,905,190,400.
    EXPECT_EQ(plan.layout.groups[0].cacheBytes, 5368709120);
    EXPECT_EQ(plan.layout.groups[1].cacheBytes, 10905190400);
    EXPECT_EQ(plan.layout.cacheBytes, 16273899520); // 15,520 MiB
    EXPECT_EQ(plan.fullLengthBytes, 33285996544);   // 62 * 512 MiB = 31 GiB
}

TEST(MakePlan, MistralIsOneWindowedGroup)
{
    Plan const plan = steppedPlan("mistral-7b-v0.1.json");
    // Every layer has window 4096: one group of 49 pages a sequence, and capPadded is its capacity.
    EXPECT_EQ(groupWindows(plan), (std::vector<int32_t>{4096}));
    EXPECT_EQ(groupPages(plan), (std::vector<std::pair<int32_t, int32_t>>{{49, 392}}));
    EXPECT_EQ(plan.layout.capPadded, 6272); // 49 * 128
    // 2 * 392 pages * 128 * 8 heads * 128 dims * 2 bytes = 205,520,896 per layer.
    EXPECT_EQ(layerBytes(plan), std::vector<int64_t>(32, 205520896));
    EXPECT_EQ(plan.layout.cacheBytes, 6576668672); // 32 * 205,520,896
    EXPECT_EQ(plan.fullLengthBytes, 8589934592);   // 32 * 2 * 512 * 128 * 8 * 128 * 2 = 8 GiB

    // One group: --pages still works, and the budget counts pages.
    Plan const pages = planFor(
        {"--config", modelPath("mistral-7b-v0.1.json"), "--step-tokens", "2048", "--pages", "400", "--budget", "1GiB"});
    EXPECT_EQ(pages.layout.numPages, 400);
    EXPECT_EQ(pages.fullLengthBytes, 8589934592); // 400 pages are below the full-length minimum 512
    // Per page id: 32 layers * 2 * 128 * 8 * 128 * 2 = 16,777,216; 1 GiB / 16 MiB = 64 pages.
    EXPECT_EQ(pages.budgetPages, 64);
    EXPECT_FALSE(pages.budgetSplit.has_value());
}

TEST(MakePlan, QwenKeepsFullCaches)
{
    Plan const plan = steppedPlan("qwen2.5-7b.json");
    EXPECT_EQ(groupPages(plan), (std::vector<std::pair<int32_t, int32_t>>{{64, 512}}));
    // 2 * 512 * 128 * 4 heads * 128 dims * 2 bytes = 134,217,728 per layer.
    EXPECT_EQ(plan.layout.cacheBytes, 3758096384); // 28 * 134,217,728 = 3.5 GiB
    EXPECT_EQ(plan.fullLengthBytes, plan.layout.cacheBytes);
}

TEST(MakePlan, DeepSeekPlansTheLatentNotTheDecompressedHeads)
{
    Plan const plan = steppedPlan("deepseek-v3.json");
    for (rt::KVLayerLayout const& layer : plan.layout.layers)
    {
        EXPECT_EQ(layer.numHalves, 1); // K only
    }
    // 512 pages * 128 tokens * 576 values * 2 bytes = 75,497,472 per layer; 61 layers = 4,605,345,792 (4.29 GiB).
    EXPECT_EQ(layerBytes(plan), std::vector<int64_t>(61, 75497472));
    EXPECT_EQ(plan.layout.cacheBytes, 4605345792);
    EXPECT_EQ(plan.layout.bytesPerPage, 8994816); // 61 * 128 * 576 * 2

    // What the planner used to read: 128 KV heads x 56 (7168 / 128), K and V: 61 * 2 * 512 * 128 * 128 * 56 * 2
    // = 114,621,939,712 bytes (106.75 GiB), about 25 times the real cache.
    PlanOptions options = parseArguments({"--dtype", "bfloat16"});
    Plan const old = makePlan(modelFromLayers("old", std::vector<rt::KVLayerConfig>(61, {128, 56})), options);
    EXPECT_EQ(old.layout.cacheBytes, 114621939712);
    EXPECT_EQ(old.layout.cacheBytes / plan.layout.cacheBytes, 24); // 24.9
}

TEST(MakePlan, Llama4ChunksCoverTheWholeSequenceAt8192)
{
    Plan const plan = steppedPlan("llama-4-scout-17b-16e.json");
    // Chunk 8192 as a window: min(64, ceil((8191 + 2048) / 128) + 1) = min(64, 81) = 64 pages: no saving here.
    EXPECT_EQ(groupWindows(plan), (std::vector<int32_t>{0, 8192}));
    EXPECT_EQ(groupPages(plan), (std::vector<std::pair<int32_t, int32_t>>{{64, 512}, {64, 512}}));
    // 48 layers * 2 * 512 * 128 * 8 * 128 * 2 bytes = 48 * 268,435,456 = 12 GiB either way.
    EXPECT_EQ(plan.layout.cacheBytes, 12884901888);
    EXPECT_EQ(plan.fullLengthBytes, 12884901888);

    Plan const longer =
        planFor({"--config", modelPath("llama-4-scout-17b-16e.json"), "--seq-len", "65536", "--step-tokens", "2048"});
    // Full layers: 65536 / 128 = 512 pages, 8 * 512 = 4096; chunked: min(512, 81) = 81, 8 * 81 = 648.
    EXPECT_EQ(groupPages(longer), (std::vector<std::pair<int32_t, int32_t>>{{512, 4096}, {81, 648}}));
    // Per page and layer 2 * 128 * 8 * 128 * 2 = 524,288: 12 * 4096 * 524,288 + 36 * 648 * 524,288.
    EXPECT_EQ(longer.layout.cacheBytes, 38000394240); // 25,769,803,776 + 12,230,590,464
    EXPECT_EQ(longer.fullLengthBytes, 103079215104);  // 48 * 4096 * 524,288 = 96 GiB
}

TEST(MakePlan, StepZeroKeepsFullCachesAndSuggests2048)
{
    Plan const plan = planFor({"--config", modelPath("gpt-oss-20b.json")});
    EXPECT_EQ(plan.layout.maxTokensPerStep, 8192); // 0 means the sequence length
    EXPECT_EQ(groupPages(plan), (std::vector<std::pair<int32_t, int32_t>>{{64, 512}, {64, 512}}));
    EXPECT_EQ(plan.layout.cacheBytes, 3221225472);
    ASSERT_TRUE(plan.stepSuggestion.has_value());
    EXPECT_EQ(plan.stepSuggestion->stepTokens, 2048);
    EXPECT_EQ(plan.stepSuggestion->cacheBytes, 2063597568); // GptOssWindowKeepsEighteenPages
    EXPECT_EQ(plan.stepSuggestion->currentBytes, 3221225472);

    // Shorter sequences than 2048: the suggestion is a whole sequence a step, which saves nothing.
    Plan const shortPlan = planFor({"--config", modelPath("gpt-oss-20b.json"), "--seq-len", "1000"});
    ASSERT_TRUE(shortPlan.stepSuggestion.has_value());
    EXPECT_EQ(shortPlan.stepSuggestion->stepTokens, 1000);
    EXPECT_EQ(shortPlan.stepSuggestion->cacheBytes, shortPlan.stepSuggestion->currentBytes);

    EXPECT_FALSE(planFor({"--config", modelPath("qwen2.5-7b.json")}).stepSuggestion.has_value()); // no windows
}

TEST(MakePlan, BudgetIsSplitAcrossGroups)
{
    Plan const plan =
        planFor({"--config", modelPath("gpt-oss-20b.json"), "--step-tokens", "2048", "--budget", "10GiB"});
    ASSERT_TRUE(plan.budgetSplit.has_value());
    EXPECT_EQ(plan.budgetPages, 0);
    // One full-length sequence: 64 pages of group 0 and 18 of group 1, each page 12 layers * 262,144 = 3,145,728
    // bytes: 82 * 3,145,728 = 257,949,696. 10,737,418,240 / 257,949,696 = 41.6, so 41 sequences.
    EXPECT_EQ(plan.budgetSplit->sequences, 41);
    EXPECT_EQ(plan.budgetSplit->numPagesPerGroup, (std::vector<int64_t>{2624, 738})); // 41 * 64, 41 * 18
    EXPECT_EQ(plan.budgetSplit->bytes, 10575937536);                                  // 41 * 257,949,696
}

TEST(MakePlan, PagesWithSeveralGroupsAndStepsOverTheSequenceAreUsageErrors)
{
    try
    {
        planFor({"--config", modelPath("gemma-3-27b-it.json"), "--pages", "1000"});
        ADD_FAILURE() << "accepted --pages with two page groups";
    }
    catch (UsageError const& error)
    {
        std::string const message = error.what();
        EXPECT_NE(message.find("--pages 1000"), std::string::npos) << message;
        EXPECT_NE(message.find("2 page groups"), std::string::npos) << message;
        EXPECT_NE(message.find("--budget"), std::string::npos) << message;
    }
    // A step longer than the sequence.
    EXPECT_THROW(planFor({"--config", modelPath("gpt-oss-20b.json"), "--step-tokens", "9000"}), UsageError);
}

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
        "slidingWindow": 128, "group": 1, "capacity": 2304, "numPages": 144, "bytes": 37748736})"));
    EXPECT_TRUE(layer.at("bytes").is_number_integer());
    EXPECT_EQ(json.at("layers")[1].at("capacity"), 8192); // 64 pages * 128

    nlohmann::json const latent = nlohmann::json::parse(formatPlanJson(steppedPlan("deepseek-v3.json")));
    EXPECT_EQ(latent.at("layers")[60].at("kind"), "latent");
    EXPECT_EQ(latent.at("layers")[60].at("numKVHeads"), 1);
    EXPECT_EQ(latent.at("layers")[60].at("headDim"), 576);

    nlohmann::json const budget = nlohmann::json::parse(formatPlanJson(
        planFor({"--config", modelPath("gpt-oss-20b.json"), "--step-tokens", "2048", "--budget", "10GiB"})));
    EXPECT_EQ(budget.at("budget"), nlohmann::json::parse(R"({"bytes": 10737418240, "sequences": 41,
        "numPagesPerGroup": [2624, 738], "cacheBytes": 10575937536})"));
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
             "no_rope_layers", "kv_lora_rank", "qk_rope_head_dim"})
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

// ---- tensor parallelism (--tp): one GPU's shard ----

TEST(TensorParallel, FlagParsesAndRejectsZero)
{
    EXPECT_FALSE(parseArguments({}).tp.has_value());
    EXPECT_EQ(parseArguments({"--tp", "4"}).tp, 4);
    EXPECT_EQ(parseArguments({"--tp=8"}).tp, 8);
    std::string const message = usageErrorOf({"--tp", "0"});
    EXPECT_NE(message.find("--tp"), std::string::npos) << message;
    EXPECT_NE(message.find("\"0\""), std::string::npos) << message;
    EXPECT_NE(message.find("[1, "), std::string::npos) << message;
}

// The built-in model, 32 layers of 8 x 128 float16, batch 8 x 8192 tokens: 8,589,934,592 bytes whole. --tp 4: two heads
// a GPU, 32 * 2 * 512 * 128 * 2 * 128 * 2 = 2,147,483,648 bytes; a page id is 32 * 2 * 128 * 2 * 128 * 2 = 4,194,304
// bytes, so 40 GiB = 42,949,672,960 bytes holds 10,240 of them on each GPU.
TEST(TensorParallel, FourGpusSplitTheHeads)
{
    Plan const plan = planFor({"--tp", "4", "--budget", "40GiB"});
    ASSERT_TRUE(plan.shard.has_value());
    EXPECT_EQ(plan.shard->tp, 4);
    EXPECT_EQ(plan.shard->rank, 0);
    EXPECT_EQ(plan.layout.cacheBytes, 2147483648);
    EXPECT_EQ(plan.layout.numPages, 512);
    EXPECT_EQ(plan.layout.bytesPerPage, 4194304);
    EXPECT_EQ(plan.budgetPages, 10240);
    EXPECT_EQ(headShapes(plan.model), (std::vector<std::pair<int32_t, int32_t>>(32, {8, 128})));
    for (rt::KVLayerConfig const& layer : plan.config.layerConfigs)
    {
        EXPECT_EQ(layer.numKVHeads, 2);
    }
    EXPECT_EQ(plan.shard->layers[31].firstHead, 0);
    EXPECT_EQ(plan.shard->layers[31].numHeads, 2);
}

// --tp 16 on 8 heads: one head a GPU, each head on two GPUs; 32 * 2 * 512 * 128 * 1 * 128 * 2 = 1,073,741,824 bytes a
// GPU, 17,179,869,184 across the 16.
TEST(TensorParallel, SixteenGpusReplicateEightHeadsInJson)
{
    ProgramResult const result = runProgram({"--tp", "16", "--json"});
    ASSERT_EQ(result.status, 0) << result.err;
    nlohmann::json const json = nlohmann::json::parse(result.out);
    EXPECT_EQ(json.at("totalBytes"), 1073741824);
    EXPECT_EQ(json.at("layers").at(7).at("numKVHeads"), 1);
    nlohmann::json const& tp = json.at("tp");
    EXPECT_EQ(tp.at("size"), 16);
    EXPECT_EQ(tp.at("rank"), 0);
    EXPECT_EQ(tp.at("totalBytesAllRanks"), 17179869184);
    ASSERT_EQ(tp.at("layers").size(), 32u);
    EXPECT_EQ(tp.at("layers").at(31),
        nlohmann::json::parse(R"({"index": 31, "firstHead": 0, "numKVHeads": 1, "replicas": 2})"));
}

// DeepSeek-V3's latent layers are whole on every GPU: 4,605,345,792 bytes a GPU (as without --tp), 8 times that in all.
TEST(TensorParallel, LatentLayersAreWholeOnEveryGpu)
{
    ProgramResult const result = runProgram({"--config", modelPath("deepseek-v3.json"), "--tp", "8"});
    ASSERT_EQ(result.status, 0) << result.err;
    EXPECT_NE(result.out.find("total     4,605,345,792 bytes (4.29 GiB) in 61 layer buffers"), std::string::npos)
        << result.out;
    EXPECT_NE(result.out.find("latent: the whole vector on every GPU"), std::string::npos) << result.out;
    EXPECT_NE(result.out.find("all GPUs  36,842,766,336 bytes"), std::string::npos) << result.out;
}

TEST(TensorParallel, TextSaysHowHeadsAreShared)
{
    ProgramResult const split = runProgram({"--tp", "4"});
    ASSERT_EQ(split.status, 0) << split.err;
    EXPECT_NE(split.out.find("tp        4 GPUs"), std::string::npos) << split.out;
    EXPECT_NE(split.out.find("layers 0-31: 2 of 8 KV heads a GPU"), std::string::npos) << split.out;
    EXPECT_NE(split.out.find("all GPUs  8,589,934,592 bytes (8.00 GiB) in 4 shards"), std::string::npos) << split.out;
    ProgramResult const replicated = runProgram({"--tp", "16"});
    EXPECT_NE(replicated.out.find("layers 0-31: 8 KV heads replicated: one a GPU, each on 2 GPUs"), std::string::npos)
        << replicated.out;
    // Without --tp the plan says nothing of GPUs.
    ProgramResult const plain = runProgram({});
    EXPECT_EQ(plain.out.find("  tp "), std::string::npos) << plain.out;
    EXPECT_EQ(plain.out.find("all GPUs"), std::string::npos) << plain.out;
    EXPECT_EQ(runProgram({"--json"}).out.find("\"tp\""), std::string::npos);
}

// gpt-oss-20b has 8 KV heads a layer: 3 GPUs neither divide 8 nor are a multiple of it.
TEST(TensorParallel, HeadsThatCannotBeSharedExitWithTwo)
{
    ProgramResult const result = runProgram({"--config", modelPath("gpt-oss-20b.json"), "--tp", "3"});
    EXPECT_EQ(result.status, kEXIT_BAD_INPUT);
    EXPECT_TRUE(result.out.empty()) << result.out;
    for (char const* word : {"numKVHeads is 8", "tp = 3"})
    {
        EXPECT_NE(result.err.find(word), std::string::npos) << result.err;
    }
}

} // namespace
} // namespace kvcache::plan
