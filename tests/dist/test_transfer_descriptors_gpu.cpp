// GPU test of describeForTransfer on a real KVCacheManager: the description names the manager's own pools (each
// layer's K pool, and its scale pool with page scales), its device, its host-held scales and, for a rank of a
// tensor-parallel group, the heads the rank holds; registration covers each pool's K and V halves. Skips without a GPU.

#include "kvcache/core/errors.h"
#include "kvcache/dist/tensor_parallel.h"
#include "kvcache/dist/transfer_descriptors.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"

namespace kvcache::rt
{
namespace
{

using test::ConfigBuilder;
using test::smallCacheOf;
using test::throwsNaming;

class TransferDescriptionGpu : public test::GpuTest
{
};

uint64_t addressOf(void const* pointer)
{
    return reinterpret_cast<uint64_t>(pointer);
}

TEST_F(TransferDescriptionGpu, NamesTheManagersPoolsScalesAndHeads)
{
    KVCacheConfig const model = smallCacheOf({KVLayerConfig{4, 32}, KVLayerConfig{2, 64}})
                                    .dataType(DataType::kUINT8)
                                    .quantization(KVQuantization::kNVFP4);
    TensorParallelShard const rank1 = tensorParallelShard(model, 2, 1);
    KVCacheManager cache(rank1.config, nullptr);
    cache.setLayerScales(0, {0.5F, 0.25F});
    cache.setLayerScales(1, {2.0F, 4.0F});
    TransferDescription const description = describeForTransfer(cache, &rank1);
    EXPECT_EQ(description.device, cache.device());
    EXPECT_EQ(description.tp, 2);
    EXPECT_EQ(description.rank, 1);
    ASSERT_EQ(description.groups.size(), 1U);
    TransferGroup const& group = description.groups[0];
    EXPECT_EQ(group.numPages, cache.numPages());
    // Data pools in layer order, then scale pools: a pool's K half starts the layer's allocation.
    ASSERT_EQ(group.poolBases.size(), 4U);
    EXPECT_EQ(group.poolBases[0], addressOf(cache.kPoolPtr(0)));
    EXPECT_EQ(group.poolBases[1], addressOf(cache.kPoolPtr(1)));
    EXPECT_EQ(group.poolBases[2], addressOf(cache.scalePoolView(0).rawPointer()));
    EXPECT_EQ(group.poolBases[3], addressOf(cache.scalePoolView(1).rawPointer()));
    EXPECT_EQ(group.layers[0].firstHead, 2); // rank 1 of 2 holds heads 2-3 of 4
    EXPECT_EQ(group.layers[1].firstHead, 1);
    EXPECT_EQ(group.layers[1].hostScales.v, 4.0F);
    // Registration: each data pool from K's first byte to V's last, where the manager's V pool ends.
    std::vector<MemoryRange> const ranges = registrationRanges(description);
    ASSERT_EQ(ranges.size(), 4U);
    for (int32_t layer = 0; layer < 2; ++layer)
    {
        uint64_t const v = addressOf(cache.vPoolPtr(layer));
        EXPECT_EQ(v - ranges[static_cast<size_t>(layer)].address, ranges[static_cast<size_t>(layer)].bytes / 2);
        EXPECT_EQ(ranges[static_cast<size_t>(layer)].device, cache.device());
    }
    // A shard of another model is refused, naming the layer.
    TensorParallelShard const other = tensorParallelShard(
        ConfigBuilder({KVLayerConfig{8, 32}, KVLayerConfig{2, 64}}).tokensPerPage(16).build(), 2, 1);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { (void)describeForTransfer(cache, &other); },
        {"shard layer 0 holds 4 heads", "the cache's layer 0 has 2"}));
}

} // namespace
} // namespace kvcache::rt
