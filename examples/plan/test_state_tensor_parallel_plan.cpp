// kvcache-plan --tp on hybrid models: GPU 0's shard of each state layer, split by heads or channels as serving engines
// shard them, in plans, text and JSON, and the splits it refuses. Every size is worked out by hand in the comment above
// its assertion, from the published configs in models/.

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

//! Plans `fixture` at batch 1 over `tp` GPUs, so that the state bytes are one sequence's on GPU 0.
Plan shardPlan(std::string const& fixture, std::string const& tp)
{
    return planFor({"--config", modelPath(fixture), "--batch", "1", "--tp", tp});
}

//! The shapes of the first state layer's tensors.
std::vector<std::vector<int64_t>> firstShapes(Plan const& plan)
{
    std::vector<std::vector<int64_t>> shapes;
    for (rt::StateTensorLayout const& tensor : plan.layout.stateLayers.at(0).tensors)
    {
        shapes.push_back(tensor.shape);
    }
    return shapes;
}

// Qwen3-Next-80B: 16 key heads, 32 value heads, 128 x 128, kernel 4, 36 gated delta net layers.
TEST(StateTensorParallel, GatedDeltaNetSplitsKeyAndValueHeads)
{
    // --tp 2: 8 key and 16 value heads. conv [2 x 8 x 128 + 16 x 128, 3] = [4096, 3] bfloat16 = 24,576 bytes;
    // recurrent [16, 128, 128] float32 = 1,048,576 bytes; 1,073,152 a layer, x 36 = 38,633,472 bytes a sequence.
    Plan const two = shardPlan("qwen3-next-80b-a3b-instruct.json", "2");
    ASSERT_EQ(two.layout.stateLayers.size(), 36U);
    EXPECT_EQ(firstShapes(two), (std::vector<std::vector<int64_t>>{{4096, 3}, {16, 128, 128}}));
    EXPECT_EQ(two.layout.stateLayers[0].slotBytes, 1073152);
    EXPECT_EQ(two.layout.stateBytesPerSlot, 38633472);
    // --tp 4: conv [2 x 4 x 128 + 8 x 128, 3] = [2048, 3] = 12,288 bytes; recurrent [8, 128, 128] = 524,288 bytes.
    Plan const four = shardPlan("qwen3-next-80b-a3b-instruct.json", "4");
    EXPECT_EQ(firstShapes(four), (std::vector<std::vector<int64_t>>{{2048, 3}, {8, 128, 128}}));
    EXPECT_EQ(four.layout.stateLayers[0].slotBytes, 536576);
}

// The plan's config carries each tensor's rule, which rt::tensorParallelShard applies: Qwen3-Next's conv is q, k and v
// channels, 16 key heads of 128 twice, then 32 value heads of 128, along dimension 0; the recurrent state splits its
// 32 value heads. Bamba's single group of 128 is replicated in B and C.
TEST(StateTensorParallel, PlansDeclareEachTensorsSplitRule)
{
    Plan const qwen = planFor({"--config", modelPath("qwen3-next-80b-a3b-instruct.json"), "--batch", "1"});
    rt::StateTensorConfig const& conv = qwen.config.stateLayerConfigs.at(0).tensors.at(0);
    EXPECT_EQ(conv.splitDim, 0);
    ASSERT_EQ(conv.splitSegments.size(), 3U);
    std::vector<std::vector<int64_t>> sizes;
    for (rt::StateSplitSegment const& segment : conv.splitSegments)
    {
        sizes.push_back({segment.parts, segment.partSize, segment.replicated ? 1 : 0});
    }
    EXPECT_EQ(sizes, (std::vector<std::vector<int64_t>>{{16, 128, 0}, {16, 128, 0}, {32, 128, 0}}));
    EXPECT_EQ(conv.splitSegments[0].name, "linear_num_key_heads");
    EXPECT_EQ(conv.splitSegments[2].name, "linear_num_value_heads");
    rt::StateTensorConfig const& recurrent = qwen.config.stateLayerConfigs.at(0).tensors.at(1);
    EXPECT_EQ(recurrent.splitDim, 0);
    ASSERT_EQ(recurrent.splitSegments.size(), 1U);
    EXPECT_EQ(recurrent.splitSegments[0].parts, 32);

    Plan const bamba = planFor({"--config", modelPath("bamba-9b.json"), "--batch", "1"});
    std::vector<rt::StateSplitSegment> const& bc = bamba.config.stateLayerConfigs.at(0).tensors.at(0).splitSegments;
    ASSERT_EQ(bc.size(), 3U);
    EXPECT_FALSE(bc[0].replicated);
    EXPECT_TRUE(bc[1].replicated);
    EXPECT_TRUE(bc[2].replicated);
    EXPECT_EQ(bc[1].parts * bc[1].partSize, 128);
}

