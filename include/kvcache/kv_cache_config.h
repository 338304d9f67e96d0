#pragma once

#include "kvcache/data_type.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! Default number of tokens in one page of the pool view.
inline constexpr int32_t kTOKENS_PER_PAGE = 128;
//! Largest supported tokensPerPage.
inline constexpr int32_t kMAX_TOKENS_PER_PAGE = 1024;

//! Shape of one attention layer's K (and V) heads.
struct KVLayerConfig
{
    int32_t numKVHeads = {};
    int32_t headDim = {};
};

//! What a KVCacheManager allocates: one buffer per attention layer, each [2, numPages, tokensPerPage, H_i, D_i].
struct KVCacheConfig
{
    int32_t numAttentionLayers = {};
    int32_t maxBatchSize = {};
    int32_t maxSequenceLength = {};
    std::vector<KVLayerConfig> layerConfigs = {};
    DataType kvCacheType = DataType::kHALF;
    //! Pages per half and layer; 0 means the minimum, maxBatchSize * capPadded / tokensPerPage.
    int32_t numPages = 0;
    //! Tokens per page: a power of two in [1, kMAX_TOKENS_PER_PAGE].
    int32_t tokensPerPage = kTOKENS_PER_PAGE;
    //! Pool to allocate from; nullptr means the current device's current pool.
    cudaMemPool_t memPool = nullptr;
};

} // namespace kvcache::rt
