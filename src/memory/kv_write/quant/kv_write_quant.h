#pragma once

// Launches of the quantizing token kernel (memory/kv_write/quant/kv_quant_kernel.cuh) for a plan of a quantized cache.

#include "memory/kv_write/kv_write_kernel.cuh"
#include "memory/kv_write/token_op_plan.h"

#include "kvcache/memory/kv_cache_manager.h"

#include <cuda_runtime_api.h>

namespace kvcache::rt::detail
{

struct QuantKernelParams;

//! Launches format kFORMAT's kernel for the plan's tensor type; defined in kv_write_quant_launch.cuh and instantiated
//! by the format's own file (kv_write_quant_<format>.cu), so that callers do not compile the kernels again.
template <KVQuantization kFORMAT, bool kWRITE, typename Source>
void launchQuantFormat(
    TokenOpPlan const& plan, QuantKernelParams const& params, Source const& source, cudaStream_t stream);

//! Quantizes tokens placed by a device list of token addresses into the pages (kWRITE), or reads them back
//! dequantized; `scales` are the layer's host-held scales (per-tensor FP8 scales, NVFP4 global scales); `counters`
//! (writes only; nullptr: none) the layer's WriteCounters.
template <bool kWRITE>
void launchQuantizedTokens(TokenOpPlan const& plan, TokenKernelParams const& params, LayerScales scales,
    WriteCounters* counters, AddressListSource const& source, cudaStream_t stream);

//! Quantizes tokens placed by (sequence, position) pairs in a page table into the pages, counting into `counters`
//! unless it is nullptr.
void launchQuantizedTokens(TokenOpPlan const& plan, TokenKernelParams const& params, LayerScales scales,
    WriteCounters* counters, TableSource const& source, cudaStream_t stream);

} // namespace kvcache::rt::detail
