// Page copies and resets on caches of several page groups (full attention and two sliding windows, KV and latent
// layers), from host and device lists, checked byte for byte against the host model of every layer of every group:
// page ids index the targeted group's pages only, layers are positions in the group's list, kV skips latent layers and
// kBOTH touches their one half, ids are checked (or counted) against the targeted group's numPages, and a target
// without a group or with a group outside the cache is refused before anything runs.

#include "kvcache/core/data_type.h"
#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/memory/page_ops.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/data_types.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/page_op_reference.h"

namespace kvcache::test
{
namespace
{

constexpr rt::KVLayerKind kLATENT = rt::KVLayerKind::kLATENT;
constexpr rt::KVHalf kBOTH = rt::KVHalf::kBOTH;
constexpr rt::KVHalf kK = rt::KVHalf::kK;
constexpr rt::KVHalf kV = rt::KVHalf::kV;
constexpr uint32_t kPATTERN = 0xDEADBEEFU;

//! Pages per half of each group of groupedConfig(): the minima are 26, 6 and 10, so every group keeps spare pages.
constexpr int32_t kGROUP_PAGES[] = {40, 12, 24};

//! Seven layers in three page groups: 2 slots of 200 tokens in pages of 16, steps of up to 8 tokens.
//! Group 0, full attention, 13 pages a sequence: layers 0 (KV), 2 (latent), 5 (KV).
//! Group 1, window 16, ceil((15 + 8) / 16) + 1 = 3 pages a sequence: layers 1 (KV), 3 (latent).
//! Group 2, window 48, ceil((47 + 8) / 16) + 1 = 5 pages a sequence: layers 4 (KV), 6 (latent), whose pages are the
//! same size (16 x 3 x 8 and 16 x 1 x 24 elements).
rt::KVCacheConfig groupedConfig(rt::DataType type)
{
    rt::KVCacheConfig config = ConfigBuilder(
        {{2, 16}, {1, 40, 16}, {1, 24, 0, kLATENT}, {1, 56, 16, kLATENT}, {3, 8, 48}, {1, 8}, {1, 24, 48, kLATENT}})
                                   .maxBatchSize(2)
                                   .maxSequenceLength(200)
                                   .tokensPerPage(16)
                                   .dataType(type)
                                   .build();
    config.maxTokensPerStep = 8;
    config.numPagesPerGroup.assign(std::begin(kGROUP_PAGES), std::end(kGROUP_PAGES));
    return config;
}

//! Targets of one group of groupedConfig(): each has a KV layer at position 0 and a latent one at position 1, and
//! group 0 a KV layer at position 2.
std::vector<rt::PageOpTarget> targetsOfGroup(int32_t group)
{
    std::vector<rt::PageOpTarget> targets{
        {0, -1, kBOTH, group},
        {0, -1, kK, group},
        {0, -1, kV, group},
        {1, 1, kBOTH, group}, // the latent layer alone: its one half
        {1, 1, kV, group},    // the latent layer's missing half: nothing
        {1, -1, kK, group},
        {0, 1, kV, group},
        {0, 1, kBOTH, group},
    };
    if (group == 0)
    {
        targets.push_back({1, -1, kV, 0});
        targets.push_back({2, 1, kBOTH, 0});
    }
    return targets;
}

//! Which API a call goes through.
enum class Lists
{
    kHOST,
    kDEVICE,
};

std::string listsName(Lists lists)
{
    return lists == Lists::kHOST ? "host lists" : "device lists";
}

//! Copies `pairs` on `target` through host or device lists (a device list counts its bad pairs into `errors` when
//! given) and waits for it.
void copyThrough(Lists lists, CacheUnderTest& cut, std::vector<rt::PageCopy> const& pairs,
    rt::PageOpTarget const& target, int32_t* errors = nullptr)
{
    if (lists == Lists::kHOST)
    {
        rt::copyPages(cut.cache(), pairs, cut.stream(), target);
        return;
    }
    DeviceArray<rt::PageCopy> const list(pairs, cut.stream());
    auto const capacity = static_cast<int32_t>(pairs.size());
    rt::copyPagesDevice(cut.cache(), list.get(), capacity, nullptr, cut.stream(), target, errors);
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(cut.stream()));
}

//! Resets `pages` to kPATTERN on `target` through host or device lists, as copyThrough does.
void resetThrough(Lists lists, CacheUnderTest& cut, std::vector<int32_t> const& pages, rt::PageOpTarget const& target,
    int32_t* errors = nullptr)
{
    if (lists == Lists::kHOST)
    {
        rt::resetPages(cut.cache(), pages, cut.stream(), kPATTERN, target);
        return;
    }
    DeviceArray<int32_t> const list(pages, cut.stream());
    auto const capacity = static_cast<int32_t>(pages.size());
    rt::resetPagesDevice(cut.cache(), list.get(), capacity, nullptr, cut.stream(), kPATTERN, target, errors);
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(cut.stream()));
}

