#pragma once

#include "kvcache/core/host_device.h"

#include <cstdint>
#include <type_traits>

namespace kvcache::rt
{

//! One layer's K and V pools as a kernel addresses them, passed by value: pool element (page, token, head, dim) of K
//! is kPool[page * pageStride + token * tokenStride + head * headStride + dim], and the same at vPool for V. Obtained
//! from KVCacheManager::layerRef; valid while the manager lives. Accessors do not check their arguments.
//!
//! Elements are stored elements: for an NVFP4 cache a byte holds two values, so a head is headDim / 2 elements
//! (headStride) while headDim stays the values. A cache with scale pools (docs/layout.md, "Quantized pages") also has
//! scale (page, token, head, i) of K at kScalePool + scaleOffset(page, token, head) + i, in scale elements of
//! scaleElementBytes bytes (float32 per token-head, FP8 E4M3 block scales for NVFP4), the same at vScalePool for V.
struct LayerRef
{
    void* kPool = nullptr;    //!< start of the K pool, [numPages, tokensPerPage, numKVHeads, headDim]
    void* vPool = nullptr;    //!< start of the V pool, same shape
    int64_t pageStride = 0;   //!< elements from one page to the next: tokensPerPage * numKVHeads * headDim
    int64_t tokenStride = 0;  //!< elements from one token to the next within a page: numKVHeads * headDim
    int64_t headStride = 0;   //!< elements from one head to the next: headDim
    int32_t elementBytes = 0; //!< bytes of one element
    int32_t numPages = 0;     //!< pages of each pool
    int32_t tokensPerPage = 0;
    int32_t numKVHeads = 0;
    int32_t headDim = 0;           //!< values of one head (stored elements: headStride)
    void* kScalePool = nullptr;    //!< K scales [numPages, tokensPerPage, numKVHeads, scalesPerHead]; null without
    void* vScalePool = nullptr;    //!< V scales, same shape; null without, and for a latent layer
    int32_t scalesPerHead = 0;     //!< 1 (kFP8_PER_TOKEN_HEAD), headDim / 16 (kNVFP4), 0 without scale pools
    int32_t scaleElementBytes = 0; //!< 4 (float32), 1 (FP8 E4M3), 0 without scale pools

    //! Returns the element offset of (page, token, head, 0) from the start of either pool.
    KVCACHE_HOST_DEVICE int64_t offset(int32_t page, int32_t token, int32_t head) const noexcept
    {
        return int64_t{page} * pageStride + int64_t{token} * tokenStride + int64_t{head} * headStride;
    }
    //! Returns the K elements of (page, token, head) as `T*` (headDim of them); sizeof(T) must be elementBytes.
    template <typename T>
    KVCACHE_HOST_DEVICE T* k(int32_t page, int32_t token, int32_t head) const noexcept
    {
        return static_cast<T*>(kPool) + offset(page, token, head);
    }
    //! Returns the V elements of (page, token, head) as `T*` (headDim of them); sizeof(T) must be elementBytes.
    template <typename T>
    KVCACHE_HOST_DEVICE T* v(int32_t page, int32_t token, int32_t head) const noexcept
    {
        return static_cast<T*>(vPool) + offset(page, token, head);
    }
    //! Returns the scale-element offset of (page, token, head, 0) from the start of either scale pool.
    KVCACHE_HOST_DEVICE int64_t scaleOffset(int32_t page, int32_t token, int32_t head) const noexcept
    {
        return ((int64_t{page} * tokensPerPage + token) * numKVHeads + head) * scalesPerHead;
    }
    //! Returns the address of K's (page, token, head), for any element type.
    KVCACHE_HOST_DEVICE void* kAddress(int32_t page, int32_t token, int32_t head) const noexcept
    {
        return static_cast<char*>(kPool) + offset(page, token, head) * elementBytes;
    }
    //! Returns the address of V's (page, token, head), for any element type.
    KVCACHE_HOST_DEVICE void* vAddress(int32_t page, int32_t token, int32_t head) const noexcept
    {
        return static_cast<char*>(vPool) + offset(page, token, head) * elementBytes;
    }
};

static_assert(std::is_trivially_copyable_v<LayerRef>, "LayerRef travels to kernels by value");

} // namespace kvcache::rt
