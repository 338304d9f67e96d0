// Host tests of the tensor-parallel split of state layers (no GPU): each family's state shapes and bytes per rank,
// worked out by hand in the comment above each assertion from the published configs; the extents every rank holds
// against a model that deals each segment's parts out one at a time; the sum over ranks (the whole plus the replicated
// copies); tensors without a rule kept whole; and every refused rule naming its field, value and limit.

#include "kvcache/core/data_type.h"
#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/dist/tensor_parallel.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"

namespace kvcache::rt
{
namespace
{

using Shape = std::vector<int64_t>;

StateSplitSegment parts(int64_t count, int64_t partSize, std::string name = {}, bool replicated = false)
{
    return StateSplitSegment{count, partSize, replicated, std::move(name)};
}

//! A tensor split along `dim` by `segments` (empty: the whole dimension, one entry a part).
StateTensorConfig splitTensor(
    std::string name, Shape shape, DataType type, int32_t dim, std::vector<StateSplitSegment> segments = {})
{
    return StateTensorConfig{std::move(name), std::move(shape), type, dim, std::move(segments)};
}

//! A model of one attention layer of 1 KV head x 128 (replicated at any tp) and `stateLayers`, batch 1.
KVCacheConfig modelWith(std::vector<StateLayerConfig> const& stateLayers)
{
    return test::ConfigBuilder({KVLayerConfig{1, 128}}).maxBatchSize(1).stateLayers(stateLayers).build();
}

//! Qwen3-Next-80B's gated delta net: 16 key heads and 32 value heads of 128, kernel 4. conv {2 x 16 x 128 + 32 x 128,
//! 3} = {8192, 3} bfloat16 as q, k and v channels; recurrent {32, 128, 128} float32.
StateLayerConfig gatedDeltaNet()
{
    return StateLayerConfig{{splitTensor("conv", {8192, 3}, DataType::kBF16, 0,
                                 {parts(16, 128, "key heads"), parts(16, 128, "key heads"), parts(32, 128)}),
        splitTensor("recurrent", {32, 128, 128}, DataType::kFLOAT, 0, {parts(32, 1)})}};
}

//! A Mamba2 layer of 128 heads of 64, `groups` groups, d_state 128, kernel 4: conv {128 x 64 + 2 x groups x 128, 3}
//! bfloat16 as x, B and C channels; SSM {128, 64, 128} float32. A single group is replicated.
StateLayerConfig mamba2(int64_t groups)
{
    StateSplitSegment const bc = parts(groups, 128, "n_groups", groups == 1);
    return StateLayerConfig{
        {splitTensor("conv", {8192 + 2 * groups * 128, 3}, DataType::kBF16, 0, {parts(128, 64), bc, bc}),
            splitTensor("ssm", {128, 64, 128}, DataType::kFLOAT, 0, {parts(128, 1)})}};
}

std::vector<Shape> shapesOf(KVCacheConfig const& config, size_t layer)
{
    std::vector<Shape> shapes;
    for (StateTensorConfig const& tensor : config.stateLayerConfigs.at(layer).tensors)
    {
        shapes.push_back(tensor.shape);
    }
    return shapes;
}

// tp 2: 8 key and 16 value heads. conv [2 x 8 x 128 + 16 x 128, 3] = [4096, 3] bfloat16 = 24,576 bytes; recurrent
// [16, 128, 128] float32 = 1,048,576 bytes; 1,073,152 a slot. tp 4: [2048, 3] = 12,288 and [8, 128, 128] = 524,288;
// 536,576 a slot. Whole: [8192, 3] = 49,152 and 2,097,152; 2,146,304 = 2 x 1,073,152 = 4 x 536,576 (nothing copied).
TEST(TensorParallelStates, GatedDeltaNetSplitsKeyAndValueHeads)
{
    KVCacheConfig const model = modelWith({gatedDeltaNet()});
    EXPECT_EQ(computeLayout(model).stateBytesPerSlot, 2146304);
    for (int32_t rank = 0; rank < 2; ++rank)
    {
        KVCacheConfig const two = tensorParallelShard(model, 2, rank).config;
        EXPECT_EQ(shapesOf(two, 0), (std::vector<Shape>{{4096, 3}, {16, 128, 128}}));
        EXPECT_EQ(computeLayout(two).stateLayers.at(0).tensors.at(0).slotBytes, 24576);
        EXPECT_EQ(computeLayout(two).stateBytesPerSlot, 1073152);
    }
    KVCacheConfig const four = tensorParallelShard(model, 4, 3).config;
    EXPECT_EQ(shapesOf(four, 0), (std::vector<Shape>{{2048, 3}, {8, 128, 128}}));
    EXPECT_EQ(computeLayout(four).stateBytesPerSlot, 536576);
    // The rank's rule: each segment's parts divided by tp, its name kept.
    std::vector<StateSplitSegment> const& segments = four.stateLayerConfigs[0].tensors[0].splitSegments;
    ASSERT_EQ(segments.size(), 3U);
    EXPECT_EQ(segments[0].parts, 4);
    EXPECT_EQ(segments[0].partSize, 128);
    EXPECT_EQ(segments[0].name, "key heads");
    EXPECT_EQ(segments[2].parts, 8);
}

// vLLM's "SD" conv layout declares the channels last: {3, 8192} split along dimension 1. tp 4: [3, 2048].
TEST(TensorParallelStates, SplitsTheDimensionTheRuleNames)
{
    StateLayerConfig const layer{{splitTensor("conv", {3, 8192}, DataType::kBF16, 1,
        {parts(16, 128), parts(16, 128), parts(32, 128)})}};
    EXPECT_EQ(shapesOf(tensorParallelShard(modelWith({layer}), 4, 2).config, 0), (std::vector<Shape>{{3, 2048}}));
}

// Bamba-9B: one group, which every rank keeps (vLLM's extra_groups_for_head_shards). tp 2: conv [64 x 64 + 2 x 128, 3]
// = [4352, 3] bfloat16 = 26,112 bytes; ssm [64, 64, 128] float32 = 2,097,152 bytes; 2,123,264 a slot. tp 4: [32 x 64
// + 256, 3] = [2304, 3]. Whole: conv [8448, 3] = 50,688 bytes, ssm 4,194,304; 4,244,992 a slot. Both ranks together:
// 2 x 2,123,264 = 4,246,528 = the whole plus one more copy of B and C (2 x 128 x 3 x 2 = 1,536 bytes).
TEST(TensorParallelStates, Mamba2KeepsASingleGroupOnEveryRank)
{
    KVCacheConfig const model = modelWith({mamba2(1)});
    EXPECT_EQ(computeLayout(model).stateBytesPerSlot, 4244992);
    for (int32_t rank = 0; rank < 2; ++rank)
    {
        KVCacheConfig const two = tensorParallelShard(model, 2, rank).config;
        EXPECT_EQ(shapesOf(two, 0), (std::vector<Shape>{{4352, 3}, {64, 64, 128}}));
        EXPECT_EQ(computeLayout(two).stateBytesPerSlot, 2123264);
    }
    EXPECT_EQ(2 * 2123264, 4244992 + 1536);
    EXPECT_EQ(shapesOf(tensorParallelShard(model, 4, 1).config, 0), (std::vector<Shape>{{2304, 3}, {32, 64, 128}}));
    // The replicated segment keeps its one part on the rank.
    KVCacheConfig const four = tensorParallelShard(model, 4, 1).config;
    StateSplitSegment const& b = four.stateLayerConfigs[0].tensors[0].splitSegments[1];
    EXPECT_EQ(b.parts, 1);
    EXPECT_TRUE(b.replicated);
}

// Nemotron-H-8B: 8 groups, split with the heads. tp 4: conv [32 x 64 + 2 x 2 x 128, 3] = [2560, 3] bfloat16 = 15,360
// bytes; ssm [32, 64, 128] = 1,048,576 bytes; 1,063,936 a slot. 16 ranks split the heads but not the 8 groups.
TEST(TensorParallelStates, Mamba2SplitsHeadsAndGroups)
{
    KVCacheConfig const model = modelWith({mamba2(8)});
    KVCacheConfig const four = tensorParallelShard(model, 4, 0).config;
    EXPECT_EQ(shapesOf(four, 0), (std::vector<Shape>{{2560, 3}, {32, 64, 128}}));
    EXPECT_EQ(computeLayout(four).stateBytesPerSlot, 1063936);
    EXPECT_TRUE(test::throwsNaming<InvalidArgumentError>([&] { tensorParallelShard(model, 16, 0); },
        {"tensorParallelShard", "stateLayerConfigs[0].tensors[0].splitSegments[1].parts", "\"conv\"", "n_groups = 8",
            "is 8", "multiple of tp = 16"}));
}

// Jamba (Mamba v1): d_inner 2 x 4096 = 8192, d_state 16, kernel 4, split along dimension 0 with no segments (one
// channel a part). tp 2: conv [4096, 3] bfloat16 = 24,576 bytes, ssm [4096, 16] float32 = 262,144; 286,720 a slot.
TEST(TensorParallelStates, MambaSplitsInnerChannelsWithoutSegments)
{
    KVCacheConfig const model = modelWith({StateLayerConfig{{splitTensor("conv", {8192, 3}, DataType::kBF16, 0),
        splitTensor("ssm", {8192, 16}, DataType::kFLOAT, 0)}}});
    KVCacheConfig const two = tensorParallelShard(model, 2, 1).config;
    EXPECT_EQ(shapesOf(two, 0), (std::vector<Shape>{{4096, 3}, {4096, 16}}));
    EXPECT_EQ(computeLayout(two).stateBytesPerSlot, 286720);
    EXPECT_TRUE(two.stateLayerConfigs[0].tensors[0].splitSegments.empty());
    // 8192 channels over 3 ranks.
    EXPECT_TRUE(test::throwsNaming<InvalidArgumentError>([&] { tensorParallelShard(model, 3, 0); },
        {"stateLayerConfigs[0].tensors[0].shape[0]", "\"conv\"", "is 8192", "multiple of tp = 3"}));
}

// LFM2-1.2B: hidden_size 2048, conv_L_cache 3. tp 2: conv [1024, 2] bfloat16 = 4,096 bytes a slot.
TEST(TensorParallelStates, ShortConvSplitsChannels)
{
    KVCacheConfig const model = modelWith(
        {StateLayerConfig{{splitTensor("conv", {2048, 2}, DataType::kBF16, 0, {parts(2048, 1, "hidden_size")})}}});
    KVCacheConfig const two = tensorParallelShard(model, 2, 0).config;
    EXPECT_EQ(shapesOf(two, 0), (std::vector<Shape>{{1024, 2}}));
    EXPECT_EQ(computeLayout(two).stateBytesPerSlot, 4096);
}

// Kimi-Linear-48B's KDA: 32 heads of 128, kernel 4. tp 2: q, k and v convs [16 x 128, 3] = [2048, 3] bfloat16 =
// 12,288 bytes each; recurrent [16, 128, 128] float32 = 1,048,576; 1,085,440 a slot.
TEST(TensorParallelStates, KdaSplitsHeads)
{
    std::vector<StateTensorConfig> tensors;
    for (char const* name : {"q_conv", "k_conv", "v_conv"})
    {
        tensors.push_back(splitTensor(name, {4096, 3}, DataType::kBF16, 0, {parts(32, 128, "num_heads")}));
    }
    tensors.push_back(splitTensor("recurrent", {32, 128, 128}, DataType::kFLOAT, 0, {parts(32, 1, "num_heads")}));
    KVCacheConfig const model = modelWith({StateLayerConfig{tensors}});
    KVCacheConfig const two = tensorParallelShard(model, 2, 1).config;
    EXPECT_EQ(shapesOf(two, 0), (std::vector<Shape>{{2048, 3}, {2048, 3}, {2048, 3}, {16, 128, 128}}));
    EXPECT_EQ(computeLayout(two).stateBytesPerSlot, 1085440);
    // 32 heads over 64 ranks; heads are never cut, although 4096 channels would divide.
    EXPECT_TRUE(test::throwsNaming<InvalidArgumentError>([&] { tensorParallelShard(model, 64, 0); },
        {"stateLayerConfigs[0].tensors[0].splitSegments[0].parts", "num_heads = 32", "multiple of tp = 64"}));
}

// A tensor without a rule is whole on every rank, as before rules existed, beside a split one; other fields and the
// state slots stay the model's.
TEST(TensorParallelStates, TensorsWithoutARuleStayWhole)
{
    KVCacheConfig model = modelWith({StateLayerConfig{{StateTensorConfig{"whole", {5, 7}, DataType::kHALF},
        splitTensor("split", {12, 2}, DataType::kFLOAT, 0)}}});
    model.numCheckpointSlots = 3;
    TensorParallelShard const shard = tensorParallelShard(model, 4, 3);
    EXPECT_EQ(shapesOf(shard.config, 0), (std::vector<Shape>{{5, 7}, {3, 2}}));
    EXPECT_EQ(shard.config.stateLayerConfigs[0].tensors[0].splitDim, -1);
    EXPECT_EQ(shard.config.stateLayerConfigs[0].tensors[0].dataType, DataType::kHALF);
    EXPECT_EQ(shard.config.stateLayerConfigs[0].tensors[1].splitDim, 0);
    EXPECT_EQ(shard.config.numCheckpointSlots, 3);
    EXPECT_EQ(computeLayout(shard.config).numStateSlots, 4);
    // 5 x 7 x 2 + 3 x 2 x 4 = 94 bytes a slot.
    EXPECT_EQ(computeLayout(shard.config).stateBytesPerSlot, 94);
    // tp 1 is the model.
    EXPECT_EQ(shapesOf(tensorParallelShard(model, 1, 0).config, 0), (std::vector<Shape>{{5, 7}, {12, 2}}));
}

//! The independent model of one segment's split: the entries each of `tp` ranks holds, dealing the parts out in
//! order and filling one rank before the next (a replicated segment's parts go to every rank).
std::vector<int64_t> dealEntries(StateSplitSegment const& segment, int32_t tp)
{
    std::vector<int64_t> held(static_cast<size_t>(tp), 0);
    if (segment.replicated)
    {
        for (int64_t& entries : held)
        {
            entries = segment.parts * segment.partSize;
        }
        return held;
    }
    std::vector<int64_t> partsHeld(static_cast<size_t>(tp), 0);
    size_t rank = 0;
    for (int64_t p = 0; p < segment.parts; ++p)
    {
        if (partsHeld[rank] * tp == segment.parts)
        {
            ++rank;
        }
        ++partsHeld[rank];
        held[rank] += segment.partSize;
    }
    return held;
}

// Over segment mixes and every tp that divides their split parts: each rank's extent is what the dealer gives it, the
// same for every rank, and the ranks together hold the whole extent plus (tp - 1) copies of the replicated entries.
TEST(TensorParallelStates, ExtentsMatchTheDealerAndAddUpToTheWholePlusCopies)
{
    std::vector<std::vector<StateSplitSegment>> const mixes = {
        {parts(24, 1)},
        {parts(12, 8), parts(12, 8), parts(24, 4)},
        {parts(48, 3), parts(1, 5, "", true), parts(1, 5, "", true)},
        {parts(2, 7, "", true), parts(6, 2), parts(24, 1)},
    };
    int checked = 0;
    for (std::vector<StateSplitSegment> const& segments : mixes)
    {
        int64_t whole = 0;
        int64_t replicatedEntries = 0;
        for (StateSplitSegment const& segment : segments)
        {
            whole += segment.parts * segment.partSize;
            replicatedEntries += segment.replicated ? segment.parts * segment.partSize : 0;
        }
        KVCacheConfig const model =
            modelWith({StateLayerConfig{{splitTensor("s", {2, whole}, DataType::kUINT8, 1, segments)}}});
        for (int32_t const tp : {1, 2, 3, 6})
        {
            std::vector<int64_t> expected(static_cast<size_t>(tp), 0);
            for (StateSplitSegment const& segment : segments)
            {
                std::vector<int64_t> const dealt = dealEntries(segment, tp);
                for (size_t r = 0; r < dealt.size(); ++r)
                {
                    expected[r] += dealt[r];
                }
            }
            int64_t sum = 0;
            for (int32_t rank = 0; rank < tp; ++rank)
            {
                SCOPED_TRACE(testing::Message() << "extent " << whole << ", tp " << tp << ", rank " << rank);
                Shape const shape = tensorParallelShard(model, tp, rank).config.stateLayerConfigs[0].tensors[0].shape;
                EXPECT_EQ(shape, (Shape{2, expected[static_cast<size_t>(rank)]}));
                sum += shape[1];
                ++checked;
            }
            EXPECT_EQ(sum, whole + (tp - 1) * replicatedEntries) << "extent " << whole << ", tp " << tp;
        }
    }
    EXPECT_EQ(checked, 4 * (1 + 2 + 3 + 6));
}

TEST(TensorParallelStates, RefusesBadRulesNamingFieldValueAndLimit)
{
    auto const refuses = [](StateTensorConfig const& tensor, int32_t tp, std::vector<std::string> const& words)
    {
        KVCacheConfig const model = modelWith({gatedDeltaNet(), StateLayerConfig{{tensor}}});
        return test::throwsNaming<InvalidArgumentError>([&] { tensorParallelShard(model, tp, 0); }, words);
    };
    EXPECT_TRUE(refuses(splitTensor("s", {8, 4}, DataType::kFLOAT, 2), 2,
        {"tensorParallelShard", "stateLayerConfigs[1].tensors[0].splitDim", "\"s\"", "is 2", "[0, 2)"}));
    EXPECT_TRUE(refuses(splitTensor("s", {8, 4}, DataType::kFLOAT, -2), 2, {"splitDim", "is -2", "-1"}));
    EXPECT_TRUE(refuses(splitTensor("s", {8, 4}, DataType::kFLOAT, 0, {parts(3, 2), parts(1, 1)}), 1,
        {"stateLayerConfigs[1].tensors[0].splitSegments", "span 7", "shape[0] = 8"}));
    EXPECT_TRUE(refuses(splitTensor("s", {8, 4}, DataType::kFLOAT, 0, {parts(0, 8)}), 1,
        {"splitSegments[0].parts", "is 0", "> 0"}));
    EXPECT_TRUE(refuses(splitTensor("s", {8, 4}, DataType::kFLOAT, 0, {parts(8, -1)}), 1,
        {"splitSegments[0].partSize", "is -1", "> 0"}));
    EXPECT_TRUE(refuses(splitTensor("s", {8, 4}, DataType::kFLOAT, -1, {parts(8, 1)}), 1,
        {"splitSegments", "1 segments", "splitDim is -1"}));
    EXPECT_TRUE(refuses(splitTensor("s", {8, 6}, DataType::kFLOAT, 1, {parts(2, 1), parts(4, 1, "heads")}), 4,
        {"stateLayerConfigs[1].tensors[0].splitSegments[0].parts", "is 2", "multiple of tp = 4"}));
    // A replicated segment need not divide; the next one must.
    EXPECT_TRUE(refuses(splitTensor("s", {8, 7}, DataType::kFLOAT, 1, {parts(3, 1, "", true), parts(4, 1, "heads")}),
        8, {"splitSegments[1].parts", "heads = 4", "multiple of tp = 8"}));
    // 2^62 parts of 4 entries leave 64 bits.
    EXPECT_TRUE(refuses(splitTensor("s", {8}, DataType::kFLOAT, 0, {parts(int64_t{1} << 62, 4)}), 1,
        {"\"s\"", "split entries", "overflows 64-bit"}));
}

// The state tensors are checked before the attention layers: a model whose state and attention layers both fail names
// the state tensor.
TEST(TensorParallelStates, ChecksStateTensorsFirst)
{
    KVCacheConfig model = modelWith({gatedDeltaNet()});
    model.layerConfigs[0].numKVHeads = 6;
    // tp 4: 6 KV heads neither divide nor are divided, and 16 key heads split; 5 splits neither.
    EXPECT_TRUE(test::throwsNaming<InvalidArgumentError>(
        [&] { tensorParallelShard(model, 4, 0); }, {"layerConfigs[0].numKVHeads", "6", "tp = 4"}));
    EXPECT_TRUE(test::throwsNaming<InvalidArgumentError>([&] { tensorParallelShard(model, 5, 0); },
        {"stateLayerConfigs[0].tensors[0].splitSegments[0].parts", "key heads = 16", "tp = 5"}));
}

} // namespace
} // namespace kvcache::rt