//! Copies `pairs`, then resets `pages`, on `target`, checking every byte of every layer after each.
void copyResetAndCheck(Lists lists, CacheUnderTest& cut, rt::PageOpTarget const& target,
    std::vector<rt::PageCopy> const& pairs, std::vector<int32_t> const& pages)
{
    SCOPED_TRACE(listsName(lists) + ", " + describe(target));
    copyThrough(lists, cut, pairs, target);
    cut.reference().copy(pairs, target);
    ASSERT_TRUE(cut.matchesReference()) << "copy";
    resetThrough(lists, cut, pages, target);
    cut.reference().reset(pages, kPATTERN, target);
    ASSERT_TRUE(cut.matchesReference()) << "reset";
}

using PageOpsGroupsTest = GpuTest;

template <typename T>
class PageOpsGroupsTypedTest : public TypedGpuTest<T>
{
};
TYPED_TEST_SUITE(PageOpsGroupsTypedTest, OneKVCacheDataTypePerSize, DataTypeNames);

TEST_F(PageOpsGroupsTest, TheGroupedCacheHasTheGroupsTheOtherTestsAssume)
{
    CudaStream stream;
    rt::KVCacheManager const cache(groupedConfig(rt::DataType::kHALF), stream.get());
    ASSERT_EQ(cache.numGroups(), 3);
    std::vector<std::vector<int32_t>> const layers{{0, 2, 5}, {1, 3}, {4, 6}};
    std::vector<int32_t> const minPages{26, 6, 10};
    for (int32_t group = 0; group < 3; ++group)
    {
        SCOPED_TRACE("group " + std::to_string(group));
        EXPECT_EQ(cache.group(group).layers, layers[static_cast<size_t>(group)]);
        EXPECT_EQ(cache.group(group).minPages, minPages[static_cast<size_t>(group)]);
        EXPECT_EQ(cache.group(group).numPages, kGROUP_PAGES[group]);
    }
    EXPECT_EQ(cache.layout().layers[4].pageBytes, cache.layout().layers[6].pageBytes);
    EXPECT_EQ(cache.vPoolPtr(2), nullptr);
    EXPECT_EQ(cache.vPoolPtr(3), nullptr);
    EXPECT_EQ(cache.vPoolPtr(6), nullptr);
}

TYPED_TEST(PageOpsGroupsTypedTest, EachTargetTouchesOnlyItsGroupsLayersAndHalves)
{
    CacheUnderTest cut(groupedConfig(TypeParam::value), 301);
    for (Lists const lists : {Lists::kHOST, Lists::kDEVICE})
    {
        for (int32_t group = 0; group < 3; ++group)
        {
            for (rt::PageOpTarget const& target : targetsOfGroup(group))
            {
                ASSERT_NO_FATAL_FAILURE(
                    copyResetAndCheck(lists, cut, target, cut.randomPairs(5, group), cut.randomPages(4, group)));
            }
        }
    }
}

TEST_F(PageOpsGroupsTest, TheSameIdsInAnotherGroupAreOtherPages)
{
    // Page 3 of group 1 is not page 3 of group 0: every other group's bytes must stay as they were.
    CacheUnderTest cut(groupedConfig(rt::DataType::kHALF), 302);
    std::vector<rt::PageCopy> const pairs{{1, 3}, {4, 0}, {5, 2}};
    std::vector<int32_t> const pages{3, 5};
    for (Lists const lists : {Lists::kHOST, Lists::kDEVICE})
    {
        for (int32_t const group : {1, 2, 0})
        {
            ASSERT_NO_FATAL_FAILURE(copyResetAndCheck(lists, cut, {0, -1, kBOTH, group}, pairs, pages));
        }
        cut.refill();
    }
}

