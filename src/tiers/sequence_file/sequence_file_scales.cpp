// What a sequence file records of a quantization: the rules a quantized geometry follows, the page scale bytes it
// implies, and the host-held scales a header carries, checked and compared.

#include "tiers/sequence_file/sequence_file_scales.h"

#include "core/layout/scale_support.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <cstring>
#include <string_view>
#include <tuple>
#include <utility>

namespace kvcache::rt::detail
{
namespace
{

//! Returns the bits of `value`: scales are compared and checked for zero bit for bit.
uint32_t bitsOf(float value)
{
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    return bits;
}

} // namespace

std::string quantizationProblem(PageGeometry const& geometry)
{
    KVQuantization const quantization = geometry.quantization;
    std::string_view const name = kvQuantizationName(quantization);
    switch (quantization)
    {
    case KVQuantization::kNONE: return {};
    case KVQuantization::kFP8_PER_TENSOR:
    case KVQuantization::kFP8_PER_TOKEN_HEAD:
        if (geometry.dataType != DataType::kFP8_E4M3)
        {
            return fmt::format("quantization is {}, which stores FP8 E4M3 values; dataType is {} and must be {}", name,
                dataTypeName(geometry.dataType), dataTypeName(DataType::kFP8_E4M3));
        }
        return {};
    case KVQuantization::kNVFP4:
        if (geometry.dataType != DataType::kUINT8)
        {
            return fmt::format("quantization is {}, which packs two 4-bit values a byte; dataType is {} and must be {}",
                name, dataTypeName(geometry.dataType), dataTypeName(DataType::kUINT8));
        }
        for (size_t i = 0; i < geometry.layers.size(); ++i)
        {
            if (geometry.layers[i].headDim % kNVFP4_BLOCK_VALUES != 0)
            {
                return fmt::format(
                    "layers[{}].headDim is {}; quantization {} scales blocks of {} values, so it must be "
                    "a multiple of {}",
                    i, geometry.layers[i].headDim, name, kNVFP4_BLOCK_VALUES, kNVFP4_BLOCK_VALUES);
            }
        }
        return {};
    }
    return fmt::format("quantization is {}; it must be kNONE (0), kFP8_PER_TENSOR (1), kFP8_PER_TOKEN_HEAD (2) or "
                       "kNVFP4 (3)",
        static_cast<int32_t>(quantization));
}

void checkLayerScales(
    std::string const& prefix, char const* name, PageGeometry const& geometry, std::vector<LayerScales> const& scales)
{
    KVQuantization const quantization = geometry.quantization;
    if (!keepsHostScales(quantization))
    {
        if (!scales.empty())
        {
            throw InvalidArgumentError(fmt::format("{}{} has {} entries; quantization {} keeps no host-held scales, so "
                                                   "it must be empty",
                prefix, name, scales.size(), kvQuantizationName(quantization)));
        }
        return;
    }
    if (scales.size() != geometry.layers.size())
    {
        throw InvalidArgumentError(fmt::format("{}{} has {} entries; quantization {} keeps a K and a V scale for each "
                                               "of the geometry's {} layers, so it must have {}",
            prefix, name, scales.size(), kvQuantizationName(quantization), geometry.layers.size(),
            geometry.layers.size()));
    }
    for (size_t i = 0; i < scales.size(); ++i)
    {
        bool const latent = geometry.layers[i].kind == KVLayerKind::kLATENT;
        for (auto const& [half, value] : {std::pair<char const*, float>{"k", scales[i].k}, {"v", scales[i].v}})
        {
            if ((half[0] == 'v' && latent) || isValidHostScale(quantization, value))
            {
                continue;
            }
            throw InvalidArgumentError(fmt::format("{}{}[{}].{} is {}; quantization {} needs a finite scale {}", prefix,
                name, i, half, value, kvQuantizationName(quantization), hostScaleLimit(quantization)));
        }
    }
}

void expectLayerScales(char const* what, std::string const& path, PageGeometry const& geometry,
    std::vector<LayerScales> const& file, std::vector<LayerScales> const& expected)
{
    for (size_t i = 0; i < file.size() && i < expected.size(); ++i)
    {
        bool const latent = geometry.layers[i].kind == KVLayerKind::kLATENT;
        for (auto const& [half, fileValue, expectedValue] :
            {std::tuple<char const*, float, float>{"k", file[i].k, expected[i].k}, {"v", file[i].v, expected[i].v}})
        {
            if ((half[0] == 'v' && latent) || bitsOf(fileValue) == bitsOf(expectedValue))
            {
                continue;
            }
            throw InvalidArgumentError(
                fmt::format("{}: '{}' was written under other host-held scales: its "
                            "layerScales[{}].{} is {}; the destination's is {} (quantization {})",
                    what, path, i, half, fileValue, expectedValue, kvQuantizationName(geometry.quantization)));
        }
    }
}

} // namespace kvcache::rt::detail
