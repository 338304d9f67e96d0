#pragma once

// One lane's part of the quantizing token kernel (kv_quant_kernel.cuh): its values as loaded, their amax, and the code
// words it stores, E4M3 bytes or E2M1 nibbles.

#include "memory/kv_write/kv_write_kernel.cuh"
#include "memory/kv_write/quant/quant_codes.cuh"

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kvcache::rt::detail
{

//! This lane's kV values of TensorT as loaded, kept packed: a 16-bit type's values two a word (the first in the low
//! half), a float's one, so that conversions and the amax of 16-bit values work on pairs.
template <typename TensorT, int32_t kV>
struct LaneValues
{
    static constexpr bool kPACKED = sizeof(TensorT) == 2;
    static constexpr int32_t kWORDS = kPACKED ? kV / 2 : kV;
    static_assert(kV * sizeof(TensorT) % 16 == 0, "a lane loads whole 16-byte vectors");

    uint32_t words[kWORDS] = {};

    //! Value i (a constant once unrolled) as a float.
    __device__ __forceinline__ float value(int32_t i) const
    {
        if constexpr (!kPACKED)
        {
            return __uint_as_float(words[i]);
        }
        else if constexpr (std::is_same_v<TensorT, __half>)
        {
            __half2 pair;
            memcpy(&pair, &words[i / 2], sizeof pair);
            return i % 2 == 0 ? __low2float(pair) : __high2float(pair);
        }
        else
        {
            // A bfloat16 is the upper half of the float it stands for.
            return __uint_as_float(i % 2 == 0 ? words[i / 2] << 16 : words[i / 2] & 0xFFFF0000U);
        }
    }
};

//! The bits of one tensor element.
__device__ __forceinline__ uint32_t elementBits(float value)
{
    return __float_as_uint(value);
}
__device__ __forceinline__ uint32_t elementBits(__half value)
{
    return __half_as_ushort(value);
}
__device__ __forceinline__ uint32_t elementBits(__nv_bfloat16 value)
{
    return __bfloat16_as_ushort(value);
}

//! Loads this lane's kV values of a tensor row: whole 16-byte vectors when allowed, else element by element; values
//! at or past `headDim` read as 0.
template <typename TensorT, int32_t kV>
__device__ __forceinline__ void loadValues(
    LaneValues<TensorT, kV>& lane, TensorT const* row, int32_t first, int32_t headDim, bool vectors)
{
    using Lane = LaneValues<TensorT, kV>;
    if (vectors && first + kV <= headDim)
    {
        auto const* from = reinterpret_cast<int4 const*>(row + first);
#pragma unroll
        for (int32_t i = 0; i < Lane::kWORDS / 4; ++i)
        {
            int4 const vector = __ldcs(from + i);
            lane.words[4 * i] = static_cast<uint32_t>(vector.x);
            lane.words[4 * i + 1] = static_cast<uint32_t>(vector.y);
            lane.words[4 * i + 2] = static_cast<uint32_t>(vector.z);
            lane.words[4 * i + 3] = static_cast<uint32_t>(vector.w);
        }
        return;
    }
#pragma unroll
    for (int32_t i = 0; i < kV; ++i)
    {
        uint32_t const bits = first + i < headDim ? elementBits(__ldcs(row + first + i)) : 0U;
        if constexpr (Lane::kPACKED)
        {
            lane.words[i / 2] |= bits << (16 * (i % 2));
        }
        else
        {
            lane.words[i] = bits;
        }
    }
}

//! The largest finite |value| among values [begin, begin + count) of the lane, as float bits (the rules' amax over
//! them), and in `finite` whether all of them are finite. 16-bit values take it two at a time on their bits (a
//! magnitude's bits order as its value), value by value only where one is not finite.
template <typename TensorT, int32_t kV>
__device__ __forceinline__ uint32_t magnitudeBits(
    LaneValues<TensorT, kV> const& lane, int32_t begin, int32_t count, bool& finite)
{
    if constexpr (LaneValues<TensorT, kV>::kPACKED)
    {
        uint32_t most = 0;
#pragma unroll
        for (int32_t j = begin / 2; j < (begin + count) / 2; ++j)
        {
            most = __vmaxu2(most, lane.words[j] & 0x7FFF7FFFU);
        }
        uint32_t const top = max(most & 0xFFFFU, most >> 16);
        constexpr bool kHALF = std::is_same_v<TensorT, __half>;
        finite = top < (kHALF ? 0x7C00U : 0x7F80U);
        if (finite)
        {
            return kHALF ? __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(top))))
                         : top << 16;
        }
    }
    uint32_t bits = 0;
    uint32_t nonFinite = 0;
