#pragma once

// An independent model of the token write: element conversions written from the IEEE formats (bit by bit, no CUDA
// header), the token address of a (sequence, position) pair from expanded page lists, and the expected bytes of a layer
// after a write. Tests and benchmarks share it.

#include "kvcache/core/data_type.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace kvcache::test
{

//! Returns the float32 bits of `value`.
inline uint32_t floatBits(float value)
{
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    return bits;
}

//! Returns the float32 of `bits`.
inline float bitsFloat(uint32_t bits)
{
    float value = 0;
    std::memcpy(&value, &bits, sizeof(value));
    return value;
}

//! Returns float16 bits `half` as a float (exact; finite inputs).
inline float halfToFloat(uint16_t half)
{
    float const sign = (half & 0x8000U) != 0 ? -1.0F : 1.0F;
    int const exponent = (half >> 10) & 0x1F;
    int const mantissa = half & 0x3FF;
    if (exponent == 0)
    {
        return sign * std::ldexp(static_cast<float>(mantissa), -24);
    }
    if (exponent == 31)
    {
        return mantissa == 0 ? sign * INFINITY : NAN;
    }
    return sign * std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);
}

//! Returns bfloat16 bits `value` as a float (exact).
inline float bfloat16ToFloat(uint16_t value)
{
    return bitsFloat(static_cast<uint32_t>(value) << 16);
}

//! Returns `value` rounded to the nearest float16, ties to even (finite inputs; overflow gives infinity).
inline uint16_t floatToHalf(float value)
{
    uint32_t const bits = floatBits(value);
    auto const sign = static_cast<uint16_t>((bits >> 16) & 0x8000U);
    uint32_t const magnitude = bits & 0x7FFFFFFFU;
    if (magnitude >= 0x47800000U) // 65536 and up: past the largest finite half even before rounding
    {
        return static_cast<uint16_t>(sign | 0x7C00U);
    }
    if (magnitude < 0x38800000U) // below 2^-14: a subnormal half, in units of 2^-24
    {
        double const units = std::nearbyint(static_cast<double>(bitsFloat(magnitude)) * 16777216.0);
        return static_cast<uint16_t>(sign | static_cast<uint16_t>(units));
    }
    uint32_t const exponent = (magnitude >> 23) - 127 + 15;
    uint32_t const mantissa = magnitude & 0x7FFFFFU;
    uint32_t half = (exponent << 10) | (mantissa >> 13);
    uint32_t const rest = mantissa & 0x1FFFU;
    if (rest > 0x1000U || (rest == 0x1000U && (half & 1U) != 0))
    {
        ++half; // a carry into the exponent is the right result, up to infinity
    }
    return static_cast<uint16_t>(sign | half);
}

//! Returns `value` rounded to the nearest bfloat16, ties to even (finite inputs).
inline uint16_t floatToBfloat16(float value)
{
    uint32_t const bits = floatBits(value);
    uint32_t const rest = bits & 0xFFFFU;
    uint32_t upper = bits >> 16;
    if (rest > 0x8000U || (rest == 0x8000U && (upper & 1U) != 0))
    {
        ++upper;
    }
    return static_cast<uint16_t>(upper);
}

//! Returns `value` as float16 bits for any input: floatToHalf, and NaN as the quiet NaN 0x7E00 (floatToHalf would
//! give infinity). For inputs that hold NaN on purpose.
inline uint16_t floatToHalfWithNan(float value)
{
    return std::isnan(value) ? uint16_t{0x7E00} : floatToHalf(value);
}

//! Returns `value` as a kernel reads it back after it was stored as `type` (float32, float16 or bfloat16): rounded
//! once, to nearest even; NaN and infinities stay what they are.
inline float roundedTo(rt::DataType type, float value)
{
    switch (type)
    {
    case rt::DataType::kHALF: return halfToFloat(floatToHalfWithNan(value));
    case rt::DataType::kBF16: return bfloat16ToFloat(floatToBfloat16(value));
    default: return value;
    }
}

//! Returns the element at `from` (type `fromType`) converted to `toType` as its bytes: the same type copied bit for
//! bit, any other through float with one rounding.
inline std::vector<uint8_t> convertElementBytes(uint8_t const* from, rt::DataType fromType, rt::DataType toType)
{
    int64_t const toBytes = rt::dataTypeSize(toType);
    std::vector<uint8_t> out(static_cast<size_t>(toBytes));
    if (fromType == toType)
    {
        std::memcpy(out.data(), from, out.size());
        return out;
    }
    float value = 0;
    if (fromType == rt::DataType::kFLOAT)
    {
        std::memcpy(&value, from, sizeof(value));
    }
    else
    {
        uint16_t bits = 0;
        std::memcpy(&bits, from, sizeof(bits));
        value = fromType == rt::DataType::kHALF ? halfToFloat(bits) : bfloat16ToFloat(bits);
    }
    if (toType == rt::DataType::kFLOAT)
    {
        std::memcpy(out.data(), &value, sizeof(value));
        return out;
    }
    uint16_t const bits = toType == rt::DataType::kHALF ? floatToHalf(value) : floatToBfloat16(value);
    std::memcpy(out.data(), &bits, sizeof(bits));
    return out;
}

//! The token addresses of a CSR page table, expanded: every resident position of every row mapped to its address.
class TableAddressModel
{
public:
    //! Row s holds `rows[s]` (resident page ids) from position firstToken[s] on.
    TableAddressModel(std::vector<std::vector<int32_t>> const& rows, std::vector<int32_t> const& firstToken,
        int32_t tokensPerPage, int32_t numPages)
    {
        for (size_t s = 0; s < rows.size(); ++s)
        {
            for (size_t j = 0; j < rows[s].size(); ++j)
            {
                int32_t const page = rows[s][j];
                for (int32_t offset = 0; offset < tokensPerPage; ++offset)
                {
                    int32_t const position = firstToken[s] + static_cast<int32_t>(j) * tokensPerPage + offset;
                    if (page >= 0 && page < numPages)
                    {
                        mAddresses[{static_cast<int32_t>(s), position}] = int64_t{page} * tokensPerPage + offset;
                    }
                }
            }
        }
    }
    //! Returns the address of (sequence, position), or nothing when the table does not hold it.
    std::optional<int64_t> address(int32_t sequence, int32_t position) const
    {
        auto const found = mAddresses.find({sequence, position});
        if (found == mAddresses.end())
        {
            return std::nullopt;
        }
        return found->second;
    }

private:
    std::map<std::pair<int32_t, int32_t>, int64_t> mAddresses;
};

} // namespace kvcache::test
