// Sequence files on plain host buffers (no GPU): round trips, and every kind of bad file refused before any page is
// written.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/tiers/sequence_file.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/sequence_file_fixture.h"

namespace kvcache::test
{
namespace
{

namespace fs = std::filesystem;

//! Two KV layers and one latent layer, bfloat16, 16 tokens a page; page bytes worked out by hand below.
rt::PageGeometry mixedGeometry()
{
    rt::PageGeometry geometry;
    geometry.dataType = rt::DataType::kBF16;
    geometry.tokensPerPage = 16;
    geometry.layers = {{rt::KVLayerKind::kKV, 2, 64}, {rt::KVLayerKind::kLATENT, 1, 96}, {rt::KVLayerKind::kKV, 4, 32}};
    // K and V: 2 * 16 * 2 * 64 * 2 = 8192; latent, one half: 16 * 96 * 2 = 3072; K and V: 2 * 16 * 4 * 32 * 2 = 8192.
    geometry.bytesPerPage = 8192 + 3072 + 8192;
    return geometry;
}

//! Header bytes of a file of mixedGeometry() without a state: the fixed 56, three 24-byte layer records, the state
//! tensor count and a reserved int32 (8), the 8-byte checksum.
constexpr int64_t kMIXED_HEADER_BYTES = 56 + 3 * 24 + 8 + 8;

class SequenceFileTest : public SequenceFileFixture
{
protected:
    //! Writes `count` pages of random bytes of mixedGeometry() holding `tokens` tokens and returns the file's bytes.
    std::vector<char> writeMixedFile(int count, int64_t tokens, uint32_t seed) const
    {
        rt::PageGeometry const geometry = mixedGeometry();
        auto const pages = randomPages(geometry, count, seed);
        rt::writeSequenceFile(mPath, geometry, tokens, pointers(pages).data(), count);
        return fileBytes();
    }
};

TEST_F(SequenceFileTest, RoundTripsPagesAndTokenCount)
{
    rt::PageGeometry const geometry = mixedGeometry();
    auto const pages = randomPages(geometry, 5, 1);
    rt::writeSequenceFile(mPath, geometry, 70, pointers(pages).data(), 5);

    rt::SequenceFileInfo const info = rt::readSequenceFileInfo(mPath);
    EXPECT_EQ(info.version, rt::kSEQUENCE_FILE_VERSION);
    EXPECT_EQ(info.pageCount, 5);
    EXPECT_EQ(info.tokenCount, 70);
    EXPECT_EQ(info.geometry.bytesPerPage, geometry.bytesPerPage);
    ASSERT_EQ(info.geometry.layers.size(), 3U);
    EXPECT_EQ(info.geometry.layers[1].kind, rt::KVLayerKind::kLATENT);
    EXPECT_EQ(info.geometry.layers[2].numKVHeads, 4);

    auto loaded = poisoned(geometry, 5);
    EXPECT_EQ(rt::readSequenceFile(mPath, geometry, pointers(loaded).data(), 5), 70);
    EXPECT_EQ(loaded, pages);
    // No temporary file is left beside the target.
    EXPECT_EQ(std::distance(fs::directory_iterator(mDir), fs::directory_iterator()), 1);
}

TEST_F(SequenceFileTest, EmptySequenceRoundTrips)
{
    rt::PageGeometry const geometry = mixedGeometry();
    rt::writeSequenceFile(mPath, geometry, 0, nullptr, 0);
    EXPECT_EQ(rt::readSequenceFile(mPath, geometry, nullptr, 0), 0);
}

TEST_F(SequenceFileTest, GeometryOfALayoutMatchesTheFormulas)
{
    rt::KVCacheConfig const config = ConfigBuilder(
        {{2, 64, 0, rt::KVLayerKind::kKV}, {1, 96, 0, rt::KVLayerKind::kLATENT}, {4, 32, 0, rt::KVLayerKind::kKV}})
                                         .tokensPerPage(16)
                                         .dataType(rt::DataType::kBF16);
    rt::PageGeometry const geometry = rt::pageGeometry(rt::computeLayout(config), 0);
    rt::PageGeometry const expected = mixedGeometry();
    EXPECT_EQ(geometry.bytesPerPage, expected.bytesPerPage);
    ASSERT_EQ(geometry.layers.size(), expected.layers.size());
    for (size_t i = 0; i < geometry.layers.size(); ++i)
    {
        EXPECT_EQ(geometry.layers[i].kind, expected.layers[i].kind);
        EXPECT_EQ(geometry.layers[i].numKVHeads, expected.layers[i].numKVHeads);
        EXPECT_EQ(geometry.layers[i].headDim, expected.layers[i].headDim);
    }
    EXPECT_TRUE(
        throwsNaming<rt::OutOfRangeError>([&] { rt::pageGeometry(rt::computeLayout(config), 1); }, {"group", "1"}));
}

TEST_F(SequenceFileTest, AFlippedByteAnywhereIsRefusedAndWritesNoPage)
{
    rt::PageGeometry const geometry = mixedGeometry();
    std::vector<char> const good = writeMixedFile(3, 40, 2);
    int64_t const headerBytes = kMIXED_HEADER_BYTES;
    int64_t const checksumBytes = 3 * 8;
    // Header fields, the header checksum, the page checksums, the first, a middle and the last page byte.
    std::vector<int64_t> const offsets{0, 9, 17, 33, 41, 49, 60, headerBytes - 1, headerBytes, headerBytes + 15,
        headerBytes + checksumBytes, headerBytes + checksumBytes + geometry.bytesPerPage + 123,
        static_cast<int64_t>(good.size()) - 1};
    for (int64_t const offset : offsets)
    {
        std::vector<char> bad = good;
        bad[static_cast<size_t>(offset)] = static_cast<char>(bad[static_cast<size_t>(offset)] ^ 0x10);
        writeBytes(bad);
        auto loaded = poisoned(geometry, 3);
        EXPECT_THROW(rt::readSequenceFile(mPath, geometry, pointers(loaded).data(), 3), rt::InvalidArgumentError)
            << "byte " << offset;
        EXPECT_TRUE(allPoison(loaded)) << "byte " << offset << " let a page be written";
    }
    // The message of a corrupt page names the page.
    std::vector<char> bad = good;
    bad[static_cast<size_t>(headerBytes + checksumBytes + 2 * geometry.bytesPerPage + 5)] ^= 0x01;
    writeBytes(bad);
    auto loaded = poisoned(geometry, 3);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::readSequenceFile(mPath, geometry, pointers(loaded).data(), 3); }, {"page 2 of 3", "corrupt"}));
}

