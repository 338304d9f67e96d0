#pragma once

// The token kernel: moves whole tokens between a strided [capacity, H, D] tensor and one layer's pages, converting
// element types on the way. Threads x of a block walk one token's (head, chunk) pairs, threads y take tokens; a chunk
// is 16 bytes of the cache's type when the plan allows vectors, else one element.

#include "device/cache_hints.cuh"
#include "memory/kv_write/token_address.h"

#include "kvcache/memory/kv_write.h"
#include "kvcache/memory/layer_ref.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

namespace kvcache::rt::detail
{

//! One side of a move that is a strided tensor: element (t, h, d) at data[t * tokenStride + h * headStride + d].
struct TokenTensorRef
{
    void* data;
    int64_t tokenStride;
    int64_t headStride;
};

//! What every token kernel needs besides the way it resolves a token's address.
struct TokenKernelParams
{
    LayerRef layer;
    TokenTensorRef k;
    TokenTensorRef v; //!< data null for a latent layer
    int32_t capacity;
    int32_t const* count;
    int32_t* errorCount;
    int32_t chunksPerHead;
    int32_t chunksPerToken;
};

//! Token i's address from a device list of token addresses.
struct AddressListSource
{
    int64_t const* addresses;

    __device__ int64_t address(int32_t i, LayerRef const& layer) const
    {
        return checkTokenAddress(addresses[i], layer.numPages, layer.tokensPerPage);
    }
};

//! Token i's address from its (sequence, position) pair in a CSR page table.
struct TableSource
{
    TableRef table;
    TokenPosition const* positions;

