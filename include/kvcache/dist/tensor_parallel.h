#pragma once

#include "kvcache/core/kv_cache_config.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! The KV heads one rank holds of one layer: heads [firstHead, firstHead + numHeads) of the model's layer.
struct TensorParallelLayerShard
{
    int32_t firstHead = {}; //!< the model head the rank's head 0 is
    int32_t numHeads = {};  //!< heads the rank holds: the layer's numKVHeads in the shard's config
    //! Ranks that hold these same heads: 1 for a split layer, tp / numKVHeads for a replicated one, tp for a latent
    //! one.
    int32_t replicas = {};
    //! True when replicas > 1: the layer's heads are copied, not split (fewer KV heads than ranks, or a latent layer).
    bool replicated = {};
};

//! Rank `rank` of `tp`'s share of a model's cache (tensorParallelShard).
struct TensorParallelShard
{
    int32_t tp = {};                                   //!< ranks in the tensor-parallel group
    int32_t rank = {};                                 //!< this rank, in [0, tp)
    KVCacheConfig config = {};                         //!< the rank's cache config: the model's with its heads
    std::vector<TensorParallelLayerShard> layers = {}; //!< one entry a layer: which heads of the model's layer it holds
};

//! Returns rank `rank` of `tp`'s cache config for a model whose full cache is `config`, and which heads it holds.
//!
//! A kKV layer of H heads with H % tp == 0 is split: rank r holds heads [r * H / tp, (r + 1) * H / tp). One with fewer
//! heads than ranks and tp % H == 0 is replicated, as engines do: each head is held by tp / H ranks, rank r holding
//! head r / (tp / H). A kLATENT layer (multi-head latent attention) caches one latent vector a token shared by every
//! attention head, so there is nothing to split by heads: every rank holds the whole of it.
//!
//! A state tensor is split by its own rule (StateTensorConfig::splitDim and splitSegments; docs/layout.md, "Tensor
//! parallelism"): along splitDim, rank r holds parts [r * P / tp, (r + 1) * P / tp) of each segment of P parts and the
//! whole of each replicated segment, in segment order, so every rank's tensor has the same shape. The shard's tensor
//! keeps its rule with each split segment's parts divided by tp. A tensor without a rule (splitDim -1) is whole on every
//! rank. Every other field (batch, lengths, windows, page size and counts, dtype, pool, state slots) is the model's, so
//! every rank has the same page groups, page ids and state slots. tp 1 returns the model's config.
//!
//! Throws InvalidArgumentError, naming the field, the value and the limit, for tp < 1, a rank outside [0, tp), a state
//! tensor whose rule computeLayout would refuse (InvalidConfigError) or whose split segment (or split dimension, without
//! segments) tp does not divide, a layer with numKVHeads < 1, or a kKV layer whose heads neither divide by tp nor
//! divide tp. It checks the state tensors, then the layers, and all of them before building anything. Needs no GPU; the
//! returned config is not otherwise validated (computeLayout does that).
TensorParallelShard tensorParallelShard(KVCacheConfig const& config, int32_t tp, int32_t rank);

} // namespace kvcache::rt
