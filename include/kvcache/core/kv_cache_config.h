#pragma once

#include "kvcache/core/data_type.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>
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

//! How a cache stores K and V values, and the scales it keeps beside them (docs/layout.md, "Quantized pages"). Every
//! format keeps the layouts FlashInfer's NHD paged kernels read. Sizes are per (token, head, half) with D = headDim.
enum class KVQuantization : int32_t
{
    //! Values stored as kvCacheType, no scales: e * D bytes (a runtime may still keep its own fp8 scales).
    kNONE = 0,
    //! FP8 E4M3 values and one float K scale and one float V scale per layer, kept by the cache on the host: D bytes,
    //! no per-page scales.
    kFP8_PER_TENSOR = 1,
    //! FP8 E4M3 values and a float32 scale per (page, token, head), K and V each: D + 4 bytes.
    kFP8_PER_TOKEN_HEAD = 2,
    //! NVFP4: E2M1 values two a byte (low nibble first) and one FP8 E4M3 scale per 16 values along the head dimension,
    //! plus a float32 global scale per layer and half kept on the host: D / 2 + D / 16 bytes.
    kNVFP4 = 3,
};

//! Values that share one NVFP4 block scale, along the head dimension.
inline constexpr int32_t kNVFP4_BLOCK_VALUES = 16;

//! Returns the printable name of `quantization` ("fp8_per_token_head", ...), or "unknown" outside the enumeration.
constexpr std::string_view kvQuantizationName(KVQuantization quantization) noexcept
{
    switch (quantization)
    {
    case KVQuantization::kNONE: return "none";
    case KVQuantization::kFP8_PER_TENSOR: return "fp8_per_tensor";
    case KVQuantization::kFP8_PER_TOKEN_HEAD: return "fp8_per_token_head";
    case KVQuantization::kNVFP4: return "nvfp4";
    }
    return "unknown";
}

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
    //! How values are stored and scaled. kFP8_PER_TENSOR and kFP8_PER_TOKEN_HEAD need kvCacheType kFP8_E4M3; kNVFP4
    //! needs kUINT8 (two values a byte) and every headDim a multiple of kNVFP4_BLOCK_VALUES. computeLayout counts the
    //! scale bytes; KVCacheManager keeps the scales (scale pools, host-held layer scales), host tiers and sequence
    //! files carry them, and the paths that do not yet (transfer, the write op) refuse such a cache by name.
    KVQuantization quantization = KVQuantization::kNONE;
};

//! A layer's host-held scales (docs/layout.md, "Quantization rules"): the per-tensor FP8 decode scales
//! (`k_scale`/`v_scale`, finite, >= 0) or the NVFP4 global decode scales of K and V (finite, > 0). A latent layer has
//! no V: its `v` is kept and unused.
struct LayerScales
{
    float k = 1.0F;
    float v = 1.0F;
};

} // namespace kvcache::rt
