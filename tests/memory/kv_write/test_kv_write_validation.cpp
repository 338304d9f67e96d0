// The token write's host side, without a GPU: every refusal of planTokenOp (the checks writeTokens and readTokens make
// before launching) with its exception type and message, the plan's vector width and block shape, and the address
// maths of both forms (token addresses, a CSR table with first tokens) against the independent model in
// support/token_write_model.h.

#include "memory/kv_write/token_address.h"
#include "memory/kv_write/token_op_plan.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/kv_write.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/token_write_model.h"

namespace
{

namespace rt = kvcache::rt;
namespace detail = kvcache::rt::detail;
using kvcache::test::ConfigBuilder;
using kvcache::test::throwsNaming;

constexpr int32_t kTOKENS_PER_PAGE = 16;
//! Layer 0: full attention 2 x 64; layer 1: window 32, 1 x 128; layer 2: latent 1 x 72.
std::vector<rt::KVLayerConfig> const kLAYERS{{2, 64}, {1, 128, 32}, {1, 72, 0, rt::KVLayerKind::kLATENT}};

rt::KVCacheLayout layoutOf(rt::DataType type)
{
    rt::KVCacheConfig config = ConfigBuilder(kLAYERS)
                                   .maxBatchSize(2)
                                   .maxSequenceLength(128)
                                   .tokensPerPage(kTOKENS_PER_PAGE)
                                   .dataType(type)
                                   .maxTokensPerStep(16)
                                   .build();
    return rt::KVCacheManager::validate(config);
}

//! Returns the layout of a cache of `layers` quantized by `quantization` in `storage`.
rt::KVCacheLayout quantizedLayoutOf(
    std::vector<rt::KVLayerConfig> const& layers, rt::KVQuantization quantization, rt::DataType storage)
{
    return rt::KVCacheManager::validate(ConfigBuilder(layers)
                                            .maxBatchSize(2)
                                            .maxSequenceLength(64)
                                            .tokensPerPage(kTOKENS_PER_PAGE)
                                            .dataType(storage)
                                            .quantization(quantization)
                                            .build());
}

//! A fake device address, 256-byte aligned: planning never dereferences it.
void* fakeDevice(uintptr_t offset = 0)
{
    return reinterpret_cast<void*>(uintptr_t{0x10000000} + offset);
}

rt::Tensor tokens(int64_t n, int64_t heads, int64_t dim, rt::DataType type = rt::DataType::kHALF,
    void* data = fakeDevice(), rt::DeviceType device = rt::DeviceType::kGPU)
{
    return rt::Tensor(data, rt::Coords{n, heads, dim}, type, device);
}

rt::Tensor strided(int64_t n, int64_t heads, int64_t dim, int64_t tokenStride, int64_t headStride, int64_t dimStride,
    void* data = fakeDevice(), rt::DataType type = rt::DataType::kHALF)
{
    return rt::Tensor(
        data, rt::Coords{n, heads, dim}, rt::Coords{tokenStride, headStride, dimStride}, type, rt::DeviceType::kGPU);
}

detail::TokenOpPlan plan(rt::KVCacheLayout const& layout, int32_t layer, rt::Tensor const& k, rt::Tensor const& v,
    rt::TokenOpOptions const& options = {}, detail::TokenDirection direction = detail::TokenDirection::kWRITE)
{
    return detail::planTokenOp("writeTokens", layout, layer, k, v, options, direction);
}

TEST(TokenWriteValidationTest, ALayerOutsideTheCacheIsOutOfRange)
{
    rt::KVCacheLayout const layout = layoutOf(rt::DataType::kHALF);
    for (int32_t const layer : {-1, 3})
    {
        EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>([&] { plan(layout, layer, tokens(4, 2, 64), tokens(4, 2, 64)); },
            {"writeTokens", "layerIdx is " + std::to_string(layer), "[0, 3)", "numLayers"}));
    }
}

