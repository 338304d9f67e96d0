// The pinned host tier against a model written here: host page bytes laid out layer by layer, K then V, from the
// formulas; round trips byte for byte for every data type, two page sizes and both methods, device lists replayed in a
// CUDA graph, kernel transfers of several launches, a transfer on another stream waiting for one in flight on the same
// host page, an evicted prefix onboarded on a prefix hit through a PageManager, sequence files over host pages, and the
// checks made before anything is enqueued.

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/paging/page_manager.h"
#include "kvcache/tiers/host_tier.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/host_page_reference.h"
#include "support/layout_model.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::CudaStream;
using kvcache::test::DeviceArray;
using kvcache::test::throwsNaming;

using kvcache::test::hostPageContents;
using kvcache::test::poisonHostPage;

constexpr uint8_t kPOISON = kvcache::test::kHOST_PAGE_POISON;

//! Two KV layers around a latent one: K and V distinct, halves of different sizes.
std::vector<rt::KVLayerConfig> mixedLayers()
{
    return {{2, 64, 0, rt::KVLayerKind::kKV}, {1, 96, 0, rt::KVLayerKind::kLATENT}, {4, 32, 0, rt::KVLayerKind::kKV}};
}

//! The byte at `offset` of page `page` of layer `layer`'s half `half` before any transfer.
uint8_t initialByte(int64_t layer, int64_t half, int64_t page, int64_t offset)
{
    uint64_t h = static_cast<uint64_t>(layer) * 0x9E3779B97F4A7C15ULL
        ^ static_cast<uint64_t>(half) * 0xC2B2AE3D27D4EB4FULL ^ static_cast<uint64_t>(page) * 0x165667B19E3779F9ULL
        ^ static_cast<uint64_t>(offset) * 0x27D4EB2F165667C5ULL;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 32;
    return static_cast<uint8_t>(h);
}

//! A cache whose pools hold initialByte, with the model's page sizes computed from the config by hand.
class TierCase
{
public:
    TierCase(rt::DataType type, int32_t tokensPerPage, int32_t extraPages = 24,
        std::vector<rt::KVLayerConfig> const& layers = mixedLayers())
    {
        rt::KVCacheConfig config = kvcache::test::ConfigBuilder(layers)
                                       .maxBatchSize(2)
                                       .maxSequenceLength(256)
                                       .tokensPerPage(tokensPerPage)
                                       .dataType(type);
        // Pages above the minimum: retained pages beyond what the slot views cover.
        minPages = 2 * 256 / tokensPerPage;
        numPages = minPages + extraPages;
        config.numPages = numPages;
        cacheConfig = config;
        cache = std::make_unique<rt::KVCacheManager>(config, stream.get());
        for (rt::KVLayerConfig const& layer : layers)
        {
            halves.push_back(layer.kind == rt::KVLayerKind::kLATENT ? 1 : 2);
            pageBytes.push_back(
                int64_t{tokensPerPage} * layer.numKVHeads * layer.headDim * kvcache::test::elementBytesByHand(type));
        }
        for (size_t l = 0; l < pageBytes.size(); ++l)
        {
            hostPageBytes += halves[l] * pageBytes[l];
        }
        for (int32_t l = 0; l < numLayers(); ++l)
        {
            for (int32_t h = 0; h < halves[static_cast<size_t>(l)]; ++h)
            {
                std::vector<uint8_t> bytes(static_cast<size_t>(numPages * pageBytes[static_cast<size_t>(l)]));
                for (int64_t p = 0; p < numPages; ++p)
                {
                    for (int64_t b = 0; b < pageBytes[static_cast<size_t>(l)]; ++b)
                    {
                        bytes[static_cast<size_t>(p * pageBytes[static_cast<size_t>(l)] + b)] = initialByte(l, h, p, b);
                    }
                }
                kvcache::test::uploadBytes(pool(l, h), bytes, stream.get());
            }
        }
    }

