#pragma once

// The page mover: how a group of threads (a block, or a warp in the host tier's kernels) moves or fills one chunk of
// bytes, shared by the page kernels, the host tier's kernels and the transfer's pack kernels. A block shape
// (device/block_shape.h) fixes the threads and the vectors each thread keeps in flight; an access policy fixes the
// load and store instructions, so each kernel keeps the cache behaviour its memory needs.

#include "device/block_shape.h"
#include "device/cache_hints.cuh"

#include <cstdint>

namespace kvcache::rt::detail
{

//! Loads this thread's vectors of a whole chunk (`from` is its first) through Access, all before any store.
template <typename Shape, typename Access>
__device__ __forceinline__ void stageChunk(int4 const* from, int4 (&staged)[Shape::kVECTORS])
{
#pragma unroll
    for (int32_t k = 0; k < Shape::kVECTORS; ++k)
    {
        staged[k] = Access::load(from + k * Shape::kTHREADS);
    }
}

//! The whole-chunk steps of an access policy that takes no hints: stage with its own loads, nothing after the stores.
template <typename Access>
struct UnhintedChunks
{
    template <typename Shape>
    __device__ __forceinline__ void loadChunk(int4 const* from, int4 (&staged)[Shape::kVECTORS]) const
    {
        stageChunk<Shape, Access>(from, staged);
    }
    template <typename Shape>
    __device__ __forceinline__ void afterChunk(int4 const*, int32_t) const
    {
    }
};

//! Plain loads and stores, of any word: the transfer's pack kernels, and bytes on every path.
struct PlainAccess : UnhintedChunks<PlainAccess>
{
    template <typename Word>
    __device__ __forceinline__ static Word load(Word const* from)
    {
        return *from;
    }
    template <typename Word>
    __device__ __forceinline__ static void store(Word* to, Word value)
    {
        *to = value;
    }
};

//! Streaming loads and stores (evict-first): host memory mapped into the device is touched once and should not
//! displace the L2's working set.
struct StreamingAccess : UnhintedChunks<StreamingAccess>
{
    __device__ __forceinline__ static int4 load(int4 const* from)
    {
        return __ldcs(from);
    }
    __device__ __forceinline__ static void store(int4* to, int4 value)
    {
        __stcs(to, value);
    }
};

//! L2-only loads and stores (cache global) of the page copy and fill, with the page copy's optional L2 hints.
//!
//! With `keepSources`, a whole chunk's sources are read at L2 priority evict_last and set back to normal once the
//! stores are issued. While a large copy runs, the L2 then evicts written (dirty) lines ahead of read-once source
//! lines, so writes reach memory nearly in the order they were made (docs/benchmarks.md has the measurements).
//! Setting the priority back leaves no evict_last lines to crowd later kernels' data out of the L2. Each line the
//! chunk read is set back by the thread that read its first bytes in this chunk, so a line shared with a neighbouring
//! chunk is set back by both, each after its own read: whichever comes last leaves it normal. Chunks that are not
//! whole take no hints.
struct CacheGlobalAccess
{
    bool keepSources;

    __device__ __forceinline__ static int4 load(int4 const* from)
    {
        return __ldcg(from);
    }
    __device__ __forceinline__ static void store(int4* to, int4 value)
    {
        __stcg(to, value);
    }
    template <typename Shape>
    __device__ __forceinline__ void loadChunk(int4 const* from, int4 (&staged)[Shape::kVECTORS]) const
    {
        if (keepSources)
        {
            uint64_t const keep = evictLastPolicy();
#pragma unroll
            for (int32_t k = 0; k < Shape::kVECTORS; ++k)
            {
                staged[k] = loadWithPolicy(from + k * Shape::kTHREADS, keep);
            }
        }
        else
        {
            stageChunk<Shape, CacheGlobalAccess>(from, staged);
        }
    }
    template <typename Shape>
    __device__ __forceinline__ void afterChunk(int4 const* from, int32_t thread) const
    {
        if (keepSources)
        {
#pragma unroll
            for (int32_t k = 0; k < Shape::kVECTORS; ++k)
            {
                bool const startsLine = reinterpret_cast<uintptr_t>(from + k * Shape::kTHREADS) % kL2_LINE_BYTES == 0;
                bool const startsChunk = k == 0 && thread == 0;
                if (startsLine || startsChunk)
                {
                    releaseL2Line(from + k * Shape::kTHREADS);
                }
            }
        }
    }
};

//! Moves words [first, count) of `from` to `to` in steps of `stride` words, one load and one store a word.
template <typename Access, typename Word>
__device__ __forceinline__ void moveWords(Word const* from, Word* to, int64_t first, int64_t count, int64_t stride)
{
    for (int64_t i = first; i < count; i += stride)
    {
        Access::store(to + i, Access::load(from + i));
    }
}

//! Moves one chunk of `bytes` bytes with Shape::kTHREADS threads (a block, or a warp), of which this is `thread`.
//! `vectorised`: source and destination are 16-byte aligned and so is `bytes`. A whole chunk (Shape::kCHUNK_BYTES)
//! has every thread issue all its loads before its first store; a shorter one moves vectors, or bytes when not
//! vectorised.
template <typename Shape, typename Access>
__device__ void moveChunk(char const* __restrict__ src, char* __restrict__ dst, int64_t bytes, bool vectorised,
    Access const& access, int32_t thread)
{
    constexpr int32_t THREADS = Shape::kTHREADS;
    if (vectorised && bytes == Shape::kCHUNK_BYTES)
    {
        auto const* from = reinterpret_cast<int4 const*>(src) + thread;
        auto* to = reinterpret_cast<int4*>(dst) + thread;
        int4 staged[Shape::kVECTORS];
        access.template loadChunk<Shape>(from, staged);
#pragma unroll
        for (int32_t k = 0; k < Shape::kVECTORS; ++k)
        {
            Access::store(to + k * THREADS, staged[k]);
        }
        access.template afterChunk<Shape>(from, thread);
    }
    else if (vectorised)
    {
        moveWords<Access>(
            reinterpret_cast<int4 const*>(src), reinterpret_cast<int4*>(dst), thread, bytes / kVECTOR_BYTES, THREADS);
    }
    else
    {
        moveWords<PlainAccess>(src, dst, thread, bytes, THREADS);
    }
}

//! Fills one chunk that starts `offset` bytes into its page with the 4-byte `pattern` (byte b of the page gets byte
//! b % 4 of the pattern), storing through Access; `thread` is this thread's index among Shape::kTHREADS.
template <typename Shape, typename Access>
__device__ void fillChunk(char* dst, int64_t offset, int64_t bytes, bool vectorised, uint32_t pattern, int32_t thread)
{
    constexpr int32_t THREADS = Shape::kTHREADS;
    if (vectorised)
    {
        auto const word = static_cast<int>(pattern);
        int4 const value = make_int4(word, word, word, word);
        auto* to = reinterpret_cast<int4*>(dst);
        for (int64_t i = thread; i < bytes / kVECTOR_BYTES; i += THREADS)
        {
            Access::store(to + i, value);
        }
    }
    else
    {
        for (int64_t i = thread; i < bytes; i += THREADS)
        {
            dst[i] = static_cast<char>(pattern >> (8 * ((offset + i) % 4)));
        }
    }
}

} // namespace kvcache::rt::detail
