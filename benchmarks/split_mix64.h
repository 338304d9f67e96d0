#pragma once

#include <cstdint>

namespace kvcache::bench
{

//! Random numbers drawn inside timed loops: SplitMix64 (Steele, Lea and Flood) and bounded draws by a 32x32-bit
//! multiply (Lemire), a few instructions each (bias below 2^-32 for the bounds used here).
class SplitMix64
{
public:
    explicit SplitMix64(uint64_t seed)
        : mState(seed)
    {
    }
    uint64_t next() noexcept
    {
        uint64_t z = (mState += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        return z ^ (z >> 31);
    }
    //! Returns a draw from [0, n), n > 0.
    int32_t below(int32_t n) noexcept
    {
        return static_cast<int32_t>(((next() >> 32) * static_cast<uint64_t>(n)) >> 32);
    }
    //! Returns a draw from [low, high].
    int32_t between(int32_t low, int32_t high) noexcept
    {
        return low + below(high - low + 1);
    }

private:
    uint64_t mState;
};

} // namespace kvcache::bench
