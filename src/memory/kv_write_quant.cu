// The quantizing token kernel's launches: one instantiation per tensor type, format and values a lane.

#include "memory/kv_write_quant.h"

#include "kernels/kv_quant_kernel.cuh"

#include "kvcache/core/errors.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace kvcache::rt::detail
{
namespace
{

template <typename TensorT, KVQuantization kFORMAT, int32_t kV, bool kWRITE, typename Source>
void launchShaped(TokenOpPlan const& plan, QuantKernelParams const& params, Source const& source, cudaStream_t stream)
{
    dim3 const block(static_cast<uint32_t>(plan.blockX), static_cast<uint32_t>(plan.blockY));
    // The kernel strides over (token, head) pairs, so a grid capped at the hardware's limit covers any count.
    dim3 const grid(static_cast<uint32_t>(std::min<int64_t>(plan.gridX, INT32_MAX)));
    quantTokenKernel<TensorT, kFORMAT, kV, kWRITE><<<grid, block, 0, stream>>>(params, source);
    KVCACHE_CUDA_TRY(cudaGetLastError());
}

template <typename TensorT, KVQuantization kFORMAT, bool kWRITE, typename Source>
void launchPerLane(TokenOpPlan const& plan, QuantKernelParams const& params, Source const& source, cudaStream_t stream)
{
    switch (plan.valuesPerLane)
    {
    case 2: launchShaped<TensorT, kFORMAT, 2, kWRITE>(plan, params, source, stream); return;
    case 4: launchShaped<TensorT, kFORMAT, 4, kWRITE>(plan, params, source, stream); return;
    case 8: launchShaped<TensorT, kFORMAT, 8, kWRITE>(plan, params, source, stream); return;
    case 16: launchShaped<TensorT, kFORMAT, 16, kWRITE>(plan, params, source, stream); return;
    default: launchShaped<TensorT, kFORMAT, 32, kWRITE>(plan, params, source, stream); return;
    }
}

template <typename TensorT, bool kWRITE, typename Source>
void launchFormat(TokenOpPlan const& plan, QuantKernelParams const& params, Source const& source, cudaStream_t stream)
{
    switch (plan.quantization)
    {
    case KVQuantization::kFP8_PER_TENSOR:
        launchPerLane<TensorT, KVQuantization::kFP8_PER_TENSOR, kWRITE>(plan, params, source, stream);
        return;
    case KVQuantization::kFP8_PER_TOKEN_HEAD:
        launchPerLane<TensorT, KVQuantization::kFP8_PER_TOKEN_HEAD, kWRITE>(plan, params, source, stream);
        return;
    case KVQuantization::kNVFP4:
        launchPerLane<TensorT, KVQuantization::kNVFP4, kWRITE>(plan, params, source, stream);
        return;
    default: return; // planTokenOp plans no other format for this kernel
    }
}

template <bool kWRITE, typename Source>
void launchQuantized(TokenOpPlan const& plan, TokenKernelParams const& params, LayerScales scales, Source const& source,
    cudaStream_t stream)
{
    QuantKernelParams const quant{params, scales.k, scales.v, plan.quantVectors};
    switch (plan.tensorType)
    {
    case DataType::kFLOAT: launchFormat<float, kWRITE>(plan, quant, source, stream); return;
    case DataType::kHALF: launchFormat<__half, kWRITE>(plan, quant, source, stream); return;
    case DataType::kBF16: launchFormat<__nv_bfloat16, kWRITE>(plan, quant, source, stream); return;
    default: return; // planTokenOp refused every other type
    }
}

} // namespace

template <bool kWRITE>
void launchQuantizedTokens(TokenOpPlan const& plan, TokenKernelParams const& params, LayerScales scales,
    AddressListSource const& source, cudaStream_t stream)
{
    launchQuantized<kWRITE>(plan, params, scales, source, stream);
}

template void launchQuantizedTokens<true>(
    TokenOpPlan const&, TokenKernelParams const&, LayerScales, AddressListSource const&, cudaStream_t);
template void launchQuantizedTokens<false>(
    TokenOpPlan const&, TokenKernelParams const&, LayerScales, AddressListSource const&, cudaStream_t);

void launchQuantizedTokens(TokenOpPlan const& plan, TokenKernelParams const& params, LayerScales scales,
    TableSource const& source, cudaStream_t stream)
{
    launchQuantized<true>(plan, params, scales, source, stream);
}

} // namespace kvcache::rt::detail
