// The token write and read on a GPU, checked byte for byte against the host model (support/token_write_model.h and
// support/layout_model.h): every pair of input and cache types (bitwise where the conversion is exact, rounding to
// nearest even otherwise), packed, strided and misaligned inputs (vector and element paths), a full-attention, a
// sliding-window and a latent layer, negative addresses skipped, bad ones counted and never written, poisoned bytes
// untouched wherever no address points, device counts clamped, a captured graph replayed with new addresses and a new
// count, and the page-table form against the address form through tables PageTableBuffers builds.

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/kv_write.h"
#include "kvcache/paging/page_table.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/layout_model.h"
#include "support/token_write_model.h"

namespace kvcache::test
{
namespace
{

using TokenWriteTest = GpuTest;

constexpr int32_t kTOKENS_PER_PAGE = 16;
//! Written over pools and outputs before a kernel runs, so a write that never happens cannot pass.
constexpr int kPOISON_BYTE = 0x7B;
constexpr rt::DataType kVALUE_TYPES[] = {rt::DataType::kFLOAT, rt::DataType::kHALF, rt::DataType::kBF16};
//! Layer 0: full attention 2 x 64; layer 1: window 32, 1 x 128 (its own page group); layer 2: latent 1 x 72; layer 3:
//! full attention 3 x 20 (no 16-byte chunks of 2-byte types: the element path).
std::vector<rt::KVLayerConfig> const kLAYERS{{2, 64}, {1, 128, 32}, {1, 72, 0, rt::KVLayerKind::kLATENT}, {3, 20}};

//! A cache of the four layers above on its own stream, with its model.
struct Cache
{
    explicit Cache(rt::DataType type)
        : config(ConfigBuilder(kLAYERS)
                     .maxBatchSize(2)
                     .maxSequenceLength(128)
                     .tokensPerPage(kTOKENS_PER_PAGE)
                     .dataType(type)
                     .maxTokensPerStep(16)
                     .build())
        , model(modelLayout(config))
        , manager(config, stream.get())
    {
    }

    //! Fills layer `layer`'s whole buffer with kPOISON_BYTE and returns its bytes.
    std::vector<uint8_t> poison(int32_t layer)
    {
        int64_t const bytes = model.layers[static_cast<size_t>(layer)].layerBytes;
        KVCACHE_CUDA_TRY(
            cudaMemsetAsync(manager.kPoolPtr(layer), kPOISON_BYTE, static_cast<size_t>(bytes), stream.get()));
        return download(layer);
    }
    //! Returns layer `layer`'s whole buffer after the queued work.
    std::vector<uint8_t> download(int32_t layer) const
    {
        return downloadBytes(
            manager.kPoolPtr(layer), model.layers[static_cast<size_t>(layer)].layerBytes, stream.get());
    }
    //! Returns the tokens layer `layer`'s pools hold: numPages * tokensPerPage.
    int64_t tokenSlots(int32_t layer) const
    {
        return model.layers[static_cast<size_t>(layer)].numPages * kTOKENS_PER_PAGE;
    }