TEST(TokenWriteValidationTest, CachesOfEightBitTypesAreRefusedNamingTheType)
{
    for (rt::DataType const type :
        {rt::DataType::kFP8_E4M3, rt::DataType::kFP8_E5M2, rt::DataType::kINT8, rt::DataType::kUINT8})
    {
        rt::KVCacheLayout const layout = layoutOf(type);
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { plan(layout, 0, tokens(4, 2, 64), tokens(4, 2, 64)); },
            {"the cache's type is " + std::string(rt::dataTypeName(type)), "float32, float16 or bfloat16"}));
    }
}

TEST(TokenWriteValidationTest, QuantizedCachesPlanAWarpAHeadAndRefuseHeadsThatAreNotWholeBlocks)
{
    struct Case
    {
        rt::KVQuantization quantization;
        rt::DataType storage;
    };
    for (Case const format : {Case{rt::KVQuantization::kFP8_PER_TENSOR, rt::DataType::kFP8_E4M3},
             Case{rt::KVQuantization::kFP8_PER_TOKEN_HEAD, rt::DataType::kFP8_E4M3},
             Case{rt::KVQuantization::kNVFP4, rt::DataType::kUINT8}})
    {
        SCOPED_TRACE(std::string(rt::kvQuantizationName(format.quantization)));
        // Head sizes against the values a lane takes (float16 tensors: 16, two 16-byte vectors, unless 32 lanes of
        // 16 do not cover the head: then the fewest powers of two that do), the lanes a head takes (a power of two
        // covering it: 16 / 16 = 1, 64 / 16 = 4, 80 / 16 = 5 -> 8, 128 / 16 = 8, 256 / 16 = 16, 528 / 32 = 16.5 ->
        // 32) and the groups of heads in grid y (one group where a warp holds every head; 40 heads of 8 lanes, four a
        // warp: 10 groups).
        std::vector<rt::KVLayerConfig> const layers{
            {2, 16}, {1, 64}, {1, 80}, {3, 128}, {1, 256}, {1, 528}, {1, 1024}, {40, 128}};
        int32_t const perLane[] = {16, 16, 16, 16, 16, 32, 32, 16};
        int32_t const perLaneFloat[] = {8, 8, 8, 8, 8, 32, 32, 8};
        int32_t const laneShift[] = {0, 2, 3, 3, 4, 5, 5, 3};
        int32_t const gridY[] = {1, 1, 1, 1, 1, 1, 1, 10};
        rt::KVCacheLayout const layout = quantizedLayoutOf(layers, format.quantization, format.storage);
        for (int32_t layer = 0; layer < static_cast<int32_t>(layers.size()); ++layer)
        {
            int32_t const heads = layers[static_cast<size_t>(layer)].numKVHeads;
            int32_t const dim = layers[static_cast<size_t>(layer)].headDim;
            detail::TokenOpPlan const p = plan(layout, layer, tokens(5, heads, dim), tokens(5, heads, dim));
            EXPECT_EQ(p.quantization, format.quantization);
            EXPECT_EQ(p.valuesPerLane, perLane[layer]) << "headDim " << dim;
            EXPECT_GE(p.valuesPerLane * 32, dim);
            EXPECT_EQ(p.laneShift, laneShift[layer]) << "headDim " << dim;
            EXPECT_GE(p.valuesPerLane << p.laneShift, dim) << "the lanes of a head cover it";
            EXPECT_EQ(p.gridY, gridY[layer]) << "heads " << heads;
            // float32 tensors: 8 values (32 bytes) a lane.
            detail::TokenOpPlan const wide = plan(layout, layer, tokens(5, heads, dim, rt::DataType::kFLOAT),
                tokens(5, heads, dim, rt::DataType::kFLOAT));
            EXPECT_EQ(wide.valuesPerLane, perLaneFloat[layer]) << "headDim " << dim;
            EXPECT_TRUE(p.quantVectors);
            EXPECT_EQ(p.blockX, 32);
            EXPECT_EQ(p.gridX, (5 + p.blockY - 1) / p.blockY) << "a warp a token";
            // NVFP4 codes of a 528-value head (264 bytes) start 8-byte aligned: a lane's 16 bytes are stored bytewise.
            EXPECT_EQ(p.codeVectors, !(format.quantization == rt::KVQuantization::kNVFP4 && dim == 528));
            // An odd token stride breaks the chunk alignment: element loads.
            EXPECT_FALSE(plan(layout, layer, strided(5, heads, dim, heads * dim + 1, dim, 1),
                strided(5, heads, dim, heads * dim + 1, dim, 1))
                             .quantVectors);
        }
        // A head past 32 lanes of the most values a lane takes is refused, not cut short.
        rt::KVCacheLayout const huge = quantizedLayoutOf({{1, 1040}}, format.quantization, format.storage);
        EXPECT_TRUE(
            throwsNaming<rt::InvalidArgumentError>([&] { plan(huge, 0, tokens(4, 1, 1040), tokens(4, 1, 1040)); },
                {"writeTokens", "layer 0 has headDim 1040", "up to 1024"}));
        if (format.quantization != rt::KVQuantization::kNVFP4) // NVFP4 configs already refuse such heads
        {
            rt::KVCacheLayout const odd = quantizedLayoutOf({{1, 72}}, format.quantization, format.storage);
            EXPECT_TRUE(
                throwsNaming<rt::InvalidArgumentError>([&] { plan(odd, 0, tokens(4, 1, 72), tokens(4, 1, 72)); },
                    {"writeTokens", "layer 0 has headDim 72", "multiples of 16"}));
        }
    }
}

