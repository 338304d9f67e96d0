// State slot copies (copyStates): every byte of every state layer's allocation poisoned with a value of its layer and
// offset (never zero), then copies over state layers of several tensor shapes and dtypes (slots of 15, 14 and 32773
// bytes among them, and slots of several chunks), checked byte for byte against copies made on the host with offsets
// worked out by hand: copied slots equal their sources, every other byte (other slots, padding, the attention pages)
// is untouched. Also: lists longer than one launch, more state tensors than one launch takes, the L2-hint and
// wide-block paths, graph capture, a fork's copies from a PageManager, and refused lists that launch nothing.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/paging/page_manager.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"

namespace kvcache::test
{
namespace
{

using StateCopyTest = GpuTest;

//! One state tensor as worked out by hand: where it starts in its layer's allocation and the bytes of one slot.
struct TensorPlace
{
    int64_t offset;
    int64_t slotBytes;
};

//! The byte at `offset` of state layer `layer` before any copy: a mix of both, in [1, 255], so every slot of every
//! tensor of every layer holds its own bytes and none is zero.
uint8_t poisonByte(int32_t layer, int64_t offset)
{
    uint64_t x = (static_cast<uint64_t>(layer) << 40) ^ static_cast<uint64_t>(offset) ^ 0x9E3779B97F4A7C15ULL;
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDULL;
    x ^= x >> 33;
    return static_cast<uint8_t>(1 + x % 255);
}

//! A cache with state layers, its state poisoned, and a host copy of every state layer's allocation to check against.
class StateUnderTest
{
public:
    StateUnderTest(rt::KVCacheConfig const& config, std::vector<std::vector<TensorPlace>> places)
        : mCache(config, mStream.get())
        , mPlaces(std::move(places))
    {
        EXPECT_EQ(mCache.numStateLayers(), static_cast<int32_t>(mPlaces.size()));
        for (int32_t l = 0; l < mCache.numStateLayers(); ++l)
        {
            rt::StateLayerLayout const& layer = mCache.layout().stateLayers[static_cast<size_t>(l)];
            std::vector<TensorPlace> const& hand = mPlaces[static_cast<size_t>(l)];
            EXPECT_EQ(layer.tensors.size(), hand.size()) << "state layer " << l;
            for (size_t t = 0; t < hand.size() && t < layer.tensors.size(); ++t)
            {
                EXPECT_EQ(layer.tensors[t].offsetBytes, hand[t].offset) << "layer " << l << " tensor " << t;
                EXPECT_EQ(layer.tensors[t].slotBytes, hand[t].slotBytes) << "layer " << l << " tensor " << t;
            }
            std::vector<uint8_t> bytes(static_cast<size_t>(layer.layerBytes));
            for (size_t b = 0; b < bytes.size(); ++b)
            {
                bytes[b] = poisonByte(l, static_cast<int64_t>(b));
            }
            uploadBytes(mCache.statePtr(l), bytes, stream());
            mExpected.push_back(std::move(bytes));
        }
        // The attention pages get a pattern of their own, which no state copy may touch.
        for (int32_t l = 0; l < mCache.numLayers(); ++l)
        {
            int64_t const bytes = mCache.layout().layers[static_cast<size_t>(l)].layerBytes;
            KVCACHE_CUDA_TRY(cudaMemsetAsync(mCache.kPoolPtr(l), 0x5A, static_cast<size_t>(bytes), stream()));
        }
    }

    rt::KVCacheManager const& cache() const
    {
        return mCache;
    }
    cudaStream_t stream() const
    {
        return mStream.get();
    }

    //! Applies `copies` to the host copy: every copy reads its source as it was before the list (no slot is both read
    //! and written in one list).
    void expect(std::vector<rt::StateSlotCopy> const& copies)
    {
        std::vector<std::vector<uint8_t>> const before = mExpected;
        for (size_t l = 0; l < mPlaces.size(); ++l)
        {
            for (TensorPlace const& tensor : mPlaces[l])
            {
                for (rt::StateSlotCopy const& copy : copies)
                {
                    auto const from = before[l].begin() + tensor.offset + copy.src * tensor.slotBytes;
                    std::copy(from, from + tensor.slotBytes,
                        mExpected[l].begin() + tensor.offset + copy.dst * tensor.slotBytes);
                }
            }
        }
    }