    int32_t numLayers() const
    {
        return static_cast<int32_t>(pageBytes.size());
    }
    void* pool(int32_t layer, int32_t half) const
    {
        return half == 0 ? cache->kPoolPtr(layer) : cache->vPoolPtr(layer);
    }
    //! The bytes a host page holds after offloading page `page` of the initial pools, laid out by the model.
    std::vector<uint8_t> expectedHostPage(int64_t page) const
    {
        std::vector<uint8_t> hostPage;
        for (int32_t l = 0; l < numLayers(); ++l)
        {
            for (int32_t h = 0; h < halves[static_cast<size_t>(l)]; ++h)
            {
                for (int64_t b = 0; b < pageBytes[static_cast<size_t>(l)]; ++b)
                {
                    hostPage.push_back(initialByte(l, h, page, b));
                }
            }
        }
        return hostPage;
    }
    //! Sets every pool byte to kPOISON.
    void poisonDevice()
    {
        for (int32_t l = 0; l < numLayers(); ++l)
        {
            for (int32_t h = 0; h < halves[static_cast<size_t>(l)]; ++h)
            {
                KVCACHE_CUDA_TRY(cudaMemsetAsync(pool(l, h), kPOISON,
                    static_cast<size_t>(numPages * pageBytes[static_cast<size_t>(l)]), stream.get()));
            }
        }
        stream.synchronize();
    }
    //! Returns device page `page` of every layer and half, in host page order.
    std::vector<uint8_t> devicePage(int64_t page) const
    {
        std::vector<uint8_t> out;
        for (int32_t l = 0; l < numLayers(); ++l)
        {
            int64_t const bytes = pageBytes[static_cast<size_t>(l)];
            for (int32_t h = 0; h < halves[static_cast<size_t>(l)]; ++h)
            {
                auto const part =
                    kvcache::test::downloadBytes(static_cast<char*>(pool(l, h)) + page * bytes, bytes, stream.get());
                out.insert(out.end(), part.begin(), part.end());
            }
        }
        return out;
    }
    std::vector<uint8_t> poisonPage() const
    {
        return std::vector<uint8_t>(static_cast<size_t>(hostPageBytes), kPOISON);
    }

    CudaStream stream;
    rt::KVCacheConfig cacheConfig;
    std::unique_ptr<rt::KVCacheManager> cache;
    int32_t minPages = 0;
    int32_t numPages = 0;
    std::vector<int64_t> halves;
    std::vector<int64_t> pageBytes;
    int64_t hostPageBytes = 0;
};

//! Element type, tokens a page, method, and whether the transfers run on the legacy default stream.
using RoundTripParams = std::tuple<rt::DataType, int32_t, rt::HostTierMethod, bool>;

class HostTierRoundTripTest : public kvcache::test::GpuTest, public ::testing::WithParamInterface<RoundTripParams>
{
};

TEST_P(HostTierRoundTripTest, OffloadAndOnboardAreByteExact)
{
    auto const [type, tokensPerPage, method, legacyStream] = GetParam();
    TierCase setup(type, tokensPerPage);
    // The copy engine moves these short lists straight between pages and host pages on a stream of the caller's, and
    // through the staging buffer on the legacy default stream (which takes no batch copies): there 16-token pages
    // stage two host pages at a time, so the five entries take three rounds, and 128-token pages stage them all at
    // once (the default staging holds every host page of this small tier).
    cudaStream_t const stream = legacyStream ? cudaStreamLegacy : setup.stream.get();
    rt::HostTierOptions options;
    if (tokensPerPage == 16)
    {
        options.stagingBytes = 2 * (2 * setup.hostPageBytes + setup.hostPageBytes / 2);
    }
    rt::HostTier tier(*setup.cache, 0, 8, options);
    ASSERT_EQ(tier.hostPageBytes(), setup.hostPageBytes);
    ASSERT_EQ(tier.numStagingHostPages(), tokensPerPage == 16 ? 2 : 8);
    for (int32_t s = 0; s < 8; ++s)
    {
        poisonHostPage(tier, s);
    }
    int32_t const last = setup.numPages - 1;
    // Scattered, and pages above the minimum; minPages + 5 and + 6 adjacent on both sides.
    std::vector<rt::HostTierEntry> const out{
        {last, 3}, {0, 0}, {setup.minPages + 5, 6}, {setup.minPages + 6, 7}, {setup.minPages + 1, 1}};
    setup.stream.synchronize();
    EXPECT_EQ(tier.offload(*setup.cache, out, stream, method), method);
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
    for (rt::HostTierEntry const& entry : out)
    {
        EXPECT_EQ(hostPageContents(tier, entry.hostPage), setup.expectedHostPage(entry.page))
            << "host page " << entry.hostPage;
    }
    for (int32_t const untouched : {2, 4, 5})
    {
        EXPECT_EQ(hostPageContents(tier, untouched), setup.poisonPage()) << "host page " << untouched;
    }

    setup.poisonDevice();
    std::vector<rt::HostTierEntry> const in{{2, 3}, {last, 0}, {9, 6}, {10, 7}, {setup.minPages + 2, 1}};
    EXPECT_EQ(tier.onboard(*setup.cache, in, stream, method), method);
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < in.size(); ++i)
    {
        EXPECT_EQ(setup.devicePage(in[i].page), setup.expectedHostPage(out[i].page)) << "page " << in[i].page;
    }
    for (int32_t const untouched : {1, 3, 4, 11})
    {
        EXPECT_EQ(setup.devicePage(untouched), setup.poisonPage()) << "page " << untouched;
    }
}

