// The host tier's contract, one suite instantiated over every cache variant of support/host_tier_contract.h (each
// element type, every quantization in every page group of a hybrid cache, caches with state layers): the queries;
// offload and onboard by every method, on the caller's stream and the legacy default stream, and from device lists
// (also replayed in a graph), bit for bit against the independent models with every other byte of the cache unchanged;
// a transfer on another stream waiting for one in flight; the host page pool; sequence files over host pages; host
// states where the cache has none; and every refusal of bad input, with the named error and nothing changed.
// test_host_tier_states.cu holds the host state contract, test_host_tier.cu the paths' limits (parts, launches).

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/tiers/host_tier.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "support/cuda_raii.h"
#include "support/error_matchers.h"
#include "support/held_stream.cuh"
#include "support/host_tier_contract.h"

namespace kvcache::rt
{
namespace
{

using test::CapturedGraph;
using test::CudaStream;
using test::DeviceArray;
using test::expectedHostPage;
using test::hostPageContents;
using test::poisonHostPage;
using test::ReferenceCache;
using test::throwsNaming;

using HostTierContract = test::HostTierContract;

//! A method, the stream it runs on (the caller's, or the legacy default stream, which takes no batch copies, so the
//! copy engine stages every transfer there) and the host pages of staging a direction: two, so that a staged transfer
//! of five entries takes three rounds, or the default, which holds every host page of the tier (one round).
struct MethodRun
{
    HostTierMethod method;
    bool legacyStream;
    int32_t stagingHostPages;
    char const* name;
};

constexpr MethodRun kMETHOD_RUNS[] = {
    {HostTierMethod::kKERNEL, false, 2, "kernel"},
    {HostTierMethod::kKERNEL, true, 2, "kernel, legacy default stream"},
    {HostTierMethod::kCOPY_ENGINE, false, 2, "copy engine"},
    {HostTierMethod::kCOPY_ENGINE, true, 2, "copy engine, legacy default stream, three staging rounds"},
    {HostTierMethod::kCOPY_ENGINE, true, 0, "copy engine, legacy default stream, one staging round"},
    {HostTierMethod::kAUTO, false, 2, "auto"},
};

TEST_P(HostTierContract, QueriesDescribeTheTierFromTheModel)
{
    int64_t const bytes = modelHostPageBytes();
    test::ModelGroup const& modelGroup = cut().reference().model().groups.at(static_cast<size_t>(group()));
    auto const tier = makeTier(6, options());
    EXPECT_EQ(tier->hostPageBytes(), bytes);
    EXPECT_EQ(static_cast<int64_t>(expectedHostPage(cut().reference(), group(), 0).size()), bytes);
    EXPECT_EQ(tier->group(), group());
    EXPECT_EQ(tier->device(), cut().cache().device());
    EXPECT_GE(tier->numaNode(), -1);
    EXPECT_EQ(tier->quantization(), GetParam().config.quantization);
    EXPECT_EQ(tier->geometry().quantization, GetParam().config.quantization);
    EXPECT_EQ(tier->geometry().dataType, GetParam().config.kvCacheType);
    EXPECT_EQ(tier->geometry().tokensPerPage, GetParam().config.tokensPerPage);
    EXPECT_EQ(tier->geometry().slidingWindow, modelGroup.slidingWindow);
    EXPECT_EQ(tier->geometry().layers.size(), modelGroup.layers.size());
    EXPECT_EQ(tier->geometry().bytesPerPage, bytes);
    EXPECT_EQ(tier->numHostPages(), 6);
    EXPECT_EQ(tier->numPinnedHostPages(), 6);
    EXPECT_EQ(tier->numFreeHostPages(), 6);
    EXPECT_EQ(tier->lastEvent(), nullptr) << "no transfer yet";
    EXPECT_EQ(tier->numHostStates(), GetParam().numHostStates);
    EXPECT_EQ(tier->numFreeHostStates(), GetParam().numHostStates);
    EXPECT_EQ(tier->hostStateBytes(), hasStates() ? states().slotBytes() : 0);
    // Staging: half the bytes a direction, in whole host pages, at least one and at most the tier's.
    EXPECT_EQ(tier->numStagingHostPages(), std::clamp<int64_t>((int64_t{128} << 20) / 2 / bytes, 1, 6));
    std::pair<int64_t, int32_t> const stagings[] = {{0, 1}, {2 * (2 * bytes + bytes / 2), 2}, {int64_t{1} << 50, 6}};
    for (auto const& [stagingBytes, hostPages] : stagings)
    {
        HostTierOptions staged = options();
        staged.stagingBytes = stagingBytes;
        EXPECT_EQ(HostTier(cut().cache(), group(), 6, staged).numStagingHostPages(), hostPages)
            << "stagingBytes " << stagingBytes;
    }
}

TEST_P(HostTierContract, OffloadAndOnboardRoundTripBitwiseByEveryMethod)
{
    int64_t const bytes = modelHostPageBytes();
    for (MethodRun const& run : kMETHOD_RUNS)
    {
        SCOPED_TRACE(run.name);
        // New bytes each run: the run before left poisoned pages, which an onboard into poisoned pages cannot show.
        cut().refill();
        cudaStream_t const stream = run.legacyStream ? cudaStreamLegacy : cut().stream();
        // The cache's stream's work done before a transfer, and the transfer's after, when they are two streams.
        auto const settle = [&]
        {
            KVCACHE_CUDA_TRY(cudaStreamSynchronize(cut().stream()));
            KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
        };
        auto const tier = makeTier(8, options(run.stagingHostPages));
        ASSERT_EQ(tier->numStagingHostPages(), run.stagingHostPages > 0 ? run.stagingHostPages : 8);
        HostTierMethod const expected = run.method != HostTierMethod::kAUTO ? run.method
            : 5 * bytes <= kHOST_TIER_KERNEL_MAX_BYTES                      ? HostTierMethod::kKERNEL
                                                                            : HostTierMethod::kCOPY_ENGINE;
        std::pair<std::vector<int32_t>, std::vector<int32_t>> const lists = test::twoPageLists(cut(), group(), 5);
        test::roundTrip(
            cut(), *tier, lists.first, lists.second, {6, 0, 3, 4, 1},
            [&](std::vector<HostTierEntry> const& entries)
            {
                settle();
                EXPECT_EQ(tier->offload(cut().cache(), entries, stream, run.method), expected);
            },
            [&](std::vector<HostTierEntry> const& entries)
            {
                settle();
                EXPECT_EQ(tier->onboard(cut().cache(), entries, stream, run.method), expected);
            },
            settle);
        ASSERT_FALSE(HasFatalFailure());
        for (int32_t const untouched : {2, 5, 7})
        {
            EXPECT_EQ(hostPageContents(*tier, untouched), poisonedHostPage()) << "host page " << untouched;
        }
        if (hasStates())
        {
            EXPECT_TRUE(states().matchesReference()) << "a page transfer touched a state slot";
        }
    }
}

TEST_P(HostTierContract, DeviceListsSkipUnusedEntriesAndCountEachBadOneOnce)
{
    constexpr int32_t kHOST_PAGES = 8;
    auto const tier = makeTier(kHOST_PAGES, options());
    int32_t const numPages = cut().numPages(group());
    std::pair<std::vector<int32_t>, std::vector<int32_t>> const lists = test::twoPageLists(cut(), group(), 4);
    // Each device list: the four entries with a bad page, padding and a bad host page in between, and one past the
    // count.
    auto const run = [&](bool toHost, std::vector<HostTierEntry> const& entries)
    {
        std::vector<HostTierEntry> const list{entries[0], {numPages, 2}, entries[1], {kUNUSED_PAGE_ENTRY, 5},
            entries[2], {1, kHOST_PAGES + 3}, entries[3], {entries[0].page, 7}};
        DeviceArray<HostTierEntry> deviceList(list, cut().stream());
        DeviceArray<int32_t> count(std::vector<int32_t>{7}, cut().stream());
        DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cut().stream());
        auto const capacity = static_cast<int32_t>(list.size());
        if (toHost)
        {
            tier->offloadDevice(cut().cache(), deviceList.get(), capacity, count.get(), cut().stream(), errors.get());
        }
        else
        {
            tier->onboardDevice(cut().cache(), deviceList.get(), capacity, count.get(), cut().stream(), errors.get());
        }
        EXPECT_EQ(errors.download(cut().stream())[0], 2) << "a bad entry counts once";
    };
    test::roundTrip(
        cut(), *tier, lists.first, lists.second, {3, 0, 6, 1},
        [&](std::vector<HostTierEntry> const& entries) { run(true, entries); },
        [&](std::vector<HostTierEntry> const& entries) { run(false, entries); },
        [&] { KVCACHE_CUDA_TRY(cudaStreamSynchronize(cut().stream())); });
    ASSERT_FALSE(HasFatalFailure());
    for (int32_t const untouched : {2, 4, 5, 7})
    {
        EXPECT_EQ(hostPageContents(*tier, untouched), poisonedHostPage()) << "host page " << untouched;
    }
    EXPECT_EQ(tier->lastEvent(), nullptr) << "device lists record no event";
}

TEST_P(HostTierContract, CapturedDeviceListsReplayWithWhatTheListHoldsThen)
{
    auto const tier = makeTier(8, options());
    constexpr int32_t kCAPACITY = 4;
    DeviceArray<HostTierEntry> list(kCAPACITY);
    DeviceArray<int32_t> count(std::vector<int32_t>{kCAPACITY}, cut().stream());
    CapturedGraph offload(cut().stream(),
        [&] { tier->offloadDevice(cut().cache(), list.get(), kCAPACITY, count.get(), cut().stream()); });
    CapturedGraph onboard(cut().stream(),
        [&] { tier->onboardDevice(cut().cache(), list.get(), kCAPACITY, count.get(), cut().stream()); });
    for (int32_t replay = 0; replay < 2; ++replay)
    {
        SCOPED_TRACE("replay " + std::to_string(replay));
        cut().refill(); // no page left poisoned by the replay before
        // The first replay moves three entries and leaves the fourth, past the count; the second moves four.
        int32_t const moved = 3 + replay;
        std::vector<int32_t> const pages = cut().randomPages(2 * moved + 1, group());
        std::vector<int32_t> const sources(pages.begin(), pages.begin() + moved);
        std::vector<int32_t> const destinations(pages.begin() + moved, pages.begin() + 2 * moved);
        int32_t const spare = pages.back();
        std::vector<int32_t> hostPages{replay, 4, 7 - replay, 5};
        hostPages.resize(static_cast<size_t>(moved));
        count.upload({moved}, cut().stream());
        auto const listed = [&](std::vector<HostTierEntry> entries)
        {
            if (entries.size() < kCAPACITY)
            {
                entries.push_back({spare, 5}); // past the count: host page 5 and page `spare` stay as they are
            }
            list.upload(entries, cut().stream());
        };
        test::roundTrip(
            cut(), *tier, sources, destinations, hostPages,
            [&](std::vector<HostTierEntry> const& entries)
            {
                listed(entries);
                offload.launch(cut().stream());
            },
            [&](std::vector<HostTierEntry> const& entries)
            {
                listed(entries);
                onboard.launch(cut().stream());
            },
            [&] { KVCACHE_CUDA_TRY(cudaStreamSynchronize(cut().stream())); });
        ASSERT_FALSE(HasFatalFailure());
        if (replay == 0)
        {
            EXPECT_EQ(hostPageContents(*tier, 5), poisonedHostPage()) << "the entry past the count moved";
        }
    }
}

TEST_P(HostTierContract, ATransferOnAnotherStreamWaitsForOneInFlightOnItsHostPage)
{
    for (HostTierMethod const method : {HostTierMethod::kCOPY_ENGINE, HostTierMethod::kKERNEL})
    {
        SCOPED_TRACE(method == HostTierMethod::kKERNEL ? "kernel" : "copy engine");
        auto const tier = makeTier(4, options());
        std::vector<int32_t> const pages = cut().randomPages(2, group());
        ReferenceCache offloaded = cut().reference();
        CudaStream other;
        // The cache's stream is held back, so the offload into host page 2 is still queued when `other` onboards it.
        test::HeldStream const held(cut().stream());
        tier->offload(cut().cache(), {{pages[0], 2}}, cut().stream(), method);
        // The host page may read idle only if the spin is over.
        bool const busy = tier->isHostPageBusy(2);
        EXPECT_TRUE(busy || held.released());
        tier->onboard(cut().cache(), {{pages[1], 2}}, other.get(), method);
        other.synchronize();
        // Had `other` not waited, pages[1] would hold the poisoned host page.
        test::copyModelPage(cut().reference(), offloaded, group(), pages[0], pages[1]);
        EXPECT_TRUE(cut().matchesReference());
        EXPECT_EQ(hostPageContents(*tier, 2), expectedHostPage(offloaded, group(), pages[0]));
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(cut().stream()));
        EXPECT_FALSE(tier->isHostPageBusy(2));
        ASSERT_NE(tier->lastEvent(), nullptr);
        EXPECT_EQ(cudaEventQuery(tier->lastEvent()), cudaSuccess);
    }
}

