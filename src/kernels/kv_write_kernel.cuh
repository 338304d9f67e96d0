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

//! Moves one chunk of N elements from `from` to `to`, converting each.
template <typename To, typename From, int32_t N>
__device__ __forceinline__ void convertChunk(To* to, From const* from)
{
    using Source = ElementChunk<From, N>;
    using Target = ElementChunk<To, N>;
    Source const source = *reinterpret_cast<Source const*>(from);
    Target target;
#pragma unroll
    for (int32_t e = 0; e < N; ++e)
    {
        target.values[e] = convertElement<To>(source.values[e]);
    }
    *reinterpret_cast<Target*>(to) = target;
}

//! Moves one chunk between a page and a tensor, in the direction kWRITE says (tensor -> page when true).
template <bool kWRITE, int32_t kVECTOR, typename TensorT, typename CacheT>
__device__ __forceinline__ void moveBetween(CacheT* page, TensorT* tensor)
{
    if constexpr (kWRITE)
    {
        convertChunk<CacheT, TensorT, kVECTOR>(page, tensor);
    }
    else
    {
        convertChunk<TensorT, CacheT, kVECTOR>(tensor, page);
    }
}

//! Moves tokens between the tensors (TensorT elements) and the pages (CacheT elements), kVECTOR elements a thread
//! access; kWRITE moves tensor -> pages. Grid-strided over tokens, so any grid covers any capacity.
template <typename TensorT, typename CacheT, int32_t kVECTOR, bool kWRITE, typename Source>
__global__ void __launch_bounds__(256) tokenKernel(TokenKernelParams params, Source source)
{
    int32_t const count =
        params.count == nullptr ? params.capacity : min(max(loadWord(params.count), 0), params.capacity);
    int64_t const tokensPerGrid = int64_t{gridDim.x} * blockDim.y;
    auto* const kTensor = static_cast<TensorT*>(params.k.data);
    auto* const vTensor = static_cast<TensorT*>(params.v.data);
    for (int64_t t = int64_t{blockIdx.x} * blockDim.y + threadIdx.y; t < count; t += tokensPerGrid)
    {
        int64_t const address = source.address(static_cast<int32_t>(t), params.layer);
        if (address < 0)
        {
            if (address == kBAD_TOKEN && threadIdx.x == 0 && params.errorCount != nullptr)
            {
                atomicAdd(params.errorCount, 1);
            }
            continue;
        }
        auto const page = static_cast<int32_t>(address / params.layer.tokensPerPage);
        auto const offset = static_cast<int32_t>(address % params.layer.tokensPerPage);
        for (int32_t c = static_cast<int32_t>(threadIdx.x); c < params.chunksPerToken; c += blockDim.x)
        {
            int32_t const head = c / params.chunksPerHead;
            int32_t const dim = (c - head * params.chunksPerHead) * kVECTOR;
            moveBetween<kWRITE, kVECTOR>(params.layer.k<CacheT>(page, offset, head) + dim,
                kTensor + t * params.k.tokenStride + head * params.k.headStride + dim);
            // A latent layer has no V (its tensor is null too).
            if (vTensor != nullptr)
            {
                moveBetween<kWRITE, kVECTOR>(params.layer.v<CacheT>(page, offset, head) + dim,
                    vTensor + t * params.v.tokenStride + head * params.v.headStride + dim);
            }
        }
    }
}

} // namespace kvcache::rt::detail
