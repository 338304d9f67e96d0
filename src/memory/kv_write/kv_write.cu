// The public token write and read: validate and plan on the host, then one launch of the token kernel.

#include "kvcache/memory/kv_write.h"

#include "memory/kv_write/kv_write_kernel.cuh"
#include "memory/kv_write/quant/kv_write_quant.h"
#include "memory/kv_write/token_op_plan.h"

#include "kvcache/core/errors.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace kvcache::rt
{
namespace detail
{
namespace
{

TokenTensorRef tensorRef(Tensor const& tensor) noexcept
{
    if (tensor.getShape().getNumDims() != 3)
    {
        return TokenTensorRef{nullptr, 0, 0};
    }
    return TokenTensorRef{tensor.rawPointer(), tensor.getStride()[0], tensor.getStride()[1]};
}

template <typename TensorT, typename CacheT, int32_t kVECTOR, bool kWRITE, typename Source>
void launchShaped(TokenOpPlan const& plan, TokenKernelParams const& params, Source const& source, cudaStream_t stream)
{
    dim3 const block(static_cast<uint32_t>(plan.blockX), static_cast<uint32_t>(plan.blockY));
    dim3 const grid(static_cast<uint32_t>(plan.gridX));
    tokenKernel<TensorT, CacheT, kVECTOR, kWRITE><<<grid, block, 0, stream>>>(params, source);
    KVCACHE_CUDA_TRY(cudaGetLastError());
}

template <typename TensorT, typename CacheT, bool kWRITE, typename Source>
void launchVectorOrNot(
    TokenOpPlan const& plan, TokenKernelParams const& params, Source const& source, cudaStream_t stream)
{
    constexpr int32_t kVECTOR = kTOKEN_VECTOR_BYTES / static_cast<int32_t>(sizeof(CacheT));
    if (plan.vectorElems == kVECTOR)
    {
        launchShaped<TensorT, CacheT, kVECTOR, kWRITE>(plan, params, source, stream);
    }
    else
    {
        launchShaped<TensorT, CacheT, 1, kWRITE>(plan, params, source, stream);
    }
}

template <typename TensorT, bool kWRITE, typename Source>
void launchForCache(TokenOpPlan const& plan, TokenKernelParams const& params, Source const& source, cudaStream_t stream)
{
    switch (plan.cacheType)
    {
    case DataType::kFLOAT: launchVectorOrNot<TensorT, float, kWRITE>(plan, params, source, stream); return;
    case DataType::kHALF: launchVectorOrNot<TensorT, __half, kWRITE>(plan, params, source, stream); return;
    case DataType::kBF16: launchVectorOrNot<TensorT, __nv_bfloat16, kWRITE>(plan, params, source, stream); return;
    default: return; // planTokenOp refused every other type
    }
}

template <bool kWRITE, typename Source>
void launchTokens(TokenOpPlan const& plan, KVCacheManager const& cache, int32_t layerIdx, Tensor const& k,
    Tensor const& v, Source const& source, TokenOpOptions const& options, cudaStream_t stream)
{
    if (plan.capacity == 0)
    {
        return;
    }
    TokenKernelParams const params{cache.layerRef(layerIdx), tensorRef(k), plan.hasV ? tensorRef(v) : TokenTensorRef{},
        plan.capacity, options.deviceCount, options.deviceErrorCount, plan.chunksPerHead, plan.chunksPerToken};
    if (plan.quantization != KVQuantization::kNONE)
    {
        LayerScales const scales =
            plan.quantization == KVQuantization::kFP8_PER_TOKEN_HEAD ? LayerScales{} : cache.layerScales(layerIdx);
        if constexpr (std::is_same_v<Source, TableSource>)
        {
            launchQuantizedTokens(plan, params, scales, options.deviceCounters, source, stream);
        }
        else
        {
            launchQuantizedTokens<kWRITE>(plan, params, scales, options.deviceCounters, source, stream);
        }
        return;
    }
    switch (plan.tensorType)
    {
    case DataType::kFLOAT: launchForCache<float, kWRITE>(plan, params, source, stream); return;
    case DataType::kHALF: launchForCache<__half, kWRITE>(plan, params, source, stream); return;
    case DataType::kBF16: launchForCache<__nv_bfloat16, kWRITE>(plan, params, source, stream); return;
    default: return; // planTokenOp refused every other type
    }
}

//! Validates, plans and launches a write (kWRITE) or read of tokens placed by a device list of token addresses.
template <bool kWRITE>
void moveAddressedTokens(char const* what, KVCacheManager const& cache, int32_t layerIdx, Tensor const& k,
    Tensor const& v, int64_t const* deviceTokenAddresses, cudaStream_t stream, TokenOpOptions const& options)
{
    TokenOpPlan const plan = planTokenOp(
        what, cache.layout(), layerIdx, k, v, options, kWRITE ? TokenDirection::kWRITE : TokenDirection::kREAD);
    validateTokenList(what, "deviceTokenAddresses", deviceTokenAddresses, plan.capacity);
    launchTokens<kWRITE>(plan, cache, layerIdx, k, v, AddressListSource{deviceTokenAddresses}, options, stream);
}

} // namespace
} // namespace detail

void writeTokens(KVCacheManager const& cache, int32_t layerIdx, Tensor const& k, Tensor const& v,
    int64_t const* deviceTokenAddresses, cudaStream_t stream, TokenOpOptions const& options)
{
    detail::moveAddressedTokens<true>("writeTokens", cache, layerIdx, k, v, deviceTokenAddresses, stream, options);
}

void writeTokens(KVCacheManager const& cache, int32_t layerIdx, Tensor const& k, Tensor const& v,
    DevicePageTable const& table, TokenPosition const* devicePositions, cudaStream_t stream,
    TokenOpOptions const& options)
{
    constexpr char const* kWHAT = "writeTokens (page table)";
    detail::TokenOpPlan const plan =
        detail::planTokenOp(kWHAT, cache.layout(), layerIdx, k, v, options, detail::TokenDirection::kWRITE);
    detail::validatePageTable(kWHAT, table);
    detail::validateTokenList(kWHAT, "devicePositions", devicePositions, plan.capacity);
    detail::TableSource const source{
        detail::TableRef{table.indptr, table.indices, table.firstToken, table.numSequences}, devicePositions};
    detail::launchTokens<true>(plan, cache, layerIdx, k, v, source, options, stream);
}

void readTokens(KVCacheManager const& cache, int32_t layerIdx, Tensor const& k, Tensor const& v,
    int64_t const* deviceTokenAddresses, cudaStream_t stream, TokenOpOptions const& options)
{
    detail::moveAddressedTokens<false>("readTokens", cache, layerIdx, k, v, deviceTokenAddresses, stream, options);
}

} // namespace kvcache::rt