struct BadCall
{
    std::string name;
    std::function<void(rt::KVCacheLayout const&)> call;
    std::vector<std::string> named;
};

std::vector<BadCall> badCalls()
{
    rt::Tensor const good = tokens(4, 2, 64);
    rt::Tensor const latent = tokens(4, 1, 72);
    int64_t const huge = std::numeric_limits<int64_t>::max() / 2;
    auto write = [](int32_t layer, rt::Tensor k, rt::Tensor v, rt::TokenOpOptions options = {})
    { return [=](rt::KVCacheLayout const& layout) { plan(layout, layer, k, v, options); }; };
    return {
        {"group", write(0, good, good, {nullptr, nullptr, 1}), {"options.group is 1", "layer 0 belongs to group 0"}},
        {"rank",
            write(0, rt::Tensor(fakeDevice(), rt::Coords{4, 128}, rt::DataType::kHALF, rt::DeviceType::kGPU), good),
            {"k has 2 dimensions", "it must have 3", "numKVHeads 2", "headDim 64"}},
        {"heads", write(0, tokens(4, 3, 64), good), {"k has shape [4, 3, 64]", "layer 0 needs [capacity, 2, 64]"}},
        {"headDim", write(0, good, tokens(4, 2, 32)), {"v has shape [4, 2, 32]", "[capacity, 2, 64]"}},
        {"device", write(0, tokens(4, 2, 64, rt::DataType::kHALF, fakeDevice(), rt::DeviceType::kCPU), good),
            {"k is host memory", "kGPU"}},
        {"type", write(0, tokens(4, 2, 64, rt::DataType::kINT32), good),
            {"k has type int32", "float32, float16 or bfloat16"}},
        {"fp8 input", write(0, good, tokens(4, 2, 64, rt::DataType::kFP8_E4M3)), {"v has type fp8_e4m3"}},
        {"last stride", write(0, strided(4, 2, 64, 256, 128, 2), good), {"k's stride over headDim is 2", "must be 1"}},
        {"negative stride", write(0, good, strided(4, 2, 64, -128, 64, 1)),
            {"v has strides [-128, 64, 1]", "must be >= 0"}},
        {"overflowing stride", write(0, strided(4, 2, 64, huge, 64, 1), good),
            {"k's last element lies more than", "elements from its start"}},
        {"null k", write(0, tokens(4, 2, 64, rt::DataType::kHALF, nullptr), good),
            {"k is null with 4 tokens", "device memory"}},
        {"null v", write(0, good, tokens(4, 2, 64, rt::DataType::kHALF, nullptr)), {"v is null with 4 tokens"}},
        {"v for latent", write(2, latent, latent), {"v is given for layer 2, a latent layer", "empty Tensor"}},
        {"missing v", write(0, good, rt::Tensor()), {"v has 0 dimensions", "it must have 3"}},
        {"v type", write(0, good, tokens(4, 2, 64, rt::DataType::kBF16)),
            {"v is bfloat16 with 4 tokens", "it must match k: float16 with 4 tokens"}},
        {"v tokens", write(0, good, tokens(5, 2, 64)), {"v is float16 with 5 tokens", "float16 with 4 tokens"}},
        {"too many tokens", write(0, tokens(int64_t{1} << 31, 2, 64), good),
            {"k holds 2147483648 tokens", "the limit is 2147483647"}},
        {"strided output",
            [=](rt::KVCacheLayout const& layout)
            { plan(layout, 0, strided(4, 2, 64, 256, 64, 1), good, {}, detail::TokenDirection::kREAD); },
            {"output k has strides [256, 64, 1]", "it must be contiguous [128, 64, 1]"}},
    };
}

