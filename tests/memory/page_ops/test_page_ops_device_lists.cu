// Page copies and resets from device lists (copyPagesDevice, resetPagesDevice), checked byte for byte against the
// host model: every data type, counts read from device memory and clamped to the capacity, unused entries skipped,
// bad ids counted and never dereferenced, graphs that replay with whatever the lists hold, thousands of entries, lists
// longer than one grid, large pages on the wide L2-hint path, and the host-side checks made before any launch.

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/cuda_raii.h"
#include "support/data_types.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/page_op_reference.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::CacheUnderTest;
using kvcache::test::DeviceArray;
using kvcache::test::firstEntries;

constexpr int32_t kINT32_MAX = std::numeric_limits<int32_t>::max();
constexpr int32_t kINT32_MIN = std::numeric_limits<int32_t>::min();

using DeviceListPageOpsTest = kvcache::test::GpuTest;

TEST_F(DeviceListPageOpsTest, DeviceCopySkipsUnusedEntriesAndCountsBadIds)
{
    CacheUnderTest cut(kvcache::test::smallConfig(), 7);
    int32_t const n = cut.numPages();
    std::vector<rt::PageCopy> const list{
        {3, 10},
        {rt::kUNUSED_PAGE_ENTRY, 11},
        {4, rt::kUNUSED_PAGE_ENTRY},
        {rt::kUNUSED_PAGE_ENTRY, rt::kUNUSED_PAGE_ENTRY},
        {n, 12},
        {5, n},
        {1 << 30, 13},
        {6, -5},
        {kINT32_MIN, 14},
        {8, kINT32_MAX},
        {7, 15},
        {3, 16},
        {n - 1, 0},
    };
    constexpr int32_t kBAD_PAIRS = 6; // {n, 12}, {5, n}, {1 << 30, 13}, {6, -5}, {INT32_MIN, 14}, {8, INT32_MAX}
    constexpr int32_t kEARLIER_ERRORS = 7;
    int32_t const size = static_cast<int32_t>(list.size());
    DeviceArray<rt::PageCopy> deviceList(list, cut.stream());
    DeviceArray<int32_t> errors(std::vector<int32_t>{kEARLIER_ERRORS}, cut.stream());

    rt::copyPagesDevice(cut.cache(), deviceList.get(), size, nullptr, cut.stream(), {}, errors.get());
    cut.reference().copy(list);
    ASSERT_TRUE(cut.matchesReference());
    EXPECT_EQ(errors.download(cut.stream())[0], kEARLIER_ERRORS + kBAD_PAIRS);

    // Without an error counter the bad pairs are skipped all the same.
    cut.refill();
    rt::copyPagesDevice(cut.cache(), deviceList.get(), size, nullptr, cut.stream());
    cut.reference().copy(list);
    ASSERT_TRUE(cut.matchesReference());
}

