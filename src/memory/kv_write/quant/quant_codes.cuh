#pragma once

// The element codes of the quantized formats on the device (docs/layout.md, "Quantization rules"): E4M3 and E2M1
// encoding and decoding, the scaled encoding of the rules, and the reductions the amax takes.

#include "memory/kv_write/quant/quant_math.h"

#include <cuda_fp8.h>

#include <cstdint>

namespace kvcache::rt::detail
{

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

//! The maximum of `bits` over aligned groups of `lanes` neighbouring lanes (a power of two up to 32). Every lane of
//! the warp must call it.
__device__ __forceinline__ uint32_t groupMaxBits(uint32_t bits, int32_t lanes)
{
    for (int32_t offset = lanes / 2; offset > 0; offset /= 2)
    {
        bits = max(bits, __shfl_xor_sync(0xFFFFFFFFU, bits, offset));
    }
    return bits;
}

} // namespace kvcache::rt::detail
