// The host reference of the quantization rules (tests/support/quantize_reference.h, docs/layout.md "Quantization
// rules") against values worked out by hand from the format definitions: E4M3 = (-1)^s 2^(e-7) (1 + m/8), subnormals
// 2^-6 m/8, max 448 = 0x7E, NaN 0x7F/0xFF; E2M1 = {0, 0.5, 1, 1.5, 2, 3, 4, 6} at codes 0-7, sign in bit 3. Each
// expected code is derived in the comment beside it; the exhaustive tests check properties of the definitions (every
// code round-trips; a midpoint goes to the even code), not numbers produced by the code under test.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "support/quantize_reference.h"

namespace kvcache::test::quant
{
namespace
{

float const kNAN = std::numeric_limits<float>::quiet_NaN();
float const kINF = std::numeric_limits<float>::infinity();

// ---- E4M3 ----

TEST(E4M3, EncodesZerosNormalsAndTheMax)
{
    EXPECT_EQ(encodeE4M3(0.0f), 0x00);
    EXPECT_EQ(encodeE4M3(-0.0f), 0x80);                // the sign of zero is kept
    EXPECT_EQ(encodeE4M3(1.0f), 0x38);                 // e = 7, m = 0
    EXPECT_EQ(encodeE4M3(1.125f), 0x39);               // e = 7, m = 1
    EXPECT_EQ(encodeE4M3(0.5f), 0x30);                 // e = 6
    EXPECT_EQ(encodeE4M3(std::ldexp(1.0f, -6)), 0x08); // the smallest normal: e = 1, m = 0
    EXPECT_EQ(encodeE4M3(15.0f), 0x57);                // 1.875 * 2^3: e = 10, m = 7
    EXPECT_EQ(encodeE4M3(-224.0f), 0xF6);              // 1.75 * 2^7: e = 14, m = 6, negative
    EXPECT_EQ(encodeE4M3(416.0f), 0x7D);               // 1.625 * 2^8
    EXPECT_EQ(encodeE4M3(448.0f), 0x7E);               // 1.75 * 2^8, the largest finite value
    EXPECT_EQ(encodeE4M3(-448.0f), 0xFE);
}

TEST(E4M3, EncodesSubnormals)
{
    EXPECT_EQ(encodeE4M3(std::ldexp(1.0f, -9)), 0x01); // 2^-6 * 1/8, the smallest subnormal
    EXPECT_EQ(encodeE4M3(std::ldexp(3.0f, -9)), 0x03);
    EXPECT_EQ(encodeE4M3(std::ldexp(7.0f, -9)), 0x07); // the largest subnormal
    EXPECT_EQ(encodeE4M3(-std::ldexp(5.0f, -9)), 0x85);
    // Below half the smallest subnormal: zero of the value's sign.
    EXPECT_EQ(encodeE4M3(std::ldexp(1.0f, -11)), 0x00);
    EXPECT_EQ(encodeE4M3(-std::ldexp(1.0f, -11)), 0x80);
    EXPECT_EQ(encodeE4M3(std::numeric_limits<float>::denorm_min()), 0x00);
}

TEST(E4M3, TiesGoToTheEvenMantissa)
{
    EXPECT_EQ(encodeE4M3(1.0625f), 0x38);                                     // between 1 (m 0) and 1.125 (m 1)
    EXPECT_EQ(encodeE4M3(1.1875f), 0x3A);                                     // between 1.125 (m 1) and 1.25 (m 2)
    EXPECT_EQ(encodeE4M3(15.5f), 0x58);                                       // between 15 (0x57) and 16 (0x58): carry
    EXPECT_EQ(encodeE4M3(400.0f), 0x7C);                                      // between 384 (m 4) and 416 (m 5)
    EXPECT_EQ(encodeE4M3(432.0f), 0x7E);                                      // between 416 (m 5) and 448 (m 6)
    EXPECT_EQ(encodeE4M3(std::ldexp(1.0f, -10)), 0x00);                       // between 0 and 2^-9
    EXPECT_EQ(encodeE4M3(std::ldexp(3.0f, -10)), 0x02);                       // 1.5 units: to 2
    EXPECT_EQ(encodeE4M3(std::ldexp(5.0f, -10)), 0x02);                       // 2.5 units: to 2
    EXPECT_EQ(encodeE4M3(std::ldexp(15.0f, -10)), 0x08);                      // 7.5 units: to 2^-6, the first normal
    EXPECT_EQ(encodeE4M3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01); // just past the tie
    EXPECT_EQ(encodeE4M3(std::nextafter(1.0625f, 0.0f)), 0x38);
    EXPECT_EQ(encodeE4M3(std::nextafter(1.0625f, 2.0f)), 0x39);
}

TEST(E4M3, SaturatesLargeValuesAndInfinitiesAndKeepsNaN)
{
    EXPECT_EQ(encodeE4M3(449.0f), 0x7E);
    EXPECT_EQ(encodeE4M3(464.0f), 0x7E); // halfway to where 480 would be: still 448, never NaN
    EXPECT_EQ(encodeE4M3(1e30f), 0x7E);
    EXPECT_EQ(encodeE4M3(-1e30f), 0xFE);
    EXPECT_EQ(encodeE4M3(kINF), 0x7E);
    EXPECT_EQ(encodeE4M3(-kINF), 0xFE);
    EXPECT_EQ(encodeE4M3(kNAN), 0x7F);
    EXPECT_EQ(encodeE4M3(-kNAN), 0x7F); // one NaN code whatever the sign
}

TEST(E4M3, Decodes)
{
    EXPECT_EQ(decodeE4M3(0x00), 0.0f);
    EXPECT_TRUE(std::signbit(decodeE4M3(0x80)));
    EXPECT_EQ(decodeE4M3(0x01), std::ldexp(1.0f, -9));
    EXPECT_EQ(decodeE4M3(0x07), std::ldexp(7.0f, -9));
    EXPECT_EQ(decodeE4M3(0x08), std::ldexp(1.0f, -6));
    EXPECT_EQ(decodeE4M3(0x38), 1.0f);
    EXPECT_EQ(decodeE4M3(0x4C), 6.0f); // e = 9, m = 4: 1.5 * 4
    EXPECT_EQ(decodeE4M3(0x57), 15.0f);
    EXPECT_EQ(decodeE4M3(0x7E), 448.0f);
    EXPECT_EQ(decodeE4M3(0xFE), -448.0f);
    EXPECT_TRUE(std::isnan(decodeE4M3(0x7F)));
    EXPECT_TRUE(std::isnan(decodeE4M3(0xFF)));
}

TEST(E4M3, EveryCodeRoundTripsAndEveryMidpointGoesToTheEvenCode)
{
    for (int code = 0; code <= 0x7E; ++code)
    {
        float const value = decodeE4M3(static_cast<uint8_t>(code));
        EXPECT_EQ(encodeE4M3(value), code) << code;
        EXPECT_EQ(encodeE4M3(-value), code | 0x80) << code;
        if (code == 0x7E)
        {
            continue;
        }
        // Consecutive codes are consecutive magnitudes; their midpoint has one bit more than either, so it is exact.
        float const next = decodeE4M3(static_cast<uint8_t>(code + 1));
        float const mid = (value + next) / 2.0f;
        int const even = code % 2 == 0 ? code : code + 1;
        EXPECT_EQ(encodeE4M3(mid), even) << code;
        EXPECT_EQ(encodeE4M3(std::nextafter(mid, 0.0f)), code) << code;
        EXPECT_EQ(encodeE4M3(std::nextafter(mid, 1000.0f)), code + 1) << code;
    }
}

// ---- E2M1 ----

TEST(E2M1, EncodesAndDecodesEveryGridPoint)
{
    float const grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (uint8_t code = 0; code < 8; ++code)
    {
        EXPECT_EQ(encodeE2M1(grid[code]), code) << grid[code];
        EXPECT_EQ(encodeE2M1(-grid[code]), code | 0x8) << grid[code];
        EXPECT_EQ(decodeE2M1(code), grid[code]);
        EXPECT_EQ(decodeE2M1(static_cast<uint8_t>(code | 0x8)), -grid[code]);
    }
    EXPECT_TRUE(std::signbit(decodeE2M1(0x8)));
}

TEST(E2M1, MidpointsGoToTheEvenCode)
{
    EXPECT_EQ(encodeE2M1(0.25f), 0x0); // 0 (code 0) or 0.5 (code 1)
    EXPECT_EQ(encodeE2M1(0.75f), 0x2); // 0.5 (1) or 1 (2)
    EXPECT_EQ(encodeE2M1(1.25f), 0x2); // 1 (2) or 1.5 (3)
    EXPECT_EQ(encodeE2M1(1.75f), 0x4); // 1.5 (3) or 2 (4)
    EXPECT_EQ(encodeE2M1(2.5f), 0x4);  // 2 (4) or 3 (5)
    EXPECT_EQ(encodeE2M1(3.5f), 0x6);  // 3 (5) or 4 (6)
    EXPECT_EQ(encodeE2M1(5.0f), 0x6);  // 4 (6) or 6 (7)
    EXPECT_EQ(encodeE2M1(-0.75f), 0xA);
    EXPECT_EQ(encodeE2M1(-5.0f), 0xE);
    EXPECT_EQ(encodeE2M1(std::nextafter(0.25f, 1.0f)), 0x1);
    EXPECT_EQ(encodeE2M1(std::nextafter(5.0f, 6.0f)), 0x7);
    EXPECT_EQ(encodeE2M1(std::nextafter(5.0f, 0.0f)), 0x6);
}

TEST(E2M1, SaturatesAndMapsNaNToZero)
{
    EXPECT_EQ(encodeE2M1(6.5f), 0x7);
    EXPECT_EQ(encodeE2M1(7.0f), 0x7); // would round to 8 without saturation
    EXPECT_EQ(encodeE2M1(1e30f), 0x7);
    EXPECT_EQ(encodeE2M1(kINF), 0x7);
    EXPECT_EQ(encodeE2M1(-kINF), 0xF);
    EXPECT_EQ(encodeE2M1(kNAN), 0x0);
    EXPECT_EQ(encodeE2M1(-0.0f), 0x8);
    EXPECT_EQ(encodeE2M1(-0.1f), 0x8); // rounds to the zero of its sign
}

// ---- FP8 with a given scale (per tensor) ----

TEST(Fp8PerTensor, DividesByTheScaleAndSaturates)
{
    EXPECT_EQ(quantizeFp8(3.0f, 0.5f), 0x4C);     // 6 = 1.5 * 4
    EXPECT_EQ(quantizeFp8(1000.0f, 1.0f), 0x7E);  // past 448
    EXPECT_EQ(quantizeFp8(-1000.0f, 2.0f), 0xFE); // -500
    EXPECT_EQ(dequantizeFp8(0x4C, 0.5f), 3.0f);
    // A zero scale never divides: finite values are the zero of their sign.
    EXPECT_EQ(quantizeFp8(3.0f, 0.0f), 0x00);
    EXPECT_EQ(quantizeFp8(-3.0f, 0.0f), 0x80);
    EXPECT_EQ(quantizeFp8(kINF, 0.0f), 0x7E);
    for (float const bad : {-1.0f, kNAN, kINF})
    {
        EXPECT_THROW(quantizeFp8(1.0f, bad), std::invalid_argument) << bad;
    }
}

// ---- FP8 per token and head ----

TEST(Fp8TokenHead, ScaleIsAmaxOver448)
{
    // amax 7: scale 7 / 448 = 2^-6 exactly, so x / scale = 64 x.
    std::vector<float> const values = {
        7.0f, -3.5f, 1.0f, std::ldexp(1.0f, -7), std::ldexp(1.0f, -16), std::ldexp(3.0f, -16), -0.0f, 0.0f};
    Fp8Head const head = quantizeFp8TokenHead(values);
    EXPECT_EQ(head.scale, std::ldexp(1.0f, -6));
    // 448 -> 0x7E; -224 -> 0xF6; 64 = 2^6 -> e 13 = 0x68; 0.5 -> 0x30; 2^-10 is the tie between 0 and 2^-9 -> 0;
    // 1.5 * 2^-9 is the tie between 1 and 2 units -> 0x02; -0 -> 0x80.
    EXPECT_EQ(head.codes, (std::vector<uint8_t>{0x7E, 0xF6, 0x68, 0x30, 0x00, 0x02, 0x80, 0x00}));
    EXPECT_EQ(dequantizeFp8(head.codes[0], head.scale), 7.0f);
    EXPECT_EQ(dequantizeFp8(head.codes[1], head.scale), -3.5f);
    EXPECT_EQ(dequantizeFp8(head.codes[5], head.scale), std::ldexp(1.0f, -14)); // 2 * 2^-9 * 2^-6
}

TEST(Fp8TokenHead, AllZeroHeadHasZeroScaleAndReadsBackZero)
{
    Fp8Head const head = quantizeFp8TokenHead({0.0f, -0.0f, 0.0f, 0.0f});
    EXPECT_EQ(head.scale, 0.0f);
    EXPECT_EQ(head.codes, (std::vector<uint8_t>{0x00, 0x80, 0x00, 0x00}));
    for (uint8_t const code : head.codes)
    {
        EXPECT_EQ(dequantizeFp8(code, head.scale), 0.0f);
    }
}

TEST(Fp8TokenHead, ScaleThatUnderflowsIsZeroNotADivisionByZero)
{
    // About 7 * 2^-149: amax / 448 is below half the smallest float subnormal and rounds to 0.
    float const tiny = 1e-44f;
    Fp8Head const head = quantizeFp8TokenHead({tiny, -tiny});
    EXPECT_EQ(head.scale, 0.0f);
    EXPECT_EQ(head.codes, (std::vector<uint8_t>{0x00, 0x80}));
}

TEST(Fp8TokenHead, NaNAndInfinitiesDoNotSetTheScale)
{
    // amax over the finite values is 7 (scale 2^-6): NaN stays NaN, infinities saturate to +-448, -1 -> -64 = 0xE8.
    Fp8Head const head = quantizeFp8TokenHead({kNAN, kINF, -kINF, 7.0f, -1.0f, 0.0f, 0.0f, 0.0f});
    EXPECT_EQ(head.scale, std::ldexp(1.0f, -6));
    EXPECT_EQ(head.codes, (std::vector<uint8_t>{0x7F, 0x7E, 0xFE, 0x7E, 0xE8, 0x00, 0x00, 0x00}));
    EXPECT_TRUE(std::isnan(dequantizeFp8(head.codes[0], head.scale)));
    EXPECT_EQ(dequantizeFp8(head.codes[1], head.scale), 7.0f);
    EXPECT_EQ(dequantizeFp8(head.codes[2], head.scale), -7.0f);
    EXPECT_EQ(dequantizeFp8(head.codes[4], head.scale), -1.0f);

    // No finite value but zeros: scale 0; the infinity still saturates, the NaN stays NaN, both read back defined.
    Fp8Head const bad = quantizeFp8TokenHead({kINF, kNAN, -0.0f, 0.0f});
    EXPECT_EQ(bad.scale, 0.0f);
    EXPECT_EQ(bad.codes, (std::vector<uint8_t>{0x7E, 0x7F, 0x80, 0x00}));
    EXPECT_EQ(dequantizeFp8(bad.codes[0], bad.scale), 0.0f);
}

// ---- NVFP4 ----

std::vector<float> withZeros(std::vector<float> values, size_t size)
{
    values.resize(size, 0.0f);
    return values;
}

TEST(Nvfp4, BlockScaleAndPackingLowNibbleFirst)
{
    // Block 0: amax 6, global 1: block scale (6 / 6) / 1 = 1 = 0x38, divisor 1, so each value is its E2M1 code:
    // 6 7 | -4 E | 3 5 | 2 4 | 1.5 3 | 1 2 | 0.5 1 | 0 0 | -0.25 8 | 0.75 2 | 1.25 2 | 1.75 4 | 2.5 4 | 3.5 6 | 5 6 |
    // -6 F. Block 1: zeros and one -0: amax 0, block scale 0x00, divisor 0, zeros of their sign.
    std::vector<float> values = {
        6.0f, -4.0f, 3.0f, 2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -6.0f};
    values = withZeros(values, 32);
    values[17] = -0.0f;
    Nvfp4Head const head = quantizeNvfp4Head(values, 1.0f);
    EXPECT_EQ(head.blockScales, (std::vector<uint8_t>{0x38, 0x00}));
    // Byte i = code(2i) | code(2i + 1) << 4.
    EXPECT_EQ(
        head.packed, (std::vector<uint8_t>{0xE7, 0x45, 0x23, 0x01, 0x28, 0x42, 0x64, 0xF6, 0x80, 0, 0, 0, 0, 0, 0, 0}));
    EXPECT_EQ(dequantizeNvfp4(head, 0, 1.0f), 6.0f);
    EXPECT_EQ(dequantizeNvfp4(head, 1, 1.0f), -4.0f);
    EXPECT_EQ(dequantizeNvfp4(head, 10, 1.0f), 1.0f); // 1.25 went to 1
    EXPECT_EQ(dequantizeNvfp4(head, 17, 1.0f), 0.0f);
}

TEST(Nvfp4, GlobalScaleDividesTheBlockScale)
{
    // Global 0.5, amax 24: (24 / 6) / 0.5 = 8 = 0x50 (e 10); divisor 8 * 0.5 = 4: 24 -> 6 (7), 10 -> 2.5 -> 2 (4),
    // -12 -> -3 (D), 1 -> 0.25 -> 0 (0).
    Nvfp4Head const head = quantizeNvfp4Head(withZeros({24.0f, 10.0f, -12.0f, 1.0f}, 16), 0.5f);
    EXPECT_EQ(head.blockScales, (std::vector<uint8_t>{0x50}));
    EXPECT_EQ(head.packed, (std::vector<uint8_t>{0x47, 0x0D, 0, 0, 0, 0, 0, 0}));
    EXPECT_EQ(dequantizeNvfp4(head, 0, 0.5f), 24.0f); // (6 * 8) * 0.5
    EXPECT_EQ(dequantizeNvfp4(head, 1, 0.5f), 8.0f);
    EXPECT_EQ(dequantizeNvfp4(head, 2, 0.5f), -12.0f);
}

TEST(Nvfp4, BlockScaleRoundsAndSaturates)
{
    // 6.375 / 6 = 1.0625, the tie between 1 and 1.125: 1 (0x38); 6.375 / 1 is past 6 and saturates (7).
    Nvfp4Head const tie = quantizeNvfp4Head(withZeros({6.375f}, 16), 1.0f);
    EXPECT_EQ(tie.blockScales, (std::vector<uint8_t>{0x38}));
    EXPECT_EQ(tie.packed[0], 0x07);

    // 6000 / 6 = 1000, past 448: 0x7E; divisor 448: 6000 / 448 = 13.4 saturates (7), 1344 / 448 = 3 (5).
    Nvfp4Head const big = quantizeNvfp4Head(withZeros({6000.0f, 1344.0f}, 16), 1.0f);
    EXPECT_EQ(big.blockScales, (std::vector<uint8_t>{0x7E}));
    EXPECT_EQ(big.packed[0], 0x57);

    // amax 18 * 2^-9: block scale 3 * 2^-9, an E4M3 subnormal (0x03); 18 * 2^-9 -> 6 (7), 9 * 2^-9 -> 3 (5).
    Nvfp4Head const small = quantizeNvfp4Head(withZeros({std::ldexp(18.0f, -9), std::ldexp(9.0f, -9)}, 16), 1.0f);
    EXPECT_EQ(small.blockScales, (std::vector<uint8_t>{0x03}));
    EXPECT_EQ(small.packed[0], 0x57);

    // amax 6 * 2^-11: block scale 2^-11, below half of E4M3's smallest subnormal: 0x00, and the block stores zeros.
    Nvfp4Head const zero = quantizeNvfp4Head(withZeros({std::ldexp(6.0f, -11), -std::ldexp(6.0f, -11)}, 16), 1.0f);
    EXPECT_EQ(zero.blockScales, (std::vector<uint8_t>{0x00}));
    EXPECT_EQ(zero.packed[0], 0x80);
}

TEST(Nvfp4, NaNAndInfinitiesDoNotSetTheBlockScale)
{
    // amax over the finite values 3: block scale 0.5 (0x30, e 6); NaN -> 0, Inf -> 7, -Inf -> F, 3 / 0.5 = 6 -> 7.
    Nvfp4Head const head = quantizeNvfp4Head(withZeros({kNAN, kINF, -kINF, 3.0f}, 16), 1.0f);
    EXPECT_EQ(head.blockScales, (std::vector<uint8_t>{0x30}));
    EXPECT_EQ(head.packed[0], 0x70);
    EXPECT_EQ(head.packed[1], 0x7F);
}

TEST(Nvfp4, RefusesABadGlobalScaleOrLength)
{
    std::vector<float> const values(16, 1.0f);
    for (float const bad : {0.0f, -1.0f, kNAN, kINF})
    {
        EXPECT_THROW(quantizeNvfp4Head(values, bad), std::invalid_argument) << bad;
    }
    EXPECT_THROW(quantizeNvfp4Head(std::vector<float>(20, 1.0f), 1.0f), std::invalid_argument);
}

} // namespace
} // namespace kvcache::test::quant