TEST_F(SequenceFileTest, TruncatedOrLongerFilesAreRefused)
{
    rt::PageGeometry const geometry = mixedGeometry();
    auto const pages = randomPages(geometry, 2, 3);
    rt::writeSequenceFile(mPath, geometry, 20, pointers(pages).data(), 2);
    std::vector<char> const good = fileBytes();
    for (size_t const length : {size_t{0}, size_t{7}, size_t{55}, size_t{100}, good.size() / 2, good.size() - 1})
    {
        writeBytes(std::vector<char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(length)));
        auto loaded = poisoned(geometry, 2);
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::readSequenceFile(mPath, geometry, pointers(loaded).data(), 2); }, {"truncated"}))
            << length << " bytes";
        EXPECT_TRUE(allPoison(loaded));
    }
    std::vector<char> longer = good;
    longer.push_back(0);
    writeBytes(longer);
    auto loaded = poisoned(geometry, 2);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::readSequenceFile(mPath, geometry, pointers(loaded).data(), 2); },
        {"file size is " + std::to_string(good.size() + 1), std::to_string(good.size())}));
    EXPECT_TRUE(allPoison(loaded));
}

TEST_F(SequenceFileTest, AnotherGeometryIsRefusedNamingTheField)
{
    rt::PageGeometry const geometry = mixedGeometry();
    auto const pages = randomPages(geometry, 1, 4);
    rt::writeSequenceFile(mPath, geometry, 16, pointers(pages).data(), 1);

    rt::PageGeometry otherDim = geometry;
    otherDim.layers[2].headDim = 64;
    otherDim.bytesPerPage += 8192;
    auto loaded = poisoned(otherDim, 1);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::readSequenceFile(mPath, otherDim, pointers(loaded).data(), 1); }, {"layers[2].headDim", "32", "64"}));
    EXPECT_TRUE(allPoison(loaded));

    rt::PageGeometry otherType = geometry;
    otherType.dataType = rt::DataType::kHALF;
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::readSequenceFile(mPath, otherType, pointers(loaded).data(), 1); }, {"dataType"}));
    rt::PageGeometry otherPage = geometry;
    otherPage.tokensPerPage = 32;
    otherPage.bytesPerPage *= 2;
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::readSequenceFile(mPath, otherPage, pointers(loaded).data(), 1); }, {"tokensPerPage", "16", "32"}));
    EXPECT_TRUE(allPoison(loaded));

    auto two = poisoned(geometry, 2);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::readSequenceFile(mPath, geometry, pointers(two).data(), 2); }, {"1 pages", "2"}));
    EXPECT_TRUE(allPoison(two));
}