std::string roundTripName(::testing::TestParamInfo<RoundTripParams> const& info)
{
    auto const [type, tokensPerPage, method, legacyStream] = info.param;
    return std::string(rt::dataTypeName(type)) + "_" + std::to_string(tokensPerPage) + "_"
        + (method == rt::HostTierMethod::kKERNEL ? "kernel" : "copy_engine") + (legacyStream ? "_legacy_stream" : "");
}

INSTANTIATE_TEST_SUITE_P(EveryTypeAndPageSize, HostTierRoundTripTest,
    ::testing::Combine(::testing::Values(rt::DataType::kFLOAT, rt::DataType::kHALF, rt::DataType::kBF16,
                           rt::DataType::kFP8_E4M3, rt::DataType::kFP8_E5M2, rt::DataType::kINT8, rt::DataType::kUINT8),
        ::testing::Values(16, 128), ::testing::Values(rt::HostTierMethod::kCOPY_ENGINE, rt::HostTierMethod::kKERNEL),
        ::testing::Bool()),
    roundTripName);

using HostTierTest = kvcache::test::GpuTest;

//! Ninety scattered pages through the copy engine: a batch moves in parts of 1, 8, 64 and the rest (onboards the other
//! way round), the kernels of most parts on the tier's own stream while another part copies. With the default staging
//! all ninety are one batch; with 40 host pages a half, three batches (40, 40, 10) of up to three parts each.
TEST_F(HostTierTest, CopyEngineBatchesInPartsAreByteExact)
{
    constexpr int32_t kENTRIES = 90;
    for (int32_t const stagingPages : {0, 40})
    {
        SCOPED_TRACE(::testing::Message() << "staging host pages " << stagingPages);
        TierCase setup(rt::DataType::kHALF, 16, 100);
        rt::HostTierOptions options;
        if (stagingPages > 0)
        {
            options.stagingBytes = 2 * int64_t{stagingPages} * setup.hostPageBytes;
        }
        constexpr int32_t kHOST_PAGES = 100;
        rt::HostTier tier(*setup.cache, 0, kHOST_PAGES, options);
        ASSERT_EQ(tier.numStagingHostPages(), stagingPages > 0 ? stagingPages : kHOST_PAGES);
        for (int32_t s = 0; s < kHOST_PAGES; ++s)
        {
            poisonHostPage(tier, s);
        }
        std::mt19937 random(11);
        std::vector<int32_t> pages(static_cast<size_t>(setup.numPages));
        std::iota(pages.begin(), pages.end(), 0);
        std::shuffle(pages.begin(), pages.end(), random);
        std::vector<int32_t> hostPages(kHOST_PAGES);
        std::iota(hostPages.begin(), hostPages.end(), 0);
        std::shuffle(hostPages.begin(), hostPages.end(), random);
        std::vector<rt::HostTierEntry> out;
        for (int32_t i = 0; i < kENTRIES; ++i)
        {
            out.push_back({pages[static_cast<size_t>(i)], hostPages[static_cast<size_t>(i)]});
        }
        EXPECT_EQ(tier.offload(*setup.cache, out, setup.stream.get(), rt::HostTierMethod::kCOPY_ENGINE),
            rt::HostTierMethod::kCOPY_ENGINE);
        for (rt::HostTierEntry const& entry : out)
        {
            ASSERT_EQ(hostPageContents(tier, entry.hostPage), setup.expectedHostPage(entry.page))
                << "host page " << entry.hostPage;
        }
        for (int32_t i = kENTRIES; i < kHOST_PAGES; ++i)
        {
            ASSERT_EQ(hostPageContents(tier, hostPages[static_cast<size_t>(i)]), setup.poisonPage())
                << "host page " << hostPages[static_cast<size_t>(i)];
        }

        // Back to other device pages, in another order: page pages[numPages - 1 - i] gets host page out[i]'s.
        setup.poisonDevice();
        std::vector<rt::HostTierEntry> in;
        for (int32_t i = 0; i < kENTRIES; ++i)
        {
            in.push_back({pages[static_cast<size_t>(setup.numPages - 1 - i)], out[static_cast<size_t>(i)].hostPage});
        }
        EXPECT_EQ(tier.onboard(*setup.cache, in, setup.stream.get(), rt::HostTierMethod::kCOPY_ENGINE),
            rt::HostTierMethod::kCOPY_ENGINE);
        setup.stream.synchronize();
        for (int32_t i = 0; i < setup.numPages; ++i)
        {
            int32_t const page = pages[static_cast<size_t>(setup.numPages - 1 - i)];
            ASSERT_EQ(setup.devicePage(page),
                i < kENTRIES ? setup.expectedHostPage(out[static_cast<size_t>(i)].page) : setup.poisonPage())
                << "page " << page;
        }
    }
}

