// The host tier's transfer paths at their limits, beside the contract (test_host_tier_contract.cu): copy-engine batches
// in parts and in several staging rounds, kernel transfers of several launches, device lists of many launches, long
// lists carrying scales in every launch and round, kAUTO at its boundary, and the tier under a PageManager onboarding
// an evicted prefix. Every byte is checked against the independent page model (support/page_op_reference.h).

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/paging/page_manager.h"
#include "kvcache/tiers/host_tier.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/gpu_test.h"
#include "support/host_page_reference.h"
#include "support/host_tier_contract.h"
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
using test::poisonHostPage;
using test::ReferenceCache;

using HostTierPathTest = test::GpuTest;

//! What a host page poisoned with kHOST_PAGE_POISON holds.
std::vector<uint8_t> poisonedHostPage(HostTier const& tier)
{
    return std::vector<uint8_t>(static_cast<size_t>(tier.hostPageBytes()), test::kHOST_PAGE_POISON);
}

//! Ninety scattered pages through the copy engine: a batch moves in parts of 1, 8, 64 and the rest (onboards the other
//! way round), the kernels of most parts on the tier's own stream while another part copies. With the default staging
//! all ninety are one batch; with 40 host pages a half, three batches (40, 40, 10) of up to three parts each.
TEST_F(HostTierPathTest, CopyEngineBatchesInPartsAreBitwise)
{
    constexpr int32_t kENTRIES = 90;
    constexpr int32_t kHOST_PAGES = 100;
    for (int32_t const stagingPages : {0, 40})
    {
        SCOPED_TRACE(::testing::Message() << "staging host pages " << stagingPages);
        KVCacheConfig config = test::mixedLayerConfig(DataType::kHALF, 16);
        config.numPages = 2 * kENTRIES + 12;
        CacheUnderTest cut(config, 11);
        HostTierOptions options;
        if (stagingPages > 0)
        {
            options.stagingBytes = 2 * int64_t{stagingPages} * cut.reference().model().groups[0].bytesPerPage;
        }
        HostTier tier(cut.cache(), 0, kHOST_PAGES, options);
        tier.waitUntilReady();
        ASSERT_EQ(tier.numStagingHostPages(), stagingPages > 0 ? stagingPages : kHOST_PAGES);
        for (int32_t s = 0; s < kHOST_PAGES; ++s)
        {
            poisonHostPage(tier, s);
        }
        std::mt19937 random(11);
        std::vector<int32_t> hostPages(kHOST_PAGES);
        std::iota(hostPages.begin(), hostPages.end(), 0);
        std::shuffle(hostPages.begin(), hostPages.end(), random);
        std::vector<int32_t> const unused(hostPages.begin() + kENTRIES, hostPages.end());
        hostPages.resize(kENTRIES);
        std::pair<std::vector<int32_t>, std::vector<int32_t>> const lists = test::twoPageLists(cut, 0, kENTRIES);
        test::roundTrip(
            cut, tier, lists.first, lists.second, hostPages,
            [&](std::vector<HostTierEntry> const& entries)
            {
                EXPECT_EQ(tier.offload(cut.cache(), entries, cut.stream(), HostTierMethod::kCOPY_ENGINE),
                    HostTierMethod::kCOPY_ENGINE);
            },
            [&](std::vector<HostTierEntry> const& entries)
            {
                EXPECT_EQ(tier.onboard(cut.cache(), entries, cut.stream(), HostTierMethod::kCOPY_ENGINE),
                    HostTierMethod::kCOPY_ENGINE);
            },
            [] {});
        ASSERT_FALSE(HasFatalFailure());
        for (int32_t const hostPage : unused)
        {
            ASSERT_EQ(hostPageContents(tier, hostPage), poisonedHostPage(tier)) << "host page " << hostPage;
        }
    }
}

