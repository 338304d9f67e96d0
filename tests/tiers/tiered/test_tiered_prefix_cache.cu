// The tiered prefix cache on a real cache (kvcache/tiers/tiered_prefix_cache.h): a prompt's pages are evicted by later
// steps, which the test follows at once with a fill of the pages they took (the step's kernels overwriting them), so
// every page reaches the host only if its offload was ordered before; the device is then poisoned and a new request of
// the prompt gets the pages back from the host, compared byte for byte (every layer, K and V, which hold different
// random bytes; a latent layer's one half) with what the pages held before, the run longer than maxTokensPerStep. A
// windowed group's window comes back through its own tier, and a prompt whose full-attention pages the device still
// has holds those and onboards only its window. Host pages a full host tier gives up go to a disk tier and come back
// bitwise. The counters, a capturing stream and bad construction are checked too. The bookkeeping itself is tested
// without a GPU in test_tiered_prefix_cache_core.cpp.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/paging/page_manager.h"
#include "kvcache/tiers/tiered_prefix_cache.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/page_op_reference.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::CacheUnderTest;
using kvcache::test::throwsNaming;

constexpr int32_t kTOKENS_PER_PAGE = 16;
//! What the step's kernels are modelled writing into the pages a step took.
constexpr uint32_t kSTEP_WRITE = 0x5A5A5A5AU;
//! What the device is poisoned with before the host tier brings pages back.
constexpr uint32_t kPOISON = 0xA5A5A5A5U;

using TieredPrefixCacheGpuTest = kvcache::test::GpuTest;

//! The bytes page `page` of group `group` holds in every layer of the group, K then V (one half for a latent layer),
//! as the reference model says they were filled.
std::vector<uint8_t> referencePage(CacheUnderTest& cut, int32_t group, int32_t page)
{
    std::vector<uint8_t> bytes;
    for (int32_t const layer : cut.cache().group(group).layers)
    {
        int64_t const pageBytes = cut.reference().pageBytes(layer);
        for (int32_t kv = 0; kv < cut.reference().numHalves(layer); ++kv)
        {
            uint8_t const* first = cut.reference().page(layer, kv, page);
            bytes.insert(bytes.end(), first, first + pageBytes);
        }
    }
    return bytes;
}

//! The bytes page `page` of group `group` holds on the device now, in referencePage's order.
std::vector<uint8_t> devicePage(CacheUnderTest& cut, int32_t group, int32_t page)
{
    std::vector<uint8_t> bytes;
    for (int32_t const layer : cut.cache().group(group).layers)
    {
        int64_t const pageBytes = cut.reference().pageBytes(layer);
        for (int32_t kv = 0; kv < cut.reference().numHalves(layer); ++kv)
        {
            void const* pool = kv == 0 ? cut.cache().kPoolPtr(layer) : cut.cache().vPoolPtr(layer);
            std::vector<uint8_t> const part = kvcache::test::downloadBytes(
                static_cast<char const*>(pool) + page * pageBytes, pageBytes, cut.stream());
            bytes.insert(bytes.end(), part.begin(), part.end());
        }
    }
    return bytes;
}

//! Fills every page of every group with `pattern`, on the cache's stream.
void fillDevice(CacheUnderTest& cut, uint32_t pattern)
{
    for (int32_t g = 0; g < cut.cache().numGroups(); ++g)
    {
        std::vector<int32_t> pages(static_cast<size_t>(cut.numPages(g)));
        for (size_t p = 0; p < pages.size(); ++p)
        {
            pages[p] = static_cast<int32_t>(p);
        }
        rt::PageOpTarget target;
        target.group = g;
        rt::resetPages(cut.cache(), pages, cut.stream(), pattern, target);
    }
}

std::vector<int32_t> tokenRun(int32_t first, int32_t count)
{
    std::vector<int32_t> tokens;
    for (int32_t i = 0; i < count; ++i)
    {
        tokens.push_back(first + 3 * i);
    }
    return tokens;
}

rt::PageManagerOptions managerOptions()
{
    rt::PageManagerOptions options;
    options.maxSequences = 4;
    return options;
}

//! A cache of random bytes, its page manager and a tiered prefix cache over them, and a runtime's steps.
class TieredCase
{
public:
    TieredCase(rt::KVCacheConfig const& config, std::vector<int64_t> const& numHostPages)
        : TieredCase(config, options(numHostPages))
    {
    }
    TieredCase(rt::KVCacheConfig const& config, rt::TieredPrefixCacheOptions const& tieredOptions)
        : cut(config, 20261201)
        , manager(cut.cache().layout(), managerOptions())
        , tiered(cut.cache(), manager, tieredOptions)
    {
    }