// Copy-engine transfers of one direction share a staging half: one on another stream waits for the one in flight
// even when their host pages and pages differ; the other direction has its own half.
TEST_P(HostTierContract, CopyEngineTransfersOfOneDirectionTakeTurnsWithTheirStagingHalf)
{
    auto const tier = makeTier(6, options(1));
    ASSERT_EQ(tier->numStagingHostPages(), 1);
    std::vector<int32_t> const pages = cut().randomPages(5, group());
    CudaStream other;
    CudaStream third;
    test::HeldStream const held(cut().stream());
    tier->offload(cut().cache(), {{pages[0], 0}, {pages[1], 1}}, cut().stream(), HostTierMethod::kCOPY_ENGINE);
    tier->offload(cut().cache(), {{pages[2], 2}, {pages[3], 3}}, other.get(), HostTierMethod::kCOPY_ENGINE);
    // The second offload may be done only if the spin is over.
    bool const waited = cudaEventQuery(tier->lastEvent()) == cudaErrorNotReady;
    EXPECT_TRUE(waited || held.released());
    tier->onboard(cut().cache(), {{pages[4], 4}}, third.get(), HostTierMethod::kCOPY_ENGINE);
    third.synchronize();
    other.synchronize();
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(cut().stream()));
    for (int32_t s = 0; s < 4; ++s)
    {
        EXPECT_EQ(
            hostPageContents(*tier, s), expectedHostPage(cut().reference(), group(), pages[static_cast<size_t>(s)]))
            << "host page " << s;
    }
    // Host page 4 was poisoned: the onboard wrote the poison into every layer and scale page of pages[4].
    uint32_t const poison = 0x01010101U * test::kHOST_PAGE_POISON;
    cut().reference().reset({pages[4]}, poison, PageOpTarget{0, -1, KVHalf::kBOTH, group()});
    EXPECT_TRUE(cut().matchesReference());
}