TEST_F(HostTierPathTest, KernelTransfersOfManyLaunchesAreBitwise)
{
    // 4 MiB host pages: the kernel path moves 16 MiB a launch, so ten entries take three launches (4 + 4 + 2) and a
    // device list of capacity 12 three launches too, the last cut short by the count; a list of 100 positions takes
    // longer launches. Then kAUTO at its boundary.
    CacheUnderTest cut(test::ConfigBuilder(std::vector<KVLayerConfig>(4, KVLayerConfig{8, 128}))
                           .maxBatchSize(2)
                           .maxSequenceLength(256)
                           .tokensPerPage(128)
                           .dataType(DataType::kFLOAT)
                           .numPages(24),
        13);
    ASSERT_EQ(cut.reference().model().groups[0].bytesPerPage, int64_t{4} << 20);
    constexpr int32_t kHOST_PAGES = 14;
    HostTier tier(cut.cache(), 0, kHOST_PAGES);
    tier.waitUntilReady();
    for (int32_t s = 0; s < kHOST_PAGES; ++s)
    {
        poisonHostPage(tier, s);
    }
    // Sources: the odd pages 23, 21, ..., 5; destinations: the even pages 18, 16, ..., 0, so destination i gets the
    // source of position 9 - i; host pages (5i + 3) mod 14, which misses host pages 2, 7, 11 and 12.
    std::vector<int32_t> sources;
    std::vector<int32_t> destinations;
    std::vector<int32_t> hostPages;
    for (int32_t i = 0; i < 10; ++i)
    {
        sources.push_back(23 - 2 * i);
        destinations.push_back(18 - 2 * i);
        hostPages.push_back((5 * i + 3) % kHOST_PAGES);
    }
    ReferenceCache initial = cut.reference();
    test::roundTrip(
        cut, tier, sources, destinations, hostPages,
        [&](std::vector<HostTierEntry> const& entries) {
            EXPECT_EQ(
                tier.offload(cut.cache(), entries, cut.stream(), HostTierMethod::kKERNEL), HostTierMethod::kKERNEL);
        },
        [&](std::vector<HostTierEntry> const& entries) {
            EXPECT_EQ(
                tier.onboard(cut.cache(), entries, cut.stream(), HostTierMethod::kKERNEL), HostTierMethod::kKERNEL);
        },
        [&] { KVCACHE_CUDA_TRY(cudaStreamSynchronize(cut.stream())); });
    ASSERT_FALSE(HasFatalFailure());
    for (int32_t const untouched : {2, 7, 11, 12})
    {
        EXPECT_EQ(hostPageContents(tier, untouched), poisonedHostPage(tier)) << "host page " << untouched;
    }

    // A device list onto pages 1, 3, ..., 23 (position i: host page i mod 10 of the ones above): a bad host page in
    // the second launch counted once, positions past the count left alone.
    std::vector<int32_t> targets;
    std::vector<HostTierEntry> deviceIn;
    for (int32_t i = 0; i < 12; ++i)
    {
        targets.push_back(1 + 2 * i);
        deviceIn.push_back({targets.back(), hostPages[static_cast<size_t>(i % 10)]});
    }
    deviceIn[5].hostPage = kHOST_PAGES;
    test::poisonDevicePages(cut, targets, 0);
    DeviceArray<HostTierEntry> list(deviceIn, cut.stream());
    DeviceArray<int32_t> count(std::vector<int32_t>{10}, cut.stream());
    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cut.stream());
    tier.onboardDevice(cut.cache(), list.get(), 12, count.get(), cut.stream(), errors.get());
    EXPECT_EQ(errors.download(cut.stream())[0], 1);
    for (int32_t i = 0; i < 10; ++i)
    {
        if (i != 5)
        {
            test::copyModelPage(
                cut.reference(), initial, 0, sources[static_cast<size_t>(i)], targets[static_cast<size_t>(i)]);
        }
    }
    EXPECT_TRUE(cut.matchesReference()) << "the device list of three launches";

    // A long device list: 100 positions of 4 MiB take 15 launches of 7 (not 25 of 4); three real entries far apart.
    std::vector<int32_t> const far{0, 2, 4};
    test::poisonDevicePages(cut, far, 0);
    std::vector<HostTierEntry> sparse(100, HostTierEntry{kUNUSED_PAGE_ENTRY, kUNUSED_PAGE_ENTRY});
    sparse[0] = {far[0], hostPages[0]};
    sparse[50] = {far[1], hostPages[1]};
    sparse[99] = {far[2], hostPages[2]};
    DeviceArray<HostTierEntry> longList(sparse, cut.stream());
    tier.onboardDevice(cut.cache(), longList.get(), 100, nullptr, cut.stream());
    for (size_t i = 0; i < far.size(); ++i)
    {
        test::copyModelPage(cut.reference(), initial, 0, sources[i], far[i]);
    }
    EXPECT_TRUE(cut.matchesReference()) << "the long device list";

    // kAUTO's rule at its boundary: one host page of kHOST_TIER_KERNEL_MAX_BYTES by the kernel, two by the copy engine.
    ASSERT_EQ(tier.hostPageBytes(), kHOST_TIER_KERNEL_MAX_BYTES);
    for (int32_t const s : {2, 7, 11})
    {
        poisonHostPage(tier, s);
    }
    EXPECT_EQ(tier.offload(cut.cache(), {{3, 2}}, cut.stream()), HostTierMethod::kKERNEL);
    EXPECT_EQ(tier.offload(cut.cache(), {{5, 7}, {7, 11}}, cut.stream()), HostTierMethod::kCOPY_ENGINE);
    EXPECT_EQ(hostPageContents(tier, 2), expectedHostPage(cut.reference(), 0, 3));
    EXPECT_EQ(hostPageContents(tier, 7), expectedHostPage(cut.reference(), 0, 5));
    EXPECT_EQ(hostPageContents(tier, 11), expectedHostPage(cut.reference(), 0, 7));
}