    //! Writes `bytes` over slot `slot` of tensor `tensor` of state layer `layer`, on the device and in the host copy.
    void overwriteSlot(int32_t layer, int32_t tensor, int32_t slot, uint8_t value)
    {
        TensorPlace const& place = mPlaces[static_cast<size_t>(layer)][static_cast<size_t>(tensor)];
        int64_t const start = place.offset + slot * place.slotBytes;
        KVCACHE_CUDA_TRY(cudaMemsetAsync(
            static_cast<char*>(mCache.statePtr(layer)) + start, value, static_cast<size_t>(place.slotBytes), stream()));
        std::fill_n(mExpected[static_cast<size_t>(layer)].begin() + start, place.slotBytes, value);
    }

    //! Returns an empty string when every byte of every state layer and attention layer is what it should be, else
    //! where the first difference is.
    std::string mismatch() const
    {
        for (size_t l = 0; l < mExpected.size(); ++l)
        {
            std::vector<uint8_t> const actual = downloadBytes(
                mCache.statePtr(static_cast<int32_t>(l)), static_cast<int64_t>(mExpected[l].size()), stream());
            for (size_t b = 0; b < actual.size(); ++b)
            {
                if (actual[b] != mExpected[l][b])
                {
                    return "state layer " + std::to_string(l) + " byte " + std::to_string(b) + ": "
                        + std::to_string(actual[b]) + ", expected " + std::to_string(mExpected[l][b]) + " ("
                        + place(l, static_cast<int64_t>(b)) + ")";
                }
            }
        }
        for (int32_t l = 0; l < mCache.numLayers(); ++l)
        {
            int64_t const bytes = mCache.layout().layers[static_cast<size_t>(l)].layerBytes;
            std::vector<uint8_t> const actual = downloadBytes(mCache.kPoolPtr(l), bytes, stream());
            for (size_t b = 0; b < actual.size(); ++b)
            {
                if (actual[b] != 0x5A)
                {
                    return "attention layer " + std::to_string(l) + " byte " + std::to_string(b) + " changed";
                }
            }
        }
        return {};
    }

private:
    //! Names the tensor and slot of byte `b` of state layer `l`, or padding.
    std::string place(size_t l, int64_t b) const
    {
        int32_t const slots = mCache.numStateSlots();
        for (size_t t = 0; t < mPlaces[l].size(); ++t)
        {
            TensorPlace const& tensor = mPlaces[l][t];
            if (b >= tensor.offset && b < tensor.offset + slots * tensor.slotBytes)
            {
                return "tensor " + std::to_string(t) + " slot "
                    + std::to_string((b - tensor.offset) / tensor.slotBytes);
            }
        }
        return "padding";
    }