    __device__ int64_t address(int32_t i, LayerRef const& layer) const
    {
        TokenPosition const token = positions[i];
        return tableTokenAddress(table, token.sequence, token.position, layer.numPages, layer.tokensPerPage);
    }
};

__device__ __forceinline__ float toFloat(float value)
{
    return value;
}
__device__ __forceinline__ float toFloat(__half value)
{
    return __half2float(value);
}
__device__ __forceinline__ float toFloat(__nv_bfloat16 value)
{
    return __bfloat162float(value);
}

template <typename To>
__device__ __forceinline__ To fromFloat(float value)
{
    if constexpr (std::is_same_v<To, __half>)
    {
        return __float2half_rn(value);
    }
    else if constexpr (std::is_same_v<To, __nv_bfloat16>)
    {
        return __float2bfloat16_rn(value);
    }
    else
    {
        return value;
    }
}

//! Converts one element, rounding to nearest even; the same type is copied bit for bit (NaN payloads included). Every
//! source type widens to float exactly, so a conversion rounds once.
template <typename To, typename From>
__device__ __forceinline__ To convertElement(From value)
{
    if constexpr (std::is_same_v<To, From>)
    {
        return value;
    }
    else
    {
        return fromFloat<To>(toFloat(value));
    }
}

//! N elements of T moved as one access: 8 bytes or one or two 16-byte vectors.
template <typename T, int32_t N>
struct alignas(sizeof(T) * N > 16 ? 16 : sizeof(T) * N) ElementChunk
{
    T values[N];
};

//! Converts a chunk of N elements, rounding each once.
template <typename To, typename From, int32_t N>
__device__ __forceinline__ ElementChunk<To, N> convertChunk(ElementChunk<From, N> const& from)
{
    if constexpr (std::is_same_v<To, From>)
    {
        return from;
    }
    else
    {
        ElementChunk<To, N> to;
#pragma unroll
        for (int32_t e = 0; e < N; ++e)
        {
            to.values[e] = convertElement<To>(from.values[e]);
        }
        return to;
    }
}

//! Splits a resolved token address into its page and offset; page -1 for a token that is not moved. The 32-bit
//! division when the address fits (every cache under 2^31 tokens a layer) is several times cheaper than the 64-bit one.
__device__ __forceinline__ void splitTokenAddress(
    int64_t address, int32_t tokensPerPage, int32_t& page, int32_t& offset)
{
    if (address < 0)
    {
        page = -1;
        offset = 0;
    }
    else if (address <= INT32_MAX)
    {
        auto const fits = static_cast<uint32_t>(address);
        auto const divisor = static_cast<uint32_t>(tokensPerPage);
        page = static_cast<int32_t>(fits / divisor);
        offset = static_cast<int32_t>(fits - static_cast<uint32_t>(page) * divisor);
    }
    else
    {
        page = static_cast<int32_t>(address / tokensPerPage);
        offset = static_cast<int32_t>(address - int64_t{page} * tokensPerPage);
    }
}

//! Reads a chunk once with the evict-first hint (ld.global.cs): each byte a token move reads is read once, so it
//! should not push out the lines being written (docs/benchmarks.md, "Token write").
template <typename Chunk>
__device__ __forceinline__ Chunk loadOnce(Chunk const* from)
{
    Chunk chunk;
    if constexpr (sizeof(Chunk) % 16 == 0)
    {
        auto const* words = reinterpret_cast<int4 const*>(from);
#pragma unroll
        for (size_t i = 0; i < sizeof(Chunk) / 16; ++i)
        {
            reinterpret_cast<int4*>(&chunk)[i] = __ldcs(words + i);
        }
    }
    else if constexpr (sizeof(Chunk) == 8)
    {
        *reinterpret_cast<int2*>(&chunk) = __ldcs(reinterpret_cast<int2 const*>(from));
    }
    else if constexpr (sizeof(Chunk) == 4)
    {
        *reinterpret_cast<int32_t*>(&chunk) = __ldcs(reinterpret_cast<int32_t const*>(from));
    }
    else
    {
        static_assert(sizeof(Chunk) == 2, "token chunks are 2, 4, 8 or a multiple of 16 bytes");
        *reinterpret_cast<uint16_t*>(&chunk) = __ldcs(reinterpret_cast<unsigned short const*>(from));
    }
    return chunk;
}

//! The end of a move that is read: the tensor when writing the cache, the page when reading it.
template <bool kWRITE, typename TensorT, typename CacheT>
__device__ __forceinline__ auto* readEnd(TensorT* tensor, CacheT* page)
{
    if constexpr (kWRITE)
    {
        return tensor;
    }
    else
    {
        return page;
    }
}

//! The end of a move that is written.
template <bool kWRITE, typename TensorT, typename CacheT>
__device__ __forceinline__ auto* writeEnd(TensorT* tensor, CacheT* page)
{
    return readEnd<!kWRITE>(tensor, page);
}

//! Moves tokens between the tensors (TensorT elements) and the pages (CacheT elements), kVECTOR elements a thread
//! access; kWRITE moves tensor -> pages. A thread issues its K and V loads before either store (several tokens a
//! thread, for more bytes in flight, measured slower). Grid-strided over tokens, so any grid covers any capacity.
template <typename TensorT, typename CacheT, int32_t kVECTOR, bool kWRITE, typename Source>
__global__ void __launch_bounds__(256) tokenKernel(TokenKernelParams params, Source source)
{
    using From = std::conditional_t<kWRITE, TensorT, CacheT>;
    using To = std::conditional_t<kWRITE, CacheT, TensorT>;
    using FromChunk = ElementChunk<From, kVECTOR>;
    using ToChunk = ElementChunk<To, kVECTOR>;
    int32_t const count =
        params.count == nullptr ? params.capacity : min(max(loadWord(params.count), 0), params.capacity);
    int64_t const tokensPerGrid = int64_t{gridDim.x} * blockDim.y;
    auto* const kTensor = static_cast<TensorT*>(params.k.data);
    auto* const vTensor = static_cast<TensorT*>(params.v.data);
    for (int64_t t = int64_t{blockIdx.x} * blockDim.y + threadIdx.y; t < count; t += tokensPerGrid)
    {
        int64_t const address = source.address(static_cast<int32_t>(t), params.layer);
        if (address == kBAD_TOKEN && threadIdx.x == 0 && params.errorCount != nullptr)
        {
            atomicAdd(params.errorCount, 1);
        }
        int32_t page = 0;
        int32_t offset = 0;
        splitTokenAddress(address, params.layer.tokensPerPage, page, offset);
        if (page < 0)
        {
            continue;
        }
        for (int32_t c = static_cast<int32_t>(threadIdx.x); c < params.chunksPerToken; c += blockDim.x)
        {
            int32_t const head = c / params.chunksPerHead;
            int32_t const dim = (c - head * params.chunksPerHead) * kVECTOR;
            CacheT* const kPage = params.layer.k<CacheT>(page, offset, head) + dim;
            TensorT* const kRow = kTensor + t * params.k.tokenStride + int64_t{head} * params.k.headStride + dim;
            FromChunk const kChunk = loadOnce(reinterpret_cast<FromChunk const*>(readEnd<kWRITE>(kRow, kPage)));
            // A latent layer has no V (its tensor is null too).
            if (vTensor != nullptr)
            {
                CacheT* const vPage = params.layer.v<CacheT>(page, offset, head) + dim;
                TensorT* const vRow = vTensor + t * params.v.tokenStride + int64_t{head} * params.v.headStride + dim;
                FromChunk const vChunk = loadOnce(reinterpret_cast<FromChunk const*>(readEnd<kWRITE>(vRow, vPage)));
                *reinterpret_cast<ToChunk*>(writeEnd<kWRITE>(kRow, kPage)) = convertChunk<To>(kChunk);
                *reinterpret_cast<ToChunk*>(writeEnd<kWRITE>(vRow, vPage)) = convertChunk<To>(vChunk);
            }
            else
            {
                *reinterpret_cast<ToChunk*>(writeEnd<kWRITE>(kRow, kPage)) = convertChunk<To>(kChunk);
            }
        }
    }
}

} // namespace kvcache::rt::detail