    rt::KVCacheConfig config;
    LayoutModel model;
    CudaStream stream;
    rt::KVCacheManager manager;
};

//! How an input tensor [n, H, D] is laid out: strides in elements and its start, in elements past an aligned base.
struct TensorLayout
{
    char const* name;
    int64_t extraTokenStride; //!< added to H * headStride
    int64_t extraHeadStride;  //!< added to D
    int64_t startOffset;
};

constexpr TensorLayout kLAYOUTS[] = {
    {"packed", 0, 0, 0},
    {"strided by 8s", 16, 8, 0},
    {"odd strides", 3, 1, 0},
    {"start one element in", 0, 0, 1},
};

//! `count` random elements of `type` as bytes: any bits when `anyBits` (NaNs included), else finite values spread over
//! float16's range and its rounding ties.
std::vector<uint8_t> randomElements(rt::DataType type, size_t count, bool anyBits, std::mt19937_64& rng)
{
    size_t const size = static_cast<size_t>(rt::dataTypeSize(type));
    std::vector<uint8_t> bytes(count * size);
    for (size_t i = 0; i < count; ++i)
    {
        uint64_t const draw = rng();
        uint32_t bits = static_cast<uint32_t>(draw);
        if (!anyBits && type == rt::DataType::kFLOAT)
        {
            // Exponents from float16's subnormals to past its largest value; a quarter on a float16 tie and a quarter
            // on a bfloat16 tie.
            uint32_t const exponent = 127 - 30 + static_cast<uint32_t>((draw >> 32) % 48);
            uint32_t mantissa = bits & 0x7FFFFFU;
            uint32_t const which = static_cast<uint32_t>(draw >> 40) % 4;
            mantissa = which == 0 ? (mantissa & ~0x1FFFU) | 0x1000U
                : which == 1      ? (mantissa & ~0xFFFFU) | 0x8000U
                                  : mantissa;
            bits = (bits & 0x80000000U) | (exponent << 23) | mantissa;
        }
        else if (!anyBits && type == rt::DataType::kHALF && ((bits >> 10) & 0x1FU) == 0x1FU)
        {
            bits &= ~0x4000U; // no infinities or NaNs
        }
        else if (!anyBits && type == rt::DataType::kBF16 && ((bits >> 7) & 0xFFU) == 0xFFU)
        {
            bits &= ~0x4000U;
        }
        std::memcpy(&bytes[i * size], &bits, size);
    }
    return bytes;
}

//! An input tensor on the device and its bytes on the host.
struct InputTensor
{
    InputTensor(rt::DataType type, int64_t n, int64_t heads, int64_t dim, TensorLayout const& layout, bool anyBits,
        std::mt19937_64& rng, cudaStream_t stream)
        : type(type)
        , headStride(dim + layout.extraHeadStride)
        , tokenStride(heads * headStride + layout.extraTokenStride)
        , start(layout.startOffset)
        , host(randomElements(
              type, static_cast<size_t>(start + (n - 1) * tokenStride + (heads - 1) * headStride + dim), anyBits, rng))
        , device(host, stream)
        , tensor(device.get() + start * rt::dataTypeSize(type), rt::Coords{n, heads, dim},
              rt::Coords{tokenStride, headStride, 1}, type, rt::DeviceType::kGPU)
    {
    }

    //! Returns the bytes of element (token, head, dim).
    uint8_t const* element(int64_t token, int64_t head, int64_t dim) const
    {
        return &host[static_cast<size_t>(
            (start + token * tokenStride + head * headStride + dim) * rt::dataTypeSize(type))];
    }

