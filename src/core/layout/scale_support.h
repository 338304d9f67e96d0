#pragma once

// What a quantized cache keeps beside its values (docs/layout.md, "Quantized pages"): page scales in a scale pool a
// layer (per token-head FP8, NVFP4) and host scales in the manager (per-tensor FP8 K/V scales, NVFP4 global scales),
// and which host scales are valid. Every path that moves or writes pages carries both.

#include "kvcache/core/kv_cache_config.h"

#include <cstdint>

namespace kvcache::rt::detail
{

//! Returns true when `quantization` keeps page scales, so each layer has a scale pool: kFP8_PER_TOKEN_HEAD, kNVFP4.
constexpr bool keepsScalePools(KVQuantization quantization) noexcept
{
    return quantization == KVQuantization::kFP8_PER_TOKEN_HEAD || quantization == KVQuantization::kNVFP4;
}

//! Bytes of one FP8 per-token-head scale (float32, as FlashInfer's kv_cache_sf reads it).
inline constexpr int64_t kTOKEN_HEAD_SCALE_BYTES = 4;
//! Bytes of one NVFP4 block scale (FP8 E4M3).
inline constexpr int64_t kNVFP4_SCALE_BYTES = 1;

//! Returns the page scale bytes of one token and head of one half in `quantization` for heads of `headDim` values.
constexpr int64_t scaleBytesPerTokenHead(KVQuantization quantization, int64_t headDim) noexcept
{
    switch (quantization)
    {
    case KVQuantization::kFP8_PER_TOKEN_HEAD: return kTOKEN_HEAD_SCALE_BYTES;
    case KVQuantization::kNVFP4: return headDim / kNVFP4_BLOCK_VALUES * kNVFP4_SCALE_BYTES;
    case KVQuantization::kNONE:
    case KVQuantization::kFP8_PER_TENSOR: break; // per-tensor scales are per layer, on the host, not in pages
    }
    return 0;
}

//! Returns true when `quantization` keeps a K and a V scale a layer on the host (docs/layout.md, "Quantization
//! rules"): the per-tensor FP8 scales and NVFP4's global scales, kFP8_PER_TENSOR and kNVFP4.
constexpr bool keepsHostScales(KVQuantization quantization) noexcept
{
    return quantization == KVQuantization::kFP8_PER_TENSOR || quantization == KVQuantization::kNVFP4;
}

//! E4M3's largest finite magnitude: a per-token-head scale is the head's amax over it.
inline constexpr float kE4M3_MAX = 448.0F;
//! E2M1's largest magnitude: an NVFP4 block scale is the block's amax over it.
inline constexpr float kE2M1_MAX = 6.0F;

//! Returns the amax a host scale of `quantization` maps to the largest code, the divisor of its calibration
//! (docs/layout.md, "Quantization rules"): 448 (kFP8_PER_TENSOR), 448 * 6 (kNVFP4 global scales); 0 for a quantization
//! without host scales.
constexpr float calibrationDivisor(KVQuantization quantization) noexcept
{
    switch (quantization)
    {
    case KVQuantization::kFP8_PER_TENSOR: return kE4M3_MAX;
    case KVQuantization::kNVFP4: return kE4M3_MAX * kE2M1_MAX;
    case KVQuantization::kNONE:
    case KVQuantization::kFP8_PER_TOKEN_HEAD: break;
    }
    return 0.0F;
}

//! Returns true when `value` is a valid host scale of `quantization`: finite and >= 0 per tensor (0 stores every value
//! as zero), finite and > 0 for NVFP4 (a block scale divides by it).
bool isValidHostScale(KVQuantization quantization, float value) noexcept;

//! Returns the limit isValidHostScale applies to `quantization`'s host scales, for messages: "> 0" or ">= 0".
constexpr char const* hostScaleLimit(KVQuantization quantization) noexcept
{
    return quantization == KVQuantization::kNVFP4 ? "> 0" : ">= 0";
}

} // namespace kvcache::rt::detail