TEST_F(HostTierTest, DeviceListsReplayInAGraph)
{
    TierCase setup(rt::DataType::kHALF, 16);
    rt::HostTier tier(*setup.cache, 0, 6);
    for (int32_t s = 0; s < 6; ++s)
    {
        poisonHostPage(tier, s);
    }
    constexpr int32_t kCAPACITY = 4;
    DeviceArray<rt::HostTierEntry> list(kCAPACITY);
    DeviceArray<int32_t> count(std::vector<int32_t>{2}, setup.stream.get());
    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, setup.stream.get());
    kvcache::test::CapturedGraph graph(setup.stream.get(),
        [&]
        { tier.offloadDevice(*setup.cache, list.get(), kCAPACITY, count.get(), setup.stream.get(), errors.get()); });

    // First replay: two entries of the count, the rest of the list ignored.
    list.upload({{7, 1}, {3, 4}, {8, 0}, {9, 2}}, setup.stream.get());
    graph.launch(setup.stream.get());
    setup.stream.synchronize();
    EXPECT_EQ(hostPageContents(tier, 1), setup.expectedHostPage(7));
    EXPECT_EQ(hostPageContents(tier, 4), setup.expectedHostPage(3));
    EXPECT_EQ(hostPageContents(tier, 0), setup.poisonPage());

    // Second replay: new list, unused entries skipped, bad ids counted once each.
    count.upload({4}, setup.stream.get());
    list.upload({{12, 0}, {rt::kUNUSED_PAGE_ENTRY, 2}, {setup.numPages, 3}, {1, 6}}, setup.stream.get());
    graph.launch(setup.stream.get());
    setup.stream.synchronize();
    EXPECT_EQ(hostPageContents(tier, 0), setup.expectedHostPage(12));
    EXPECT_EQ(hostPageContents(tier, 2), setup.poisonPage());
    EXPECT_EQ(hostPageContents(tier, 3), setup.poisonPage());
    EXPECT_EQ(errors.download(setup.stream.get())[0], 2);

    // Onboard from a device list, captured too.
    setup.poisonDevice();
    DeviceArray<rt::HostTierEntry> back(std::vector<rt::HostTierEntry>{{20, 0}, {21, 1}}, setup.stream.get());
    kvcache::test::CapturedGraph onboard(
        setup.stream.get(), [&] { tier.onboardDevice(*setup.cache, back.get(), 2, nullptr, setup.stream.get()); });
    onboard.launch(setup.stream.get());
    setup.stream.synchronize();
    EXPECT_EQ(setup.devicePage(20), setup.expectedHostPage(12));
    EXPECT_EQ(setup.devicePage(21), setup.expectedHostPage(7));
}

