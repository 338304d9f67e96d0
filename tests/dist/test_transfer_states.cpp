// Host tests of state slots in transfers (no GPU): each side's state layers live in host memory laid out by the
// documented rule (tensors of a layer one after another, each starting a multiple of 256 bytes into the layer, slot n
// of a tensor slotBytes * n bytes into it), the remote side filled with bytes that differ per side, layer, tensor,
// slot and byte, the local side poisoned. The ranges and prepared lists are applied as a transfer library copies them,
// and every byte of every slot is checked.

#include "kvcache/core/data_type.h"
#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/dist/tensor_parallel.h"
#include "kvcache/dist/transfer_descriptors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"

namespace kvcache::rt
{
namespace
{

using test::ConfigBuilder;
using test::throwsNaming;

constexpr uint8_t kPOISON = 0xA5;
constexpr int32_t kSLOTS = 7; // maxBatchSize 4 + 3 checkpoint slots

//! Per tensor, by hand: its data type's size times the product of its extents.
struct HandTensor
{
    int64_t slotBytes;
    int64_t offset; //!< in its layer, by the 256-byte rule
};

//! Two state layers: a Mamba2-like one (a float16 conv state of 8 x 3 = 48 bytes a slot, a float32 SSM state of
//! 2 x 4 x 4 = 128 bytes a slot) and a one-tensor layer of 33 one-byte values (odd bytes a slot).
std::vector<StateLayerConfig> stateLayers(DataType ssmType = DataType::kFLOAT, int64_t lastExtent = 33)
{
    return {StateLayerConfig{{StateTensorConfig{"conv", {8, 3}, DataType::kHALF},
                StateTensorConfig{"ssm", {2, 4, 4}, ssmType}}},
        StateLayerConfig{{StateTensorConfig{"short_conv", {lastExtent}, DataType::kINT8}}}};
}

//! The tensors of stateLayers() by hand: per layer, per tensor.
std::vector<std::vector<HandTensor>> const& handTensors()
{
    // conv: 7 slots x 48 bytes = 336 bytes, so ssm starts at 512; short_conv starts its own layer at 0.
    static std::vector<std::vector<HandTensor>> const tensors = {{{48, 0}, {128, 512}}, {{33, 0}}};
    return tensors;
}

int64_t handLayerBytes(std::vector<HandTensor> const& tensors)
{
    HandTensor const& last = tensors.back();
    return last.offset + kSLOTS * last.slotBytes;
}

KVCacheConfig config(std::vector<StateLayerConfig> layers = stateLayers())
{
    ConfigBuilder builder({{2, 16}});
    builder.maxBatchSize(4).maxSequenceLength(64).tokensPerPage(16).maxTokensPerStep(16);
    return builder.stateLayers(std::move(layers)).numCheckpointSlots(3);
}

//! One side: its description and its state memory, one host buffer per state layer.
struct Side
{
    std::vector<std::vector<uint8_t>> layers;
    TransferDescription description;

