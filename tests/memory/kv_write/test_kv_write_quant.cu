// The quantizing token write and its dequantizing read-back on a GPU, byte for byte against the host reference of the
// quantization rules (support/quantize_reference.h): FP8 per tensor, FP8 per token and head, NVFP4; float32, float16
// and bfloat16 inputs, packed (chunk loads) and strided (element loads); a full-attention layer, a windowed one, a
// latent one (no V) and a head of 528 values (the last lane holds half its values); NaN, infinities, -0, subnormal and
// saturating values, a head of zeros and one with no finite value; skipped, bad and uncounted tokens leave the
// poisoned pages and scales untouched; and the page-table form writes what the address form writes.

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

using QuantWriteTest = GpuTest;

constexpr int32_t kTOKENS_PER_PAGE = 16;
constexpr int kPOISON_BYTE = 0x7B;
constexpr int32_t kTOKENS = 24;
//! Tokens the device count lets through: the last ones are never written.
constexpr int32_t kCOUNTED = kTOKENS - 3;
constexpr int32_t kSKIPPED_TOKENS[] = {5, 9};
constexpr int32_t kBAD_TOKEN = 7;
//! A bad address past the count: neither written nor counted (the kernel loads it before it compares the count).
constexpr int32_t kUNCOUNTED_BAD_TOKEN = kTOKENS - 2;

constexpr rt::DataType kINPUT_TYPES[] = {rt::DataType::kFLOAT, rt::DataType::kHALF, rt::DataType::kBF16};

//! Full attention 2 x 128 (fewer heads than a warp holds: idle lanes); window 32, 1 x 64 (its own group); latent
//! 1 x 48; full attention 3 x 528 (a head a warp: three groups of heads in grid y).
std::vector<rt::KVLayerConfig> const kLAYERS{{2, 128}, {1, 64, 32}, {1, 48, 0, rt::KVLayerKind::kLATENT}, {3, 528}};

bool hasV(int32_t layer)
{
    return layer != 2;
}

//! The values of one input half [kTOKENS, heads, dim], as floats representable in `type`: magnitudes from 1e-3 to 3e3
//! by (token, head), and the special cases on tokens 0-2.
std::vector<float> makeValues(rt::DataType type, int32_t heads, int32_t headDim, uint64_t seed)
{
    // Sizes as size_t: GCC 13 sees a possibly negative int32 length in the fills below and warns.
    auto const dim = static_cast<size_t>(std::max(headDim, 1));
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0F, 1.0F);
    constexpr float kMAGNITUDES[] = {1e-3F, 1.0F, 50.0F, 3000.0F};
    std::vector<float> values(static_cast<size_t>(kTOKENS) * static_cast<size_t>(std::max(heads, 1)) * dim);
    float const inf = std::numeric_limits<float>::infinity();
    float const nan = std::numeric_limits<float>::quiet_NaN();
    for (int32_t t = 0; t < kTOKENS; ++t)
    {
        for (int32_t h = 0; h < heads; ++h)
        {
            float const magnitude = kMAGNITUDES[(t + h) % 4];
            float* const head = values.data() + (static_cast<size_t>(t) * static_cast<size_t>(heads) + h) * dim;
            for (size_t d = 0; d < dim; ++d)
            {
                head[d] = roundedTo(type, normal(rng) * magnitude);
            }
            if (t == 0)
            {
                float const specials[] = {nan, inf, -inf, -0.0F, 1e-30F, 4.0e4F, -7.5e3F};
                std::transform(
                    std::begin(specials), std::end(specials), head, [&](float x) { return roundedTo(type, x); });
            }
            if (t == 1)
            {
                std::fill(head, head + dim, 0.0F);
            }
            if (t == 2)
            {
                for (size_t d = 0; d < dim; ++d)
                {
                    head[d] = d % 3 == 0 ? nan : (d % 3 == 1 ? inf : -inf);
                }
            }
        }
    }
    return values;
}

