#pragma once

// Quantized configs the scale tests share: the formats with scale pools and their storage types, and a cache of seven
// layers in three page groups (full attention and two windows, KV and latent layers) that any quantization can hold.

#include "kvcache/core/data_type.h"
#include "kvcache/core/kv_cache_config.h"

#include <cstdint>
#include <iterator>
#include <string>

#include "support/config_builder.h"

namespace kvcache::test
{

//! A quantization and the storage type it needs.
struct ScaledFormat
{
    rt::KVQuantization quantization;
    rt::DataType storage;
};

//! The quantizations with scale pools (page scales).
inline constexpr ScaledFormat kSCALED_FORMATS[] = {
    {rt::KVQuantization::kFP8_PER_TOKEN_HEAD, rt::DataType::kFP8_E4M3},
    {rt::KVQuantization::kNVFP4, rt::DataType::kUINT8},
};

//! The quantizations the token write quantizes into: per tensor, and the two with scale pools.
inline constexpr ScaledFormat kQUANTIZED_FORMATS[] = {
    {rt::KVQuantization::kFP8_PER_TENSOR, rt::DataType::kFP8_E4M3},
    kSCALED_FORMATS[0],
    kSCALED_FORMATS[1],
};

//! Every quantization with the storage type it needs (kNONE in float16 and in FP8 E4M3).
inline constexpr ScaledFormat kEVERY_FORMAT[] = {
    {rt::KVQuantization::kNONE, rt::DataType::kHALF},
    {rt::KVQuantization::kNONE, rt::DataType::kFP8_E4M3},
    {rt::KVQuantization::kFP8_PER_TENSOR, rt::DataType::kFP8_E4M3},
    {rt::KVQuantization::kFP8_PER_TOKEN_HEAD, rt::DataType::kFP8_E4M3},
    {rt::KVQuantization::kNVFP4, rt::DataType::kUINT8},
};

//! Returns the format's name for traces: the quantization's, and the storage type's.
inline std::string nameOf(ScaledFormat format)
{
    return std::string(rt::kvQuantizationName(format.quantization)) + " in "
        + std::string(rt::dataTypeName(format.storage));
}

//! Pages per half of each group of scaledConfig(): above the minima (26, 6, 10), so every group has spare pages.
inline constexpr int32_t kSCALED_GROUP_PAGES[] = {40, 12, 24};

//! Seven layers in three page groups, every headDim a multiple of 16 (NVFP4's block): 2 slots of 200 tokens in pages
//! of 16, steps of up to 8 tokens. Group 0 (full attention): layers 0 (KV), 2 (latent), 5 (KV); group 1 (window 16):
//! layers 1 (KV), 3 (latent); group 2 (window 48): layers 4 (KV), 6 (latent).
inline rt::KVCacheConfig scaledConfig(ScaledFormat format)
{
    constexpr rt::KVLayerKind kLATENT = rt::KVLayerKind::kLATENT;
    rt::KVCacheConfig config = ConfigBuilder(
        {{2, 16}, {1, 32, 16}, {1, 48, 0, kLATENT}, {1, 64, 16, kLATENT}, {3, 16, 48}, {1, 32}, {1, 16, 48, kLATENT}})
                                   .maxBatchSize(2)
                                   .maxSequenceLength(200)
                                   .tokensPerPage(16)
                                   .dataType(format.storage)
                                   .quantization(format.quantization)
                                   .build();
    config.maxTokensPerStep = 8;
    config.numPagesPerGroup.assign(std::begin(kSCALED_GROUP_PAGES), std::end(kSCALED_GROUP_PAGES));
    return config;
}

} // namespace kvcache::test
