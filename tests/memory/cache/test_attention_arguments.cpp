// The attention arguments of every format, built on the host from a layout and a fake scale pool base (never
// dereferenced): the scale values a kernel multiplies by, the K and V scale pool views, and the flags, against values
// worked out by hand from docs/layout.md ("Quantized pages", "Quantization rules").

#include "memory/cache/attention_arguments.h"

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "support/config_builder.h"

namespace kvcache::rt
{
namespace
{

//! Layer 0: 2 heads of 32 values; layer 1: latent, 1 head of 64. 2 sequences of 64 tokens, 16 a page: 4 pages a
//! sequence, 8 pages in the one group.
KVCacheLayout layoutOf(KVQuantization quantization)
{
    DataType const storage = quantization == KVQuantization::kNVFP4 ? DataType::kUINT8
        : quantization == KVQuantization::kNONE                     ? DataType::kHALF
                                                                    : DataType::kFP8_E4M3;
    return computeLayout(test::ConfigBuilder({{2, 32}, {1, 64, 0, KVLayerKind::kLATENT}})
                             .maxBatchSize(2)
                             .maxSequenceLength(64)
                             .tokensPerPage(16)
                             .dataType(storage)
                             .quantization(quantization)
                             .build());
}

char* const kBASE = reinterpret_cast<char*>(0x100000);
//! Distinct from 1 and from each other, so that a swapped or dropped scale shows.
LayerScales const kHOST_SCALES{0.25F, 0.75F};

void expectEmpty(Tensor const& view)
{
    EXPECT_EQ(view.rawPointer(), nullptr);
    EXPECT_EQ(view.getShape().getNumDims(), 0);
}

TEST(AttentionArguments, UnquantizedLayersMultiplyByOneAndHaveNoScalePools)
{
    KVCacheLayout const layout = layoutOf(KVQuantization::kNONE);
    for (int32_t layer : {0, 1})
    {
        AttentionArguments const arguments = detail::attentionArgumentsOf(layout, layer, kHOST_SCALES, nullptr);
        EXPECT_EQ(arguments.quantization, KVQuantization::kNONE);
        EXPECT_EQ(arguments.kScale, 1.0F);
        EXPECT_EQ(arguments.vScale, 1.0F);
        expectEmpty(arguments.kScalePool);
        expectEmpty(arguments.vScalePool);
        EXPECT_FALSE(arguments.tokenHeadScales);
        EXPECT_FALSE(arguments.tensorCoreDecode);
    }
}

TEST(AttentionArguments, Fp8PerTensorPassesTheHostScales)
{
    KVCacheLayout const layout = layoutOf(KVQuantization::kFP8_PER_TENSOR);
    AttentionArguments const kv = detail::attentionArgumentsOf(layout, 0, kHOST_SCALES, nullptr);
    EXPECT_EQ(kv.quantization, KVQuantization::kFP8_PER_TENSOR);
    EXPECT_EQ(kv.kScale, 0.25F);
    EXPECT_EQ(kv.vScale, 0.75F);
    expectEmpty(kv.kScalePool);
    expectEmpty(kv.vScalePool);
    EXPECT_FALSE(kv.tokenHeadScales);
    EXPECT_FALSE(kv.tensorCoreDecode);

    // A latent layer has no V: its v scale is unused, so the kernel's factor is 1.
    AttentionArguments const latent = detail::attentionArgumentsOf(layout, 1, kHOST_SCALES, nullptr);
    EXPECT_EQ(latent.kScale, 0.25F);
    EXPECT_EQ(latent.vScale, 1.0F);
}

TEST(AttentionArguments, Fp8PerTokenHeadSplitsTheFloatScalePoolIntoKAndV)
{
    KVCacheLayout const layout = layoutOf(KVQuantization::kFP8_PER_TOKEN_HEAD);
    AttentionArguments const kv = detail::attentionArgumentsOf(layout, 0, kHOST_SCALES, kBASE);
    EXPECT_EQ(kv.quantization, KVQuantization::kFP8_PER_TOKEN_HEAD);
    // The scales are in the pages; the host scales (there are none for this format) must not leak in.
    EXPECT_EQ(kv.kScale, 1.0F);
    EXPECT_EQ(kv.vScale, 1.0F);
    // K: [8 pages, 16 tokens, 2 heads] float32 at the base; a half is 8 * 16 * 2 * 4 = 1024 bytes, so V at + 1024.
    EXPECT_EQ(kv.kScalePool.rawPointer(), kBASE);
    EXPECT_EQ(kv.kScalePool.getShape(), (Coords{8, 16, 2}));
    EXPECT_EQ(kv.kScalePool.getDataType(), DataType::kFLOAT);
    EXPECT_EQ(kv.vScalePool.rawPointer(), kBASE + 1024);
    EXPECT_EQ(kv.vScalePool.getShape(), (Coords{8, 16, 2}));
    EXPECT_EQ(kv.vScalePool.getDataType(), DataType::kFLOAT);
    EXPECT_EQ(kv.kScalePool.getDeviceType(), DeviceType::kGPU);
    EXPECT_TRUE(kv.tokenHeadScales);
    EXPECT_TRUE(kv.tensorCoreDecode);

    // Latent: K scales [8, 16, 1] only.
    AttentionArguments const latent = detail::attentionArgumentsOf(layout, 1, kHOST_SCALES, kBASE);
    EXPECT_EQ(latent.kScalePool.rawPointer(), kBASE);
    EXPECT_EQ(latent.kScalePool.getShape(), (Coords{8, 16, 1}));
    expectEmpty(latent.vScalePool);
    EXPECT_EQ(latent.vScale, 1.0F);
}

TEST(AttentionArguments, Nvfp4PassesGlobalScalesAndSplitsTheBlockScales)
{
    KVCacheLayout const layout = layoutOf(KVQuantization::kNVFP4);
    AttentionArguments const kv = detail::attentionArgumentsOf(layout, 0, kHOST_SCALES, kBASE);
    EXPECT_EQ(kv.quantization, KVQuantization::kNVFP4);
    EXPECT_EQ(kv.kScale, 0.25F);
    EXPECT_EQ(kv.vScale, 0.75F);
    // K: [8 pages, 16 tokens, 2 heads, 32 / 16 = 2 blocks] E4M3; a half is 8 * 16 * 2 * 2 = 512 bytes.
    EXPECT_EQ(kv.kScalePool.rawPointer(), kBASE);
    EXPECT_EQ(kv.kScalePool.getShape(), (Coords{8, 16, 2, 2}));
    EXPECT_EQ(kv.kScalePool.getDataType(), DataType::kFP8_E4M3);
    EXPECT_EQ(kv.vScalePool.rawPointer(), kBASE + 512);
    EXPECT_EQ(kv.vScalePool.getShape(), (Coords{8, 16, 2, 2}));
    EXPECT_FALSE(kv.tokenHeadScales);
    EXPECT_TRUE(kv.tensorCoreDecode);

    // Latent: 64 / 16 = 4 blocks a head, K only; its global scale k, and 1 for the V it does not have.
    AttentionArguments const latent = detail::attentionArgumentsOf(layout, 1, kHOST_SCALES, kBASE);
    EXPECT_EQ(latent.kScale, 0.25F);
    EXPECT_EQ(latent.vScale, 1.0F);
    EXPECT_EQ(latent.kScalePool.getShape(), (Coords{8, 16, 1, 4}));
    expectEmpty(latent.vScalePool);
}

TEST(AttentionArguments, ScalePoolTensorKeepsBothHalvesInOneView)
{
    // The view scalePoolView returns: [halves, pages, tokens, heads(, blocks)], halves 2, or 1 for a latent layer.
    KVCacheLayout const nvfp4 = layoutOf(KVQuantization::kNVFP4);
    EXPECT_EQ(detail::scalePoolTensor(nvfp4, 0, kBASE).getShape(), (Coords{2, 8, 16, 2, 2}));
    EXPECT_EQ(detail::scalePoolTensor(nvfp4, 1, kBASE).getShape(), (Coords{1, 8, 16, 1, 4}));
    KVCacheLayout const tokenHead = layoutOf(KVQuantization::kFP8_PER_TOKEN_HEAD);
    EXPECT_EQ(detail::scalePoolTensor(tokenHead, 0, kBASE).getShape(), (Coords{2, 8, 16, 2}));
    EXPECT_EQ(detail::scalePoolTensor(tokenHead, 0, kBASE).getDataType(), DataType::kFLOAT);
}

} // namespace
} // namespace kvcache::rt
