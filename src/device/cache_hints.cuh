#pragma once

// PTX helpers for the page kernels: non-coherent loads of lists and the layer table, and the L2 eviction-priority
// hints that large copies use.

#include "core/layout/page_anatomy.h"

#include <cstdint>

namespace kvcache::rt::detail
{

//! Bytes of one L2 cache line.
constexpr int64_t kL2_LINE_BYTES = 128;

//! Reads a 4-byte word. `.nc` is safe: nothing writes lists or the layer table while a page kernel runs.
__device__ __forceinline__ int32_t loadWord(int32_t const* word)
{
    int32_t value;
    asm("ld.global.nc.b32 %0, [%1];" : "=r"(value) : "l"(word));
    return value;
}

//! Reads one layer table entry with one 16-byte load.
__device__ __forceinline__ LayerTableEntry loadLayer(LayerTableEntry const* entry)
{
    static_assert(sizeof(LayerTableEntry) == 16 && alignof(LayerTableEntry) == 16);
    uint64_t base, pageBytesAndV;
    asm("ld.global.nc.v2.b64 {%0, %1}, [%2];" : "=l"(base), "=l"(pageBytesAndV) : "l"(entry));
    return LayerTableEntry{reinterpret_cast<char*>(base), static_cast<int64_t>(pageBytesAndV)};
}

//! Returns a policy that gives the lines a load brings in L2 eviction priority evict_last.
__device__ __forceinline__ uint64_t evictLastPolicy()
{
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

//! Reads 16 bytes under `policy` (from evictLastPolicy()).
__device__ __forceinline__ int4 loadWithPolicy(int4 const* from, uint64_t policy)
{
    int4 v;
    asm("ld.global.cg.L2::cache_hint.v4.s32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(from), "l"(policy));
    return v;
}

//! Gives the L2 line holding `address` back its normal eviction priority.
__device__ __forceinline__ void releaseL2Line(void const* address)
{
    // applypriority takes the line's 128-byte-aligned start.
    auto const line = reinterpret_cast<uintptr_t>(address) & ~static_cast<uintptr_t>(kL2_LINE_BYTES - 1);
    asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(line) : "memory");
}

} // namespace kvcache::rt::detail
