// Quantized layouts: data and scale bytes of every format, the budget maths counting scales, the config's refusals,
// and the manager refusing the scaled formats until its page operations carry scales. Every expected number is worked
// out by hand in the comments, from docs/layout.md ("Quantized pages"), not from the library's code.

#include "kvcache/core/data_type.h"
#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"

namespace kvcache::rt
{
namespace
{

constexpr int64_t kGiB = int64_t{1} << 30;

//! The issue's memory example: 32 layers of 8 KV heads of 128, 64 sequences of 8192 tokens in pages of 128, so
//! 64 * 8192 / 128 = 4096 pages a half.
test::ConfigBuilder llama8x128(KVQuantization quantization, DataType storage)
{
    std::vector<KVLayerConfig> const layers(32, KVLayerConfig{8, 128});
    return test::ConfigBuilder(layers)
        .maxBatchSize(64)
        .maxSequenceLength(8192)
        .tokensPerPage(128)
        .dataType(storage)
        .quantization(quantization);
}

//! One format's sizes for llama8x128, written out by hand.
struct FormatByHand
{
    KVQuantization quantization;
    DataType storage;
    int64_t bytesPerTokenHeadHalf; //!< the issue's table: fp16 2D, fp8 D, fp8 per-token-head D + 4, NVFP4 D/2 + D/16
    int32_t storedDim;
    int64_t pageBytes;      //!< 128 tokens * 8 heads * stored bytes of a head
    int64_t scalePageBytes; //!< 128 tokens * 8 heads * scale bytes of a head
    int64_t layerBytes;     //!< 2 halves * 4096 pages * pageBytes
    int64_t scaleBytes;     //!< 2 halves * 4096 pages * scalePageBytes
    int64_t bytesPerPage;   //!< 32 layers * 2 halves * (pageBytes + scalePageBytes)
    int64_t cacheBytes;     //!< 4096 pages * bytesPerPage
};

// clang-format off
FormatByHand const kFORMATS[] = {
    // float16: 2 * 128 = 256 bytes; page 128 * 8 * 128 * 2 = 262,144; 64 GiB in all.
    {KVQuantization::kNONE, DataType::kHALF, 256, 128, 262144, 0, 2147483648, 0, 16777216, 68719476736},
    // fp8 without scales: 128 bytes; page 131,072; 32 GiB.
    {KVQuantization::kNONE, DataType::kFP8_E4M3, 128, 128, 131072, 0, 1073741824, 0, 8388608, 34359738368},
    // fp8 per tensor: the same bytes (its two float scales a layer are host values, not pages).
    {KVQuantization::kFP8_PER_TENSOR, DataType::kFP8_E4M3, 128, 128, 131072, 0, 1073741824, 0, 8388608,
        34359738368},
    // fp8 per token and head: 128 + 4 = 132 bytes; scale page 128 * 8 * 4 = 4096; scales 2 * 4096 * 4096 =
    // 33,554,432 a layer; a page id 32 * 2 * (131,072 + 4096) = 8,650,752; 4096 * that = 35,433,480,192.
    {KVQuantization::kFP8_PER_TOKEN_HEAD, DataType::kFP8_E4M3, 132, 128, 131072, 4096, 1073741824, 33554432,
        8650752, 35433480192},
    // NVFP4: 64 + 8 = 72 bytes; page 128 * 8 * 64 = 65,536; scale page 128 * 8 * 8 = 8192; a page id
    // 32 * 2 * (65,536 + 8192) = 4,718,592; 4096 * that = 19,327,352,832 (18 GiB).
    {KVQuantization::kNVFP4, DataType::kUINT8, 72, 64, 65536, 8192, 536870912, 67108864, 4718592, 19327352832},
};
// clang-format on

TEST(QuantizedLayout, EveryFormatOfTheIssuesModelByHand)
{
    for (FormatByHand const& format : kFORMATS)
    {
        SCOPED_TRACE(
            std::string(kvQuantizationName(format.quantization)) + " in " + std::string(dataTypeName(format.storage)));
        KVCacheLayout const layout = computeLayout(llama8x128(format.quantization, format.storage));
        EXPECT_EQ(layout.quantization, format.quantization);
        EXPECT_EQ(layout.numPages, 4096);
        ASSERT_EQ(layout.layers.size(), 32u);
        for (KVLayerLayout const& layer : layout.layers)
        {
            EXPECT_EQ(layer.headDim, 128); // the model's head size, whatever the format stores
            EXPECT_EQ(layer.storedDim, format.storedDim);
            EXPECT_EQ(layer.pageBytes, format.pageBytes);
            EXPECT_EQ(layer.halfElems * layout.elementBytes, 4096 * format.pageBytes); // where V starts
            EXPECT_EQ(layer.scalePageBytes, format.scalePageBytes);
            EXPECT_EQ(layer.layerBytes, format.layerBytes);
            EXPECT_EQ(layer.scaleBytes, format.scaleBytes);
        }
        EXPECT_EQ(layout.bytesPerPage, format.bytesPerPage);
        EXPECT_EQ(layout.groups.at(0).bytesPerPage, format.bytesPerPage);
        EXPECT_EQ(layout.cacheBytes, format.cacheBytes);
        EXPECT_EQ(layout.groups.at(0).cacheBytes, format.cacheBytes);
        // The issue's per (head, token, half) table: 32 layers * 2 halves * 8 heads * 524,288 tokens = 2^28 of them.
        EXPECT_EQ(layout.cacheBytes, (int64_t{1} << 28) * format.bytesPerTokenHeadHalf);
    }
}

TEST(QuantizedLayout, LatentAndWindowedLayersByHand)
{
    // Batch 2, 1024 tokens in pages of 64, 256 tokens a step. Group 0 (full attention: layers 0 and 2) keeps 16 pages
    // a sequence, 32 pages; group 1 (window 128: layer 1) keeps min(16, ceil(383 / 64) + 1 = 7) pages, 14 pages.
    // Layer 2 is latent: one half of 576 values a token, so no V scales.
    std::vector<KVLayerConfig> const layers{{8, 128, 0}, {8, 128, 128}, {1, 576, 0, KVLayerKind::kLATENT}};
    test::ConfigBuilder builder(layers);
    builder.maxBatchSize(2).maxSequenceLength(1024).tokensPerPage(64).maxTokensPerStep(256);
    {
        SCOPED_TRACE("fp8 per token and head");
        // KV pages 64 * 8 * 128 = 65,536 bytes and scale pages 64 * 8 * 4 = 2048; latent pages 64 * 576 = 36,864
        // and scale pages 64 * 4 = 256.
        KVCacheLayout const layout = computeLayout(
            builder.dataType(DataType::kFP8_E4M3).quantization(KVQuantization::kFP8_PER_TOKEN_HEAD).build());
        ASSERT_EQ(layout.groups.size(), 2u);
        EXPECT_EQ(layout.layers[0].scalePageBytes, 2048);
        EXPECT_EQ(layout.layers[0].scaleBytes, 131072); // 2 * 32 * 2048
        EXPECT_EQ(layout.layers[1].scaleBytes, 57344);  // 2 * 14 * 2048
        EXPECT_EQ(layout.layers[2].pageBytes, 36864);
        EXPECT_EQ(layout.layers[2].scalePageBytes, 256);
        EXPECT_EQ(layout.layers[2].scaleBytes, 8192);     // 1 half * 32 * 256
        EXPECT_EQ(layout.groups[0].bytesPerPage, 172288); // 2 * (65,536 + 2048) + (36,864 + 256)
        EXPECT_EQ(layout.groups[1].bytesPerPage, 135168); // 2 * (65,536 + 2048)
        EXPECT_EQ(layout.groups[0].cacheBytes, 5513216);  // 32 * 172,288
        EXPECT_EQ(layout.groups[1].cacheBytes, 1892352);  // 14 * 135,168
        // Layer by layer: 4,194,304 + 131,072 + 1,835,008 + 57,344 + 1,179,648 + 8192.
        EXPECT_EQ(layout.cacheBytes, 7405568);
    }
    {
        SCOPED_TRACE("NVFP4");
        // KV pages 64 * 8 * 64 = 32,768 and scale pages 64 * 8 * 8 = 4096; latent pages 64 * 288 = 18,432 and scale
        // pages 64 * 36 = 2304.
        KVCacheLayout const layout =
            computeLayout(builder.dataType(DataType::kUINT8).quantization(KVQuantization::kNVFP4).build());
        EXPECT_EQ(layout.layers[2].storedDim, 288);
        EXPECT_EQ(layout.layers[2].pageBytes, 18432);
        EXPECT_EQ(layout.layers[2].scalePageBytes, 2304);
        EXPECT_EQ(layout.layers[2].layerBytes, 589824);  // 32 * 18,432
        EXPECT_EQ(layout.layers[2].scaleBytes, 73728);   // 32 * 2304
        EXPECT_EQ(layout.groups[0].bytesPerPage, 94464); // 2 * (32,768 + 4096) + (18,432 + 2304)
        EXPECT_EQ(layout.groups[1].bytesPerPage, 73728); // 2 * (32,768 + 4096)
        EXPECT_EQ(layout.cacheBytes, 4055040);           // 32 * 94,464 + 14 * 73,728
    }
}

TEST(QuantizedBudget, MaxPagesCountsScaleBytes)
{
    // 16 GiB = 17,179,869,184 bytes over a page id's bytes (kFORMATS): float16 16,777,216 -> 1024; fp8 8,388,608
    // -> 2048; per token and head 8,650,752 -> 1985 (1986 pages would take 17,180,393,472); NVFP4 4,718,592 -> 3640
    // (3641 would take 17,180,393,472).
    EXPECT_EQ(maxPagesForBudget(llama8x128(KVQuantization::kNONE, DataType::kHALF), 16 * kGiB), 1024);
    EXPECT_EQ(maxPagesForBudget(llama8x128(KVQuantization::kFP8_PER_TENSOR, DataType::kFP8_E4M3), 16 * kGiB), 2048);
    auto const tokenHead = llama8x128(KVQuantization::kFP8_PER_TOKEN_HEAD, DataType::kFP8_E4M3).build();
    EXPECT_EQ(maxPagesForBudget(tokenHead, 16 * kGiB), 1985);
    EXPECT_EQ(maxPagesForBudget(tokenHead, int64_t{1985} * 8650752), 1985);
    EXPECT_EQ(maxPagesForBudget(tokenHead, int64_t{1985} * 8650752 - 1), 1984);
    EXPECT_EQ(maxPagesForBudget(llama8x128(KVQuantization::kNVFP4, DataType::kUINT8), 16 * kGiB), 3640);
}

TEST(QuantizedBudget, SplitCountsScaleBytesOfEveryGroup)
{
    // Batch 4 of 8192 tokens, 2048 a step: full attention keeps 64 pages a sequence, window 128 keeps
    // min(64, ceil(2175 / 128) + 1) = 18. A page id of either group: 2 * (128 * 8 * 128 + 128 * 8 * 4) = 270,336
    // bytes, so a sequence costs (64 + 18) * 270,336 = 22,167,552 and 1 GiB holds 48 (49 would take 1,086,210,048).
    // Without the scales a sequence would cost 82 * 262,144 = 21,495,808 and 1 GiB would hold 49.
    std::vector<KVLayerConfig> const layers{{8, 128, 0}, {8, 128, 128}};
    KVCacheConfig const config = test::ConfigBuilder(layers)
                                     .maxBatchSize(4)
                                     .maxSequenceLength(8192)
                                     .maxTokensPerStep(2048)
                                     .dataType(DataType::kFP8_E4M3)
                                     .quantization(KVQuantization::kFP8_PER_TOKEN_HEAD);
    BudgetSplit const split = splitBudget(config, kGiB);
    EXPECT_EQ(split.sequences, 48);
    EXPECT_EQ(split.numPagesPerGroup, (std::vector<int64_t>{3072, 864}));
    EXPECT_EQ(split.bytes, 1064042496); // 48 * 22,167,552
    KVCacheConfig sized = config;
    sized.numPagesPerGroup = {3072, 864};
    EXPECT_EQ(computeLayout(sized).cacheBytes, 1064042496); // the split's bytes are what the layout allocates
}

// ---------------------------------------------------------------------------------------------------------------
// Refusals

TEST(QuantizedValidation, ScaledFp8NeedsE4M3Storage)
{
    for (KVQuantization const quantization : {KVQuantization::kFP8_PER_TENSOR, KVQuantization::kFP8_PER_TOKEN_HEAD})
    {
        for (DataType const storage : {DataType::kHALF, DataType::kFP8_E5M2, DataType::kUINT8})
        {
            EXPECT_TRUE(
                test::throwsNaming<InvalidConfigError>([&] { computeLayout(llama8x128(quantization, storage)); },
                    {"KVCacheConfig.quantization", std::string(kvQuantizationName(quantization)), "kvCacheType",
                        std::string(dataTypeName(storage)), "fp8_e4m3"}));
        }
    }
}

TEST(QuantizedValidation, Nvfp4NeedsUint8Storage)
{
    for (DataType const storage : {DataType::kFP8_E4M3, DataType::kINT8, DataType::kHALF})
    {
        EXPECT_TRUE(
            test::throwsNaming<InvalidConfigError>([&] { computeLayout(llama8x128(KVQuantization::kNVFP4, storage)); },
                {"KVCacheConfig.quantization", "nvfp4", "kvCacheType", std::string(dataTypeName(storage)), "uint8"}));
    }
}

TEST(QuantizedValidation, Nvfp4NeedsHeadDimInBlocksOf16NamingTheLayer)
{
    // 72 = 4.5 blocks; 8 is even (two values a byte) but half a block. 576 (a latent layer) and 16 are whole blocks.
    for (int32_t const headDim : {72, 8, 17})
    {
        std::vector<KVLayerConfig> const layers{{1, 576, 0, KVLayerKind::kLATENT}, {2, 16}, {4, headDim}};
        KVCacheConfig const config =
            test::ConfigBuilder(layers).dataType(DataType::kUINT8).quantization(KVQuantization::kNVFP4);
        EXPECT_TRUE(test::throwsNaming<InvalidConfigError>([&] { computeLayout(config); },
            {"layerConfigs[2].headDim", std::to_string(headDim), "nvfp4", "multiple of 16"}));
    }
    std::vector<KVLayerConfig> const whole{{1, 576, 0, KVLayerKind::kLATENT}, {2, 16}, {4, 64}};
    EXPECT_NO_THROW(computeLayout(
        test::ConfigBuilder(whole).dataType(DataType::kUINT8).quantization(KVQuantization::kNVFP4).build()));
}

TEST(QuantizedValidation, RejectsQuantizationOutsideTheEnumeration)
{
    for (int32_t const value : {-1, 4, 99})
    {
        EXPECT_TRUE(test::throwsNaming<InvalidConfigError>([&]
            { computeLayout(llama8x128(static_cast<KVQuantization>(value), DataType::kFP8_E4M3)); },
            {"KVCacheConfig.quantization", std::to_string(value), "kNVFP4 (3)"}));
    }
    EXPECT_EQ(kvQuantizationName(static_cast<KVQuantization>(99)), "unknown");
}

TEST(QuantizedValidation, BudgetsRefuseWhatTheLayoutRefuses)
{
    auto const broken = llama8x128(KVQuantization::kNVFP4, DataType::kFP8_E4M3).build();
    EXPECT_THROW(maxPagesForBudget(broken, kGiB), InvalidConfigError);
    EXPECT_THROW(splitBudget(broken, kGiB), InvalidConfigError);
}

} // namespace
} // namespace kvcache::rt
