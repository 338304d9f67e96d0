#pragma once

#include "kvcache/core/device_allocation.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/core/tensor.h"
#include "kvcache/memory/layer_ref.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace kvcache::rt
{
namespace detail
{
//! The library's own access to a KVCacheManager beyond its public calls (src/memory/cache/layer_table.h).
class KVCacheManagerInternal;
} // namespace detail

//! What an attention kernel takes for one layer's quantization (docs/flashinfer.md shows FlashInfer's call for each
//! format), so that a runtime passes it through without knowing each format's rules. A stored value `code` of K reads
//! back as decode(code) * (its page scale, where the format has one) * kScale (docs/layout.md, "Quantization rules");
//! the same for V. The views stay valid while the manager lives; the scales are a copy taken at the call.
struct AttentionArguments
{
    //! The cache's format.
    KVQuantization quantization = KVQuantization::kNONE;
    //! The factor a kernel multiplies every K value by after any page scale: the per-tensor FP8 K scale
    //! (kFP8_PER_TENSOR) or the K global scale (kNVFP4), FlashInfer's `k_scale`; 1 for the other formats.
    float kScale = 1.0F;
    //! The same for V (`v_scale`); 1 for a latent layer, which has no V.
    float vScale = 1.0F;
    //! K's page scales, FlashInfer's `kv_cache_sf[0]`: [numPages, tokensPerPage, H] float32, one a token and head
    //! (kFP8_PER_TOKEN_HEAD), or [numPages, tokensPerPage, H, headDim / 16] FP8 E4M3, one a block of 16 values
    //! (kNVFP4); empty (null data, no dimensions) for the other formats.
    Tensor kScalePool{};
    //! V's page scales, `kv_cache_sf[1]`, the same shape; empty where kScalePool is, and for a latent layer.
    Tensor vScalePool{};
    //! The page scales are one a token and head (kFP8_PER_TOKEN_HEAD): FlashInfer's `use_token_head_sf`.
    bool tokenHeadScales = false;
    //! Only a tensor-core decode reads this format's page scales (kFP8_PER_TOKEN_HEAD, kNVFP4): FlashInfer's decode
    //! wrapper needs `use_tensor_cores=True`.
    bool tensorCoreDecode = false;
};

//! Owns one device buffer per attention layer and hands out zero-copy views of it: the slot view
//! [2, maxBatchSize, capPadded, H, D] and the pool view [2, numPages, tokensPerPage, H, D]. D in every data view is
//! the stored elements of a head: headDim, or headDim / 2 bytes for kNVFP4 (two values a byte). State layers
//! (KVCacheConfig::stateLayerConfigs) get one allocation each and a view [numStateSlots, ...shape] per tensor.
class KVCacheManager
{
public:
    using KVLayerConfig = rt::KVLayerConfig;
    using Config = KVCacheConfig;

    //! An empty manager: no layers, nothing allocated.
    KVCacheManager() noexcept = default;
    //! Validates `config`, then allocates each layer with cudaMallocAsync on `stream` (never reallocated), and for a
    //! quantization with page scales (kFP8_PER_TOKEN_HEAD, kNVFP4) a second allocation a layer, its scale pool;
    //! `stream` must outlive the manager, which frees its memory on it. Every quantization is accepted; page
    //! operations, host tiers, sequence files and page transfer carry the scales (docs/layout.md, "Status").
    //! Each state layer gets one more allocation of its layerBytes, its tensors at their offsetBytes (docs/layout.md,
    //! "State layers"); state memory is not cleared.
    //! Throws InvalidConfigError for a bad config (before allocating anything), OutOfMemoryError when a layer, its
    //! scale pool or a state layer cannot be allocated (after freeing everything already allocated) and CudaError for
    //! other CUDA failures.
    KVCacheManager(Config const& config, cudaStream_t stream);
    //! Returns all memory with cudaFreeAsync on the constructor's stream and device; never throws.
    ~KVCacheManager() noexcept = default;

    KVCacheManager(KVCacheManager const&) = delete;
    KVCacheManager& operator=(KVCacheManager const&) = delete;
    //! Takes `other`'s memory; `other` is left with no layers.
    KVCacheManager(KVCacheManager&& other) noexcept = default;
    //! Frees this manager's memory (stream-ordered), then takes `other`'s; `other` is left with no layers (a
    //! self-move gives the memory up).
    KVCacheManager& operator=(KVCacheManager&& other) noexcept = default;

    //! Exactly computeLayout(config), under the seed API's name: validates `config` without a GPU and returns its
    //! layout; throws InvalidConfigError naming the field, the value and the limit.
    static KVCacheLayout validate(Config const& config)
    {
        return computeLayout(config);
    }

    //! Returns the slot view [2, maxBatchSize, slotTokens, H, D] of `layerIdx` ([1, ...] for a latent layer; slotTokens
    //! is capPadded for full attention and the ring's length for a sliding window: token s at s % slotTokens). Throws
    //! std::out_of_range for a bad index and InvalidConfigError when the layer's group has more pages than its
    //! minimum (the view's V half would be wrong).
    Tensor& getCombinedKVCache(int32_t layerIdx);
    //! Returns the pool view [2, numPages, tokensPerPage, H, D] of `layerIdx` ([1, ...] for a latent layer; numPages is
    //! the layer's group's); aborts on a bad index.
    Tensor& getCombinedKVCachePoolView(int32_t layerIdx) noexcept;
    //! Returns K and V, each [maxBatchSize, slotTokens, H, D] at kPoolPtr / vPoolPtr (for a latent layer V is empty:
    //! null, [0, slotTokens, H, D]); aborts on a bad index.
    std::pair<Tensor, Tensor> getSeparateKVCache(int32_t layerIdx) const noexcept;
    //! Returns latent layer `layerIdx`'s pool as MLA kernels take it: [numPages, tokensPerPage, headDim] at kPoolPtr,
    //! each token's vector holding the kv_lora_rank values first, then the rope part. Throws OutOfRangeError for a bad
    //! index and InvalidArgumentError for a layer that is not latent.
    Tensor latentPoolView(int32_t layerIdx) const;

    //! Returns layer `layerIdx`'s scale pool, zero-copy, K scales then V scales (none for a latent layer):
    //! [numHalves, numPages, tokensPerPage, H] float32 (kFP8_PER_TOKEN_HEAD) or [numHalves, numPages, tokensPerPage, H,
    //! headDim / 16] FP8 E4M3 (kNVFP4), as FlashInfer reads `kv_cache_sf`. Throws OutOfRangeError for a bad index and
    //! InvalidArgumentError, naming the quantization, for a cache without scale pools.
    Tensor scalePoolView(int32_t layerIdx) const;
    //! Returns layer `layerIdx`'s host-held scales. Throws OutOfRangeError for a bad index and InvalidArgumentError,
    //! naming the quantization, unless it is kFP8_PER_TENSOR or kNVFP4. Both start at 1.
    LayerScales layerScales(int32_t layerIdx) const;
    //! Returns what an attention kernel takes for layer `layerIdx`'s quantization: the host-held scales as kScale /
    //! vScale (1 where the format has none) and the scale pool split into K and V views (empty where it has none).
    //! Works for every format. Throws OutOfRangeError for a bad index.
    AttentionArguments attentionArguments(int32_t layerIdx) const;
    //! Sets layer `layerIdx`'s host-held scales (kFP8_PER_TENSOR: finite, >= 0; kNVFP4: finite, > 0; a latent layer's
    //! v is unused and not checked, as sequence files record it as 0). Throws as layerScales does, and
    //! InvalidArgumentError naming the scale, its value and the limit; a throw changes nothing.
    void setLayerScales(int32_t layerIdx, LayerScales scales);

    //! The same view as getCombinedKVCache(layerIdx) (the Python name slot_view); throws as it does.
    Tensor& slotView(int32_t layerIdx)
    {
        return getCombinedKVCache(layerIdx);
    }
    //! The same view as getCombinedKVCachePoolView(layerIdx) (the Python name pool_view); aborts on a bad index.
    Tensor& poolView(int32_t layerIdx) noexcept
    {
        return getCombinedKVCachePoolView(layerIdx);
    }
    //! The same views as getSeparateKVCache(layerIdx) (the Python name separate_view); aborts on a bad index.
    std::pair<Tensor, Tensor> separateView(int32_t layerIdx) const noexcept
    {
        return getSeparateKVCache(layerIdx);
    }

    //! Returns tensor `tensorIdx` of state layer `stateLayerIdx`, zero-copy: [numStateSlots, ...shape], contiguous and
    //! row-major in the tensor's dtype, so slot n (a sequence's or a checkpoint's state) is index n of the first
    //! dimension. Throws OutOfRangeError for a bad layer or tensor index.
    Tensor stateView(int32_t stateLayerIdx, int32_t tensorIdx) const;
    //! Returns the tensor named `name` of state layer `stateLayerIdx`, as stateView(stateLayerIdx, tensorIdx) does.
    //! Throws OutOfRangeError for a bad layer index and InvalidArgumentError, naming the layer's tensors, for an
    //! unknown name.
    Tensor stateView(int32_t stateLayerIdx, std::string_view name) const;
    //! Returns the start of state layer `stateLayerIdx`'s allocation (its first tensor); aborts on a bad index.
    void* statePtr(int32_t stateLayerIdx) const noexcept;
    //! Returns the number of state layers.
    int32_t numStateLayers() const noexcept
    {
        return static_cast<int32_t>(mStateBuffers.size());
    }
    //! Returns the slots of every state layer: maxBatchSize + numCheckpointSlots, or 0 without state layers.
    int32_t numStateSlots() const noexcept
    {
        return mLayout.numStateSlots;
    }

    //! Returns the largest layer slotTokens: maxSequenceLength rounded up to whole pages when any layer has full
    //! attention, else the longest sliding-window ring.
    int32_t maxCapPadded() const noexcept
    {
        return mLayout.capPadded;
    }
    //! Returns the pages per half of group 0's layers (of every layer when there is one group).
    int32_t numPages() const noexcept
    {
        return mLayout.numPages;
    }
    //! Returns group 0's minimum pages, maxBatchSize * pagesPerSequence: the pages its slot views cover.
    int32_t minPages() const noexcept
    {
        return mLayout.minPages;
    }
    //! Returns the number of page groups (0 with no layers).
    int32_t numGroups() const noexcept
    {
        return static_cast<int32_t>(mLayout.groups.size());
    }
    //! Returns page group `groupIdx`: its layers, pagesPerSequence, numPages and bytes per page id; aborts on a bad
    //! index.
    KVPageGroupLayout const& group(int32_t groupIdx) const noexcept;
    //! Returns the page group of layer `layerIdx`; aborts on a bad index.
    int32_t groupOf(int32_t layerIdx) const noexcept;
    //! Returns the tokens per page.
    int32_t tokensPerPage() const noexcept
    {
        return mLayout.tokensPerPage;
    }
    //! Returns the start of layer `layerIdx`'s K pool; aborts on a bad index.
    void* kPoolPtr(int32_t layerIdx) const noexcept;
    //! Returns the start of layer `layerIdx`'s V pool (nullptr for a latent layer); aborts on a bad index.
    void* vPoolPtr(int32_t layerIdx) const noexcept;
    //! Returns layer `layerIdx`'s pools as a kernel addresses them (pass it by value); aborts on a bad index.
    LayerRef layerRef(int32_t layerIdx) const noexcept;
    //! Returns layer `layerIdx`'s head shape; aborts on a bad index.
    KVLayerConfig const& getLayerConfig(int32_t layerIdx) const noexcept;
    //! Returns the number of attention layers.
    int32_t numLayers() const noexcept
    {
        return static_cast<int32_t>(mBuffers.size());
    }
    //! Returns true when every layer has the same numKVHeads and headDim (also for zero layers); kinds and windows may
    //! differ.
    bool isUniform() const noexcept;
    //! Returns the config the manager was built from.
    Config const& getConfig() const noexcept
    {
        return mConfig;
    }
    //! Returns the layout maths (sizes per layer and in total): the one source of every shape the manager reports.
    KVCacheLayout const& layout() const noexcept
    {
        return mLayout;
    }
    //! Returns the device bytes the manager holds: layout().cacheBytes (data and scale pools), layout().stateBytes
    //! (state layers) and the table that the page kernels read, 16 bytes an entry: one a layer, two a layer with scale
    //! pools.
    int64_t allocatedBytes() const noexcept;
    //! Returns the stream the memory was allocated on and will be freed on.
    cudaStream_t stream() const noexcept
    {
        return mStream;
    }
    //! Returns the device the memory lives on.
    int32_t device() const noexcept
    {
        return mDevice;
    }

private:
    friend class detail::KVCacheManagerInternal;

    void checkIndex(int32_t layerIdx, char const* what) const noexcept;
    //! Throws OutOfRangeError for a bad index, InvalidArgumentError when the cache keeps no scale pools
    //! (`pageScales`) or no host-held layer scales.
    void checkScaledIndex(int32_t layerIdx, char const* what, bool pageScales) const;

    Config mConfig{};
    KVCacheLayout mLayout{};
    cudaStream_t mStream{nullptr};
    int32_t mDevice{0};
    std::vector<DeviceAllocation> mBuffers{};
    //! One a layer: its scale pool, empty without page scales.
    std::vector<DeviceAllocation> mScaleBuffers{};
    //! One a layer: the host-held scales (kFP8_PER_TENSOR, kNVFP4), else empty.
    std::vector<LayerScales> mLayerScales{};
    std::vector<Tensor> mSlotViews{};
    std::vector<Tensor> mPoolViews{};
    //! One a state layer: its tensors at their offsetBytes.
    std::vector<DeviceAllocation> mStateBuffers{};
    //! Data entries then scale entries, group by group, read by the page kernels (see src/memory/cache/layer_table.h).
    DeviceAllocation mLayerTable{};
};

} // namespace kvcache::rt
