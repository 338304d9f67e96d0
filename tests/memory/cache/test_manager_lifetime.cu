// GPU tests of KVCacheManager's lifetime: device memory accounting, out-of-memory cleanup, zero layers, bad layer
// indices, moves and several managers on several streams.

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/layer_ref.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/layout_model.h"
#include "support/view_round_trip.cuh"

namespace kvcache::test
{
namespace
{

static_assert(std::is_nothrow_destructible_v<rt::KVCacheManager>, "the destructor must be noexcept");
static_assert(std::is_nothrow_default_constructible_v<rt::KVCacheManager>);
static_assert(std::is_nothrow_move_constructible_v<rt::KVCacheManager>);
static_assert(std::is_nothrow_move_assignable_v<rt::KVCacheManager>);
static_assert(!std::is_copy_constructible_v<rt::KVCacheManager>);
static_assert(!std::is_copy_assignable_v<rt::KVCacheManager>);

class KVCacheManagerLifetimeTest : public GpuTest
{
};

class KVCacheManagerDeathTest : public GpuTest
{
};

constexpr int64_t kMIB = int64_t{1} << 20;
//! Most a stream-ordered allocation is assumed to be rounded up by the pool.
constexpr int64_t kALLOCATION_GRANULARITY = 2 * kMIB;
//! Bytes of the page kernels' table entry of one layer, as allocatedBytes() documents it.
constexpr int64_t kLAYER_TABLE_ENTRY_BYTES = 16;

//! Returns three small float16 layers, one slot of 64 tokens in one page.
rt::KVCacheConfig threeSmallLayers()
{
    ConfigBuilder builder({{2, 64}, {1, 32}, {4, 16}});
    return builder.maxSequenceLength(64).tokensPerPage(64).dataType(rt::DataType::kHALF).build();
}

//! Returns a builder of two layers of 2 slots of 200 tokens in pages of 32, allocated from `pool`.
ConfigBuilder twoLayersInPool(cudaMemPool_t pool)
{
    ConfigBuilder builder({{4, 64}, {2, 32}});
    builder.maxBatchSize(2).maxSequenceLength(200).tokensPerPage(32).memPool(pool);
    return builder;
}

//! Returns every layer's LayerRef.
std::vector<rt::LayerRef> layerRefsOf(rt::KVCacheManager const& manager)
{
    std::vector<rt::LayerRef> refs;
    for (int32_t layer = 0; layer < manager.numLayers(); ++layer)
    {
        refs.push_back(manager.layerRef(layer));
    }
    return refs;
}

// ---------------------------------------------------------------------------------------------------------------
// Device memory.

TEST_F(KVCacheManagerLifetimeTest, DeviceMemoryMatchesLayout)
{
    DedicatedPool pool;
    CudaStream stream;
    uint64_t const usedBefore = pool.usedBytes();

    // 4 slots of 1024 tokens in float16: 16 MiB, 2 MiB, 16 MiB and 1.25 MiB, worked out by hand.
    int64_t const expectedCacheBytes = 16 * kMIB + 2 * kMIB + 16 * kMIB + 5 * kMIB / 4;
    ConfigBuilder builder({{8, 128}, {2, 64}, {4, 256}, {1, 80}});
    builder.maxBatchSize(4).maxSequenceLength(1000).tokensPerPage(128).memPool(pool.get());
    rt::KVCacheConfig const config = builder.dataType(rt::DataType::kHALF).build();
    {
        rt::KVCacheManager manager(config, stream.get());
        stream.synchronize();
        EXPECT_EQ(manager.layout().cacheBytes, expectedCacheBytes);
        LayoutModel const model = modelLayout(config);
        EXPECT_EQ(model.cacheBytes, expectedCacheBytes);
        int64_t const tableBytes = kLAYER_TABLE_ENTRY_BYTES * static_cast<int64_t>(model.layers.size());
        EXPECT_EQ(manager.allocatedBytes(), model.cacheBytes + tableBytes);

        auto const taken = static_cast<int64_t>(pool.usedBytes() - usedBefore);
        EXPECT_GE(taken, manager.allocatedBytes()) << "the pool holds less than the layout and the layer table need";
        EXPECT_LE(taken, manager.allocatedBytes() + (manager.numLayers() + 1) * kALLOCATION_GRANULARITY)
            << "the pool holds more than the layout, the layer table and allocation rounding explain";
    }
    stream.synchronize();
    EXPECT_EQ(pool.usedBytes(), usedBefore) << "memory not returned after destruction";
}

TEST_F(KVCacheManagerLifetimeTest, OutOfMemoryFreesPartialAllocation)
{
    DedicatedPool pool;
    CudaStream stream;
    size_t freeBefore = 0;
    size_t totalMemory = 0;
    KVCACHE_TEST_CUDA(cudaMemGetInfo(&freeBefore, &totalMemory));
    uint64_t const usedBefore = pool.usedBytes();

    // Layer 0 takes 4 KiB per page and fits; layer 1 takes 16 MiB per page, twice the GPU's memory in all.
    int64_t const bytesPerPageOfLayer1 = int64_t{2} * 128 * 128 * 256 * 2;
    int64_t const numPages = (2 * static_cast<int64_t>(totalMemory) + bytesPerPageOfLayer1 - 1) / bytesPerPageOfLayer1;
    ASSERT_LE(numPages, rt::kMAX_NUM_PAGES);
    int64_t const layer0Bytes = numPages * 2 * 128 * 1 * 8 * 2;
    int64_t const layer1Bytes = numPages * bytesPerPageOfLayer1;
    ConfigBuilder builder({{1, 8}, {128, 256}});
    builder.maxSequenceLength(128).tokensPerPage(128).dataType(rt::DataType::kHALF).memPool(pool.get());
    rt::KVCacheConfig const config = builder.numPages(static_cast<int32_t>(numPages)).build();

    std::string message;
    EXPECT_TRUE(throwsNaming<rt::OutOfMemoryError>([&] { rt::KVCacheManager manager(config, stream.get()); },
        {std::to_string(layer1Bytes), std::to_string(layer0Bytes + layer1Bytes)}, &message))
        << "the message names the bytes layer 1 asked for and those of the whole config";
    EXPECT_TRUE(std::regex_search(message, std::regex("layer[^0-9]{0,16}1([^0-9]|$)", std::regex::icase)))
        << "message does not name layer 1: " << message;
    EXPECT_TRUE(std::regex_search(message, std::regex("free", std::regex::icase)))
        << "message does not name the free memory: " << message;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failed allocation left a CUDA error behind";

    stream.synchronize();
    EXPECT_GE(static_cast<int64_t>(pool.usedBytesHigh() - usedBefore), layer0Bytes)
        << "layer 0 was never allocated, so freeing a partial allocation was not exercised";
    EXPECT_EQ(pool.usedBytes(), usedBefore) << "layer 0 was not freed";

    KVCACHE_TEST_CUDA(cudaMemPoolTrimTo(pool.get(), 0));
    size_t freeAfter = 0;
    KVCACHE_TEST_CUDA(cudaMemGetInfo(&freeAfter, &totalMemory));
    EXPECT_GE(static_cast<int64_t>(freeAfter) + 8 * kMIB, static_cast<int64_t>(freeBefore))
        << "device memory was not given back";
}

TEST_F(KVCacheManagerLifetimeTest, ZeroLayersAllocatesNothing)
{
    DedicatedPool pool;
    CudaStream stream;
    {
        ConfigBuilder builder(std::vector<rt::KVLayerConfig>{});
        builder.maxBatchSize(2).maxSequenceLength(100).tokensPerPage(64).memPool(pool.get());
        rt::KVCacheManager manager(builder.build(), stream.get());
        EXPECT_EQ(manager.numLayers(), 0);
        EXPECT_TRUE(manager.isUniform());
        EXPECT_EQ(manager.allocatedBytes(), 0);
        EXPECT_EQ(manager.layout().cacheBytes, 0);
        EXPECT_TRUE(manager.layout().layers.empty());
        EXPECT_THROW(static_cast<void>(manager.getCombinedKVCache(0)), std::out_of_range);
        stream.synchronize();
    }
    stream.synchronize();
    EXPECT_EQ(pool.usedBytesHigh(), 0u) << "a manager with no layers allocated from the pool";
}

// ---------------------------------------------------------------------------------------------------------------
// Index checks.

TEST_F(KVCacheManagerLifetimeTest, OutOfRangeLayerThrows)
{
    CudaStream stream;
    rt::KVCacheManager manager(threeSmallLayers(), stream.get());
    ASSERT_EQ(manager.numLayers(), 3);
    for (int32_t index : {-1, 3})
    {
        // The message names the bad index and the layer count (3).
        EXPECT_TRUE(throwsNaming<std::out_of_range>(
            [&] { static_cast<void>(manager.getCombinedKVCache(index)); }, {std::to_string(index), "3"}))
            << "index " << index;
    }
    EXPECT_NO_THROW(static_cast<void>(manager.getCombinedKVCache(2)));
}

TEST_F(KVCacheManagerDeathTest, NoexceptAccessorsAbortOnBadIndex)
{
    CudaStream stream;
    rt::KVCacheManager manager(threeSmallLayers(), stream.get());
    ASSERT_EQ(manager.numLayers(), 3);
    // The message must carry the bad index and the layer count (3), in either order.
    std::string const minusOne = "(^|[^0-9-])-1([^0-9]|$)";
    std::string const three = "(^|[^0-9])3([^0-9]|$)";
    std::string const minusOneAndCount = minusOne + ".*" + three + "|" + three + ".*" + minusOne;
    std::string const threeAndCount = "(^|[^0-9])3[^0-9](.*[^0-9])?3([^0-9]|$)";
    EXPECT_DEATH(static_cast<void>(manager.getCombinedKVCachePoolView(-1)), minusOneAndCount);
    EXPECT_DEATH(static_cast<void>(manager.getCombinedKVCachePoolView(3)), threeAndCount);
    EXPECT_DEATH(static_cast<void>(manager.getSeparateKVCache(3)), threeAndCount);
    EXPECT_DEATH(static_cast<void>(manager.kPoolPtr(-1)), minusOneAndCount);
    EXPECT_DEATH(static_cast<void>(manager.vPoolPtr(3)), threeAndCount);
    EXPECT_DEATH(static_cast<void>(manager.getLayerConfig(-1)), minusOneAndCount);
    EXPECT_DEATH(static_cast<void>(manager.layerRef(3)), threeAndCount);
    EXPECT_DEATH(static_cast<void>(manager.layerRef(-1)), minusOneAndCount);
}

// ---------------------------------------------------------------------------------------------------------------
// Moves.

TEST_F(KVCacheManagerLifetimeTest, MoveConstructionTakesMemoryAndEmptiesSource)
{
    DedicatedPool pool;
    CudaStream stream;
    DeviceArray<unsigned long long> badWrites(1);
    rt::KVCacheConfig const config = twoLayersInPool(pool.get()).dataType(rt::DataType::kHALF).build();
    LayoutModel const model = modelLayout(config);
    {
        rt::KVCacheManager source(config, stream.get());
        ASSERT_NO_FATAL_FAILURE(poisonAndWriteSlots<uint16_t>(source, model, 7, stream.get(), badWrites.get()));
        ASSERT_NO_FATAL_FAILURE(expectNoBadWrites(badWrites.get(), stream.get()));
        std::vector<rt::LayerRef> const refs = layerRefsOf(source);
        int64_t const allocated = source.allocatedBytes();
        uint64_t const usedBefore = pool.usedBytes();

        rt::KVCacheManager target(std::move(source));
        stream.synchronize();
        ASSERT_EQ(target.numLayers(), 2);
        EXPECT_EQ(target.stream(), stream.get());
        EXPECT_EQ(target.allocatedBytes(), allocated);
        for (int32_t layer = 0; layer < 2; ++layer)
        {
            SCOPED_TRACE("layer " + std::to_string(layer));
            rt::LayerRef const& before = refs[static_cast<size_t>(layer)];
            EXPECT_TRUE(sameLayerRef(target.layerRef(layer), before));
            EXPECT_EQ(target.kPoolPtr(layer), before.kPool);
            EXPECT_EQ(target.vPoolPtr(layer), before.vPool);
            EXPECT_EQ(target.getCombinedKVCachePoolView(layer).rawPointer(), before.kPool);
            EXPECT_EQ(target.getCombinedKVCache(layer).rawPointer(), before.kPool);
        }
        EXPECT_EQ(source.numLayers(), 0);
        EXPECT_EQ(source.allocatedBytes(), 0) << "the source still counts memory (the layer table) as its own";
        EXPECT_EQ(pool.usedBytes(), usedBefore) << "moving allocated or freed memory";
        verifySlotWrite<uint16_t>(target, model, 7, stream.get());
    }
    stream.synchronize();
    EXPECT_EQ(pool.usedBytes(), 0u) << "memory freed twice or never";
}

TEST_F(KVCacheManagerLifetimeTest, MoveAssignmentFreesTargetMemory)
{
    DedicatedPool pool;
    CudaStream stream;
    DeviceArray<unsigned long long> badWrites(1);
    rt::KVCacheConfig const sourceConfig = twoLayersInPool(pool.get()).dataType(rt::DataType::kBF16).build();
    ConfigBuilder targetBuilder({{8, 128}});
    targetBuilder.maxBatchSize(4).maxSequenceLength(512).tokensPerPage(128).memPool(pool.get());
    rt::KVCacheConfig const targetConfig = targetBuilder.dataType(rt::DataType::kHALF).build();
    LayoutModel const model = modelLayout(sourceConfig);
    {
        rt::KVCacheManager source(sourceConfig, stream.get());
        stream.synchronize();
        uint64_t const usedBySource = pool.usedBytes();
        rt::KVCacheManager target(targetConfig, stream.get());
        stream.synchronize();
        ASSERT_GE(static_cast<int64_t>(pool.usedBytes() - usedBySource), modelLayout(targetConfig).cacheBytes);

        ASSERT_NO_FATAL_FAILURE(poisonAndWriteSlots<uint16_t>(source, model, 11, stream.get(), badWrites.get()));
        ASSERT_NO_FATAL_FAILURE(expectNoBadWrites(badWrites.get(), stream.get()));
        std::vector<rt::LayerRef> const sourceRefs = layerRefsOf(source);
        int64_t const sourceAllocated = source.allocatedBytes();

        target = std::move(source);
        stream.synchronize();
        EXPECT_EQ(pool.usedBytes(), usedBySource) << "the target's own memory was not freed";
        ASSERT_EQ(target.numLayers(), 2);
        EXPECT_EQ(target.kPoolPtr(0), sourceRefs[0].kPool);
        for (int32_t layer = 0; layer < 2; ++layer)
        {
            SCOPED_TRACE("layer " + std::to_string(layer));
            EXPECT_TRUE(sameLayerRef(target.layerRef(layer), sourceRefs[static_cast<size_t>(layer)]));
        }
        EXPECT_EQ(target.allocatedBytes(), sourceAllocated);
        EXPECT_EQ(target.getConfig().kvCacheType, rt::DataType::kBF16);
        EXPECT_EQ(source.numLayers(), 0);
        EXPECT_EQ(source.allocatedBytes(), 0) << "the source still counts memory (the layer table) as its own";
        verifySlotWrite<uint16_t>(target, model, 11, stream.get());

        // Self-move may keep the memory or give it up, but never half of each.
        rt::KVCacheManager& alias = target;
        target = std::move(alias);
        stream.synchronize();
        uint64_t const usedAfterSelfMove = pool.usedBytes();
        if (target.numLayers() == 2)
        {
            EXPECT_EQ(target.kPoolPtr(0), sourceRefs[0].kPool);
            EXPECT_EQ(usedAfterSelfMove, usedBySource);
            verifySlotWrite<uint16_t>(target, model, 11, stream.get());
        }
        else
        {
            EXPECT_EQ(target.numLayers(), 0);
            EXPECT_EQ(target.allocatedBytes(), 0);
            EXPECT_EQ(usedAfterSelfMove, 0u);
        }

        // Moving into the emptied source works too.
        bool const kept = target.numLayers() == 2;
        source = std::move(target);
        EXPECT_EQ(target.numLayers(), 0);
        if (kept)
        {
            ASSERT_EQ(source.numLayers(), 2);
            EXPECT_EQ(source.kPoolPtr(0), sourceRefs[0].kPool);
        }
    }
    stream.synchronize();
    EXPECT_EQ(pool.usedBytes(), 0u) << "memory freed twice or never";
}

// ---------------------------------------------------------------------------------------------------------------
// Several managers.

TEST_F(KVCacheManagerLifetimeTest, SeveralManagersOnSeveralStreams)
{
    DedicatedPool pool;
    std::array<CudaStream, 3> streams;
    DeviceArray<unsigned long long> badWrites(3);
    std::array<ConfigBuilder, 3> builders = {
        ConfigBuilder({{4, 64}, {2, 128}}), ConfigBuilder({{2, 64}, {2, 64}, {2, 64}}), ConfigBuilder({{8, 32}})};
    builders[0].maxBatchSize(2).maxSequenceLength(300).tokensPerPage(32).dataType(rt::DataType::kHALF);
    builders[1].maxBatchSize(3).maxSequenceLength(130).tokensPerPage(128).dataType(rt::DataType::kBF16);
    builders[2].maxBatchSize(1).maxSequenceLength(1000).tokensPerPage(256).dataType(rt::DataType::kFP8_E4M3);
    std::array<rt::KVCacheConfig, 3> configs;
    for (size_t i = 0; i < 3; ++i)
    {
        configs[i] = builders[i].memPool(pool.get()).build();
    }
    std::array<LayoutModel, 3> const models = {
        modelLayout(configs[0]), modelLayout(configs[1]), modelLayout(configs[2])};
    std::array<uint64_t, 3> const salts = {100, 200, 300};

    std::array<std::optional<rt::KVCacheManager>, 3> managers;
    std::array<uint64_t, 3> usedBy = {};
    uint64_t usedSoFar = pool.usedBytes();
    for (size_t i = 0; i < 3; ++i)
    {
        managers[i].emplace(configs[i], streams[i].get());
        streams[i].synchronize();
        uint64_t const used = pool.usedBytes();
        usedBy[i] = used - usedSoFar;
        usedSoFar = used;
        EXPECT_GE(static_cast<int64_t>(usedBy[i]), managers[i]->allocatedBytes()) << "manager " << i;
        EXPECT_EQ(managers[i]->allocatedBytes(),
            models[i].cacheBytes + kLAYER_TABLE_ENTRY_BYTES * static_cast<int64_t>(models[i].layers.size()))
            << "manager " << i;
        EXPECT_EQ(managers[i]->stream(), streams[i].get());
    }

    unsigned long long* const counters = badWrites.get();
    ASSERT_NO_FATAL_FAILURE(
        poisonAndWriteSlots<uint16_t>(*managers[0], models[0], salts[0], streams[0].get(), counters));
    ASSERT_NO_FATAL_FAILURE(
        poisonAndWriteSlots<uint16_t>(*managers[1], models[1], salts[1], streams[1].get(), counters + 1));
    ASSERT_NO_FATAL_FAILURE(
        poisonAndWriteSlots<uint8_t>(*managers[2], models[2], salts[2], streams[2].get(), counters + 2));
    for (size_t i = 0; i < 3; ++i)
    {
        ASSERT_NO_FATAL_FAILURE(expectNoBadWrites(counters + i, streams[i].get()));
    }
    {
        SCOPED_TRACE("manager 0");
        verifySlotWrite<uint16_t>(*managers[0], models[0], salts[0], streams[0].get());
    }
    {
        SCOPED_TRACE("manager 1");
        verifySlotWrite<uint16_t>(*managers[1], models[1], salts[1], streams[1].get());
    }
    {
        SCOPED_TRACE("manager 2");
        verifySlotWrite<uint8_t>(*managers[2], models[2], salts[2], streams[2].get());
    }

    uint64_t expectedUsed = usedSoFar;
    for (size_t i : {size_t{1}, size_t{2}, size_t{0}})
    {
        managers[i].reset();
        streams[i].synchronize();
        expectedUsed -= usedBy[i];
        EXPECT_EQ(pool.usedBytes(), expectedUsed) << "after destroying manager " << i;
    }
}

} // namespace
} // namespace kvcache::test
