#pragma once

// Exact shortcuts of the quantizing write's arithmetic (docs/layout.md, "Quantization rules"), host and device: a
// division by a reciprocal with one correction, and E2M1 rounding by additions to 2^24. The kernel takes them where
// their ranges hold (checked a warp at a time) and the rules' plain operations elsewhere;
// tests/memory/kv_write/test_quant_math.cpp checks both against the plain operations on the host.

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVCACHE_QUANT_MATH __host__ __device__ __forceinline__
#else
#define KVCACHE_QUANT_MATH inline
#endif

namespace kvcache::rt::detail
{

//! The magnitudes divideByReciprocal is exact for: dividends up to kFAST_DIVIDE_MAX and divisors in
//! [kFAST_DIVIDE_MIN, kFAST_DIVIDE_MAX], whenever the quotient is at least kFAST_QUOTIENT_MIN.
inline constexpr float kFAST_DIVIDE_MIN = 0x1p-50F;
inline constexpr float kFAST_DIVIDE_MAX = 0x1p50F;
inline constexpr float kFAST_QUOTIENT_MIN = 0x1p-40F;

KVCACHE_QUANT_MATH float fusedMultiplyAdd(float a, float b, float c)
{
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
}

KVCACHE_QUANT_MATH float multiply(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

//! `from`'s bits as a `To` of the same size. A copy of the bytes, which the host and device compilers alike turn into a
//! register move (what __float_as_uint and __uint_as_float compile to on the device).
template <typename To, typename From>
KVCACHE_QUANT_MATH To sameBits(From from)
{
    static_assert(sizeof(To) == sizeof(From), "sameBits reads one type's bytes as another of the same size");
    To to{};
    memcpy(&to, &from, sizeof to);
    return to;
}

KVCACHE_QUANT_MATH uint32_t floatBits(float x)
{
    return sameBits<uint32_t>(x);
}

KVCACHE_QUANT_MATH float bitsFloat(uint32_t bits)
{
    return sameBits<float>(bits);
}

//! a / b rounded to nearest even, from `reciprocal` = 1 / b rounded to nearest even: the product q = a * reciprocal is
//! off by at most an ulp, and one step with the exact residual (a fused multiply-add) rounds it correctly (Markstein's
//! correction). Exact for |a| <= kFAST_DIVIDE_MAX and b in [kFAST_DIVIDE_MIN, kFAST_DIVIDE_MAX] whenever |a / b| >=
//! 2^-40; below that (|a| far under b) it may miss by an ulp but keeps a's sign, which no encoding here can tell apart
//! (E4M3 and E2M1 round anything under 2^-10 to a signed zero). The residual is taken as q * b - a and subtracted
//! (its negation rides on the reciprocal's sign, for free): of the two zeros a zero dividend's steps add, the last then
//! has the dividend's sign, so the quotient keeps it without a sign fix. With b = 0 and reciprocal 0 it gives the zero
//! of a's sign for every finite a, the rules' zero divisor.
KVCACHE_QUANT_MATH float divideByReciprocal(float a, float b, float reciprocal)
{
    float const q = multiply(a, reciprocal);
    float const overshoot = fusedMultiplyAdd(q, b, -a);
    return fusedMultiplyAdd(overshoot, -reciprocal, q);
}

//! Whether an amax (a head's or a block's, >= 0) keeps every division the quantizing write makes of it or by it within
//! divideByReciprocal's exact range: zero, or in [2^-30, kFAST_DIVIDE_MAX], so that amax / 448 and amax / 6 are at
//! least 2^-39 and exact, and so are the values' quotients by the scales made of them.
KVCACHE_QUANT_MATH bool isFastAmax(float amax)
{
    return amax == 0.0F || (amax >= 0x1p-30F && amax <= kFAST_DIVIDE_MAX);
}

//! Whether a runtime's scale (per-tensor FP8, NVFP4 global) keeps the divisors made of it within divideByReciprocal's
//! range: in [2^-40, 2^40] (an NVFP4 divisor is an E4M3 value in [2^-9, 448] times it).
KVCACHE_QUANT_MATH bool isFastScale(float scale)
{
    return scale >= 0x1p-40F && scale <= 0x1p40F;
}

//! |x|'s bits when x is finite, else 0: for non-negative floats the bits order as the values, so the integer maximum
//! of these is the bits of the largest finite magnitude (the rules' amax).
KVCACHE_QUANT_MATH uint32_t finiteMagnitudeBits(float x)
{
    uint32_t const magnitude = floatBits(x) & 0x7FFFFFFFU;
    return magnitude < 0x7F800000U ? magnitude : 0U;
}

KVCACHE_QUANT_MATH float minimum(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return fminf(a, b);
#else
    return std::fmin(a, b);
#endif
}

//! The bits of the float 2^24 + 2c are kE2M1_BASE + c for E2M1 code c: a float in [2^24, 2^25) is a multiple of 2.
inline constexpr uint32_t kE2M1_BASE = 0x4B800000U;

//! E2M1 code of |x| for a finite `x` as the rules round it (nearest, ties to the even code, saturating at 6), plus
//! kE2M1_BASE: eight of these, value i shifted by 4i and summed (mod 2^32), are the word of their nibbles plus
//! kE2M1_BASE * 0x11111111, as the codes are below 16. Each grid of the format is one rounding: adding |x| times 4, 2
//! or 1 to 2^24 (plus 4 or 8) rounds to a multiple of 2, ties to even, which makes 2^24 + 2c for c = round(2|x|) (the
//! step-1/2 codes below 2), round(|x|) + 2 (step 1, from 2 to 4) and round(|x| / 2) + 4 (step 2, from 4). Each
//! candidate exceeds the code of |x| outside its range and none falls below it, so the code is the smallest (compared
//! as bits, which order as these positive floats do); |x| capped at 6 saturates.
KVCACHE_QUANT_MATH uint32_t e2m1MagnitudeOverBase(float x)
{
    float const magnitude = minimum(std::fabs(x), 6.0F);
    uint32_t const halves = floatBits(fusedMultiplyAdd(magnitude, 4.0F, 0x1p24F));
    uint32_t const units = floatBits(fusedMultiplyAdd(magnitude, 2.0F, 0x1p24F + 4.0F));
    uint32_t const twos = floatBits(magnitude + (0x1p24F + 8.0F));
    uint32_t const fewer = halves < units ? halves : units;
    return fewer < twos ? fewer : twos;
}

//! E2M1 nibble of a finite `x` (sign in bit 3) plus kE2M1_BASE (e2m1MagnitudeOverBase).
KVCACHE_QUANT_MATH uint32_t e2m1NibbleOverBase(float x)
{
    return e2m1MagnitudeOverBase(x) | ((floatBits(x) >> 28) & 0x8U);
}

//! E2M1 nibble of a finite `x`, as the rules round it (e2m1NibbleOverBase without the base).
KVCACHE_QUANT_MATH uint32_t encodeE2M1Finite(float x)
{
    return e2m1NibbleOverBase(x) - kE2M1_BASE;
}

} // namespace kvcache::rt::detail
