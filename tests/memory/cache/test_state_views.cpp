// GPU tests of KVCacheManager's state layers: one allocation a state layer, a zero-copy view [numStateSlots, ...shape]
// per tensor at its offset, bytes written through a view found where the layout puts them, errors for bad indices
// and names, and the memory returned. Every size is worked out by hand in the comments.

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
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

class StateViewsTest : public GpuTest
{
};

//! Bytes of the page kernels' table entry of one attention layer.
constexpr int64_t kLAYER_TABLE_ENTRY_BYTES = 16;

//! One attention layer (2 x 64, float16), and two state layers: a Mamba2-like one (conv [16, 3] bfloat16, SSM
//! [4, 8, 16] float32) and a short convolution (conv [10, 2] float16); 3 sequences and 2 checkpoints: 5 slots.
//! Layer 0: conv 16 x 3 x 2 = 96 bytes a slot, 480 at 0; SSM 4 x 8 x 16 x 4 = 2048 bytes a slot, 10240 at 512 (480
//! rounded up to 256): 10752 bytes. Layer 1: conv 10 x 2 x 2 = 40 bytes a slot, 200 bytes.
rt::KVCacheConfig stateConfig(cudaMemPool_t pool)
{
    std::vector<rt::StateLayerConfig> const layers = {
        {{{"conv", {16, 3}, rt::DataType::kBF16}, {"ssm", {4, 8, 16}, rt::DataType::kFLOAT}}},
        {{{"conv", {10, 2}, rt::DataType::kHALF}}}};
    return ConfigBuilder({{2, 64}})
        .maxBatchSize(3)
        .maxSequenceLength(64)
        .tokensPerPage(16)
        .stateLayers(layers)
        .numCheckpointSlots(2)
        .memPool(pool)
        .build();
}

TEST_F(StateViewsTest, ViewsHaveTheLayoutsShapesAndOffsets)
{
    DedicatedPool pool;
    CudaStream stream;
    rt::KVCacheManager const manager(stateConfig(pool.get()), stream.get());
    ASSERT_EQ(manager.numStateLayers(), 2);
    EXPECT_EQ(manager.numStateSlots(), 5);
    EXPECT_EQ(manager.numLayers(), 1);

    auto* const base0 = static_cast<char*>(manager.statePtr(0));
    rt::Tensor const conv = manager.stateView(0, 0);
    EXPECT_EQ(conv.getShape(), (rt::Coords{5, 16, 3}));
    EXPECT_EQ(conv.getStride(), (rt::Coords{48, 3, 1}));
    EXPECT_EQ(conv.getDataType(), rt::DataType::kBF16);
    EXPECT_EQ(conv.getDeviceType(), rt::DeviceType::kGPU);
    EXPECT_EQ(conv.rawPointer(), base0);
    EXPECT_EQ(conv.sizeBytes(), 480);

    rt::Tensor const ssm = manager.stateView(0, "ssm");
    EXPECT_EQ(ssm.getShape(), (rt::Coords{5, 4, 8, 16}));
    EXPECT_EQ(ssm.getDataType(), rt::DataType::kFLOAT);
    EXPECT_EQ(ssm.rawPointer(), base0 + 512);
    EXPECT_EQ(ssm.sizeBytes(), 10240);
    EXPECT_TRUE(ssm.isContiguous());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(ssm.rawPointer()) % 256, 0U);
    EXPECT_EQ(manager.stateView(0, 1).rawPointer(), ssm.rawPointer());

    rt::Tensor const shortConv = manager.stateView(1, "conv");
    EXPECT_EQ(shortConv.getShape(), (rt::Coords{5, 10, 2}));
    EXPECT_EQ(shortConv.getDataType(), rt::DataType::kHALF);
    EXPECT_EQ(shortConv.rawPointer(), manager.statePtr(1));

    // Pages: 3 sequences x 64 / 16 = 12 pages of 16 x 2 x 64 x 2 = 4096 bytes a half, 2 halves: 98,304 bytes. State:
    // 10752 + 200 bytes. One layer table entry; the state copy keeps no table in device memory.
    EXPECT_EQ(manager.layout().cacheBytes, 98304);
    EXPECT_EQ(manager.allocatedBytes(), 98304 + 10752 + 200 + kLAYER_TABLE_ENTRY_BYTES);
}

