#include "core/layout/scale_support.h"

#include <cmath>

namespace kvcache::rt::detail
{

bool isValidHostScale(KVQuantization quantization, float value) noexcept
{
    bool const positive = quantization == KVQuantization::kNVFP4;
    return std::isfinite(value) && value >= 0.0F && !(positive && value == 0.0F);
}

} // namespace kvcache::rt::detail