TEST_F(HostTierTest, KernelTransfersOfManyLaunchesAreByteExact)
{
    // 4 MiB host pages: the kernel path moves 16 MiB a launch, so ten entries take three launches (4 + 4 + 2) and a
    // device list of capacity 12 three launches too, the last cut short by the count; a list of 100 positions takes
    // longer launches. Then kAUTO at its boundary.
    std::vector<rt::KVLayerConfig> const layers(4, rt::KVLayerConfig{8, 128});
    TierCase setup(rt::DataType::kFLOAT, 128, 20, layers);
    ASSERT_EQ(setup.hostPageBytes, int64_t{4} << 20);
    rt::HostTier tier(*setup.cache, 0, 14);
    for (int32_t s = 0; s < 14; ++s)
    {
        poisonHostPage(tier, s);
    }
    std::vector<rt::HostTierEntry> out;
    for (int32_t i = 0; i < 10; ++i)
    {
        out.push_back({setup.numPages - 1 - 2 * i, (5 * i + 3) % 14});
    }
    EXPECT_EQ(
        tier.offload(*setup.cache, out, setup.stream.get(), rt::HostTierMethod::kKERNEL), rt::HostTierMethod::kKERNEL);
    for (rt::HostTierEntry const& entry : out)
    {
        EXPECT_EQ(hostPageContents(tier, entry.hostPage), setup.expectedHostPage(entry.page))
            << "host page " << entry.hostPage;
    }
    // (5i + 3) mod 14 for i < 10 misses host pages 2, 7, 11 and 12.
    for (int32_t const untouched : {2, 7, 11, 12})
    {
        EXPECT_EQ(hostPageContents(tier, untouched), setup.poisonPage()) << "host page " << untouched;
    }

    setup.poisonDevice();
    std::vector<rt::HostTierEntry> in;
    for (int32_t i = 0; i < 10; ++i)
    {
        in.push_back({i, out[static_cast<size_t>(9 - i)].hostPage});
    }
    tier.onboard(*setup.cache, in, setup.stream.get(), rt::HostTierMethod::kKERNEL);
    setup.stream.synchronize();
    for (int32_t i = 0; i < 10; ++i)
    {
        EXPECT_EQ(setup.devicePage(i), setup.expectedHostPage(out[static_cast<size_t>(9 - i)].page)) << "page " << i;
    }
    EXPECT_EQ(setup.devicePage(10), setup.poisonPage());

    // A device list: a bad host page in the second launch counted once, positions past the count left alone.
    setup.poisonDevice();
    std::vector<rt::HostTierEntry> deviceIn;
    for (int32_t i = 0; i < 12; ++i)
    {
        deviceIn.push_back({12 + i, out[static_cast<size_t>(i % 10)].hostPage});
    }
    deviceIn[5].hostPage = 14;
    DeviceArray<rt::HostTierEntry> list(deviceIn, setup.stream.get());
    DeviceArray<int32_t> count(std::vector<int32_t>{10}, setup.stream.get());
    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, setup.stream.get());
    tier.onboardDevice(*setup.cache, list.get(), 12, count.get(), setup.stream.get(), errors.get());
    setup.stream.synchronize();
    EXPECT_EQ(errors.download(setup.stream.get())[0], 1);
    for (int32_t i = 0; i < 12; ++i)
    {
        bool const moved = i < 10 && i != 5;
        EXPECT_EQ(setup.devicePage(12 + i),
            moved ? setup.expectedHostPage(out[static_cast<size_t>(i)].page) : setup.poisonPage())
            << "position " << i;
    }

    // A long device list: 100 positions of 4 MiB take 15 launches of 7 (not 25 of 4); three real entries far apart.
    setup.poisonDevice();
    std::vector<rt::HostTierEntry> sparse(100, rt::HostTierEntry{rt::kUNUSED_PAGE_ENTRY, rt::kUNUSED_PAGE_ENTRY});
    sparse[0] = {3, out[0].hostPage};
    sparse[50] = {4, out[1].hostPage};
    sparse[99] = {5, out[2].hostPage};
    DeviceArray<rt::HostTierEntry> longList(sparse, setup.stream.get());
    tier.onboardDevice(*setup.cache, longList.get(), 100, nullptr, setup.stream.get());
    setup.stream.synchronize();
    for (int32_t i = 0; i < 3; ++i)
    {
        EXPECT_EQ(setup.devicePage(3 + i), setup.expectedHostPage(out[static_cast<size_t>(i)].page))
            << "page " << 3 + i;
    }
    EXPECT_EQ(setup.devicePage(6), setup.poisonPage());

    // kAUTO's rule at its boundary: one host page of kHOST_TIER_KERNEL_MAX_BYTES by the kernel, two by the copy engine.
    ASSERT_EQ(setup.hostPageBytes, rt::kHOST_TIER_KERNEL_MAX_BYTES);
    for (int32_t const s : {2, 7, 11})
    {
        poisonHostPage(tier, s);
    }
    EXPECT_EQ(tier.offload(*setup.cache, {{3, 2}}, setup.stream.get()), rt::HostTierMethod::kKERNEL);
    EXPECT_EQ(tier.offload(*setup.cache, {{4, 7}, {5, 11}}, setup.stream.get()), rt::HostTierMethod::kCOPY_ENGINE);
    setup.stream.synchronize();
    EXPECT_EQ(hostPageContents(tier, 2), setup.expectedHostPage(out[0].page));
    EXPECT_EQ(hostPageContents(tier, 7), setup.expectedHostPage(out[1].page));
    EXPECT_EQ(hostPageContents(tier, 11), setup.expectedHostPage(out[2].page));
}

__global__ void spinKernel(long long cycles)
{
    long long const start = clock64();
    while (clock64() - start < cycles)
    {
    }
}

//! Holds `stream` back with a spin of about a tenth of a second, so work enqueued after it is still in flight when
//! the test looks; released() says whether the spin is over (under a sanitizer it may be, early).
class HeldStream
{
public:
    explicit HeldStream(cudaStream_t stream)
    {
        spinKernel<<<1, 1, 0, stream>>>(200'000'000LL);
        KVCACHE_CUDA_TRY(cudaGetLastError());
        mSpinDone.record(stream);
    }

