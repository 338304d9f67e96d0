// Sequence files of quantized geometries on plain host buffers (no GPU): the header records the quantization and the
// host-held scales (checked in the header's bytes), pages carry their scale bytes, and old-version files, files of
// another quantization or of other host-held scales, bad scale arguments and corrupt scale fields under a valid
// checksum are refused naming the field, the value and the expected value, before any page is written.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/tiers/sequence_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "support/error_matchers.h"
#include "support/scaled_configs.h"
#include "support/sequence_file_fixture.h"

namespace kvcache::test
{
namespace
{

namespace fs = std::filesystem;

constexpr ScaledFormat kPLAIN_FP8 = kEVERY_FORMAT[1];
constexpr ScaledFormat kPER_TENSOR = kEVERY_FORMAT[2];
constexpr ScaledFormat kTOKEN_HEAD = kEVERY_FORMAT[3];
constexpr ScaledFormat kNVFP4 = kEVERY_FORMAT[4];

//! Group 0 of scaledConfig(): a KV layer of 2 x 16, a latent layer of 48, a KV layer of 1 x 32, 16 tokens a page.
//! Its header: the fixed 56 bytes, three 24-byte layer records (K scale at +16, V scale at +20), the state tensor
//! count and a reserved int32, the checksum.
constexpr int64_t kHEADER_BYTES = 56 + 3 * 24 + 8 + 8;

rt::PageGeometry geometryOf(ScaledFormat format, int32_t group = 0)
{
    return rt::pageGeometry(rt::computeLayout(scaledConfig(format)), group);
}

bool keepsHostScales(rt::KVQuantization quantization)
{
    return quantization == rt::KVQuantization::kFP8_PER_TENSOR || quantization == rt::KVQuantization::kNVFP4;
}

//! Distinct valid scales, K and V apart, for each layer of `geometry` (none for a quantization without host scales);
//! a latent layer's V is set too, which a file does not keep.
std::vector<rt::LayerScales> scalesOf(rt::PageGeometry const& geometry, float offset = 0.0F)
{
    std::vector<rt::LayerScales> scales;
    for (size_t i = 0; keepsHostScales(geometry.quantization) && i < geometry.layers.size(); ++i)
    {
        float const position = static_cast<float>(i);
        scales.push_back({0.25F + 0.5F * position + offset, 1.5F + 0.125F * position + offset});
    }
    return scales;
}

template <typename T>
T fieldAt(std::vector<char> const& bytes, int64_t offset)
{
    T value;
    std::memcpy(&value, bytes.data() + offset, sizeof(T));
    return value;
}

class SequenceFileQuantizedTest : public SequenceFileFixture
{
protected:
    //! Writes `count` random pages of `geometry` under `scales` and returns them.
    std::vector<std::vector<uint8_t>> writeFile(
        rt::PageGeometry const& geometry, std::vector<rt::LayerScales> const& scales, int count = 2)
    {
        auto pages = randomPages(geometry, count, 17);
        rt::writeSequenceFile(mPath, geometry, 20, pointers(pages).data(), count, scales);
        return pages;
    }
    //! Returns success when reading the file into poisoned pages throws InvalidArgumentError naming `words` and
    //! leaves every page poisoned.
    ::testing::AssertionResult readIsRefused(rt::PageGeometry const& expected,
        std::vector<rt::LayerScales> const& expectedScales, std::vector<std::string> const& words, int count = 2)
    {
        auto loaded = poisoned(expected, count);
        ::testing::AssertionResult const refused = throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::readSequenceFile(mPath, expected, pointers(loaded).data(), count, expectedScales); }, words);
        if (!refused)
        {
            return refused;
        }
        if (!allPoison(loaded))
        {
            return ::testing::AssertionFailure() << "a refused read wrote a page";
        }
        return ::testing::AssertionSuccess();
    }
};

