#pragma once

#include "kvcache/core/data_type.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
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

//! The most dimensions of one state tensor's per-sequence shape: a slot-major view [numSlots, ...shape] must fit in
//! rt::Coords (8 dimensions).
inline constexpr int32_t kMAX_STATE_DIMS = 7;

//! One run of consecutive entries along a state tensor's split dimension (StateTensorConfig::splitDim): `parts` parts of
//! `partSize` entries each, e.g. a gated delta net conv state's key heads, `linear_num_key_heads` parts of
//! `linear_key_head_dim` channels.
struct StateSplitSegment
{
    //! Parts in the run (heads, groups or channels), > 0. Tensor parallelism over tp ranks gives rank r parts
    //! [r * parts / tp, (r + 1) * parts / tp), so tp must divide it unless the segment is replicated.
    int64_t parts = {};
    //! Entries of the split dimension one part spans (a head's channels), > 0; a part is never cut between ranks.
    int64_t partSize = 1;
    //! Kept whole on every rank instead of split: e.g. a Mamba2 model's single group of B and C, which every rank
    //! needs (vLLM's extra_groups_for_head_shards).
    bool replicated = false;
    //! What the parts are, for messages (e.g. "linear_num_key_heads"); may be empty.
    std::string name = {};
};

//! One named tensor of a state layer: what one sequence keeps of it, row-major, in `dataType`.
struct StateTensorConfig
{
    //! Non-empty and unique within its layer, e.g. "conv" or "ssm".
    std::string name = {};
    //! Extents of one sequence's tensor, each > 0, 1 to kMAX_STATE_DIMS of them. Declare them in the order the
    //! kernel reads them (docs/layout.md, "State layers"): e.g. a gated delta net's recurrent state {Hv, Dk, Dv} for
    //! FLA's [N, H, K, V] or a Mamba2 SSM state {nheads, headdim, dstate}.
    std::vector<int64_t> shape = {};
    //! Element type: any value of DataType.
    DataType dataType = DataType::kFLOAT;
    //! How tensor parallelism (rt::tensorParallelShard) splits the tensor: the dimension of `shape` it splits, or -1
    //! (the default) to keep the tensor whole on every rank (docs/layout.md, "Tensor parallelism").
    int32_t splitDim = -1;
    //! shape[splitDim] as consecutive segments, in order, their parts * partSize adding up to it: rank r's extent there
    //! is its share of each segment, in segment order. Empty: one segment of shape[splitDim] parts of one entry.
    //! Must be empty when splitDim is -1.
    std::vector<StateSplitSegment> splitSegments = {};
};

//! A layer that keeps a fixed-size state per sequence instead of per-token pages (Mamba, Mamba2, gated delta net,
//! short convolution, KDA). One generic kind: the layer names its tensors; the cache does not know the architecture.
struct StateLayerConfig
{
    //! At least one tensor; each gets [numSlots, ...shape] of the layer's allocation (see kv_cache_layout.h).
    std::vector<StateTensorConfig> tensors = {};
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
    //! State layers (recurrent and convolution layers of hybrid models), in model order; their indices are their own,
    //! apart from the attention layers'. They belong to no page group: each keeps numStateSlots slots of its tensors.
    std::vector<StateLayerConfig> stateLayerConfigs = {};
    //! State slots beyond the maxBatchSize that running sequences hold, kept for checkpoints of a sequence's state.
    //! Must be 0 without state layers.
    int32_t numCheckpointSlots = 0;
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
