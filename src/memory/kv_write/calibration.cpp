// Host-held scales from the amax the quantizing write observed (docs/layout.md, "Calibration").

#include "core/layout/scale_support.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_write.h"

#include <fmt/format.h>

#include <cmath>

namespace kvcache::rt
{
namespace
{

constexpr char const* kCALIBRATED_SCALES = "calibratedScales";

//! Returns `amax` over the quantization's divisor, after checking the amax and the scale it gives.
float scaleFromAmax(char const* what, char const* field, KVQuantization quantization, float amax)
{
    if (!std::isfinite(amax) || amax <= 0.0F)
    {
        throw InvalidArgumentError(
            fmt::format("{}: {} is {}; it must be finite and > 0 (0 means no value was observed, "
                        "and a zero scale would store every value as zero)",
                what, field, amax));
    }
    float const divisor = detail::calibrationDivisor(quantization);
    float const scale = amax / divisor;
    if (scale == 0.0F || !detail::isValidHostScale(quantization, scale))
    {
        throw InvalidArgumentError(
            fmt::format("{}: {} is {}, and {} / {} underflows float32 to 0; the scale must be > 0", what, field, amax,
                amax, divisor));
    }
    return scale;
}

} // namespace

LayerScales calibratedScales(KVQuantization quantization, float kAmax, float vAmax, bool hasV)
{
    if (!detail::keepsHostScales(quantization))
    {
        throw InvalidArgumentError(fmt::format("{}: KVCacheConfig.quantization is {}, which keeps no host-held layer "
                                               "scales; they exist for fp8_per_tensor and nvfp4",
            kCALIBRATED_SCALES, kvQuantizationName(quantization)));
    }
    LayerScales scales;
    scales.k = scaleFromAmax(kCALIBRATED_SCALES, "kAmax", quantization, kAmax);
    if (hasV)
    {
        scales.v = scaleFromAmax(kCALIBRATED_SCALES, "vAmax", quantization, vAmax);
    }
    return scales;
}

void calibrateLayerScales(KVCacheManager& cache, int32_t layerIdx, WriteCounters const& observed)
{
    if (layerIdx < 0 || layerIdx >= cache.numLayers())
    {
        throw OutOfRangeError(
            fmt::format("calibrateLayerScales: layer index {} is out of range [0, {})", layerIdx, cache.numLayers()));
    }
    bool const hasV = cache.getLayerConfig(layerIdx).kind != KVLayerKind::kLATENT;
    LayerScales scales = calibratedScales(cache.layout().quantization, observed.kAmax, observed.vAmax, hasV);
    if (!hasV)
    {
        scales.v = cache.layerScales(layerIdx).v;
    }
    cache.setLayerScales(layerIdx, scales);
}

} // namespace kvcache::rt
