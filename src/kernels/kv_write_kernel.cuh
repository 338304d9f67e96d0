#pragma once

// The token kernel: moves whole tokens between a strided [capacity, H, D] tensor and one layer's pages, converting
// element types on the way. Threads x of a block walk one token's (head, chunk) pairs, threads y take tokens; a chunk
// is 16 bytes of the cache's type when the plan allows vectors, else one element.

#include "kernels/cache_hints.cuh"
#include "memory/token_address.h"

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
__device__ __forceinline__ void splitTokenAddress(int64_t address, int32_t tokensPerPage, int32_t& page, int32_t& offset)
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

//! Moves tokens between the tensors (TensorT elements) and the pages (CacheT elements), kVECTOR elements a thread
//! access; kWRITE moves tensor -> pages. A thread takes kUNROLL tokens a pass, gridDim.x * blockDim.y apart, and
//! issues all their loads before any store: a token is a few kilobytes, so one token a thread leaves too few bytes in
//! flight to fill HBM. Grid-strided over passes, so any grid covers any capacity.
template <typename TensorT, typename CacheT, int32_t kVECTOR, int32_t kUNROLL, bool kWRITE, typename Source>
__global__ void __launch_bounds__(256) tokenKernel(TokenKernelParams params, Source source)
{
    using From = std::conditional_t<kWRITE, TensorT, CacheT>;
    using To = std::conditional_t<kWRITE, CacheT, TensorT>;
    using FromChunk = ElementChunk<From, kVECTOR>;
    using ToChunk = ElementChunk<To, kVECTOR>;
    constexpr int32_t kHALVES = 2; // K, then V
    int32_t const count =
        params.count == nullptr ? params.capacity : min(max(loadWord(params.count), 0), params.capacity);
    int64_t const tokensPerGrid = int64_t{gridDim.x} * blockDim.y;
    TensorT* const tensors[kHALVES] = {static_cast<TensorT*>(params.k.data), static_cast<TensorT*>(params.v.data)};
    TokenTensorRef const refs[kHALVES] = {params.k, params.v};
    // A latent layer has no V (its tensor is null too).
    int32_t const halves = params.v.data != nullptr ? kHALVES : 1;
    for (int64_t first = int64_t{blockIdx.x} * blockDim.y + threadIdx.y; first < count;
         first += tokensPerGrid * kUNROLL)
    {
        int64_t token[kUNROLL];
        int32_t page[kUNROLL];
        int32_t offset[kUNROLL];
#pragma unroll
        for (int32_t u = 0; u < kUNROLL; ++u)
        {
            token[u] = first + u * tokensPerGrid;
            int64_t const address =
                token[u] < count ? source.address(static_cast<int32_t>(token[u]), params.layer) : kSKIPPED_TOKEN;
            if (address == kBAD_TOKEN && threadIdx.x == 0 && params.errorCount != nullptr)
            {
                atomicAdd(params.errorCount, 1);
            }
            splitTokenAddress(address, params.layer.tokensPerPage, page[u], offset[u]);
        }
        for (int32_t c = static_cast<int32_t>(threadIdx.x); c < params.chunksPerToken; c += blockDim.x)
        {
            int32_t const head = c / params.chunksPerHead;
            int32_t const dim = (c - head * params.chunksPerHead) * kVECTOR;
            From const* from[kHALVES][kUNROLL];
            To* to[kHALVES][kUNROLL];
#pragma unroll
            for (int32_t u = 0; u < kUNROLL; ++u)
            {
#pragma unroll
                for (int32_t half = 0; half < kHALVES; ++half)
                {
                    CacheT* const inPage = page[u] < 0 ? nullptr
                        : half == 0                    ? params.layer.k<CacheT>(page[u], offset[u], head) + dim
                                                       : params.layer.v<CacheT>(page[u], offset[u], head) + dim;
                    TensorT* const inTensor = tensors[half] + token[u] * refs[half].tokenStride
                        + int64_t{head} * refs[half].headStride + dim;
                    if constexpr (kWRITE)
                    {
                        from[half][u] = inTensor;
                        to[half][u] = inPage;
                    }
                    else
                    {
                        from[half][u] = inPage;
                        to[half][u] = inTensor;
                    }
                }
            }
            FromChunk loaded[kHALVES][kUNROLL];
#pragma unroll
            for (int32_t half = 0; half < kHALVES; ++half)
            {
#pragma unroll
                for (int32_t u = 0; u < kUNROLL; ++u)
                {
                    if (half < halves && page[u] >= 0)
                    {
                        loaded[half][u] = *reinterpret_cast<FromChunk const*>(from[half][u]);
                    }
                }
            }
#pragma unroll
            for (int32_t half = 0; half < kHALVES; ++half)
            {
#pragma unroll
                for (int32_t u = 0; u < kUNROLL; ++u)
                {
                    if (half < halves && page[u] >= 0)
                    {
                        *reinterpret_cast<ToChunk*>(to[half][u]) = convertChunk<To>(loaded[half][u]);
                    }
                }
            }
        }
    }
}

} // namespace kvcache::rt::detail