TEST_P(HostTierContract, HostPagesAreHandedOutAndTakenBackWithTheirRefusals)
{
    auto const tier = makeTier(4, options());
    EXPECT_EQ(tier->numFreeHostPages(), 4);
    std::vector<int32_t> const three = tier->allocateHostPages(3);
    EXPECT_EQ(three, (std::vector<int32_t>{0, 1, 2})) << "never used host pages go in ascending order";
    EXPECT_EQ(tier->numFreeHostPages(), 1);
    // Refused, nothing handed out or taken back.
    EXPECT_TRUE(throwsNaming<OutOfMemoryError>(
        [&] { tier->allocateHostPages(2); }, {"allocateHostPages", "count is 2", "1 free host pages"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { tier->allocateHostPages(-1); }, {"count is -1", ">= 0"}));
    std::vector<int32_t> const twice{1, 1};
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { tier->releaseHostPages(twice.data(), 2); }, {"releaseHostPages", "host page 1", "more than once"}));
    int32_t const free = 3;
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { tier->releaseHostPages(&free, 1); }, {"hostPages[0] is host page 3", "not handed out"}));
    std::vector<int32_t> const outside{0, 4};
    EXPECT_TRUE(
        throwsNaming<OutOfRangeError>([&] { tier->releaseHostPages(outside.data(), 2); }, {"host page 4", "[0, 4)"}));
    EXPECT_TRUE(
        throwsNaming<InvalidArgumentError>([&] { tier->releaseHostPages(nullptr, 1); }, {"count is 1", "null"}));
    EXPECT_EQ(tier->numFreeHostPages(), 1);
    // Released host pages go first, then never used ones.
    tier->releaseHostPages(&three[1], 1);
    EXPECT_EQ(tier->numFreeHostPages(), 2);
    EXPECT_EQ(tier->allocateHostPages(2), (std::vector<int32_t>{1, 3}));
    EXPECT_EQ(tier->numFreeHostPages(), 0);
    EXPECT_TRUE(nothingChanged(*tier, {0, 1, 2, 3}));
}

