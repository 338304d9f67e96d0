#pragma once

// A value for test data that depends on every index it is given, for kernels and the host models that check them.

#include <cstdint>

namespace kvcache::test
{

//! Returns an integer in [1, 1000] (exact in float16) hashed from `values[0, count)` in order, negated when
//! `negative` (e.g. for V, so that K and V cannot stand in for each other): a value in the wrong place differs.
__host__ __device__ inline float hashedValue(uint32_t const* values, int count, bool negative)
{
    uint32_t hash = values[0];
    for (int i = 1; i < count; ++i)
    {
        hash = hash * 0x9E3779B1u + values[i];
    }
    hash ^= hash >> 15;
    hash *= 0x2C1B3C6Du;
    hash ^= hash >> 12;
    float const magnitude = static_cast<float>(1u + hash % 1000u);
    return negative ? -magnitude : magnitude;
}

} // namespace kvcache::test