TEST_F(DeviceListPageOpsTest, DeviceCopyReadsTheCountFromDeviceMemory)
{
    CacheUnderTest cut(kvcache::test::smallConfig(), 8);
    constexpr int32_t kCAPACITY = 10;
    std::vector<rt::PageCopy> const pairs = cut.randomPairs(kCAPACITY);
    DeviceArray<rt::PageCopy> deviceList(pairs, cut.stream());
    DeviceArray<int32_t> deviceCount(1);

    struct Case
    {
        int32_t deviceCount;
        int32_t applied;
    };
    // 1000 is clamped to the capacity: the list holds exactly that many entries, so reading more would show in
    // memcheck. A negative count counts as 0.
    for (Case const& testCase :
        {Case{4, 4}, Case{0, 0}, Case{1, 1}, Case{kCAPACITY, kCAPACITY}, Case{1000, kCAPACITY}, Case{-3, 0}})
    {
        SCOPED_TRACE("device count " + std::to_string(testCase.deviceCount));
        cut.refill();
        deviceCount.upload({testCase.deviceCount}, cut.stream());
        rt::copyPagesDevice(cut.cache(), deviceList.get(), kCAPACITY, deviceCount.get(), cut.stream());
        cut.reference().copy(firstEntries(pairs, testCase.applied));
        ASSERT_TRUE(cut.matchesReference());
    }

    // Without a count pointer the kernel takes the capacity, which may be shorter than the list.
    for (int32_t const capacity : {kCAPACITY, 6})
    {
        SCOPED_TRACE("no device count, capacity " + std::to_string(capacity));
        cut.refill();
        rt::copyPagesDevice(cut.cache(), deviceList.get(), capacity, nullptr, cut.stream());
        cut.reference().copy(firstEntries(pairs, capacity));
        ASSERT_TRUE(cut.matchesReference());
    }

    // Bad pairs past the count are neither applied nor counted.
    std::vector<rt::PageCopy> withBadTail = cut.randomPairs(kCAPACITY);
    withBadTail[7].src = cut.numPages();
    withBadTail[9].dst = -5;
    deviceList.upload(withBadTail, cut.stream());
    deviceCount.upload({5}, cut.stream());
    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cut.stream());
    cut.refill();
    rt::copyPagesDevice(cut.cache(), deviceList.get(), kCAPACITY, deviceCount.get(), cut.stream(), {}, errors.get());
    cut.reference().copy(firstEntries(withBadTail, 5));
    ASSERT_TRUE(cut.matchesReference());
    EXPECT_EQ(errors.download(cut.stream())[0], 0);
}

TEST_F(DeviceListPageOpsTest, DeviceResetSkipsUnusedEntriesCountsBadIdsAndReadsTheCount)
{
    CacheUnderTest cut(kvcache::test::smallConfig(), 9);
    int32_t const n = cut.numPages();
    std::vector<int32_t> const list{3, rt::kUNUSED_PAGE_ENTRY, n, 17, 1 << 30, -5, 40, kINT32_MIN, kINT32_MAX, 63, 0};
    constexpr int32_t kBAD_PAGES = 5; // n, 1 << 30, -5, INT32_MIN, INT32_MAX
    constexpr int32_t kEARLIER_ERRORS = 3;
    constexpr uint32_t kPATTERN = 0xDEADBEEFU;
    int32_t const size = static_cast<int32_t>(list.size());
    DeviceArray<int32_t> deviceList(list, cut.stream());
    DeviceArray<int32_t> errors(std::vector<int32_t>{kEARLIER_ERRORS}, cut.stream());

    rt::resetPagesDevice(cut.cache(), deviceList.get(), size, nullptr, cut.stream(), kPATTERN, {}, errors.get());
    cut.reference().reset(list, kPATTERN);
    ASSERT_TRUE(cut.matchesReference());
    EXPECT_EQ(errors.download(cut.stream())[0], kEARLIER_ERRORS + kBAD_PAGES);

    cut.refill();
    rt::resetPagesDevice(cut.cache(), deviceList.get(), size, nullptr, cut.stream(), kPATTERN);
    cut.reference().reset(list, kPATTERN);
    ASSERT_TRUE(cut.matchesReference()) << "without an error counter";

    // Only the first *deviceCount entries count, clamped to the capacity; the bad ids at 2 and 4 lie past a count of 2.
    DeviceArray<int32_t> deviceCount(1);
    DeviceArray<int32_t> freshErrors(std::vector<int32_t>{0}, cut.stream());
    for (int32_t const count : {2, 0, 1000})
    {
        SCOPED_TRACE("device count " + std::to_string(count));
        cut.refill();
        deviceCount.upload({count}, cut.stream());
        rt::resetPagesDevice(cut.cache(), deviceList.get(), size, deviceCount.get(), cut.stream(), 0U, {},
            count == 2 ? freshErrors.get() : nullptr);
        cut.reference().reset(firstEntries(list, count), 0U);
        ASSERT_TRUE(cut.matchesReference());
    }
    EXPECT_EQ(freshErrors.download(cut.stream())[0], 0);
}

