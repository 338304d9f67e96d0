// kvcache-plan --tp: one GPU's shard of the heads, in plans, text and JSON.
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