    static rt::TieredPrefixCacheOptions options(std::vector<int64_t> const& numHostPages)
    {
        rt::TieredPrefixCacheOptions options;
        options.numHostPages = numHostPages;
        return options;
    }

    //! Steps tokens[length, size) into `sequence`, maxTokensPerStep at a time, each step followed by a fill of the
    //! pages it took with `written` (its kernels) unless `written` is 0; calls `afterStep` after each step.
    template <typename AfterStep>
    void prefill(rt::SequenceId sequence, std::vector<int32_t> const& tokens, uint32_t written, AfterStep&& afterStep)
    {
        int32_t const stepTokens = manager.layout().maxTokensPerStep;
        for (int32_t length = manager.length(sequence); length < static_cast<int32_t>(tokens.size());
             length = manager.length(sequence))
        {
            int32_t const count = std::min(stepTokens, static_cast<int32_t>(tokens.size()) - length);
            rt::SequenceAppend const append{sequence, tokens.data() + length, count};
            std::vector<std::vector<int32_t>> before;
            for (int32_t g = 0; g < manager.numGroups(); ++g)
            {
                rt::SequencePages const pages = manager.pages(sequence, g);
                before.emplace_back(pages.pages, pages.pages + pages.numPages);
            }
            tiered.step(&append, 1, cut.stream());
            for (int32_t g = 0; g < manager.numGroups() && written != 0; ++g)
            {
                rt::SequencePages const pages = manager.pages(sequence, g);
                std::vector<int32_t> taken;
                for (int32_t p = 0; p < pages.numPages; ++p)
                {
                    bool const isNew = static_cast<size_t>(p) >= before[static_cast<size_t>(g)].size();
                    if (pages.pages[p] >= 0 && isNew)
                    {
                        taken.push_back(pages.pages[p]);
                    }
                }
                rt::PageOpTarget target;
                target.group = g;
                rt::resetPages(cut.cache(), taken, cut.stream(), written, target);
            }
            afterStep();
        }
    }

    //! The reference bytes of the first `numPages` pages of `sequence` in group 0: what must come back after eviction.
    std::vector<std::vector<uint8_t>> referencePagesOf(rt::SequenceId sequence, int32_t numPages)
    {
        rt::SequencePages const pages = manager.pages(sequence, 0);
        std::vector<std::vector<uint8_t>> bytes;
        for (int32_t p = 0; p < numPages; ++p)
        {
            bytes.push_back(referencePage(cut, 0, pages.pages[p]));
        }
        return bytes;
    }
    //! Overwrites every device page with `poison` and resets the counters: whatever an admission brings back next
    //! must come from the host or the disk, not from the device.
    void poisonDeviceAndResetStats(uint32_t poison)
    {
        fillDevice(cut, poison);
        KVCACHE_TEST_CUDA(cudaStreamSynchronize(cut.stream()));
        tiered.resetStats();
    }

    CacheUnderTest cut;
    rt::PageManager manager;
    rt::TieredPrefixCache tiered;
};

//! Three layers of different shapes, one of them latent (K only).
std::vector<rt::KVLayerConfig> mixedLayers()
{
    return {{2, 64}, {1, 96, 0, rt::KVLayerKind::kLATENT}, {3, 40}};
}

//! mixedLayers() in bf16: 2 sequences of 128 tokens in pages of kTOKENS_PER_PAGE, steps of 32 tokens.
rt::KVCacheConfig mixedConfig()
{
    return kvcache::test::ConfigBuilder(mixedLayers())
        .maxBatchSize(2)
        .maxSequenceLength(128)
        .tokensPerPage(kTOKENS_PER_PAGE)
        .maxTokensPerStep(32)
        .dataType(rt::DataType::kBF16);
}