TEST(TokenWriteValidationTest, EveryBadArgumentIsRefusedNamingTheFieldTheValueAndTheLimit)
{
    rt::KVCacheLayout const layout = layoutOf(rt::DataType::kHALF);
    for (BadCall const& bad : badCalls())
    {
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { bad.call(layout); }, bad.named)) << bad.name;
    }
}

TEST(TokenWriteValidationTest, NullListsAndBadTablesAreRefused)
{
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([]
        { detail::validateTokenList("writeTokens", "deviceTokenAddresses", nullptr, 3); },
        {"deviceTokenAddresses is null with capacity 3", "3 device entries"}));
    EXPECT_NO_THROW(detail::validateTokenList("writeTokens", "deviceTokenAddresses", nullptr, 0));
    int32_t const some[2] = {0, 0};
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            detail::validatePageTable("writeTokens", rt::DevicePageTable{some, some, nullptr, -1});
        },
        {"table.numSequences is -1", ">= 0"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            detail::validatePageTable("writeTokens", rt::DevicePageTable{nullptr, some, nullptr, 1});
        },
        {"table.indptr is null"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            detail::validatePageTable("writeTokens", rt::DevicePageTable{some, nullptr, nullptr, 1});
        },
        {"table.indices is null"}));
}

TEST(TokenWritePlanTest, VectorsWhereShapesAndStridesAllowThemElementsElsewhere)
{
    rt::KVCacheLayout const layout = layoutOf(rt::DataType::kHALF);
    // 16 bytes of float16: 8 elements a thread, 2 heads of 8 chunks a token, 16 tokens a block.
    detail::TokenOpPlan const packed = plan(layout, 0, tokens(100, 2, 64), tokens(100, 2, 64));
    EXPECT_EQ(std::make_tuple(packed.vectorElems, packed.chunksPerToken, packed.blockX, packed.blockY, packed.gridX),
        std::make_tuple(8, 16, 16, 16, int64_t{7}))
        << "vector elements, chunks a token, block x and y, blocks";
    EXPECT_TRUE(packed.hasV);
    // Strides in multiples of 8 keep vectors (float32 input, so 32 bytes read a chunk).
    EXPECT_EQ(plan(layout, 0, strided(3, 2, 64, 200, 96, 1, fakeDevice(), rt::DataType::kFLOAT),
                  strided(3, 2, 64, 128, 64, 1, fakeDevice(), rt::DataType::kFLOAT))
                  .vectorElems,
        8);
    EXPECT_EQ(plan(layout, 0, strided(3, 2, 64, 129, 64, 1), tokens(3, 2, 64)).vectorElems, 1) << "odd token stride";
    EXPECT_EQ(plan(layout, 0, tokens(3, 2, 64), strided(3, 2, 64, 128, 68, 1)).vectorElems, 1) << "head stride 68";
    EXPECT_EQ(plan(layout, 0, tokens(3, 2, 64, rt::DataType::kHALF, fakeDevice(2)), tokens(3, 2, 64)).vectorElems, 1)
        << "a pointer off 16 bytes";
    // The latent layer: 72 elements are 9 chunks, so 16 lanes a token; no V.
    detail::TokenOpPlan const latent = plan(layout, 2, tokens(5, 1, 72), rt::Tensor());
    EXPECT_FALSE(latent.hasV);
    EXPECT_EQ(latent.vectorElems, 8);
    EXPECT_EQ(latent.blockX, 16);
    // float32 cache: 4 elements a chunk; 1 x 128 is 32 chunks, a warp a token.
    detail::TokenOpPlan const wide = plan(layoutOf(rt::DataType::kFLOAT), 1, tokens(9, 1, 128, rt::DataType::kBF16),
        tokens(9, 1, 128, rt::DataType::kBF16));
    EXPECT_EQ(wide.vectorElems, 4);
    EXPECT_EQ(wide.blockX, 32);
    EXPECT_EQ(wide.blockY, 8);
    EXPECT_EQ(wide.gridX, 2);
    EXPECT_EQ(
        plan(layout, 0, tokens(0, 2, 64, rt::DataType::kHALF, nullptr), tokens(0, 2, 64, rt::DataType::kHALF, nullptr))
            .gridX,
        0)
        << "no tokens, no blocks (and null data is fine)";
}

