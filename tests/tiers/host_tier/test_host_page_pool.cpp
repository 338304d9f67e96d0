// The host tier's free host pages (src/tiers/host_tier/host_pages/host_page_pool.h), on the host: the order they
// are handed out in, the pinned limit, and refused calls that change nothing. The order is the one the host tier has
// always promised: released host pages first, most recent first, then never used ones in ascending order.

#include "tiers/host_tier/host_pages/host_page_pool.h"

#include "kvcache/core/errors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "support/error_matchers.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::throwsNaming;
using rt::detail::HostPagePool;

TEST(HostPagePoolTest, HandsOutReleasedHostPagesFirstThenNeverUsedOnesInOrder)
{
    HostPagePool pool(8);
    EXPECT_EQ(pool.allocate(3, 8), (std::vector<int32_t>{0, 1, 2}));
    std::vector<int32_t> const back{2, 0};
    pool.release(back.data(), 2, 8);
    EXPECT_EQ(pool.numFree(8), 7);
    // 0 was released last, so it comes first; then 2; then the never used 3, 4.
    EXPECT_EQ(pool.allocate(4, 8), (std::vector<int32_t>{0, 2, 3, 4}));
    EXPECT_EQ(pool.numFree(8), 3);
}

TEST(HostPagePoolTest, OnlyPinnedHostPagesAreHandedOut)
{
    HostPagePool pool(10);
    EXPECT_EQ(pool.numFree(4), 4);
    EXPECT_EQ(pool.allocate(4, 4), (std::vector<int32_t>{0, 1, 2, 3}));
    EXPECT_EQ(pool.numFree(4), 0);
    EXPECT_TRUE(throwsNaming<rt::OutOfMemoryError>([&] { pool.allocate(1, 4); }, {"count is 1", "0 free", "4 of 10"}));
    // Pinning grew: the next host pages become free, in order.
    EXPECT_EQ(pool.numFree(7), 3);
    EXPECT_EQ(pool.allocate(2, 7), (std::vector<int32_t>{4, 5}));
    EXPECT_EQ(pool.numFree(7), 1);
}

TEST(HostPagePoolTest, RefusedCallsChangeNothing)
{
    HostPagePool pool(6);
    std::vector<int32_t> const three = pool.allocate(3, 6);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { pool.allocate(-1, 6); }, {"count", "-1"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfMemoryError>([&] { pool.allocate(4, 6); }, {"count is 4", "3 free"}));

    std::vector<int32_t> const outside{1, 6};
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] { pool.release(outside.data(), 2, 6); }, {"releaseHostPages", "host page 6", "[0, 6)"}));
    std::vector<int32_t> const free{1, 4};
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { pool.release(free.data(), 2, 6); }, {"hostPages[1]", "host page 4", "not handed out"}));
    std::vector<int32_t> const twice{2, 2};
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { pool.release(twice.data(), 2, 6); }, {"host page 2", "more than once"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { pool.release(nullptr, 1, 6); }, {"count", "null"}));
    // Nothing above was released: the three host pages are still out, the next one handed out is never used.
    EXPECT_EQ(pool.numFree(6), 3);
    EXPECT_EQ(pool.allocate(1, 6), (std::vector<int32_t>{3}));
    pool.release(three.data(), 3, 6);
    EXPECT_EQ(pool.allocate(3, 6), (std::vector<int32_t>{2, 1, 0}));
}

} // namespace
