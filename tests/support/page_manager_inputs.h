#pragma once

// Inputs the page manager tests share: runs of token ids, and options whose hash seed is fixed so that hashes are the
// same in every run.

#include "kvcache/paging/page_manager.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

namespace kvcache::test
{

//! Returns the `count` token ids first, first + 1, ...
inline std::vector<int32_t> tokensFrom(int32_t first, int32_t count)
{
    std::vector<int32_t> tokens(static_cast<size_t>(count));
    std::iota(tokens.begin(), tokens.end(), first);
    return tokens;
}

//! Returns the hash seed of the 32 bytes first, first + 1, ...
inline std::array<uint8_t, 32> consecutiveSeed(uint8_t first)
{
    std::array<uint8_t, 32> seed{};
    std::iota(seed.begin(), seed.end(), first);
    return seed;
}

//! Returns options of `maxSequences` sequences, prefix caching on or off, hashing with consecutiveSeed(seedFirst).
inline rt::PageManagerOptions seededOptions(int32_t maxSequences, uint8_t seedFirst, bool prefixCaching = true)
{
    rt::PageManagerOptions options;
    options.maxSequences = maxSequences;
    options.enablePrefixCaching = prefixCaching;
    options.hashSeed = consecutiveSeed(seedFirst);
    return options;
}

} // namespace kvcache::test
