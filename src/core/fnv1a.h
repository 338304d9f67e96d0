#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcache::rt::detail
{

//! 64-bit FNV-1a: offset basis 14695981039346656037, prime 1099511628211. Every fingerprint and hash the library
//! documents as FNV-1a folds its values through this, each value's bytes least significant first.
class Fnv1a
{
public:
    //! Folds the sizeof(T) bytes of `value` (an integer or enumerator), least significant first.
    template <typename T>
    void add(T value) noexcept
    {
        auto const bits = static_cast<uint64_t>(value);
        for (size_t byte = 0; byte < sizeof(T); ++byte)
        {
            mHash ^= (bits >> (8 * byte)) & 0xFFu;
            mHash *= 1099511628211ull;
        }
    }

    uint64_t value() const noexcept
    {
        return mHash;
    }

private:
    uint64_t mHash = 14695981039346656037ull;
};

} // namespace kvcache::rt::detail