    uint8_t* slot(size_t layer, size_t tensor, int32_t slot)
    {
        HandTensor const& hand = handTensors()[layer][tensor];
        return layers[layer].data() + hand.offset + int64_t{slot} * hand.slotBytes;
    }
};

uint8_t pattern(int32_t side, size_t layer, size_t tensor, int32_t slot, int64_t byte)
{
    return static_cast<uint8_t>(side * 101 + layer * 53 + tensor * 29 + static_cast<size_t>(slot) * 13 + byte * 7 + 1);
}

//! A side whose state memory holds pattern(fill, ...) in every slot, or kPOISON when fill < 0.
Side makeSide(int32_t fill, KVCacheConfig const& cacheConfig = config(), int32_t device = 0)
{
    Side side;
    KVCacheLayout const layout = computeLayout(cacheConfig);
    std::vector<uint64_t> bases = {0x1000}; // one page part (float16, one layer): never read here
    for (StateLayerLayout const& layer : layout.stateLayers)
    {
        side.layers.emplace_back(static_cast<size_t>(layer.layerBytes), kPOISON);
        bases.push_back(reinterpret_cast<uint64_t>(side.layers.back().data()));
    }
    side.description = describeForTransfer(layout, bases, device);
    if (fill >= 0)
    {
        for (size_t l = 0; l < side.layers.size() && l < handTensors().size(); ++l)
        {
            for (size_t t = 0; t < handTensors()[l].size(); ++t)
            {
                for (int32_t s = 0; s < kSLOTS; ++s)
                {
                    for (int64_t b = 0; b < handTensors()[l][t].slotBytes; ++b)
                    {
                        side.slot(l, t, s)[b] = pattern(fill, l, t, s, b);
                    }
                }
            }
        }
    }
    return side;
}

void apply(TransferDescriptors const& ranges)
{
    ASSERT_EQ(ranges.local.size(), ranges.remote.size());
    for (size_t i = 0; i < ranges.local.size(); ++i)
    {
        ASSERT_EQ(ranges.local[i].bytes, ranges.remote[i].bytes);
        std::memcpy(reinterpret_cast<void*>(ranges.local[i].address),
            reinterpret_cast<void const*>(ranges.remote[i].address), ranges.local[i].bytes);
    }
}

//! Checks every byte of `local`: slot localSlots[i] holds the remote's slot remoteSlots[i], every other slot kPOISON.
void expectMoved(Side& local, std::vector<int32_t> const& localSlots, std::vector<int32_t> const& remoteSlots)
{
    for (size_t l = 0; l < handTensors().size(); ++l)
    {
        for (size_t t = 0; t < handTensors()[l].size(); ++t)
        {
            for (int32_t s = 0; s < kSLOTS; ++s)
            {
                int32_t from = -1;
                for (size_t i = 0; i < localSlots.size(); ++i)
                {
                    from = localSlots[i] == s ? remoteSlots[i] : from;
                }
                for (int64_t b = 0; b < handTensors()[l][t].slotBytes; ++b)
                {
                    uint8_t const expected = from < 0 ? kPOISON : pattern(1, l, t, from, b);
                    ASSERT_EQ(local.slot(l, t, s)[b], expected)
                        << "layer " << l << " tensor " << t << " slot " << s << " byte " << b;
                }
            }
        }
    }
}

TEST(TransferStates, DescriptionHoldsEachTensorBySlot)
{
    Side side = makeSide(-1);
    TransferDescription const& d = side.description;
    EXPECT_EQ(d.numStateSlots, kSLOTS);
    ASSERT_EQ(d.stateLayers.size(), 2U);
    for (size_t l = 0; l < 2; ++l)
    {
        ASSERT_EQ(d.stateLayers[l].tensors.size(), handTensors()[l].size());
        for (size_t t = 0; t < handTensors()[l].size(); ++t)
        {
            EXPECT_EQ(d.stateLayers[l].tensors[t].slotBytes, handTensors()[l][t].slotBytes);
            EXPECT_EQ(d.stateLayers[l].tensors[t].base, reinterpret_cast<uint64_t>(side.slot(l, t, 0)));
        }
    }
    EXPECT_EQ(d.stateLayers[0].tensors[1].shape, (std::vector<int64_t>{2, 4, 4}));
    EXPECT_EQ(d.stateLayers[0].tensors[1].dataType, DataType::kFLOAT);

    // The registration adds one range per state layer, over its whole allocation.
    std::vector<MemoryRange> const ranges = registrationRanges(d);
    ASSERT_EQ(ranges.size(), 3U);
    for (size_t l = 0; l < 2; ++l)
    {
        EXPECT_EQ(ranges[1 + l].address, reinterpret_cast<uint64_t>(side.layers[l].data()));
        EXPECT_EQ(ranges[1 + l].bytes, static_cast<uint64_t>(handLayerBytes(handTensors()[l])));
    }
}

//! The state ranges that move remote slots `remoteSlots` into local slots `localSlots`, and both sides.
struct SlotTransfer
{
    Side remote = makeSide(1);
    Side local = makeSide(-1);
    std::vector<int32_t> localSlots;
    std::vector<int32_t> remoteSlots;
    TransferDescriptors ranges;

