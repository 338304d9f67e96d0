// Host tests of the tensor-parallel shard maths (no GPU): which heads each rank holds, against a model that deals the
// heads out one at a time; worked examples of published shapes; latent layers on every rank; every rejected split
// naming its field, value and limit; and the shard's layout against the model's divided by hand.

#include "kvcache/core/data_type.h"
#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/dist/tensor_parallel.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"

namespace kvcache::rt
{
namespace
{

KVLayerConfig kvLayer(int32_t heads, int32_t dim, int32_t window = 0)
{
    return KVLayerConfig{heads, dim, window, KVLayerKind::kKV};
}

KVLayerConfig latentLayer(int32_t dim)
{
    return KVLayerConfig{1, dim, 0, KVLayerKind::kLATENT};
}

//! The independent model of one layer's split: heads[r] lists the model heads rank r holds. Written as a dealer, not
//! from the formulas: with at least as many heads as ranks, deal the heads in order, filling one rank before the
//! next; with fewer, walk the ranks in order, moving to the next head once it has as many holders as its share.
std::vector<std::vector<int32_t>> dealHeads(int32_t heads, int32_t tp)
{
    std::vector<std::vector<int32_t>> held(static_cast<size_t>(tp));
    if (heads >= tp)
    {
        size_t rank = 0;
        for (int32_t h = 0; h < heads; ++h)
        {
            if (held[rank].size() * static_cast<size_t>(tp) == static_cast<size_t>(heads))
            {
                ++rank;
            }
            held[rank].push_back(h);
        }
    }
    else
    {
        int32_t head = 0;
        int32_t holders = 0;
        for (auto& rankHeads : held)
        {
            if (holders * heads == tp)
            {
                ++head;
                holders = 0;
            }
            rankHeads.push_back(head);
            ++holders;
        }
    }
    return held;
}

std::vector<int32_t> headsOf(TensorParallelLayerShard const& layer)
{
    std::vector<int32_t> heads;
    for (int32_t h = 0; h < layer.numHeads; ++h)
    {
        heads.push_back(layer.firstHead + h);
    }
    return heads;
}

TEST(TensorParallelShard, HeadsMatchTheDealerForEverySplitAndReplication)
{
    int checked = 0;
    for (int32_t heads : {1, 2, 3, 4, 6, 8, 12, 16, 32, 64})
    {
        for (int32_t tp : {1, 2, 3, 4, 6, 8, 16, 32, 64})
        {
            if (heads % tp != 0 && tp % heads != 0)
            {
                continue;
            }
            KVCacheConfig const config = test::ConfigBuilder({kvLayer(heads, 128), kvLayer(heads, 64, 256)});
            std::vector<std::vector<int32_t>> const expected = dealHeads(heads, tp);
            std::map<int32_t, int32_t> holdersOfHead;
            for (int32_t rank = 0; rank < tp; ++rank)
            {
                TensorParallelShard const shard = tensorParallelShard(config, tp, rank);
                ASSERT_EQ(shard.tp, tp);
                ASSERT_EQ(shard.rank, rank);
                ASSERT_EQ(shard.layers.size(), 2u);
                for (size_t i = 0; i < 2; ++i)
                {
                    TensorParallelLayerShard const& layer = shard.layers[i];
                    SCOPED_TRACE(testing::Message() << heads << " heads, tp " << tp << ", rank " << rank);
                    EXPECT_EQ(headsOf(layer), expected[static_cast<size_t>(rank)]);
                    EXPECT_EQ(shard.config.layerConfigs[i].numKVHeads, layer.numHeads);
                    EXPECT_EQ(layer.replicas, heads >= tp ? 1 : tp / heads);
                    EXPECT_EQ(layer.replicated, heads < tp);
                    EXPECT_EQ(shard.config.layerConfigs[i].headDim, config.layerConfigs[i].headDim);
                    EXPECT_EQ(shard.config.layerConfigs[i].slidingWindow, config.layerConfigs[i].slidingWindow);
                    ++checked;
                }
                for (int32_t const h : headsOf(shard.layers[0]))
                {
                    ++holdersOfHead[h];
                }
            }
            // Every head is held, and by the same number of ranks.
            ASSERT_EQ(holdersOfHead.size(), static_cast<size_t>(heads));
            for (auto const& [head, holders] : holdersOfHead)
            {
                EXPECT_EQ(holders, heads >= tp ? 1 : tp / heads) << "head " << head << ", tp " << tp;
            }
        }
    }
    EXPECT_GT(checked, 100);
}

// Llama-3.1-70B: 8 KV heads. tp 4: two heads a rank, rank 3 holds heads 6 and 7. tp 16: one head a rank, each head on
// two ranks; rank 5 holds head 2 (ranks 4 and 5 hold head 2).
TEST(TensorParallelShard, WorkedExamplesOfEightHeads)
{
    KVCacheConfig const config = test::ConfigBuilder(std::vector<KVLayerConfig>(80, kvLayer(8, 128)));
    TensorParallelShard const four = tensorParallelShard(config, 4, 3);
    EXPECT_EQ(four.layers[79].firstHead, 6);
    EXPECT_EQ(four.layers[79].numHeads, 2);
    EXPECT_EQ(four.config.layerConfigs[0].numKVHeads, 2);
    EXPECT_FALSE(four.layers[0].replicated);

    TensorParallelShard const sixteen = tensorParallelShard(config, 16, 5);
    EXPECT_EQ(sixteen.layers[0].firstHead, 2);
    EXPECT_EQ(sixteen.layers[0].numHeads, 1);
    EXPECT_EQ(sixteen.layers[0].replicas, 2);
    EXPECT_TRUE(sixteen.layers[0].replicated);
    EXPECT_EQ(tensorParallelShard(config, 16, 4).layers[0].firstHead, 2);
    EXPECT_EQ(tensorParallelShard(config, 16, 6).layers[0].firstHead, 3);
}

TEST(TensorParallelShard, OneRankIsTheModel)
{
    KVCacheConfig const config = test::ConfigBuilder({kvLayer(3, 64), kvLayer(5, 128, 512), latentLayer(576)});
    TensorParallelShard const shard = tensorParallelShard(config, 1, 0);
    ASSERT_EQ(shard.config.layerConfigs.size(), 3u);
    std::vector<int32_t> const heads = {3, 5, 1};
    for (size_t i = 0; i < 3; ++i)
    {
        EXPECT_EQ(shard.config.layerConfigs[i].numKVHeads, heads[i]);
        EXPECT_EQ(shard.layers[i].firstHead, 0);
        EXPECT_EQ(shard.layers[i].numHeads, heads[i]);
        EXPECT_EQ(shard.layers[i].replicas, 1);
        EXPECT_FALSE(shard.layers[i].replicated);
    }
}

// DeepSeek-V3-like: latent layers hold one 576-value vector a token on every rank, whatever tp (even one that would
// not divide a head count); the kKV layer beside it is split.
TEST(TensorParallelShard, LatentLayersAreWholeOnEveryRank)
{
    KVCacheConfig const config = test::ConfigBuilder({latentLayer(576), kvLayer(16, 128), latentLayer(576)});
    for (int32_t const tp : {2, 8, 16})
    {
        for (int32_t rank = 0; rank < tp; ++rank)
        {
            TensorParallelShard const shard = tensorParallelShard(config, tp, rank);
            for (size_t const i : {size_t{0}, size_t{2}})
            {
                EXPECT_EQ(shard.config.layerConfigs[i].kind, KVLayerKind::kLATENT);
                EXPECT_EQ(shard.config.layerConfigs[i].numKVHeads, 1);
                EXPECT_EQ(shard.config.layerConfigs[i].headDim, 576);
                EXPECT_EQ(shard.layers[i].firstHead, 0);
                EXPECT_EQ(shard.layers[i].replicas, tp);
                EXPECT_TRUE(shard.layers[i].replicated);
            }
            EXPECT_EQ(shard.config.layerConfigs[1].numKVHeads, 16 / tp);
        }
    }
    // 3 ranks split no 16-head layer, but a model of latent layers alone takes any tp.
    KVCacheConfig const allLatent = test::ConfigBuilder(std::vector<KVLayerConfig>(61, latentLayer(576)));
    EXPECT_EQ(tensorParallelShard(allLatent, 3, 2).config.layerConfigs[60].headDim, 576);
}

// 32 layers of 8 x 128, float16, batch 8, 8192 tokens, 128-token pages: 512 pages, 128 * 8 * 128 * 2 = 262,144 bytes
// a K page. Whole model: 32 * 2 * 512 * 262,144 = 8,589,934,592 bytes. tp 4: a quarter, 2,147,483,648 bytes, the same
// pages. tp 16: one head, 32,768 bytes a page, 32 * 2 * 512 * 32,768 = 1,073,741,824 bytes.
TEST(TensorParallelShard, ShardLayoutKeepsPagesAndDividesBytes)
{
    KVCacheConfig const config =
        test::ConfigBuilder(std::vector<KVLayerConfig>(32, kvLayer(8, 128))).maxBatchSize(8).maxSequenceLength(8192);
    KVCacheLayout const full = computeLayout(config);
    EXPECT_EQ(full.cacheBytes, int64_t{8589934592});
    KVCacheLayout const quarter = computeLayout(tensorParallelShard(config, 4, 1).config);
    EXPECT_EQ(quarter.cacheBytes, int64_t{2147483648});
    EXPECT_EQ(quarter.numPages, 512);
    KVCacheLayout const replicated = computeLayout(tensorParallelShard(config, 16, 15).config);
    EXPECT_EQ(replicated.cacheBytes, int64_t{1073741824});
    EXPECT_EQ(replicated.numPages, 512);
}

TEST(TensorParallelShard, RefusesBadSplitsNamingFieldValueAndLimit)
{
    KVCacheConfig const config = test::ConfigBuilder({kvLayer(8, 128), kvLayer(6, 128)});
    EXPECT_TRUE(
        test::throwsNaming<InvalidArgumentError>([&] { tensorParallelShard(config, 0, 0); }, {"tp", "0", ">= 1"}));
    EXPECT_TRUE(
        test::throwsNaming<InvalidArgumentError>([&] { tensorParallelShard(config, -2, 0); }, {"tp", "-2", ">= 1"}));
    EXPECT_TRUE(test::throwsNaming<InvalidArgumentError>(
        [&] { tensorParallelShard(config, 2, 2); }, {"rank", "2", "[0, tp = 2)"}));
    EXPECT_TRUE(test::throwsNaming<InvalidArgumentError>(
        [&] { tensorParallelShard(config, 2, -1); }, {"rank", "-1", "[0, tp = 2)"}));
    // Layer 1's 6 heads: 4 ranks neither divide 6 nor are a multiple of it.
    EXPECT_TRUE(test::throwsNaming<InvalidArgumentError>([&] { tensorParallelShard(config, 4, 0); },
        {"layerConfigs[1].numKVHeads", "6", "tp = 4", "divides", "multiple"}));
    // Layer 0's 8 heads with 3 ranks: the first bad layer is named.
    EXPECT_TRUE(test::throwsNaming<InvalidArgumentError>(
        [&] { tensorParallelShard(config, 3, 0); }, {"layerConfigs[0].numKVHeads", "8", "tp = 3"}));
    KVCacheConfig const noHeads = test::ConfigBuilder({kvLayer(8, 128), kvLayer(0, 128)});
    EXPECT_TRUE(test::throwsNaming<InvalidArgumentError>(
        [&] { tensorParallelShard(noHeads, 2, 0); }, {"layerConfigs[1].numKVHeads", "0", ">= 1"}));
    // 6 heads and 12 ranks replicate (two ranks a head); 6 heads and 2 or 3 ranks split.
    EXPECT_EQ(tensorParallelShard(config, 2, 1).config.layerConfigs[1].numKVHeads, 3);
    EXPECT_NO_THROW(tensorParallelShard(test::ConfigBuilder({kvLayer(6, 64)}), 12, 11));
}

TEST(TensorParallelShard, KeepsEveryOtherField)
{
    KVCacheConfig config = test::ConfigBuilder({kvLayer(4, 64, 1024), kvLayer(4, 64)})
                               .maxBatchSize(3)
                               .maxSequenceLength(4096)
                               .tokensPerPage(32)
                               .dataType(DataType::kBF16)
                               .maxTokensPerStep(512)
                               .numPagesPerGroup({400, 100});
    TensorParallelShard const shard = tensorParallelShard(config, 2, 1);
    EXPECT_EQ(shard.config.numAttentionLayers, 2);
    EXPECT_EQ(shard.config.maxBatchSize, 3);
    EXPECT_EQ(shard.config.maxSequenceLength, 4096);
    EXPECT_EQ(shard.config.tokensPerPage, 32);
    EXPECT_EQ(shard.config.kvCacheType, DataType::kBF16);
    EXPECT_EQ(shard.config.maxTokensPerStep, 512);
    EXPECT_EQ(shard.config.numPagesPerGroup, (std::vector<int32_t>{400, 100}));
    EXPECT_EQ(shard.config.layerConfigs[0].slidingWindow, 1024);
    EXPECT_EQ(shard.config.layerConfigs[1].numKVHeads, 2);
    EXPECT_EQ(shard.layers[1].firstHead, 2);
}

} // namespace
} // namespace kvcache::rt