//! `values` in `type`, each token `tokenStride` elements from the last (padding poisoned), uploaded.
DeviceArray<uint8_t> uploadInput(
    std::vector<float> const& values, rt::DataType type, int64_t rowElems, int64_t tokenStride, cudaStream_t stream)
{
    int64_t const bytesPer = rt::dataTypeSize(type);
    std::vector<uint8_t> bytes(static_cast<size_t>(kTOKENS * tokenStride * bytesPer), kPOISON_BYTE);
    for (int64_t t = 0; t < kTOKENS; ++t)
    {
        for (int64_t e = 0; e < rowElems; ++e)
        {
            float const x = values[static_cast<size_t>(t * rowElems + e)];
            uint8_t* const to = bytes.data() + (t * tokenStride + e) * bytesPer;
            if (type == rt::DataType::kFLOAT)
            {
                std::memcpy(to, &x, 4);
            }
            else
            {
                uint16_t const half = type == rt::DataType::kHALF ? floatToHalfWithNan(x) : floatToBfloat16(x);
                std::memcpy(to, &half, 2);
            }
        }
    }
    return DeviceArray<uint8_t>(bytes, stream);
}

//! One quantized cache of kLAYERS on its own stream, with its host-held scales set.
struct QuantCache
{
    explicit QuantCache(ScaledFormat format)
        : manager(ConfigBuilder(kLAYERS)
                      .maxBatchSize(2)
                      .maxSequenceLength(64)
                      .tokensPerPage(kTOKENS_PER_PAGE)
                      .dataType(format.storage)
                      .quantization(format.quantization)
                      .maxTokensPerStep(16)
                      .build(),
            stream.get())
        , format(format)
    {
        for (int32_t layer = 0; layer < static_cast<int32_t>(kLAYERS.size()); ++layer)
        {
            if (format.quantization != rt::KVQuantization::kFP8_PER_TOKEN_HEAD)
            {
                // Per tensor: scales that make the larger magnitudes saturate; NVFP4: global scales of about
                // amax / (448 * 6) for the 3e3 heads.
                manager.setLayerScales(layer,
                    format.quantization == rt::KVQuantization::kNVFP4 ? rt::LayerScales{2.1e-3F, 3.7e-3F}
                                                                      : rt::LayerScales{0.37F, 2.5F});
            }
        }
    }

    bool scalePools() const
    {
        return format.quantization != rt::KVQuantization::kFP8_PER_TENSOR;
    }
    int64_t dataBytes(int32_t layer) const
    {
        return modelLayout(manager.getConfig()).layers[static_cast<size_t>(layer)].layerBytes;
    }
    int64_t scaleBytes(int32_t layer) const
    {
        return modelLayout(manager.getConfig()).layers[static_cast<size_t>(layer)].scaleBytes;
    }
    void* scalePool(int32_t layer) const
    {
        return manager.layerRef(layer).kScalePool;
    }
    //! Poisons the layer's data and scale pools.
    void poison(int32_t layer)
    {
        KVCACHE_CUDA_TRY(cudaMemsetAsync(
            manager.kPoolPtr(layer), kPOISON_BYTE, static_cast<size_t>(dataBytes(layer)), stream.get()));
        if (scalePools())
        {
            KVCACHE_CUDA_TRY(
                cudaMemsetAsync(scalePool(layer), kPOISON_BYTE, static_cast<size_t>(scaleBytes(layer)), stream.get()));
        }
    }
    std::vector<uint8_t> data(int32_t layer) const
    {
        return downloadBytes(manager.kPoolPtr(layer), dataBytes(layer), stream.get());
    }
    std::vector<uint8_t> scales(int32_t layer) const
    {
        return scalePools() ? downloadBytes(scalePool(layer), scaleBytes(layer), stream.get()) : std::vector<uint8_t>{};
    }

    CudaStream stream;
    rt::KVCacheManager manager;
    ScaledFormat format;
};

//! Distinct token addresses inside the layer's group, with the skipped, bad and uncounted tokens as the test says.
std::vector<int64_t> makeAddresses(rt::LayerRef const& ref, uint64_t seed)
{
    std::vector<int64_t> all(static_cast<size_t>(ref.numPages) * ref.tokensPerPage);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), std::mt19937_64(seed));
    std::vector<int64_t> addresses(all.begin(), all.begin() + kTOKENS);
    for (int32_t const t : kSKIPPED_TOKENS)
    {
        addresses[static_cast<size_t>(t)] = -1;
    }
    addresses[kBAD_TOKEN] = int64_t{ref.numPages} * ref.tokensPerPage;
    addresses[kUNCOUNTED_BAD_TOKEN] = int64_t{ref.numPages} * ref.tokensPerPage + 5;
    return addresses;
}

bool written(std::vector<int64_t> const& addresses, int32_t t)
{
    return t < kCOUNTED && addresses[static_cast<size_t>(t)] >= 0 && t != kBAD_TOKEN;
}

