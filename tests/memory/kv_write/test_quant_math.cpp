// The quantizing write's exact shortcuts (src/memory/kv_write/quant/quant_math.h) against the operations the rules
// name: the division by a reciprocal with one correction against IEEE division, over every finite float16 dividend and
// random float32 ones across the range the kernel uses it in; E2M1 rounding on the float's bits against the host
// reference's E2M1 over a dense sweep of floats, every threshold's neighbours and the extremes. A product by the
// reciprocal without the correction misses some quotients by an ulp, and the thresholds' neighbours tell every rounding
// apart, so a wrong shortcut fails here.

#include "memory/kv_write/quant/quant_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support/quantize_reference.h"

namespace
{

namespace detail = kvcache::rt::detail;
namespace quant = kvcache::test::quant;

//! Every finite float16 value as a float, both signs.
std::vector<float> float16Values()
{
    std::vector<float> values;
    for (uint32_t h = 0; h < 0x7C00U; ++h)
    {
        int const exponent = static_cast<int>(h >> 10);
        auto const mantissa = static_cast<float>(h & 0x3FFU);
        float const v =
            exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1.0F + mantissa / 1024.0F, exponent - 15);
        values.push_back(v);
        values.push_back(-v);
    }
    return values;
}

//! Divisors across the range: its ends, powers of two, and random mantissas at random exponents.
std::vector<float> divisors(std::mt19937& rng, int count)
{
    std::vector<float> values{detail::kFAST_DIVIDE_MIN, detail::kFAST_DIVIDE_MAX, 1.0F, 448.0F, 6.0F, 1.0F / 3.0F};
    std::uniform_real_distribution<float> mantissa(1.0F, 2.0F);
    std::uniform_int_distribution<int> exponent(-50, 49);
    while (static_cast<int>(values.size()) < count)
    {
        values.push_back(std::ldexp(mantissa(rng), exponent(rng)));
    }
    return values;
}

TEST(QuantMath, DivisionByTheReciprocalIsExactForEveryFloat16Dividend)
{
    std::mt19937 rng(7);
    std::vector<float> const dividends = float16Values();
    int64_t checked = 0;
    for (float const b : divisors(rng, 48))
    {
        float const reciprocal = 1.0F / b;
        for (float const a : dividends)
        {
            float const expected = a / b;
            float const actual = detail::divideByReciprocal(a, b, reciprocal);
            if (std::fabs(expected) >= detail::kFAST_QUOTIENT_MIN)
            {
                ASSERT_EQ(detail::floatBits(actual), detail::floatBits(expected)) << a << " / " << b;
            }
            else
            {
                ASSERT_EQ(std::signbit(actual), std::signbit(expected)) << a << " / " << b;
                ASSERT_LT(std::fabs(actual), 0x1p-39F) << a << " / " << b;
            }
            ++checked;
        }
    }
    EXPECT_EQ(checked, int64_t{48} * 0x7C00 * 2);
}

TEST(QuantMath, DivisionByTheReciprocalIsExactForFloat32DividendsInItsRange)
{
    std::mt19937 rng(11);
    std::uniform_int_distribution<uint32_t> bits;
    std::uniform_real_distribution<float> mantissa(1.0F, 2.0F);
    std::uniform_int_distribution<int> exponent(-50, 49);
    int64_t exact = 0;
    for (int i = 0; i < 4'000'000; ++i)
    {
        float a = detail::bitsFloat(bits(rng));
        if (!std::isfinite(a) || std::fabs(a) > detail::kFAST_DIVIDE_MAX)
        {
            a = std::ldexp(mantissa(rng), exponent(rng)) * (i % 2 == 0 ? 1.0F : -1.0F);
        }
        float const b = std::ldexp(mantissa(rng), exponent(rng));
        float const expected = a / b;
        float const actual = detail::divideByReciprocal(a, b, 1.0F / b);
        if (std::fabs(expected) >= detail::kFAST_QUOTIENT_MIN)
        {
            ASSERT_EQ(detail::floatBits(actual), detail::floatBits(expected)) << a << " / " << b;
            ++exact;
        }
        else
        {
            ASSERT_EQ(std::signbit(actual), std::signbit(expected)) << a << " / " << b;
        }
    }
    EXPECT_GT(exact, 1'000'000) << "too few quotients in the exact range to mean anything";
}