TEST_F(SequenceFileTest, NotASequenceFileOrAnotherVersionIsRefused)
{
    writeBytes(std::vector<char>(200, 'x'));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { rt::readSequenceFileInfo(mPath); }, {"magic"}));

    rt::PageGeometry const geometry = mixedGeometry();
    rt::writeSequenceFile(mPath, geometry, 0, nullptr, 0);
    std::vector<char> bytes = fileBytes();
    for (char const version : {char{4}, char{1}})
    {
        bytes[8] = version; // version, little-endian, right after the magic
        writeBytes(bytes);
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { rt::readSequenceFileInfo(mPath); },
            {"version " + std::to_string(version), "reads versions 2 to 3"}));
    }
    EXPECT_THROW(rt::readSequenceFileInfo((mDir / "missing").string()), rt::Error);
}

TEST_F(SequenceFileTest, BadWriteArgumentsAreRefusedAndLeaveNoFile)
{
    rt::PageGeometry geometry = mixedGeometry();
    auto const pages = randomPages(geometry, 2, 5);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::writeSequenceFile(mPath, geometry, 33, pointers(pages).data(), 2); }, {"tokenCount", "33", "32"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::writeSequenceFile(mPath, geometry, 1, pointers(pages).data(), -1); }, {"pageCount", "-1"}));
    std::vector<void const*> withNull{pages[0].data(), nullptr};
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::writeSequenceFile(mPath, geometry, 1, withNull.data(), 2); }, {"pages[1]"}));
    geometry.bytesPerPage += 1;
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::writeSequenceFile(mPath, geometry, 1, pointers(pages).data(), 2); },
        {"bytesPerPage", std::to_string(geometry.bytesPerPage), std::to_string(geometry.bytesPerPage - 1)}));
    EXPECT_FALSE(fs::exists(mPath));
    // A folder that does not exist: an I/O error, no temporary left anywhere.
    EXPECT_THROW(rt::writeSequenceFile((mDir / "no" / "file").string(), mixedGeometry(), 1, pointers(pages).data(), 2),
        rt::Error);
    EXPECT_EQ(std::distance(fs::directory_iterator(mDir), fs::directory_iterator()), 0);
}

TEST_F(SequenceFileTest, OutOfRangeHeaderFieldsWithAValidChecksumAreRefused)
{
    rt::PageGeometry const geometry = mixedGeometry();
    std::vector<char> const good = writeMixedFile(1, 16, 8);
    // Fixed part: dataType at 12, tokensPerPage 16, slidingWindow 20, quantization 28, bytesPerPage 32, pageCount 40,
    // tokenCount 48; then 24-byte layer records from 56: kind, numKVHeads, headDim, reserved, K scale, V scale.
    int64_t const headerBytes = kMIXED_HEADER_BYTES;
    int32_t const huge = 1 << 30;
    int64_t const int64Max = std::numeric_limits<int64_t>::max();
    std::vector<BadHeaderField> const cases{
        {16, huge, false, {"tokensPerPage is 1073741824", "power of two in [1, 1024]"}},
        {16, 3, false, {"tokensPerPage is 3", "power of two in [1, 1024]"}},
        {16, 0, false, {"tokensPerPage is 0", "power of two in [1, 1024]"}},
        {12, 99, false, {"dataType is 99"}},
        {20, -5, false, {"slidingWindow is -5", ">= 0"}},
        {28, 9, false, {"quantization is 9", "kNVFP4 (3)"}},
        {28, 1, false, {"quantization is fp8_per_tensor", "dataType is bfloat16", "must be fp8_e4m3"}},
        {56 + 16, 0x3F800000, false, {"a K scale the quantization does not keep at byte 72 is 0x3f800000", "be 0"}},
        {80 + 20, 1, false, {"a latent layer's V scale at byte 100", "must be 0"}},
        {56, 7, false, {"layers[0].kind is 7", "kKV (0) or kLATENT (1)"}},
        {60, 0, false, {"layers[0].numKVHeads is 0", "> 0"}},
        // 2^30 heads of 64 bfloat16 values, K and V, 16 tokens: 2 * 16 * 2^30 * 64 * 2 = 2^42 bytes, plus the other
        // two layers' 3072 + 8192: no overflow, but not the page size the header says.
        {60, huge, false, {"bytesPerPage is 19456", "pages of 4398046522368 bytes"}},
        {80 + 4, huge, false, {"layers[1].numKVHeads is 1073741824", "latent", "must be 1"}},
        {104 + 8, -7, false, {"layers[2].headDim is -7", "> 0"}},
        // 2 * 16 * 4 * (2^31 - 1) * 2 = 549755813632, plus 8192 + 3072.
        {104 + 8, std::numeric_limits<int32_t>::max(), false, {"bytesPerPage is 19456", "pages of 549755824896 bytes"}},
        {104 + 12, 2, false, {"reserved field at byte 116 is 0x00000002", "must be 0"}},
        {32, int64Max, true, {"bytesPerPage is 9223372036854775807", "19456"}},
        {40, int64Max / 2, true, {"pageCount is 4611686018427387903", "overflows 64 bits"}},
        {40, -1, true, {"pageCount is -1", ">= 0"}},
        {48, 17, true, {"tokenCount is 17", "at most 16"}},
    };
    for (BadHeaderField const& c : cases)
    {
        writeBytes(withBadField(good, headerBytes, c));
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { rt::readSequenceFileInfo(mPath); }, c.words))
            << "byte " << c.offset << " = " << c.value;
        auto loaded = poisoned(geometry, 1);
        EXPECT_THROW(rt::readSequenceFile(mPath, geometry, pointers(loaded).data(), 1), rt::InvalidArgumentError);
        EXPECT_TRUE(allPoison(loaded)) << "byte " << c.offset << " let a page be written";
    }

    // Heads and head size of 2^30 each: 2 * 16 * 2^30 * 2^30 * 2 bytes leaves int64; the overflow is named.
    std::vector<char> bad = good;
    patchHeader<int32_t>(bad, headerBytes, 60, huge);
    patchHeader<int32_t>(bad, headerBytes, 64, huge);
    writeBytes(bad);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { rt::readSequenceFileInfo(mPath); },
        {"layers[0]", "numKVHeads 1073741824", "headDim 1073741824", "overflows", "9223372036854775807"}));

    // A layer count beyond the limit or none: refused before the layer records are read.
    for (int32_t const layers : {1 << 20, 0, -1})
    {
        bad = good;
        std::memcpy(bad.data() + 24, &layers, sizeof(layers));
        writeBytes(bad);
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::readSequenceFileInfo(mPath); }, {"numLayers is " + std::to_string(layers), "[1, 65536]"}));
    }
}

