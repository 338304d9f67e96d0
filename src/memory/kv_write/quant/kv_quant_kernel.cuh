#pragma once

// The quantizing token kernel: writes tokens into, or reads them back from, the pages of a quantized cache (FP8 per
// tensor, FP8 per token and head, NVFP4) by the rules of docs/layout.md ("Quantization rules"). A head is a group of
// neighbouring lanes (a power of two), lane l of it holding values [l * kV, l * kV + kV), so a head's amax is a
// reduction over its group and an NVFP4 block of 16 values is 16 / kV neighbouring lanes (one lane's values when kV
// is 16, half of them when it is 32).

#include "memory/kv_write/kv_write_kernel.cuh"
#include "memory/kv_write/quant/quant_codes.cuh"
#include "memory/kv_write/quant/quant_lane.cuh"
#include "memory/kv_write/token_op_plan.h"

#include "kvcache/core/kv_cache_config.h"

#include <cstddef>
#include <cstdint>

namespace kvcache::rt::detail
{

//! What the quantizing kernel needs besides the way it resolves a token's address.
struct QuantKernelParams
{
    TokenKernelParams base;
    float kScale;            //!< kFP8_PER_TENSOR: the layer's K scale; kNVFP4: its K global scale; else unused
    float vScale;            //!< the same for V
    float kScaleReciprocal;  //!< 1 / kScale, rounded to nearest even, where isFastScale(kScale) holds; else 0
    float vScaleReciprocal;  //!< the same for V
    bool vectors;            //!< the tensors' rows allow whole-chunk loads (and, reading, stores) of kV elements
    bool codeVectors;        //!< a lane's codes start aligned to their size (up to 16 bytes) in every head
    int32_t laneShift;       //!< log2 of the lanes a head takes
    WriteCounters* counters; //!< the layer's counters, raised when the kernel counts (kCOUNT); else unused
};

//! What one lane saw of one half while the write counts: the largest finite |value| as float bits, and how many of its
//! values saturated (WriteCounters).
struct LaneSeen
{
    uint32_t amaxBits = 0;
    uint32_t saturated = 0;
};

//! Whether a quotient lies past the largest code's rounding interval, so that the encoding clipped it: E4M3 rounds up
//! to 464 down to 448 (a tie goes to its even code, 448), E2M1 below 7 down to 6 (7 ties to the even 8). NaN is never.
template <KVQuantization kFORMAT>
__device__ __forceinline__ bool saturates(float quotient)
{
    return kFORMAT == KVQuantization::kNVFP4 ? fabsf(quotient) >= 7.0F : fabsf(quotient) > 464.0F;
}

//! The quotient that store(x, divisor) encodes (docs/layout.md): x / divisor, or for a zero divisor x itself when it
//! is not finite and a zero otherwise.
__device__ __forceinline__ float storedQuotient(float x, float divisor)
{
    return divisor > 0.0F ? x / divisor : (isfinite(x) ? 0.0F : x);
}

//! Quantizes one lane's kV values of one head half into the page, of which `valid` (<= 0 for a lane past the head) lie
//! inside the head: codes at `codes` (this lane's first byte), scales at `scales` (the head's first scale element).
//! `sub` is the lane's place among the `lanes` lanes of its head; `scale` the per-tensor scale or the NVFP4 global
//! scale, `scaleReciprocal` its reciprocal where it is fast (0 where not: the warp takes the rules' operations). Every
//! lane of the warp calls it (reductions and a vote). The warp takes the fast path when all its values are finite and
//! every amax and scale lies where divideByReciprocal is exact (quant_math.h): divisions become a product and two
//! fused multiply-adds (a zero divisor's reciprocal 0 gives each value's signed zero, as the rules do), E4M3 codes come
//! two a conversion and E2M1 codes as the least of three rounded sums, eight a word (e2m1Word), with the same results
//! as the rules' plain operations, which the other path applies (NaN, infinities, tiny or huge magnitudes).
//! With kCOUNT, `seen` takes the lane's largest finite |value| and its values that saturated.
template <KVQuantization kFORMAT, int32_t kV, bool kCOUNT, typename TensorT>
__device__ __forceinline__ void quantizeLane(LaneValues<TensorT, kV> const& lane, int32_t sub, int32_t lanes,
    int32_t valid, float scale, float scaleReciprocal, uint8_t* codes, void* scales, bool codeVectors, LaneSeen& seen)
{
    if constexpr (kFORMAT == KVQuantization::kNVFP4)
    {
        constexpr int32_t kBLOCKS = kV >= 16 ? kV / 16 : 1; // blocks this lane holds part or all of
        constexpr int32_t kPER_BLOCK = kV >= 16 ? 16 : kV;  // of this lane's values in each
        constexpr int32_t kLANES = kV >= 16 ? 1 : 16 / kV;  // lanes sharing a block
        float amax[kBLOCKS];
        bool fast = scaleReciprocal != 0.0F;
#pragma unroll
        for (int32_t b = 0; b < kBLOCKS; ++b)
        {
            bool finite = true;
            uint32_t const bits = magnitudeBits(lane, b * kPER_BLOCK, kPER_BLOCK, finite);
            amax[b] = bitsFloat(groupMaxBits(bits, kLANES));
            fast = fast && finite && isFastAmax(amax[b]);
            if constexpr (kCOUNT)
            {
                seen.amaxBits = max(seen.amaxBits, bits);
            }
        }
        fast = __all_sync(0xFFFFFFFFU, fast);
        CodeBytes<kV / 2> packed;
#pragma unroll
        for (int32_t b = 0; b < kBLOCKS; ++b)
        {
            uint8_t const blockCode = fast
                ? encodeE4M3(divideByReciprocal(divideByReciprocal(amax[b], 6.0F, 1.0F / 6.0F), scale, scaleReciprocal))
                : encodeE4M3((amax[b] / 6.0F) / scale);
            if (fast)
            {
                // A finite amax's code is no NaN, which the hardware decode would need mapping.
                float const divisor = __half2float(__nv_cvt_fp8_to_halfraw(blockCode, __NV_E4M3)) * scale;
                float const reciprocal = divisor > 0.0F ? __frcp_rn(divisor) : 0.0F;
                if constexpr (kCOUNT)
                {
                    // Division is monotonic: no value of the block clips unless its amax does, which is rare. Counted
                    // before the codes, so that the amax is not kept alive beside them.
                    if (saturates<kFORMAT>(divideByReciprocal(amax[b], divisor, reciprocal)))
                    {
#pragma unroll
                        for (int32_t at = b * kPER_BLOCK; at < (b + 1) * kPER_BLOCK; ++at)
                        {
                            seen.saturated +=
                                saturates<kFORMAT>(divideByReciprocal(lane.value(at), divisor, reciprocal));
                        }
                    }
                }
#pragma unroll
                for (int32_t at = b * kPER_BLOCK; at < (b + 1) * kPER_BLOCK; at += 8)
                {
                    packed.words[at / 8] = e2m1Word(lane, at, divisor, reciprocal);
                }
            }
            else
            {
                float const divisor = decodeE4M3(blockCode) * scale;
#pragma unroll
                for (int32_t i = 0; i < kPER_BLOCK; i += 2)
                {
                    int32_t const at = b * kPER_BLOCK + i;
                    uint32_t const low = encodeScaled(lane.value(at), divisor, encodeE2M1);
                    uint32_t const high = encodeScaled(lane.value(at + 1), divisor, encodeE2M1);
                    packed.set(at / 2, low | (high << 4));
                    if constexpr (kCOUNT)
                    {
                        seen.saturated += saturates<kFORMAT>(storedQuotient(lane.value(at), divisor))
                            + saturates<kFORMAT>(storedQuotient(lane.value(at + 1), divisor));
                    }
                }
            }
            // The block's first lane writes its scale; a block past the head (headDim is a multiple of 16) is none.
            if (b * kPER_BLOCK < valid && sub % kLANES == 0)
            {
                static_cast<uint8_t*>(scales)[(sub * kV + b * kPER_BLOCK) / 16] = blockCode;
            }
        }
        storeCodes<kV / 2>(codes, packed, valid / 2, codeVectors);
    }
    else
    {
        bool finite = true;
        uint32_t const bits = magnitudeBits(lane, 0, kV, finite);
        if constexpr (kCOUNT)
        {
            seen.amaxBits = max(seen.amaxBits, bits);
        }
        float divisor = scale;
        bool fast = false;
        if constexpr (kFORMAT == KVQuantization::kFP8_PER_TOKEN_HEAD)
        {
            float const amax = bitsFloat(groupMaxBits(bits, lanes));
            fast = __all_sync(0xFFFFFFFFU, finite && isFastAmax(amax));
            divisor = fast ? divideByReciprocal(amax, 448.0F, 1.0F / 448.0F) : amax / 448.0F;
            if (sub == 0 && valid > 0)
            {
                *static_cast<float*>(scales) = divisor;
            }
        }
        else
        {
            // Quotients of values up to kFAST_DIVIDE_MAX by a fast scale stay finite.
            fast = __all_sync(0xFFFFFFFFU, finite && scaleReciprocal != 0.0F && bits <= floatBits(kFAST_DIVIDE_MAX));
        }
        CodeBytes<kV> bytes;
        if (fast)
        {
            float const reciprocal = kFORMAT == KVQuantization::kFP8_PER_TENSOR ? scaleReciprocal
                : divisor > 0.0F                                                ? __frcp_rn(divisor)
                                                                                : 0.0F;
#pragma unroll
            for (int32_t i = 0; i < kV; i += 2)
            {
                // Finite quotients only here: the conversion saturates and no NaN needs its own code.
                float2 const quotients = make_float2(divideByReciprocal(lane.value(i), divisor, reciprocal),
                    divideByReciprocal(lane.value(i + 1), divisor, reciprocal));
                bytes.setPair(i, __nv_cvt_float2_to_fp8x2(quotients, __NV_SATFINITE, __NV_E4M3));
            }
            // Every value here is finite, and FP8 per token-head's divisor is its amax over 448: none of them clips.
            if constexpr (kCOUNT && kFORMAT == KVQuantization::kFP8_PER_TENSOR)
            {
                // Division is monotonic: no value of the lane clips unless its amax does, which is rare.
                if (saturates<kFORMAT>(divideByReciprocal(bitsFloat(bits), divisor, reciprocal)))
                {
#pragma unroll
                    for (int32_t i = 0; i < kV; ++i)
                    {
                        seen.saturated += saturates<kFORMAT>(divideByReciprocal(lane.value(i), divisor, reciprocal));
                    }
                }
            }
        }
        else
        {
#pragma unroll
            for (int32_t i = 0; i < kV; ++i)
            {
                bytes.set(i, encodeScaled(lane.value(i), divisor, encodeE4M3));
                if constexpr (kCOUNT)
                {
                    seen.saturated += saturates<kFORMAT>(storedQuotient(lane.value(i), divisor));
                }
            }
        }
        storeCodes<kV>(codes, bytes, valid, codeVectors);
    }
}

//! The counters' amax words as they were when the warp started. Read at the start, so that the read's latency
//! overlaps the warp's work instead of lengthening its end; a value that rose since only costs an atomic that changes
//! nothing. Read through L1: every warp of the grid reads this one line, and most find it in their SM's L1 instead of
//! all queueing at one L2 slice. A stale line is harmless for the same reason, and L1 does not outlive the launch.
__device__ __forceinline__ uint2 amaxAtStart(WriteCounters const* counters)
{
    static_assert(offsetof(WriteCounters, vAmax) == offsetof(WriteCounters, kAmax) + sizeof(float),
        "the two amax words are read as one");
    return __ldca(reinterpret_cast<uint2 const*>(&counters->kAmax));
}

//! Adds a warp's LaneSeen of both halves to its counters. One vote first: once the counters have settled, no lane saw
//! an amax past `before` (amaxAtStart) or a saturated value, and the warp is done. Otherwise the warp reduces its
//! lanes' and its first lane raises what the warp saw past `before` and adds what saturated: one atomic a half at most,
//! whose result nothing waits for. Every lane of the warp calls it.
__device__ __forceinline__ void addSeen(
    LaneSeen kSeen, LaneSeen vSeen, bool hasV, uint2 before, WriteCounters* counters)
{
    bool const news = kSeen.amaxBits > before.x || kSeen.saturated != 0U
        || (hasV && (vSeen.amaxBits > before.y || vSeen.saturated != 0U));
    if (!__any_sync(0xFFFFFFFFU, news))
    {
        return;
    }
    uint32_t const kAmaxBits = __reduce_max_sync(0xFFFFFFFFU, kSeen.amaxBits);
    uint32_t const kCount = __reduce_add_sync(0xFFFFFFFFU, kSeen.saturated);
    uint32_t const vAmaxBits = __reduce_max_sync(0xFFFFFFFFU, vSeen.amaxBits);
    uint32_t const vCount = __reduce_add_sync(0xFFFFFFFFU, vSeen.saturated);
    if ((threadIdx.x & 31U) != 0)
    {
        return;
    }
    // A non-negative float's bits order as its value, so an unsigned maximum on them is the float maximum.
    auto const raise =
        [](float* amax, uint32_t bits, uint32_t beforeBits, unsigned long long* saturated, unsigned long long count)
    {
        if (bits > beforeBits)
        {
            atomicMax(reinterpret_cast<unsigned int*>(amax), bits);
        }
        if (count != 0)
        {
            atomicAdd(saturated, count);
        }
    };
    raise(&counters->kAmax, kAmaxBits, before.x, &counters->kSaturated, kCount);
    if (hasV)
    {
        raise(&counters->vAmax, vAmaxBits, before.y, &counters->vSaturated, vCount);
    }
}

//! Reads one lane's `valid` values (of kV; > 0) of one head half back from the page: the inverse of quantizeLane.
//! Values past `valid` are left as they were.
template <KVQuantization kFORMAT, int32_t kV>
__device__ __forceinline__ void dequantizeLane(
    int32_t sub, int32_t valid, float scale, uint8_t const* codes, void const* scales, float* values)
{
    if constexpr (kFORMAT == KVQuantization::kNVFP4)
    {
#pragma unroll
        for (int32_t i = 0; i < kV; i += 2)
        {
            if (i < valid)
            {
                uint32_t const pair = codes[i / 2];
                float const block = decodeE4M3(static_cast<uint8_t const*>(scales)[(sub * kV + i) / 16]);
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
//! tensor -> pages, else pages -> tensor. A head is 2^laneShift neighbouring lanes of a warp; a warp takes one token
//! and 32 >> laneShift of its heads (grid y picks which), so that a decode step's few tokens still spread over the GPU
//! and every lane loads a whole vector. Grid-strided over tokens in x. kCOUNT (writes only) keeps each lane's amax and
//! saturated values of the tokens it writes in registers and adds its warp's to params.counters once, at the
//! warp's end (addSeen).
template <typename TensorT, KVQuantization kFORMAT, int32_t kV, bool kWRITE, bool kCOUNT, typename Source>
__global__ void __launch_bounds__(32 * kQUANT_WARPS_PER_BLOCK) quantTokenKernel(QuantKernelParams params, Source source)
{
    static_assert(kWRITE || !kCOUNT, "only the write counts");
    TokenKernelParams const& base = params.base;
    LayerRef const& layer = base.layer;
    // Compared where it is used, so that nothing waits for this load before the first token's loads are issued (t
    // runs below capacity, so a count past it or below 0 needs no clamp).
    int32_t const count = base.count == nullptr ? base.capacity : loadWord(base.count);
    auto const lane = static_cast<int32_t>(threadIdx.x);
    int32_t const lanes = 1 << params.laneShift;
    int32_t const sub = lane & (lanes - 1);
    int32_t const heads = layer.numKVHeads;
    int32_t const head = static_cast<int32_t>(blockIdx.y) * (32 >> params.laneShift) + (lane >> params.laneShift);
    // Lanes of a head past the last one, or past a head's values, hold zeros and store nothing; they still take part
    // in the warp's reductions and vote. Their addresses are computed for the last head, never used.
    int32_t const addressedHead = min(head, heads - 1);
    int32_t const first = sub * kV;
    // This lane's values inside the head: kV, fewer for the last lane of a head that is not a multiple of kV, <= 0
    // past.
    int32_t const valid = head < heads ? min(kV, layer.headDim - first) : 0;
    // Bytes of codes per value: 1, or 1/2 for NVFP4.
    int32_t const codeFirst = kFORMAT == KVQuantization::kNVFP4 ? first / 2 : first;
    bool const hasV = base.v.data != nullptr;
    bool const countsErrors = lane == 0 && blockIdx.y == 0 && base.errorCount != nullptr;
    int64_t const tokensPerGrid = int64_t{gridDim.x} * blockDim.y;
    LaneSeen kSeen;
    LaneSeen vSeen;
    uint2 amaxBefore = make_uint2(0U, 0U);
    if constexpr (kCOUNT)
    {
        amaxBefore = amaxAtStart(params.counters);
    }
    // Tokens run to capacity, not count: a write loads a token's rows (which the tensors hold up to capacity) and its
    // address before the count, itself a load, says whether it moves, so the three loads' latencies overlap instead of
    // following one another.
    for (int64_t t = int64_t{blockIdx.x} * blockDim.y + threadIdx.y; t < base.capacity; t += tokensPerGrid)
    {
        auto* const kRow =
            static_cast<TensorT*>(base.k.data) + t * base.k.tokenStride + int64_t{addressedHead} * base.k.headStride;
        auto* const vRow = hasV
            ? static_cast<TensorT*>(base.v.data) + t * base.v.tokenStride + int64_t{addressedHead} * base.v.headStride
            : nullptr;
        LaneValues<TensorT, kV> kValues;
        LaneValues<TensorT, kV> vValues;
        if constexpr (kWRITE)
        {
            if (valid > 0)
            {
                loadValues(kValues, kRow, first, layer.headDim, params.vectors);
                if (hasV)
                {
                    loadValues(vValues, vRow, first, layer.headDim, params.vectors);
                }
            }
        }
        int64_t const address = source.address(static_cast<int32_t>(t), layer);
        if (t >= count)
        {
            break;
        }
        if (address == kBAD_TOKEN && countsErrors)
        {
            atomicAdd(base.errorCount, 1);
        }
        if (address < 0)
        {
            continue;
        }
        // A page is tokensPerPage tokens of the pools (LayerRef), so a token's address counts tokens from the pools'
        // start: no division into page and offset. Per-tensor FP8 has no scale pools (its scales are the kernel's
        // arguments).
        int64_t const scaleOffset = kFORMAT == KVQuantization::kFP8_PER_TENSOR
            ? 0
            : (address * heads + addressedHead) * layer.scalesPerHead * layer.scaleElementBytes;
        int64_t const codeOffset =
            (address * layer.tokenStride + addressedHead * layer.headStride) * layer.elementBytes;
        auto* const kCodes = static_cast<uint8_t*>(layer.kPool) + codeOffset + codeFirst;
        auto* const kScales = static_cast<uint8_t*>(layer.kScalePool) + scaleOffset;
        auto* const vCodes = hasV ? static_cast<uint8_t*>(layer.vPool) + codeOffset + codeFirst : nullptr;
        auto* const vScales = hasV ? static_cast<uint8_t*>(layer.vScalePool) + scaleOffset : nullptr;
        if constexpr (kWRITE)
        {
            quantizeLane<kFORMAT, kV, kCOUNT>(kValues, sub, lanes, valid, params.kScale, params.kScaleReciprocal,
                kCodes, kScales, params.codeVectors, kSeen);
            if (hasV)
            {
                quantizeLane<kFORMAT, kV, kCOUNT>(vValues, sub, lanes, valid, params.vScale, params.vScaleReciprocal,
                    vCodes, vScales, params.codeVectors, vSeen);
            }
        }
        else if (valid > 0)
        {
            float values[kV];
            dequantizeLane<kFORMAT, kV>(sub, valid, params.kScale, kCodes, kScales, values);
            storeValues<TensorT, kV>(kRow, first, layer.headDim, params.vectors, values);
            if (hasV)
            {
                dequantizeLane<kFORMAT, kV>(sub, valid, params.vScale, vCodes, vScales, values);
                storeValues<TensorT, kV>(vRow, first, layer.headDim, params.vectors, values);
            }
        }
    }
    if constexpr (kCOUNT)
    {
        // Every thread leaves the loop (the kernel returns nowhere before this), so every lane of a warp votes.
        addSeen(kSeen, vSeen, hasV, amaxBefore, params.counters);
    }
}

} // namespace kvcache::rt::detail