TEST(TokenAddressTest, AddressesAreCheckedAgainstTheLayersPages)
{
    EXPECT_EQ(detail::checkTokenAddress(0, 10, 16), 0);
    EXPECT_EQ(detail::checkTokenAddress(159, 10, 16), 159);
    EXPECT_EQ(detail::checkTokenAddress(160, 10, 16), detail::kBAD_TOKEN);
    EXPECT_EQ(detail::checkTokenAddress(std::numeric_limits<int64_t>::max(), 10, 16), detail::kBAD_TOKEN);
    EXPECT_EQ(detail::checkTokenAddress(-1, 10, 16), detail::kSKIPPED_TOKEN);
    EXPECT_EQ(detail::checkTokenAddress(std::numeric_limits<int64_t>::min(), 10, 16), detail::kSKIPPED_TOKEN);
}

TEST(TokenAddressTest, TableLookupsMatchTheExpandedModelForRandomTables)
{
    std::mt19937_64 rng(7);
    constexpr int32_t kNUM_PAGES = 40;
    for (int32_t round = 0; round < 50; ++round)
    {
        int32_t const rowsCount = std::uniform_int_distribution<int32_t>(1, 6)(rng);
        std::vector<std::vector<int32_t>> rows;
        std::vector<int32_t> firstToken;
        std::vector<int32_t> indptr{0};
        std::vector<int32_t> indices;
        for (int32_t s = 0; s < rowsCount; ++s)
        {
            int32_t const pages = std::uniform_int_distribution<int32_t>(0, 5)(rng);
            std::vector<int32_t> row;
            for (int32_t j = 0; j < pages; ++j)
            {
                // Now and then an id outside the pool, which must be counted, never addressed.
                row.push_back(std::uniform_int_distribution<int32_t>(-2, kNUM_PAGES + 1)(rng));
            }
            firstToken.push_back(std::uniform_int_distribution<int32_t>(0, 3)(rng) * kTOKENS_PER_PAGE);
            indices.insert(indices.end(), row.begin(), row.end());
            indptr.push_back(static_cast<int32_t>(indices.size()));
            rows.push_back(row);
        }
        kvcache::test::TableAddressModel const model(rows, firstToken, kTOKENS_PER_PAGE, kNUM_PAGES);
        for (bool const withFirstTokens : {true, false})
        {
            std::vector<int32_t> const zeros(firstToken.size(), 0);
            kvcache::test::TableAddressModel const zeroModel(rows, zeros, kTOKENS_PER_PAGE, kNUM_PAGES);
            detail::TableRef const table{
                indptr.data(), indices.data(), withFirstTokens ? firstToken.data() : nullptr, rowsCount};
            for (int32_t s = -1; s <= rowsCount; ++s)
            {
                for (int32_t position = -2; position < 10 * kTOKENS_PER_PAGE; ++position)
                {
                    int64_t const got = detail::tableTokenAddress(table, s, position, kNUM_PAGES, kTOKENS_PER_PAGE);
                    std::optional<int64_t> const expected = (withFirstTokens ? model : zeroModel).address(s, position);
                    int64_t const want = s < 0 ? detail::kSKIPPED_TOKEN : expected.value_or(detail::kBAD_TOKEN);
                    ASSERT_EQ(got, want) << "sequence " << s << ", position " << position;
                }
            }
        }
    }
}