TEST_P(HostTierContract, BadTransfersAreRefusedBeforeAnythingIsEnqueued)
{
    auto const tier = makeTier(4, options());
    KVCacheManager const& cache = cut().cache();
    cudaStream_t const stream = cut().stream();
    int32_t const n = cut().numPages(group());
    std::string const pages = "[0, " + std::to_string(n) + ")";
    test::OtherCache const otherGeometry = test::otherGeometry(GetParam());
    KVCacheManager const otherCache(otherGeometry.config, stream);
    std::string const difference = otherGeometry.field + " is " + otherGeometry.cacheValue + " in the cache and "
        + otherGeometry.tierValue + " in the tier";
    KVCacheManager const morePages(test::otherPageCount(GetParam()), stream);
    std::string const pageCounts = std::to_string(n + 1) + " pages per half; the tier's has " + std::to_string(n);
    CudaStream capturing;
    for (bool const toHost : {true, false})
    {
        std::string const what = toHost ? "HostTier::offload" : "HostTier::onboard";
        auto const call = [&](KVCacheManager const& target, HostTierEntry const* entries, int32_t count,
                              cudaStream_t on, HostTierMethod how)
        {
            if (toHost)
            {
                tier->offload(target, entries, count, on, how);
            }
            else
            {
                tier->onboard(target, entries, count, on, how);
            }
        };
        for (HostTierMethod const method :
            {HostTierMethod::kKERNEL, HostTierMethod::kCOPY_ENGINE, HostTierMethod::kAUTO})
        {
            SCOPED_TRACE(what + ", method " + std::to_string(static_cast<int32_t>(method)));
            auto const list = [&](std::vector<HostTierEntry> const& entries)
            { call(cache, entries.data(), static_cast<int32_t>(entries.size()), stream, method); };
            std::vector<HostTierEntry> const one{{1, 0}};
            test::expectListsRefused<HostTierEntry>(what,
                {{{{1, 0}, {n, 1}}, true, {"entries[1].page is page " + std::to_string(n), pages}},
                    {{{-1, 0}}, true, {"entries[0].page is page -1"}},
                    {{{1, 0}, {2, 4}}, true, {"entries[1].hostPage is host page 4", "[0, 4)"}},
                    {{{1, 0}, {2, 0}}, false, {"host page 0 is listed more than once"}},
                    {{{3, 0}, {3, 1}}, false, {"page 3 is listed more than once"}}},
                list);
            EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
                [&] { call(cache, nullptr, 2, stream, method); }, {what, "the list is null but count is 2"}));
            EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
                [&] { call(cache, one.data(), -1, stream, method); }, {what, "count is -1", ">= 0"}));
            EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
                [&] { call(otherCache, one.data(), 1, stream, method); }, {what, "another geometry", difference}));
            EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
                [&] { call(morePages, one.data(), 1, stream, method); }, {what, pageCounts}));
            KVCACHE_CUDA_TRY(cudaStreamBeginCapture(capturing.get(), cudaStreamCaptureModeRelaxed));
            EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
                [&] { call(cache, one.data(), 1, capturing.get(), method); }, {what, "the stream is capturing"}));
            cudaGraph_t graph = nullptr;
            KVCACHE_CUDA_TRY(cudaStreamEndCapture(capturing.get(), &graph));
            KVCACHE_CUDA_TRY(cudaGraphDestroy(graph));
        }
        std::vector<HostTierEntry> const one{{1, 0}};
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&] { call(cache, one.data(), 1, stream, static_cast<HostTierMethod>(7)); }, {what, "method is 7"}));
    }
    EXPECT_TRUE(nothingChanged(*tier, {0, 1, 2, 3}));
    EXPECT_EQ(tier->lastEvent(), nullptr) << "a refused transfer recorded an event";
}

