// The quantizing token kernel's dispatch: the format's launches live in kv_write_quant_<format>.cu.

#include "memory/kv_write/quant/kv_write_quant.h"

#include "memory/kv_write/quant/kv_quant_kernel.cuh"

namespace kvcache::rt::detail
{

namespace
{

template <bool kWRITE, typename Source>
void launchQuantized(TokenOpPlan const& plan, TokenKernelParams const& params, LayerScales scales,
    WriteCounters* counters, Source const& source, cudaStream_t stream)
{
    // A layer's scales are the same for every token, so their reciprocals are taken here, once.
    auto const reciprocal = [](float scale) { return isFastScale(scale) ? 1.0F / scale : 0.0F; };
    QuantKernelParams const quant{params, scales.k, scales.v, reciprocal(scales.k), reciprocal(scales.v),
        plan.quantVectors, plan.codeVectors, plan.laneShift, counters};
    switch (plan.quantization)
    {
    case KVQuantization::kFP8_PER_TENSOR:
        launchQuantFormat<KVQuantization::kFP8_PER_TENSOR, kWRITE>(plan, quant, source, stream);
        return;
    case KVQuantization::kFP8_PER_TOKEN_HEAD:
        launchQuantFormat<KVQuantization::kFP8_PER_TOKEN_HEAD, kWRITE>(plan, quant, source, stream);
        return;
    case KVQuantization::kNVFP4: launchQuantFormat<KVQuantization::kNVFP4, kWRITE>(plan, quant, source, stream); return;
    default: return; // planTokenOp plans no other format for this kernel
    }
}

} // namespace

template <bool kWRITE>
void launchQuantizedTokens(TokenOpPlan const& plan, TokenKernelParams const& params, LayerScales scales,
    WriteCounters* counters, AddressListSource const& source, cudaStream_t stream)
{
    launchQuantized<kWRITE>(plan, params, scales, counters, source, stream);
}

template void launchQuantizedTokens<true>(
    TokenOpPlan const&, TokenKernelParams const&, LayerScales, WriteCounters*, AddressListSource const&, cudaStream_t);
template void launchQuantizedTokens<false>(
    TokenOpPlan const&, TokenKernelParams const&, LayerScales, WriteCounters*, AddressListSource const&, cudaStream_t);

void launchQuantizedTokens(TokenOpPlan const& plan, TokenKernelParams const& params, LayerScales scales,
    WriteCounters* counters, TableSource const& source, cudaStream_t stream)
{
    launchQuantized<true>(plan, params, scales, counters, source, stream);
}

} // namespace kvcache::rt::detail