TEST_F(SequenceFileTest, TheWriterRefusesWhatALayoutRefuses)
{
    auto const pages = randomPages(mixedGeometry(), 1, 9);
    auto const refused = [&](rt::PageGeometry const& geometry, int64_t pageCount, std::vector<std::string> words)
    {
        return throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::writeSequenceFile(mPath, geometry, 0, pointers(pages).data(), pageCount); }, std::move(words));
    };
    rt::PageGeometry window = mixedGeometry();
    window.slidingWindow = -5;
    EXPECT_TRUE(refused(window, 1, {"geometry.slidingWindow is -5", ">= 0"}));
    rt::PageGeometry three = mixedGeometry();
    three.tokensPerPage = 3;
    three.bytesPerPage = three.bytesPerPage / 16 * 3; // what 3 tokens would take: the rule, not the size, refuses
    EXPECT_TRUE(refused(three, 1, {"geometry.tokensPerPage is 3", "power of two in [1, 1024]"}));
    rt::PageGeometry big = mixedGeometry();
    big.tokensPerPage = 2048;
    big.bytesPerPage *= 128;
    EXPECT_TRUE(refused(big, 1, {"geometry.tokensPerPage is 2048", "[1, 1024]"}));
    rt::PageGeometry latent = mixedGeometry();
    latent.layers[1].numKVHeads = 2;
    latent.bytesPerPage += 3072;
    EXPECT_TRUE(refused(latent, 1, {"geometry.layers[1].numKVHeads is 2", "must be 1"}));
    rt::PageGeometry overflow = mixedGeometry();
    overflow.layers[2].numKVHeads = 1 << 30;
    overflow.layers[2].headDim = 1 << 30;
    EXPECT_TRUE(refused(overflow, 1, {"geometry.layers[2]", "overflows", "9223372036854775807"}));
    rt::PageGeometry none = mixedGeometry();
    none.layers.clear();
    none.bytesPerPage = 0;
    EXPECT_TRUE(refused(none, 0, {"geometry.layers has 0 entries"}));
    // A page count whose file size leaves int64 is refused before any page pointer is read.
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::writeSequenceFile(mPath, mixedGeometry(), 0, nullptr, std::numeric_limits<int64_t>::max() / 2); },
        {"pageCount is 4611686018427387903", "overflows 64 bits"}));
    EXPECT_FALSE(fs::exists(mPath));
    EXPECT_EQ(std::distance(fs::directory_iterator(mDir), fs::directory_iterator()), 0);
}

TEST_F(SequenceFileTest, RewritingReplacesTheWholeFile)
{
    rt::PageGeometry const geometry = mixedGeometry();
    auto const first = randomPages(geometry, 3, 6);
    rt::writeSequenceFile(mPath, geometry, 48, pointers(first).data(), 3);
    auto const second = randomPages(geometry, 1, 7);
    rt::writeSequenceFile(mPath, geometry, 9, pointers(second).data(), 1);
    auto loaded = poisoned(geometry, 1);
    EXPECT_EQ(rt::readSequenceFile(mPath, geometry, pointers(loaded).data(), 1), 9);
    EXPECT_EQ(loaded, second);
    EXPECT_EQ(std::distance(fs::directory_iterator(mDir), fs::directory_iterator()), 1);
}

} // namespace
} // namespace kvcache::test