    SlotTransfer(std::vector<int32_t> localSlotList, std::vector<int32_t> remoteSlotList)
        : localSlots(std::move(localSlotList))
        , remoteSlots(std::move(remoteSlotList))
        , ranges(stateTransferDescriptors(local.description, localSlots.data(), remote.description, remoteSlots.data(),
              static_cast<int32_t>(localSlots.size())))
    {
    }

    //! Applies the ranges as a transfer library would and checks every byte of the local side.
    void applyAndCheck()
    {
        apply(ranges);
        expectMoved(local, localSlots, remoteSlots);
    }
};

TEST(TransferStates, RangesMoveEveryTensorOfEachSlotPair)
{
    SlotTransfer transfer({0, 5, 2}, {6, 1, 3});
    TransferDescriptors const& ranges = transfer.ranges;
    // No two pairs are adjacent on both sides: one range per pair and tensor, layer by layer.
    EXPECT_EQ(ranges.local.size(), 9U);
    EXPECT_EQ(ranges.layerEnds, (std::vector<int64_t>{6, 9}));
    EXPECT_EQ(ranges.local[0].address, reinterpret_cast<uint64_t>(transfer.local.slot(0, 0, 0)));
    EXPECT_EQ(ranges.remote[0].address, reinterpret_cast<uint64_t>(transfer.remote.slot(0, 0, 6)));
    transfer.applyAndCheck();
}

TEST(TransferStates, RunsOfSlotsMergeWithinATensor)
{
    SlotTransfer transfer({1, 2, 3}, {4, 5, 6});
    TransferDescriptors const& ranges = transfer.ranges;
    ASSERT_EQ(ranges.local.size(), 3U);
    EXPECT_EQ(ranges.layerEnds, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(ranges.local[1].bytes, 3U * 128U);
    EXPECT_EQ(ranges.local[2].bytes, 3U * 33U);
    transfer.applyAndCheck();
}

TEST(TransferStates, PreparedListsNameSlotsByIndex)
{
    Side const remote = makeSide(1);
    Side local = makeSide(-1);
    PreparedDescriptors const mine = preparedStateDescriptors(local.description);
    PreparedDescriptors const theirs = preparedStateDescriptors(remote.description);
    EXPECT_EQ(mine.numPages, kSLOTS);
    EXPECT_EQ(mine.descriptorsPerPage, 1);
    EXPECT_EQ(mine.layerEnds, (std::vector<int64_t>{2, 3}));
    ASSERT_EQ(mine.blocks.size(), 3U);
    // A transfer names descriptor (block, slot): apply the pairs as NIXL would, block by block.
    std::vector<int32_t> const localSlots = {3, 0};
    std::vector<int32_t> const remoteSlots = {0, 2};
    for (size_t b = 0; b < mine.blocks.size(); ++b)
    {
        EXPECT_EQ(mine.blocks[b].count, kSLOTS);
        EXPECT_EQ(mine.blocks[b].bytes, theirs.blocks[b].bytes);
        for (size_t i = 0; i < localSlots.size(); ++i)
        {
            std::memcpy(reinterpret_cast<void*>(mine.blocks[b].address + mine.blocks[b].bytes * localSlots[i]),
                reinterpret_cast<void const*>(theirs.blocks[b].address + theirs.blocks[b].bytes * remoteSlots[i]),
                mine.blocks[b].bytes);
        }
    }
    expectMoved(local, localSlots, remoteSlots);

    KVCacheConfig withoutStates = config({});
    withoutStates.numCheckpointSlots = 0;
    TransferDescription const none = describeForTransfer(computeLayout(withoutStates), {0x1000}, 0);
    EXPECT_TRUE(preparedStateDescriptors(none).blocks.empty());
}

TEST(TransferStates, BytesKeepTheStateLayersAndReadVersionOne)
{
    Side const side = makeSide(-1);
    std::vector<uint8_t> const bytes = encodeTransferDescription(side.description);
    TransferDescription const decoded = decodeTransferDescription(bytes.data(), bytes.size());
    EXPECT_EQ(decoded.numStateSlots, kSLOTS);
    ASSERT_EQ(decoded.stateLayers.size(), 2U);
    for (size_t l = 0; l < 2; ++l)
    {
        ASSERT_EQ(decoded.stateLayers[l].tensors.size(), side.description.stateLayers[l].tensors.size());
        for (size_t t = 0; t < decoded.stateLayers[l].tensors.size(); ++t)
        {
            TransferStateTensor const& a = decoded.stateLayers[l].tensors[t];
            TransferStateTensor const& b = side.description.stateLayers[l].tensors[t];
            EXPECT_EQ(a.base, b.base);
            EXPECT_EQ(a.dataType, b.dataType);
            EXPECT_EQ(a.shape, b.shape);
            EXPECT_EQ(a.slotBytes, b.slotBytes);
        }
    }
    // The last 8 + 4 + 8 + 4 + 8 bytes are the one-byte layer's only tensor: base, dataType, slotBytes, the count of
    // extents and the extent. Its slotBytes must match the extent.
    std::vector<uint8_t> corrupt = bytes;
    int64_t const wrongBytes = 34;
    std::memcpy(corrupt.data() + corrupt.size() - 8 - 4 - 8, &wrongBytes, sizeof wrongBytes);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { decodeTransferDescription(corrupt.data(), corrupt.size()); }, {"slotBytes", "34", "33"}));

