#include "kvcache/memory/kv_cache_manager.h"

#include "memory/cache/attention_arguments.h"
#include "memory/cache/layer_table.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

namespace kvcache::rt
{
namespace
{

double toGiB(int64_t bytes)
{
    return static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30);
}

//! Throws InvalidArgumentError naming `what` and `name` when `value` is not a valid host scale of `quantization`
//! (detail::isValidHostScale).
void checkHostScale(char const* what, char const* name, int32_t layerIdx, float value, KVQuantization quantization)
{
    if (!detail::isValidHostScale(quantization, value))
    {
        throw InvalidArgumentError(fmt::format("{}: LayerScales.{} of layer {} is {}; quantization {} needs a finite "
                                               "scale {}",
            what, name, layerIdx, value, kvQuantizationName(quantization), detail::hostScaleLimit(quantization)));
    }
}

} // namespace

KVCacheManager::KVCacheManager(Config const& config, cudaStream_t stream)
    : mConfig(config)
    , mLayout(computeLayout(config))
    , mStream(stream)
{
    int device = 0;
    KVCACHE_CUDA_TRY(cudaGetDevice(&device));
    mDevice = device;
    auto const layerCount = static_cast<int32_t>(mLayout.layers.size());
    // Members are owners: a throw below frees what was allocated so far (stream-ordered) as they unwind.
    mBuffers.reserve(static_cast<size_t>(layerCount));
    mScaleBuffers.reserve(static_cast<size_t>(layerCount));
    for (int32_t i = 0; i < layerCount; ++i)
    {
        KVLayerLayout const& layer = mLayout.layers[static_cast<size_t>(i)];
        char const* part = "layer";
        int64_t bytes = layer.layerBytes;
        try
        {
            mBuffers.emplace_back(bytes, stream, config.memPool);
            // Scales get an allocation of their own, 256-byte aligned like the data (docs/layout.md, "Where the scale
            // pools live"); a layer without page scales keeps an empty owner so indices stay the layer's.
            part = "scale pool of layer";
            bytes = layer.scaleBytes;
            mScaleBuffers.push_back(bytes > 0 ? DeviceAllocation(bytes, stream, config.memPool) : DeviceAllocation{});
        }
        catch (OutOfMemoryError const& error)
        {
            throw OutOfMemoryError(fmt::format("KVCacheManager: cannot allocate the {} {} of {}: it needs {} bytes "
                                               "({:.3f} GiB); the whole config needs {} bytes ({:.3f} GiB); {}",
                part, i, layerCount, bytes, toGiB(bytes), mLayout.cacheBytes, toGiB(mLayout.cacheBytes), error.what()));
        }
    }
    auto const stateLayerCount = static_cast<int32_t>(mLayout.stateLayers.size());
    mStateBuffers.reserve(static_cast<size_t>(stateLayerCount));
    for (int32_t i = 0; i < stateLayerCount; ++i)
    {
        int64_t const bytes = mLayout.stateLayers[static_cast<size_t>(i)].layerBytes;
        try
        {
            mStateBuffers.emplace_back(bytes, stream, config.memPool);
        }
        catch (OutOfMemoryError const& error)
        {
            int64_t const total = mLayout.cacheBytes + mLayout.stateBytes;
            throw OutOfMemoryError(
                fmt::format("KVCacheManager: cannot allocate state layer {} of {}: it needs {} bytes "
                            "({:.3f} GiB); the whole config needs {} bytes ({:.3f} GiB); {}",
                    i, stateLayerCount, bytes, toGiB(bytes), total, toGiB(total), error.what()));
        }
    }
    mLayerTable = detail::makeLayerTable(mBuffers, mScaleBuffers, mLayout, stream, config.memPool);
    if (detail::keepsHostScales(mLayout.quantization))
    {
        mLayerScales.assign(static_cast<size_t>(layerCount), LayerScales{});
    }

    auto const batch = int64_t{mLayout.maxBatchSize};
    auto const tokensPerPage = int64_t{mLayout.tokensPerPage};
    mSlotViews.reserve(static_cast<size_t>(layerCount));
    mPoolViews.reserve(static_cast<size_t>(layerCount));
    for (int32_t i = 0; i < layerCount; ++i)
    {
        KVLayerLayout const& layer = mLayout.layers[static_cast<size_t>(i)];
        void* base = mBuffers[static_cast<size_t>(i)].data();
        mSlotViews.emplace_back(base,
            Coords{layer.numHalves, batch, layer.slotTokens, layer.numKVHeads, layer.storedDim}, mLayout.dataType,
            DeviceType::kGPU);
        mPoolViews.emplace_back(base,
            Coords{layer.numHalves, layer.numPages, tokensPerPage, layer.numKVHeads, layer.storedDim}, mLayout.dataType,
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
    Coords const shape{mLayout.maxBatchSize, layer.slotTokens, layer.numKVHeads, layer.storedDim};
    Tensor k(kPoolPtr(layerIdx), shape, mLayout.dataType, DeviceType::kGPU);
    if (layer.numHalves == 1)
    {
        // No V: an empty view (null, no elements) of the same rank, so volume() and sizeBytes() read 0.
        return {k,
            Tensor(nullptr, Coords{0, layer.slotTokens, layer.numKVHeads, layer.storedDim}, mLayout.dataType,
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
    ref.tokenStride = int64_t{layer.numKVHeads} * layer.storedDim;
    ref.headStride = layer.storedDim;
    ref.elementBytes = static_cast<int32_t>(mLayout.elementBytes);
    ref.numPages = layer.numPages;
    ref.tokensPerPage = mLayout.tokensPerPage;
    ref.numKVHeads = layer.numKVHeads;
    ref.headDim = layer.headDim;
    if (layer.scaleBytes > 0)
    {
        auto* const scales = static_cast<char*>(mScaleBuffers[static_cast<size_t>(layerIdx)].data());
        ref.kScalePool = scales;
        ref.vScalePool = layer.numHalves == 2 ? scales + layer.numPages * layer.scalePageBytes : nullptr;
        bool const tokenHead = mLayout.quantization == KVQuantization::kFP8_PER_TOKEN_HEAD;
        ref.scaleElementBytes = tokenHead ? 4 : 1;
        ref.scalesPerHead = static_cast<int32_t>(
            layer.scalePageBytes / (int64_t{mLayout.tokensPerPage} * layer.numKVHeads * ref.scaleElementBytes));
    }
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

Tensor KVCacheManager::stateView(int32_t stateLayerIdx, int32_t tensorIdx) const
{
    if (stateLayerIdx < 0 || stateLayerIdx >= numStateLayers())
    {
        throw OutOfRangeError(fmt::format("KVCacheManager::stateView: state layer index {} is out of range [0, {})",
            stateLayerIdx, numStateLayers()));
    }
    StateLayerLayout const& layer = mLayout.stateLayers[static_cast<size_t>(stateLayerIdx)];
    auto const numTensors = static_cast<int32_t>(layer.tensors.size());
    if (tensorIdx < 0 || tensorIdx >= numTensors)
    {
        throw OutOfRangeError(
            fmt::format("KVCacheManager::stateView: tensor index {} of state layer {} is out of range [0, {})",
                tensorIdx, stateLayerIdx, numTensors));
    }
    StateTensorLayout const& tensor = layer.tensors[static_cast<size_t>(tensorIdx)];
    // Coords takes its rank from an initializer list: start from a list of the right length, then set the extents.
    std::array<Coords, kMAX_STATE_DIMS> const ranks = {Coords{0, 0}, Coords{0, 0, 0}, Coords{0, 0, 0, 0},
        Coords{0, 0, 0, 0, 0}, Coords{0, 0, 0, 0, 0, 0}, Coords{0, 0, 0, 0, 0, 0, 0}, Coords{0, 0, 0, 0, 0, 0, 0, 0}};
    Coords shape = ranks[tensor.shape.size() - 1];
    shape[0] = mLayout.numStateSlots;
    for (size_t d = 0; d < tensor.shape.size(); ++d)
    {
        shape[static_cast<int32_t>(d) + 1] = tensor.shape[d];
    }
    return Tensor(
        static_cast<char*>(statePtr(stateLayerIdx)) + tensor.offsetBytes, shape, tensor.dataType, DeviceType::kGPU);
}

Tensor KVCacheManager::stateView(int32_t stateLayerIdx, std::string_view name) const
{
    if (stateLayerIdx < 0 || stateLayerIdx >= numStateLayers())
    {
        throw OutOfRangeError(fmt::format("KVCacheManager::stateView: state layer index {} is out of range [0, {})",
            stateLayerIdx, numStateLayers()));
    }
    std::vector<StateTensorLayout> const& tensors = mLayout.stateLayers[static_cast<size_t>(stateLayerIdx)].tensors;
    std::string names;
    for (size_t t = 0; t < tensors.size(); ++t)
    {
        if (tensors[t].name == name)
        {
            return stateView(stateLayerIdx, static_cast<int32_t>(t));
        }
        names += fmt::format("{}\"{}\"", names.empty() ? "" : ", ", tensors[t].name);
    }
    throw InvalidArgumentError(fmt::format(
        "KVCacheManager::stateView: state layer {} has no tensor \"{}\"; its tensors: {}", stateLayerIdx, name, names));
}

void* KVCacheManager::statePtr(int32_t stateLayerIdx) const noexcept
{
    if (stateLayerIdx < 0 || stateLayerIdx >= numStateLayers())
    {
        detail::failIndex("KVCacheManager::statePtr", "state layer", stateLayerIdx, numStateLayers());
    }
    return mStateBuffers[static_cast<size_t>(stateLayerIdx)].data();
}

int64_t KVCacheManager::allocatedBytes() const noexcept
{
    int64_t bytes = mLayerTable.size();
    for (DeviceAllocation const& buffer : mStateBuffers)
    {
        bytes += buffer.size();
    }
    for (DeviceAllocation const& buffer : mBuffers)
    {
        bytes += buffer.size();
    }
    for (DeviceAllocation const& buffer : mScaleBuffers)
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
    return Tensor(kPoolPtr(layerIdx), Coords{layer.numPages, mLayout.tokensPerPage, layer.storedDim}, mLayout.dataType,
        DeviceType::kGPU);
}

void KVCacheManager::checkScaledIndex(int32_t layerIdx, char const* what, bool pageScales) const
{
    if (layerIdx < 0 || layerIdx >= numLayers())
    {
        throw OutOfRangeError(fmt::format("{}: layer index {} is out of range [0, {})", what, layerIdx, numLayers()));
    }
    bool const kept =
        pageScales ? detail::keepsScalePools(mLayout.quantization) : detail::keepsHostScales(mLayout.quantization);
    if (!kept)
    {
        throw InvalidArgumentError(
            fmt::format("{}: KVCacheConfig.quantization is {}, which keeps no {}; they exist for "
                        "{}",
                what, kvQuantizationName(mLayout.quantization), pageScales ? "scale pools" : "host-held layer scales",
                pageScales ? "fp8_per_token_head and nvfp4" : "fp8_per_tensor and nvfp4"));
    }
}

Tensor KVCacheManager::scalePoolView(int32_t layerIdx) const
{
    checkScaledIndex(layerIdx, "KVCacheManager::scalePoolView", true);
    return detail::scalePoolTensor(mLayout, layerIdx, mScaleBuffers[static_cast<size_t>(layerIdx)].data());
}

AttentionArguments KVCacheManager::attentionArguments(int32_t layerIdx) const
{
    if (layerIdx < 0 || layerIdx >= numLayers())
    {
        throw OutOfRangeError(fmt::format(
            "KVCacheManager::attentionArguments: layer index {} is out of range [0, {})", layerIdx, numLayers()));
    }
    auto const at = static_cast<size_t>(layerIdx);
    return detail::attentionArgumentsOf(mLayout, layerIdx,
        detail::keepsHostScales(mLayout.quantization) ? mLayerScales[at] : LayerScales{}, mScaleBuffers[at].data());
}

LayerScales KVCacheManager::layerScales(int32_t layerIdx) const
{
    checkScaledIndex(layerIdx, "KVCacheManager::layerScales", false);
    return mLayerScales[static_cast<size_t>(layerIdx)];
}

void KVCacheManager::setLayerScales(int32_t layerIdx, LayerScales scales)
{
    constexpr char const* kWHAT = "KVCacheManager::setLayerScales";
    checkScaledIndex(layerIdx, kWHAT, false);
    checkHostScale(kWHAT, "k", layerIdx, scales.k, mLayout.quantization);
    // A latent layer has no V: its v is unused, so not checked (sequence files record it as 0, and restoring a file's
    // scales must be possible).
    if (mLayout.layers[static_cast<size_t>(layerIdx)].kind != KVLayerKind::kLATENT)
    {
        checkHostScale(kWHAT, "v", layerIdx, scales.v, mLayout.quantization);
    }
    mLayerScales[static_cast<size_t>(layerIdx)] = scales;
}

} // namespace kvcache::rt