TEST_F(SequenceFileQuantizedTest, EveryQuantizationRoundTripsWithItsHostScalesAndPageScaleBytes)
{
    // Group 0's pages worked out by hand: data 2*16*2*16 + 16*48 + 2*16*1*32 bytes a value (1024 + 768 + 1024 = 2816
    // for FP8, half that for NVFP4); per token-head scales 4 bytes a token and head (256 + 64 + 128); NVFP4 block
    // scales one a 16 values (2*16*2*1 + 16*3 + 2*16*1*2 = 64 + 48 + 64).
    EXPECT_EQ(geometryOf(kPER_TENSOR).bytesPerPage, 2816);
    EXPECT_EQ(geometryOf(kTOKEN_HEAD).bytesPerPage, 2816 + 448);
    EXPECT_EQ(geometryOf(kNVFP4).bytesPerPage, 1408 + 176);
    for (ScaledFormat const format : kEVERY_FORMAT)
    {
        for (int32_t group = 0; group < 3; ++group)
        {
            SCOPED_TRACE(nameOf(format) + ", group " + std::to_string(group));
            rt::PageGeometry const geometry = geometryOf(format, group);
            std::vector<rt::LayerScales> const scales = scalesOf(geometry);
            auto const pages = writeFile(geometry, scales, 3);
            std::vector<char> const bytes = fileBytes();
            EXPECT_EQ(fieldAt<uint32_t>(bytes, 8), 3U) << "the version";
            EXPECT_EQ(fieldAt<int32_t>(bytes, 28), static_cast<int32_t>(format.quantization));
            rt::SequenceFileInfo const info = rt::readSequenceFileInfo(mPath);
            EXPECT_EQ(info.version, rt::kSEQUENCE_FILE_VERSION);
            EXPECT_EQ(info.geometry, geometry);
            ASSERT_EQ(info.layerScales.size(), scales.size());
            for (size_t i = 0; i < geometry.layers.size(); ++i)
            {
                int64_t const record = 56 + 24 * static_cast<int64_t>(i);
                bool const latent = geometry.layers[i].kind == rt::KVLayerKind::kLATENT;
                float const k = scales.empty() ? 0.0F : scales[i].k;
                float const v = scales.empty() || latent ? 0.0F : scales[i].v;
                EXPECT_EQ(fieldAt<float>(bytes, record + 16), k) << "layer " << i;
                EXPECT_EQ(fieldAt<float>(bytes, record + 20), v) << "layer " << i;
                if (!scales.empty())
                {
                    EXPECT_EQ(info.layerScales[i].k, k);
                    EXPECT_EQ(info.layerScales[i].v, v);
                }
            }
            auto loaded = poisoned(geometry, 3);
            EXPECT_EQ(rt::readSequenceFile(mPath, geometry, pointers(loaded).data(), 3, scales), 20);
            EXPECT_EQ(loaded, pages);
        }
    }
}

TEST_F(SequenceFileQuantizedTest, OldVersionFilesAreRefusedNamingBothVersions)
{
    for (ScaledFormat const format : {kEVERY_FORMAT[0], kPER_TENSOR, kNVFP4})
    {
        SCOPED_TRACE(nameOf(format));
        rt::PageGeometry const geometry = geometryOf(format);
        writeFile(geometry, scalesOf(geometry));
        std::vector<char> bytes = fileBytes();
        patchHeader<uint32_t>(bytes, kHEADER_BYTES, 8, 1);
        writeBytes(bytes);
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::readSequenceFileInfo(mPath); }, {"has version 1", "reads versions 2 to 3"}));
        EXPECT_TRUE(readIsRefused(geometry, scalesOf(geometry), {"has version 1", "reads versions 2 to 3"}));
    }
}

TEST_F(SequenceFileQuantizedTest, AnotherQuantizationIsRefusedNamingTheFilesAndTheExpectedOne)
{
    struct Case
    {
        ScaledFormat file;
        ScaledFormat expected;
    };
    // The first two hold the same bytes a page: only the recorded quantization tells them apart.
    for (Case const& c : {Case{kPER_TENSOR, kPLAIN_FP8}, Case{kPLAIN_FP8, kPER_TENSOR}, Case{kTOKEN_HEAD, kPER_TENSOR},
             Case{kNVFP4, kTOKEN_HEAD}, Case{kEVERY_FORMAT[0], kNVFP4}})
    {
        SCOPED_TRACE(nameOf(c.file) + " read as " + nameOf(c.expected));
        rt::PageGeometry const fileGeometry = geometryOf(c.file);
        writeFile(fileGeometry, scalesOf(fileGeometry));
        rt::PageGeometry const expected = geometryOf(c.expected);
        EXPECT_TRUE(readIsRefused(expected, scalesOf(expected),
            {"readSequenceFile", "another geometry",
                "quantization is " + std::string(rt::kvQuantizationName(c.file.quantization)) + " in the file and "
                    + std::string(rt::kvQuantizationName(c.expected.quantization)) + " in the destination"}));
    }
}