//! The expected pools and read-back after writing `k` (and `v`) at `addresses` into poisoned pools.
struct Expected
{
    std::vector<uint8_t> data;
    std::vector<uint8_t> scales;
    std::vector<float> kRead;
    std::vector<float> vRead;
};

//! Places one head's codes, scale and read-back by the reference.
void expectHead(ScaledFormat format, rt::LayerRef const& ref, float hostScale, float const* values, int64_t dataOffset,
    int64_t scaleOffset, Expected& expected, float* read)
{
    int32_t const dim = ref.headDim;
    std::vector<float> const head(values, values + dim);
    if (format.quantization == rt::KVQuantization::kNVFP4)
    {
        quant::Nvfp4Head const q = quant::quantizeNvfp4Head(head, hostScale);
        std::copy(q.packed.begin(), q.packed.end(), expected.data.begin() + dataOffset);
        std::copy(q.blockScales.begin(), q.blockScales.end(), expected.scales.begin() + scaleOffset);
        for (int32_t d = 0; d < dim; ++d)
        {
            read[d] = quant::dequantizeNvfp4(q, static_cast<size_t>(d), hostScale);
        }
        return;
    }
    float scale = hostScale;
    std::vector<uint8_t> codes(static_cast<size_t>(dim));
    if (format.quantization == rt::KVQuantization::kFP8_PER_TOKEN_HEAD)
    {
        quant::Fp8Head const q = quant::quantizeFp8TokenHead(head);
        scale = q.scale;
        codes = q.codes;
        std::memcpy(expected.scales.data() + scaleOffset, &scale, sizeof(float));
    }
    else
    {
        for (int32_t d = 0; d < dim; ++d)
        {
            codes[static_cast<size_t>(d)] = quant::quantizeFp8(values[d], scale);
        }
    }
    std::copy(codes.begin(), codes.end(), expected.data.begin() + dataOffset);
    for (int32_t d = 0; d < dim; ++d)
    {
        read[d] = quant::dequantizeFp8(codes[static_cast<size_t>(d)], scale);
    }
}

Expected expectedWrite(QuantCache const& cache, int32_t layer, std::vector<float> const& k, std::vector<float> const& v,
    std::vector<int64_t> const& addresses)
{
    rt::LayerRef const ref = cache.manager.layerRef(layer);
    rt::LayerScales const scales = cache.format.quantization == rt::KVQuantization::kFP8_PER_TOKEN_HEAD
        ? rt::LayerScales{}
        : cache.manager.layerScales(layer);
    Expected expected;
    expected.data.assign(static_cast<size_t>(cache.dataBytes(layer)), kPOISON_BYTE);
    expected.scales.assign(static_cast<size_t>(cache.scalePools() ? cache.scaleBytes(layer) : 0), kPOISON_BYTE);
    float poison = 0.0F;
    std::memset(&poison, kPOISON_BYTE, sizeof(poison));
    int64_t const rowElems = int64_t{ref.numKVHeads} * ref.headDim;
    expected.kRead.assign(static_cast<size_t>(kTOKENS * rowElems), poison);
    expected.vRead = expected.kRead;
    int64_t const vData = static_cast<char*>(ref.vPool) - static_cast<char*>(ref.kPool);
    int64_t const vScales =
        hasV(layer) && cache.scalePools() ? static_cast<char*>(ref.vScalePool) - static_cast<char*>(ref.kScalePool) : 0;
    for (int32_t t = 0; t < kTOKENS; ++t)
    {
        if (!written(addresses, t))
        {
            continue;
        }
        auto const page = static_cast<int32_t>(addresses[static_cast<size_t>(t)] / ref.tokensPerPage);
        auto const offset = static_cast<int32_t>(addresses[static_cast<size_t>(t)] % ref.tokensPerPage);
        for (int32_t h = 0; h < ref.numKVHeads; ++h)
        {
            int64_t const data = ref.offset(page, offset, h) * ref.elementBytes;
            int64_t const scale = cache.scalePools() ? ref.scaleOffset(page, offset, h) * ref.scaleElementBytes : 0;
            int64_t const row = t * rowElems + int64_t{h} * ref.headDim;
            expectHead(cache.format, ref, scales.k, k.data() + row, data, scale, expected, expected.kRead.data() + row);
            if (hasV(layer))
            {
                expectHead(cache.format, ref, scales.v, v.data() + row, vData + data, vScales + scale, expected,
                    expected.vRead.data() + row);
            }
        }
    }
    return expected;
}