TEST_F(TieredPrefixCacheGpuTest, APromptsPagesEvictedByLaterStepsComeBackFromTheHostBitwise)
{
    // 16 pages of 16 tokens; steps of 32 tokens, shorter than the five pages that come back.
    TieredCase setup(mixedConfig(), {16});
    cudaStream_t const stream = setup.cut.stream();
    std::vector<int32_t> const prompt = tokenRun(1, 5 * kTOKENS_PER_PAGE + 5);
    auto const count = static_cast<int32_t>(prompt.size());

    // The donor's pages keep the random bytes they were filled with: they stand for what its prefill computed.
    rt::SequenceId const donor = setup.manager.create();
    rt::TieredAdmission const first = setup.tiered.admit(donor, prompt.data(), count, stream);
    EXPECT_EQ(first.computeTokens, count);
    setup.prefill(donor, prompt, 0, [] {});
    std::vector<std::vector<uint8_t>> const expected = setup.referencePagesOf(donor, 5);
    // K and V differ, so a transfer that swapped or duplicated halves shows.
    int64_t const layer0Page = setup.cut.reference().pageBytes(0);
    ASSERT_NE(std::vector<uint8_t>(expected[0].begin(), expected[0].begin() + layer0Page),
        std::vector<uint8_t>(expected[0].begin() + layer0Page, expected[0].begin() + 2 * layer0Page));
    setup.manager.free(donor);
    ASSERT_EQ(setup.manager.counts(0).cached, 5);

    // Two requests of other tokens take every page: the second evicts the donor's five, and its steps' kernels
    // overwrite them at once, on the same stream.
    std::vector<rt::SequenceId> fillers;
    for (int32_t f = 0; f < 2; ++f)
    {
        std::vector<int32_t> const other = tokenRun(10000 * (f + 1), 128);
        rt::SequenceId const filler = setup.manager.create();
        setup.tiered.admit(filler, other.data(), 128, stream);
        setup.prefill(filler, other, kSTEP_WRITE, [] {});
        fillers.push_back(filler);
    }
    EXPECT_EQ(setup.tiered.stats().offloadedPages, 5);
    EXPECT_EQ(setup.tiered.numHostPagesHeld(0), 5);
    for (rt::SequenceId const filler : fillers)
    {
        setup.manager.free(filler);
    }

    ASSERT_NO_FATAL_FAILURE(setup.poisonDeviceAndResetStats(kPOISON));
    rt::SequenceId const request = setup.manager.create();
    rt::TieredAdmission const admission = setup.tiered.admit(request, prompt.data(), count, stream);
    EXPECT_EQ(admission.deviceTokens, 0);
    EXPECT_EQ(admission.hostTokens, 5 * kTOKENS_PER_PAGE);
    EXPECT_EQ(admission.computeTokens, 5);
    KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream));
    rt::SequencePages const pages = setup.manager.pages(request, 0);
    ASSERT_EQ(pages.numPages, 5);
    std::vector<int32_t> const onboarded(pages.pages, pages.pages + 5);
    for (int32_t p = 0; p < 5; ++p)
    {
        EXPECT_EQ(devicePage(setup.cut, 0, onboarded[static_cast<size_t>(p)]), expected[static_cast<size_t>(p)])
            << "page " << p << " of the prompt (device page " << onboarded[static_cast<size_t>(p)] << ")";
    }
    rt::TieredPrefixCacheStats const stats = setup.tiered.stats();
    EXPECT_EQ(stats.admissions, 1);
    EXPECT_EQ(stats.queryTokens, count);
    EXPECT_EQ(stats.deviceHitTokens, 0);
    EXPECT_EQ(stats.hostHitTokens, 5 * kTOKENS_PER_PAGE);
    EXPECT_EQ(stats.missedTokens, 5);
    EXPECT_EQ(stats.onboardedPages, 5);

    // The onboarded pages are registered: the next request adopts them on the device.
    setup.prefill(request, prompt, 0, [] {});
    setup.manager.free(request);
    rt::SequenceId const next = setup.manager.create();
    EXPECT_EQ(setup.tiered.admit(next, prompt.data(), count, stream).deviceTokens, 5 * kTOKENS_PER_PAGE);
    rt::SequencePages const adopted = setup.manager.pages(next, 0);
    EXPECT_EQ(std::vector<int32_t>(adopted.pages, adopted.pages + 5), onboarded);
    EXPECT_EQ(setup.tiered.stats().deviceHitTokens, 5 * kTOKENS_PER_PAGE);
    EXPECT_NO_THROW(setup.tiered.checkInvariants());
    EXPECT_NO_THROW(setup.manager.checkInvariants());
}

