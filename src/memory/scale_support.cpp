#include "memory/scale_support.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <cmath>

namespace kvcache::rt::detail
{

bool isValidHostScale(KVQuantization quantization, float value) noexcept
{
    bool const positive = quantization == KVQuantization::kNVFP4;
    return std::isfinite(value) && value >= 0.0F && !(positive && value == 0.0F);
}

void refuseUncarriedScales(char const* what, KVQuantization quantization, CarriedScales carried, char const* missing)
{
    bool const served = quantization == KVQuantization::kNONE
        || (quantization == KVQuantization::kFP8_PER_TENSOR && carried == CarriedScales::kHOST_HELD);
    if (served)
    {
        return;
    }
    throw InvalidArgumentError(fmt::format("{}: KVCacheConfig.quantization is {}; {}, so it would drop the cache's "
                                           "scales (supported here: {})",
        what, kvQuantizationName(quantization), missing,
        carried == CarriedScales::kHOST_HELD ? "none, fp8_per_tensor" : "none"));
}

} // namespace kvcache::rt::detail