TEST_F(HostTierPathTest, LongListsCarryScalesInEveryLaunchAndRound)
{
    // More entries than one kernel launch takes (kMAX_INLINE_PAGE_OPS), and than the staging holds at a time.
    constexpr int32_t kENTRIES = kMAX_INLINE_PAGE_OPS + 40;
    for (test::ScaledFormat const format : test::kSCALED_FORMATS)
    {
        SCOPED_TRACE(test::nameOf(format));
        CacheUnderTest cut(test::pagePoolConfig({{2, 32}, {1, 16, 0, KVLayerKind::kLATENT}}, 16, 700)
                               .dataType(format.storage)
                               .quantization(format.quantization),
            41);
        for (HostTierMethod const method : {HostTierMethod::kKERNEL, HostTierMethod::kCOPY_ENGINE})
        {
            cut.refill(); // no page left poisoned by the method before
            HostTierOptions options;
            options.stagingBytes = 2 * 100 * cut.reference().model().groups[0].bytesPerPage;
            HostTier tier(cut.cache(), 0, kENTRIES, options);
            tier.waitUntilReady();
            std::vector<int32_t> hostPages(kENTRIES);
            for (int32_t i = 0; i < kENTRIES; ++i)
            {
                hostPages[static_cast<size_t>(i)] = kENTRIES - 1 - i;
            }
            std::pair<std::vector<int32_t>, std::vector<int32_t>> const lists = test::twoPageLists(cut, 0, kENTRIES);
            test::roundTrip(
                cut, tier, lists.first, lists.second, hostPages,
                [&](std::vector<HostTierEntry> const& entries)
                { EXPECT_EQ(tier.offload(cut.cache(), entries, cut.stream(), method), method); },
                [&](std::vector<HostTierEntry> const& entries)
                { EXPECT_EQ(tier.onboard(cut.cache(), entries, cut.stream(), method), method); },
                [] {});
            ASSERT_FALSE(HasFatalFailure());
        }
    }
}