    rt::DataType type;
    int64_t headStride;
    int64_t tokenStride;
    int64_t start;
    std::vector<uint8_t> host;
    DeviceArray<uint8_t> device;
    rt::Tensor tensor;
};

//! `n` token addresses of a layer of `slots` token slots: distinct valid ones, with every fifth skipped (negative) and
//! every seventh past the pools (bad).
std::vector<int64_t> mixedAddresses(int64_t n, int64_t slots, std::mt19937_64& rng)
{
    std::vector<int64_t> valid(static_cast<size_t>(slots));
    std::iota(valid.begin(), valid.end(), 0);
    std::shuffle(valid.begin(), valid.end(), rng);
    std::vector<int64_t> addresses;
    int64_t const bad[] = {slots, slots + 5, std::numeric_limits<int64_t>::max()};
    int64_t const skipped[] = {-1, -7, std::numeric_limits<int64_t>::min()};
    for (int64_t i = 0; i < n; ++i)
    {
        addresses.push_back(i % 7 == 6 ? bad[i % 3] : i % 5 == 4 ? skipped[i % 3] : valid[static_cast<size_t>(i)]);
    }
    return addresses;
}

//! Returns the number of the first `count` addresses that lie past `slots`.
int32_t badAddresses(std::vector<int64_t> const& addresses, int64_t count, int64_t slots)
{
    return static_cast<int32_t>(
        std::count_if(addresses.begin(), addresses.begin() + count, [&](int64_t a) { return a >= slots; }));
}

//! Returns `before` (a layer's bytes) with the first `count` tokens of `k` and `v` (v null for a latent layer) written
//! where `addresses` say, as the model defines it.
std::vector<uint8_t> expectedLayer(Cache const& cache, int32_t layer, std::vector<uint8_t> before, InputTensor const& k,
    InputTensor const* v, std::vector<int64_t> const& addresses, int64_t count)
{
    ModelLayer const& m = cache.model.layers[static_cast<size_t>(layer)];
    rt::DataType const cacheType = cache.config.kvCacheType;
    for (int64_t i = 0; i < count; ++i)
    {
        int64_t const address = addresses[static_cast<size_t>(i)];
        if (address < 0 || address >= cache.tokenSlots(layer))
        {
            continue;
        }
        for (int64_t kv = 0; kv < (v == nullptr ? 1 : 2); ++kv)
        {
            InputTensor const& input = kv == 0 ? k : *v;
            for (int64_t head = 0; head < m.numKVHeads; ++head)
            {
                for (int64_t dim = 0; dim < m.headDim; ++dim)
                {
                    std::vector<uint8_t> const value =
                        convertElementBytes(input.element(i, head, dim), input.type, cacheType);
                    int64_t const at = cache.model.poolByteOffset(
                        layer, kv, address / kTOKENS_PER_PAGE, address % kTOKENS_PER_PAGE, head, dim);
                    std::copy(value.begin(), value.end(), before.begin() + at);
                }
            }
        }
    }
    return before;
}

//! Compares two byte buffers, naming the first byte that differs.
::testing::AssertionResult sameBytes(std::vector<uint8_t> const& expected, std::vector<uint8_t> const& actual)
{
    if (expected.size() != actual.size())
    {
        return ::testing::AssertionFailure() << actual.size() << " bytes; " << expected.size() << " expected";
    }
    auto const [wanted, found] = std::mismatch(expected.begin(), expected.end(), actual.begin());
    if (wanted != expected.end())
    {
        return ::testing::AssertionFailure() << "byte " << (wanted - expected.begin()) << " is 0x" << std::hex
                                             << int{*found} << "; 0x" << int{*wanted} << " expected";
    }
    return ::testing::AssertionSuccess();
}

//! A contiguous output [n, H, D] of `type`, poisoned.
struct OutputTensor
{
    OutputTensor(rt::DataType type, int64_t n, int64_t heads, int64_t dim, cudaStream_t stream)
        : device(static_cast<size_t>(n * heads * dim * rt::dataTypeSize(type)))
        , tensor(device.get(), rt::Coords{n, heads, dim}, type, rt::DeviceType::kGPU)
    {
        device.fillBytes(kPOISON_BYTE, stream);
    }

