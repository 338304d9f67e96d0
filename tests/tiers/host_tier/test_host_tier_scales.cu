// Host tiers of quantized caches: a host page holds the page's data of every layer of its group, then its scales (FP8
// per token-head, NVFP4), laid out as support/host_page_reference.h writes it from the formulas, in exactly the group's
// bytesPerPage. Offload and onboard, host lists by either method and device lists (also replayed in a graph), move
// data and scales together, bit for bit, in every page group of a hybrid cache with windowed and latent layers: random
// bytes (K and V distinct, scales distinct from data), host pages poisoned before an offload, device pages reset before
// an onboard into other pages, every byte of every layer and scale pool compared with the model afterwards.

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/tiers/host_tier.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
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

using test::CacheUnderTest;
using test::DeviceArray;
using test::expectedHostPage;
using test::hostPageContents;
using test::kEVERY_FORMAT;
using test::kHOST_PAGE_POISON;
using test::nameOf;
using test::scaledConfig;
using test::ScaledFormat;
using test::throwsNaming;
using test::twoPageLists;

constexpr int32_t kHOST_PAGES = 8;

using HostTierScalesTest = test::GpuTest;

TEST_F(HostTierScalesTest, HostListsMoveDataAndScalesOfEveryGroupByEitherMethod)
{
    uint64_t seed = 11;
    for (ScaledFormat const format : kEVERY_FORMAT)
    {
        SCOPED_TRACE(nameOf(format));
        CacheUnderTest cut(scaledConfig(format), ++seed);
        bool const scaled =
            format.quantization == KVQuantization::kFP8_PER_TOKEN_HEAD || format.quantization == KVQuantization::kNVFP4;
        ASSERT_EQ(cut.reference().hasScales(), scaled) << "the model must hold scales, or nothing below checks them";
        for (int32_t group = 0; group < 3; ++group)
        {
            SCOPED_TRACE("group " + std::to_string(group));
            int64_t const bytes = cut.reference().model().groups[static_cast<size_t>(group)].bytesPerPage;
            // The copy engine moves five entries straight on the cache's stream, and through the staging buffer on
            // the legacy default stream (which takes no batch copies): two host pages at a time, three rounds.
            for (auto const& run : {std::pair{HostTierMethod::kKERNEL, false},
                     std::pair{HostTierMethod::kCOPY_ENGINE, false}, std::pair{HostTierMethod::kCOPY_ENGINE, true}})
            {
                HostTierMethod const method = run.first;
                bool const legacyStream = run.second;
                SCOPED_TRACE(method == HostTierMethod::kKERNEL ? "kernel"
                        : legacyStream                         ? "copy engine, legacy default stream"
                                                               : "copy engine");
                cudaStream_t const stream = legacyStream ? cudaStreamLegacy : cut.stream();
                // The cache's stream's work done before, and the transfer's after, when they are two streams.
                auto const settle = [&]
                {
                    KVCACHE_CUDA_TRY(cudaStreamSynchronize(cut.stream()));
                    KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
                };
                HostTierOptions options;
                options.stagingBytes = 2 * 2 * bytes;
                HostTier tier(cut.cache(), group, kHOST_PAGES, options);
                ASSERT_EQ(tier.hostPageBytes(), bytes) << "a host page is the group's data and scale bytes";
                ASSERT_EQ(
                    static_cast<int64_t>(expectedHostPage(cut.reference(), group, 0).size()), tier.hostPageBytes());
                EXPECT_EQ(tier.quantization(), format.quantization);
                EXPECT_EQ(tier.geometry().quantization, format.quantization);
                auto const [sources, destinations] = twoPageLists(cut, group, 5);
                test::roundTrip(
                    cut, tier, sources, destinations, {6, 0, 3, 4, 1},
                    [&](std::vector<HostTierEntry> const& entries)
                    {
                        settle();
                        EXPECT_EQ(tier.offload(cut.cache(), entries, stream, method), method);
                    },
                    [&](std::vector<HostTierEntry> const& entries)
                    {
                        settle();
                        EXPECT_EQ(tier.onboard(cut.cache(), entries, stream, method), method);
                    },
                    settle);
                if (HasFatalFailure())
                {
                    return;
                }
            }
        }
    }
}

