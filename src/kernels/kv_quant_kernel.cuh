#pragma once

// The quantizing token kernel: writes tokens into, or reads them back from, the pages of a quantized cache (FP8 per
// tensor, FP8 per token and head, NVFP4) by the rules of docs/layout.md ("Quantization rules"). One warp takes one
// token and quantizes its heads one after the other: lane l holds values [l * kV, l * kV + kV) of a head, so a head's
// amax is a warp reduction and an NVFP4 block of 16 values is 16 / kV neighbouring lanes (or half a lane's values
// when kV is 32).

#include "kernels/kv_write_kernel.cuh"
#include "memory/token_op_plan.h"

#include "kvcache/core/kv_cache_config.h"

#include <cuda_fp8.h>

#include <cstdint>

namespace kvcache::rt::detail
{

//! What the quantizing kernel needs besides the way it resolves a token's address.
struct QuantKernelParams
{
    TokenKernelParams base;
    float kScale;     //!< kFP8_PER_TENSOR: the layer's K scale; kNVFP4: its K global scale; else unused
    float vScale;     //!< the same for V
    bool vectors;     //!< the tensors' rows allow whole-chunk loads (and, reading, stores) of kV elements
    bool codeVectors; //!< a lane's codes start aligned to their size (up to 16 bytes) in every head
};

//! E4M3 of `x` (docs/layout.md): round to nearest even, saturating at +-448 (infinities too), NaN as 0x7F.
__device__ __forceinline__ uint8_t encodeE4M3(float x)
{
    if (isnan(x))
    {
        return 0x7F;
    }
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

//! The value of E4M3 code `code`; 0x7F and 0xFF are NaN.
__device__ __forceinline__ float decodeE4M3(uint32_t code)
{
    uint32_t const exponent = (code >> 3) & 0xF;
    uint32_t const mantissa = code & 0x7;
    float magnitude;
    if (exponent == 0xF && mantissa == 0x7)
    {
        magnitude = __int_as_float(0x7FC00000);
    }
    else if (exponent == 0)
    {
        magnitude = static_cast<float>(mantissa) * 0x1p-9F;
    }
    else
    {
        magnitude = __uint_as_float(((exponent + 120) << 23) | (mantissa << 20));
    }
    return (code & 0x80) != 0 ? -magnitude : magnitude;
}

//! E2M1 nibble of `x`: round to nearest even on {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating at 6, NaN as +0. The
//! thresholds are the midpoints; a midpoint goes to the even code (0, 1, 2, 4, 6 at codes 0, 2, 4, 6).
__device__ __forceinline__ uint32_t encodeE2M1(float x)
{
    if (isnan(x))
    {
        return 0;
    }
    float const a = fabsf(x);
    uint32_t code;
    if (a <= 0.25F)
    {
        code = 0;
    }
    else if (a < 0.75F)
    {
        code = 1;
    }
    else if (a <= 1.25F)
    {
        code = 2;
    }
    else if (a < 1.75F)
    {
        code = 3;
    }
    else if (a <= 2.5F)
    {
        code = 4;
    }
    else if (a < 3.5F)
    {
        code = 5;
    }
    else if (a <= 5.0F)
    {
        code = 6;
    }
    else
    {
        code = 7;
    }
    return signbit(x) ? code | 0x8U : code;
}

//! The value of E2M1 nibble `code` (low four bits): (-1)^s * 2^(e-1) * (1 + m/2), or m/2 for e = 0.
__device__ __forceinline__ float decodeE2M1(uint32_t code)
{
    uint32_t const exponent = (code >> 1) & 0x3;
    uint32_t const mantissa = code & 0x1;
    float const magnitude = exponent == 0 ? 0.5F * static_cast<float>(mantissa)
                                          : __uint_as_float(((exponent + 126) << 23) | (mantissa << 22));
    return (code & 0x8) != 0 ? -magnitude : magnitude;
}

//! `x` as the encoding stores it with decode scale `divisor`: E(x / divisor), or, for a zero divisor, a finite `x` as
//! the zero of its sign and a non-finite one as itself (never a division by zero).
template <typename Encode>
__device__ __forceinline__ uint32_t encodeScaled(float x, float divisor, Encode encode)
{
    if (divisor > 0.0F)
    {
        return encode(x / divisor);
    }
    return encode(isfinite(x) ? copysignf(0.0F, x) : x);
}

//! The largest of `amax` and |x| over finite x.
__device__ __forceinline__ float finiteMax(float amax, float x)
{
    float const a = fabsf(x);
    return isfinite(a) && a > amax ? a : amax;
}

//! The maximum of `value` over groups of `kLANES` neighbouring lanes (a power of two up to 32).
template <int32_t kLANES>
__device__ __forceinline__ float groupMax(float value)
{
#pragma unroll
    for (int32_t offset = kLANES / 2; offset > 0; offset /= 2)
    {
        value = fmaxf(value, __shfl_xor_sync(0xFFFFFFFFU, value, offset));
    }
    return value;
}

//! Loads this lane's kV values of a tensor row (kept in the tensor's type until used, which halves the registers of
//! 16-bit inputs): one chunk access when allowed, else element by element; values at or past `headDim` read as 0.
template <typename TensorT, int32_t kV>
__device__ __forceinline__ ElementChunk<TensorT, kV> loadValues(
    TensorT const* row, int32_t first, int32_t headDim, bool vectors)
{
    if (vectors && first + kV <= headDim)
    {
        return loadOnce(reinterpret_cast<ElementChunk<TensorT, kV> const*>(row + first));
    }
    ElementChunk<TensorT, kV> chunk;
#pragma unroll
    for (int32_t i = 0; i < kV; ++i)
    {
        chunk.values[i] = first + i < headDim ? __ldcs(row + first + i) : fromFloat<TensorT>(0.0F);
    }
    return chunk;
}

//! Stores this lane's kV floats into a tensor row converted to TensorT; elements past `headDim` are not stored.
template <typename TensorT, int32_t kV>
__device__ __forceinline__ void storeValues(TensorT* row, int32_t first, int32_t headDim, bool vectors, float const* in)
{
    if (vectors && first + kV <= headDim)
    {
        ElementChunk<TensorT, kV> chunk;
#pragma unroll
        for (int32_t i = 0; i < kV; ++i)
        {
            chunk.values[i] = fromFloat<TensorT>(in[i]);
        }
        *reinterpret_cast<ElementChunk<TensorT, kV>*>(row + first) = chunk;
        return;
    }
#pragma unroll
    for (int32_t i = 0; i < kV; ++i)
    {
        if (first + i < headDim)
        {
            row[first + i] = fromFloat<TensorT>(in[i]);
        }
    }
}

//! kBYTES code bytes built in 32-bit registers (byte j in bits 8 * (j % 4) of word j / 4): byte arrays of odd sizes
//! measured register spills.
template <int32_t kBYTES>
struct CodeBytes
{
    uint32_t words[(kBYTES + 3) / 4] = {};

    __device__ __forceinline__ void set(int32_t j, uint32_t byte)
    {
        words[j / 4] |= (byte & 0xFFU) << (8 * (j % 4));
    }
    __device__ __forceinline__ uint8_t get(int32_t j) const
    {
        return static_cast<uint8_t>(words[j / 4] >> (8 * (j % 4)));
    }
};

//! Stores this lane's `valid` code bytes of kBYTES: in one access (aligned to min(kBYTES, 16)) when all are and
//! `vectors` says the address is so aligned, else byte by byte.
template <int32_t kBYTES>
__device__ __forceinline__ void storeCodes(uint8_t* to, CodeBytes<kBYTES> const& bytes, int32_t valid, bool vectors)
{
    if (vectors && valid >= kBYTES)
    {
        if constexpr (kBYTES == 1)
        {
            *to = bytes.get(0);
        }
        else if constexpr (kBYTES == 2)
        {
            *reinterpret_cast<uint16_t*>(to) = static_cast<uint16_t>(bytes.words[0]);
        }
        else if constexpr (kBYTES == 4)
        {
            *reinterpret_cast<uint32_t*>(to) = bytes.words[0];
        }
        else if constexpr (kBYTES == 8)
        {
            *reinterpret_cast<uint2*>(to) = make_uint2(bytes.words[0], bytes.words[1]);
        }
        else
        {
#pragma unroll
            for (int32_t w = 0; w < kBYTES / 4; w += 4)
            {
                reinterpret_cast<uint4*>(to)[w / 4] =
                    make_uint4(bytes.words[w], bytes.words[w + 1], bytes.words[w + 2], bytes.words[w + 3]);
            }
        }
        return;
    }
#pragma unroll
    for (int32_t i = 0; i < kBYTES; ++i)
    {
        if (i < valid)
        {
            to[i] = bytes.get(i);
        }
    }
}

//! Quantizes one lane's kV values of one head half into the page, of which `valid` (<= 0 for a lane past the head) lie
//! inside the head: codes at `codes` (this lane's first byte), scales at `scales` (the head's first scale element).
//! `scale` is the per-tensor scale or the NVFP4 global scale. Every lane of the warp calls it (warp reductions).
template <KVQuantization kFORMAT, int32_t kV, typename TensorT>
__device__ __forceinline__ void quantizeLane(ElementChunk<TensorT, kV> const& values, int32_t lane, int32_t valid,
    float scale, uint8_t* codes, void* scales, bool codeVectors)
{
    if constexpr (kFORMAT == KVQuantization::kNVFP4)
    {
        constexpr int32_t kBLOCKS = kV >= 16 ? kV / 16 : 1; // blocks this lane holds part or all of
        constexpr int32_t kPER_BLOCK = kV >= 16 ? 16 : kV;  // of this lane's values in each
        constexpr int32_t kLANES = kV >= 16 ? 1 : 16 / kV;  // lanes sharing a block
        CodeBytes<kV / 2> packed;
#pragma unroll
        for (int32_t b = 0; b < kBLOCKS; ++b)
        {
            float amax = 0.0F;
#pragma unroll
            for (int32_t i = 0; i < kPER_BLOCK; ++i)
            {
                amax = finiteMax(amax, toFloat(values.values[b * kPER_BLOCK + i]));
            }
            amax = groupMax<kLANES>(amax);
            uint8_t const blockCode = encodeE4M3((amax / 6.0F) / scale);
            float const divisor = decodeE4M3(blockCode) * scale;
#pragma unroll
            for (int32_t i = 0; i < kPER_BLOCK; i += 2)
            {
                uint32_t const low = encodeScaled(toFloat(values.values[b * kPER_BLOCK + i]), divisor, encodeE2M1);
                uint32_t const high = encodeScaled(toFloat(values.values[b * kPER_BLOCK + i + 1]), divisor, encodeE2M1);
                packed.set((b * kPER_BLOCK + i) / 2, low | (high << 4));
            }
            // The block's first lane writes its scale; a block past the head (headDim is a multiple of 16) is none.
            if (b * kPER_BLOCK < valid && lane % kLANES == 0)
            {
                static_cast<uint8_t*>(scales)[(lane * kV + b * kPER_BLOCK) / 16] = blockCode;
            }
        }
        storeCodes<kV / 2>(codes, packed, valid / 2, codeVectors);
    }
    else
    {
        float divisor = scale;
        if constexpr (kFORMAT == KVQuantization::kFP8_PER_TOKEN_HEAD)
        {
            float amax = 0.0F;
#pragma unroll
            for (int32_t i = 0; i < kV; ++i)
            {
                amax = finiteMax(amax, toFloat(values.values[i]));
            }
            divisor = groupMax<32>(amax) / 448.0F;
            if (lane == 0)
            {
                *static_cast<float*>(scales) = divisor;
            }
        }
        CodeBytes<kV> bytes;
#pragma unroll
        for (int32_t i = 0; i < kV; ++i)
        {
            bytes.set(i, encodeScaled(toFloat(values.values[i]), divisor, encodeE4M3));
        }
        storeCodes<kV>(codes, bytes, valid, codeVectors);
    }
}

//! Reads one lane's `valid` values (of kV; > 0) of one head half back from the page: the inverse of quantizeLane.
//! Values past `valid` are left as they were.
template <KVQuantization kFORMAT, int32_t kV>
__device__ __forceinline__ void dequantizeLane(
    int32_t lane, int32_t valid, float scale, uint8_t const* codes, void const* scales, float* values)
{
    if constexpr (kFORMAT == KVQuantization::kNVFP4)
    {
#pragma unroll
        for (int32_t i = 0; i < kV; i += 2)
        {
            if (i < valid)
            {
                uint32_t const pair = codes[i / 2];
                float const block = decodeE4M3(static_cast<uint8_t const*>(scales)[(lane * kV + i) / 16]);
                values[i] = (decodeE2M1(pair) * block) * scale;
                values[i + 1] = (decodeE2M1(pair >> 4) * block) * scale;
            }
        }
    }
    else
    {
        float const divisor =
            kFORMAT == KVQuantization::kFP8_PER_TOKEN_HEAD ? *static_cast<float const*>(scales) : scale;
#pragma unroll
        for (int32_t i = 0; i < kV; ++i)
        {
            if (i < valid)
            {
                values[i] = decodeE4M3(codes[i]) * divisor;
            }
        }
    }
}

//! Moves tokens between the tensors (TensorT) and the pages of a quantized cache, kV values a lane; kWRITE quantizes
//! tensor -> pages, else pages -> tensor. A warp takes a token (its address resolved once) and walks its heads, loading
//! the next head's values before it quantizes the current one. Grid-strided over tokens.
template <typename TensorT, KVQuantization kFORMAT, int32_t kV, bool kWRITE, typename Source>
__global__ void __launch_bounds__(32 * kQUANT_WARPS_PER_BLOCK) quantTokenKernel(QuantKernelParams params, Source source)
{
    using Chunk = ElementChunk<TensorT, kV>;
    TokenKernelParams const& base = params.base;
    LayerRef const& layer = base.layer;
    int32_t const count = base.count == nullptr ? base.capacity : min(max(loadWord(base.count), 0), base.capacity);
    int32_t const lane = static_cast<int32_t>(threadIdx.x);
    int32_t const first = lane * kV;
    // This lane's values inside the head: kV, fewer for the last lane of a head that is not a multiple of kV, <= 0
    // past.
    int32_t const valid = min(kV, layer.headDim - first);
    // Bytes of codes per value: 1, or 1/2 for NVFP4.
    int32_t const codeFirst = kFORMAT == KVQuantization::kNVFP4 ? first / 2 : first;
    int32_t const heads = layer.numKVHeads;
    bool const hasV = base.v.data != nullptr;
    int64_t const tokensPerGrid = int64_t{gridDim.x} * blockDim.y;
    for (int64_t t = int64_t{blockIdx.x} * blockDim.y + threadIdx.y; t < count; t += tokensPerGrid)
    {
        int64_t const address = source.address(static_cast<int32_t>(t), layer);
        if (address == kBAD_TOKEN && lane == 0 && base.errorCount != nullptr)
        {
            atomicAdd(base.errorCount, 1);
        }
        int32_t page = 0;
        int32_t offset = 0;
        splitTokenAddress(address, layer.tokensPerPage, page, offset);
        if (page < 0)
        {
            continue;
        }
        auto* const kRow = static_cast<TensorT*>(base.k.data) + t * base.k.tokenStride;
        auto* const vRow = static_cast<TensorT*>(base.v.data) + (hasV ? t * base.v.tokenStride : 0);
        Chunk kNext{};
        Chunk vNext{};
        if constexpr (kWRITE)
        {
            kNext = loadValues<TensorT, kV>(kRow, first, layer.headDim, params.vectors);
            if (hasV)
            {
                vNext = loadValues<TensorT, kV>(vRow, first, layer.headDim, params.vectors);
            }
        }
        for (int32_t head = 0; head < heads; ++head)
        {
            // Per-tensor FP8 has no scale pools (its scales are the kernel's arguments).
            int64_t const scaleOffset = kFORMAT == KVQuantization::kFP8_PER_TENSOR
                ? 0
                : layer.scaleOffset(page, offset, head) * layer.scaleElementBytes;
            auto* const kCodes = static_cast<uint8_t*>(layer.kAddress(page, offset, head)) + codeFirst;
            auto* const kScales = static_cast<uint8_t*>(layer.kScalePool) + scaleOffset;
            auto* const vCodes = hasV ? static_cast<uint8_t*>(layer.vAddress(page, offset, head)) + codeFirst : nullptr;
            auto* const vScales = hasV ? static_cast<uint8_t*>(layer.vScalePool) + scaleOffset : nullptr;
            if constexpr (kWRITE)
            {
                Chunk const kValues = kNext;
                Chunk const vValues = vNext;
                if (head + 1 < heads)
                {
                    kNext = loadValues<TensorT, kV>(
                        kRow + int64_t{head + 1} * base.k.headStride, first, layer.headDim, params.vectors);
                    if (hasV)
                    {
                        vNext = loadValues<TensorT, kV>(
                            vRow + int64_t{head + 1} * base.v.headStride, first, layer.headDim, params.vectors);
                    }
                }
                quantizeLane<kFORMAT, kV>(kValues, lane, valid, params.kScale, kCodes, kScales, params.codeVectors);
                if (hasV)
                {
                    quantizeLane<kFORMAT, kV>(vValues, lane, valid, params.vScale, vCodes, vScales, params.codeVectors);
                }
            }
            else if (valid > 0)
            {
                float values[kV];
                dequantizeLane<kFORMAT, kV>(lane, valid, params.kScale, kCodes, kScales, values);
                storeValues<TensorT, kV>(
                    kRow + int64_t{head} * base.k.headStride, first, layer.headDim, params.vectors, values);
                if (hasV)
                {
                    dequantizeLane<kFORMAT, kV>(lane, valid, params.vScale, vCodes, vScales, values);
                    storeValues<TensorT, kV>(
                        vRow + int64_t{head} * base.v.headStride, first, layer.headDim, params.vectors, values);
                }
            }
        }
    }
}

} // namespace kvcache::rt::detail