    DeviceArray<uint8_t> device;
    rt::Tensor tensor;
};

//! Returns what readTokens must leave in a poisoned contiguous output of `type`: for each of the first `count` valid
//! addresses, the cache's elements (from `layerBytes`) converted to `type`.
std::vector<uint8_t> expectedOutput(Cache const& cache, int32_t layer, int64_t kv,
    std::vector<uint8_t> const& layerBytes, std::vector<int64_t> const& addresses, int64_t n, int64_t count,
    rt::DataType type)
{
    ModelLayer const& m = cache.model.layers[static_cast<size_t>(layer)];
    int64_t const size = rt::dataTypeSize(type);
    std::vector<uint8_t> out(static_cast<size_t>(n * m.numKVHeads * m.headDim * size), kPOISON_BYTE);
    for (int64_t i = 0; i < count; ++i)
    {
        int64_t const address = addresses[static_cast<size_t>(i)];
        if (address < 0 || address >= cache.tokenSlots(layer))
        {
            continue;
        }
        for (int64_t head = 0; head < m.numKVHeads; ++head)
        {
            for (int64_t dim = 0; dim < m.headDim; ++dim)
            {
                int64_t const at = cache.model.poolByteOffset(
                    layer, kv, address / kTOKENS_PER_PAGE, address % kTOKENS_PER_PAGE, head, dim);
                std::vector<uint8_t> const value =
                    convertElementBytes(&layerBytes[static_cast<size_t>(at)], cache.config.kvCacheType, type);
                std::copy(
                    value.begin(), value.end(), out.begin() + ((i * m.numKVHeads + head) * m.headDim + dim) * size);
            }
        }
    }
    return out;
}

bool isLatent(int32_t layer)
{
    return kLAYERS[static_cast<size_t>(layer)].kind == rt::KVLayerKind::kLATENT;
}

TEST_F(TokenWriteTest, EveryTypePairLayerAndInputLayoutWritesTheModelsBytesAndReadsThemBack)
{
    std::mt19937_64 rng(11);
    constexpr int64_t kTOKENS = 40;
    for (rt::DataType const cacheType : kVALUE_TYPES)
    {
        Cache cache(cacheType);
        DeviceArray<int32_t> errors(1);
        for (rt::DataType const inputType : kVALUE_TYPES)
        {
            bool const exact = inputType == cacheType || cacheType == rt::DataType::kFLOAT;
            for (int32_t layer = 0; layer < cache.manager.numLayers(); ++layer)
            {
                for (TensorLayout const& tensorLayout : kLAYOUTS)
                {
                    SCOPED_TRACE(std::string(rt::dataTypeName(inputType)) + " into "
                        + std::string(rt::dataTypeName(cacheType)) + ", layer " + std::to_string(layer) + ", "
                        + tensorLayout.name);
                    rt::KVLayerConfig const& shape = kLAYERS[static_cast<size_t>(layer)];
                    cudaStream_t const stream = cache.stream.get();
                    InputTensor const k(inputType, kTOKENS, shape.numKVHeads, shape.headDim, tensorLayout,
                        inputType == cacheType, rng, stream);
                    InputTensor const v(inputType, kTOKENS, shape.numKVHeads, shape.headDim, tensorLayout,
                        inputType == cacheType, rng, stream);
                    std::vector<int64_t> const addresses = mixedAddresses(kTOKENS, cache.tokenSlots(layer), rng);
                    DeviceArray<int64_t> const deviceAddresses(addresses, stream);
                    errors.fillBytes(0, stream);
                    std::vector<uint8_t> const before = cache.poison(layer);

                    rt::Tensor const vTensor = isLatent(layer) ? rt::Tensor() : v.tensor;
                    rt::writeTokens(cache.manager, layer, k.tensor, vTensor, deviceAddresses.get(), stream,
                        {nullptr, errors.get(), cache.manager.groupOf(layer)});
                    std::vector<uint8_t> const written = cache.download(layer);
                    ASSERT_TRUE(sameBytes(
                        expectedLayer(cache, layer, before, k, isLatent(layer) ? nullptr : &v, addresses, kTOKENS),
                        written));
                    EXPECT_EQ(errors.download(stream)[0], badAddresses(addresses, kTOKENS, cache.tokenSlots(layer)));

                    // Read back into the input's type: the input itself wherever the conversion was exact.
                    OutputTensor const kOut(inputType, kTOKENS, shape.numKVHeads, shape.headDim, stream);
                    OutputTensor const vOut(inputType, kTOKENS, shape.numKVHeads, shape.headDim, stream);
                    errors.fillBytes(0, stream);
                    rt::readTokens(cache.manager, layer, kOut.tensor, isLatent(layer) ? rt::Tensor() : vOut.tensor,
                        deviceAddresses.get(), stream, {nullptr, errors.get()});
                    for (int64_t kv = 0; kv < (isLatent(layer) ? 1 : 2); ++kv)
                    {
                        std::vector<uint8_t> const got = (kv == 0 ? kOut : vOut).device.download(stream);
                        ASSERT_TRUE(sameBytes(
                            expectedOutput(cache, layer, kv, written, addresses, kTOKENS, kTOKENS, inputType), got))
                            << (kv == 0 ? "K" : "V") << " read back";
                        if (exact && tensorLayout.extraTokenStride == 0 && tensorLayout.extraHeadStride == 0)
                        {
                            // Packed input: a written row is the input's row, bit for bit.
                            InputTensor const& input = kv == 0 ? k : v;
                            int64_t const rowBytes = shape.numKVHeads * shape.headDim * rt::dataTypeSize(inputType);
                            for (int64_t i = 0; i < kTOKENS; ++i)
                            {
                                int64_t const address = addresses[static_cast<size_t>(i)];
                                if (address >= 0 && address < cache.tokenSlots(layer))
                                {
                                    ASSERT_EQ(
                                        std::memcmp(input.element(i, 0, 0), &got[static_cast<size_t>(i * rowBytes)],
                                            static_cast<size_t>(rowBytes)),
                                        0)
                                        << "token " << i << " did not round-trip";
                                }
                            }
                        }
                    }
                    EXPECT_EQ(errors.download(stream)[0], badAddresses(addresses, kTOKENS, cache.tokenSlots(layer)));
                }
            }
        }
    }
}

TEST_F(TokenWriteTest, DeviceCountsAreClampedToTheCapacity)
{
    Cache cache(rt::DataType::kHALF);
    std::mt19937_64 rng(3);
    cudaStream_t const stream = cache.stream.get();
    constexpr int64_t kCAPACITY = 24;
    InputTensor const k(rt::DataType::kHALF, kCAPACITY, 2, 64, kLAYOUTS[0], true, rng, stream);
    InputTensor const v(rt::DataType::kHALF, kCAPACITY, 2, 64, kLAYOUTS[0], true, rng, stream);
    std::vector<int64_t> addresses(static_cast<size_t>(kCAPACITY));
    std::iota(addresses.begin(), addresses.end(), 5);
    DeviceArray<int64_t> const deviceAddresses(addresses, stream);
    DeviceArray<int32_t> count(1);
    for (int32_t const asked : {-3, 0, 7, static_cast<int32_t>(kCAPACITY), 1000})
    {
        SCOPED_TRACE("device count " + std::to_string(asked));
        count.upload({asked}, stream);
        std::vector<uint8_t> const before = cache.poison(0);
        rt::writeTokens(cache.manager, 0, k.tensor, v.tensor, deviceAddresses.get(), stream, {count.get()});
        int64_t const written = std::clamp<int64_t>(asked, 0, kCAPACITY);
        ASSERT_TRUE(sameBytes(expectedLayer(cache, 0, before, k, &v, addresses, written), cache.download(0)));
    }
}

TEST_F(TokenWriteTest, ACapturedWriteReplaysWithNewAddressesAndANewCount)
{
    Cache cache(rt::DataType::kBF16);
    std::mt19937_64 rng(5);
    cudaStream_t const stream = cache.stream.get();
    constexpr int64_t kCAPACITY = 32;
    int32_t const layer = 1; // the windowed layer: its own page group
    InputTensor const k(rt::DataType::kFLOAT, kCAPACITY, 1, 128, kLAYOUTS[1], false, rng, stream);
    InputTensor const v(rt::DataType::kFLOAT, kCAPACITY, 1, 128, kLAYOUTS[1], false, rng, stream);
    DeviceArray<int64_t> deviceAddresses(static_cast<size_t>(kCAPACITY));
    DeviceArray<int32_t> count(1);
    DeviceArray<int32_t> errors(1);
    CapturedGraph graph(stream,
        [&]
        {
            rt::writeTokens(cache.manager, layer, k.tensor, v.tensor, deviceAddresses.get(), stream,
                {count.get(), errors.get(), cache.manager.groupOf(layer)});
        });
    for (int32_t const replayCount : {32, 10})
    {
        SCOPED_TRACE("replay with count " + std::to_string(replayCount));
        std::vector<int64_t> const addresses = mixedAddresses(kCAPACITY, cache.tokenSlots(layer), rng);
        deviceAddresses.upload(addresses, stream);
        count.upload({replayCount}, stream);
        errors.fillBytes(0, stream);
        std::vector<uint8_t> const before = cache.poison(layer);
        graph.launch(stream);
        ASSERT_TRUE(
            sameBytes(expectedLayer(cache, layer, before, k, &v, addresses, replayCount), cache.download(layer)));
        EXPECT_EQ(errors.download(stream)[0], badAddresses(addresses, replayCount, cache.tokenSlots(layer)));
    }
}

TEST_F(TokenWriteTest, ThePageTableFormWritesWhatTheAddressFormWritesForTheSameTokens)
{
    for (int32_t const layer : {0, 1, 2})
    {
        SCOPED_TRACE("layer " + std::to_string(layer));
        Cache cache(rt::DataType::kHALF);
        std::mt19937_64 rng(9);
        cudaStream_t const stream = cache.stream.get();
        // Sequence 0 lost two pages to a window (or, in a full group, is given so); sequence 1 holds three.
        int32_t const unused = rt::kUNUSED_PAGE_ENTRY;
        std::vector<int32_t> const first{unused, unused, 3, 5};
        std::vector<int32_t> const second{6, 0, 2};
        std::vector<rt::SequencePages> const sequences{{first.data(), 4, 60}, {second.data(), 3, 40}};
        rt::PageTableBuffers tables(2, 8, kTOKENS_PER_PAGE, stream);
        tables.build(sequences.data(), 2, stream);
        TableAddressModel const model({{3, 5}, {6, 0, 2}}, {2 * kTOKENS_PER_PAGE, 0}, kTOKENS_PER_PAGE,
            static_cast<int32_t>(cache.model.layers[static_cast<size_t>(layer)].numPages));

        // Tokens inside both rows, one skipped, and bad ones: before row 0's first token, past the pages of rows 0 and
        // 1, a row past the table.
        std::vector<rt::TokenPosition> const positions{{0, 32}, {0, 47}, {0, 48}, {0, 59}, {1, 0}, {1, 17}, {1, 39},
            {-1, 3}, {0, 31}, {0, 64}, {2, 0}, {1, 47}, {1, 48}, {0, 40}};
        auto const n = static_cast<int64_t>(positions.size());
        std::vector<int64_t> addresses;
        for (rt::TokenPosition const& token : positions)
        {
            addresses.push_back(token.sequence < 0
                    ? -1
                    : model.address(token.sequence, token.position).value_or(cache.tokenSlots(layer)));
        }
        rt::KVLayerConfig const& shape = kLAYERS[static_cast<size_t>(layer)];
        InputTensor const k(rt::DataType::kHALF, n, shape.numKVHeads, shape.headDim, kLAYOUTS[0], true, rng, stream);
        InputTensor const v(rt::DataType::kHALF, n, shape.numKVHeads, shape.headDim, kLAYOUTS[0], true, rng, stream);
        rt::Tensor const vTensor = isLatent(layer) ? rt::Tensor() : v.tensor;
        DeviceArray<rt::TokenPosition> const devicePositions(positions, stream);
        DeviceArray<int64_t> const deviceAddresses(addresses, stream);
        DeviceArray<int32_t> errors(1);

        errors.fillBytes(0, stream);
        std::vector<uint8_t> const before = cache.poison(layer);
        rt::DevicePageTable const table{tables.deviceIndptr(), tables.deviceIndices(), tables.deviceFirstToken(), 2};
        rt::writeTokens(
            cache.manager, layer, k.tensor, vTensor, table, devicePositions.get(), stream, {nullptr, errors.get()});
        std::vector<uint8_t> const byTable = cache.download(layer);
        EXPECT_EQ(errors.download(stream)[0], 4) << "positions 31 and 64 of row 0, 48 of row 1, and row 2";

        errors.fillBytes(0, stream);
        cache.poison(layer);
        rt::writeTokens(
            cache.manager, layer, k.tensor, vTensor, deviceAddresses.get(), stream, {nullptr, errors.get()});
        std::vector<uint8_t> const byAddress = cache.download(layer);
        EXPECT_EQ(errors.download(stream)[0], 4);
        EXPECT_TRUE(sameBytes(byAddress, byTable));
        EXPECT_TRUE(
            sameBytes(expectedLayer(cache, layer, before, k, isLatent(layer) ? nullptr : &v, addresses, n), byTable));
    }
}

TEST_F(TokenWriteTest, EightBitCachesAndBadArgumentsAreRefusedBeforeLaunchingAndZeroTokensIsANoOp)
{
    CudaStream stream;
    rt::KVCacheManager fp8(ConfigBuilder(kLAYERS)
                               .maxBatchSize(1)
                               .tokensPerPage(kTOKENS_PER_PAGE)
                               .dataType(rt::DataType::kFP8_E4M3)
                               .maxTokensPerStep(16)
                               .build(),
        stream.get());
    DeviceArray<uint8_t> values(4 * 2 * 64 * 2);
    DeviceArray<int64_t> addresses(4);
    rt::Tensor const k(values.get(), rt::Coords{4, 2, 64}, rt::DataType::kHALF, rt::DeviceType::kGPU);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::writeTokens(fp8, 0, k, k, addresses.get(), stream.get()); }, {"writeTokens", "fp8_e4m3"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::readTokens(fp8, 0, k, k, addresses.get(), stream.get()); }, {"readTokens", "fp8_e4m3"}));

    Cache cache(rt::DataType::kHALF);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::writeTokens(cache.manager, 0, k, k, nullptr, cache.stream.get()); },
        {"deviceTokenAddresses is null with capacity 4"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::writeTokens(cache.manager, 2, k, rt::Tensor(), addresses.get(), cache.stream.get()); },
        {"k has shape [4, 2, 64]", "layer 2 needs [capacity, 1, 72]"}));
    std::vector<uint8_t> const before = cache.poison(0);
    rt::Tensor const none(nullptr, rt::Coords{0, 2, 64}, rt::DataType::kHALF, rt::DeviceType::kGPU);
    rt::writeTokens(cache.manager, 0, none, none, nullptr, cache.stream.get());
    EXPECT_TRUE(sameBytes(before, cache.download(0)));
}

