#pragma once

// Launches of the quantizing token kernel (kernels/kv_quant_kernel.cuh) for a plan of a quantized cache.

#include "kernels/kv_write_kernel.cuh"
#include "memory/token_op_plan.h"

#include "kvcache/memory/kv_cache_manager.h"

#include <cuda_runtime_api.h>

namespace kvcache::rt::detail
{

//! Quantizes tokens placed by a device list of token addresses into the pages (kWRITE), or reads them back
//! dequantized; `scales` are the layer's host-held scales (per-tensor FP8 scales, NVFP4 global scales).
template <bool kWRITE>
void launchQuantizedTokens(TokenOpPlan const& plan, TokenKernelParams const& params, LayerScales scales,
    AddressListSource const& source, cudaStream_t stream);

//! Quantizes tokens placed by (sequence, position) pairs in a page table into the pages.
void launchQuantizedTokens(TokenOpPlan const& plan, TokenKernelParams const& params, LayerScales scales,
    TableSource const& source, cudaStream_t stream);

} // namespace kvcache::rt::detail