TEST_F(TieredPrefixCacheGpuTest, AWindowedGroupsPagesComeBackThroughItsOwnTier)
{
    // Group 0: full attention; group 1: a window of 32 tokens, whose pages the window releases during the prefill.
    TieredCase setup(kvcache::test::ConfigBuilder({{2, 32, 32}, {2, 64}})
                         .maxBatchSize(2)
                         .maxSequenceLength(128)
                         .tokensPerPage(kTOKENS_PER_PAGE)
                         .maxTokensPerStep(32)
                         .dataType(rt::DataType::kHALF),
        {16, 16});
    ASSERT_EQ(setup.manager.numGroups(), 2);
    ASSERT_EQ(setup.cut.cache().group(1).slidingWindow, 32);
    cudaStream_t const stream = setup.cut.stream();
    std::vector<int32_t> const prompt = tokenRun(7, 5 * kTOKENS_PER_PAGE + 3);
    auto const count = static_cast<int32_t>(prompt.size());

    rt::SequenceId const donor = setup.manager.create();
    setup.tiered.admit(donor, prompt.data(), count, stream);
    // The windowed group's page of each prompt page, seen while the window still holds it.
    std::map<int32_t, int32_t> windowedPageOf;
    setup.prefill(donor, prompt, 0,
        [&]
        {
            rt::SequencePages const pages = setup.manager.pages(donor, 1);
            for (int32_t p = 0; p < pages.numPages; ++p)
            {
                if (pages.pages[p] >= 0)
                {
                    windowedPageOf[p] = pages.pages[p];
                }
            }
        });
    rt::SequencePages const fullPages = setup.manager.pages(donor, 0);
    std::vector<std::vector<uint8_t>> expectedFull;
    std::vector<std::vector<uint8_t>> expectedWindowed;
    for (int32_t p = 0; p < 5; ++p)
    {
        expectedFull.push_back(referencePage(setup.cut, 0, fullPages.pages[p]));
        ASSERT_EQ(windowedPageOf.count(p), 1u);
        expectedWindowed.push_back(referencePage(setup.cut, 1, windowedPageOf[p]));
    }
    setup.manager.free(donor);
    EXPECT_EQ(setup.tiered.evictCached(0, 64, stream), 5);
    EXPECT_EQ(setup.tiered.evictCached(1, 64, stream), 5);
    fillDevice(setup.cut, kPOISON);

    rt::SequenceId const request = setup.manager.create();
    rt::TieredAdmission const admission = setup.tiered.admit(request, prompt.data(), count, stream);
    EXPECT_EQ(admission.hostTokens, 5 * kTOKENS_PER_PAGE);
    // The windowed group needs only the window before token 80: tokens 49-79, pages 3 and 4.
    int32_t const window = (5 * kTOKENS_PER_PAGE - 32 + 1) / kTOKENS_PER_PAGE;
    EXPECT_EQ(setup.tiered.stats().onboardedPages, 5 + (5 - window));
    KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream));
    rt::SequencePages const full = setup.manager.pages(request, 0);
    rt::SequencePages const windowed = setup.manager.pages(request, 1);
    for (int32_t p = 0; p < 5; ++p)
    {
        EXPECT_EQ(devicePage(setup.cut, 0, full.pages[p]), expectedFull[static_cast<size_t>(p)]) << "page " << p;
        ASSERT_EQ(windowed.pages[p] >= 0, p >= window) << "windowed entry " << p;
        if (p >= window)
        {
            EXPECT_EQ(devicePage(setup.cut, 1, windowed.pages[p]), expectedWindowed[static_cast<size_t>(p)])
                << "windowed page " << p;
        }
    }

    // A shorter prompt: the device has its full-attention pages (the request's, cached) but not its window (pages 0
    // and 1, which the admission above did not need): it holds the former and onboards only the latter.
    setup.manager.free(request);
    setup.tiered.resetStats();
    std::vector<int32_t> const shorter(prompt.begin(), prompt.begin() + 2 * kTOKENS_PER_PAGE + 1);
    rt::SequenceId const adopter = setup.manager.create();
    rt::TieredAdmission const partly =
        setup.tiered.admit(adopter, shorter.data(), static_cast<int32_t>(shorter.size()), stream);
    EXPECT_EQ(partly.deviceTokens, 0);
    EXPECT_EQ(partly.hostTokens, 2 * kTOKENS_PER_PAGE);
    EXPECT_EQ(setup.tiered.stats().onboardedPages, 2);
    KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream));
    rt::SequencePages const adopterFull = setup.manager.pages(adopter, 0);
    rt::SequencePages const adopterWindow = setup.manager.pages(adopter, 1);
    for (int32_t p = 0; p < 2; ++p)
    {
        EXPECT_EQ(adopterFull.pages[p], full.pages[p]) << "the request's cached page " << p << ", held";
        EXPECT_EQ(devicePage(setup.cut, 0, adopterFull.pages[p]), expectedFull[static_cast<size_t>(p)]) << "page " << p;
        ASSERT_GE(adopterWindow.pages[p], 0) << "the window before token 32 covers page " << p;
        EXPECT_EQ(devicePage(setup.cut, 1, adopterWindow.pages[p]), expectedWindowed[static_cast<size_t>(p)])
            << "windowed page " << p;
    }
    EXPECT_NO_THROW(setup.tiered.checkInvariants());
    EXPECT_NO_THROW(setup.manager.checkInvariants());
}