TEST_F(SequenceFileQuantizedTest, OtherHostScalesAreRefusedBitForBitExceptALatentLayersV)
{
    for (ScaledFormat const format : {kPER_TENSOR, kNVFP4})
    {
        SCOPED_TRACE(nameOf(format));
        rt::PageGeometry const geometry = geometryOf(format); // layer 1 is latent
        std::vector<rt::LayerScales> const scales = scalesOf(geometry);
        auto const pages = writeFile(geometry, scales);
        std::vector<rt::LayerScales> other = scales;
        other[2].v = 0.75F;
        EXPECT_TRUE(readIsRefused(geometry, other,
            {"layerScales[2].v is 1.75", "the destination's is 0.75",
                std::string(rt::kvQuantizationName(format.quantization))}));
        other = scales;
        other[1].k = 2.0F;
        EXPECT_TRUE(readIsRefused(geometry, other, {"layerScales[1].k is 0.75", "the destination's is 2"}));
        // One ulp apart reads differently: refused.
        other = scales;
        other[0].k = std::nextafter(scales[0].k, 1.0F);
        EXPECT_TRUE(readIsRefused(geometry, other, {"layerScales[0].k"}));
        // The latent layer has no V: its v is neither kept nor compared.
        other = scales;
        other[1].v = 123.0F;
        auto loaded = poisoned(geometry, 2);
        EXPECT_EQ(rt::readSequenceFile(mPath, geometry, pointers(loaded).data(), 2, other), 20);
        EXPECT_EQ(loaded, pages);
    }
    // Per tensor, -0 and +0 store values alike but read back with other signs: they differ.
    rt::PageGeometry const geometry = geometryOf(kPER_TENSOR);
    std::vector<rt::LayerScales> scales = scalesOf(geometry);
    scales[0].k = 0.0F;
    writeFile(geometry, scales);
    scales[0].k = -0.0F;
    EXPECT_TRUE(readIsRefused(geometry, scales, {"layerScales[0].k is 0", "the destination's is -0"}));
}

TEST_F(SequenceFileQuantizedTest, ScaleArgumentsAreCheckedBeforeAnythingIsWrittenOrRead)
{
    rt::PageGeometry const perTensor = geometryOf(kPER_TENSOR);
    rt::PageGeometry const nvfp4 = geometryOf(kNVFP4);
    auto const pages = randomPages(perTensor, 1, 3);
    auto const nvfp4Pages = randomPages(nvfp4, 1, 4);
    auto const writeRefused = [&](rt::PageGeometry const& geometry, std::vector<rt::LayerScales> const& scales,
                                  std::vector<std::string> const& words)
    {
        auto const& source = geometry.quantization == rt::KVQuantization::kNVFP4 ? nvfp4Pages : pages;
        return throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::writeSequenceFile(mPath, geometry, 1, pointers(source).data(), 1, scales); }, words);
    };
    float const nan = std::numeric_limits<float>::quiet_NaN();
    float const inf = std::numeric_limits<float>::infinity();
    EXPECT_TRUE(writeRefused(perTensor, {}, {"writeSequenceFile: layerScales has 0 entries", "3 layers", "have 3"}));
    EXPECT_TRUE(writeRefused(perTensor, {{1, 1}, {1, 1}}, {"layerScales has 2 entries"}));
    EXPECT_TRUE(writeRefused(geometryOf(kTOKEN_HEAD), {{1, 1}, {1, 1}, {1, 1}},
        {"layerScales has 3 entries", "fp8_per_token_head keeps no host-held scales", "must be empty"}));
    EXPECT_TRUE(writeRefused(perTensor, {{1, 1}, {1, 1}, {1, -1}}, {"layerScales[2].v is -1", ">= 0"}));
    EXPECT_TRUE(writeRefused(perTensor, {{1, 1}, {nan, 1}, {1, 1}}, {"layerScales[1].k is nan", "finite"}));
    EXPECT_TRUE(writeRefused(perTensor, {{inf, 1}, {1, 1}, {1, 1}}, {"layerScales[0].k is inf"}));
    EXPECT_TRUE(writeRefused(nvfp4, {{1, 0}, {1, 1}, {1, 1}}, {"layerScales[0].v is 0", "nvfp4", "> 0"}));
    EXPECT_FALSE(fs::exists(mPath));
    // Zero is a per-tensor scale (values store as zeros); a latent layer's V is not used, whatever it holds.
    rt::writeSequenceFile(mPath, perTensor, 1, pointers(pages).data(), 1, {{0, 0}, {1, nan}, {1, 1}});
    EXPECT_EQ(rt::readSequenceFileInfo(mPath).layerScales[1].v, 0.0F);

    // The expected scales are checked before the file is opened: a missing file is not what is reported.
    auto loaded = poisoned(perTensor, 1);
    std::string const missing = (mDir / "missing").string();
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::readSequenceFile(missing, perTensor, pointers(loaded).data(), 1, {}); },
        {"readSequenceFile: expectedScales has 0 entries", "3 layers"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            rt::readSequenceFile(missing, perTensor, pointers(loaded).data(), 1, {{1, 1}, {-2, 1}, {1, 1}});
        },
        {"expectedScales[1].k is -2"}));
    EXPECT_TRUE(allPoison(loaded));
}

