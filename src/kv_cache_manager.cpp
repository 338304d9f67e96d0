#include "kvcache/kv_cache_manager.h"

#include "layer_table_upload.h"

#include "kvcache/errors.h"

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

cudaError_t allocate(void** ptr, int64_t bytes, cudaMemPool_t pool, cudaStream_t stream)
{
    auto const size = static_cast<size_t>(bytes);
    return pool != nullptr ? cudaMallocFromPoolAsync(ptr, size, pool, stream) : cudaMallocAsync(ptr, size, stream);
}

//! Makes `device` current for its lifetime and restores the previous device afterwards; never throws.
class ScopedDevice
{
public:
    explicit ScopedDevice(int32_t device) noexcept
    {
        if (KVCACHE_CUDA_LOG(cudaGetDevice(&mPrevious)) == cudaSuccess && mPrevious != device)
        {
            mSwitched = KVCACHE_CUDA_LOG(cudaSetDevice(device)) == cudaSuccess;
        }
    }
    ~ScopedDevice() noexcept
    {
        if (mSwitched)
        {
            KVCACHE_CUDA_LOG(cudaSetDevice(mPrevious));
        }
    }
    ScopedDevice(ScopedDevice const&) = delete;
    ScopedDevice& operator=(ScopedDevice const&) = delete;

private:
    int mPrevious{0};
    bool mSwitched{false};
};

} // namespace

KVCacheManager::KVCacheManager(Config const& config, cudaStream_t stream)
    : mConfig(config)
    , mLayout(computeLayout(config))
    , mStream(stream)
{
    int device = 0;
    KVCACHE_CUDA_TRY(cudaGetDevice(&device));
    mDevice = device;
    int32_t const layerCount = config.numAttentionLayers;
    if (layerCount == 0)
    {
        return;
    }
    mBuffers.reserve(static_cast<size_t>(layerCount));
    try
    {
        for (int32_t i = 0; i < layerCount; ++i)
        {
            int64_t const bytes = mLayout.layers[static_cast<size_t>(i)].layerBytes;
            void* ptr = nullptr;
            cudaError_t const status = allocate(&ptr, bytes, config.memPool, stream);
            if (status == cudaErrorMemoryAllocation)
            {
                cudaGetLastError();
                size_t freeBytes = 0;
                size_t totalBytes = 0;
                KVCACHE_CUDA_LOG(cudaMemGetInfo(&freeBytes, &totalBytes));
                throw OutOfMemoryError(fmt::format(
                    "KVCacheManager: cannot allocate layer {} of {}: it needs {} bytes ({:.3f} GiB); the whole config "
                    "needs {} bytes ({:.3f} GiB); device {} has {} bytes ({:.3f} GiB) free of {}",
                    i, layerCount, bytes, toGiB(bytes), mLayout.cacheBytes, toGiB(mLayout.cacheBytes), mDevice,
                    freeBytes, toGiB(static_cast<int64_t>(freeBytes)), totalBytes));
            }
            if (status != cudaSuccess)
            {
                detail::throwCudaError(status, "cudaMallocAsync", __FILE__, __LINE__);
            }
            mBuffers.push_back(ptr);
        }

        std::vector<detail::LayerTableEntry> table;
        table.reserve(static_cast<size_t>(layerCount));
        for (int32_t i = 0; i < layerCount; ++i)
        {
            KVLayerLayout const& layer = mLayout.layers[static_cast<size_t>(i)];
            table.push_back({static_cast<char*>(mBuffers[static_cast<size_t>(i)]), layer.pageBytes});
        }
        void* tablePtr = nullptr;
        KVCACHE_CUDA_TRY(allocate(
            &tablePtr, static_cast<int64_t>(table.size() * sizeof(detail::LayerTableEntry)), config.memPool, stream));
        mLayerTable = static_cast<detail::LayerTableEntry*>(tablePtr);
        detail::uploadLayerTable(mLayerTable, table.data(), layerCount, stream);

        auto const batch = int64_t{config.maxBatchSize};
        auto const cap = int64_t{mLayout.capPadded};
        auto const pages = int64_t{mLayout.numPages};
        auto const pageSize = int64_t{mLayout.tokensPerPage};
        mSlotViews.reserve(static_cast<size_t>(layerCount));
        mPoolViews.reserve(static_cast<size_t>(layerCount));
        for (int32_t i = 0; i < layerCount; ++i)
        {
            KVLayerLayout const& layer = mLayout.layers[static_cast<size_t>(i)];
            void* base = mBuffers[static_cast<size_t>(i)];
            mSlotViews.emplace_back(
                base, Coords{2, batch, cap, layer.numKVHeads, layer.headDim}, config.kvCacheType, DeviceType::kGPU);
            mPoolViews.emplace_back(base, Coords{2, pages, pageSize, layer.numKVHeads, layer.headDim},
                config.kvCacheType, DeviceType::kGPU);
        }
    }
    catch (...)
    {
        release();
        throw;
    }
}

