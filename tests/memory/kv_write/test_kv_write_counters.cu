// The quantizing write's counters on a GPU (docs/layout.md, "Calibration"): the amax of the values written and the
// values that saturated, per layer half, for FP8 per tensor, FP8 per token and head and NVFP4, against counts worked
// out on the host from the inputs with the rules' quotients (support/quantize_reference.h gives the page scales); with
// calibrated scales, with scales four times too small (so values saturate), with infinities and NaN among the values,
// float32 and float16 inputs, a latent layer (its V counters untouched) and the page-table form. The counters start
// from values that are not zero and accumulate over two writes; skipped, bad and uncounted tokens hold the largest
// values (1000 times the others) and must not count. The pages written with counters equal those written without. A
// write of more tokens than the device runs at once counts each of them.

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/kv_write.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/gpu_test.h"
#include "support/layout_model.h"
#include "support/quantize_reference.h"
#include "support/scaled_configs.h"
#include "support/token_write_model.h"

namespace kvcache::test
{
namespace
{

using Q = rt::KVQuantization;

using WriteCountersTest = GpuTest;

constexpr int32_t kTOKENS_PER_PAGE = 16;
constexpr int kPOISON_BYTE = 0x7B;
constexpr int32_t kTOKENS = 40;
//! Tokens the device count lets through; the rest are neither written nor counted.
constexpr int32_t kCOUNTED = kTOKENS - 4;
constexpr int32_t kSKIPPED_TOKEN = 6;
constexpr int32_t kBAD_TOKEN = 11;
//! How much larger the skipped, bad and uncounted tokens' values are: far past every written value, and finite in
//! float16.
constexpr float kUNWRITTEN_MAGNITUDE = 1.0e3F;
//! The special values of the written token 3: NaN and infinities (left out of the amax; an infinity saturates).
constexpr int32_t kSPECIAL_TOKEN = 3;

//! Layer 0: 2 heads of 64 (full attention); layer 1: latent, 1 head of 96.
std::vector<rt::KVLayerConfig> const kLAYERS{{2, 64}, {1, 96, 0, rt::KVLayerKind::kLATENT}};

//! What the counters start from: not zero, so that a write that overwrote them instead of raising them shows.
constexpr rt::WriteCounters kSTART{0.5F, 0.25F, 1000, 2000};

//! One input half [kTOKENS, heads, dim]: normal values times `magnitude`, the unwritten tokens 1e4 times larger, and
//! NaN, +inf and -inf on the special token when `specials` (its first three values of head 0 for one head).
std::vector<float> makeValues(
    rt::DataType type, int32_t heads, int32_t dim, float magnitude, bool specials, uint64_t seed)
{
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0F, 1.0F);
    std::vector<float> values(static_cast<size_t>(kTOKENS) * static_cast<size_t>(heads) * static_cast<size_t>(dim));
    for (int32_t t = 0; t < kTOKENS; ++t)
    {
        bool const unwritten = t == kSKIPPED_TOKEN || t == kBAD_TOKEN || t >= kCOUNTED;
        for (size_t i = 0; i < static_cast<size_t>(heads * dim); ++i)
        {
            float const x = normal(rng) * magnitude * (unwritten ? kUNWRITTEN_MAGNITUDE : 1.0F);
            values[static_cast<size_t>(t) * static_cast<size_t>(heads * dim) + i] = roundedTo(type, x);
        }
    }
    if (specials)
    {
        float* const token = values.data() + static_cast<size_t>(kSPECIAL_TOKEN) * static_cast<size_t>(heads * dim);
        token[0] = std::numeric_limits<float>::quiet_NaN();
        token[1] = std::numeric_limits<float>::infinity();
        token[heads > 1 ? dim + 2 : 2] = -std::numeric_limits<float>::infinity();
    }
    return values;
}

//! `values` in `type`, contiguous, uploaded.
DeviceArray<uint8_t> upload(std::vector<float> const& values, rt::DataType type, cudaStream_t stream)
{
    size_t const bytesPer = type == rt::DataType::kHALF ? 2 : 4;
    std::vector<uint8_t> bytes(values.size() * bytesPer);
    for (size_t i = 0; i < values.size(); ++i)
    {
        if (type == rt::DataType::kHALF)
        {
            uint16_t const half = floatToHalfWithNan(values[i]);
            std::memcpy(bytes.data() + i * 2, &half, 2);
        }
        else
        {
            std::memcpy(bytes.data() + i * 4, &values[i], 4);
        }
    }
    return DeviceArray<uint8_t>(bytes, stream);
}

bool written(int32_t t)
{
    return t < kCOUNTED && t != kSKIPPED_TOKEN && t != kBAD_TOKEN;
}

//! The quotient store(x, d) encodes (docs/layout.md): x / d, or for d = 0 x itself when not finite, else 0.
float storedQuotient(float x, float d)
{
    return d > 0.0F ? x / d : (std::isfinite(x) ? 0.0F : x);
}

//! One half's expected counters: amax over the written tokens' finite values, and the values whose quotient lies past
//! the largest code's rounding interval (E4M3: > 464, halfway from 448 to the 480 it lacks, a tie going to 448; E2M1:
//! >= 7, halfway from 6 to 8, a tie going to 8).
struct Observed
{
    float amax = 0.0F;
    uint64_t saturated = 0;
};

//! Over the first `tokens` tokens of `values`, those `counts` takes.
Observed expectedHalf(Q quantization, float hostScale, std::vector<float> const& values, int32_t heads, int32_t dim,
    int32_t tokens = kTOKENS, bool (*counts)(int32_t) = written)
{
    Observed observed;
    for (int32_t t = 0; t < tokens; ++t)
    {
        if (!counts(t))
        {
            continue;
        }
        for (int32_t h = 0; h < heads; ++h)
        {
            auto const first = values.begin() + (static_cast<int64_t>(t) * heads + h) * dim;
            std::vector<float> const head(first, first + dim);
            observed.amax = std::max(observed.amax, quant::finiteAmax(head.data(), head.size()));
            if (quantization == Q::kNVFP4)
            {
                quant::Nvfp4Head const q = quant::quantizeNvfp4Head(head, hostScale);
                for (int32_t d = 0; d < dim; ++d)
                {
                    float const divisor = quant::decodeE4M3(q.blockScales[static_cast<size_t>(d / 16)]) * hostScale;
                    observed.saturated += std::fabs(storedQuotient(head[static_cast<size_t>(d)], divisor)) >= 7.0F;
                }
                continue;
            }
            float const divisor =
                quantization == Q::kFP8_PER_TOKEN_HEAD ? quant::quantizeFp8TokenHead(head).scale : hostScale;
            for (float const x : head)
            {
                observed.saturated += std::fabs(storedQuotient(x, divisor)) > 464.0F;
            }
        }
    }
    return observed;
}

struct Case
{
    char const* name;
    rt::DataType type;
    //! The host scales over the calibrated ones (amax / 448, amax / 2688): 1, or 1/4 so that values saturate.
    float scaleFactor;
    bool specials;
    bool table; //!< the page-table form instead of token addresses
};

constexpr Case kCASES[] = {
    {"calibrated float32", rt::DataType::kFLOAT, 1.0F, false, false},
    {"scales too small float16", rt::DataType::kHALF, 0.25F, false, false},
    {"scales too small float32 with NaN and infinities", rt::DataType::kFLOAT, 0.25F, true, false},
    {"calibrated float16 with NaN and infinities, page table", rt::DataType::kHALF, 1.0F, true, true},
};

std::vector<uint8_t> poolBytes(rt::KVCacheManager const& cache, int32_t layer, cudaStream_t stream)
{
    auto const model = modelLayout(cache.getConfig());
    auto const& sizes = model.layers[static_cast<size_t>(layer)];
    std::vector<uint8_t> bytes = downloadBytes(cache.kPoolPtr(layer), sizes.layerBytes, stream);
    if (sizes.scaleBytes > 0)
    {
        std::vector<uint8_t> const scales = downloadBytes(cache.layerRef(layer).kScalePool, sizes.scaleBytes, stream);
        bytes.insert(bytes.end(), scales.begin(), scales.end());
    }
    return bytes;
}

void poison(rt::KVCacheManager const& cache, int32_t layer, cudaStream_t stream)
{
    auto const model = modelLayout(cache.getConfig());
    auto const& sizes = model.layers[static_cast<size_t>(layer)];
    KVCACHE_CUDA_TRY(
        cudaMemsetAsync(cache.kPoolPtr(layer), kPOISON_BYTE, static_cast<size_t>(sizes.layerBytes), stream));
    if (sizes.scaleBytes > 0)
    {
        KVCACHE_CUDA_TRY(cudaMemsetAsync(
            cache.layerRef(layer).kScalePool, kPOISON_BYTE, static_cast<size_t>(sizes.scaleBytes), stream));
    }
}

TEST_F(WriteCountersTest, CountersHoldTheAmaxAndTheSaturatedValuesWorkedOutOnTheHost)
{
    for (ScaledFormat const format : kQUANTIZED_FORMATS)
    {
        for (Case const& c : kCASES)
        {
            for (int32_t layer = 0; layer < static_cast<int32_t>(kLAYERS.size()); ++layer)
            {
                SCOPED_TRACE(std::string(rt::kvQuantizationName(format.quantization)) + ", " + c.name + ", layer "
                    + std::to_string(layer));
                CudaStream stream;
                rt::KVCacheManager cache(ConfigBuilder(kLAYERS)
                                             .maxBatchSize(2)
                                             .maxSequenceLength(64)
                                             .tokensPerPage(kTOKENS_PER_PAGE)
                                             .dataType(format.storage)
                                             .quantization(format.quantization)
                                             .build(),
                    stream.get());
                rt::LayerRef const ref = cache.layerRef(layer);
                bool const hasV = layer == 0;
                int32_t const heads = ref.numKVHeads;
                int32_t const dim = ref.headDim;
                // K ~ N(0, 1), V ~ N(0, 9): distinct halves, distinct amax.
                uint64_t const seed = static_cast<uint64_t>(layer * 10 + (&c - kCASES));
                std::vector<float> const k = makeValues(c.type, heads, dim, 1.0F, c.specials, seed);
                std::vector<float> const v = makeValues(c.type, heads, dim, 3.0F, c.specials, seed + 100);
                Observed const kTrue = expectedHalf(Q::kNONE, 1.0F, k, heads, dim);
                Observed const vTrue = expectedHalf(Q::kNONE, 1.0F, v, heads, dim);
                rt::LayerScales scales;
                if (format.quantization != Q::kFP8_PER_TOKEN_HEAD)
                {
                    float const divisor = format.quantization == Q::kNVFP4 ? 448.0F * 6.0F : 448.0F;
                    scales = {kTrue.amax / divisor * c.scaleFactor, vTrue.amax / divisor * c.scaleFactor};
                    cache.setLayerScales(layer, scales);
                }
                Observed const kExpected = expectedHalf(format.quantization, scales.k, k, heads, dim);
                Observed const vExpected = expectedHalf(format.quantization, scales.v, v, heads, dim);
                if (c.scaleFactor < 1.0F && format.quantization != Q::kFP8_PER_TOKEN_HEAD)
                {
                    ASSERT_GT(kExpected.saturated, 0U) << "scales four times too small must clip some values";
                }

                DeviceArray<uint8_t> const kIn = upload(k, c.type, stream.get());
                DeviceArray<uint8_t> const vIn = upload(v, c.type, stream.get());
                rt::Coords const shape{kTOKENS, heads, dim};
                rt::Tensor const kTensor(kIn.get(), shape, c.type, rt::DeviceType::kGPU);
                rt::Tensor const vTensor =
                    hasV ? rt::Tensor(vIn.get(), shape, c.type, rt::DeviceType::kGPU) : rt::Tensor();
                // Distinct addresses; one skipped, one past the pages.
                std::vector<int64_t> addresses(static_cast<size_t>(ref.numPages) * kTOKENS_PER_PAGE);
                std::iota(addresses.begin(), addresses.end(), 0);
                std::shuffle(addresses.begin(), addresses.end(), std::mt19937_64(seed));
                addresses.resize(kTOKENS);
                addresses[kSKIPPED_TOKEN] = -1;
                addresses[kBAD_TOKEN] = int64_t{ref.numPages} * kTOKENS_PER_PAGE;
                DeviceArray<int64_t> const deviceAddresses(addresses, stream.get());
                // The same tokens as (row, position) pairs of a table whose row r holds pages [r * 4, r * 4 + 4):
                // address a is row a / 64, position a % 64; the bad one a row past the table, the skipped one -1.
                std::vector<int32_t> indptr{0, 4, 8};
                std::vector<int32_t> indices(8);
                std::iota(indices.begin(), indices.end(), 0);
                std::vector<rt::TokenPosition> positions(kTOKENS);
                for (size_t t = 0; t < positions.size(); ++t)
                {
                    int64_t const a = addresses[t];
                    positions[t] = a < 0
                        ? rt::TokenPosition{-1, 0}
                        : rt::TokenPosition{static_cast<int32_t>(a / 64), static_cast<int32_t>(a % 64)};
                }
                ASSERT_EQ(ref.numPages, 8) << "the table's rows cover the pages";
                DeviceArray<int32_t> const deviceIndptr(indptr, stream.get());
                DeviceArray<int32_t> const deviceIndices(indices, stream.get());
                DeviceArray<rt::TokenPosition> const devicePositions(positions, stream.get());
                rt::DevicePageTable const table{deviceIndptr.get(), deviceIndices.get(), nullptr, 2};
                DeviceArray<int32_t> const count(std::vector<int32_t>{kCOUNTED}, stream.get());
                DeviceArray<rt::WriteCounters> counters(std::vector<rt::WriteCounters>{kSTART}, stream.get());

                auto const write = [&](rt::WriteCounters* deviceCounters)
                {
                    rt::TokenOpOptions options;
                    options.deviceCount = count.get();
                    options.deviceCounters = deviceCounters;
                    if (c.table)
                    {
                        rt::writeTokens(
                            cache, layer, kTensor, vTensor, table, devicePositions.get(), stream.get(), options);
                    }
                    else
                    {
                        rt::writeTokens(cache, layer, kTensor, vTensor, deviceAddresses.get(), stream.get(), options);
                    }
                };
                poison(cache, layer, stream.get());
                write(nullptr);
                std::vector<uint8_t> const without = poolBytes(cache, layer, stream.get());
                poison(cache, layer, stream.get());
                write(counters.get());
                EXPECT_EQ(poolBytes(cache, layer, stream.get()), without) << "counting changed what was written";
                // A second write of the same tokens: the amax stays, the counts double.
                write(counters.get());
                rt::WriteCounters const got = counters.download(stream.get())[0];

                EXPECT_EQ(got.kAmax, std::max(kSTART.kAmax, kExpected.amax));
                EXPECT_EQ(got.kSaturated, kSTART.kSaturated + 2 * kExpected.saturated);
                if (hasV)
                {
                    EXPECT_EQ(got.vAmax, std::max(kSTART.vAmax, vExpected.amax));
                    EXPECT_EQ(got.vSaturated, kSTART.vSaturated + 2 * vExpected.saturated);
                }
                else
                {
                    EXPECT_EQ(got.vAmax, kSTART.vAmax) << "a latent layer has no V to count";
                    EXPECT_EQ(got.vSaturated, kSTART.vSaturated);
                }
                // The amax is a written value's, well below the unwritten tokens' (1000 times larger).
                EXPECT_LT(got.kAmax, 100.0F);
                if (format.quantization == Q::kFP8_PER_TOKEN_HEAD)
                {
                    // amax / 448 puts every finite value inside E4M3's range: only infinities clip.
                    uint64_t const infinities = c.specials ? 2 : 0;
                    EXPECT_EQ(kExpected.saturated, infinities);
                }
            }
        }
    }
}

TEST_F(WriteCountersTest, AWriteOfMoreTokensThanTheDeviceRunsAtOnceCountsEveryToken)
{
    // Four times as many tokens as the device has warps in flight at most: the counted kernel's blocks each stride over
    // several tokens. The largest values lie on the last token, and with scales four times too small values saturate
    // all along the write.
    int device = 0;
    KVCACHE_CUDA_TRY(cudaGetDevice(&device));
    int multiprocessors = 0;
    int threadsPerMultiprocessor = 0;
    KVCACHE_CUDA_TRY(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
    KVCACHE_CUDA_TRY(cudaDeviceGetAttribute(&threadsPerMultiprocessor, cudaDevAttrMaxThreadsPerMultiProcessor, device));
    int32_t const tokens = 4 * multiprocessors * (threadsPerMultiprocessor / 32);
    constexpr int32_t kDIM = 16;
    for (ScaledFormat const format : kQUANTIZED_FORMATS)
    {
        SCOPED_TRACE(rt::kvQuantizationName(format.quantization));
        CudaStream stream;
        rt::KVCacheManager cache(ConfigBuilder({{1, kDIM}})
                                     .maxBatchSize(1)
                                     .maxSequenceLength(tokens)
                                     .tokensPerPage(kTOKENS_PER_PAGE)
                                     .dataType(format.storage)
                                     .quantization(format.quantization)
                                     .build(),
            stream.get());
        std::mt19937_64 rng(static_cast<uint64_t>(tokens));
        std::normal_distribution<float> normal(0.0F, 1.0F);
        std::vector<float> k(static_cast<size_t>(tokens) * kDIM);
        std::vector<float> v(k.size());
        for (size_t i = 0; i < k.size(); ++i)
        {
            k[i] = normal(rng);
            v[i] = 3.0F * normal(rng);
        }
        size_t const last = static_cast<size_t>(tokens - 1) * kDIM;
        k[last + 5] = 40.0F;
        v[last + 9] = -90.0F;
        auto const every = [](int32_t) { return true; };
        Observed const kTrue = expectedHalf(Q::kNONE, 1.0F, k, 1, kDIM, tokens, every);
        Observed const vTrue = expectedHalf(Q::kNONE, 1.0F, v, 1, kDIM, tokens, every);
        ASSERT_EQ(kTrue.amax, 40.0F);
        ASSERT_EQ(vTrue.amax, 90.0F);
        rt::LayerScales scales;
        if (format.quantization != Q::kFP8_PER_TOKEN_HEAD)
        {
            // A quarter of the calibrated scales of the values before the last token (amax about 5 and 15).
            float const divisor = format.quantization == Q::kNVFP4 ? 448.0F * 6.0F : 448.0F;
            scales = {5.0F / divisor / 4.0F, 15.0F / divisor / 4.0F};
            cache.setLayerScales(0, scales);
        }
        Observed const kExpected = expectedHalf(format.quantization, scales.k, k, 1, kDIM, tokens, every);
        Observed const vExpected = expectedHalf(format.quantization, scales.v, v, 1, kDIM, tokens, every);
        if (format.quantization != Q::kFP8_PER_TOKEN_HEAD)
        {
            ASSERT_GT(kExpected.saturated, 1000U);
            ASSERT_GT(vExpected.saturated, 1000U);
        }

        DeviceArray<uint8_t> const kIn = upload(k, rt::DataType::kFLOAT, stream.get());
        DeviceArray<uint8_t> const vIn = upload(v, rt::DataType::kFLOAT, stream.get());
        rt::Coords const shape{tokens, 1, kDIM};
        rt::Tensor const kTensor(kIn.get(), shape, rt::DataType::kFLOAT, rt::DeviceType::kGPU);
        rt::Tensor const vTensor(vIn.get(), shape, rt::DataType::kFLOAT, rt::DeviceType::kGPU);
        // Every token its own slot, in a shuffled order.
        std::vector<int64_t> addresses(static_cast<size_t>(tokens));
        std::iota(addresses.begin(), addresses.end(), 0);
        std::shuffle(addresses.begin(), addresses.end(), rng);
        DeviceArray<int64_t> const deviceAddresses(addresses, stream.get());
        DeviceArray<rt::WriteCounters> counters(std::vector<rt::WriteCounters>{kSTART}, stream.get());
        auto const write = [&](rt::WriteCounters* deviceCounters)
        {
            rt::TokenOpOptions options;
            options.deviceCounters = deviceCounters;
            rt::writeTokens(cache, 0, kTensor, vTensor, deviceAddresses.get(), stream.get(), options);
        };
        poison(cache, 0, stream.get());
        write(nullptr);
        std::vector<uint8_t> const without = poolBytes(cache, 0, stream.get());
        poison(cache, 0, stream.get());
        write(counters.get());
        EXPECT_EQ(poolBytes(cache, 0, stream.get()), without) << "counting changed what was written";
        rt::WriteCounters const got = counters.download(stream.get())[0];
        EXPECT_EQ(got.kAmax, 40.0F);
        EXPECT_EQ(got.vAmax, 90.0F);
        EXPECT_EQ(got.kSaturated, kSTART.kSaturated + kExpected.saturated);
        EXPECT_EQ(got.vSaturated, kSTART.vSaturated + vExpected.saturated);
    }
}

TEST_F(WriteCountersTest, CalibrationFromTheCountersLandsTheLargestValueOnTheLargestCode)
{
    // FP8 per tensor: after calibrating from the counters, the value of largest magnitude stores as 448 (0x7E).
    CudaStream stream;
    rt::KVCacheManager cache(ConfigBuilder({{1, 32}})
                                 .maxBatchSize(1)
                                 .maxSequenceLength(16)
                                 .tokensPerPage(kTOKENS_PER_PAGE)
                                 .dataType(rt::DataType::kFP8_E4M3)
                                 .quantization(Q::kFP8_PER_TENSOR)
                                 .build(),
        stream.get());
    std::vector<float> k(32);
    std::vector<float> v(32);
    for (size_t i = 0; i < 32; ++i)
    {
        k[i] = 0.1F * static_cast<float>(i) - 1.0F;  // from -1 to 2.1: amax 2.1, at 31
        v[i] = -0.3F * static_cast<float>(i) + 0.5F; // from 0.5 to -8.8: amax 8.8, at 31
    }
    DeviceArray<uint8_t> const kIn = upload(k, rt::DataType::kFLOAT, stream.get());
    DeviceArray<uint8_t> const vIn = upload(v, rt::DataType::kFLOAT, stream.get());
    rt::Tensor const kTensor(kIn.get(), rt::Coords{1, 1, 32}, rt::DataType::kFLOAT, rt::DeviceType::kGPU);
    rt::Tensor const vTensor(vIn.get(), rt::Coords{1, 1, 32}, rt::DataType::kFLOAT, rt::DeviceType::kGPU);
    DeviceArray<int64_t> const address(std::vector<int64_t>{5}, stream.get());
    DeviceArray<rt::WriteCounters> counters(std::vector<rt::WriteCounters>{rt::WriteCounters{}}, stream.get());
    rt::TokenOpOptions options;
    options.deviceCounters = counters.get();
    rt::writeTokens(cache, 0, kTensor, vTensor, address.get(), stream.get(), options);
    rt::WriteCounters const observed = counters.download(stream.get())[0];
    EXPECT_EQ(observed.kAmax, k[31]);
    EXPECT_EQ(observed.vAmax, -v[31]);
    rt::calibrateLayerScales(cache, 0, observed);
    EXPECT_EQ(cache.layerScales(0).k, k[31] / 448.0F);
    EXPECT_EQ(cache.layerScales(0).v, -v[31] / 448.0F);
    rt::writeTokens(cache, 0, kTensor, vTensor, address.get(), stream.get());
    rt::LayerRef const ref = cache.layerRef(0);
    std::vector<uint8_t> const pool =
        downloadBytes(cache.kPoolPtr(0), 2 * int64_t{ref.numPages} * ref.pageStride, stream.get());
    int64_t const at = ref.offset(0, 5, 0);
    EXPECT_EQ(pool[static_cast<size_t>(at + 31)], 0x7E) << "K's largest value stores as +448";
    EXPECT_EQ(pool[static_cast<size_t>(ref.numPages * ref.pageStride + at + 31)], 0xFE) << "V's as -448";
}

} // namespace
} // namespace kvcache::test
