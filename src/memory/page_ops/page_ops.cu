// The public page operations: validate, plan, then launch the page kernels over host or device lists.

#include "kvcache/memory/page_ops.h"

#include "memory/page_ops/page_kernels.cuh"
#include "memory/page_ops/page_list_validation.h"
#include "memory/page_ops/page_op_plan.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace kvcache::rt
{
namespace detail
{
namespace
{

// Short host lists travel in a small parameter block: a launch copies its whole parameter block.
constexpr int32_t kSMALL_INLINE_LIST = 32;

PageOpParams kernelParams(PageOpPlan const& plan, int32_t listSize, int32_t dataChunks)
{
    return PageOpParams{plan.table, plan.scaleTable, dataChunks, plan.firstLayer, plan.halfBits, plan.firstHalf,
        plan.numPages, keepsSourcesInL2(plan, listSize), plan.pattern, plan.errorCount};
}

//! Returns the part of a host list a launch covers: all of it (host lists are split before they are carried).
template <typename Item, int32_t N>
InlineList<Item, N> const& partOf(InlineList<Item, N> const& list, int64_t /*first*/, int32_t /*positions*/)
{
    return list;
}

//! Returns positions [first, first + positions) of a device list.
template <typename Item>
DeviceList<Item> partOf(DeviceList<Item> const& list, int64_t first, int32_t positions)
{
    return DeviceList<Item>{list.items + first, list.count, static_cast<int32_t>(list.first + first), positions};
}

//! Launches over `listSize` entries of `list` (the capacity, for device lists): one launch per kMAX_GRID_YZ entries.
template <typename Shape, typename Op, typename List>
void launchShaped(PageOpPlan const& plan, List const& list, int32_t listSize, cudaStream_t stream)
{
    auto const dataChunks = static_cast<int32_t>(chunksPerPage(plan.maxPageBytes, Shape::kCHUNK_BYTES));
    int64_t const scaleChunks =
        plan.scaleTable == nullptr ? 0 : chunksPerPage(plan.maxScalePageBytes, Shape::kCHUNK_BYTES);
    PageOpParams const params = kernelParams(plan, listSize, dataChunks);
    auto const chunks = static_cast<uint32_t>(dataChunks + scaleChunks);
    for (int64_t first = 0; first < listSize; first += kMAX_GRID_YZ)
    {
        auto const positions = static_cast<int32_t>(std::min(kMAX_GRID_YZ, listSize - first));
        dim3 const grid(chunks, static_cast<uint32_t>(positions), plan.gridZ);
        pageOpKernel<Shape, Op, List><<<grid, Shape::kTHREADS, 0, stream>>>(params, partOf(list, first, positions));
        KVCACHE_CUDA_TRY(cudaGetLastError());
    }
}

//! One pass over the plan's table entries.
template <typename Op, typename List>
void launchPass(PageOpPlan const& plan, List const& list, int32_t listSize, cudaStream_t stream)
{
    if (usesWideBlocks(plan, listSize))
    {
        launchShaped<WideShape, Op>(plan, list, listSize, stream);
    }
    else
    {
        launchShaped<NarrowShape, Op>(plan, list, listSize, stream);
    }
}

//! One grid over the data pages and, for a cache with scale pools, their scale pages (docs/layout.md, "How every page
//! operation carries scales").
template <typename Op, typename List>
void launch(PageOpPlan const& plan, List const& list, int32_t listSize, cudaStream_t stream)
{
    if (listSize == 0 || plan.gridZ == 0)
    {
        return;
    }
    launchPass<Op>(plan, list, listSize, stream);
}

//! Launches a validated host list as kernel parameters, kMAX_INLINE_PAGE_OPS entries a launch.
template <typename Op, typename Item>
void launchHostList(PageOpPlan const& plan, Item const* items, int32_t count, cudaStream_t stream)
{
    for (int32_t first = 0; first < count; first += kMAX_INLINE_PAGE_OPS)
    {
        int32_t const part = std::min(kMAX_INLINE_PAGE_OPS, count - first);
        if (part <= kSMALL_INLINE_LIST)
        {
            launch<Op>(plan, makeInlineList<kSMALL_INLINE_LIST>(items + first, part), part, stream);
        }
        else
        {
            launch<Op>(plan, makeInlineList<kMAX_INLINE_PAGE_OPS>(items + first, part), part, stream);
        }
    }
}

} // namespace
} // namespace detail

void copyPages(
    KVCacheManager const& cache, PageCopy const* pairs, int32_t count, cudaStream_t stream, PageOpTarget const& target)
{
    constexpr char const* kWHAT = "copyPages";
    detail::PageOpPlan const plan = detail::planPageOp(kWHAT, cache, target, 0, nullptr);
    detail::validateCopyList(kWHAT, pairs, count, plan.numPages);
    detail::launchHostList<detail::CopyOp>(plan, pairs, count, stream);
}

void copyPages(
    KVCacheManager const& cache, std::vector<PageCopy> const& pairs, cudaStream_t stream, PageOpTarget const& target)
{
    copyPages(cache, pairs.data(), detail::listCount("copyPages", pairs), stream, target);
}

void copyPagesDevice(KVCacheManager const& cache, PageCopy const* devicePairs, int32_t capacity,
    int32_t const* deviceCount, cudaStream_t stream, PageOpTarget const& target, int32_t* deviceErrorCount)
{
    constexpr char const* kWHAT = "copyPagesDevice";
    detail::validateDeviceListArguments(kWHAT, devicePairs, capacity);
    detail::PageOpPlan const plan = detail::planPageOp(kWHAT, cache, target, 0, deviceErrorCount);
    detail::launch<detail::CopyOp>(
        plan, detail::DeviceList<PageCopy>{devicePairs, deviceCount, 0, capacity}, capacity, stream);
}

void resetPages(KVCacheManager const& cache, int32_t const* pages, int32_t count, cudaStream_t stream, uint32_t pattern,
    PageOpTarget const& target)
{
    constexpr char const* kWHAT = "resetPages";
    detail::PageOpPlan const plan = detail::planPageOp(kWHAT, cache, target, pattern, nullptr);
    detail::validateResetList(kWHAT, pages, count, plan.numPages);
    detail::launchHostList<detail::ResetOp>(plan, pages, count, stream);
}

void resetPages(KVCacheManager const& cache, std::vector<int32_t> const& pages, cudaStream_t stream, uint32_t pattern,
    PageOpTarget const& target)
{
    resetPages(cache, pages.data(), detail::listCount("resetPages", pages), stream, pattern, target);
}

void resetPagesDevice(KVCacheManager const& cache, int32_t const* devicePages, int32_t capacity,
    int32_t const* deviceCount, cudaStream_t stream, uint32_t pattern, PageOpTarget const& target,
    int32_t* deviceErrorCount)
{
    constexpr char const* kWHAT = "resetPagesDevice";
    detail::validateDeviceListArguments(kWHAT, devicePages, capacity);
    detail::PageOpPlan const plan = detail::planPageOp(kWHAT, cache, target, pattern, deviceErrorCount);
    detail::launch<detail::ResetOp>(
        plan, detail::DeviceList<int32_t>{devicePages, deviceCount, 0, capacity}, capacity, stream);
}

} // namespace kvcache::rt