TEST_F(DeviceListPageOpsTest, CapturedDeviceCopyReplaysWithTheCurrentListAndCount)
{
    CacheUnderTest cut(kvcache::test::smallConfig(), 11);
    constexpr int32_t kCAPACITY = 16;
    DeviceArray<rt::PageCopy> deviceList(cut.randomPairs(kCAPACITY), cut.stream());
    DeviceArray<int32_t> deviceCount(std::vector<int32_t>{kCAPACITY}, cut.stream());
    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cut.stream());

    kvcache::test::CapturedGraph graph(cut.stream(),
        [&] {
            rt::copyPagesDevice(
                cut.cache(), deviceList.get(), kCAPACITY, deviceCount.get(), cut.stream(), {}, errors.get());
        });
    ASSERT_TRUE(cut.matchesReference()) << "capturing ran something";

    int32_t expectedErrors = 0;
    for (int32_t const count : {kCAPACITY, 5, 11, 0, 40})
    {
        SCOPED_TRACE("device count " + std::to_string(count));
        std::vector<rt::PageCopy> pairs = cut.randomPairs(kCAPACITY);
        if (count == 11)
        {
            pairs[2].src = rt::kUNUSED_PAGE_ENTRY;
            pairs[6].dst = cut.numPages();
            ++expectedErrors;
        }
        deviceList.upload(pairs, cut.stream());
        deviceCount.upload({count}, cut.stream());
        graph.launch(cut.stream());
        cut.reference().copy(firstEntries(pairs, count));
        ASSERT_TRUE(cut.matchesReference());
    }
    EXPECT_EQ(errors.download(cut.stream())[0], expectedErrors);
}

TEST_F(DeviceListPageOpsTest, CapturedDeviceResetReplaysWithTheCurrentListAndCount)
{
    CacheUnderTest cut(kvcache::test::smallConfig(), 12);
    constexpr int32_t kCAPACITY = 12;
    constexpr uint32_t kPATTERN = 0x7E007E00U;
    DeviceArray<int32_t> deviceList(cut.randomPages(kCAPACITY), cut.stream());
    DeviceArray<int32_t> deviceCount(std::vector<int32_t>{kCAPACITY}, cut.stream());
    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cut.stream());

    kvcache::test::CapturedGraph graph(cut.stream(),
        [&]
        {
            rt::resetPagesDevice(
                cut.cache(), deviceList.get(), kCAPACITY, deviceCount.get(), cut.stream(), kPATTERN, {}, errors.get());
        });
    ASSERT_TRUE(cut.matchesReference()) << "capturing ran something";

    int32_t expectedErrors = 0;
    for (int32_t const count : {kCAPACITY, 3, 8, 0, 100})
    {
        SCOPED_TRACE("device count " + std::to_string(count));
        std::vector<int32_t> pages = cut.randomPages(kCAPACITY);
        if (count == 8)
        {
            pages[1] = rt::kUNUSED_PAGE_ENTRY;
            pages[4] = 1 << 30;
            ++expectedErrors;
        }
        deviceList.upload(pages, cut.stream());
        deviceCount.upload({count}, cut.stream());
        graph.launch(cut.stream());
        cut.reference().reset(firstEntries(pages, count), kPATTERN);
        ASSERT_TRUE(cut.matchesReference());
        cut.refill();
    }
    EXPECT_EQ(errors.download(cut.stream())[0], expectedErrors);
}

