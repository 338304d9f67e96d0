#include "kvcache/dist/tensor_parallel.h"

#include "core/layout/kv_cache_layout_internal.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <cstddef>
#include <string>

namespace kvcache::rt
{
namespace
{

//! Throws InvalidArgumentError (InvalidConfigError for a rule computeLayout refuses) naming `field`'s member when
//! `tensor`'s split rule is malformed or splits something tp does not divide.
void checkStateTensorSplit(StateTensorConfig const& tensor, int32_t tp, std::string const& field)
{
    detail::checkStateSplit(tensor, field);
    if (tensor.splitDim == -1)
    {
        return;
    }
    if (tensor.splitSegments.empty())
    {
        int64_t const extent = tensor.shape[static_cast<size_t>(tensor.splitDim)];
        if (extent % tp != 0)
        {
            throw InvalidArgumentError(fmt::format("{}.shape[{}] (tensor \"{}\", its split dimension) is {}; it must be "
                                                   "a multiple of tp = {}",
                field, tensor.splitDim, tensor.name, extent, tp));
        }
        return;
    }
    for (size_t s = 0; s < tensor.splitSegments.size(); ++s)
    {
        StateSplitSegment const& segment = tensor.splitSegments[s];
        if (!segment.replicated && segment.parts % tp != 0)
        {
            std::string const label =
                segment.name.empty() ? std::string() : fmt::format(": {} = {}", segment.name, segment.parts);
            throw InvalidArgumentError(fmt::format("{}.splitSegments[{}].parts (tensor \"{}\"{}) is {}; it must be a "
                                                   "multiple of tp = {} (or the segment replicated)",
                field, s, tensor.name, label, segment.parts, tp));
        }
    }
}

//! Makes `tensor` (checked by checkStateTensorSplit) one rank's share of it over `tp` ranks.
void shardStateTensor(StateTensorConfig& tensor, int32_t tp)
{
    if (tensor.splitDim == -1)
    {
        return;
    }
    int64_t& extent = tensor.shape[static_cast<size_t>(tensor.splitDim)];
    if (tensor.splitSegments.empty())
    {
        extent /= tp;
        return;
    }
    extent = 0;
    for (StateSplitSegment& segment : tensor.splitSegments)
    {
        if (!segment.replicated)
        {
            segment.parts /= tp;
        }
        // No overflow: the rank's parts are at most the model's, whose product and sum checkStateSplit checked.
        extent += segment.parts * segment.partSize;
    }
}

} // namespace

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
    // Check every state tensor and layer before writing any, so that a bad one leaves no partial result behind.
    for (size_t i = 0; i < config.stateLayerConfigs.size(); ++i)
    {
        std::vector<StateTensorConfig> const& tensors = config.stateLayerConfigs[i].tensors;
        for (size_t t = 0; t < tensors.size(); ++t)
        {
            checkStateTensorSplit(tensors[t], tp,
                fmt::format("tensorParallelShard: KVCacheConfig.stateLayerConfigs[{}].tensors[{}]", i, t));
        }
    }
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
    for (StateLayerConfig& layer : shard.config.stateLayerConfigs)
    {
        for (StateTensorConfig& tensor : layer.tensors)
        {
            shardStateTensor(tensor, tp);
        }
    }
    return shard;
}

} // namespace kvcache::rt