TEST_F(TokenWriteTest, TheLatentPoolViewShowsWrittenTokensWhereMlaKernelsReadThem)
{
    Cache cache(rt::DataType::kBF16);
    cudaStream_t const stream = cache.stream.get();
    std::mt19937_64 rng(13);
    int32_t const layer = 2;
    rt::Tensor const view = cache.manager.latentPoolView(layer);
    int64_t const numPages = cache.model.layers[static_cast<size_t>(layer)].numPages;
    EXPECT_EQ(view.getShape(), (rt::Coords{numPages, kTOKENS_PER_PAGE, 72}));
    EXPECT_EQ(view.getStride(), (rt::Coords{kTOKENS_PER_PAGE * 72, 72, 1}));
    EXPECT_EQ(view.rawPointer(), cache.manager.kPoolPtr(layer));
    EXPECT_EQ(view.getDataType(), rt::DataType::kBF16);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { cache.manager.latentPoolView(0); }, {"latentPoolView", "layer 0 is a KV layer", "latent"}));
    EXPECT_TRUE(
        throwsNaming<rt::OutOfRangeError>([&] { cache.manager.latentPoolView(4); }, {"latentPoolView", "4", "[0, 4)"}));

    constexpr int64_t kTOKENS = 20;
    InputTensor const k(rt::DataType::kBF16, kTOKENS, 1, 72, kLAYOUTS[0], true, rng, stream);
    std::vector<int64_t> addresses(static_cast<size_t>(kTOKENS));
    std::iota(addresses.begin(), addresses.end(), 3 * kTOKENS_PER_PAGE + 5);
    DeviceArray<int64_t> const deviceAddresses(addresses, stream);
    cache.poison(layer);
    rt::writeTokens(cache.manager, layer, k.tensor, rt::Tensor(), deviceAddresses.get(), stream);
    std::vector<uint8_t> const pool = downloadBytes(view.rawPointer(), view.sizeBytes(), stream);
    for (int64_t i = 0; i < kTOKENS; ++i)
    {
        int64_t const address = addresses[static_cast<size_t>(i)];
        // (page, token, d) of the view, from its own strides.
        int64_t const element =
            address / kTOKENS_PER_PAGE * view.getStride()[0] + address % kTOKENS_PER_PAGE * view.getStride()[1];
        ASSERT_EQ(std::memcmp(&pool[static_cast<size_t>(element * 2)], k.element(i, 0, 0), 72 * 2), 0) << "token " << i;
    }
}

} // namespace
} // namespace kvcache::test