// Bamba-9B: 128 Mamba2 heads of 64, one group, d_state 128, kernel 4, 29 Mamba2 layers. vLLM copies the single group
// to every GPU: at --tp 2 the groups become 1 + (2 - 1) = 2, conv (8192 + 2 x 2 x 128) / 2 = 64 x 64 + 2 x 1 x 128.
TEST(StateTensorParallel, Mamba2CopiesASingleGroupToEveryGpu)
{
    // conv [4352, 3] bfloat16 = 26,112 bytes; ssm [64, 64, 128] float32 = 2,097,152 bytes; 2,123,264 a layer,
    // x 29 = 61,574,656 bytes a sequence.
    Plan const two = shardPlan("bamba-9b.json", "2");
    ASSERT_EQ(two.layout.stateLayers.size(), 29U);
    EXPECT_EQ(firstShapes(two), (std::vector<std::vector<int64_t>>{{4352, 3}, {64, 64, 128}}));
    EXPECT_EQ(two.layout.stateLayers[0].slotBytes, 2123264);
    EXPECT_EQ(two.layout.stateBytesPerSlot, 61574656);
    // --tp 4: groups 1 + 3 = 4, conv (8192 + 2 x 4 x 128) / 4 = 2304; ssm [32, 64, 128].
    Plan const four = shardPlan("bamba-9b.json", "4");
    EXPECT_EQ(firstShapes(four), (std::vector<std::vector<int64_t>>{{2304, 3}, {32, 64, 128}}));
}

// Nemotron-H-8B: 128 Mamba2 heads of 64, 8 groups, ssm_state_size 128, kernel 4, 24 Mamba2 layers.
TEST(StateTensorParallel, Mamba2SplitsHeadsAndGroups)
{
    // --tp 4: 32 heads and 2 groups. conv [32 x 64 + 2 x 2 x 128, 3] = [2560, 3] bfloat16 = 15,360 bytes;
    // ssm [32, 64, 128] float32 = 1,048,576 bytes; 1,063,936 a layer, x 24 = 25,534,464 bytes a sequence.
    Plan const four = shardPlan("nemotron-h-8b-base-8k.json", "4");
    ASSERT_EQ(four.layout.stateLayers.size(), 24U);
    EXPECT_EQ(firstShapes(four), (std::vector<std::vector<int64_t>>{{2560, 3}, {32, 64, 128}}));
    EXPECT_EQ(four.layout.stateBytesPerSlot, 25534464);
}

// jamba-like: d_inner = 2 x 4096 = 8192, d_state 16, kernel 4, 28 Mamba layers.
TEST(StateTensorParallel, MambaSplitsInnerChannels)
{
    // --tp 2: 4096 channels. conv [4096, 3] bfloat16 = 24,576 bytes; ssm [4096, 16] float32 = 262,144 bytes;
    // 286,720 a layer, x 28 = 8,028,160 bytes a sequence.
    Plan const two = shardPlan("jamba-like.json", "2");
    ASSERT_EQ(two.layout.stateLayers.size(), 28U);
    EXPECT_EQ(firstShapes(two), (std::vector<std::vector<int64_t>>{{4096, 3}, {4096, 16}}));
    EXPECT_EQ(two.layout.stateBytesPerSlot, 8028160);
}

// LFM2-1.2B: hidden_size 2048, conv_L_cache 3, 10 short conv layers.
TEST(StateTensorParallel, ShortConvSplitsChannels)
{
    // --tp 2: conv [1024, 2] bfloat16 = 4,096 bytes a layer, x 10 = 40,960 bytes a sequence.
    Plan const two = shardPlan("lfm2-1.2b.json", "2");
    ASSERT_EQ(two.layout.stateLayers.size(), 10U);
    EXPECT_EQ(firstShapes(two), (std::vector<std::vector<int64_t>>{{1024, 2}}));
    EXPECT_EQ(two.layout.stateBytesPerSlot, 40960);
}