// The tier under a PageManager, as a runtime wires them: eviction offloads each page to a host page and remembers its
// hash; a later request of the same prompt misses on the GPU, finds the next pages' hashes (hashNextPages) in the tier,
// appends those tokens (fresh pages registered under the same hashes) and onboards the host pages into them. The device
// is poisoned in between, so every byte checked came back through the tier; a third request then adopts the pages.
TEST_F(HostTierPathTest, AnEvictedPrefixIsOnboardedIntoFreshPagesOnAPrefixHit)
{
    KVCacheConfig const config = test::mixedLayerConfig(DataType::kHALF, 16);
    CacheUnderTest cut(config, 17);
    PageManagerOptions options;
    options.maxSequences = 4;
    PageManager manager(config, options);
    HostTier tier(cut.cache(), 0, 8);
    std::map<std::pair<uint64_t, uint64_t>, int32_t> hostPageOfHash;
    std::map<int32_t, int32_t> evictedPageOfHostPage;
    manager.setEvictionCallback(
        [&](int32_t group, int32_t page, PageHash hash)
        {
            ASSERT_EQ(group, 0);
            int32_t const hostPage = tier.allocateHostPages(1)[0];
            poisonHostPage(tier, hostPage);
            // kAUTO moves a list this small with the kernel.
            EXPECT_EQ(tier.offload(cut.cache(), {{page, hostPage}}, cut.stream()), HostTierMethod::kKERNEL);
            hostPageOfHash[{hash.lo, hash.hi}] = hostPage;
            evictedPageOfHostPage[hostPage] = page;
        });
    std::vector<int32_t> prompt(4 * 16 + 5);
    for (size_t i = 0; i < prompt.size(); ++i)
    {
        prompt[i] = static_cast<int32_t>(1000 + 7 * i);
    }
    auto const count = static_cast<int32_t>(prompt.size());

    SequenceId const donor = manager.create();
    manager.append({donor, prompt.data(), count});
    manager.free(donor);
    ASSERT_EQ(manager.evictCached(0, 4), 4);
    ASSERT_EQ(evictedPageOfHostPage.size(), 4u);
    for (auto const& [hostPage, page] : evictedPageOfHostPage)
    {
        EXPECT_EQ(hostPageContents(tier, hostPage), expectedHostPage(cut.reference(), 0, page))
            << "host page " << hostPage;
    }
    ReferenceCache evicted = cut.reference();
    std::vector<int32_t> every(static_cast<size_t>(cut.numPages(0)));
    std::iota(every.begin(), every.end(), 0);
    test::poisonDevicePages(cut, every, 0);

    SequenceId const request = manager.create();
    ASSERT_EQ(manager.adoptPrefix(request, prompt.data(), count), 0);
    std::vector<PageHash> hashes(4);
    ASSERT_EQ(manager.hashNextPages(request, prompt.data(), count, hashes.data()), 4);
    std::vector<int32_t> hostPages;
    for (PageHash const& hash : hashes)
    {
        auto const found = hostPageOfHash.find({hash.lo, hash.hi});
        if (found == hostPageOfHash.end())
        {
            break;
        }
        hostPages.push_back(found->second);
    }
    ASSERT_EQ(hostPages.size(), 4u);
    manager.append({request, prompt.data(), 4 * 16});
    SequencePages const pages = manager.pages(request, 0);
    ASSERT_EQ(pages.numPages, 4);
    std::vector<int32_t> const onboarded(pages.pages, pages.pages + 4);
    std::vector<HostTierEntry> entries;
    for (size_t i = 0; i < 4; ++i)
    {
        entries.push_back({onboarded[i], hostPages[i]});
        test::copyModelPage(cut.reference(), evicted, 0, evictedPageOfHostPage[hostPages[i]], onboarded[i]);
    }
    EXPECT_EQ(tier.onboard(cut.cache(), entries, cut.stream()), HostTierMethod::kKERNEL);
    EXPECT_TRUE(cut.matchesReference()) << "the prompt's pages came back from the host pages";

    manager.free(request);
    SequenceId const next = manager.create();
    EXPECT_EQ(manager.adoptPrefix(next, prompt.data(), count), 4 * 16);
    SequencePages const adopted = manager.pages(next, 0);
    EXPECT_EQ(std::vector<int32_t>(adopted.pages, adopted.pages + adopted.numPages), onboarded);
    EXPECT_NO_THROW(manager.checkInvariants());
}

} // namespace
} // namespace kvcache::rt