    bool released() const
    {
        return cudaEventQuery(mSpinDone.get()) == cudaSuccess;
    }

private:
    kvcache::test::CudaEvent mSpinDone;
};

// The tier under a PageManager, as a runtime wires them: eviction offloads each page to a host page and remembers its
// hash; a later request of the same prompt misses on the GPU, finds the next pages' hashes (hashNextPages) in the tier,
// appends those tokens (fresh pages registered under the same hashes) and onboards the host pages into them. The device
// is poisoned in between, so every byte checked came back through the tier; a third request then adopts the pages.
TEST_F(HostTierTest, AnEvictedPrefixIsOnboardedIntoFreshPagesOnAPrefixHit)
{
    TierCase setup(rt::DataType::kHALF, 16);
    rt::PageManagerOptions options;
    options.maxSequences = 4;
    rt::PageManager manager(setup.cacheConfig, options);
    rt::HostTier tier(*setup.cache, 0, 8);
    std::map<std::pair<uint64_t, uint64_t>, int32_t> hostPageOfHash;
    std::map<int32_t, int32_t> evictedPageOfHostPage;
    manager.setEvictionCallback(
        [&](int32_t group, int32_t page, rt::PageHash hash)
        {
            ASSERT_EQ(group, 0);
            int32_t const hostPage = tier.allocateHostPages(1)[0];
            poisonHostPage(tier, hostPage);
            // kAUTO moves a list this small with the kernel.
            EXPECT_EQ(tier.offload(*setup.cache, {{page, hostPage}}, setup.stream.get()), rt::HostTierMethod::kKERNEL);
            hostPageOfHash[{hash.lo, hash.hi}] = hostPage;
            evictedPageOfHostPage[hostPage] = page;
        });
    std::vector<int32_t> prompt(4 * 16 + 5);
    for (size_t i = 0; i < prompt.size(); ++i)
    {
        prompt[i] = static_cast<int32_t>(1000 + 7 * i);
    }
    auto const count = static_cast<int32_t>(prompt.size());

    rt::SequenceId const donor = manager.create();
    manager.append({donor, prompt.data(), count});
    manager.free(donor);
    ASSERT_EQ(manager.evictCached(0, 4), 4);
    setup.stream.synchronize();
    ASSERT_EQ(evictedPageOfHostPage.size(), 4u);
    for (auto const& [hostPage, page] : evictedPageOfHostPage)
    {
        EXPECT_EQ(hostPageContents(tier, hostPage), setup.expectedHostPage(page)) << "host page " << hostPage;
    }
    setup.poisonDevice();

    rt::SequenceId const request = manager.create();
    ASSERT_EQ(manager.adoptPrefix(request, prompt.data(), count), 0);
    std::vector<rt::PageHash> hashes(4);
    ASSERT_EQ(manager.hashNextPages(request, prompt.data(), count, hashes.data()), 4);
    std::vector<int32_t> hostPages;
    for (rt::PageHash const& hash : hashes)
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
    rt::SequencePages const pages = manager.pages(request, 0);
    ASSERT_EQ(pages.numPages, 4);
    std::vector<rt::HostTierEntry> entries;
    for (int32_t i = 0; i < 4; ++i)
    {
        entries.push_back({pages.pages[i], hostPages[static_cast<size_t>(i)]});
    }
    EXPECT_EQ(tier.onboard(*setup.cache, entries, setup.stream.get()), rt::HostTierMethod::kKERNEL);
    setup.stream.synchronize();
    std::vector<int32_t> const onboarded(pages.pages, pages.pages + 4);
    for (int32_t i = 0; i < 4; ++i)
    {
        int32_t const hostPage = hostPages[static_cast<size_t>(i)];
        EXPECT_EQ(setup.devicePage(onboarded[static_cast<size_t>(i)]),
            setup.expectedHostPage(evictedPageOfHostPage[hostPage]))
            << "page " << i << " of the prompt";
    }

    manager.free(request);
    rt::SequenceId const next = manager.create();
    EXPECT_EQ(manager.adoptPrefix(next, prompt.data(), count), 4 * 16);
    rt::SequencePages const adopted = manager.pages(next, 0);
    EXPECT_EQ(std::vector<int32_t>(adopted.pages, adopted.pages + adopted.numPages), onboarded);
    EXPECT_NO_THROW(manager.checkInvariants());
}

