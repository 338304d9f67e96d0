// Sequence files of quantized caches through host tiers, on a hybrid cache of windowed and latent layers: pages
// offloaded, saved, loaded into other host pages and onboarded into other device pages come back bit for bit, data and
// page scales (FP8 per token-head, NVFP4); the host-held scales (per-tensor FP8, NVFP4 global scales) are recorded and
// a load compares them with the cache's; another quantization, other host-held scales, a cache of another geometry
// than the tier's and the overloads without a cache for host-held scales are refused with nothing changed.

#include "kvcache/core/errors.h"
#include "kvcache/tiers/host_tier.h"
#include "kvcache/tiers/sequence_file.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "support/cuda_raii.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/host_page_reference.h"
#include "support/page_op_reference.h"
#include "support/scaled_configs.h"

namespace kvcache::rt
{
namespace
{

namespace fs = std::filesystem;
using test::CacheUnderTest;
using test::hostPageContents;
using test::kHOST_PAGE_POISON;
using test::nameOf;
using test::poisonHostPage;
using test::scaledConfig;
using test::ScaledFormat;
using test::throwsNaming;
using test::twoPageLists;

constexpr int32_t kHOST_PAGES = 8;
constexpr int64_t kTOKENS = 40; // within three pages of 16 tokens

bool keepsHostScales(KVQuantization quantization)
{
    return quantization == KVQuantization::kFP8_PER_TENSOR || quantization == KVQuantization::kNVFP4;
}

//! Gives every layer of a cache with host-held scales its own K and V scales (K and V distinct, all valid).
void setDistinctScales(KVCacheManager& cache, float offset = 0.0F)
{
    for (int32_t layer = 0; layer < cache.numLayers(); ++layer)
    {
        float const position = static_cast<float>(layer);
        cache.setLayerScales(layer, {0.5F + 0.125F * position + offset, 3.0F + 0.0625F * position + offset});
    }
}

//! Returns the host-held scales a file of `group` of `cache` records: one a layer of the group, a latent layer's v 0.
std::vector<LayerScales> groupScales(KVCacheManager const& cache, int32_t group)
{
    std::vector<LayerScales> scales;
    for (int32_t const layer : cache.group(group).layers)
    {
        LayerScales layerScales = cache.layerScales(layer);
        layerScales.v =
            cache.layout().layers[static_cast<size_t>(layer)].kind == KVLayerKind::kLATENT ? 0.0F : layerScales.v;
        scales.push_back(layerScales);
    }
    return scales;
}

bool sameScales(std::vector<LayerScales> const& a, std::vector<LayerScales> const& b)
{
    if (a.size() != b.size())
    {
        return false;
    }
    for (size_t i = 0; i < a.size(); ++i)
    {
        if (a[i].k != b[i].k || a[i].v != b[i].v)
        {
            return false;
        }
    }
    return true;
}

std::vector<uint8_t> poisonPage(HostTier const& tier)
{
    return std::vector<uint8_t>(static_cast<size_t>(tier.hostPageBytes()), kHOST_PAGE_POISON);
}

class SequenceFileScalesTest : public test::GpuTest
{
protected:
    void SetUp() override
    {
        test::GpuTest::SetUp();
        mPath = (fs::temp_directory_path()
            / ("kvcache_sequence_file_scales_" + std::to_string(::getpid()) + "_"
                + ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".kvseq"))
                    .string();
        fs::remove(mPath);
    }
    void TearDown() override
    {
        fs::remove(mPath);
    }

    //! Offloads `pages` of the tier's group to host pages {1, 4, 6} and saves them with `cache`'s host-held scales.
    void offloadAndSave(CacheUnderTest& cut, HostTier& tier, std::vector<int32_t> const& pages)
    {
        std::vector<int32_t> const scratch{1, 4, 6};
        tier.offload(cut.cache(), test::pairEntries(pages, scratch), cut.stream());
        saveSequence(mPath, tier, cut.cache(), scratch.data(), static_cast<int64_t>(scratch.size()), kTOKENS);
    }