TEST_F(PageOpsGroupsTest, IdsBeyondTheTargetedGroupsPagesAreOutOfRange)
{
    CacheUnderTest cut(groupedConfig(rt::DataType::kHALF), 303);
    for (int32_t const group : {1, 2})
    {
        SCOPED_TRACE("group " + std::to_string(group));
        // Valid in group 0, whose 40 pages outnumber the others'.
        int32_t const id = kGROUP_PAGES[group];
        std::string const limit = "; page ids must be in [0, " + std::to_string(id) + ")";
        std::string const page = " is page " + std::to_string(id) + limit;
        rt::PageOpTarget const target{0, -1, kBOTH, group};
        EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
            [&] {
                rt::copyPages(cut.cache(), {{id, 1}}, cut.stream(), target);
            },
            {"copyPages: pairs.src[0]" + page}));
        EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
            [&] {
                rt::copyPages(cut.cache(), {{2, 0}, {1, id}}, cut.stream(), target);
            },
            {"copyPages: pairs.dst[1]" + page}));
        EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
            [&] {
                rt::resetPages(cut.cache(), {0, id}, cut.stream(), kPATTERN, target);
            },
            {"resetPages: pages[1]" + page}));
        EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
            [&] { rt::resetPages(cut.cache(), {id + 9}, cut.stream(), kPATTERN, target); }, {"pages[0]", limit}));
        ASSERT_TRUE(cut.matchesReference()) << "a rejected list changed the buffers";
    }
    // The same ids in group 0 are pages like any other.
    ASSERT_NO_FATAL_FAILURE(copyResetAndCheck(Lists::kHOST, cut, {0, -1, kBOTH, 0},
        {{kGROUP_PAGES[1], 1}, {kGROUP_PAGES[2], 2}}, {kGROUP_PAGES[1] + 9, kGROUP_PAGES[2] + 9}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] {
            rt::copyPages(cut.cache(), {{kGROUP_PAGES[0], 1}}, cut.stream(), {0, -1, kBOTH, 0});
        },
        {"page ids must be in [0, 40)"}));
    ASSERT_TRUE(cut.matchesReference());
}

//! A target the grouped cache refuses, with what the message must name after the operation's name.
struct RefusedTarget
{
    rt::PageOpTarget target;
    std::vector<std::string> named;
};