TEST_F(DeviceListPageOpsTest, TargetsTouchOnlyTheChosenLayersAndHalves)
{
    CacheUnderTest cut(kvcache::test::smallConfig(), 24);
    for (rt::PageOpTarget const& target : kvcache::test::targetsOfThreeLayers())
    {
        SCOPED_TRACE(kvcache::test::describe(target));
        std::vector<rt::PageCopy> const devicePairs = cut.randomPairs(7);
        DeviceArray<rt::PageCopy> deviceList(devicePairs, cut.stream());
        rt::copyPagesDevice(cut.cache(), deviceList.get(), 7, nullptr, cut.stream(), target);
        cut.reference().copy(devicePairs, target);
        ASSERT_TRUE(cut.matchesReference()) << "copyPagesDevice";

        std::vector<int32_t> const devicePages = cut.randomPages(5);
        DeviceArray<int32_t> devicePageList(devicePages, cut.stream());
        rt::resetPagesDevice(cut.cache(), devicePageList.get(), 5, nullptr, cut.stream(), 0x7E007E00U, target);
        cut.reference().reset(devicePages, 0x7E007E00U, target);
        ASSERT_TRUE(cut.matchesReference()) << "resetPagesDevice";
    }
}

TEST_F(DeviceListPageOpsTest, BadArgumentsThrowBeforeAnyLaunch)
{
    CacheUnderTest cut(kvcache::test::smallConfig(), 25);
    DeviceArray<rt::PageCopy> pairs(cut.randomPairs(4), cut.stream());
    DeviceArray<int32_t> pages(cut.randomPages(4), cut.stream());
    for (kvcache::test::BadTarget const& bad : kvcache::test::badTargetsOfThreeLayers())
    {
        SCOPED_TRACE(kvcache::test::describe(bad.target));
        EXPECT_TRUE(kvcache::test::throwsNaming<rt::InvalidArgumentError>([&]
            { rt::copyPagesDevice(cut.cache(), pairs.get(), 4, nullptr, cut.stream(), bad.target); },
            bad.named("copyPagesDevice")));
        EXPECT_TRUE(kvcache::test::throwsNaming<rt::InvalidArgumentError>([&]
            { rt::resetPagesDevice(cut.cache(), pages.get(), 4, nullptr, cut.stream(), 0xDEADBEEFU, bad.target); },
            bad.named("resetPagesDevice")));
    }
    for (int32_t const capacity : {-1, kINT32_MIN})
    {
        std::string const named = "capacity is " + std::to_string(capacity) + "; it must be >= 0";
        EXPECT_TRUE(kvcache::test::throwsNaming<rt::InvalidArgumentError>([&]
            { rt::copyPagesDevice(cut.cache(), pairs.get(), capacity, nullptr, cut.stream()); },
            {"copyPagesDevice: " + named}));
        EXPECT_TRUE(kvcache::test::throwsNaming<rt::InvalidArgumentError>([&]
            { rt::resetPagesDevice(cut.cache(), pages.get(), capacity, nullptr, cut.stream()); },
            {"resetPagesDevice: " + named}));
    }
    EXPECT_TRUE(kvcache::test::throwsNaming<rt::InvalidArgumentError>([&]
        { rt::copyPagesDevice(cut.cache(), nullptr, 3, nullptr, cut.stream()); },
        {"copyPagesDevice: the list is null but capacity is 3"}));
    EXPECT_TRUE(kvcache::test::throwsNaming<rt::InvalidArgumentError>([&]
        { rt::resetPagesDevice(cut.cache(), nullptr, 3, nullptr, cut.stream()); },
        {"resetPagesDevice: the list is null but capacity is 3"}));
    ASSERT_TRUE(cut.matchesReference()) << "a rejected call changed the buffer";

    EXPECT_NO_THROW(rt::copyPagesDevice(cut.cache(), nullptr, 0, nullptr, cut.stream()));
    EXPECT_NO_THROW(rt::resetPagesDevice(cut.cache(), nullptr, 0, nullptr, cut.stream(), 0xDEADBEEFU));
    EXPECT_NO_THROW(rt::copyPagesDevice(cut.cache(), pairs.get(), 4, nullptr, cut.stream(), {1, 0, rt::KVHalf::kK}));
    ASSERT_TRUE(cut.matchesReference()) << "an empty list or layer range changed the buffer";
}