TEST(TokenWriteModelTest, TheConversionModelRoundsToNearestEven)
{
    using kvcache::test::floatToBfloat16;
    using kvcache::test::floatToHalf;
    EXPECT_EQ(floatToHalf(1.0F), 0x3C00);
    EXPECT_EQ(floatToHalf(-2.0F), 0xC000);
    EXPECT_EQ(floatToHalf(65504.0F), 0x7BFF);
    EXPECT_EQ(floatToHalf(65519.0F), 0x7BFF);
    EXPECT_EQ(floatToHalf(65520.0F), 0x7C00) << "the tie above the largest half rounds to infinity";
    EXPECT_EQ(floatToHalf(0x1p-24F), 0x0001);
    EXPECT_EQ(floatToHalf(0x1p-25F), 0x0000) << "a tie between 0 and the smallest subnormal goes to 0";
    EXPECT_EQ(floatToHalf(0x3p-25F), 0x0002) << "a tie between 1 and 2 units goes to 2";
    EXPECT_EQ(floatToHalf(1.0F + 0x1p-11F), 0x3C00) << "a tie goes to the even mantissa";
    EXPECT_EQ(floatToHalf(1.0F + 0x3p-11F), 0x3C02);
    EXPECT_EQ(floatToBfloat16(1.0F), 0x3F80);
    EXPECT_EQ(floatToBfloat16(1.0F + 0x1p-8F), 0x3F80);
    EXPECT_EQ(floatToBfloat16(1.0F + 0x3p-8F), 0x3F82);
    EXPECT_EQ(kvcache::test::halfToFloat(0x0001), 0x1p-24F);
    EXPECT_EQ(kvcache::test::halfToFloat(0xFBFF), -65504.0F);
}

TEST(TokenWriteModelTest, RoundedToKeepsNanAndInfinitiesAndRoundsOnceToTheStoredType)
{
    using kvcache::rt::DataType;
    using kvcache::test::floatToHalfWithNan;
    using kvcache::test::roundedTo;
    float const inf = std::numeric_limits<float>::infinity();
    float const nan = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(floatToHalfWithNan(nan), 0x7E00);
    EXPECT_EQ(floatToHalfWithNan(-inf), 0xFC00);
    EXPECT_EQ(floatToHalfWithNan(1.0F + 0x3p-11F), 0x3C02);
    EXPECT_TRUE(std::isnan(roundedTo(DataType::kHALF, nan)));
    EXPECT_TRUE(std::isnan(roundedTo(DataType::kBF16, nan)));
    EXPECT_EQ(roundedTo(DataType::kHALF, inf), inf);
    EXPECT_EQ(roundedTo(DataType::kBF16, -inf), -inf);
    EXPECT_EQ(roundedTo(DataType::kHALF, 1.0F + 0x1p-12F), 1.0F);
    EXPECT_EQ(roundedTo(DataType::kHALF, 1.0F + 0x3p-11F), 1.0F + 0x1p-9F);
    EXPECT_EQ(roundedTo(DataType::kBF16, 1.0F + 0x3p-8F), 1.0F + 0x1p-6F);
    EXPECT_EQ(roundedTo(DataType::kFLOAT, 1.0F + 0x1p-23F), 1.0F + 0x1p-23F);
}

} // namespace
