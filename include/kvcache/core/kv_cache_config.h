#pragma once

#include "kvcache/core/data_type.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! Default number of tokens in one page of the pool view.
inline constexpr int32_t kTOKENS_PER_PAGE = 128;
//! Largest supported tokensPerPage.
inline constexpr int32_t kMAX_TOKENS_PER_PAGE = 1024;

//! What one attention layer caches per token.
enum class KVLayerKind : int32_t
{
    //! K and V, each numKVHeads x headDim.
    kKV = 0,
    //! One compressed latent vector of headDim values and no V (multi-head latent attention: DeepSeek-V2/V3, Kimi-K2;
    //! headDim = kv_lora_rank + qk_rope_head_dim). numKVHeads must be 1.
    kLATENT = 1,
};

//! Shape of one attention layer's cache. `{numKVHeads, headDim}` keeps the seed's meaning: full attention, K and V.
struct KVLayerConfig
{
    int32_t numKVHeads = {};
    int32_t headDim = {};
    //! Tokens the layer attends back over (sliding-window attention); 0 means full attention. A windowed layer keeps
    //! only the pages its window can reach (see kv_cache_layout.h) and its slot view is a ring.
    int32_t slidingWindow = 0;
    KVLayerKind kind = KVLayerKind::kKV;
};

//! What a KVCacheManager allocates: one buffer per attention layer, each [2, numPages, tokensPerPage, H_i, D_i].
struct KVCacheConfig
{
    int32_t numAttentionLayers = {};
    int32_t maxBatchSize = {};
    int32_t maxSequenceLength = {};
    std::vector<KVLayerConfig> layerConfigs = {};
    DataType kvCacheType = DataType::kHALF;
    //! Pages per half and layer; 0 means the minimum, maxBatchSize * capPadded / tokensPerPage. With several page
    //! groups (layers of different sliding windows) it must be 0: size each group with numPagesPerGroup.
    int32_t numPages = 0;
    //! Tokens per page: a power of two in [1, kMAX_TOKENS_PER_PAGE].
    int32_t tokensPerPage = kTOKENS_PER_PAGE;
    //! Pool to allocate from; nullptr means the current device's current pool.
    cudaMemPool_t memPool = nullptr;
    //! The most tokens one sequence appends in one step (a prefill chunk); it bounds what a sliding-window layer must
    //! keep. 0 means maxSequenceLength: a whole prompt may arrive at once, so windowed layers keep full-length caches.
    int32_t maxTokensPerStep = 0;
    //! Pages per half of each page group's layers (0 for a group's minimum); empty means every group's minimum, or
    //! numPages for a single group. Group order: see KVCacheLayout::groups.
    std::vector<int32_t> numPagesPerGroup = {};
};

} // namespace kvcache::rt
