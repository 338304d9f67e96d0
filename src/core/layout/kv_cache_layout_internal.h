#pragma once

// What the layout maths' two files share (kv_cache_layout.cpp, kv_cache_layout_state.cpp): size arithmetic in 64 bits
// that names what overflowed, and the state layers' part of computeLayout. The check of a state tensor's split rule is
// also tensorParallelShard's (src/dist). Not installed.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <string>

namespace kvcache::rt::detail
{

//! Throws InvalidConfigError naming `what` and its operands when `a op b` left int64 (`overflowed`).
inline void throwIfOverflowed(bool overflowed, std::string const& what, int64_t a, char op, int64_t b)
{
    if (overflowed)
    {
        throw InvalidConfigError(fmt::format("KVCacheConfig: {} = {} {} {} overflows 64-bit sizes (limit {})", what, a,
            op, b, std::numeric_limits<int64_t>::max()));
    }
}

//! a * b, or InvalidConfigError naming `what` when the product leaves int64.
inline int64_t checkedMul(int64_t a, int64_t b, std::string const& what)
{
    int64_t product = 0;
    throwIfOverflowed(__builtin_mul_overflow(a, b, &product), what, a, 'x', b);
    return product;
}

//! a + b, or InvalidConfigError naming `what` when the sum leaves int64.
inline int64_t checkedAdd(int64_t a, int64_t b, std::string const& what)
{
    int64_t sum = 0;
    throwIfOverflowed(__builtin_add_overflow(a, b, &sum), what, a, '+', b);
    return sum;
}

//! Checks `tensor`'s tensor-parallel split rule against its shape: splitDim in [-1, dimensions), no segments without a
//! split dimension, every segment's parts and partSize > 0, and the segments spanning shape[splitDim] exactly. Throws
//! InvalidConfigError whose message starts with `field` (e.g. "KVCacheConfig.stateLayerConfigs[0].tensors[1]").
void checkStateSplit(StateTensorConfig const& tensor, std::string const& field);

//! Validates the state layers and checkpoint slots of `config` and fills the state fields of `layout`.
void addStateLayers(KVCacheConfig const& config, KVCacheLayout& layout);

} // namespace kvcache::rt::detail