TEST_F(HostTierScalesTest, DeviceListsMoveDataAndScalesAndCountEachBadEntryOnce)
{
    uint64_t seed = 23;
    for (ScaledFormat const format : test::kSCALED_FORMATS)
    {
        SCOPED_TRACE(nameOf(format));
        CacheUnderTest cut(scaledConfig(format), ++seed);
        for (int32_t group = 0; group < 3; ++group)
        {
            SCOPED_TRACE("group " + std::to_string(group));
            HostTier tier(cut.cache(), group, kHOST_PAGES);
            int32_t const numPages = cut.numPages(group);
            auto const [sources, destinations] = twoPageLists(cut, group, 4);
            // Each device list: the four entries with a bad one and padding in between, and one past the count.
            auto const run = [&](bool toHost, std::vector<HostTierEntry> const& entries)
            {
                std::vector<HostTierEntry> list{entries[0], {numPages, 2}, entries[1], {kUNUSED_PAGE_ENTRY, 5},
                    entries[2], {1, kHOST_PAGES + 3}, entries[3], {entries[0].page, 7}};
                DeviceArray<HostTierEntry> deviceList(list, cut.stream());
                DeviceArray<int32_t> count(std::vector<int32_t>{7}, cut.stream());
                DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cut.stream());
                auto const capacity = static_cast<int32_t>(list.size());
                if (toHost)
                {
                    tier.offloadDevice(
                        cut.cache(), deviceList.get(), capacity, count.get(), cut.stream(), errors.get());
                }
                else
                {
                    tier.onboardDevice(
                        cut.cache(), deviceList.get(), capacity, count.get(), cut.stream(), errors.get());
                }
                EXPECT_EQ(errors.download(cut.stream())[0], 2) << "a bad entry counts once, not once a table entry";
            };
            test::poisonHostPage(tier, 7); // past the count: must stay poisoned
            test::roundTrip(
                cut, tier, sources, destinations, {3, 0, 6, 1},
                [&](std::vector<HostTierEntry> const& entries) { run(true, entries); },
                [&](std::vector<HostTierEntry> const& entries) { run(false, entries); },
                [&] { KVCACHE_CUDA_TRY(cudaStreamSynchronize(cut.stream())); });
            EXPECT_EQ(hostPageContents(tier, 7),
                std::vector<uint8_t>(static_cast<size_t>(tier.hostPageBytes()), kHOST_PAGE_POISON));
            if (HasFatalFailure())
            {
                return;
            }
        }
    }
}

TEST_F(HostTierScalesTest, CapturedDeviceListsReplayWithScales)
{
    CacheUnderTest cut(scaledConfig(test::kSCALED_FORMATS[1]), 37);
    int32_t const group = 1; // a window with a latent layer: no V scales there
    HostTier tier(cut.cache(), group, kHOST_PAGES);
    DeviceArray<HostTierEntry> list(3);
    test::CapturedGraph offload(
        cut.stream(), [&] { tier.offloadDevice(cut.cache(), list.get(), 3, nullptr, cut.stream()); });
    test::CapturedGraph onboard(
        cut.stream(), [&] { tier.onboardDevice(cut.cache(), list.get(), 3, nullptr, cut.stream()); });
    for (int32_t replay = 0; replay < 2; ++replay)
    {
        SCOPED_TRACE("replay " + std::to_string(replay));
        auto const [sources, destinations] = twoPageLists(cut, group, 3);
        test::roundTrip(
            cut, tier, sources, destinations, {replay, 4, 7 - replay},
            [&](std::vector<HostTierEntry> const& entries)
            {
                list.upload(entries, cut.stream());
                offload.launch(cut.stream());
            },
            [&](std::vector<HostTierEntry> const& entries)
            {
                list.upload(entries, cut.stream());
                onboard.launch(cut.stream());
            },
            [&] { KVCACHE_CUDA_TRY(cudaStreamSynchronize(cut.stream())); });
        ASSERT_FALSE(HasFatalFailure());
    }
}

