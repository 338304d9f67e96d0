#pragma once

#include "kvcache/core/tensor.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvcache::rt
{

//! What the quantizing write saw of one layer, per half (docs/layout.md, "Calibration"): device memory the caller owns
//! and zeroes (cudaMemsetAsync) before the writes it should cover, read on a later step without a sync. A latent
//! layer's V counters stay as they were.
struct WriteCounters
{
    //! The largest finite |value| given to the writes for K, 0 before any: raised with atomicMax on the bits of the
    //! float (a non-negative float's bits order as its value). NaN and infinities are left out, as a head's amax does.
    float kAmax = 0.0F;
    //! The same for V.
    float vAmax = 0.0F;
    //! K values the encoding clipped: finite or infinite values whose scaled magnitude lies past the largest code's
    //! rounding interval (E4M3: |x / s| > 464, which rounds to 448 below; E2M1: |x / d| >= 7, which rounds to 6 below),
    //! with s or d the decode scale the rules divide by. NaN never counts; a zero divisor counts only infinities.
    unsigned long long kSaturated = 0;
    //! The same for V.
    unsigned long long vSaturated = 0;
};

static_assert(sizeof(WriteCounters) == 24, "WriteCounters is read as two floats and two 64-bit counts");

//! The optional parts of a token write or read: a device-side token count, a device error counter, the page group
//! the caller's page ids belong to and the write's counters.
struct TokenOpOptions
{
    //! Device int32: the tokens to move, read by the kernel (clamped to [0, capacity], capacity being the tensors'
    //! first extent), so a captured graph replays with whatever it holds then; nullptr moves all `capacity`.
    int32_t const* deviceCount = nullptr;
    //! Device int32 to which the kernel adds one for each token whose destination lies outside the layer's pages (that
    //! token is neither written nor read); nullptr counts nothing.
    int32_t* deviceErrorCount = nullptr;
    //! The page group the caller's page ids belong to; -1 skips the check, any other value must be the layer's group.
    int32_t group = -1;
    //! Device counters of the written layer (8-byte aligned), raised by a write into a quantized cache (writeTokens,
    //! either form) with the amax of the values it is given and the values that saturated; nullptr records nothing and
    //! costs nothing. Only tokens that are written count. A read, or a cache that is not quantized, refuses them.
    WriteCounters* deviceCounters = nullptr;
};

//! One token of a sequence in a page table: the table's row and the token's absolute position in the sequence.
struct TokenPosition
{
    //! The table row; a negative value skips the token (padding).
    int32_t sequence;
    //! The absolute token position in the sequence.
    int32_t position;
};

//! One page group's CSR page table in device memory, as PageTableBuffers builds it: row s holds pages
//! indices[indptr[s] .. indptr[s + 1]), which hold the sequence's tokens from firstToken[s] on, tokensPerPage a page.
struct DevicePageTable
{
    int32_t const* indptr = nullptr;     //!< numSequences + 1 row starts
    int32_t const* indices = nullptr;    //!< page ids of the group
    int32_t const* firstToken = nullptr; //!< numSequences first positions, multiples of tokensPerPage; nullptr: all 0
    int32_t numSequences = 0;            //!< rows of the table
};

//! Writes `capacity` new tokens of layer `layerIdx` into its pages, in one launch on `stream`; never synchronises or
//! allocates, so the call may be captured in a CUDA graph.
//!
//! `k` and `v` are device tensors [capacity, numKVHeads, headDim] of float32, float16 or bfloat16 (one type for both),
//! any non-negative token and head strides, the last dimension contiguous; values are converted to the cache's type
//! (round to nearest even). A latent layer takes K alone: `v` must then be an empty Tensor (null data). Token i goes to
//! the token address `deviceTokenAddresses[i]` (page * tokensPerPage + offset, int64, device memory, `capacity`
//! entries): a negative address skips the token, an address past the layer group's pages is counted into
//! options.deviceErrorCount and not written. Two tokens with one address leave either. The tensors must not overlap
//! the pool.
//!
//! A quantized cache (KVCacheConfig::quantization) stores the values quantized by docs/layout.md's "Quantization
//! rules", bit for bit as tests/support/quantize_reference.h does: FP8 per tensor with the layer's host-held scales,
//! FP8 per token and head with a scale per (page, token, head) written beside, NVFP4 with block scales and the layer's
//! global scales; its head dimensions must be multiples of 16 and at most 1024. A warp quantizes a token's heads, a
//! group of neighbouring lanes a head.
//!
//! Throws before launching anything: OutOfRangeError for a layer outside [0, numLayers()), InvalidArgumentError for an
//! 8-bit cache without quantization, a quantized head not a multiple of 16 or above 1024, a wrong shape, type, device,
//! stride or group, a null tensor or list with capacity > 0, or a V tensor given to a latent layer (or missing for a KV
//! layer), naming the field, the value and the limit; CudaError when the launch fails. Zero capacity is a no-op.
void writeTokens(KVCacheManager const& cache, int32_t layerIdx, Tensor const& k, Tensor const& v,
    int64_t const* deviceTokenAddresses, cudaStream_t stream, TokenOpOptions const& options = {});

//! Writes tokens as writeTokens above, each placed by its (sequence, position) pair in `table`, the CSR page table of
//! the layer's group (`devicePositions` holds `capacity` pairs). A position before the row's first token, past its
//! pages, a row outside [0, numSequences) or a page id outside the group's pages is counted into
//! options.deviceErrorCount and not written. Throws as writeTokens does, and InvalidArgumentError for a null indptr or
//! indices, a negative numSequences, or a null list with capacity > 0.
void writeTokens(KVCacheManager const& cache, int32_t layerIdx, Tensor const& k, Tensor const& v,
    DevicePageTable const& table, TokenPosition const* devicePositions, cudaStream_t stream,
    TokenOpOptions const& options = {});

//! Gathers `capacity` tokens of layer `layerIdx` from its pages into `k` and `v` (contiguous device tensors
//! [capacity, numKVHeads, headDim] of float32, float16 or bfloat16; `v` empty for a latent layer), converting from the
//! cache's type (dequantizing a quantized cache's values: code times scale), in one launch on `stream`; the inverse of
//! writeTokens with the same address, count, error and
//! validation rules (an output row whose address is negative or bad is left as it was). Never synchronises or
//! allocates. Throws as writeTokens does, and InvalidArgumentError for a non-contiguous output.
void readTokens(KVCacheManager const& cache, int32_t layerIdx, Tensor const& k, Tensor const& v,
    int64_t const* deviceTokenAddresses, cudaStream_t stream, TokenOpOptions const& options = {});

//! Returns the host-held scales that docs/layout.md's calibration gives for the observed amax of K and V in
//! `quantization`: amax / 448 (kFP8_PER_TENSOR, so the largest value lands on E4M3's largest code) or amax / (448 * 6)
//! (kNVFP4 global scales, so the largest block scale lands on 448), in float32. `hasV` false (a latent layer) leaves v
//! at 1 and vAmax unchecked. Throws InvalidArgumentError, naming the quantization, unless it keeps host scales
//! (kFP8_PER_TENSOR, kNVFP4), and naming the field and its value for an amax that is not finite or not > 0 (0: nothing
//! was observed, and a zero scale would store every value as zero) or a scale that underflows to 0.
LayerScales calibratedScales(KVQuantization quantization, float kAmax, float vAmax, bool hasV = true);

//! Sets layer `layerIdx`'s host-held scales from `observed` (a host copy of its WriteCounters) by calibratedScales; a
//! latent layer's v is kept. Throws OutOfRangeError for a bad index and as calibratedScales does; a throw changes
//! nothing.
void calibrateLayerScales(KVCacheManager& cache, int32_t layerIdx, WriteCounters const& observed);

} // namespace kvcache::rt