    // A version 1 description is one without state layers: the same bytes less the state part.
    KVCacheConfig withoutStates = config({});
    withoutStates.numCheckpointSlots = 0;
    TransferDescription const none = describeForTransfer(computeLayout(withoutStates), {0x1000}, 3);
    std::vector<uint8_t> old = encodeTransferDescription(none);
    old.resize(old.size() - 8); // numStateSlots and the count of state layers
    uint32_t const one = 1;
    std::memcpy(old.data() + 4, &one, sizeof one);
    TransferDescription const read = decodeTransferDescription(old.data(), old.size());
    EXPECT_EQ(read.device, 3);
    EXPECT_EQ(read.numStateSlots, 0);
    EXPECT_TRUE(read.stateLayers.empty());
    EXPECT_EQ(read.groups.size(), 1U);
}

TEST(TransferStates, MismatchesAndBadSlotsAreRefusedByName)
{
    Side local = makeSide(-1);
    Side const remote = makeSide(1);
    EXPECT_EQ(stateTransferMismatch(local.description, remote.description), "");

    Side const otherType = makeSide(-1, config(stateLayers(DataType::kBF16)));
    EXPECT_NE(stateTransferMismatch(local.description, otherType.description).find("state layer 0 tensor 1's dataType "
                                                                                   "is float32 in the local cache and "
                                                                                   "bfloat16"),
        std::string::npos);
    Side const otherShape = makeSide(-1, config(stateLayers(DataType::kFLOAT, 34)));
    EXPECT_NE(stateTransferMismatch(local.description, otherShape.description).find("[33] in the local cache and [34]"),
        std::string::npos);
    TransferDescription fewer = remote.description;
    fewer.stateLayers.pop_back();
    EXPECT_NE(stateTransferMismatch(local.description, fewer).find("2 state layers and the remote cache 1"),
        std::string::npos);
    TransferDescription otherRank = remote.description;
    otherRank.tp = 2;
    otherRank.rank = 1;
    EXPECT_NE(stateTransferMismatch(local.description, otherRank).find("rank 1 of tp 2"), std::string::npos);

    std::vector<int32_t> const good = {0, 1};
    std::vector<int32_t> const bad = {2, kSLOTS};
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { stateTransferDescriptors(local.description, good.data(), otherShape.description, good.data(), 2); },
        {"stateTransferDescriptors", "[33] in the local cache and [34]"}));
    EXPECT_TRUE(throwsNaming<OutOfRangeError>(
        [&] { stateTransferDescriptors(local.description, good.data(), remote.description, bad.data(), 2); },
        {"remoteSlots[1]", "slot 7", "[0, 7)"}));
    EXPECT_TRUE(throwsNaming<OutOfRangeError>(
        [&] { stateTransferDescriptors(local.description, bad.data(), remote.description, good.data(), 2); },
        {"localSlots[1]", "slot 7"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { stateTransferDescriptors(local.description, nullptr, remote.description, good.data(), 2); },
        {"localSlots", "null", "2"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { stateTransferDescriptors(local.description, good.data(), remote.description, good.data(), -1); },
        {"count", "-1"}));
    // Nothing moved by any refused call.
    expectMoved(local, {}, {});

    KVCacheLayout const layout = computeLayout(config());
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { describeForTransfer(layout, {0x1000}, 0); }, {"poolBases", "1 addresses", "2 state layers"}));
}