TEST_F(TieredPrefixCacheGpuTest, PagesTheHostGivesUpComeBackFromTheDiskBitwise)
{
    std::filesystem::path const directory =
        std::filesystem::temp_directory_path() / ("kvcache-tiered-disk-" + std::to_string(::getpid()));
    rt::TieredPrefixCacheOptions options = TieredCase::options({5});
    options.diskDirectory = directory.string();
    options.numDiskPages = {16};
    auto const diskFiles = [&]
    {
        int32_t files = 0;
        for (auto const& entry : std::filesystem::directory_iterator(directory))
        {
            files += entry.path().extension() == ".kvseq" ? 1 : 0;
        }
        return files;
    };
    {
        TieredCase setup(mixedConfig(), options);
        cudaStream_t const stream = setup.cut.stream();
        std::vector<int32_t> const prompt = tokenRun(1, 5 * kTOKENS_PER_PAGE + 5);
        auto const count = static_cast<int32_t>(prompt.size());
        rt::SequenceId const donor = setup.manager.create();
        setup.tiered.admit(donor, prompt.data(), count, stream);
        setup.prefill(donor, prompt, 0, [] {});
        std::vector<std::vector<uint8_t>> const expected = setup.referencePagesOf(donor, 5);
        setup.manager.free(donor);
        // One eviction a call, so that each finds the host tier full: the donor's five pages fill it, then three pages
        // of another prompt (their bytes written by its steps) take the host pages of the donor's oldest three, which
        // go to disk first.
        auto const evictOneByOne = [&]
        {
            while (setup.manager.counts(0).cached > 0)
            {
                setup.tiered.evictCached(0, 1, stream);
            }
        };
        evictOneByOne();
        std::vector<int32_t> const other = tokenRun(10000, 3 * kTOKENS_PER_PAGE + 1);
        rt::SequenceId const filler = setup.manager.create();
        setup.tiered.admit(filler, other.data(), static_cast<int32_t>(other.size()), stream);
        setup.prefill(filler, other, kSTEP_WRITE, [] {});
        setup.manager.free(filler);
        evictOneByOne();
        EXPECT_EQ(setup.tiered.stats().spilledPages, 3);
        EXPECT_EQ(setup.tiered.numDiskPagesHeld(0), 3);
        EXPECT_EQ(diskFiles(), 3);

        ASSERT_NO_FATAL_FAILURE(setup.poisonDeviceAndResetStats(kPOISON));
        rt::SequenceId const request = setup.manager.create();
        rt::TieredAdmission const admission = setup.tiered.admit(request, prompt.data(), count, stream);
        EXPECT_EQ(admission.deviceTokens, 0);
        EXPECT_EQ(admission.hostTokens, 5 * kTOKENS_PER_PAGE);
        rt::TieredPrefixCacheStats const stats = setup.tiered.stats();
        EXPECT_EQ(stats.restoredPages, 3);
        EXPECT_EQ(stats.onboardedPages, 5);
        EXPECT_EQ(stats.diskFailures, 0);
        KVCACHE_TEST_CUDA(cudaStreamSynchronize(stream));
        rt::SequencePages const pages = setup.manager.pages(request, 0);
        for (int32_t p = 0; p < 5; ++p)
        {
            EXPECT_EQ(devicePage(setup.cut, 0, pages.pages[p]), expected[static_cast<size_t>(p)]) << "page " << p;
        }
        EXPECT_NO_THROW(setup.tiered.checkInvariants());
    }
    // The disk tier's files go with it.
    EXPECT_EQ(diskFiles(), 0);
    std::filesystem::remove_all(directory);
}

TEST_F(TieredPrefixCacheGpuTest, ACapturingStreamIsRefusedBeforeAnythingChanges)
{
    TieredCase setup(kvcache::test::ConfigBuilder(mixedLayers())
                         .maxBatchSize(2)
                         .maxSequenceLength(128)
                         .tokensPerPage(kTOKENS_PER_PAGE),
        {8});
    std::vector<int32_t> const prompt = tokenRun(1, 3 * kTOKENS_PER_PAGE + 1);
    rt::SequenceId const donor = setup.manager.create();
    setup.tiered.admit(donor, prompt.data(), static_cast<int32_t>(prompt.size()), setup.cut.stream());
    setup.prefill(donor, prompt, 0, [] {});
    setup.manager.free(donor);
    setup.tiered.evictCached(0, 16, setup.cut.stream());
    rt::TieredPrefixCacheStats const before = setup.tiered.stats();

    kvcache::test::CudaStream capturing;
    rt::SequenceId const request = setup.manager.create();
    KVCACHE_TEST_CUDA(cudaStreamBeginCapture(capturing.get(), cudaStreamCaptureModeThreadLocal));
    bool const admitRefused = throwsNaming<rt::InvalidArgumentError>([&]
        { setup.tiered.admit(request, prompt.data(), static_cast<int32_t>(prompt.size()), capturing.get()); },
        {"TieredPrefixCache::admit", "capturing"});
    rt::SequenceAppend const append{request, prompt.data(), 16};
    bool const stepRefused = throwsNaming<rt::InvalidArgumentError>(
        [&] { setup.tiered.step(&append, 1, capturing.get()); }, {"TieredPrefixCache::step", "capturing"});
    cudaGraph_t graph = nullptr;
    KVCACHE_TEST_CUDA(cudaStreamEndCapture(capturing.get(), &graph));
    KVCACHE_TEST_CUDA(cudaGraphDestroy(graph));
    EXPECT_TRUE(admitRefused);
    EXPECT_TRUE(stepRefused);
    EXPECT_EQ(setup.manager.length(request), 0);
    EXPECT_EQ(setup.tiered.stats().admissions, before.admissions);
    EXPECT_EQ(setup.tiered.numHostPagesHeld(0), 3);
    // Outside the capture the same admission finds the host's pages.
    EXPECT_EQ(
        setup.tiered.admit(request, prompt.data(), static_cast<int32_t>(prompt.size()), setup.cut.stream()).hostTokens,
        3 * kTOKENS_PER_PAGE);
}