// Kimi-Linear-48B: 32 KDA heads of 128, kernel 4, 20 KDA layers.
TEST(StateTensorParallel, KdaSplitsHeads)
{
    // --tp 2: 16 heads. q, k and v convs [2048, 3] bfloat16 = 12,288 bytes each; recurrent [16, 128, 128] float32 =
    // 1,048,576 bytes; 1,085,440 a layer, x 20 = 21,708,800 bytes a sequence.
    Plan const two = shardPlan("kimi-linear-48b-a3b-instruct.json", "2");
    ASSERT_EQ(two.layout.stateLayers.size(), 20U);
    EXPECT_EQ(firstShapes(two), (std::vector<std::vector<int64_t>>{{2048, 3}, {2048, 3}, {2048, 3}, {16, 128, 128}}));
    EXPECT_EQ(two.layout.stateBytesPerSlot, 21708800);
}

// The JSON of Qwen3-Next at --tp 2, batch 1: GPU 0's state bytes (as above) and all GPUs' together.
TEST(StateTensorParallel, JsonGivesGpuZerosStateBytes)
{
    ProgramResult const result =
        runProgram({"--config", modelPath("qwen3-next-80b-a3b-instruct.json"), "--batch", "1", "--tp", "2", "--json"});
    ASSERT_EQ(result.status, 0) << result.err;
    nlohmann::json const json = nlohmann::json::parse(result.out);
    EXPECT_EQ(json.at("stateBytesPerSequence"), 38633472);
    EXPECT_EQ(json.at("stateBytes"), 38633472);
    ASSERT_EQ(json.at("stateLayers").size(), 36U);
    EXPECT_EQ(json.at("stateLayers").at(0).at("stateBytes"), 1073152);
    EXPECT_EQ(json.at("stateLayers").at(0).at("tensors").at(0).at("shape"), nlohmann::json::parse("[4096, 3]"));
    // 2 x 38,633,472.
    EXPECT_EQ(json.at("tp").at("stateBytesAllRanks"), 77266944);
}

// The text plan says the state per sequence of GPU 0 and all GPUs' state.
TEST(StateTensorParallel, TextGivesGpuZerosStateBytes)
{
    ProgramResult const result = runProgram({"--config", modelPath("lfm2-1.2b.json"), "--batch", "1", "--tp", "2"});
    ASSERT_EQ(result.status, 0) << result.err;
    // 40,960 bytes a sequence on GPU 0 (above), 81,920 on both.
    for (char const* words : {"conv [1024, 2] bfloat16", "40,960 bytes (40.00 KiB) of state per sequence",
             "+ 81,920 bytes (80.00 KiB) of state in 2 shards of 40,960 bytes"})
    {
        EXPECT_NE(result.out.find(words), std::string::npos) << words << "\n" << result.out;
    }
}

//! Expects `args` to exit 2 with nothing on stdout and every one of `words` in the message.
void expectRefused(std::vector<std::string> const& args, std::vector<std::string> const& words)
{
    ProgramResult const result = runProgram(args);
    EXPECT_EQ(result.status, kEXIT_BAD_INPUT);
    EXPECT_TRUE(result.out.empty()) << result.out;
    for (std::string const& word : words)
    {
        EXPECT_NE(result.err.find(word), std::string::npos) << word << "\n" << result.err;
    }
}

TEST(StateTensorParallel, RefusesSplitsThatDoNotDivide)
{
    // 16 key heads over 32 GPUs (the 32 value heads would split).
    expectRefused({"--config", modelPath("qwen3-next-80b-a3b-instruct.json"), "--tp", "32"},
        {"--tp 32", "linear_num_key_heads = 16"});
    // 128 heads split over 16 GPUs, but 8 groups do not, and more than one group is not copied.
    expectRefused({"--config", modelPath("nemotron-h-8b-base-8k.json"), "--tp", "16"}, {"--tp 16", "n_groups = 8"});
    // 128 heads over 3 GPUs.
    expectRefused({"--config", modelPath("bamba-9b.json"), "--tp", "3"}, {"--tp 3", "mamba_n_heads = 128"});
    // d_inner 8192 over 3 GPUs.
    expectRefused({"--config", modelPath("jamba-like.json"), "--tp", "3"}, {"--tp 3", "d_inner", "= 8192"});
    // 2048 channels over 3 GPUs.
    expectRefused({"--config", modelPath("lfm2-1.2b.json"), "--tp", "3"}, {"--tp 3", "hidden_size = 2048"});
    // 32 KDA heads over 64 GPUs.
    expectRefused(
        {"--config", modelPath("kimi-linear-48b-a3b-instruct.json"), "--tp", "64"}, {"--tp 64", "num_heads = 32"});
}

} // namespace
} // namespace kvcache::plan
