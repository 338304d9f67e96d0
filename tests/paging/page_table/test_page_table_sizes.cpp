// PageTableBuffers' sizes (no GPU): non-positive sizes and oversized tables refused before any CUDA call, arrays on
// 128-byte boundaries without overlap, and an empty object that owns nothing and refuses to build.
// The batches and reference tables are tests/support/page_table_reference.h.

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_table.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "support/error_matchers.h"
#include "support/page_table_reference.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::throwsNaming;
using namespace kvcache::test::page_tables;

static_assert(
    std::is_nothrow_destructible_v<
        rt::PageTableBuffers> && std::is_nothrow_move_constructible_v<rt::PageTableBuffers> && std::is_nothrow_move_assignable_v<rt::PageTableBuffers>,
    "PageTableBuffers moves and dies without throwing");

static_assert(!std::is_copy_constructible_v<rt::PageTableBuffers> && !std::is_copy_assignable_v<rt::PageTableBuffers>,
    "PageTableBuffers is move-only");

TEST(PageTableSizesTest, NonPositiveSizesAndOversizedTablesAreRefusedBeforeAnyCudaCall)
{
    struct Case
    {
        Sizes sizes;
        std::vector<std::string> named;
    };
    std::vector<Case> const cases = {
        {{0, 4, 16}, {"maxBatchSize is 0", "> 0"}},
        {{-3, 4, 16}, {"maxBatchSize is -3", "> 0"}},
        {{4, 0, 16}, {"maxPagesPerSequence is 0", "> 0"}},
        {{4, 4, 0}, {"tokensPerPage is 0", "> 0"}},
        {{4, 4, -16}, {"tokensPerPage is -16", "> 0"}},
        {{1 << 16, 1 << 15, 16}, {"maxBatchSize * maxPagesPerSequence is 2147483648", "65536 x 32768", "2147483647"}},
        {{kINT32_MAX, 2, 16}, {"is 4294967294", "2147483647"}},
    };
    for (Case const& c : cases)
    {
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] {
                rt::PageTableBuffers tables(
                    c.sizes.maxBatchSize, c.sizes.maxPagesPerSequence, c.sizes.tokensPerPage, nullptr);
            },
            c.named))
            << c.named.front();
    }
    // INT32_MAX entries are within the limit, and the region's offsets do not overflow.
    rt::detail::PageTableShape const largest = rt::detail::makePageTableShape(1, kINT32_MAX, 1);
    EXPECT_EQ(largest.entries(), kINT32_MAX);
    EXPECT_GE(largest.elements(), 2 * largest.entries());
}

TEST(PageTableSizesTest, ArraysStartOn128BytesAndDoNotOverlap)
{
    for (Sizes const sizes : {Sizes{1, 1, 1}, Sizes{7, 33, 5}, Sizes{256, 64, 16}, Sizes{31, 1, 128}})
    {
        rt::detail::PageTableShape const shape =
            rt::detail::makePageTableShape(sizes.maxBatchSize, sizes.maxPagesPerSequence, sizes.tokensPerPage);
        int64_t const rows = sizes.maxBatchSize;
        int64_t const entries = rows * sizes.maxPagesPerSequence;
        // Each array from its start to its end, in the region's order.
        std::vector<std::pair<int64_t, int64_t>> const arrays = {{shape.indptrOffset(), rows + 1},
            {shape.lastPageLenOffset(), rows}, {shape.firstTokenOffset(), rows}, {shape.residentTokensOffset(), rows},
            {shape.blockTableOffset(), entries}, {shape.indicesOffset(), entries}};
        int64_t end = 0;
        for (auto const& [offset, length] : arrays)
        {
            EXPECT_EQ(offset * 4 % 128, 0) << "an array at element " << offset;
            EXPECT_GE(offset, end) << "arrays overlap";
            end = offset + length;
        }
        EXPECT_GE(shape.elements(), end);
    }
}

TEST(PageTableBuffersTest, AnEmptyObjectOwnsNothingAndRefusesToBuild)
{
    rt::PageTableBuffers empty;
    EXPECT_EQ(empty.deviceIndptr(), nullptr);
    EXPECT_EQ(empty.deviceBlockTable(), nullptr);
    EXPECT_EQ(empty.hostIndices(), nullptr);
    EXPECT_EQ(empty.maxBatchSize(), 0);
    EXPECT_EQ(empty.count(), 0);
    EXPECT_EQ(empty.uploadBytes(), 0);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { empty.build(nullptr, 0, nullptr); }, {"build: this object owns no buffers"}));
    rt::PageTableBuffers moved(std::move(empty));
    EXPECT_EQ(moved.hostIndptr(), nullptr);
}

} // namespace
