// Page transfer of quantized caches. Without a GPU: the geometry fingerprint tells quantizations apart, the hash of
// the host-held scales reads their bits and only the group's layers (a latent layer's V left out), and a header
// mismatch names the quantization or the scales. On two GPUs: pages of per token-head FP8 and NVFP4 caches (K/V and
// latent layers, two page groups) arrive with their scale pages bitwise on the direct and the staged path; another
// quantization, or other host-held scales in the group, is refused on both sides before anything moves.

#include "dist/transfer_header.h"

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/core/page_geometry.h"
#include "kvcache/dist/page_transfer.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <string>
#include <vector>

#include "support/page_transfer_fixture.h"
#include "support/scaled_configs.h"

namespace kvcache::rt
{
namespace
{

using test::rethrowIfAny;
using test::ScaledFormat;

constexpr uint64_t kFNV_OFFSET_BASIS = 14695981039346656037ull;

//! FNV-1a over `words`, each as four little-endian bytes: the fingerprint's and the scale hash's encoding.
uint64_t fnv1a(std::initializer_list<uint32_t> words)
{
    uint64_t hash = kFNV_OFFSET_BASIS;
    for (uint32_t const word : words)
    {
        for (int shift = 0; shift < 32; shift += 8)
        {
            hash ^= (word >> shift) & 0xFFu;
            hash *= 1099511628211ull;
        }
    }
    return hash;
}

uint32_t bitsOf(float value)
{
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    return bits;
}

//! test::transferConfig stored and quantized as `format`; `pages` sets numPagesPerGroup when not empty.
KVCacheConfig quantizedConfig(ScaledFormat format, std::vector<int32_t> pages = {})
{
    test::ConfigBuilder builder = test::transferConfig();
    builder.dataType(format.storage).quantization(format.quantization);
    if (!pages.empty())
    {
        builder.numPagesPerGroup(pages);
    }
    return builder.build();
}

TEST(TransferFingerprint, TellsQuantizationsOfOneStorageTypeApart)
{
    // kNONE, per tensor and per token-head FP8 share the storage type and every shape: only the quantization differs.
    ScaledFormat const formats[] = {{KVQuantization::kNONE, DataType::kFP8_E4M3},
        {KVQuantization::kFP8_PER_TENSOR, DataType::kFP8_E4M3},
        {KVQuantization::kFP8_PER_TOKEN_HEAD, DataType::kFP8_E4M3}, {KVQuantization::kNONE, DataType::kUINT8},
        {KVQuantization::kNVFP4, DataType::kUINT8}};
    std::vector<uint64_t> prints;
    for (ScaledFormat const format : formats)
    {
        prints.push_back(geometryFingerprint(computeLayout(quantizedConfig(format))));
        EXPECT_EQ(geometryFingerprint(computeLayout(quantizedConfig(format))), prints.back()) << test::nameOf(format);
    }
    for (size_t i = 0; i < prints.size(); ++i)
    {
        for (size_t j = i + 1; j < prints.size(); ++j)
        {
            EXPECT_NE(prints[i], prints[j]) << test::nameOf(formats[i]) << " and " << test::nameOf(formats[j]);
        }
    }
}

TEST(TransferFingerprint, EncodesVersionThreeAsTheGroupsPageGeometryFingerprints)
{
    KVCacheConfig const config = test::ConfigBuilder({KVLayerConfig{2, 16, 0, KVLayerKind::kKV}})
                                     .maxBatchSize(1)
                                     .maxSequenceLength(64)
                                     .tokensPerPage(16)
                                     .dataType(DataType::kFP8_E4M3)
                                     .quantization(KVQuantization::kFP8_PER_TOKEN_HEAD);
    // The page: 1 KV layer of 2 heads of 16, FP8 E4M3 of 1 byte, 16 tokens; data 2 * 16 * 2 * 16 = 1024 bytes, and a
    // float scale per token and head in each half, 2 * 16 * 2 * 4 = 256: 1280 bytes.
    uint64_t const page =
        fnv1a({static_cast<uint32_t>(DataType::kFP8_E4M3), static_cast<uint32_t>(KVQuantization::kFP8_PER_TOKEN_HEAD),
            16, 0, 1, static_cast<uint32_t>(KVLayerKind::kKV), 2, 16, 1280, 0});
    // Version 3, 1 group, then the group's page fingerprint as a uint64 (low word first).
    uint64_t const expected = fnv1a({3, 1, static_cast<uint32_t>(page), static_cast<uint32_t>(page >> 32)});
    EXPECT_EQ(geometryFingerprint(computeLayout(config)), expected);
}

TEST(TransferFingerprint, ChangesWithAnyGroupsPageGeometryAndOnlyWithIt)
{
    auto layout = [](int32_t windowHeads, int32_t numPages)
    {
        return computeLayout(test::ConfigBuilder({KVLayerConfig{2, 16}, KVLayerConfig{windowHeads, 16, 32}})
                                 .maxBatchSize(2)
                                 .maxSequenceLength(64)
                                 .tokensPerPage(16)
                                 .numPagesPerGroup({0, numPages}));
    };
    uint64_t const base = geometryFingerprint(layout(2, 0));
    EXPECT_EQ(geometryFingerprint(layout(2, 12)), base) << "page counts are left out";
    EXPECT_NE(geometryFingerprint(layout(4, 0)), base) << "the windowed group's heads";
    EXPECT_EQ(
        pageGeometryFingerprint(pageGeometry(layout(4, 0), 0)), pageGeometryFingerprint(pageGeometry(layout(2, 0), 0)))
        << "group 0 is the same: its pages may move";
}

TEST(TransferScalesHash, ReadsTheBitsOfTheGroupsScalesAndLeavesALatentLayersVOut)
{
    for (ScaledFormat const format : {ScaledFormat{KVQuantization::kFP8_PER_TENSOR, DataType::kFP8_E4M3},
             ScaledFormat{KVQuantization::kNVFP4, DataType::kUINT8}})
    {
        SCOPED_TRACE(test::nameOf(format));
        // Group 0: layers 0 (KV), 2 (latent), 5 (KV); group 1: 1 (KV), 3 (latent); group 2: 4 (KV), 6 (latent).
        KVCacheLayout const layout = computeLayout(test::scaledConfig(format));
        std::vector<LayerScales> scales;
        for (int32_t layer = 0; layer < 7; ++layer)
        {
            scales.push_back(test::transferLayerScales(layer));
        }
        uint64_t const group0 = detail::hostScalesHash(layout, 0, scales);
        EXPECT_EQ(detail::hostScalesHash(layout, 2, scales),
            fnv1a({bitsOf(scales[4].k), bitsOf(scales[4].v), bitsOf(scales[6].k)}));

        std::vector<LayerScales> changed = scales;
        changed[2].v = 7.0F; // a latent layer's V scales nothing
        EXPECT_EQ(detail::hostScalesHash(layout, 0, changed), group0);
        changed[1].k = 7.0F; // another group's layer
        EXPECT_EQ(detail::hostScalesHash(layout, 0, changed), group0);
        EXPECT_NE(detail::hostScalesHash(layout, 1, changed), detail::hostScalesHash(layout, 1, scales));
        changed = scales;
        changed[2].k = 7.0F; // a latent layer's K
        EXPECT_NE(detail::hostScalesHash(layout, 0, changed), group0);
        changed = scales;
        changed[5].v = 7.0F; // a K/V layer's V
        EXPECT_NE(detail::hostScalesHash(layout, 0, changed), group0);
    }
    // Bits, not values: 0 and -0 are both valid per-tensor scales and differ.
    KVCacheLayout const perTensor =
        computeLayout(test::scaledConfig({KVQuantization::kFP8_PER_TENSOR, DataType::kFP8_E4M3}));
    std::vector<LayerScales> zeros(7, LayerScales{0.0F, 0.0F});
    std::vector<LayerScales> negativeZero = zeros;
    negativeZero[0].k = -0.0F;
    EXPECT_NE(detail::hostScalesHash(perTensor, 0, zeros), detail::hostScalesHash(perTensor, 0, negativeZero));
}

TEST(TransferScalesHash, IsTheOffsetBasisWithoutHostHeldScales)
{
    for (ScaledFormat const format : {ScaledFormat{KVQuantization::kNONE, DataType::kHALF},
             ScaledFormat{KVQuantization::kFP8_PER_TOKEN_HEAD, DataType::kFP8_E4M3}})
    {
        KVCacheLayout const layout = computeLayout(test::scaledConfig(format));
        EXPECT_EQ(detail::hostScalesHash(layout, 0, {}), kFNV_OFFSET_BASIS) << test::nameOf(format);
    }
}

TEST(TransferHeader, AMismatchNamesTheQuantizationOrTheHostHeldScales)
{
    detail::TransferHeader const mine{detail::kTRANSFER_HEADER_MAGIC, 0, 0x1234, 3, 1, 0xAAAA,
        static_cast<int32_t>(KVQuantization::kFP8_PER_TOKEN_HEAD), 0};
    EXPECT_EQ(detail::headerMismatch(mine, mine, 1), "");

    detail::TransferHeader theirs = mine;
    theirs.quantization = static_cast<int32_t>(KVQuantization::kNVFP4);
    theirs.fingerprint = 0x5678; // the fingerprint includes the quantization: the message names the quantization
    std::string message = detail::headerMismatch(mine, theirs, 1);
    EXPECT_NE(message.find("KVCacheConfig.quantization is fp8_per_token_head (2) here, nvfp4 (3) at peer 1"),
        std::string::npos)
        << message;

    theirs = mine;
    theirs.scalesHash = 0xBBBB;
    message = detail::headerMismatch(mine, theirs, 1);
    EXPECT_NE(message.find("host-held layer scales (KVCacheManager::layerScales) of group 0 differ"), std::string::npos)
        << message;

    theirs = mine;
    theirs.fingerprint = 0x5678;
    message = detail::headerMismatch(mine, theirs, 1);
    EXPECT_NE(message.find("page geometry fingerprint of group 0 is 0x0000000000001234 here, 0x0000000000005678 at "
                           "peer 1"),
        std::string::npos)
        << message;
    theirs.group = 1; // a group mismatch is named as such, not as the other group's geometry
    message = detail::headerMismatch(mine, theirs, 1);
    EXPECT_NE(message.find("group 0 and count 3 here, group 1 and count 3 at peer 1"), std::string::npos) << message;
    theirs = mine;
    theirs.magic = 0;
    EXPECT_NE(detail::headerMismatch(mine, theirs, 1).find("not a kvcache page transfer"), std::string::npos);
}

class PageTransferScalesTest : public test::PageTransferFixture
{
protected:
    //! Sends `from` of group `group` into `to` on `path` and records the pair for expectAllReceived.
    void sendAndRecord(
        int32_t group, std::vector<int32_t> const& from, std::vector<int32_t> const& to, TransferPath path)
    {
        TransferOptions options;
        options.path = path;
        ASSERT_NO_THROW(rethrowIfAny(transfer(group, from, to, options)))
            << "group " << group << ", path " << static_cast<int32_t>(path);
        mFrom[group].insert(mFrom[group].end(), from.begin(), from.end());
        mTo[group].insert(mTo[group].end(), to.begin(), to.end());
    }
    //! Expects pages 1-3 of group 0 refused on both sides, on the direct and the staged path, with `naming` in the
    //! message, and the receiver's group 0 untouched.
    void expectRefusedOnBothPaths(std::string const& naming)
    {
        for (TransferPath const how : {TransferPath::kDIRECT, TransferPath::kSTAGED})
        {
            TransferOptions options;
            options.path = how;
            for (std::exception_ptr const& error : transfer(0, {1, 2, 3}, {4, 5, 6}, options))
            {
                expectMismatch(error, naming);
            }
        }
        expectReceived(0, {}, {});
    }
    //! Checks both groups of the receiver against every recorded transfer, then forgets them.
    void expectAllReceived()
    {
        for (int32_t group = 0; group < 2; ++group)
        {
            expectReceived(group, mFrom[group], mTo[group]);
            mFrom[group].clear();
            mTo[group].clear();
        }
    }