//! Empty when equal, else where and how `actual` first differs from `expected`.
std::string firstDifference(std::vector<uint8_t> const& actual, std::vector<uint8_t> const& expected)
{
    if (actual.size() != expected.size())
    {
        return "sizes " + std::to_string(actual.size()) + " and " + std::to_string(expected.size());
    }
    auto const at = std::mismatch(actual.begin(), actual.end(), expected.begin());
    if (at.first == actual.end())
    {
        return {};
    }
    return "byte " + std::to_string(at.first - actual.begin()) + " is " + std::to_string(*at.first) + ", expected "
        + std::to_string(*at.second);
}

//! Empty when each float equals (NaN matching NaN), else the first difference.
std::string firstDifference(std::vector<float> const& actual, std::vector<float> const& expected)
{
    for (size_t i = 0; i < actual.size(); ++i)
    {
        bool const same =
            std::isnan(expected[i]) ? std::isnan(actual[i]) : std::memcmp(&actual[i], &expected[i], sizeof(float)) == 0;
        if (!same)
        {
            return "value " + std::to_string(i) + " is " + std::to_string(actual[i]) + ", expected "
                + std::to_string(expected[i]);
        }
    }
    return {};
}

TEST_F(QuantWriteTest, WritesAndReadsBackEveryFormatByTheRules)
{
    for (ScaledFormat const format : kQUANTIZED_FORMATS)
    {
        SCOPED_TRACE(std::string(rt::kvQuantizationName(format.quantization)));
        QuantCache cache(format);
        for (rt::DataType const type : kINPUT_TYPES)
        {
            for (bool const strided : {false, true})
            {
                for (int32_t layer = 0; layer < static_cast<int32_t>(kLAYERS.size()); ++layer)
                {
                    SCOPED_TRACE(std::string(rt::dataTypeName(type)) + (strided ? " strided" : " packed") + " layer "
                        + std::to_string(layer));
                    rt::LayerRef const ref = cache.manager.layerRef(layer);
                    int64_t const rowElems = int64_t{ref.numKVHeads} * ref.headDim;
                    // A token stride of one extra element breaks every chunk alignment: the element path.
                    int64_t const tokenStride = strided ? rowElems + 1 : rowElems;
                    uint64_t const seed = static_cast<uint64_t>(layer * 100 + static_cast<int>(type) * 10 + strided);
                    std::vector<float> const k = makeValues(type, ref.numKVHeads, ref.headDim, seed);
                    std::vector<float> const v = makeValues(type, ref.numKVHeads, ref.headDim, seed + 7);
                    DeviceArray<uint8_t> const kIn = uploadInput(k, type, rowElems, tokenStride, cache.stream.get());
                    DeviceArray<uint8_t> const vIn = uploadInput(v, type, rowElems, tokenStride, cache.stream.get());
                    rt::Coords const shape{kTOKENS, ref.numKVHeads, ref.headDim};
                    rt::Coords const stride{tokenStride, ref.headDim, 1};
                    rt::Tensor const kTensor(kIn.get(), shape, stride, type, rt::DeviceType::kGPU);
                    rt::Tensor const vTensor =
                        hasV(layer) ? rt::Tensor(vIn.get(), shape, stride, type, rt::DeviceType::kGPU) : rt::Tensor();
                    std::vector<int64_t> const hostAddresses = makeAddresses(ref, seed);
                    DeviceArray<int64_t> const addresses(hostAddresses, cache.stream.get());
                    DeviceArray<int32_t> const count(std::vector<int32_t>{kCOUNTED}, cache.stream.get());
                    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cache.stream.get());
                    rt::TokenOpOptions options;
                    options.deviceCount = count.get();
                    options.deviceErrorCount = errors.get();

                    cache.poison(layer);
                    rt::writeTokens(
                        cache.manager, layer, kTensor, vTensor, addresses.get(), cache.stream.get(), options);
                    Expected const expected = expectedWrite(cache, layer, k, v, hostAddresses);
                    EXPECT_EQ(firstDifference(cache.data(layer), expected.data), "") << "data";
                    EXPECT_EQ(firstDifference(cache.scales(layer), expected.scales), "") << "scales";
                    EXPECT_EQ(errors.download(cache.stream.get())[0], 1)
                        << "the bad address, counted once, and not the "
                           "one past the count";

                    DeviceArray<float> kOut(static_cast<size_t>(kTOKENS * rowElems));
                    DeviceArray<float> vOut(static_cast<size_t>(kTOKENS * rowElems));
                    kOut.fillBytes(kPOISON_BYTE, cache.stream.get());
                    vOut.fillBytes(kPOISON_BYTE, cache.stream.get());
                    rt::Tensor const kRead(kOut.get(), shape, rt::DataType::kFLOAT, rt::DeviceType::kGPU);
                    rt::Tensor const vRead = hasV(layer)
                        ? rt::Tensor(vOut.get(), shape, rt::DataType::kFLOAT, rt::DeviceType::kGPU)
                        : rt::Tensor();
                    rt::readTokens(cache.manager, layer, kRead, vRead, addresses.get(), cache.stream.get(), options);
                    EXPECT_EQ(firstDifference(kOut.download(cache.stream.get()), expected.kRead), "") << "K read";
                    if (hasV(layer))
                    {
                        EXPECT_EQ(firstDifference(vOut.download(cache.stream.get()), expected.vRead), "") << "V read";
                    }
                }
            }
        }
    }
}