TEST_F(TieredPrefixCacheGpuTest, BadConstructionIsRefusedNamingTheFieldAndLeavesTheManagerAlone)
{
    rt::KVCacheConfig const config = kvcache::test::ConfigBuilder(mixedLayers())
                                         .maxBatchSize(2)
                                         .maxSequenceLength(128)
                                         .tokensPerPage(kTOKENS_PER_PAGE);
    CacheUnderTest cut(config, 7);
    rt::KVCacheConfig larger = config;
    larger.numPages = 24;
    rt::PageManager wrongSize(larger, managerOptions());
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::TieredPrefixCache(cut.cache(), wrongSize, TieredCase::options({8})); },
        {"group 0 numPages", "24", "16"}));
    rt::PageManager manager(cut.cache().layout(), managerOptions());
    int32_t evictions = 0;
    manager.setEvictionCallback([&](int32_t, int32_t, rt::PageHash) { ++evictions; });
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::TieredPrefixCache(cut.cache(), manager, TieredCase::options({})); }, {"numHostPages has 0 entries"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::TieredPrefixCache(cut.cache(), manager, TieredCase::options({0})); },
        {"numHostPages[0] is 0", "[1, 2147483647]"}));
    // Host states need a manager keeping state checkpoints, and are the tiered cache's to size.
    rt::TieredPrefixCacheOptions withStates = TieredCase::options({8});
    withStates.numHostStates = 2;
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::TieredPrefixCache(cut.cache(), manager, withStates); }, {"numHostStates is 2", "state checkpoints"}));
    rt::TieredPrefixCacheOptions tierStates = TieredCase::options({8});
    tierStates.hostTier.numHostStates = 1;
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { rt::TieredPrefixCache(cut.cache(), manager, tierStates); },
        {"hostTier.numHostStates is 1", "numHostStates"}));
    // The manager's own callback is still the one called.
    std::vector<int32_t> const tokens = tokenRun(1, kTOKENS_PER_PAGE);
    rt::SequenceId const sequence = manager.create();
    manager.append({sequence, tokens.data(), kTOKENS_PER_PAGE});
    manager.free(sequence);
    EXPECT_EQ(manager.evictCached(0, 4), 1);
    EXPECT_EQ(evictions, 1);

    rt::TieredPrefixCache tiered(cut.cache(), manager, TieredCase::options({8}));
    EXPECT_EQ(tiered.numGroups(), 1);
    EXPECT_EQ(tiered.hostTier(0).numHostPages(), 8);
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>([&] { tiered.hostTier(1); }, {"hostTier", "group is 1", "[0, 1)"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>([&] { tiered.findHostPage(-1, {}); }, {"group is -1"}));
    // A moved tiered cache keeps the wiring: the evictions reach it, not the manager's old callback.
    rt::TieredPrefixCache moved(std::move(tiered));
    rt::SequenceId const again = manager.create();
    manager.append({again, tokens.data(), kTOKENS_PER_PAGE});
    manager.free(again);
    EXPECT_EQ(moved.evictCached(0, 4, cut.stream()), 1);
    EXPECT_EQ(evictions, 1);
    EXPECT_EQ(moved.stats().offloadedPages, 1);
}

//! Distinct, never-poison bytes for state tensor `tensor` of the state after `tag`.
std::vector<uint8_t> stateBytes(int32_t tensor, int64_t bytes, uint32_t tag)
{
    std::vector<uint8_t> out(static_cast<size_t>(bytes));
    for (int64_t b = 0; b < bytes; ++b)
    {
        uint64_t h = (static_cast<uint64_t>(tensor + 1) * 0x9E3779B97F4A7C15ULL)
            ^ (static_cast<uint64_t>(b) * 0xC2B2AE3D27D4EB4FULL) ^ (static_cast<uint64_t>(tag) * 0x165667B19E3779F9ULL);
        h ^= h >> 31;
        auto const byte = static_cast<uint8_t>(h);
        out[static_cast<size_t>(b)] = byte == 0xA5 ? 0x5A : byte;
    }
    return out;
}