KVCacheManager::~KVCacheManager() noexcept
{
    release();
}

KVCacheManager::KVCacheManager(KVCacheManager&& other) noexcept
    : mConfig(std::exchange(other.mConfig, {}))
    , mLayout(std::exchange(other.mLayout, {}))
    , mStream(std::exchange(other.mStream, nullptr))
    , mDevice(std::exchange(other.mDevice, 0))
    , mBuffers(std::exchange(other.mBuffers, {}))
    , mSlotViews(std::exchange(other.mSlotViews, {}))
    , mPoolViews(std::exchange(other.mPoolViews, {}))
    , mLayerTable(std::exchange(other.mLayerTable, nullptr))
{
}

KVCacheManager& KVCacheManager::operator=(KVCacheManager&& other) noexcept
{
    if (this != &other)
    {
        release();
        mConfig = std::exchange(other.mConfig, {});
        mLayout = std::exchange(other.mLayout, {});
        mStream = std::exchange(other.mStream, nullptr);
        mDevice = std::exchange(other.mDevice, 0);
        mBuffers = std::exchange(other.mBuffers, {});
        mSlotViews = std::exchange(other.mSlotViews, {});
        mPoolViews = std::exchange(other.mPoolViews, {});
        mLayerTable = std::exchange(other.mLayerTable, nullptr);
    }
    return *this;
}

void KVCacheManager::release() noexcept
{
    if (mBuffers.empty() && mLayerTable == nullptr)
    {
        return;
    }
    ScopedDevice const onDevice(mDevice);
    for (void* buffer : mBuffers)
    {
        KVCACHE_CUDA_LOG(cudaFreeAsync(buffer, mStream));
    }
    if (mLayerTable != nullptr)
    {
        KVCACHE_CUDA_LOG(cudaFreeAsync(mLayerTable, mStream));
    }
    mBuffers.clear();
    mSlotViews.clear();
    mPoolViews.clear();
    mLayerTable = nullptr;
}

void KVCacheManager::checkIndex(int32_t layerIdx, char const* what) const noexcept
{
    if (layerIdx < 0 || layerIdx >= numLayers())
    {
        detail::failIndex(what, layerIdx, numLayers());
    }
}

Tensor& KVCacheManager::getCombinedKVCache(int32_t layerIdx)
{
    if (layerIdx < 0 || layerIdx >= numLayers())
    {
        throw OutOfRangeError(fmt::format(
            "KVCacheManager::getCombinedKVCache: layer index {} is out of range [0, {})", layerIdx, numLayers()));
    }
    if (mLayout.numPages != mLayout.minPages)
    {
        throw InvalidConfigError(fmt::format(
            "KVCacheManager::getCombinedKVCache: numPages is {} but the slot view [2, maxBatchSize, capPadded, H, D] "
            "is only valid at the minimum {} pages (its V half would start inside the K pool); use "
            "getCombinedKVCachePoolView, getSeparateKVCache or kPoolPtr/vPoolPtr, which are valid for any numPages",
            mLayout.numPages, mLayout.minPages));
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
    Coords const shape{mConfig.maxBatchSize, mLayout.capPadded, layer.numKVHeads, layer.headDim};
    return {Tensor(kPoolPtr(layerIdx), shape, mConfig.kvCacheType, DeviceType::kGPU),
        Tensor(vPoolPtr(layerIdx), shape, mConfig.kvCacheType, DeviceType::kGPU)};
}

void* KVCacheManager::kPoolPtr(int32_t layerIdx) const noexcept
{
    checkIndex(layerIdx, "KVCacheManager::kPoolPtr");
    return mBuffers[static_cast<size_t>(layerIdx)];
}

void* KVCacheManager::vPoolPtr(int32_t layerIdx) const noexcept
{
    checkIndex(layerIdx, "KVCacheManager::vPoolPtr");
    KVLayerLayout const& layer = mLayout.layers[static_cast<size_t>(layerIdx)];
    return static_cast<char*>(mBuffers[static_cast<size_t>(layerIdx)]) + layer.halfElems * mLayout.elementBytes;
}

KVCacheManager::KVLayerConfig const& KVCacheManager::getLayerConfig(int32_t layerIdx) const noexcept
{
    checkIndex(layerIdx, "KVCacheManager::getLayerConfig");
    return mConfig.layerConfigs[static_cast<size_t>(layerIdx)];
}

bool KVCacheManager::isUniform() const noexcept
{
    auto const& layers = mConfig.layerConfigs;
    return std::all_of(layers.begin(), layers.end(),
        [&](KVLayerConfig const& layer)
        { return layer.numKVHeads == layers.front().numKVHeads && layer.headDim == layers.front().headDim; });
}

} // namespace kvcache::rt