TEST_F(HostTierTest, ATransferOnAnotherStreamWaitsForOneInFlightOnItsHostPage)
{
    for (rt::HostTierMethod const method : {rt::HostTierMethod::kCOPY_ENGINE, rt::HostTierMethod::kKERNEL})
    {
        TierCase setup(rt::DataType::kHALF, 16);
        rt::HostTier tier(*setup.cache, 0, 4);
        poisonHostPage(tier, 2);
        CudaStream other;
        // Stream A is held back, so the offload into host page 2 is still queued when stream B onboards host page 2.
        HeldStream const held(setup.stream.get());
        tier.offload(*setup.cache, {{5, 2}}, setup.stream.get(), method);
        // The host page may read idle only if the spin is over.
        bool const busy = tier.isHostPageBusy(2);
        EXPECT_TRUE(busy || held.released());
        tier.onboard(*setup.cache, {{14, 2}}, other.get(), method);
        other.synchronize();
        // Had B not waited, page 14 would hold the poisoned host page.
        EXPECT_EQ(setup.devicePage(14), setup.expectedHostPage(5));
        setup.stream.synchronize();
        EXPECT_FALSE(tier.isHostPageBusy(2));
        ASSERT_NE(tier.lastEvent(), nullptr);
        EXPECT_EQ(cudaEventQuery(tier.lastEvent()), cudaSuccess);
    }
}

// Copy-engine transfers of one direction share a staging half: one on another stream waits for the one in flight
// even when their host pages and pages differ; the other direction has its own half.
TEST_F(HostTierTest, CopyEngineTransfersOfOneDirectionTakeTurnsWithTheirStagingHalf)
{
    TierCase setup(rt::DataType::kHALF, 16);
    rt::HostTierOptions options;
    options.stagingBytes = 2 * setup.hostPageBytes; // one hostPage a direction: every transfer below takes two rounds
    rt::HostTier tier(*setup.cache, 0, 6, options);
    ASSERT_EQ(tier.numStagingHostPages(), 1);
    for (int32_t s = 0; s < 6; ++s)
    {
        poisonHostPage(tier, s);
    }
    CudaStream other;
    CudaStream third;
    HeldStream const held(setup.stream.get());
    tier.offload(*setup.cache, {{5, 0}, {6, 1}}, setup.stream.get(), rt::HostTierMethod::kCOPY_ENGINE);
    tier.offload(*setup.cache, {{7, 2}, {8, 3}}, other.get(), rt::HostTierMethod::kCOPY_ENGINE);
    // The second offload may be done only if the spin is over.
    bool const waited = cudaEventQuery(tier.lastEvent()) == cudaErrorNotReady;
    EXPECT_TRUE(waited || held.released());
    tier.onboard(*setup.cache, {{20, 4}}, third.get(), rt::HostTierMethod::kCOPY_ENGINE);
    third.synchronize();
    other.synchronize();
    setup.stream.synchronize();
    for (int32_t s = 0; s < 4; ++s)
    {
        EXPECT_EQ(hostPageContents(tier, s), setup.expectedHostPage(5 + s)) << "host page " << s;
    }
    EXPECT_EQ(setup.devicePage(20), setup.poisonPage());
}

TEST_F(HostTierTest, PinnedHostPagesGrowToTheTierChunkByChunk)
{
    TierCase setup(rt::DataType::kHALF, 16);
    rt::HostTierOptions options;
    options.chunkBytes = setup.hostPageBytes; // one hostPage a chunk
    rt::HostTier tier(*setup.cache, 0, 12, options);
    EXPECT_GE(tier.numPinnedHostPages(), 1);
    EXPECT_EQ(tier.numHostPages(), 12);
    tier.waitUntilReady();
    EXPECT_EQ(tier.numPinnedHostPages(), 12);
    poisonHostPage(tier, 11);
    tier.offload(*setup.cache, {{4, 11}, {3, 0}}, setup.stream.get());
    EXPECT_EQ(hostPageContents(tier, 11), setup.expectedHostPage(4));
    EXPECT_EQ(hostPageContents(tier, 0), setup.expectedHostPage(3));
}