TEST_P(HostTierContract, BadDeviceListsAndQueriesAreRefusedBeforeAnythingIsLaunched)
{
    auto const tier = makeTier(4, options());
    KVCacheManager const& cache = cut().cache();
    cudaStream_t const stream = cut().stream();
    KVCacheManager const otherCache(test::otherGeometry(GetParam()).config, stream);
    DeviceArray<HostTierEntry> list(std::vector<HostTierEntry>{{1, 0}}, stream);
    for (bool const toHost : {true, false})
    {
        std::string const what = toHost ? "HostTier::offloadDevice" : "HostTier::onboardDevice";
        SCOPED_TRACE(what);
        auto const call = [&](KVCacheManager const& target, HostTierEntry const* entries, int32_t capacity)
        {
            if (toHost)
            {
                tier->offloadDevice(target, entries, capacity, nullptr, stream);
            }
            else
            {
                tier->onboardDevice(target, entries, capacity, nullptr, stream);
            }
        };
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { call(cache, list.get(), -1); }, {what, "capacity is -1"}));
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&] { call(cache, nullptr, 2); }, {what, "the list is null but capacity is 2"}));
        int32_t const tooMany = kMAX_DEVICE_PAGE_OPS_PER_LAUNCH + 1;
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { call(cache, list.get(), tooMany); },
            {what, "capacity is " + std::to_string(tooMany), std::to_string(kMAX_DEVICE_PAGE_OPS_PER_LAUNCH)}));
        EXPECT_TRUE(
            throwsNaming<InvalidArgumentError>([&] { call(otherCache, list.get(), 1); }, {what, "another geometry"}));
    }
    // Host pages outside the tier: each query names it and the limit.
    int32_t const outside = 4;
    EXPECT_TRUE(throwsNaming<OutOfRangeError>(
        [&] { static_cast<void>(tier->isHostPageBusy(outside)); }, {"isHostPageBusy", "host page 4", "[0, 4)"}));
    EXPECT_TRUE(throwsNaming<OutOfRangeError>(
        [&] { static_cast<void>(tier->isHostPageBusy(-1)); }, {"isHostPageBusy", "host page -1"}));
    EXPECT_TRUE(throwsNaming<OutOfRangeError>(
        [&] { static_cast<void>(tier->hostPageData(outside)); }, {"host page 4", "[0, 4)"}));
    EXPECT_TRUE(throwsNaming<OutOfRangeError>(
        [&] { tier->synchronizeHostPages(&outside, 1); }, {"synchronizeHostPages", "host page 4", "[0, 4)"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { tier->synchronizeHostPages(nullptr, 1); }, {"synchronizeHostPages", "count is 1", "null"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { tier->synchronizeHostPages(&outside, -1); }, {"synchronizeHostPages", "count is -1"}));
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
    EXPECT_TRUE(nothingChanged(*tier, {0, 1, 2, 3}));
}

TEST_P(HostTierContract, TheConstructorRefusesBadArgumentsWithNothingChanged)
{
    KVCacheManager const& cache = cut().cache();
    auto const groups = static_cast<int32_t>(cut().reference().model().groups.size());
    auto const construct = [&](int32_t g, int64_t numHostPages, HostTierOptions const& tierOptions)
    { HostTier const tier(cache, g, numHostPages, tierOptions); };
    EXPECT_TRUE(throwsNaming<OutOfRangeError>([&] { construct(groups, 4, options()); },
        {"HostTier", "group is " + std::to_string(groups), "[0, " + std::to_string(groups) + ")"}));
    EXPECT_TRUE(throwsNaming<OutOfRangeError>([&] { construct(-1, 4, options()); }, {"HostTier", "group is -1"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { construct(group(), 0, options()); }, {"numHostPages is 0"}));
    int64_t const tooMany = int64_t{std::numeric_limits<int32_t>::max()} + 1;
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { construct(group(), tooMany, options()); },
        {"numHostPages is " + std::to_string(tooMany), std::to_string(std::numeric_limits<int32_t>::max())}));
    HostTierOptions noChunk = options();
    noChunk.chunkBytes = 0;
    EXPECT_TRUE(
        throwsNaming<InvalidArgumentError>([&] { construct(group(), 4, noChunk); }, {"chunkBytes is 0", "> 0"}));
    HostTierOptions negativeStaging = options();
    negativeStaging.stagingBytes = -1;
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { construct(group(), 4, negativeStaging); }, {"stagingBytes is -1", ">= 0"}));
    HostTierOptions negativeStates = options();
    negativeStates.numHostStates = -1;
    EXPECT_TRUE(
        throwsNaming<InvalidArgumentError>([&] { construct(group(), 4, negativeStates); }, {"numHostStates is -1"}));
    if (!hasStates())
    {
        HostTierOptions wanted = options();
        wanted.numHostStates = 1;
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&] { construct(group(), 4, wanted); }, {"numHostStates is 1", "no state layers"}));
    }
    EXPECT_TRUE(cut().matchesReference());
}

