// kvcache-plan's command line: byte sizes, flags and their errors.
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
        {{"--kv-dtype", "fp4"}, {"--kv-dtype", "fp16|bf16|fp8|fp8-token-head|nvfp4", "\"fp4\""}},
        {{"--kv-dtype", "fp8", "--dtype", "float16"}, {"--kv-dtype fp8", "--dtype float16"}},
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

// ---- cache formats (--kv-dtype) ----

TEST(KVFormat, EachNameMapsToAStorageTypeAndQuantization)
{
    struct Expected
    {
        char const* name;
        rt::DataType storage;
        rt::KVQuantization quantization;
    };
    Expected const expected[] = {
        {"fp16", rt::DataType::kHALF, rt::KVQuantization::kNONE},
        {"bf16", rt::DataType::kBF16, rt::KVQuantization::kNONE},
        {"fp8", rt::DataType::kFP8_E4M3, rt::KVQuantization::kFP8_PER_TENSOR},
        {"fp8-token-head", rt::DataType::kFP8_E4M3, rt::KVQuantization::kFP8_PER_TOKEN_HEAD},
        {"nvfp4", rt::DataType::kUINT8, rt::KVQuantization::kNVFP4},
    };
    for (Expected const& format : expected)
    {
        PlanOptions const options = parseArguments({std::string("--kv-dtype=") + format.name});
        ASSERT_TRUE(options.kvFormat.has_value()) << format.name;
        EXPECT_EQ(options.kvFormat->name, format.name);
        EXPECT_EQ(options.kvFormat->storage, format.storage) << format.name;
        EXPECT_EQ(options.kvFormat->quantization, format.quantization) << format.name;
        EXPECT_FALSE(options.dataType.has_value());
    }
    EXPECT_FALSE(parseArguments({}).kvFormat.has_value());
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

} // namespace
} // namespace kvcache::plan