    CudaStream mStream;
    rt::KVCacheManager mCache;
    std::vector<std::vector<TensorPlace>> mPlaces;
    std::vector<std::vector<uint8_t>> mExpected;
};

//! One attention layer (2 x 64, float16), 4 sequences and 3 checkpoint slots: 7 slots. Three state layers:
//!  0: conv [8, 3] bfloat16: 48 bytes a slot, 336 at 0; ssm [4, 8, 16] float32: 2048 bytes a slot at 512 (336 rounded
//!     up to 256).
//!  1: odd [5, 3] int8: 15 bytes a slot, 105 at 0; big [40, 300] float32: 48000 bytes a slot (a whole 32 KiB chunk and
//!     15232 bytes), at 256.
//!  2: tail [32773] uint8: 32773 bytes a slot (a whole chunk and 5 bytes; most slots start unaligned), 229411 at 0;
//!     h [7] float16: 14 bytes a slot at 229632 (229411 rounded up to 256).
rt::KVCacheConfig mixedConfig()
{
    std::vector<rt::StateLayerConfig> const layers = {
        {{{"conv", {8, 3}, rt::DataType::kBF16}, {"ssm", {4, 8, 16}, rt::DataType::kFLOAT}}},
        {{{"odd", {5, 3}, rt::DataType::kINT8}, {"big", {40, 300}, rt::DataType::kFLOAT}}},
        {{{"tail", {32773}, rt::DataType::kUINT8}, {"h", {7}, rt::DataType::kHALF}}}};
    return ConfigBuilder({{2, 64}})
        .maxBatchSize(4)
        .maxSequenceLength(64)
        .tokensPerPage(16)
        .stateLayers(layers)
        .numCheckpointSlots(3)
        .build();
}

std::vector<std::vector<TensorPlace>> mixedPlaces()
{
    return {{{0, 48}, {512, 2048}}, {{0, 15}, {256, 48000}}, {{0, 32773}, {229632, 14}}};
}

TEST_F(StateCopyTest, CopiesEverySlotOfEveryTensorOfEveryLayer)
{
    StateUnderTest sut(mixedConfig(), mixedPlaces());
    ASSERT_EQ(sut.cache().numStateSlots(), 7);
    ASSERT_EQ(sut.mismatch(), "") << "the poison did not land";

    // Slot 0 read twice; slots 1 and 2 (odd and even sizes meet unaligned and aligned starts) read once.
    std::vector<rt::StateSlotCopy> const copies = {{0, 3}, {2, 5}, {0, 6}, {1, 4}};
    rt::copyStates(sut.cache(), copies.data(), static_cast<int32_t>(copies.size()), sut.stream());
    sut.expect(copies);
    EXPECT_EQ(sut.mismatch(), "");

    // The vector overload, reading back a slot written above.
    std::vector<rt::StateSlotCopy> const back = {{6, 1}, {4, 0}};
    rt::copyStates(sut.cache(), back, sut.stream());
    sut.expect(back);
    EXPECT_EQ(sut.mismatch(), "");
}

TEST_F(StateCopyTest, EverySlotAsSourceAndAsDestination)
{
    StateUnderTest sut(mixedConfig(), mixedPlaces());
    // Each slot in turn to the last slot, then the last slot's neighbour to each: every slot's first and last bytes
    // are read and written once.
    for (int32_t src = 0; src < 6; ++src)
    {
        std::vector<rt::StateSlotCopy> const copies = {{src, 6}};
        rt::copyStates(sut.cache(), copies, sut.stream());
        sut.expect(copies);
        ASSERT_EQ(sut.mismatch(), "") << "from slot " << src;
    }
    for (int32_t dst = 0; dst < 6; ++dst)
    {
        std::vector<rt::StateSlotCopy> const copies = {{6, dst}};
        sut.overwriteSlot(2, 0, 6, static_cast<uint8_t>(0x30 + dst));
        rt::copyStates(sut.cache(), copies, sut.stream());
        sut.expect(copies);
        ASSERT_EQ(sut.mismatch(), "") << "to slot " << dst;
    }
}

//! Tiny slots (a float32 [3] and an int8 [17]: 12 and 17 bytes), 8 sequences and `checkpoints` checkpoint slots.
rt::KVCacheConfig manySlotsConfig(int32_t checkpoints)
{
    std::vector<rt::StateLayerConfig> const layers = {
        {{{"a", {3}, rt::DataType::kFLOAT}}}, {{{"b", {17}, rt::DataType::kINT8}}}};
    return ConfigBuilder({{1, 16}})
        .maxBatchSize(8)
        .maxSequenceLength(16)
        .tokensPerPage(16)
        .stateLayers(layers)
        .numCheckpointSlots(checkpoints)
        .build();
}

TEST_F(StateCopyTest, ListsLongerThanOneLaunch)
{
    // 8 + 592 = 600 slots: a at 0 (7200 bytes); b at 0 of its own layer.
    StateUnderTest sut(manySlotsConfig(592), {{{0, 12}}, {{0, 17}}});
    // Slots [0, 300) to [300, 600): two launches of kMAX_INLINE_STATE_COPIES and 44 copies.
    static_assert(rt::kMAX_INLINE_STATE_COPIES == 256);
    std::vector<rt::StateSlotCopy> copies;
    for (int32_t i = 0; i < 300; ++i)
    {
        copies.push_back({(i * 7) % 300, 300 + i});
    }
    rt::copyStates(sut.cache(), copies, sut.stream());
    sut.expect(copies);
    EXPECT_EQ(sut.mismatch(), "");
}

//! 43 state layers of three tensors: a [5] float32 (20 bytes a slot, 120 at 0), b [3, 7] int8 (21 bytes a slot at 256,
//! 120 rounded up) and c [9000] float32 (36000 bytes, two chunks, a slot at 512); 4 sequences and 2 checkpoint slots.
//! 129 tensors: more than one launch takes, the last launch's one tensor the third of the last layer.
rt::KVCacheConfig manyTensorsConfig()
{
    std::vector<rt::StateLayerConfig> const layers(43,
        rt::StateLayerConfig{{{"a", {5}, rt::DataType::kFLOAT}, {"b", {3, 7}, rt::DataType::kINT8},
            {"c", {9000}, rt::DataType::kFLOAT}}});
    return ConfigBuilder({{1, 16}})
        .maxBatchSize(4)
        .maxSequenceLength(16)
        .tokensPerPage(16)
        .stateLayers(layers)
        .numCheckpointSlots(2)
        .build();
}

TEST_F(StateCopyTest, MoreStateTensorsThanOneLaunchTakes)
{
    StateUnderTest sut(
        manyTensorsConfig(), std::vector<std::vector<TensorPlace>>(43, {{0, 20}, {256, 21}, {512, 36000}}));
    std::vector<rt::StateSlotCopy> const copies = {{0, 3}, {1, 5}, {2, 4}};
    rt::copyStates(sut.cache(), copies, sut.stream());
    sut.expect(copies);
    EXPECT_EQ(sut.mismatch(), "");
}

//! One state layer: w [256, 1024] float32, 1 MiB (32 chunks) a slot, and t [33] int8 at 1 MiB * slots; 4 sequences and
//! `checkpoints` checkpoint slots.
rt::KVCacheConfig largeSlotsConfig(int32_t checkpoints)
{
    std::vector<rt::StateLayerConfig> const layers = {
        {{{"w", {256, 1024}, rt::DataType::kFLOAT}, {"t", {33}, rt::DataType::kINT8}}}};
    return ConfigBuilder({{1, 16}})
        .maxBatchSize(4)
        .maxSequenceLength(16)
        .tokensPerPage(16)
        .stateLayers(layers)
        .numCheckpointSlots(checkpoints)
        .build();
}

TEST_F(StateCopyTest, LargeCopiesTakeTheL2HintAndWideBlocks)
{
    // 4 + 136 = 140 slots of 1 MiB + 33 bytes: w takes 140 MiB, t starts right after it (a multiple of 256).
    constexpr int64_t kMIB = int64_t{1} << 20;
    StateUnderTest sut(largeSlotsConfig(136), {{{0, kMIB}, {140 * kMIB, 33}}});
    // 40 copies write 40 MiB (over 32 MiB: sources read at evict_last) in 40 x 33 = 1320 narrow blocks; 130 copies
    // write 130 MiB in 4290 blocks (over 4096: wide blocks). Sources 0 to 4, destinations from 5 on.
    for (int32_t const count : {40, 130})
    {
        std::vector<rt::StateSlotCopy> copies;
        for (int32_t i = 0; i < count; ++i)
        {
            copies.push_back({i % 5, 5 + (i * 37) % 135});
        }
        rt::copyStates(sut.cache(), copies, sut.stream());
        sut.expect(copies);
        ASSERT_EQ(sut.mismatch(), "") << count << " copies";
    }
}

TEST_F(StateCopyTest, ACapturedCopyReplaysWithTheCapturedList)
{
    StateUnderTest sut(mixedConfig(), mixedPlaces());
    std::vector<rt::StateSlotCopy> copies = {{1, 2}, {1, 3}, {0, 5}};
    std::vector<rt::StateSlotCopy> const captured = copies;
    CapturedGraph graph(sut.stream(), [&] { rt::copyStates(sut.cache(), copies, sut.stream()); });
    ASSERT_EQ(sut.mismatch(), "") << "capturing ran the copy";
    // The graph keeps its own list.
    copies = {{4, 6}};
    for (int32_t replay = 0; replay < 2; ++replay)
    {
        // New source contents: the replay copies what the sources hold then.
        sut.overwriteSlot(0, 1, 1, static_cast<uint8_t>(0x41 + replay));
        sut.overwriteSlot(2, 0, 0, static_cast<uint8_t>(0x61 + replay));
        graph.launch(sut.stream());
        sut.expect(captured);
        ASSERT_EQ(sut.mismatch(), "") << "replay " << replay;
    }
}

TEST_F(StateCopyTest, AForkCopiesTheParentsStateBeforeTheStep)
{
    StateUnderTest sut(mixedConfig(), mixedPlaces());
    rt::PageManager manager(sut.cache().layout());
    rt::SequenceId const a = manager.create();
    rt::SequenceId const b = manager.create();
    int32_t const token = 7;
    std::vector<rt::SequenceAppend> appends = {{a, &token, 1}, {b, &token, 1}};
    rt::StepCopies const first = manager.step(appends.data(), 2);
    EXPECT_TRUE(first.stateCopies().empty());
    // Slots 0 and 1 taken; the forks of b get slots 2 and 3.
    rt::SequenceId const c = manager.fork(b);
    rt::SequenceId const d = manager.fork(b);
    ASSERT_EQ(manager.stateSlot(b), 1);
    ASSERT_EQ(manager.stateSlot(c), 2);
    ASSERT_EQ(manager.stateSlot(d), 3);
    appends = {{c, &token, 1}, {d, &token, 1}};
    rt::StepCopies const second = manager.step(appends.data(), 2);
    std::vector<rt::StateSlotCopy> const expected = {{1, 2}, {1, 3}};
    ASSERT_EQ(second.stateCopies().size(), 2U);
    rt::copyStates(sut.cache(), second.stateCopies(), sut.stream());
    sut.expect(expected);
    EXPECT_EQ(sut.mismatch(), "");
}

TEST_F(StateCopyTest, RefusedListsLaunchNothing)
{
    StateUnderTest sut(mixedConfig(), mixedPlaces());
    rt::KVCacheManager const& cache = sut.cache();
    cudaStream_t const stream = sut.stream();
    // Each list holds a valid copy before the bad one: a copy launched before the check would show.
    auto const copy = [&](std::vector<rt::StateSlotCopy> const& copies)
    { return [&cache, copies, stream] { rt::copyStates(cache, copies, stream); }; };
    EXPECT_TRUE(
        throwsNaming<rt::OutOfRangeError>(copy({{0, 1}, {2, 7}}), {"copyStates", "copies[1].dst", "slot 7", "[0, 7)"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(copy({{0, 1}, {-1, 3}}), {"copies[1].src", "slot -1"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        copy({{0, 1}, {2, 1}}), {"copyStates", "slot 1", "destination more than once"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        copy({{0, 1}, {1, 3}}), {"copyStates", "slot 1", "both a source and a destination"}));
    EXPECT_TRUE(
        throwsNaming<rt::InvalidArgumentError>(copy({{0, 1}, {4, 4}}), {"slot 4", "both a source and a destination"}));
    rt::StateSlotCopy const one{0, 1};
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::copyStates(cache, &one, -1, stream); }, {"copyStates", "count is -1", ">= 0"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::copyStates(cache, nullptr, 2, stream); }, {"copyStates", "null", "count is 2"}));
    // Zero copies: nothing to do, a null list included.
    rt::copyStates(cache, nullptr, 0, stream);
    rt::copyStates(cache, std::vector<rt::StateSlotCopy>{}, stream);
    KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(sut.mismatch(), "");
}

TEST_F(StateCopyTest, ACacheWithoutStateLayersRefusesCopies)
{
    CudaStream stream;
    rt::KVCacheManager const cache(ConfigBuilder({{1, 16}}).maxSequenceLength(16).tokensPerPage(16), stream.get());
    ASSERT_EQ(cache.numStateSlots(), 0);
    std::vector<rt::StateSlotCopy> const copies = {{0, 1}};
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::copyStates(cache, copies, stream.get()); }, {"copyStates", "count is 1", "no state layers"}));
    rt::copyStates(cache, nullptr, 0, stream.get());
    KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream.get()));
}

} // namespace
} // namespace kvcache::test