TEST_F(QuantWriteTest, PageTableFormWritesWhatTheAddressFormWrites)
{
    for (ScaledFormat const format : kQUANTIZED_FORMATS)
    {
        SCOPED_TRACE(std::string(rt::kvQuantizationName(format.quantization)));
        QuantCache byAddress(format);
        QuantCache byTable(format);
        int32_t const layer = 0;
        rt::LayerRef const ref = byAddress.manager.layerRef(layer);
        int64_t const rowElems = int64_t{ref.numKVHeads} * ref.headDim;
        std::vector<float> const k = makeValues(rt::DataType::kHALF, ref.numKVHeads, ref.headDim, 3);
        std::vector<float> const v = makeValues(rt::DataType::kHALF, ref.numKVHeads, ref.headDim, 4);
        DeviceArray<uint8_t> const kIn =
            uploadInput(k, rt::DataType::kHALF, rowElems, rowElems, byAddress.stream.get());
        DeviceArray<uint8_t> const vIn =
            uploadInput(v, rt::DataType::kHALF, rowElems, rowElems, byAddress.stream.get());
        rt::Coords const shape{kTOKENS, ref.numKVHeads, ref.headDim};
        rt::Tensor const kTensor(kIn.get(), shape, rt::DataType::kHALF, rt::DeviceType::kGPU);
        rt::Tensor const vTensor(vIn.get(), shape, rt::DataType::kHALF, rt::DeviceType::kGPU);
        // One sequence of two pages, 9 and 4 (out of order): token t at position t + 3.
        std::vector<int32_t> const pages{9, 4};
        std::vector<int64_t> addresses;
        std::vector<rt::TokenPosition> positions;
        for (int32_t t = 0; t < kTOKENS; ++t)
        {
            int32_t const position = t + 3;
            positions.push_back({0, position});
            addresses.push_back(int64_t{pages[static_cast<size_t>(position / kTOKENS_PER_PAGE)]} * kTOKENS_PER_PAGE
                + position % kTOKENS_PER_PAGE);
        }
        DeviceArray<int64_t> const deviceAddresses(addresses, byAddress.stream.get());
        DeviceArray<rt::TokenPosition> const devicePositions(positions, byTable.stream.get());
        DeviceArray<int32_t> const indptr(std::vector<int32_t>{0, 2}, byTable.stream.get());
        DeviceArray<int32_t> const indices(pages, byTable.stream.get());
        rt::DevicePageTable const table{indptr.get(), indices.get(), nullptr, 1};

        byAddress.poison(layer);
        byTable.poison(layer);
        rt::writeTokens(byAddress.manager, layer, kTensor, vTensor, deviceAddresses.get(), byAddress.stream.get());
        rt::writeTokens(byTable.manager, layer, kTensor, vTensor, table, devicePositions.get(), byTable.stream.get());
        std::vector<uint8_t> const data = byAddress.data(layer);
        EXPECT_NE(data, std::vector<uint8_t>(data.size(), kPOISON_BYTE)) << "the address form wrote nothing";
        EXPECT_EQ(firstDifference(byTable.data(layer), data), "") << "data";
        EXPECT_EQ(firstDifference(byTable.scales(layer), byAddress.scales(layer)), "") << "scales";
    }
}

} // namespace
} // namespace kvcache::test
