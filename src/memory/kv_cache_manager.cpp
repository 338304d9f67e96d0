#include "kvcache/memory/kv_cache_manager.h"

#include "memory/layer_table.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvcache::rt
{
namespace
{

double toGiB(int64_t bytes)
{
    return static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30);
}

//! Returns the layout of `config`, or throws InvalidArgumentError for a quantization whose scales the cache cannot
//! keep yet: its page operations (copy, reset, host tier, sequence files, transfer) would move data without scales
//! and corrupt every page they touch, silently. Runs before anything is allocated.
KVCacheLayout constructibleLayout(KVCacheConfig const& config)
{
    KVCacheLayout layout = computeLayout(config);
    if (layout.quantization != KVQuantization::kNONE)
    {
        throw InvalidArgumentError(fmt::format("KVCacheManager: KVCacheConfig.quantization is {}, which is not "
                                               "implemented yet: the cache keeps no scales and its page operations "
                                               "would drop them; supported: none (computeLayout and the budget maths "
                                               "accept every quantization)",
            kvQuantizationName(layout.quantization)));
    }
    return layout;
}

} // namespace

KVCacheManager::KVCacheManager(Config const& config, cudaStream_t stream)
    : mConfig(config)
    , mLayout(constructibleLayout(config))
    , mStream(stream)
{
    int device = 0;
    KVCACHE_CUDA_TRY(cudaGetDevice(&device));
    mDevice = device;
    auto const layerCount = static_cast<int32_t>(mLayout.layers.size());
    // Members are owners: a throw below frees what was allocated so far (stream-ordered) as they unwind.
    mBuffers.reserve(static_cast<size_t>(layerCount));
    for (int32_t i = 0; i < layerCount; ++i)
    {
        int64_t const bytes = mLayout.layers[static_cast<size_t>(i)].layerBytes;
        try
        {
            mBuffers.emplace_back(bytes, stream, config.memPool);
        }
        catch (OutOfMemoryError const& error)
        {
            throw OutOfMemoryError(fmt::format("KVCacheManager: cannot allocate layer {} of {}: it needs {} bytes "
                                               "({:.3f} GiB); the whole config needs {} bytes ({:.3f} GiB); {}",
                i, layerCount, bytes, toGiB(bytes), mLayout.cacheBytes, toGiB(mLayout.cacheBytes), error.what()));
        }
    }
    mLayerTable = detail::makeLayerTable(mBuffers, mLayout, stream, config.memPool);

    auto const batch = int64_t{mLayout.maxBatchSize};
    auto const tokensPerPage = int64_t{mLayout.tokensPerPage};
    mSlotViews.reserve(static_cast<size_t>(layerCount));
    mPoolViews.reserve(static_cast<size_t>(layerCount));
    for (int32_t i = 0; i < layerCount; ++i)
    {
        KVLayerLayout const& layer = mLayout.layers[static_cast<size_t>(i)];
        void* base = mBuffers[static_cast<size_t>(i)].data();
        mSlotViews.emplace_back(base, Coords{layer.numHalves, batch, layer.slotTokens, layer.numKVHeads, layer.headDim},
            mLayout.dataType, DeviceType::kGPU);
        mPoolViews.emplace_back(base,
            Coords{layer.numHalves, layer.numPages, tokensPerPage, layer.numKVHeads, layer.headDim}, mLayout.dataType,
            DeviceType::kGPU);
    }
}

void KVCacheManager::checkIndex(int32_t layerIdx, char const* what) const noexcept
{
    if (layerIdx < 0 || layerIdx >= numLayers())
    {
        detail::failIndex(what, "layer", layerIdx, numLayers());
    }
}

Tensor& KVCacheManager::getCombinedKVCache(int32_t layerIdx)
{
    if (layerIdx < 0 || layerIdx >= numLayers())
    {
        throw OutOfRangeError(fmt::format(
            "KVCacheManager::getCombinedKVCache: layer index {} is out of range [0, {})", layerIdx, numLayers()));
    }
    KVLayerLayout const& layer = mLayout.layers[static_cast<size_t>(layerIdx)];
    KVPageGroupLayout const& group = mLayout.groups[static_cast<size_t>(layer.group)];
    if (group.numPages != group.minPages)
    {
        throw InvalidConfigError(fmt::format(
            "KVCacheManager::getCombinedKVCache: layer {} is in page group {}, whose numPages is {}, but the slot view "
            "[2, maxBatchSize, slotTokens, H, D] is only valid at the group's minimum {} pages (its V half would start "
            "inside the K pool); use getCombinedKVCachePoolView, getSeparateKVCache or kPoolPtr/vPoolPtr, which are "
            "valid for any numPages",
            layerIdx, layer.group, group.numPages, group.minPages));
    }
    return mSlotViews[static_cast<size_t>(layerIdx)];
}

Tensor& KVCacheManager::getCombinedKVCachePoolView(int32_t layerIdx) noexcept
{
    checkIndex(layerIdx, "KVCacheManager::getCombinedKVCachePoolView");
    return mPoolViews[static_cast<size_t>(layerIdx)];
}

