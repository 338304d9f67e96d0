#pragma once

// What an attention kernel takes for one layer's quantization, from the layout alone (no CUDA calls), so that host
// tests check it for every format without a GPU; KVCacheManager::attentionArguments and scalePoolView call it.

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/core/tensor.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <cstdint>

namespace kvcache::rt::detail
{

//! Returns the scale pool view of layer `layerIdx` of `layout` (a quantization with scale pools) whose scale
//! allocation starts at `scales`: [numHalves, numPages, tokensPerPage, H] float32 (kFP8_PER_TOKEN_HEAD) or
//! [numHalves, numPages, tokensPerPage, H, headDim / 16] FP8 E4M3 (kNVFP4). Checks nothing.
Tensor scalePoolTensor(KVCacheLayout const& layout, int32_t layerIdx, void* scales);

//! Returns layer `layerIdx`'s attention arguments: `hostScales` as kScale / vScale where the format keeps host scales
//! (vScale 1 for a latent layer), 1 elsewhere; the scale pool at `scales` split into its K and V halves where the
//! format keeps scale pools (no V view for a latent layer). Checks nothing.
AttentionArguments attentionArgumentsOf(
    KVCacheLayout const& layout, int32_t layerIdx, LayerScales hostScales, void* scales);

} // namespace kvcache::rt::detail