TEST_P(HostTierContract, PinnedHostPagesGrowToTheTierChunkByChunk)
{
    HostTierOptions chunked = options();
    chunked.chunkBytes = modelHostPageBytes(); // one host page a chunk
    HostTier tier(cut().cache(), group(), 12, chunked);
    EXPECT_GE(tier.numPinnedHostPages(), 1);
    EXPECT_LE(tier.numPinnedHostPages(), 12);
    EXPECT_EQ(tier.numHostPages(), 12);
    tier.waitUntilReady();
    EXPECT_EQ(tier.numPinnedHostPages(), 12);
    EXPECT_EQ(tier.numFreeHostPages(), 12);
    std::vector<int32_t> const pages = cut().randomPages(2, group());
    poisonHostPage(tier, 11);
    poisonHostPage(tier, 0);
    tier.offload(cut().cache(), {{pages[0], 11}, {pages[1], 0}}, cut().stream());
    EXPECT_EQ(hostPageContents(tier, 11), expectedHostPage(cut().reference(), group(), pages[0]));
    EXPECT_EQ(hostPageContents(tier, 0), expectedHostPage(cut().reference(), group(), pages[1]));
}

TEST_P(HostTierContract, SequenceFilesRoundTripThroughHostPages)
{
    auto const tier = makeTier(8, options());
    KVCacheManager const& cache = cut().cache();
    std::vector<int32_t> const pages = cut().randomPages(3, group());
    tier->offload(cache, {{pages[0], 0}, {pages[1], 1}, {pages[2], 2}}, cut().stream());
    std::filesystem::path const dir = std::filesystem::temp_directory_path()
        / ("kvcache_host_tier_contract_" + std::to_string(::getpid()) + "_" + GetParam().name);
    std::filesystem::create_directories(dir);
    std::string const path = (dir / "sequence.kvseq").string();
    int64_t const tokens = 2 * int64_t{GetParam().config.tokensPerPage} + 5;
    std::vector<int32_t> const saved{0, 1, 2};
    std::vector<int32_t> const loaded{5, 7, 6};
    auto const expectLoaded = [&]
    {
        for (size_t i = 0; i < loaded.size(); ++i)
        {
            EXPECT_EQ(hostPageContents(*tier, loaded[i]), expectedHostPage(cut().reference(), group(), pages[i]))
                << "host page " << loaded[i];
        }
    };
    saveSequence(path, *tier, cache, saved.data(), 3, tokens);
    EXPECT_EQ(loadSequence(path, *tier, cache, loaded.data(), 3), tokens);
    expectLoaded();

    // Without the cache: the same file, unless the quantization keeps host-held scales, which only the cache knows.
    for (int32_t const hostPage : loaded)
    {
        poisonHostPage(*tier, hostPage);
    }
    KVQuantization const quantization = GetParam().config.quantization;
    if (quantization == KVQuantization::kFP8_PER_TENSOR || quantization == KVQuantization::kNVFP4)
    {
        std::string const named = "KVCacheConfig.quantization is " + std::string(kvQuantizationName(quantization));
        std::string const unsaved = (dir / "unsaved.kvseq").string();
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&] { saveSequence(unsaved, *tier, saved.data(), 3, tokens); }, {"saveSequence", named}));
        EXPECT_FALSE(std::filesystem::exists(unsaved));
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&] { loadSequence(path, *tier, loaded.data(), 3); }, {"loadSequence", named}));
        EXPECT_TRUE(nothingChanged(*tier, loaded));
    }
    else
    {
        std::string const plain = (dir / "plain.kvseq").string();
        saveSequence(plain, *tier, saved.data(), 3, tokens);
        EXPECT_EQ(loadSequence(plain, *tier, loaded.data(), 3), tokens);
        expectLoaded();
    }

    // A tier of another geometry refuses the file and keeps its host pages.
    test::OtherCache const other = test::otherGeometry(GetParam());
    KVCacheManager const otherCache(other.config, cut().stream());
    HostTier otherTier(otherCache, group(), 3, options());
    for (int32_t s = 0; s < 3; ++s)
    {
        poisonHostPage(otherTier, s);
    }
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { loadSequence(path, otherTier, otherCache, saved.data(), 3); },
        {"another geometry", other.field + " is " + other.tierValue + " in the file and " + other.cacheValue}));
    for (int32_t s = 0; s < 3; ++s)
    {
        EXPECT_EQ(hostPageContents(otherTier, s),
            std::vector<uint8_t>(static_cast<size_t>(otherTier.hostPageBytes()), test::kHOST_PAGE_POISON));
    }
    std::filesystem::remove_all(dir);
}