    std::string mPath;
};

TEST_F(SequenceFileScalesTest, SavedPagesComeBackBitwiseIntoOtherHostAndDevicePages)
{
    uint64_t seed = 101;
    for (ScaledFormat const format : test::kEVERY_FORMAT)
    {
        SCOPED_TRACE(nameOf(format));
        CacheUnderTest cut(scaledConfig(format), ++seed);
        bool const hostScales = keepsHostScales(format.quantization);
        if (hostScales)
        {
            setDistinctScales(cut.cache());
        }
        for (int32_t group = 0; group < 3; ++group)
        {
            SCOPED_TRACE("group " + std::to_string(group));
            HostTier tier(cut.cache(), group, kHOST_PAGES);
            auto const lists = twoPageLists(cut, group, 3);
            // To the host: offload to other host pages, save, and load into the round trip's host pages.
            test::roundTrip(
                cut, tier, lists.first, lists.second, {0, 2, 7},
                [&](std::vector<HostTierEntry> const& entries)
                {
                    std::vector<int32_t> pages;
                    std::vector<int32_t> hostPages;
                    for (HostTierEntry const& entry : entries)
                    {
                        pages.push_back(entry.page);
                        hostPages.push_back(entry.hostPage);
                    }
                    offloadAndSave(cut, tier, pages);
                    SequenceFileInfo const info = readSequenceFileInfo(mPath);
                    EXPECT_EQ(info.version, kSEQUENCE_FILE_VERSION);
                    EXPECT_EQ(info.geometry, tier.geometry());
                    EXPECT_EQ(info.geometry.quantization, format.quantization);
                    EXPECT_EQ(info.pageCount, 3);
                    EXPECT_EQ(info.tokenCount, kTOKENS);
                    EXPECT_TRUE(sameScales(
                        info.layerScales, hostScales ? groupScales(cut.cache(), group) : std::vector<LayerScales>{}));
                    EXPECT_EQ(loadSequence(mPath, tier, cut.cache(), hostPages.data(), 3), kTOKENS);
                },
                [&](std::vector<HostTierEntry> const& entries) { tier.onboard(cut.cache(), entries, cut.stream()); },
                [] {});
            ASSERT_FALSE(HasFatalFailure());
        }
    }
}

TEST_F(SequenceFileScalesTest, AnotherCacheLoadsTheFileOnlyUnderTheSameHostScales)
{
    for (ScaledFormat const format :
        {ScaledFormat{KVQuantization::kFP8_PER_TENSOR, DataType::kFP8_E4M3}, test::kSCALED_FORMATS[1]})
    {
        SCOPED_TRACE(nameOf(format));
        CacheUnderTest saved(scaledConfig(format), 7);
        setDistinctScales(saved.cache());
        CacheUnderTest restored(scaledConfig(format), 8);
        KVCacheManager& restoredCache = restored.cache();
        setDistinctScales(restoredCache, 0.25F);
        int32_t const group = 1; // KV layer 1, latent layer 3
        HostTier savedTier(saved.cache(), group, kHOST_PAGES);
        HostTier tier(restored.cache(), group, kHOST_PAGES);
        std::vector<int32_t> const sources = saved.randomPages(3, group);
        offloadAndSave(saved, savedTier, sources);
        std::vector<int32_t> const hostPages{5, 0, 3};
        for (int32_t const hostPage : hostPages)
        {
            poisonHostPage(tier, hostPage);
        }
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&]
            { loadSequence(mPath, tier, restored.cache(), hostPages.data(), 3); },
            // The check is readSequenceFile's, which loadSequence reads the file through (as for a geometry mismatch).
            {"readSequenceFile", "layerScales[0].k", "is 0.625", "the destination's is 0.875",
                std::string(kvQuantizationName(format.quantization))}));
        // Layer 1's K agrees now, its V does not (the file's 3.0625).
        restoredCache.setLayerScales(1, {saved.cache().layerScales(1).k, 2.5F});
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&]
            { loadSequence(mPath, tier, restored.cache(), hostPages.data(), 3); },
            {"layerScales[0].v", "is 3.0625", "the destination's is 2.5"}));
        for (int32_t const hostPage : hostPages)
        {
            EXPECT_EQ(hostPageContents(tier, hostPage), poisonPage(tier)) << "a refused load wrote a host page";
        }

        // Adopting the file's scales (as read from its header) lets the load through, the pages come back bitwise. The
        // latent layer 3 keeps a V scale of its own: it has no V, so that scale is not compared.
        SequenceFileInfo const info = readSequenceFileInfo(mPath);
        ASSERT_EQ(info.layerScales.size(), 2U);
        EXPECT_EQ(info.layerScales[1].v, 0.0F) << "a latent layer's V scale is recorded as 0";
        restoredCache.setLayerScales(1, info.layerScales[0]);
        restoredCache.setLayerScales(3, {info.layerScales[1].k, 42.0F});
        ASSERT_EQ(loadSequence(mPath, tier, restored.cache(), hostPages.data(), 3), kTOKENS);
        std::vector<int32_t> const destinations = restored.randomPages(3, group);
        test::poisonDevicePages(restored, destinations, group);
        tier.onboard(restored.cache(), test::pairEntries(destinations, hostPages), restored.stream());
        for (size_t i = 0; i < destinations.size(); ++i)
        {
            test::copyModelPage(restored.reference(), saved.reference(), group, sources[i], destinations[i]);
        }
        EXPECT_TRUE(restored.matchesReference());
        EXPECT_TRUE(sameScales(groupScales(restored.cache(), group), groupScales(saved.cache(), group)));
        EXPECT_EQ(restored.cache().layerScales(3).v, 42.0F) << "a load changes no host-held scale";
    }
}