TEST_F(SequenceFileQuantizedTest, CorruptQuantizationAndScaleFieldsUnderAValidChecksumAreRefused)
{
    struct Case
    {
        ScaledFormat format;
        int64_t offset;
        int32_t bits; // written as the 4 bytes at offset
        std::vector<std::string> words;
    };
    auto const bitsOf = [](float value)
    {
        int32_t bits = 0;
        std::memcpy(&bits, &value, sizeof(bits));
        return bits;
    };
    std::vector<Case> const cases{
        {kPER_TENSOR, 56 + 16, bitsOf(-1.0F), {"header layerScales[0].k is -1", ">= 0"}},
        {kPER_TENSOR, 56 + 16, bitsOf(std::numeric_limits<float>::quiet_NaN()), {"layerScales[0].k is nan"}},
        {kNVFP4, 104 + 20, bitsOf(0.0F), {"layerScales[2].v is 0", "> 0"}},
        {kPER_TENSOR, 80 + 20, bitsOf(1.0F), {"a latent layer's V scale at byte 100 is 0x3f800000", "must be 0"}},
        {kTOKEN_HEAD, 104 + 16, bitsOf(1.0F), {"a K scale the quantization does not keep at byte 120", "must be 0"}},
        {kTOKEN_HEAD, 56 + 20, 1, {"a V scale the quantization does not keep at byte 76 is 0x00000001"}},
        // The quantization: outside the enumeration, one the data type cannot hold, or other page bytes.
        {kNVFP4, 28, 7, {"quantization is 7", "kNVFP4 (3)"}},
        {kNVFP4, 28, 2, {"quantization is fp8_per_token_head", "dataType is uint8", "must be fp8_e4m3"}},
        {kTOKEN_HEAD, 28, 0, {"bytesPerPage is 3264", "pages of 2816 bytes"}},
        {kPER_TENSOR, 28, 2, {"bytesPerPage is 2816", "pages of 3264 bytes"}},
        // An NVFP4 head must be whole blocks of 16 values: latent layer 1's headDim at 80 + 8.
        {kNVFP4, 80 + 8, 40, {"layers[1].headDim is 40", "nvfp4", "multiple of 16"}},
    };
    for (Case const& c : cases)
    {
        SCOPED_TRACE(nameOf(c.format) + ", byte " + std::to_string(c.offset));
        rt::PageGeometry const geometry = geometryOf(c.format);
        writeFile(geometry, scalesOf(geometry));
        std::vector<char> bytes = fileBytes();
        patchHeader<int32_t>(bytes, kHEADER_BYTES, c.offset, c.bits);
        writeBytes(bytes);
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { rt::readSequenceFileInfo(mPath); }, c.words));
        EXPECT_TRUE(readIsRefused(geometry, scalesOf(geometry), {}));
    }
}

TEST_F(SequenceFileQuantizedTest, TheWriterRefusesQuantizedGeometriesALayoutWouldNotGive)
{
    auto const pages = randomPages(geometryOf(kTOKEN_HEAD), 1, 5);
    auto const refused = [&](rt::PageGeometry const& geometry, std::vector<std::string> const& words)
    {
        return throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::writeSequenceFile(mPath, geometry, 1, pointers(pages).data(), 1, scalesOf(geometry)); }, words);
    };
    rt::PageGeometry withoutScaleBytes = geometryOf(kTOKEN_HEAD);
    withoutScaleBytes.bytesPerPage = geometryOf(kPLAIN_FP8).bytesPerPage;
    EXPECT_TRUE(refused(withoutScaleBytes, {"geometry.bytesPerPage is 2816", "pages of 3264 bytes"}));
    rt::PageGeometry wrongType = geometryOf(kNVFP4);
    wrongType.dataType = rt::DataType::kFP8_E4M3;
    EXPECT_TRUE(refused(wrongType, {"geometry.quantization is nvfp4", "dataType is fp8_e4m3", "must be uint8"}));
    rt::PageGeometry outside = geometryOf(kPLAIN_FP8);
    outside.quantization = static_cast<rt::KVQuantization>(-1);
    EXPECT_TRUE(refused(outside, {"geometry.quantization is -1"}));
    EXPECT_FALSE(fs::exists(mPath));
    EXPECT_EQ(std::distance(fs::directory_iterator(mDir), fs::directory_iterator()), 0);
}

} // namespace
} // namespace kvcache::test