TEST_P(HostTierContract, HostStatesAreThereExactlyWhenTheCacheHasStateLayers)
{
    auto const tier = makeTier(2, options());
    if (hasStates())
    {
        // test_host_tier_states.cu holds their contract.
        EXPECT_EQ(tier->numHostStates(), GetParam().numHostStates);
        EXPECT_EQ(tier->hostStateBytes(), states().slotBytes());
        return;
    }
    EXPECT_EQ(tier->numHostStates(), 0);
    EXPECT_EQ(tier->hostStateBytes(), 0);
    EXPECT_EQ(tier->numFreeHostStates(), 0);
    EXPECT_TRUE(throwsNaming<OutOfMemoryError>(
        [&] { tier->allocateHostStates(1); }, {"allocateHostStates", "count is 1", "numHostStates is 0"}));
    int32_t const none = 0;
    EXPECT_TRUE(throwsNaming<OutOfRangeError>([&] { tier->releaseHostStates(&none, 1); }, {"host state 0", "[0, 0)"}));
    EXPECT_TRUE(
        throwsNaming<OutOfRangeError>([&] { static_cast<void>(tier->hostStateData(0)); }, {"host state 0", "[0, 0)"}));
    EXPECT_TRUE(throwsNaming<OutOfRangeError>(
        [&] { static_cast<void>(tier->isHostStateBusy(0)); }, {"isHostStateBusy", "host state 0"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] {
            tier->offloadStates(cut().cache(), {{0, 0}}, cut().stream());
        },
        {"HostTier::offloadStates", "no state layers"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] {
            tier->onboardStates(cut().cache(), {{0, 0}}, cut().stream());
        },
        {"HostTier::onboardStates", "no state layers"}));
    EXPECT_TRUE(nothingChanged(*tier, {0, 1}));
    EXPECT_EQ(tier->lastEvent(), nullptr);
}

INSTANTIATE_TEST_SUITE_P(
    EveryVariant, HostTierContract, ::testing::ValuesIn(test::hostTierVariants()), test::variantName);

} // namespace
} // namespace kvcache::rt