//! A checkpoint's state evicted with its carrier page to a host state and, `throughDisk`, from there to the disk tier
//! with the page's file (3 host pages, then another prompt's pages taking them), then brought back by an admission of
//! the same prompt into a checkpoint slot and restored into the new sequence's slot, every state slot (and the freed
//! host state) poisoned in between, compared byte for byte.
void checkpointRoundTrip(bool throughDisk)
{
    // One full-attention group, 2 sequences (state slots 0 and 1) and 2 checkpoint slots (2 and 3); one state layer
    // of two tensors: recurrent [2, 4, 4] float32 = 128 bytes a slot, conv [6, 3] bfloat16 = 36 bytes.
    kvcache::test::CudaStream stream;
    rt::KVCacheConfig const config =
        kvcache::test::ConfigBuilder({rt::KVLayerConfig{2, 64}})
            .maxBatchSize(2)
            .maxSequenceLength(64)
            .tokensPerPage(kTOKENS_PER_PAGE)
            .maxTokensPerStep(64)
            .numPages(8)
            .stateLayers({rt::StateLayerConfig{{rt::StateTensorConfig{"recurrent", {2, 4, 4}, rt::DataType::kFLOAT},
                rt::StateTensorConfig{"conv", {6, 3}, rt::DataType::kBF16}}}})
            .numCheckpointSlots(2)
            .build();
    rt::KVCacheManager cache(config, stream.get());
    rt::PageManagerOptions managerOptions;
    managerOptions.maxSequences = 2;
    rt::PageManager manager(cache.layout(), managerOptions);
    rt::TieredPrefixCacheOptions options;
    options.numHostPages = {throughDisk ? 3 : 8};
    options.numHostStates = 2;
    std::filesystem::path const directory =
        std::filesystem::temp_directory_path() / ("kvcache-tiered-states-" + std::to_string(::getpid()));
    if (throughDisk)
    {
        options.diskDirectory = directory.string();
        options.numDiskPages = {8};
    }
    rt::TieredPrefixCache tiered(cache, manager, options);
    ASSERT_EQ(tiered.checkpointGroup(), 0);
    EXPECT_EQ(tiered.hostTier(0).numHostStates(), 2);

    std::vector<int64_t> const tensorBytes{128, 36};
    auto slotAddress = [&](int32_t tensor, int32_t slot)
    {
        return static_cast<char*>(cache.stateView(0, tensor).rawPointer())
            + slot * tensorBytes[static_cast<size_t>(tensor)];
    };
    auto writeSlot = [&](int32_t slot, uint32_t tag)
    {
        for (int32_t t = 0; t < 2; ++t)
        {
            kvcache::test::uploadBytes(
                slotAddress(t, slot), stateBytes(t, tensorBytes[static_cast<size_t>(t)], tag), stream.get());
        }
    };
    auto slotHolds = [&](int32_t slot, uint32_t tag)
    {
        bool same = true;
        for (int32_t t = 0; t < 2; ++t)
        {
            same = same
                && kvcache::test::downloadBytes(slotAddress(t, slot), tensorBytes[static_cast<size_t>(t)], stream.get())
                    == stateBytes(t, tensorBytes[static_cast<size_t>(t)], tag);
        }
        return same;
    };
    auto poisonStates = [&]()
    {
        for (int32_t t = 0; t < 2; ++t)
        {
            KVCACHE_CUDA_TRY(
                cudaMemsetAsync(slotAddress(t, 0), 0xA5, 4 * tensorBytes[static_cast<size_t>(t)], stream.get()));
        }
    };
    auto runStateCopies = [&](std::vector<rt::StateSlotCopy> const& copies)
    { rt::copyStates(cache, copies.data(), static_cast<int32_t>(copies.size()), stream.get()); };

    // A prompt of 3 pages and a token: the runtime steps to the checkpoint boundary (48), where its kernels leave the
    // state `kTAG`, and checkpoints it; the next step hands out the save.
    constexpr uint32_t kTAG = 48;
    std::vector<int32_t> const prompt = tokenRun(11, 3 * kTOKENS_PER_PAGE + 1);
    rt::SequenceId const a = manager.create();
    EXPECT_EQ(tiered.admit(a, prompt.data(), 49, stream.get()).computeTokens, 49);
    ASSERT_EQ(manager.checkpointBoundary(a), 48);
    rt::SequenceAppend const first{a, prompt.data(), 48};
    runStateCopies(tiered.step(&first, 1, stream.get()).stateCopies());
    writeSlot(manager.stateSlot(a), kTAG);
    ASSERT_TRUE(manager.checkpointState(a));
    rt::SequenceAppend const last{a, prompt.data() + 48, 1};
    runStateCopies(tiered.step(&last, 1, stream.get()).stateCopies());
    writeSlot(manager.stateSlot(a), kTAG + 1);
    manager.free(a);
    std::vector<rt::PageHash> hashes(3);
    manager.hasher().chain(manager.hasher().root(nullptr, 0), prompt.data(), 3, kTOKENS_PER_PAGE, hashes.data());
    int32_t const checkpointSlot = manager.checkpointSlot(hashes[2]);
    ASSERT_GE(checkpointSlot, 2);
    EXPECT_TRUE(slotHolds(checkpointSlot, kTAG));

    // Evicted: the checkpoint's state goes to a host state with the carrier page, bit for bit.
    EXPECT_EQ(tiered.evictCached(0, 8, stream.get()), 3);
    ASSERT_EQ(tiered.numHostStatesHeld(), 1);
    int32_t const hostState = tiered.findHostState(hashes[2]);
    ASSERT_GE(hostState, 0);
    EXPECT_EQ(manager.numCheckpoints(), 0);
    std::vector<uint8_t> packed = stateBytes(0, 128, kTAG);
    std::vector<uint8_t> const conv = stateBytes(1, 36, kTAG);
    packed.insert(packed.end(), conv.begin(), conv.end());
    ASSERT_EQ(tiered.hostTier(0).hostStateBytes(), 164);
    auto const* held = static_cast<uint8_t const*>(tiered.hostTier(0).hostStateData(hostState));
    EXPECT_EQ(std::vector<uint8_t>(held, held + 164), packed);

    if (throughDisk)
    {
        // Another prompt's 3 pages take every host page: the first prompt's go to disk, page 2 with its state.
        std::vector<int32_t> const other = tokenRun(5000, 3 * kTOKENS_PER_PAGE + 1);
        rt::SequenceId const c = manager.create();
        tiered.admit(c, other.data(), 49, stream.get());
        rt::SequenceAppend const whole{c, other.data(), 49};
        runStateCopies(tiered.step(&whole, 1, stream.get()).stateCopies());
        manager.free(c);
        EXPECT_EQ(tiered.evictCached(0, 8, stream.get()), 3);
        EXPECT_EQ(tiered.stats().spilledStates, 1);
        EXPECT_EQ(tiered.numHostStatesHeld(), 0);
        EXPECT_GE(tiered.findDiskPage(0, hashes[2]), 0);
        // The freed host state poisoned too: the state can only come back from the file.
        std::fill_n(static_cast<uint8_t*>(tiered.hostTier(0).hostStateData(hostState)), 164, uint8_t{0xA5});
    }
    // Every state slot poisoned: the second request's state can only come from the host (or the disk).
    poisonStates();
    rt::SequenceId const b = manager.create();
    rt::TieredAdmission const admission = tiered.admit(b, prompt.data(), 49, stream.get());
    EXPECT_EQ(admission.hostTokens, 48);
    EXPECT_EQ(admission.computeTokens, 1);
    int32_t const restored = manager.checkpointSlot(hashes[2]);
    ASSERT_GE(restored, 2);
    EXPECT_TRUE(slotHolds(restored, kTAG)) << "the host state onboarded into the checkpoint slot";
    // The restore is the next step's state copy: the sequence's slot then holds the state after token 48.
    rt::SequenceAppend const rest{b, prompt.data() + 48, 1};
    std::vector<rt::StateSlotCopy> const copies = tiered.step(&rest, 1, stream.get()).stateCopies();
    ASSERT_EQ(copies.size(), 1u);
    EXPECT_EQ(copies[0].src, restored);
    EXPECT_EQ(copies[0].dst, manager.stateSlot(b));
    runStateCopies(copies);
    EXPECT_TRUE(slotHolds(manager.stateSlot(b), kTAG));
    rt::TieredPrefixCacheStats const stats = tiered.stats();
    EXPECT_EQ(stats.offloadedStates, 1);
    EXPECT_EQ(stats.onboardedStates, 1);
    EXPECT_EQ(stats.restoredStates, throughDisk ? 1 : 0);
    EXPECT_EQ(stats.diskHitTokens, throughDisk ? 48 : 0);
    tiered.checkInvariants();
    manager.checkInvariants();
}

TEST_F(TieredPrefixCacheGpuTest, ACheckpointsStateGoesToTheHostWithItsPageAndComesBackBitwise)
{
    checkpointRoundTrip(false);
}

TEST_F(TieredPrefixCacheGpuTest, ACheckpointsStateGoesToTheDiskWithItsPageAndComesBackBitwise)
{
    checkpointRoundTrip(true);
}

} // namespace