TEST_F(StateViewsTest, WritesThroughAViewLandWhereTheLayoutSays)
{
    DedicatedPool pool;
    CudaStream stream;
    rt::KVCacheManager const manager(stateConfig(pool.get()), stream.get());
    KVCACHE_TEST_CUDA(cudaMemsetAsync(manager.statePtr(0), 0, 10752, stream.get()));
    // Slot 3 of the SSM state: 512 floats, 2048 bytes at 3 x 2048 from the view's start.
    std::vector<float> slot(512);
    for (size_t i = 0; i < slot.size(); ++i)
    {
        slot[i] = static_cast<float>(i) + 0.5F;
    }
    rt::Tensor const ssm = manager.stateView(0, "ssm");
    auto* const slotStart = static_cast<char*>(ssm.rawPointer()) + 3 * 2048;
    KVCACHE_TEST_CUDA(cudaMemcpyAsync(slotStart, slot.data(), 2048, cudaMemcpyHostToDevice, stream.get()));
    std::vector<unsigned char> all(10752);
    KVCACHE_TEST_CUDA(
        cudaMemcpyAsync(all.data(), manager.statePtr(0), all.size(), cudaMemcpyDeviceToHost, stream.get()));
    stream.synchronize();
    // The slot starts at 512 + 6144 = 6656 of the layer's allocation; everything else stays zero.
    for (size_t byte = 0; byte < all.size(); ++byte)
    {
        bool const inSlot = byte >= 6656 && byte < 6656 + 2048;
        if (!inSlot)
        {
            ASSERT_EQ(all[byte], 0) << "byte " << byte;
        }
    }
    std::vector<float> back(512);
    std::memcpy(back.data(), all.data() + 6656, 2048);
    EXPECT_EQ(back, slot);
}

TEST_F(StateViewsTest, RefusesBadIndicesAndNames)
{
    DedicatedPool pool;
    CudaStream stream;
    rt::KVCacheManager const manager(stateConfig(pool.get()), stream.get());
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] { static_cast<void>(manager.stateView(2, 0)); }, {"state layer index 2", "[0, 2)"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] { static_cast<void>(manager.stateView(-1, "conv")); }, {"state layer index -1"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] { static_cast<void>(manager.stateView(1, 1)); }, {"tensor index 1", "state layer 1", "[0, 1)"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { static_cast<void>(manager.stateView(0, "recurrent")); }, {"\"recurrent\"", "\"conv\", \"ssm\""}));
}

TEST_F(StateViewsTest, NoStateLayersAndMemoryReturned)
{
    DedicatedPool pool;
    CudaStream stream;
    uint64_t const before = pool.usedBytes();
    {
        rt::KVCacheManager const plain(ConfigBuilder({{2, 64}}).memPool(pool.get()).build(), stream.get());
        EXPECT_EQ(plain.numStateLayers(), 0);
        EXPECT_EQ(plain.numStateSlots(), 0);
        EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
            [&] { static_cast<void>(plain.stateView(0, 0)); }, {"state layer index 0", "[0, 0)"}));

        rt::KVCacheManager source(stateConfig(pool.get()), stream.get());
        void* const state = source.statePtr(1);
        rt::KVCacheManager const target(std::move(source));
        EXPECT_EQ(target.statePtr(1), state);
        EXPECT_EQ(source.numStateLayers(), 0); // NOLINT(bugprone-use-after-move): moved-from state is documented
        stream.synchronize();
    }
    stream.synchronize();
    EXPECT_EQ(pool.usedBytes(), before) << "state memory not returned";
}

} // namespace
} // namespace kvcache::test
