// The attention arguments of every format, built on the host from a layout and a fake scale pool base (never
// dereferenced): the scale values a kernel multiplies by, the K and V scale pool views, and the flags, against values
// worked out by hand from docs/layout.md ("Quantized pages", "Quantization rules").

#include "memory/cache/attention_arguments.h"

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <tuple>

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

//! A scale pool view: at `pointer`, or an empty view where `pointer` is null.
struct ExpectedPool
{
    char* pointer;
    Coords shape;
    DataType type;
};

ExpectedPool const kNO_POOL{nullptr, Coords{}, DataType::kFLOAT};

//! What a kernel multiplies one layer's K and V by, and where it finds the page scales.
struct ExpectedLayer
{
    float kScale;
    float vScale;
    ExpectedPool kPool;
    ExpectedPool vPool;
};

//! The arguments of layoutOf(quantization)'s KV layer and latent layer, given `scaleBase`.
struct FormatCase
{
    KVQuantization quantization;
    char* scaleBase;
    bool tokenHeadScales;
    bool tensorCoreDecode;
    ExpectedLayer kv;
    ExpectedLayer latent;
};

FormatCase const kFORMAT_CASES[] = {
    // Unquantized: nothing to multiply by, no scale pools.
    {KVQuantization::kNONE, nullptr, false, false, {1.0F, 1.0F, kNO_POOL, kNO_POOL}, {1.0F, 1.0F, kNO_POOL, kNO_POOL}},
    // The host scales; a latent layer has no V: its v scale is unused, so the kernel's factor is 1.
    {KVQuantization::kFP8_PER_TENSOR, nullptr, false, false, {0.25F, 0.75F, kNO_POOL, kNO_POOL},
        {0.25F, 1.0F, kNO_POOL, kNO_POOL}},
    // The scales are in the pages; the host scales (there are none for this format) must not leak in. K: [8 pages,
    // 16 tokens, 2 heads] float32 at the base; a half is 8 * 16 * 2 * 4 = 1024 bytes, so V at + 1024. Latent: K
    // scales [8, 16, 1] only.
    {KVQuantization::kFP8_PER_TOKEN_HEAD, kBASE, true, true,
        {1.0F, 1.0F, {kBASE, Coords{8, 16, 2}, DataType::kFLOAT}, {kBASE + 1024, Coords{8, 16, 2}, DataType::kFLOAT}},
        {1.0F, 1.0F, {kBASE, Coords{8, 16, 1}, DataType::kFLOAT}, kNO_POOL}},
    // Global scales from the host. K: [8 pages, 16 tokens, 2 heads, 32 / 16 = 2 blocks] E4M3; a half is
    // 8 * 16 * 2 * 2 = 512 bytes. Latent: 64 / 16 = 4 blocks a head, K only, with its global scale k.
    {KVQuantization::kNVFP4, kBASE, false, true,
        {0.25F, 0.75F, {kBASE, Coords{8, 16, 2, 2}, DataType::kFP8_E4M3},
            {kBASE + 512, Coords{8, 16, 2, 2}, DataType::kFP8_E4M3}},
        {0.25F, 1.0F, {kBASE, Coords{8, 16, 1, 4}, DataType::kFP8_E4M3}, kNO_POOL}},
};

//! What a kernel multiplies a layer's K and V by, and the flags that pick its path: compared as one value, so that a
//! failure shows them all.
struct Scalars
{
    KVQuantization quantization;
    float kScale;
    float vScale;
    bool tokenHeadScales;
    bool tensorCoreDecode;

    bool operator==(Scalars const& other) const
    {
        return std::tie(quantization, kScale, vScale, tokenHeadScales, tensorCoreDecode)
            == std::tie(other.quantization, other.kScale, other.vScale, other.tokenHeadScales, other.tensorCoreDecode);
    }
};

std::ostream& operator<<(std::ostream& out, Scalars const& scalars)
{
    return out << kvQuantizationName(scalars.quantization) << ", k " << scalars.kScale << ", v " << scalars.vScale
               << ", tokenHeadScales " << scalars.tokenHeadScales << ", tensorCoreDecode " << scalars.tensorCoreDecode;
}

void expectPool(Tensor const& view, ExpectedPool const& expected)
{
    EXPECT_EQ(view.rawPointer(), expected.pointer);
    if (expected.pointer == nullptr)
    {
        EXPECT_EQ(view.getShape().getNumDims(), 0);
        return;
    }
    EXPECT_EQ(view.getShape(), expected.shape);
    EXPECT_EQ(view.getDataType(), expected.type);
    EXPECT_EQ(view.getDeviceType(), DeviceType::kGPU);
}

TEST(AttentionArguments, EveryFormatGivesTheScalesPoolsAndFlagsWorkedOutByHand)
{
    for (FormatCase const& c : kFORMAT_CASES)
    {
        SCOPED_TRACE(std::string(kvQuantizationName(c.quantization)));
        KVCacheLayout const layout = layoutOf(c.quantization);
        for (int32_t const layer : {0, 1})
        {
            SCOPED_TRACE(layer == 0 ? "KV layer" : "latent layer");
            ExpectedLayer const& expected = layer == 0 ? c.kv : c.latent;
            AttentionArguments const arguments = detail::attentionArgumentsOf(layout, layer, kHOST_SCALES, c.scaleBase);
            Scalars const actual{arguments.quantization, arguments.kScale, arguments.vScale, arguments.tokenHeadScales,
                arguments.tensorCoreDecode};
            EXPECT_EQ(actual,
                (Scalars{c.quantization, expected.kScale, expected.vScale, c.tokenHeadScales, c.tensorCoreDecode}));
            expectPool(arguments.kScalePool, expected.kPool);
            expectPool(arguments.vScalePool, expected.vPool);
        }
    }
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