TEST_F(DeviceListPageOpsTest, ThousandsOfDeviceEntriesOnALargePool)
{
    CacheUnderTest cut(kvcache::test::pagePoolConfig({{1, 64}, {1, 24}}, 16, 4608), 20);
    constexpr int32_t kPAIRS = 3000;
    constexpr int32_t kPAGES = 4000;
    std::vector<rt::PageCopy> const pairs = cut.randomPairs(kPAIRS);
    DeviceArray<rt::PageCopy> deviceList(pairs, cut.stream());
    DeviceArray<int32_t> deviceCount(std::vector<int32_t>{kPAIRS}, cut.stream());
    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cut.stream());
    rt::copyPagesDevice(cut.cache(), deviceList.get(), kPAIRS, deviceCount.get(), cut.stream(), {}, errors.get());
    cut.reference().copy(pairs);
    ASSERT_TRUE(cut.matchesReference());
    EXPECT_EQ(errors.download(cut.stream())[0], 0);

    std::vector<int32_t> const pages = cut.randomPages(kPAGES);
    DeviceArray<int32_t> devicePages(pages, cut.stream());
    rt::resetPagesDevice(cut.cache(), devicePages.get(), kPAGES, nullptr, cut.stream(), 0xDEADBEEFU);
    cut.reference().reset(pages, 0xDEADBEEFU);
    ASSERT_TRUE(cut.matchesReference());
}

TEST_F(DeviceListPageOpsTest, DeviceListsLongerThanOneGridAreCoveredWholeWithTheirCount)
{
    CacheUnderTest cut(kvcache::test::smallConfig(), 21);
    constexpr int32_t kLIMIT = rt::kMAX_DEVICE_PAGE_OPS_PER_LAUNCH;
    constexpr int32_t kCAPACITY = kLIMIT + 300;
    // Real pairs on both sides of every launch boundary; a bad pair and a reset page past the first launch.
    std::vector<int32_t> const positions{0, kLIMIT - 1, kLIMIT, kLIMIT + 150, kCAPACITY - 1};
    std::vector<rt::PageCopy> const real = cut.randomPairs(static_cast<int32_t>(positions.size()));
    std::vector<rt::PageCopy> list(kCAPACITY, rt::PageCopy{rt::kUNUSED_PAGE_ENTRY, rt::kUNUSED_PAGE_ENTRY});
    for (size_t i = 0; i < positions.size(); ++i)
    {
        list[static_cast<size_t>(positions[i])] = real[i];
    }
    constexpr int32_t kBAD_POSITION = kLIMIT + 100;
    list[kBAD_POSITION] = rt::PageCopy{cut.numPages(), 0};
    DeviceArray<rt::PageCopy> deviceList(list, cut.stream());
    DeviceArray<int32_t> deviceCount(1);
    DeviceArray<int32_t> errors(std::vector<int32_t>{0}, cut.stream());

    for (int32_t const count : {kCAPACITY, kLIMIT + 120, kLIMIT})
    {
        SCOPED_TRACE("device count " + std::to_string(count));
        cut.refill();
        deviceCount.upload({count}, cut.stream());
        errors.upload({0}, cut.stream());
        rt::copyPagesDevice(
            cut.cache(), deviceList.get(), kCAPACITY, deviceCount.get(), cut.stream(), {}, errors.get());
        cut.reference().copy(firstEntries(list, count));
        ASSERT_TRUE(cut.matchesReference());
        EXPECT_EQ(errors.download(cut.stream())[0], count > kBAD_POSITION ? 1 : 0);
    }

    std::vector<int32_t> pages(kCAPACITY, rt::kUNUSED_PAGE_ENTRY);
    pages[kLIMIT - 1] = real[0].dst;
    pages[kCAPACITY - 1] = real[1].dst;
    DeviceArray<int32_t> devicePages(pages, cut.stream());
    cut.refill();
    rt::resetPagesDevice(cut.cache(), devicePages.get(), kCAPACITY, nullptr, cut.stream(), 0x5EEDF00DU);
    cut.reference().reset({real[0].dst, real[1].dst}, 0x5EEDF00DU);
    ASSERT_TRUE(cut.matchesReference());
}

