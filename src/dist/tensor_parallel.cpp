#include "kvcache/dist/tensor_parallel.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <cstddef>

namespace kvcache::rt
{

TensorParallelShard tensorParallelShard(KVCacheConfig const& config, int32_t tp, int32_t rank)
{
    if (tp < 1)
    {
        throw InvalidArgumentError(fmt::format("tensorParallelShard: tp is {}; it must be >= 1", tp));
    }
    if (rank < 0 || rank >= tp)
    {
        throw InvalidArgumentError(
            fmt::format("tensorParallelShard: rank is {}; it must be in [0, tp = {}) = [0, {}]", rank, tp, tp - 1));
    }
    TensorParallelShard shard;
    shard.tp = tp;
    shard.rank = rank;
    shard.config = config;
    shard.layers.reserve(config.layerConfigs.size());
    // Check every layer before writing any, so that a bad layer leaves no partial result behind.
    for (size_t i = 0; i < config.layerConfigs.size(); ++i)
    {
        KVLayerConfig const& layer = config.layerConfigs[i];
        int32_t const heads = layer.numKVHeads;
        if (heads < 1)
        {
            throw InvalidArgumentError(fmt::format(
                "tensorParallelShard: KVCacheConfig.layerConfigs[{}].numKVHeads is {}; it must be >= 1", i, heads));
        }
        if (layer.kind == KVLayerKind::kKV && heads % tp != 0 && tp % heads != 0)
        {
            throw InvalidArgumentError(fmt::format("tensorParallelShard: KVCacheConfig.layerConfigs[{}].numKVHeads is "
                                                   "{}, which tp = {} neither divides (to split the heads) nor is a "
                                                   "multiple of (to replicate them)",
                i, heads, tp));
        }
    }
    for (KVLayerConfig& layer : shard.config.layerConfigs)
    {
        int32_t const heads = layer.numKVHeads;
        TensorParallelLayerShard entry;
        if (layer.kind == KVLayerKind::kLATENT)
        {
            // One latent vector a token serves every attention head; splitting it by heads means nothing.
            entry = {0, heads, tp, tp > 1};
        }
        else if (heads % tp == 0)
        {
            int32_t const perRank = heads / tp;
            entry = {rank * perRank, perRank, 1, false};
        }
        else
        {
            int32_t const ranksPerHead = tp / heads;
            entry = {rank / ranksPerHead, 1, ranksPerHead, true};
        }
        layer.numKVHeads = entry.numHeads;
        shard.layers.push_back(entry);
    }
    return shard;
}

} // namespace kvcache::rt