TEST_F(PageOpsGroupsTest, AMissingOrUnknownGroupIsRefusedBeforeAnyLaunch)
{
    CacheUnderTest cut(groupedConfig(rt::DataType::kHALF), 304);
    constexpr int32_t kINT32_MIN = std::numeric_limits<int32_t>::min();
    std::vector<RefusedTarget> const refused{
        {{0, -1, kBOTH, -1}, {"PageOpTarget.group is -1 but the cache has 3 page groups", "[0, 3)"}},
        {{0, 1, kK, -1}, {"PageOpTarget.group is -1 but the cache has 3 page groups"}},
        {{0, -1, kBOTH, 3}, {"PageOpTarget.group is 3", "[0, 3)"}},
        {{0, -1, kV, -2}, {"PageOpTarget.group is -2", "[0, 3)"}},
        {{0, -1, kBOTH, kINT32_MIN}, {"PageOpTarget.group is " + std::to_string(kINT32_MIN)}},
        // Positions count within the group: 2 is a layer of group 0 only.
        {{2, -1, kBOTH, 1}, {"PageOpTarget.firstLayer is 2", "[0, 2)", "page group 1"}},
        {{0, 3, kK, 2}, {"PageOpTarget.numLayers is 3", "[0, 2]"}},
    };
    // Every entry is bad in every group, so a launch would show in the error counter as well as in the bytes.
    std::vector<rt::PageCopy> const pairs{{1, kGROUP_PAGES[0]}, {-5, 2}};
    std::vector<int32_t> const pages{kGROUP_PAGES[0], 1 << 30};
    DeviceArray<rt::PageCopy> const devicePairs(pairs, cut.stream());
    DeviceArray<int32_t> const devicePages(pages, cut.stream());
    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cut.stream());
    cudaStream_t const stream = cut.stream();
    for (RefusedTarget const& bad : refused)
    {
        SCOPED_TRACE(describe(bad.target));
        auto const named = [&](std::string const& what)
        {
            std::vector<std::string> words{what + ": " + bad.named.front()};
            words.insert(words.end(), bad.named.begin() + 1, bad.named.end());
            return words;
        };
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] {
                rt::copyPages(cut.cache(), {{1, 2}}, stream, bad.target);
            },
            named("copyPages")));
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { rt::resetPages(cut.cache(), {1}, stream, kPATTERN, bad.target); }, named("resetPages")));
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
            { rt::copyPagesDevice(cut.cache(), devicePairs.get(), 2, nullptr, stream, bad.target, errors.get()); },
            named("copyPagesDevice")));
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
            { rt::resetPagesDevice(cut.cache(), devicePages.get(), 2, nullptr, stream, 0U, bad.target, errors.get()); },
            named("resetPagesDevice")));
    }
    ASSERT_TRUE(cut.matchesReference()) << "a refused call changed the buffers";
    EXPECT_EQ(errors.download(stream)[0], 0) << "a refused call launched a kernel";

    // The same device lists on a real group are launched, and counted.
    rt::copyPagesDevice(cut.cache(), devicePairs.get(), 2, nullptr, stream, {0, -1, kBOTH, 1}, errors.get());
    rt::resetPagesDevice(cut.cache(), devicePages.get(), 2, nullptr, stream, 0U, {0, -1, kBOTH, 2}, errors.get());
    EXPECT_EQ(errors.download(stream)[0], 4);
    ASSERT_TRUE(cut.matchesReference());
}

TEST_F(PageOpsGroupsTest, DeviceListsCountBadIdsAgainstTheTargetedGroup)
{
    CacheUnderTest cut(groupedConfig(rt::DataType::kHALF), 305);
    constexpr int32_t kUNUSED = rt::kUNUSED_PAGE_ENTRY;
    // Sources and destinations stay apart in every group; which ids are bad depends on the group's 40, 12 or 24 pages.
    std::vector<rt::PageCopy> const pairs{
        {3, 1}, {12, 2}, {4, 13}, {kUNUSED, 5}, {23, 6}, {30, 7}, {8, 40}, {-5, 9}, {10, 0}};
    std::vector<int32_t> const pages{3, 12, kUNUSED, 23, 30, 40, -5, 0};
    struct Case
    {
        rt::PageOpTarget target;
        int32_t badPairs;
        int32_t badPages;
    };
    std::vector<Case> const cases{
        {{0, -1, kBOTH, 0}, 2, 2},
        {{0, -1, kBOTH, 1}, 6, 5},
        {{0, -1, kBOTH, 2}, 3, 3},
        {{1, -1, kK, 0}, 2, 2},
        // Only the latent layer's missing V half: nothing is written, but bad ids are still counted once each.
        {{1, 1, kV, 1}, 6, 5},
        {{0, 1, kV, 2}, 3, 3},
    };
    DeviceArray<int32_t> errors(1);
    for (Case const& testCase : cases)
    {
        SCOPED_TRACE(describe(testCase.target));
        errors.upload({0}, cut.stream());
        copyThrough(Lists::kDEVICE, cut, pairs, testCase.target, errors.get());
        cut.reference().copy(pairs, testCase.target);
        ASSERT_TRUE(cut.matchesReference()) << "copyPagesDevice";
        EXPECT_EQ(errors.download(cut.stream())[0], testCase.badPairs) << "copyPagesDevice";

        errors.upload({0}, cut.stream());
        resetThrough(Lists::kDEVICE, cut, pages, testCase.target, errors.get());
        cut.reference().reset(pages, kPATTERN, testCase.target);
        ASSERT_TRUE(cut.matchesReference()) << "resetPagesDevice";
        EXPECT_EQ(errors.download(cut.stream())[0], testCase.badPages) << "resetPagesDevice";
        cut.refill();
    }

    // A device count stops the list before its bad entries in group 1 (the first bad pair is at position 1).
    DeviceArray<rt::PageCopy> const list(pairs, cut.stream());
    DeviceArray<int32_t> const count(std::vector<int32_t>{1}, cut.stream());
    errors.upload({0}, cut.stream());
    rt::PageOpTarget const groupOne{0, -1, kBOTH, 1};
    rt::copyPagesDevice(cut.cache(), list.get(), 9, count.get(), cut.stream(), groupOne, errors.get());
    cut.reference().copy(firstEntries(pairs, 1), groupOne);
    ASSERT_TRUE(cut.matchesReference());
    EXPECT_EQ(errors.download(cut.stream())[0], 0);
}

