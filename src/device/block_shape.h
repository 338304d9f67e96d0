#pragma once

// How a block of the page kernels, the host tier kernels and the page mover divides one chunk of a page: visible to
// host code, which sizes grids with it.

#include <cstdint>

namespace kvcache::rt::detail
{

//! Bytes each thread moves per load or store.
constexpr int64_t kVECTOR_BYTES = 16;
//! Threads of a warp.
constexpr int32_t kWARP_THREADS = 32;

//! A block of THREADS threads, each moving VECTORS 16-byte vectors of one chunk of a page.
template <int32_t THREADS, int32_t VECTORS>
struct BlockShape
{
    static constexpr int32_t kTHREADS = THREADS;
    static constexpr int32_t kVECTORS = VECTORS;
    static constexpr int64_t kCHUNK_BYTES = int64_t{THREADS} * VECTORS * kVECTOR_BYTES;
};

//! The shape of THREADS threads whose chunk is CHUNK_BYTES, every thread moving an equal share of whole vectors.
template <int32_t THREADS, int64_t CHUNK_BYTES>
using BlockShapeOfChunk = BlockShape<THREADS, static_cast<int32_t>(CHUNK_BYTES / (kVECTOR_BYTES * THREADS))>;

} // namespace kvcache::rt::detail
