#pragma once

#include <cstdint>
#include <cstring>

namespace kvcache::rt::detail
{

//! Returns the bits of `value`: host-held scales are compared and encoded bit for bit.
inline uint32_t bitsOf(float value) noexcept
{
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    return bits;
}

} // namespace kvcache::rt::detail