TEST(QuantMath, AZeroDivisorWithAZeroReciprocalGivesTheZeroOfTheDividendsSign)
{
    // The kernel passes reciprocal 0 for a zero divisor (a head or block of zeros, or an NVFP4 block scale that
    // rounded to 0): every finite dividend must come out as the zero of its sign, as the rules store it.
    std::mt19937 rng(5);
    std::uniform_int_distribution<uint32_t> bits;
    std::vector<float> dividends = float16Values();
    for (int i = 0; i < 1'000'000; ++i)
    {
        float const a = detail::bitsFloat(bits(rng));
        if (std::isfinite(a))
        {
            dividends.push_back(a);
        }
    }
    dividends.push_back(std::numeric_limits<float>::max());
    dividends.push_back(-std::numeric_limits<float>::denorm_min());
    for (float const a : dividends)
    {
        float const actual = detail::divideByReciprocal(a, 0.0F, 0.0F);
        ASSERT_EQ(detail::floatBits(actual), std::signbit(a) ? 0x80000000U : 0U) << a;
    }
}

TEST(QuantMath, FastRangesHoldZeroAndTheirEnds)
{
    EXPECT_TRUE(detail::isFastAmax(0.0F));
    EXPECT_TRUE(detail::isFastAmax(0x1p-30F));
    EXPECT_TRUE(detail::isFastAmax(detail::kFAST_DIVIDE_MAX));
    EXPECT_FALSE(detail::isFastAmax(std::nextafter(0x1p-30F, 0.0F)));
    EXPECT_FALSE(detail::isFastAmax(std::nextafter(detail::kFAST_DIVIDE_MAX, 1e30F)));
    EXPECT_TRUE(detail::isFastScale(0x1p-40F));
    EXPECT_TRUE(detail::isFastScale(0x1p40F));
    EXPECT_FALSE(detail::isFastScale(0.0F));
    EXPECT_FALSE(detail::isFastScale(std::nextafter(0x1p-40F, 0.0F)));
    EXPECT_FALSE(detail::isFastScale(std::numeric_limits<float>::infinity()));
    EXPECT_FALSE(detail::isFastScale(std::numeric_limits<float>::quiet_NaN()));
    // The smallest fast amax over 448 and 6 stays where the division is exact.
    EXPECT_GE(0x1p-30F / 448.0F, detail::kFAST_QUOTIENT_MIN);
    EXPECT_GE(0x1p-30F / 6.0F, detail::kFAST_QUOTIENT_MIN);
}

TEST(QuantMath, FiniteMagnitudeBitsDropNonFiniteValuesAndSigns)
{
    EXPECT_EQ(detail::finiteMagnitudeBits(-2.5F), detail::floatBits(2.5F));
    EXPECT_EQ(detail::finiteMagnitudeBits(-0.0F), 0U);
    EXPECT_EQ(detail::finiteMagnitudeBits(std::numeric_limits<float>::infinity()), 0U);
    EXPECT_EQ(detail::finiteMagnitudeBits(-std::numeric_limits<float>::infinity()), 0U);
    EXPECT_EQ(detail::finiteMagnitudeBits(std::numeric_limits<float>::quiet_NaN()), 0U);
    EXPECT_EQ(detail::finiteMagnitudeBits(std::numeric_limits<float>::max()),
        detail::floatBits(std::numeric_limits<float>::max()));
}

void expectE2M1(float x)
{
    ASSERT_EQ(detail::encodeE2M1Finite(x), quant::encodeE2M1(x)) << std::hexfloat << x;
    ASSERT_EQ(detail::encodeE2M1Finite(-x), quant::encodeE2M1(-x)) << std::hexfloat << -x;
}

TEST(QuantMath, E2M1OnTheBitsMatchesTheReferenceAroundEveryThreshold)
{
    // The rounding thresholds (midpoints between codes), the codes themselves, and the saturation region.
    for (float const t : {0.0F, 0.25F, 0.5F, 0.75F, 1.0F, 1.25F, 1.5F, 1.75F, 2.0F, 2.5F, 3.0F, 3.5F, 4.0F, 5.0F, 6.0F,
             7.0F, 8.0F, 1e10F})
    {
        float below = t;
        float above = t;
        for (int step = 0; step < 64; ++step)
        {
            expectE2M1(below);
            expectE2M1(above);
            below = std::nextafter(below, 0.0F);
            above = std::nextafter(above, 1e30F);
        }
    }
    expectE2M1(std::numeric_limits<float>::denorm_min());
    expectE2M1(std::numeric_limits<float>::min());
    expectE2M1(std::numeric_limits<float>::max());
}

TEST(QuantMath, E2M1OnTheBitsMatchesTheReferenceOverASweep)
{
    // Every 13th float from 2^-3 to 16 (every binade the codes live in, and past saturation), then every 65537th of
    // the remaining finite floats.
    for (uint32_t bits = detail::floatBits(0.125F); bits <= detail::floatBits(16.0F); bits += 13)
    {
        expectE2M1(detail::bitsFloat(bits));
    }
    for (uint32_t bits = 0; bits < 0x7F800000U; bits += 65537)
    {
        expectE2M1(detail::bitsFloat(bits));
    }
}

} // namespace