TEST_F(SequenceFileScalesTest, AFileOfAnotherQuantizationIsRefusedAndChangesNothing)
{
    struct Case
    {
        ScaledFormat saved;
        ScaledFormat loaded;
    };
    // Per-tensor FP8 and unscaled FP8 pages have the same bytes: only the recorded quantization tells them apart.
    for (Case const& c :
        {Case{{KVQuantization::kFP8_PER_TENSOR, DataType::kFP8_E4M3}, {KVQuantization::kNONE, DataType::kFP8_E4M3}},
            Case{{KVQuantization::kNONE, DataType::kFP8_E4M3}, {KVQuantization::kFP8_PER_TENSOR, DataType::kFP8_E4M3}},
            Case{test::kSCALED_FORMATS[0], {KVQuantization::kFP8_PER_TENSOR, DataType::kFP8_E4M3}},
            Case{test::kSCALED_FORMATS[1], test::kSCALED_FORMATS[0]}})
    {
        SCOPED_TRACE(nameOf(c.saved) + " loaded as " + nameOf(c.loaded));
        CacheUnderTest saved(scaledConfig(c.saved), 3);
        CacheUnderTest other(scaledConfig(c.loaded), 4);
        HostTier savedTier(saved.cache(), 0, kHOST_PAGES);
        HostTier tier(other.cache(), 0, kHOST_PAGES);
        offloadAndSave(saved, savedTier, saved.randomPages(3, 0));
        std::vector<int32_t> const hostPages{0, 2, 7};
        for (int32_t const hostPage : hostPages)
        {
            poisonHostPage(tier, hostPage);
        }
        EXPECT_TRUE(
            throwsNaming<InvalidArgumentError>([&] { loadSequence(mPath, tier, other.cache(), hostPages.data(), 3); },
                {"another geometry",
                    "quantization is " + std::string(kvQuantizationName(c.saved.quantization)) + " in the file and "
                        + std::string(kvQuantizationName(c.loaded.quantization)) + " in the destination"}));
        for (int32_t const hostPage : hostPages)
        {
            EXPECT_EQ(hostPageContents(tier, hostPage), poisonPage(tier)) << "a refused load wrote a host page";
        }
    }
}

TEST_F(SequenceFileScalesTest, HostHeldScalesNeedTheCacheAndItsGeometry)
{
    CacheUnderTest perTensor(scaledConfig({KVQuantization::kFP8_PER_TENSOR, DataType::kFP8_E4M3}), 5);
    CacheUnderTest plain(scaledConfig({KVQuantization::kNONE, DataType::kFP8_E4M3}), 6);
    HostTier tier(perTensor.cache(), 0, kHOST_PAGES);
    std::vector<int32_t> const hostPages{0, 1};
    for (char const* what : {"saveSequence", "loadSequence"})
    {
        bool const save = std::string(what) == "saveSequence";
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&]
            {
                if (save)
                {
                    saveSequence(mPath, tier, hostPages.data(), 2, 16);
                }
                else
                {
                    loadSequence(mPath, tier, hostPages.data(), 2);
                }
            },
            {what, "KVCacheConfig.quantization is fp8_per_tensor", "pass the cache"}));
        // A cache whose group has another geometry than the tier's (here: only the quantization differs).
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&]
            {
                if (save)
                {
                    saveSequence(mPath, tier, plain.cache(), hostPages.data(), 2, 16);
                }
                else
                {
                    loadSequence(mPath, tier, plain.cache(), hostPages.data(), 2);
                }
            },
            {what, "another geometry", "quantization is none in the cache and fp8_per_tensor in the tier"}));
        EXPECT_FALSE(fs::exists(mPath));
    }

    // Page scales live in the host pages: a per-token-head tier saves and loads without the cache.
    CacheUnderTest tokenHead(scaledConfig(test::kSCALED_FORMATS[0]), 9);
    HostTier tokenHeadTier(tokenHead.cache(), 2, kHOST_PAGES);
    auto const lists = twoPageLists(tokenHead, 2, 2);
    test::roundTrip(
        tokenHead, tokenHeadTier, lists.first, lists.second, {3, 5},
        [&](std::vector<HostTierEntry> const& entries)
        {
            std::vector<int32_t> const scratch{0, 1};
            tokenHeadTier.offload(tokenHead.cache(), test::pairEntries(lists.first, scratch), tokenHead.stream());
            saveSequence(mPath, tokenHeadTier, scratch.data(), 2, 16);
            std::vector<int32_t> const loaded{entries[0].hostPage, entries[1].hostPage};
            EXPECT_EQ(loadSequence(mPath, tokenHeadTier, loaded.data(), 2), 16);
        },
        [&](std::vector<HostTierEntry> const& entries)
        { tokenHeadTier.onboard(tokenHead.cache(), entries, tokenHead.stream()); },
        [] {});
}

} // namespace
} // namespace kvcache::rt
