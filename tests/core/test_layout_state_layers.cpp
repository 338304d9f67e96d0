// State layers in the layout (no GPU): per-tensor, per-layer and per-slot bytes, tensor offsets, state slots in the
// budget maths, and the named errors of a bad state layer. Every expected size is worked out by hand in the comments.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"

namespace kvcache::rt
{
namespace
{

//! A gated delta net layer of Qwen3-Next-80B: 16 key heads and 32 value heads of 128, kernel 4. The conv state is
//! [2 * 16 * 128 + 32 * 128, 4 - 1] = [8192, 3] in bfloat16, the recurrent state [32, 128, 128] in float32.
StateLayerConfig gatedDeltaNetLayer()
{
    return StateLayerConfig{{StateTensorConfig{"conv", {8192, 3}, DataType::kBF16},
        StateTensorConfig{"recurrent", {32, 128, 128}, DataType::kFLOAT}}};
}

//! One full-attention layer of 2 KV heads x 64, float16.
std::vector<KVLayerConfig> oneAttentionLayer()
{
    return {KVLayerConfig{2, 64}};
}

TEST(StateLayout, CountsEveryTensorLayerAndSlot)
{
    KVCacheConfig const config = test::ConfigBuilder(oneAttentionLayer())
                                     .maxBatchSize(4)
                                     .maxSequenceLength(256)
                                     .tokensPerPage(16)
                                     .stateLayers({gatedDeltaNetLayer(), gatedDeltaNetLayer()})
                                     .numCheckpointSlots(2)
                                     .build();
    KVCacheLayout const layout = computeLayout(config);
    // 4 sequences + 2 checkpoints = 6 slots.
    EXPECT_EQ(layout.numStateSlots, 6);
    EXPECT_EQ(layout.numCheckpointSlots, 2);
    ASSERT_EQ(layout.stateLayers.size(), 2U);
    for (StateLayerLayout const& layer : layout.stateLayers)
    {
        ASSERT_EQ(layer.tensors.size(), 2U);
        StateTensorLayout const& conv = layer.tensors[0];
        StateTensorLayout const& recurrent = layer.tensors[1];
        EXPECT_EQ(conv.name, "conv");
        EXPECT_EQ(conv.shape, (std::vector<int64_t>{8192, 3}));
        EXPECT_EQ(conv.dataType, DataType::kBF16);
        EXPECT_EQ(conv.slotElems, 24576); // 8192 * 3
        EXPECT_EQ(conv.slotBytes, 49152); // 24576 * 2
        EXPECT_EQ(conv.offsetBytes, 0);
        EXPECT_EQ(conv.bytes, 294912); // 6 * 49152, = 1152 * 256: the next tensor needs no padding
        EXPECT_EQ(recurrent.name, "recurrent");
        EXPECT_EQ(recurrent.dataType, DataType::kFLOAT);
        EXPECT_EQ(recurrent.slotElems, 524288);  // 32 * 128 * 128
        EXPECT_EQ(recurrent.slotBytes, 2097152); // 524288 * 4
        EXPECT_EQ(recurrent.offsetBytes, 294912);
        EXPECT_EQ(recurrent.bytes, 12582912);  // 6 * 2097152
        EXPECT_EQ(layer.slotBytes, 2146304);   // 49152 + 2097152
        EXPECT_EQ(layer.layerBytes, 12877824); // 294912 + 12582912
    }
    EXPECT_EQ(layout.stateBytesPerSlot, 4292608); // 2 * 2146304
    EXPECT_EQ(layout.stateBytes, 25755648);       // 2 * 12877824
    // The attention layer keeps its page group and its bytes: 16 pages a sequence of 2 halves x 16 tokens x 2 heads x
    // 64 x 2 bytes = 8192 bytes a page id; 4 sequences x 16 pages = 64 pages, 524288 bytes. cacheBytes counts pages
    // only.
    ASSERT_EQ(layout.groups.size(), 1U);
    EXPECT_EQ(layout.groups[0].layers, std::vector<int32_t>{0});
    EXPECT_EQ(layout.bytesPerPage, 8192);
    EXPECT_EQ(layout.cacheBytes, 524288);
}

TEST(StateLayout, QwenNextSequenceStateOverThirtySixLayers)
{
    // Qwen3-Next-80B has 36 gated delta net layers: 36 x 2146304 = 77266944 bytes (about 77 MB) a sequence.
    KVCacheConfig const config = test::ConfigBuilder(oneAttentionLayer())
                                     .stateLayers(std::vector<StateLayerConfig>(36, gatedDeltaNetLayer()))
                                     .build();
    KVCacheLayout const layout = computeLayout(config);
    EXPECT_EQ(layout.numStateSlots, 1); // maxBatchSize 1, no checkpoints
    EXPECT_EQ(layout.stateBytesPerSlot, 77266944);
    EXPECT_EQ(layout.stateBytes, 77266944);
}

TEST(StateLayout, AlignsEachTensorStartAndCountsThePadding)
{
    // Tensor "a": 3 float16 = 6 bytes a slot, 5 slots = 30 bytes at 0. Tensor "b": 2 x 2 float32 = 16 bytes a slot,
    // 80 bytes, starting at 30 rounded up to 256. Tensor "c": 7 uint8, 35 bytes, at 336 rounded up to 512.
    StateLayerConfig const layer{{StateTensorConfig{"a", {3}, DataType::kHALF},
        StateTensorConfig{"b", {2, 2}, DataType::kFLOAT}, StateTensorConfig{"c", {7}, DataType::kUINT8}}};
    KVCacheConfig const config =
        test::ConfigBuilder(oneAttentionLayer()).maxBatchSize(3).stateLayers({layer}).numCheckpointSlots(2).build();
    KVCacheLayout const layout = computeLayout(config);
    ASSERT_EQ(layout.stateLayers.size(), 1U);
    StateLayerLayout const& state = layout.stateLayers[0];
    EXPECT_EQ(state.tensors[0].offsetBytes, 0);
    EXPECT_EQ(state.tensors[0].bytes, 30);
    EXPECT_EQ(state.tensors[1].offsetBytes, 256);
    EXPECT_EQ(state.tensors[1].bytes, 80);
    EXPECT_EQ(state.tensors[2].offsetBytes, 512);
    EXPECT_EQ(state.tensors[2].bytes, 35);
    EXPECT_EQ(state.slotBytes, 29);   // 6 + 16 + 7: no padding in one sequence's state
    EXPECT_EQ(state.layerBytes, 547); // 512 + 35
    EXPECT_EQ(layout.stateBytesPerSlot, 29);
    EXPECT_EQ(layout.stateBytes, 547);
}

TEST(StateLayout, StateLayersAloneHaveNoPageGroups)
{
    // A pure recurrent model (no attention layer): one Mamba-like layer, conv [64, 3] float16 (384 bytes a slot) and
    // SSM [64, 16] float32 (4096 bytes a slot); 2 slots: conv 768 bytes at 0, SSM 8192 bytes at 768 (3 x 256).
    StateLayerConfig const mamba{
        {StateTensorConfig{"conv", {64, 3}, DataType::kHALF}, StateTensorConfig{"ssm", {64, 16}, DataType::kFLOAT}}};
    KVCacheConfig const config = test::ConfigBuilder({}).maxBatchSize(2).stateLayers({mamba}).build();
    KVCacheLayout const layout = computeLayout(config);
    EXPECT_TRUE(layout.groups.empty());
    EXPECT_TRUE(layout.layers.empty());
    EXPECT_EQ(layout.cacheBytes, 0);
    EXPECT_EQ(layout.numStateSlots, 2);
    EXPECT_EQ(layout.stateLayers[0].tensors[1].offsetBytes, 768);
    EXPECT_EQ(layout.stateBytesPerSlot, 4480); // 384 + 4096
    EXPECT_EQ(layout.stateBytes, 8960);        // 768 + 8192
    // No pages to buy: every budget gives 0 sequences and the state bytes.
    BudgetSplit const split = splitBudget(config, int64_t{1} << 30);
    EXPECT_EQ(split.sequences, 0);
    EXPECT_TRUE(split.numPagesPerGroup.empty());
    EXPECT_EQ(split.bytes, 8960);
    EXPECT_EQ(split.stateBytes, 8960);
}

TEST(StateLayout, NoStateLayersLeavesTheStateFieldsEmpty)
{
    KVCacheLayout const layout = computeLayout(test::ConfigBuilder(oneAttentionLayer()).maxBatchSize(8).build());
    EXPECT_EQ(layout.numStateSlots, 0);
    EXPECT_EQ(layout.numCheckpointSlots, 0);
    EXPECT_TRUE(layout.stateLayers.empty());
    EXPECT_EQ(layout.stateBytesPerSlot, 0);
    EXPECT_EQ(layout.stateBytes, 0);
}

//! One attention layer (8192 bytes a page id in pages of 16, 4 pages a sequence of 64 tokens: 32768 bytes a sequence)
//! and one state layer of 1000 float32 (4000 bytes a slot) with 2 sequences and 1 checkpoint: 12000 state bytes.
KVCacheConfig budgetModel()
{
    StateLayerConfig const layer{{StateTensorConfig{"state", {1000}, DataType::kFLOAT}}};
    return test::ConfigBuilder(oneAttentionLayer())
        .maxBatchSize(2)
        .maxSequenceLength(64)
        .tokensPerPage(16)
        .stateLayers({layer})
        .numCheckpointSlots(1)
        .build();
}

TEST(StateLayout, SplitBudgetTakesTheStateSlotsOffFirst)
{
    KVCacheConfig const config = budgetModel();
    ASSERT_EQ(computeLayout(config).stateBytes, 12000);
    // 12000 + 3 x 32768 = 110304: exactly 3 sequences of pages.
    BudgetSplit const three = splitBudget(config, 110304);
    EXPECT_EQ(three.sequences, 3);
    EXPECT_EQ(three.numPagesPerGroup, std::vector<int64_t>{12});
    EXPECT_EQ(three.bytes, 110304);
    EXPECT_EQ(three.stateBytes, 12000);
    EXPECT_EQ(splitBudget(config, 110303).sequences, 2);
    EXPECT_EQ(splitBudget(config, 110303).bytes, 77536); // 12000 + 2 x 32768
    // A budget below the state bytes buys no pages; the bytes are the state's, which the cache needs anyway.
    BudgetSplit const none = splitBudget(config, 11999);
    EXPECT_EQ(none.sequences, 0);
    EXPECT_EQ(none.numPagesPerGroup, std::vector<int64_t>{0});
    EXPECT_EQ(none.bytes, 12000);
}

TEST(StateLayout, MaxPagesForBudgetTakesTheStateSlotsOffFirst)
{
    KVCacheConfig const config = budgetModel();
    // (12000 + 10 x 8192 - budget) pages: 10 at 93920, 9 one byte below, 0 below the state bytes.
    EXPECT_EQ(maxPagesForBudget(config, 93920), 10);
    EXPECT_EQ(maxPagesForBudget(config, 93919), 9);
    EXPECT_EQ(maxPagesForBudget(config, 12000), 0);
    EXPECT_EQ(maxPagesForBudget(config, 100), 0);
}

//! Returns a config of one attention layer and the state layer `layer`.
KVCacheConfig withStateLayer(StateLayerConfig const& layer)
{
    return test::ConfigBuilder(oneAttentionLayer()).stateLayers({layer}).build();
}

TEST(StateLayout, RefusesBadStateLayersByName)
{
    auto const refuses = [](StateLayerConfig const& layer, std::vector<std::string> const& words)
    {
        return test::throwsNaming<InvalidConfigError>(
            [&] { static_cast<void>(computeLayout(withStateLayer(layer))); }, words);
    };
    EXPECT_TRUE(refuses(StateLayerConfig{}, {"stateLayerConfigs[0].tensors", "empty", "at least one"}));
    EXPECT_TRUE(refuses(StateLayerConfig{{StateTensorConfig{"conv", {8, 0}, DataType::kHALF}}},
        {"stateLayerConfigs[0].tensors[0].shape[1]", "\"conv\"", "is 0", "> 0"}));
    EXPECT_TRUE(refuses(
        StateLayerConfig{{StateTensorConfig{"conv", {-2}, DataType::kHALF}}}, {"tensors[0].shape[0]", "is -2", "> 0"}));
    EXPECT_TRUE(refuses(StateLayerConfig{{StateTensorConfig{"ssm", {4}, static_cast<DataType>(99)}}},
        {"stateLayerConfigs[0].tensors[0].dataType", "\"ssm\"", "99", "not a DataType"}));
    EXPECT_TRUE(refuses(StateLayerConfig{{StateTensorConfig{"", {4}, DataType::kFLOAT}}},
        {"stateLayerConfigs[0].tensors[0].name", "empty"}));
    EXPECT_TRUE(refuses(StateLayerConfig{{StateTensorConfig{"ssm", {}, DataType::kFLOAT}}},
        {"tensors[0].shape", "0 dimensions", "1 to 7"}));
    EXPECT_TRUE(refuses(StateLayerConfig{{StateTensorConfig{"ssm", {1, 1, 1, 1, 1, 1, 1, 1}, DataType::kFLOAT}}},
        {"tensors[0].shape", "8 dimensions", "1 to 7"}));
    EXPECT_TRUE(refuses(StateLayerConfig{{StateTensorConfig{"x", {4}, DataType::kFLOAT},
                            StateTensorConfig{"x", {2}, DataType::kFLOAT}}},
        {"stateLayerConfigs[0].tensors[1].name", "\"x\"", "tensors[0]", "unique"}));
}

// A tensor-parallel split rule is checked by computeLayout too, so a bad one is refused without tensor parallelism; a
// good one changes no size.
TEST(StateLayout, ChecksSplitRulesAtOneRank)
{
    auto const tensor = [](int32_t dim, std::vector<StateSplitSegment> segments)
    { return StateLayerConfig{{StateTensorConfig{"conv", {8192, 3}, DataType::kBF16, dim, std::move(segments)}}}; };
    auto const refuses = [](StateLayerConfig const& layer, std::vector<std::string> const& words)
    {
        return test::throwsNaming<InvalidConfigError>(
            [&] { static_cast<void>(computeLayout(withStateLayer(layer))); }, words);
    };
    EXPECT_TRUE(refuses(tensor(2, {}), {"stateLayerConfigs[0].tensors[0].splitDim", "\"conv\"", "is 2", "[0, 2)"}));
    EXPECT_TRUE(refuses(tensor(-3, {}), {"tensors[0].splitDim", "is -3", "-1"}));
    EXPECT_TRUE(refuses(tensor(-1, {StateSplitSegment{8192}}), {"tensors[0].splitSegments", "splitDim is -1"}));
    // 16 x 128 + 16 x 128 + 32 x 127 = 8,160 entries, not 8,192.
    EXPECT_TRUE(refuses(tensor(0, {StateSplitSegment{16, 128}, StateSplitSegment{16, 128}, StateSplitSegment{32, 127}}),
        {"tensors[0].splitSegments", "span 8160", "shape[0] = 8192"}));
    EXPECT_TRUE(refuses(tensor(0, {StateSplitSegment{0, 128}}), {"splitSegments[0].parts", "is 0", "> 0"}));
    EXPECT_TRUE(refuses(tensor(0, {StateSplitSegment{8192, 0}}), {"splitSegments[0].partSize", "is 0", "> 0"}));
    // Qwen3-Next's conv as q, k and v channels: [8192, 3] bfloat16 = 49,152 bytes a slot, with or without the rule.
    KVCacheLayout const layout = computeLayout(withStateLayer(
        tensor(0, {StateSplitSegment{16, 128}, StateSplitSegment{16, 128}, StateSplitSegment{32, 128}})));
    EXPECT_EQ(layout.stateBytesPerSlot, 49152);
    EXPECT_EQ(computeLayout(withStateLayer(tensor(1, {}))).stateBytesPerSlot, 49152);
}

TEST(StateLayout, RefusesSizesThatLeaveSixtyFourBits)
{
    int64_t const big = int64_t{1} << 32;
    // Elements: 2^32 x 2^32 = 2^64.
    EXPECT_TRUE(test::throwsNaming<InvalidConfigError>(
        [&]
        {
            static_cast<void>(
                computeLayout(withStateLayer(StateLayerConfig{{StateTensorConfig{"s", {big, big}, DataType::kHALF}}})));
        },
        {"state layer 0", "\"s\"", "elements per slot", "overflows 64-bit"}));
    // Bytes a slot: 2^62 elements x 4 bytes = 2^64.
    EXPECT_TRUE(test::throwsNaming<InvalidConfigError>(
        [&]
        {
            static_cast<void>(computeLayout(
                withStateLayer(StateLayerConfig{{StateTensorConfig{"s", {int64_t{1} << 62}, DataType::kFLOAT}}})));
        },
        {"\"s\"", "bytes per slot", "overflows 64-bit"}));
    // Bytes of all slots: 2^61 bytes a slot x 4 slots = 2^63.
    KVCacheConfig slots =
        withStateLayer(StateLayerConfig{{StateTensorConfig{"s", {int64_t{1} << 61}, DataType::kUINT8}}});
    slots.maxBatchSize = 4;
    EXPECT_TRUE(test::throwsNaming<InvalidConfigError>(
        [&] { static_cast<void>(computeLayout(slots)); }, {"\"s\"", "bytes", "overflows 64-bit"}));
    // Two layers of 2^62 bytes each: the sum, 2^63, leaves int64.
    StateLayerConfig const half{{StateTensorConfig{"s", {int64_t{1} << 62}, DataType::kUINT8}}};
    KVCacheConfig const twoLayers = test::ConfigBuilder(oneAttentionLayer()).stateLayers({half, half}).build();
    EXPECT_TRUE(test::throwsNaming<InvalidConfigError>(
        [&] { static_cast<void>(computeLayout(twoLayers)); }, {"state bytes", "overflows 64-bit"}));
}

TEST(StateLayout, RefusesBadCheckpointSlotsByName)
{
    StateLayerConfig const layer{{StateTensorConfig{"s", {4}, DataType::kFLOAT}}};
    KVCacheConfig negative = withStateLayer(layer);
    negative.numCheckpointSlots = -1;
    EXPECT_TRUE(test::throwsNaming<InvalidConfigError>(
        [&] { static_cast<void>(computeLayout(negative)); }, {"numCheckpointSlots", "-1", ">= 0"}));
    KVCacheConfig const withoutState = test::ConfigBuilder(oneAttentionLayer()).numCheckpointSlots(3).build();
    EXPECT_TRUE(test::throwsNaming<InvalidConfigError>(
        [&] { static_cast<void>(computeLayout(withoutState)); }, {"numCheckpointSlots", "3", "without state layers"}));
    // kMAX_NUM_PAGES sequences of one token in pages of one, and kMAX_NUM_PAGES + 2 checkpoints: 2^31 slots.
    KVCacheConfig tooMany =
        test::ConfigBuilder({}).maxBatchSize(kMAX_NUM_PAGES).maxSequenceLength(1).tokensPerPage(1).build();
    tooMany.stateLayerConfigs = {layer};
    tooMany.numCheckpointSlots = kMAX_NUM_PAGES + 2;
    EXPECT_TRUE(test::throwsNaming<InvalidConfigError>([&] { static_cast<void>(computeLayout(tooMany)); },
        {"numCheckpointSlots", std::to_string(kMAX_NUM_PAGES + 2), "2147483648", "int32"}));
    // The same with one checkpoint fewer fits: 2^31 - 1 slots.
    tooMany.numCheckpointSlots = kMAX_NUM_PAGES + 1;
    EXPECT_EQ(computeLayout(tooMany).numStateSlots, std::numeric_limits<int32_t>::max());
}

} // namespace
} // namespace kvcache::rt