TEST_F(HostTierTest, SequenceFilesRoundTripThroughHostPages)
{
    TierCase setup(rt::DataType::kBF16, 16);
    rt::HostTier tier(*setup.cache, 0, 8);
    tier.offload(*setup.cache, {{1, 0}, {9, 1}, {4, 2}}, setup.stream.get());
    std::string const path =
        (std::filesystem::temp_directory_path() / ("kvcache_host_tier_" + std::to_string(::getpid()) + ".kvseq"))
            .string();
    std::vector<int32_t> const saved{0, 1, 2};
    rt::saveSequence(path, tier, saved.data(), 3, 40);
    std::vector<int32_t> const loaded{5, 7, 6};
    for (int32_t const hostPage : loaded)
    {
        poisonHostPage(tier, hostPage);
    }
    EXPECT_EQ(rt::loadSequence(path, tier, loaded.data(), 3), 40);
    EXPECT_EQ(hostPageContents(tier, 5), setup.expectedHostPage(1));
    EXPECT_EQ(hostPageContents(tier, 7), setup.expectedHostPage(9));
    EXPECT_EQ(hostPageContents(tier, 6), setup.expectedHostPage(4));

    // A tier of another geometry refuses the file and keeps its host pages.
    TierCase other(rt::DataType::kHALF, 16);
    rt::HostTier otherTier(*other.cache, 0, 4);
    for (int32_t s = 0; s < 3; ++s)
    {
        poisonHostPage(otherTier, s);
    }
    std::vector<int32_t> const three{0, 1, 2};
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::loadSequence(path, otherTier, three.data(), 3); }, {"dataType"}));
    for (int32_t s = 0; s < 3; ++s)
    {
        EXPECT_EQ(hostPageContents(otherTier, s), other.poisonPage());
    }
    std::filesystem::remove(path);
}

TEST_F(HostTierTest, BadInputIsRefusedBeforeAnythingIsEnqueued)
{
    TierCase setup(rt::DataType::kHALF, 16);
    rt::HostTier tier(*setup.cache, 0, 4);
    for (int32_t s = 0; s < 4; ++s)
    {
        poisonHostPage(tier, s);
    }
    cudaStream_t const stream = setup.stream.get();
    int32_t const n = setup.numPages;
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] {
            tier.offload(*setup.cache, {{1, 0}, {n, 1}}, stream);
        },
        {"entries[1].page", std::to_string(n), "[0, " + std::to_string(n) + ")"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] {
            tier.offload(*setup.cache, {{1, 0}, {2, 4}}, stream);
        },
        {"entries[1].hostPage", "4", "[0, 4)"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] {
            tier.onboard(*setup.cache, {{-1, 0}}, stream);
        },
        {"entries[0].page", "-1"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            tier.offload(*setup.cache, {{1, 0}, {2, 0}}, stream);
        },
        {"host page 0", "more than once"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            tier.onboard(*setup.cache, {{3, 0}, {3, 1}}, stream);
        },
        {"page 3", "more than once"}));
    EXPECT_TRUE(
        throwsNaming<rt::InvalidArgumentError>([&] { tier.offload(*setup.cache, nullptr, 2, stream); }, {"null", "2"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { tier.offloadDevice(*setup.cache, nullptr, -1, nullptr, stream); }, {"capacity", "-1"}));
    TierCase other(rt::DataType::kFLOAT, 16);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            tier.offload(*other.cache, {{1, 0}}, stream);
        },
        {"another geometry"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>([&] { rt::HostTier(*setup.cache, 1, 4); }, {"group", "1"}));
    EXPECT_TRUE(
        throwsNaming<rt::InvalidArgumentError>([&] { rt::HostTier(*setup.cache, 0, 0); }, {"numHostPages", "0"}));
    rt::HostTierOptions negativeStaging;
    negativeStaging.stagingBytes = -1;
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::HostTier(*setup.cache, 0, 4, negativeStaging); }, {"stagingBytes", "-1"}));
    rt::HostTierOptions tooMuchStaging;
    tooMuchStaging.stagingBytes = int64_t{1} << 50; // clamped to the tier's hostPages: 4
    EXPECT_EQ(rt::HostTier(*setup.cache, 0, 4, tooMuchStaging).numStagingHostPages(), 4);
    setup.stream.synchronize();
    for (int32_t s = 0; s < 4; ++s)
    {
        EXPECT_EQ(hostPageContents(tier, s), setup.poisonPage()) << "a refused call wrote host page " << s;
    }

    // A full tier: nothing handed out when the request does not fit.
    std::vector<int32_t> const three = tier.allocateHostPages(3);
    EXPECT_EQ(three, (std::vector<int32_t>{0, 1, 2}));
    EXPECT_TRUE(throwsNaming<rt::OutOfMemoryError>([&] { tier.allocateHostPages(2); }, {"count is 2", "1 free"}));
    EXPECT_EQ(tier.numFreeHostPages(), 1);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&]
        {
            std::vector<int32_t> const twice{1, 1};
            tier.releaseHostPages(twice.data(), 2);
        },
        {"host page 1", "more than once"}));
    EXPECT_EQ(tier.numFreeHostPages(), 1);
    tier.releaseHostPages(&three[1], 1);
    EXPECT_EQ(tier.allocateHostPages(2), (std::vector<int32_t>{1, 3}));
}

} // namespace