TEST_F(HostTierScalesTest, LongListsCarryScalesInEveryLaunchAndRound)
{
    // More entries than one kernel launch takes (kMAX_INLINE_PAGE_OPS), and than the staging holds at a time.
    constexpr int32_t kENTRIES = kMAX_INLINE_PAGE_OPS + 40;
    for (ScaledFormat const format : test::kSCALED_FORMATS)
    {
        SCOPED_TRACE(nameOf(format));
        CacheUnderTest cut(test::pagePoolConfig({{2, 32}, {1, 16, 0, KVLayerKind::kLATENT}}, 16, 700)
                               .dataType(format.storage)
                               .quantization(format.quantization),
            41);
        for (HostTierMethod const method : {HostTierMethod::kKERNEL, HostTierMethod::kCOPY_ENGINE})
        {
            HostTierOptions options;
            options.stagingBytes = 2 * 100 * cut.reference().model().groups[0].bytesPerPage;
            HostTier tier(cut.cache(), 0, kENTRIES, options);
            tier.waitUntilReady();
            std::vector<int32_t> hostPages(kENTRIES);
            for (int32_t i = 0; i < kENTRIES; ++i)
            {
                hostPages[static_cast<size_t>(i)] = kENTRIES - 1 - i;
            }
            auto const [sources, destinations] = twoPageLists(cut, 0, kENTRIES);
            test::roundTrip(
                cut, tier, sources, destinations, hostPages,
                [&](std::vector<HostTierEntry> const& entries)
                { EXPECT_EQ(tier.offload(cut.cache(), entries, cut.stream(), method), method); },
                [&](std::vector<HostTierEntry> const& entries)
                { EXPECT_EQ(tier.onboard(cut.cache(), entries, cut.stream(), method), method); },
                [] {});
            ASSERT_FALSE(HasFatalFailure());
        }
    }
}

TEST_F(HostTierScalesTest, ACacheOfAnotherQuantizationIsRefusedBeforeAnythingMoves)
{
    // Per-tensor FP8 and unscaled FP8 pages have the same bytes; the quantization tells them apart.
    CacheUnderTest perTensor(scaledConfig({KVQuantization::kFP8_PER_TENSOR, DataType::kFP8_E4M3}), 43);
    CacheUnderTest plain(scaledConfig({KVQuantization::kNONE, DataType::kFP8_E4M3}), 47);
    HostTier tier(perTensor.cache(), 0, 2);
    ASSERT_EQ(tier.hostPageBytes(), plain.reference().model().groups[0].bytesPerPage);
    test::poisonHostPage(tier, 0);
    std::vector<HostTierEntry> const entries{{3, 0}};
    for (HostTierMethod const method : {HostTierMethod::kKERNEL, HostTierMethod::kCOPY_ENGINE})
    {
        EXPECT_TRUE(
            throwsNaming<InvalidArgumentError>([&] { tier.offload(plain.cache(), entries, plain.stream(), method); },
                {"HostTier::offload", "quantization is none in the cache and fp8_per_tensor in the tier"}));
        EXPECT_TRUE(
            throwsNaming<InvalidArgumentError>([&] { tier.onboard(plain.cache(), entries, plain.stream(), method); },
                {"HostTier::onboard", "quantization is none in the cache and fp8_per_tensor in the tier"}));
    }
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { tier.offloadDevice(plain.cache(), nullptr, 0, nullptr, plain.stream()); },
        {"quantization is none in the cache and fp8_per_tensor in the tier"}));
    EXPECT_EQ(
        hostPageContents(tier, 0), std::vector<uint8_t>(static_cast<size_t>(tier.hostPageBytes()), kHOST_PAGE_POISON));
    EXPECT_TRUE(plain.matchesReference());
}

} // namespace
} // namespace kvcache::rt