// Under tensor parallelism a rank describes its own share of each state tensor: stateLayers() with the conv split as 4
// parts of 2 channels and the SSM state by its 2 heads gives rank 1 of 2 conv [4, 3] (4 x 3 x 2 = 24 bytes a slot) and
// SSM [1, 4, 4] (64 bytes); the layer without a rule stays [33]. A cache laid out as the whole model's states is refused
// with the rank's shard, naming the tensor.
TEST(TransferStates, ShardsDescribeTheirShareOfEachStateTensor)
{
    std::vector<StateLayerConfig> layers = stateLayers();
    layers[0].tensors[0].splitDim = 0;
    layers[0].tensors[0].splitSegments = {StateSplitSegment{4, 2}};
    layers[0].tensors[1].splitDim = 0;
    KVCacheConfig const model = config(layers);
    TensorParallelShard const shard = tensorParallelShard(model, 2, 1);
    KVCacheLayout const rankLayout = computeLayout(shard.config);
    std::vector<uint64_t> const bases = {0x1000, 0x10000, 0x20000};
    TransferDescription const described = describeForTransfer(rankLayout, bases, 0, {}, &shard);
    EXPECT_EQ(described.tp, 2);
    EXPECT_EQ(described.rank, 1);
    ASSERT_EQ(described.stateLayers.size(), 2U);
    ASSERT_EQ(described.stateLayers[0].tensors.size(), 2U);
    EXPECT_EQ(described.stateLayers[0].tensors[0].shape, (std::vector<int64_t>{4, 3}));
    EXPECT_EQ(described.stateLayers[0].tensors[0].slotBytes, 24);
    EXPECT_EQ(described.stateLayers[0].tensors[1].shape, (std::vector<int64_t>{1, 4, 4}));
    EXPECT_EQ(described.stateLayers[0].tensors[1].slotBytes, 64);
    EXPECT_EQ(described.stateLayers[1].tensors[0].shape, (std::vector<int64_t>{33}));
    // The same rank of the same tp on the other side matches; another rank does not.
    EXPECT_EQ(stateTransferMismatch(described, described), "");
    TensorParallelShard const rank0 = tensorParallelShard(model, 2, 0);
    EXPECT_NE(stateTransferMismatch(described, describeForTransfer(rankLayout, bases, 0, {}, &rank0)).find("rank 0 of "
                                                                                                          "tp 2"),
        std::string::npos);
    KVCacheConfig wholeStates = shard.config;
    wholeStates.stateLayerConfigs = model.stateLayerConfigs;
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { describeForTransfer(computeLayout(wholeStates), bases, 0, {}, &shard); },
        {"describeForTransfer", "state layer 0 tensor 0", "[4, 3] in the shard's config", "[8, 3] in the cache"}));
}

} // namespace
} // namespace kvcache::rt
