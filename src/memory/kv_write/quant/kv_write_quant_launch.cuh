#pragma once

// The quantizing kernel's launches for one format, instantiated by one .cu file a format (kv_write_quant_<format>.cu)
// so that the three compile in parallel.

#include "memory/kv_write/quant/kv_quant_kernel.cuh"
#include "memory/kv_write/quant/kv_write_quant.h"
#include "memory/kv_write/token_op_plan.h"

#include "kvcache/core/errors.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>

namespace kvcache::rt::detail
{

template <typename TensorT, KVQuantization kFORMAT, int32_t kV, bool kWRITE, typename Source>
void launchQuantShaped(
    TokenOpPlan const& plan, QuantKernelParams const& params, Source const& source, cudaStream_t stream)
{
    dim3 const block(static_cast<uint32_t>(plan.blockX), static_cast<uint32_t>(plan.blockY));
    // The kernel strides over tokens, so a grid capped at the hardware's limit covers any count.
    dim3 const grid(static_cast<uint32_t>(std::min<int64_t>(plan.gridX, INT32_MAX)), static_cast<uint32_t>(plan.gridY));
    // Counting is a kernel of its own, so that a write without counters runs the same code as before.
    if constexpr (kWRITE)
    {
        if (params.counters != nullptr)
        {
            quantTokenKernel<TensorT, kFORMAT, kV, true, true><<<grid, block, 0, stream>>>(params, source);
            KVCACHE_CUDA_TRY(cudaGetLastError());
            return;
        }
    }
    quantTokenKernel<TensorT, kFORMAT, kV, kWRITE, false><<<grid, block, 0, stream>>>(params, source);
    KVCACHE_CUDA_TRY(cudaGetLastError());
}

template <typename TensorT, KVQuantization kFORMAT, bool kWRITE, typename Source>
void launchQuantPerLane(
    TokenOpPlan const& plan, QuantKernelParams const& params, Source const& source, cudaStream_t stream)
{
    switch (plan.valuesPerLane)
    {
    case 8: launchQuantShaped<TensorT, kFORMAT, 8, kWRITE>(plan, params, source, stream); return;
    case 16: launchQuantShaped<TensorT, kFORMAT, 16, kWRITE>(plan, params, source, stream); return;
    default: launchQuantShaped<TensorT, kFORMAT, 32, kWRITE>(plan, params, source, stream); return;
    }
}

template <KVQuantization kFORMAT, bool kWRITE, typename Source>
void launchQuantFormat(
    TokenOpPlan const& plan, QuantKernelParams const& params, Source const& source, cudaStream_t stream)
{
    switch (plan.tensorType)
    {
    case DataType::kFLOAT: launchQuantPerLane<float, kFORMAT, kWRITE>(plan, params, source, stream); return;
    case DataType::kHALF: launchQuantPerLane<__half, kFORMAT, kWRITE>(plan, params, source, stream); return;
    case DataType::kBF16: launchQuantPerLane<__nv_bfloat16, kFORMAT, kWRITE>(plan, params, source, stream); return;
    default: return; // planTokenOp refused every other type
    }
}

//! Instantiates format kFORMAT's launches: writes by address list and by page table, reads by address list.
#define KVCACHE_INSTANTIATE_QUANT_FORMAT(FORMAT)                                                                       \
    template void launchQuantFormat<FORMAT, true, AddressListSource>(                                                  \
        TokenOpPlan const&, QuantKernelParams const&, AddressListSource const&, cudaStream_t);                         \
    template void launchQuantFormat<FORMAT, false, AddressListSource>(                                                 \
        TokenOpPlan const&, QuantKernelParams const&, AddressListSource const&, cudaStream_t);                         \
    template void launchQuantFormat<FORMAT, true, TableSource>(                                                        \
        TokenOpPlan const&, QuantKernelParams const&, TableSource const&, cudaStream_t);

} // namespace kvcache::rt::detail
