#pragma once

// Host reference of the quantization rules in docs/layout.md ("Quantization rules"): FP8 E4M3 and E2M1 encoding and
// decoding, bit-exact, and the quantization of one head for the per-tensor, per-token-head and NVFP4 formats. The
// quantizing write's GPU tests compare the device's bytes and scales against these functions, so they follow the
// written rules operation by operation (float32 divisions where the rules divide) and never depend on the
// floating-point environment. Every input is defined: NaN, infinities and zeros included; no path divides by zero.

#include "kvcache/core/kv_cache_config.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvcache::test::quant
{

//! E4M3's largest finite magnitude, 1.75 * 2^8: the per-token-head scale is amax / 448.
inline constexpr float kE4M3_MAX = 448.0f;
//! E2M1's largest magnitude: an NVFP4 block scale is the block's amax / 6.
inline constexpr float kE2M1_MAX = 6.0f;
//! The E4M3 code a NaN input encodes to (0xFF also decodes as NaN, but is never produced).
inline constexpr uint8_t kE4M3_NAN = 0x7F;
//! The E4M3 codes of +448 and -448, where larger magnitudes and infinities saturate.
inline constexpr uint8_t kE4M3_MAX_CODE = 0x7E;
//! The E2M1 code of +6 (a nibble); bit 3 is the sign.
inline constexpr uint8_t kE2M1_MAX_CODE = 0x7;

namespace detail
{

//! Rounds a non-negative value to an integer, ties to even, by comparison rather than through the rounding mode.
inline double roundHalfEven(double value)
{
    double const floor = std::floor(value);
    double const fraction = value - floor; // exact: both are below 2^52 here
    if (fraction > 0.5)
    {
        return floor + 1.0;
    }
    if (fraction < 0.5)
    {
        return floor;
    }
    return std::fmod(floor, 2.0) == 0.0 ? floor : floor + 1.0;
}

//! Encodes magnitude `a` (finite, below the format's saturation bound) of a float format with `mantissaBits` and
//! smallest normal exponent `minExponent`; codes are exponent-field << mantissaBits | mantissa, so a mantissa that
//! rounds up to the next binade carries into the exponent field by plain addition. Every step is a power of two,
//! so the divisions below are exact in double.
inline uint32_t encodeMagnitude(double a, int mantissaBits, int minExponent)
{
    double const minNormal = std::ldexp(1.0, minExponent);
    if (a < minNormal)
    {
        // Subnormals (and zero): units of 2^(minExponent - mantissaBits); a result of 2^mantissaBits units is the
        // smallest normal, whose code is exactly that number.
        return static_cast<uint32_t>(roundHalfEven(a / std::ldexp(1.0, minExponent - mantissaBits)));
    }
    int exponent = 0;
    std::frexp(a, &exponent); // a = f * 2^exponent, f in [0.5, 1): the binade is [2^(exponent-1), 2^exponent)
    int const binade = exponent - 1;
    double const units = roundHalfEven(a / std::ldexp(1.0, binade - mantissaBits)); // in [2^m, 2^(m+1)]
    uint32_t const field = static_cast<uint32_t>(binade - minExponent + 1);
    return (field << mantissaBits) + static_cast<uint32_t>(units) - (1u << mantissaBits);
}

} // namespace detail

//! FP8 E4M3 (OCP E4M3FN: bias 7, no infinities, NaN = S.1111.111) of `x`: round to nearest, ties to even; magnitudes
//! above 448 and infinities saturate to +-448 (the satfinite conversion); NaN gives 0x7F; -0 gives 0x80.
inline uint8_t encodeE4M3(float x)
{
    if (std::isnan(x))
    {
        return kE4M3_NAN;
    }
    uint8_t const sign = std::signbit(x) ? uint8_t{0x80} : uint8_t{0x00};
    double const a = std::fabs(static_cast<double>(x));
    if (a >= kE4M3_MAX)
    {
        return static_cast<uint8_t>(sign | kE4M3_MAX_CODE);
    }
    // Below 448 the top binade's steps of 32 round to at most 14 units, 448 itself: no NaN code is reached.
    return static_cast<uint8_t>(sign | detail::encodeMagnitude(a, 3, -6));
}

//! The value of E4M3 code `code`: (-1)^s * 2^(e-7) * (1 + m/8), or 2^-6 * m/8 for e = 0; 0x7F and 0xFF are NaN.
inline float decodeE4M3(uint8_t code)
{
    int const exponent = (code >> 3) & 0xF;
    int const mantissa = code & 0x7;
    if (exponent == 0xF && mantissa == 0x7)
    {
        return std::numeric_limits<float>::quiet_NaN();
    }
    float const magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                          : std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
    return (code & 0x80) != 0 ? -magnitude : magnitude;
}

//! E2M1 (bias 1, values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}) of `x` as a nibble, sign in bit 3: round to nearest, ties to
//! even; magnitudes above 6 and infinities saturate to +-6; NaN, which E2M1 cannot represent, gives +0 (code 0).
inline uint8_t encodeE2M1(float x)
{
    if (std::isnan(x))
    {
        return 0;
    }
    uint8_t const sign = std::signbit(x) ? uint8_t{0x8} : uint8_t{0x0};
    double const a = std::fabs(static_cast<double>(x));
    if (a >= kE2M1_MAX)
    {
        return static_cast<uint8_t>(sign | kE2M1_MAX_CODE);
    }
    return static_cast<uint8_t>(sign | detail::encodeMagnitude(a, 1, 0));
}

//! The value of E2M1 nibble `code` (bits above 3 ignored): (-1)^s * 2^(e-1) * (1 + m/2), or m/2 for e = 0.
inline float decodeE2M1(uint8_t code)
{
    int const exponent = (code >> 1) & 0x3;
    int const mantissa = code & 0x1;
    float const magnitude = exponent == 0 ? 0.5f * static_cast<float>(mantissa)
                                          : std::ldexp(1.0f + 0.5f * static_cast<float>(mantissa), exponent - 1);
    return (code & 0x8) != 0 ? -magnitude : magnitude;
}

//! The largest magnitude among the finite values of [first, first + count); 0 when there are none. NaN and
//! infinities are left out so that one bad value does not wipe out the scale of the others.
inline float finiteAmax(float const* first, size_t count)
{
    float amax = 0.0f;
    for (size_t i = 0; i < count; ++i)
    {
        float const a = std::fabs(first[i]);
        if (std::isfinite(a) && a > amax)
        {
            amax = a;
        }
    }
    return amax;
}

//! One value stored with `divisor` (a decode scale: stored * divisor reads back as x): `encode(x / divisor)`, or, for a
//! zero divisor, a finite value as the zero of its sign and a non-finite one as itself (never a division by zero).
template <typename Encode>
uint8_t encodeScaled(float x, float divisor, Encode encode)
{
    if (divisor > 0.0f)
    {
        return encode(x / divisor);
    }
    return encode(std::isfinite(x) ? std::copysign(0.0f, x) : x);
}

//! Throws std::invalid_argument naming `name` unless `scale` is finite and at least `zeroAllowed ? 0 : > 0`.
inline void checkScale(char const* name, float scale, bool zeroAllowed)
{
    if (!std::isfinite(scale) || scale < 0.0f || (!zeroAllowed && scale == 0.0f))
    {
        throw std::invalid_argument(std::string(name) + " is " + std::to_string(scale) + "; it must be finite and "
            + (zeroAllowed ? ">= 0" : "> 0"));
    }
}

//! FP8 with a given scale (per tensor: the runtime's k_scale or v_scale): E4M3 of x / scale, saturating.
inline uint8_t quantizeFp8(float x, float scale)
{
    checkScale("FP8 scale", scale, true);
    return encodeScaled(x, scale, encodeE4M3);
}

//! What an FP8 value reads back as: decode(code) * scale.
inline float dequantizeFp8(uint8_t code, float scale)
{
    return decodeE4M3(code) * scale;
}

//! One (token, head) of a kFP8_PER_TOKEN_HEAD cache: its float32 scale and its D E4M3 codes.
struct Fp8Head
{
    float scale = 0.0f;
    std::vector<uint8_t> codes;
};

//! Quantizes one head: scale = finiteAmax / 448 (float32), then each value as quantizeFp8(x, scale). A head whose
//! finite values are all zero (or so small that amax / 448 underflows) gets scale 0 and reads back as zeros.
inline Fp8Head quantizeFp8TokenHead(std::vector<float> const& values)
{
    Fp8Head head;
    head.scale = finiteAmax(values.data(), values.size()) / kE4M3_MAX;
    head.codes.reserve(values.size());
    for (float const x : values)
    {
        head.codes.push_back(encodeScaled(x, head.scale, encodeE4M3));
    }
    return head;
}

//! One (token, head) of a kNVFP4 cache: D / 2 bytes of E2M1 pairs (element 2i in the low nibble of byte i) and
//! D / 16 E4M3 block scales.
struct Nvfp4Head
{
    std::vector<uint8_t> packed;
    std::vector<uint8_t> blockScales;
};

//! Quantizes one head of a layer half whose global (decode) scale is `globalScale`, finite and > 0. Per block of 16:
//! scale code = E4M3((finiteAmax / 6) / globalScale) (float32 divisions, saturating at 448), divisor =
//! decode(scale code) * globalScale (float32), each value = E2M1 of x / divisor (encodeScaled: a zero divisor stores
//! zeros). Throws std::invalid_argument for a bad global scale or a length that is not a multiple of 16.
inline Nvfp4Head quantizeNvfp4Head(std::vector<float> const& values, float globalScale)
{
    checkScale("NVFP4 global scale", globalScale, false);
    size_t const block = rt::kNVFP4_BLOCK_VALUES;
    if (values.size() % block != 0)
    {
        throw std::invalid_argument("NVFP4 head of " + std::to_string(values.size())
            + " values; it must be a multiple of " + std::to_string(block));
    }
    Nvfp4Head head;
    head.packed.assign(values.size() / 2, 0);
    for (size_t first = 0; first < values.size(); first += block)
    {
        float const blockScale = (finiteAmax(values.data() + first, block) / kE2M1_MAX) / globalScale;
        uint8_t const scaleCode = encodeE4M3(blockScale);
        head.blockScales.push_back(scaleCode);
        float const divisor = decodeE4M3(scaleCode) * globalScale;
        for (size_t i = first; i < first + block; ++i)
        {
            uint8_t const nibble = encodeScaled(values[i], divisor, encodeE2M1);
            head.packed[i / 2] |= static_cast<uint8_t>(nibble << (4 * (i % 2)));
        }
    }
    return head;
}

//! What value `i` of an NVFP4 head reads back as: (decodeE2M1(nibble) * decodeE4M3(block scale)) * globalScale.
inline float dequantizeNvfp4(Nvfp4Head const& head, size_t i, float globalScale)
{
    uint8_t const nibble = static_cast<uint8_t>((head.packed.at(i / 2) >> (4 * (i % 2))) & 0xF);
    float const blockScale = decodeE4M3(head.blockScales.at(i / rt::kNVFP4_BLOCK_VALUES));
    return (decodeE2M1(nibble) * blockScale) * globalScale;
}

} // namespace kvcache::test::quant