TEST_F(DeviceListPageOpsTest, LargePagesOfWholeVectorsButNotWholeLinesAreCopiedExactly)
{
    // 33,344-byte pages in four alike layers: a list of 300 entries writes over 32 MiB and needs over 4096 wide
    // blocks, so it runs in wide blocks that read their sources at L2 priority evict_last and give each line back.
    CacheUnderTest cut(kvcache::test::largePageConfig(), 26);
    constexpr int32_t kCAPACITY = 300;
    std::vector<rt::PageCopy> const pairs = cut.randomPairs(kCAPACITY);
    std::vector<int32_t> const pages = cut.randomPages(kCAPACITY);
    DeviceArray<rt::PageCopy> deviceList(pairs, cut.stream());
    DeviceArray<int32_t> devicePages(pages, cut.stream());
    rt::copyPagesDevice(cut.cache(), deviceList.get(), kCAPACITY, nullptr, cut.stream());
    cut.reference().copy(pairs);
    ASSERT_TRUE(cut.matchesReference()) << "copyPagesDevice";

    // The capacity picks the path, so a shorter count keeps it; the copy must still stop at the count.
    constexpr int32_t kCOUNT = 170;
    DeviceArray<int32_t> deviceCount(std::vector<int32_t>{kCOUNT}, cut.stream());
    cut.refill();
    rt::copyPagesDevice(cut.cache(), deviceList.get(), kCAPACITY, deviceCount.get(), cut.stream());
    cut.reference().copy(firstEntries(pairs, kCOUNT));
    ASSERT_TRUE(cut.matchesReference()) << "copyPagesDevice, " << kCOUNT << " of " << kCAPACITY << " pairs";

    rt::resetPagesDevice(cut.cache(), devicePages.get(), kCAPACITY, nullptr, cut.stream(), 0xDEADBEEFU);
    cut.reference().reset(pages, 0xDEADBEEFU);
    ASSERT_TRUE(cut.matchesReference()) << "resetPagesDevice";
}

template <typename T>
class DeviceListPageOpsTypedTest : public kvcache::test::TypedGpuTest<T>
{
};
TYPED_TEST_SUITE(DeviceListPageOpsTypedTest, kvcache::test::AllKVCacheDataTypes, kvcache::test::DataTypeNames);

TYPED_TEST(DeviceListPageOpsTypedTest, CopiesAndResetsMatchTheReference)
{
    kvcache::test::forEachPageSize(TypeParam::value, 200,
        [](CacheUnderTest& cut)
        {
            std::vector<rt::PageCopy> const devicePairs = cut.randomPairs(12);
            DeviceArray<rt::PageCopy> deviceList(devicePairs, cut.stream());
            DeviceArray<int32_t> deviceCount(std::vector<int32_t>{12}, cut.stream());
            rt::copyPagesDevice(cut.cache(), deviceList.get(), 12, deviceCount.get(), cut.stream());
            cut.reference().copy(devicePairs);
            ASSERT_TRUE(cut.matchesReference()) << "pairs from device memory";

            for (uint32_t const pattern : {0x7E007E00U, 0xDEADBEEFU, 0U})
            {
                std::vector<int32_t> const devicePages = cut.randomPages(7);
                DeviceArray<int32_t> devicePageList(devicePages, cut.stream());
                rt::resetPagesDevice(cut.cache(), devicePageList.get(), 7, nullptr, cut.stream(), pattern);
                cut.reference().reset(devicePages, pattern);
                ASSERT_TRUE(cut.matchesReference()) << "pattern " << pattern << " from device memory";
            }
        });
}

} // namespace