#pragma unroll
    for (int32_t i = begin; i < begin + count; ++i)
    {
        float const x = lane.value(i);
        bits = max(bits, finiteMagnitudeBits(x));
        nonFinite |= static_cast<uint32_t>((floatBits(x) & 0x7FFFFFFFU) >= 0x7F800000U);
    }
    finite = nonFinite == 0;
    return bits;
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
    //! Sets bytes j and j + 1 (j even) from the low 16 bits of `pair`.
    __device__ __forceinline__ void setPair(int32_t j, uint32_t pair)
    {
        words[j / 4] |= (pair & 0xFFFFU) << (8 * (j % 4));
    }
    __device__ __forceinline__ uint8_t get(int32_t j) const
    {
        return static_cast<uint8_t>(words[j / 4] >> (8 * (j % 4)));
    }
};

//! Byte permutation (PTX prmt): byte i of the result is byte s_i of {b, a} (0-3 from a), where s_i is nibble i of
//! `selector`; with bit 3 of s_i set, the sign bit of that byte replicated.
__device__ __forceinline__ uint32_t permuteBytes(uint32_t a, uint32_t b, uint32_t selector)
{
    uint32_t result = 0;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(result) : "r"(a), "r"(b), "r"(selector));
    return result;
}

//! The E2M1 signs of the eight 16-bit values in `words` (two a word, the first low), value i's at bit 4i + 3 (the
//! sign bit of its nibble): a quotient by a positive divisor, or the zero of a zero divisor, has its dividend's sign.
//! Four permutations instead of a shift and a mask a value: the values' high bytes as 0xFF or 0 by sign, then the
//! even and the odd values a word each, one a byte.
__device__ __forceinline__ uint32_t e2m1Signs(uint32_t const* words)
{
    uint32_t const first = permuteBytes(words[0], words[1], 0xFDB9U); // values 0-3
    uint32_t const last = permuteBytes(words[2], words[3], 0xFDB9U);  // values 4-7
    uint32_t const even = permuteBytes(first, last, 0x6420U);         // values 0, 2, 4, 6
    uint32_t const odd = permuteBytes(first, last, 0x7531U);          // values 1, 3, 5, 7
    return (even & 0x08080808U) | (odd & 0x80808080U);
}

//! The code word (eight E2M1 nibbles, value `at` in the low one) of values [at, at + 8) of the lane divided by
//! `divisor` (> 0, or 0 with reciprocal 0) on the fast path: the codes plus their bases shifted and summed, less the
//! bases (e2m1MagnitudeOverBase), then the signs.
template <typename TensorT, int32_t kV>
__device__ __forceinline__ uint32_t e2m1Word(
    LaneValues<TensorT, kV> const& lane, int32_t at, float divisor, float reciprocal)
{
    uint32_t word = 0;
#pragma unroll
    for (int32_t i = 7; i >= 0; --i)
    {
        float const quotient = divideByReciprocal(lane.value(at + i), divisor, reciprocal);
        uint32_t const nibble =
            LaneValues<TensorT, kV>::kPACKED ? e2m1MagnitudeOverBase(quotient) : e2m1NibbleOverBase(quotient);
        word = (word << 4) + nibble;
    }
    word -= kE2M1_BASE * 0x11111111U;
    if constexpr (LaneValues<TensorT, kV>::kPACKED)
    {
        word |= e2m1Signs(&lane.words[at / 2]);
    }
    return word;
}

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

} // namespace kvcache::rt::detail
