#include "memory/page_ops/page_op_plan.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace kvcache::rt::detail
{
namespace
{

//! Lists whose wide grid has at most this many blocks run in narrow blocks.
constexpr int64_t kMAX_WIDE_BLOCKS_FOR_NARROW = 4096;
//! Copies that write more than this read their sources at L2 priority evict_last.
constexpr int64_t kMIN_BYTES_TO_KEEP_SOURCES = int64_t{32} << 20;

} // namespace

PageOpPlan planPageOp(
    char const* what, KVCacheManager const& cache, PageOpTarget const& target, uint32_t pattern, int32_t* errorCount)
{
    int32_t const groupCount = cache.numGroups();
    if (target.group < -1 || target.group >= std::max(groupCount, 1))
    {
        throw InvalidArgumentError(fmt::format("{}: PageOpTarget.group is {}; it must be -1 (the only group) or in "
                                               "[0, {})",
            what, target.group, groupCount));
    }
    if (target.group == -1 && groupCount > 1)
    {
        throw InvalidArgumentError(fmt::format("{}: PageOpTarget.group is -1 but the cache has {} page groups; a page "
                                               "id means nothing across groups, so name one in [0, {})",
            what, groupCount, groupCount));
    }
    int32_t const groupIndex = std::max(target.group, 0);
    std::vector<int32_t> const noLayers;
    std::vector<int32_t> const& groupLayers = groupCount == 0 ? noLayers : cache.group(groupIndex).layers;
    auto const layerCount = static_cast<int32_t>(groupLayers.size());
    if (target.firstLayer < 0 || (target.firstLayer >= layerCount && layerCount > 0)
        || (layerCount == 0 && target.firstLayer != 0))
    {
        throw InvalidArgumentError(fmt::format("{}: PageOpTarget.firstLayer is {}; it must be in [0, {}) (layers of "
                                               "page group {})",
            what, target.firstLayer, layerCount, groupIndex));
    }
    int32_t const available = layerCount - target.firstLayer;
    if (target.numLayers < -1 || target.numLayers > available)
    {
        throw InvalidArgumentError(fmt::format("{}: PageOpTarget.numLayers is {}; it must be -1 (all) or in [0, {}] "
                                               "for firstLayer {} of {} layers",
            what, target.numLayers, available, target.firstLayer, layerCount));
    }
    if (target.half != KVHalf::kBOTH && target.half != KVHalf::kK && target.half != KVHalf::kV)
    {
        throw InvalidArgumentError(fmt::format(
            "{}: PageOpTarget.half is {}; it must be kBOTH, kK or kV", what, static_cast<int32_t>(target.half)));
    }
    int32_t const numLayers = target.numLayers == -1 ? available : target.numLayers;
    int32_t const halfBits = target.half == KVHalf::kBOTH ? 1 : 0;

    int64_t maxPageBytes = 0;
    int64_t maxScalePageBytes = 0;
    int64_t bytesPerEntry = 0;
    bool samePageBytes = true;
    for (int32_t i = target.firstLayer; i < target.firstLayer + numLayers; ++i)
    {
        KVLayerLayout const& layer = cache.layout().layers[static_cast<size_t>(groupLayers[static_cast<size_t>(i)])];
        int32_t const halves = target.half == KVHalf::kBOTH ? layer.numHalves
            : target.half == KVHalf::kK                     ? 1
                                                            : layer.numHalves - 1;
        bytesPerEntry += (layer.pageBytes + layer.scalePageBytes) * halves;
        // A latent layer's missing V half leaves idle blocks too.
        samePageBytes =
            samePageBytes && (maxPageBytes == 0 || layer.pageBytes == maxPageBytes) && halves == (1 << halfBits);
        maxPageBytes = std::max(maxPageBytes, layer.pageBytes);
        maxScalePageBytes = std::max(maxScalePageBytes, layer.scalePageBytes);
    }
    int64_t const gridZ = int64_t{numLayers} << halfBits;
    if (gridZ > kMAX_GRID_YZ)
    {
        throw InvalidArgumentError(
            fmt::format("{}: {} layer halves exceed one launch's grid ({})", what, gridZ, kMAX_GRID_YZ));
    }
    checkCacheDevice(what, cache);
    int32_t const numPages = groupCount == 0 ? cache.numPages() : cache.group(groupIndex).numPages;
    return PageOpPlan{KVCacheManagerInternal::layerTable(cache, groupIndex), target.firstLayer, halfBits,
        target.half == KVHalf::kV ? 1 : 0, numPages, pattern, errorCount, maxPageBytes, bytesPerEntry,
        static_cast<uint32_t>(gridZ), samePageBytes, KVCacheManagerInternal::scaleTable(cache, groupIndex),
        maxScalePageBytes};
}

void checkCacheDevice(char const* what, KVCacheManager const& cache)
{
    int device = 0;
    KVCACHE_CUDA_TRY(cudaGetDevice(&device));
    if (device != cache.device())
    {
        throw InvalidArgumentError(
            fmt::format("{}: the current device is {} but the cache lives on device {}", what, device, cache.device()));
    }
}

bool wideBlocksPay(int64_t wideBlocks)
{
    return wideBlocks > kMAX_WIDE_BLOCKS_FOR_NARROW;
}

bool keepsSourcesInL2(int64_t bytesPerEntry, int64_t entries)
{
    return bytesPerEntry > 0 && entries > kMIN_BYTES_TO_KEEP_SOURCES / bytesPerEntry;
}

bool usesWideBlocks(PageOpPlan const& plan, int32_t listSize)
{
    int64_t const wideBlocks =
        int64_t{listSize} * chunksPerPage(plan.maxPageBytes, WideShape::kCHUNK_BYTES) * plan.gridZ;
    return plan.samePageBytes && wideBlocksPay(wideBlocks);
}

bool keepsSourcesInL2(PageOpPlan const& plan, int32_t listSize)
{
    return keepsSourcesInL2(plan.bytesPerEntry, listSize);
}

} // namespace kvcache::rt::detail
