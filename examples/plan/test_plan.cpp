#include "model_config.h"
#include "plan.h"
#include "plan_options.h"

#include "kvcache/errors.h"

#include <gtest/gtest.h>

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
        "--page-size=64", "--pages", "100", "--budget=2GiB", "--per-layer"});
    EXPECT_EQ(options.maxBatchSize, 4);
    EXPECT_EQ(options.maxSequenceLength, 1000);
    EXPECT_EQ(options.dataType, rt::DataType::kFP8_E5M2);
    EXPECT_EQ(options.tokensPerPage, 64);
    EXPECT_EQ(options.numPages, 100);
    EXPECT_EQ(options.budgetBytes, 2147483648); // 2 * 1,073,741,824
    EXPECT_TRUE(options.perLayer);
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
        "text_config": {"num_hidden_layers": 6, "num_key_value_heads": 2, "head_dim": 64,
            "layer_types": ["sliding_attention", "full_attention", "mamba", "attention", "conv",
                "chunked_attention"]}})",
        "inline.json");
    EXPECT_EQ(model.numModelLayers, 6);
    EXPECT_EQ(model.attentionLayers, (std::vector<int32_t>{0, 1, 3, 5}));
    EXPECT_EQ(headShapes(model), (std::vector<std::pair<int32_t, int32_t>>(4, {2, 64})));
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
             "--kv-heads", "--head-dim", "--layer-heads", "--config", "--per-layer", "num_key_value_heads",
             "layer_types", "attn_layer_period", "text_config", "torch_dtype"})
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

} // namespace
} // namespace kvcache::plan
