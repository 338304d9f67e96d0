#pragma once

// Host planning of a token write or read: every argument check, then the kernel's vector width and launch shape. No
// CUDA calls, so host tests check every refusal without a GPU.

#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/kv_write.h"

#include <cstdint>

namespace kvcache::rt::detail
{

//! Which way tokens move: from the tensors into the pages, or back.
enum class TokenDirection : int32_t
{
    kWRITE = 0,
    kREAD = 1,
};

//! Bytes one thread moves on the cache side when the shapes and strides allow it (one 16-byte vector).
inline constexpr int32_t kTOKEN_VECTOR_BYTES = 16;
//! Threads of one block of the token kernel.
inline constexpr int32_t kTOKEN_BLOCK_THREADS = 256;
//! Warps of one block of the quantizing kernel, each a token at a time.
inline constexpr int32_t kQUANT_WARPS_PER_BLOCK = 8;
//! The quantizing kernel's grid y (groups of a token's heads): CUDA's limit.
inline constexpr int32_t kMAX_QUANT_GRID_Y = 65535;
//! A quantized cache's tokens are moved for head dimensions that are multiples of this (whole NVFP4 blocks).
inline constexpr int32_t kQUANT_HEAD_DIM_MULTIPLE = 16;
//! The most values a lane of the quantizing kernel takes (its largest instantiation), so a head it moves has at most
//! 32 times as many.
inline constexpr int32_t kMAX_QUANT_VALUES_PER_LANE = 32;

//! What the token kernel is launched with, decided on the host.
struct TokenOpPlan
{
    int32_t capacity = 0; //!< tokens the tensors hold (their first extent): the grid covers them all
    DataType tensorType = DataType::kFLOAT;
    DataType cacheType = DataType::kFLOAT;
    bool hasV = false;         //!< false for a latent layer
    int32_t vectorElems = 1;   //!< elements a thread moves at once: 16 bytes of the cache's type, or 1
    int32_t chunksPerHead = 0; //!< headDim / vectorElems
    int32_t chunksPerToken = 0;
    int32_t blockX = 0; //!< threads over one token's chunks
    int32_t blockY = 0; //!< tokens a block moves at once
    int64_t gridX = 0;  //!< blocks: capacity / blockY rounded up
    //! A quantized cache's format (the quantizing kernel: a head 2^laneShift lanes of valuesPerLane values, a warp a
    //! token and 32 >> laneShift of its heads), or kNONE (the token kernel above).
    KVQuantization quantization = KVQuantization::kNONE;
    //! A power of two in [8, 32]: 32 bytes of the tensors' type, or more where 32 lanes would not cover the head.
    int32_t valuesPerLane = 0;
    int32_t laneShift = 0;     //!< log2 of the lanes a head takes: the fewest that cover headDim, up to 32
    int32_t gridY = 1;         //!< groups of 32 >> laneShift heads
    bool quantVectors = false; //!< the tensors allow loads (stores when reading) of valuesPerLane elements at once
    bool codeVectors = false; //!< a lane's codes (valuesPerLane bytes, or half as many for NVFP4) can be stored at once
};

//! Checks the layer, the cache's type, the group and both tensors of a token operation on the cache of `layout`, and
//! returns its plan; throws OutOfRangeError for a bad layer index and InvalidArgumentError for anything else, naming
//! `what`, the field, its value and the limit.
TokenOpPlan planTokenOp(char const* what, KVCacheLayout const& layout, int32_t layerIdx, Tensor const& k,
    Tensor const& v, TokenOpOptions const& options, TokenDirection direction);

//! Throws InvalidArgumentError naming `what` and `field` when `list` is null and `capacity` is positive.
void validateTokenList(char const* what, char const* field, void const* list, int32_t capacity);

//! Throws InvalidArgumentError naming `what` for a table with a null indptr or indices or a negative numSequences.
void validatePageTable(char const* what, DevicePageTable const& table);

} // namespace kvcache::rt::detail