    std::vector<int32_t> mFrom[2];
    std::vector<int32_t> mTo[2];
};

TEST_F(PageTransferScalesTest, ScaledPagesArriveWithTheirScalesOnEveryPath)
{
    for (ScaledFormat const format : test::kSCALED_FORMATS)
    {
        SCOPED_TRACE(test::nameOf(format));
        // The receiver's pools are larger: retained page ids beyond its minimum receive too. Group 0: 64 pages on the
        // sender, 100 on the receiver; group 1: 12 and 40.
        makeCaches(quantizedConfig(format), quantizedConfig(format, {100, 40}));
        int32_t path = 0;
        // Each path writes receiver pages of its own, so that one path's right bytes cannot hide another's wrong ones.
        for (TransferPath const how : {TransferPath::kDIRECT, TransferPath::kSTAGED, TransferPath::kAUTO})
        {
            SCOPED_TRACE(testing::Message() << "path " << static_cast<int32_t>(how));
            // A run of four, then 20 scattered pages (20 runs: kAUTO stages them), then group 1.
            sendAndRecord(0, {50, 51, 52, 53}, {5 * path, 5 * path + 1, 5 * path + 2, 5 * path + 3}, how);
            std::vector<int32_t> from;
            std::vector<int32_t> to;
            for (int32_t i = 0; i < 20; ++i)
            {
                from.push_back((i * 7 + path) % 64);
                to.push_back(99 - (20 * path + i));
            }
            sendAndRecord(0, from, to, how);
            sendAndRecord(1, {11, 0, 3, 4}, {30 + path, 10 + path, 20 + 2 * path, 21 + 2 * path}, how);
            ++path;
        }
        expectAllReceived();
    }
}

TEST_F(PageTransferScalesTest, ScalePagesOfNoMultipleOf16BytesMoveBesideAlignedData)
{
    // One head, 2 tokens a page: a scale page is 8 bytes (the pack kernel's byte path), a data page 128 or 64 (its
    // 16-byte path). 32 pages.
    KVCacheConfig const config =
        test::ConfigBuilder({KVLayerConfig{1, 64, 0, KVLayerKind::kKV}, KVLayerConfig{1, 32, 0, KVLayerKind::kLATENT}})
            .maxBatchSize(2)
            .maxSequenceLength(32)
            .tokensPerPage(2)
            .dataType(DataType::kFP8_E4M3)
            .quantization(KVQuantization::kFP8_PER_TOKEN_HEAD);
    makeCaches(config, config);
    ASSERT_EQ(mSides[1].cache->layout().layers[0].scalePageBytes, 8);
    sendAndRecord(0, {0, 1, 2, 9}, {20, 21, 22, 3}, TransferPath::kDIRECT);
    sendAndRecord(0, {3, 17, 30, 4, 11}, {0, 31, 5, 9, 14}, TransferPath::kSTAGED);
    expectReceived(0, mFrom[0], mTo[0]);
}

TEST_F(PageTransferScalesTest, AnotherQuantizationIsRefusedOnBothSidesBeforeAnythingMoves)
{
    struct Pair
    {
        ScaledFormat sender;
        ScaledFormat receiver;
    };
    ScaledFormat const none8{KVQuantization::kNONE, DataType::kFP8_E4M3};
    ScaledFormat const perTensor{KVQuantization::kFP8_PER_TENSOR, DataType::kFP8_E4M3};
    ScaledFormat const perTokenHead{KVQuantization::kFP8_PER_TOKEN_HEAD, DataType::kFP8_E4M3};
    ScaledFormat const nvfp4{KVQuantization::kNVFP4, DataType::kUINT8};
    Pair const pairs[] = {{perTokenHead, none8}, {none8, perTokenHead}, {perTensor, none8}, {perTokenHead, perTensor},
        {nvfp4, {KVQuantization::kNONE, DataType::kUINT8}}};
    for (Pair const& pair : pairs)
    {
        SCOPED_TRACE(test::nameOf(pair.sender) + " to " + test::nameOf(pair.receiver));
        makeCaches(quantizedConfig(pair.sender), quantizedConfig(pair.receiver));
        expectRefusedOnBothPaths("KVCacheConfig.quantization is");
    }
    // The refusals left the communicators in step: equal caches transfer.
    makeCaches(quantizedConfig(nvfp4), quantizedConfig(nvfp4));
    sendAndRecord(0, {1, 2, 3}, {4, 5, 6}, TransferPath::kAUTO);
    expectAllReceived();
}

TEST_F(PageTransferScalesTest, OtherHostHeldScalesOfTheGroupAreRefusedButALatentLayersVIsNotCompared)
{
    for (ScaledFormat const format : {ScaledFormat{KVQuantization::kFP8_PER_TENSOR, DataType::kFP8_E4M3},
             ScaledFormat{KVQuantization::kNVFP4, DataType::kUINT8}})
    {
        SCOPED_TRACE(test::nameOf(format));
        makeCaches(quantizedConfig(format), quantizedConfig(format));
        KVCacheManager& receiver = *mSides[1].cache;
        LayerScales const layer0 = test::transferLayerScales(0);
        receiver.setLayerScales(0, LayerScales{layer0.k, layer0.v * 2.0F});
        expectRefusedOnBothPaths("host-held layer scales (KVCacheManager::layerScales) of group 0 differ");
        // Group 1 (layer 1) has equal scales: its pages move.
        sendAndRecord(1, {2, 7}, {3, 9}, TransferPath::kDIRECT);
        // Layer 0 equal again; the latent layer 2's V differs, and scales nothing.
        receiver.setLayerScales(0, layer0);
        LayerScales const latent = test::transferLayerScales(2);
        receiver.setLayerScales(2, LayerScales{latent.k, latent.v * 2.0F});
        sendAndRecord(0, {1, 2, 3}, {4, 5, 6}, TransferPath::kSTAGED);
        sendAndRecord(0, {8}, {9}, TransferPath::kDIRECT);
        expectAllReceived();
    }
}

} // namespace
} // namespace kvcache::rt