std::pair<Tensor, Tensor> KVCacheManager::getSeparateKVCache(int32_t layerIdx) const noexcept
{
    checkIndex(layerIdx, "KVCacheManager::getSeparateKVCache");
    KVLayerLayout const& layer = mLayout.layers[static_cast<size_t>(layerIdx)];
    Coords const shape{mLayout.maxBatchSize, layer.slotTokens, layer.numKVHeads, layer.headDim};
    Tensor k(kPoolPtr(layerIdx), shape, mLayout.dataType, DeviceType::kGPU);
    if (layer.numHalves == 1)
    {
        // No V: an empty view (null, no elements) of the same rank, so volume() and sizeBytes() read 0.
        return {k,
            Tensor(nullptr, Coords{0, layer.slotTokens, layer.numKVHeads, layer.headDim}, mLayout.dataType,
                DeviceType::kGPU)};
    }
    return {k, Tensor(vPoolPtr(layerIdx), shape, mLayout.dataType, DeviceType::kGPU)};
}

void* KVCacheManager::kPoolPtr(int32_t layerIdx) const noexcept
{
    checkIndex(layerIdx, "KVCacheManager::kPoolPtr");
    return mBuffers[static_cast<size_t>(layerIdx)].data();
}

void* KVCacheManager::vPoolPtr(int32_t layerIdx) const noexcept
{
    checkIndex(layerIdx, "KVCacheManager::vPoolPtr");
    KVLayerLayout const& layer = mLayout.layers[static_cast<size_t>(layerIdx)];
    if (layer.numHalves == 1)
    {
        return nullptr;
    }
    return static_cast<char*>(mBuffers[static_cast<size_t>(layerIdx)].data()) + layer.halfElems * mLayout.elementBytes;
}

LayerRef KVCacheManager::layerRef(int32_t layerIdx) const noexcept
{
    checkIndex(layerIdx, "KVCacheManager::layerRef");
    KVLayerLayout const& layer = mLayout.layers[static_cast<size_t>(layerIdx)];
    LayerRef ref;
    ref.kPool = kPoolPtr(layerIdx);
    ref.vPool = vPoolPtr(layerIdx);
    ref.pageStride = layer.pageElems;
    ref.tokenStride = int64_t{layer.numKVHeads} * layer.headDim;
    ref.headStride = layer.headDim;
    ref.elementBytes = static_cast<int32_t>(mLayout.elementBytes);
    ref.numPages = layer.numPages;
    ref.tokensPerPage = mLayout.tokensPerPage;
    ref.numKVHeads = layer.numKVHeads;
    ref.headDim = layer.headDim;
    return ref;
}

KVCacheManager::KVLayerConfig const& KVCacheManager::getLayerConfig(int32_t layerIdx) const noexcept
{
    checkIndex(layerIdx, "KVCacheManager::getLayerConfig");
    return mConfig.layerConfigs[static_cast<size_t>(layerIdx)];
}

KVPageGroupLayout const& KVCacheManager::group(int32_t groupIdx) const noexcept
{
    if (groupIdx < 0 || groupIdx >= numGroups())
    {
        detail::failIndex("KVCacheManager::group", "page group", groupIdx, numGroups());
    }
    return mLayout.groups[static_cast<size_t>(groupIdx)];
}

int32_t KVCacheManager::groupOf(int32_t layerIdx) const noexcept
{
    checkIndex(layerIdx, "KVCacheManager::groupOf");
    return mLayout.layers[static_cast<size_t>(layerIdx)].group;
}

bool KVCacheManager::isUniform() const noexcept
{
    auto const& layers = mLayout.layers;
    return std::all_of(layers.begin(), layers.end(),
        [&](KVLayerLayout const& layer)
        { return layer.numKVHeads == layers.front().numKVHeads && layer.headDim == layers.front().headDim; });
}

int64_t KVCacheManager::allocatedBytes() const noexcept
{
    int64_t bytes = mLayerTable.size();
    for (DeviceAllocation const& buffer : mBuffers)
    {
        bytes += buffer.size();
    }
    return bytes;
}

Tensor KVCacheManager::latentPoolView(int32_t layerIdx) const
{
    if (layerIdx < 0 || layerIdx >= numLayers())
    {
        throw OutOfRangeError(fmt::format(
            "KVCacheManager::latentPoolView: layer index {} is out of range [0, {})", layerIdx, numLayers()));
    }
    KVLayerLayout const& layer = mLayout.layers[static_cast<size_t>(layerIdx)];
    if (layer.kind != KVLayerKind::kLATENT)
    {
        throw InvalidArgumentError(fmt::format("KVCacheManager::latentPoolView: layer {} is a KV layer ({} x {}); the "
                                               "view needs a latent layer (use getCombinedKVCachePoolView)",
            layerIdx, layer.numKVHeads, layer.headDim));
    }
    return Tensor(kPoolPtr(layerIdx), Coords{layer.numPages, mLayout.tokensPerPage, layer.headDim}, mLayout.dataType,
        DeviceType::kGPU);
}

} // namespace kvcache::rt