TEST_F(PageOpsGroupsTest, WideBlocksServeALaterGroupWithALatentLayer)
{
    // Group 2's two layers have pages of one size, so K of both, or both halves of the KV layer alone, take wide
    // blocks for a list of over 4096 entries (two layer halves of one chunk each).
    CacheUnderTest cut(groupedConfig(rt::DataType::kHALF), 306);
    constexpr int32_t kCAPACITY = 4200;
    constexpr int32_t kGROUP = 2;
    std::vector<int32_t> const positions{0, 1, 2047, 4096, kCAPACITY - 1};
    auto const entries = static_cast<int32_t>(positions.size());
    for (rt::PageOpTarget const& target : {rt::PageOpTarget{0, -1, kK, kGROUP}, rt::PageOpTarget{0, 1, kBOTH, kGROUP}})
    {
        SCOPED_TRACE(describe(target));
        std::vector<rt::PageCopy> const real = cut.randomPairs(entries, kGROUP);
        std::vector<int32_t> const realPages = cut.randomPages(entries, kGROUP);
        std::vector<rt::PageCopy> pairs(kCAPACITY, rt::PageCopy{rt::kUNUSED_PAGE_ENTRY, rt::kUNUSED_PAGE_ENTRY});
        std::vector<int32_t> pages(kCAPACITY, rt::kUNUSED_PAGE_ENTRY);
        for (size_t i = 0; i < positions.size(); ++i)
        {
            pairs[static_cast<size_t>(positions[i])] = real[i];
            pages[static_cast<size_t>(positions[i])] = realPages[i];
        }
        copyThrough(Lists::kDEVICE, cut, pairs, target);
        cut.reference().copy(real, target);
        ASSERT_TRUE(cut.matchesReference()) << "copyPagesDevice";
        resetThrough(Lists::kDEVICE, cut, pages, target);
        cut.reference().reset(realPages, kPATTERN, target);
        ASSERT_TRUE(cut.matchesReference()) << "resetPagesDevice";
    }
}

TEST_F(PageOpsGroupsTest, AOneGroupLatentCacheTakesGroupMinusOne)
{
    // DeepSeek-like: latent layers only, all full attention, so one group; 6 minimum pages and 14 retained.
    rt::KVCacheConfig const config = ConfigBuilder({{1, 64, 0, kLATENT}, {1, 24, 0, kLATENT}, {1, 40, 0, kLATENT}})
                                         .maxBatchSize(2)
                                         .maxSequenceLength(40)
                                         .tokensPerPage(16)
                                         .numPages(20)
                                         .build();
    CacheUnderTest cut(config, 307);
    ASSERT_EQ(cut.cache().numGroups(), 1);
    std::vector<rt::PageOpTarget> const targets{
        {}, {0, -1, kK, -1}, {0, -1, kV, -1}, {1, 1, kBOTH, -1}, {0, -1, kBOTH, 0}, {2, -1, kK, 0}};
    for (Lists const lists : {Lists::kHOST, Lists::kDEVICE})
    {
        for (rt::PageOpTarget const& target : targets)
        {
            ASSERT_NO_FATAL_FAILURE(copyResetAndCheck(lists, cut, target, cut.randomPairs(6), cut.randomPages(5)));
        }
    }
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            rt::copyPages(cut.cache(), {{1, 2}}, cut.stream(), {0, -1, kBOTH, 1});
        },
        {"copyPages: PageOpTarget.group is 1", "[0, 1)"}));
    ASSERT_TRUE(cut.matchesReference());
}

} // namespace
} // namespace kvcache::test
