#pragma once

#include "kvcache/core/kv_cache_config.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvcache::rt
{

//! Sizes of one layer's buffer; element counts are per half (K or V; a latent layer has one half, K).
struct KVLayerLayout
{
    int32_t numKVHeads = {};
    int32_t headDim = {};
    KVLayerKind kind = KVLayerKind::kKV;
    int32_t slidingWindow = {}; //!< 0 for full attention
    int32_t group = {};         //!< index into KVCacheLayout::groups
    int32_t numHalves = {};     //!< 2 (K and V), or 1 for a latent layer
    int32_t slotTokens = {};    //!< tokens of one slot of the slot view: the group's pagesPerSequence * tokensPerPage
    int32_t numPages = {};      //!< pages per half: the group's numPages
    int32_t storedDim = {};     //!< elements of one head as stored: headDim, or headDim / 2 bytes for kNVFP4
    int64_t pageElems = {};     //!< tokensPerPage * numKVHeads * storedDim
    int64_t pageBytes = {};     //!< pageElems * element size: data of one page of one half
    int64_t halfElems = {};     //!< numPages * pageElems; the V pool starts this many elements after K
    int64_t layerBytes = {};    //!< numHalves * halfElems * element size: the data allocation
    //! Scale bytes of one page of one half: tokensPerPage * numKVHeads * 4 (kFP8_PER_TOKEN_HEAD), tokensPerPage *
    //! numKVHeads * headDim / 16 (kNVFP4), else 0.
    int64_t scalePageBytes = {};
    //! numHalves * numPages * scalePageBytes: the layer's scale allocation (K scales, then V scales), 0 without one.
    int64_t scaleBytes = {};
};

//! Layers that share one page-id space: the same pages-per-sequence rule. Full-attention layers (KV and latent) form
//! group 0; each distinct sliding window forms another, in ascending order of window. A page id means nothing
//! outside its group.
struct KVPageGroupLayout
{
    int32_t slidingWindow = {};    //!< 0 for full attention
    int32_t pagesPerSequence = {}; //!< the most pages one sequence holds at once
    int32_t slotTokens = {};       //!< pagesPerSequence * tokensPerPage: tokens one slot holds (a ring when windowed)
    int32_t minPages = {};         //!< maxBatchSize * pagesPerSequence
    int32_t numPages = {};         //!< pages per half of each of its layers: numPagesPerGroup's entry, or minPages
    std::vector<int32_t> layers = {}; //!< its layers, ascending
    int64_t bytesPerPage = {};        //!< one page id across its layers and their halves, data and scales
    int64_t cacheBytes = {};          //!< its layers' allocations together, data and scales
};

//! Where each state tensor starts in its layer's allocation: a multiple of this many bytes, as cudaMallocAsync aligns
//! an allocation of its own, so every tensor's view is as aligned as a separate buffer would be.
inline constexpr int64_t kSTATE_TENSOR_ALIGNMENT = 256;

//! One state tensor of a state layer: [numStateSlots, ...shape], contiguous and row-major, slot-major (docs/layout.md,
//! "State layers"). Slot n's state starts slotBytes * n bytes after the tensor's start.
struct StateTensorLayout
{
    std::string name = {};
    std::vector<int64_t> shape = {}; //!< one slot's extents, as the config gives them
    DataType dataType = DataType::kFLOAT;
    int64_t slotElems = {};   //!< product of shape
    int64_t slotBytes = {};   //!< slotElems * element size: one sequence's tensor
    int64_t offsetBytes = {}; //!< start in the layer's allocation: the end of the tensor before, rounded up to
                              //!< kSTATE_TENSOR_ALIGNMENT (0 for the first)
    int64_t bytes = {};       //!< numStateSlots * slotBytes
};

//! One state layer's allocation: its tensors one after another, in config order. It belongs to no page group.
struct StateLayerLayout
{
    std::vector<StateTensorLayout> tensors = {};
    int64_t slotBytes = {};  //!< sum of the tensors' slotBytes: one sequence's state of the layer, without padding
    int64_t layerBytes = {}; //!< the allocation: the last tensor's offsetBytes + bytes (alignment padding included)
};

//! The layout maths of a validated config: what every view, kernel and accounting figure derives from.
//!
//! A layer with sliding window W keeps pagesPerSequence = min(ceil(S / P), ceil((W - 1 + C) / P) + 1) pages a
//! sequence (S = maxSequenceLength, P = tokensPerPage, C = maxTokensPerStep): attending from the first of C tokens
//! appended in one step reaches W - 1 tokens back, so W - 1 + C consecutive tokens must be resident at once; they
//! start anywhere in a page, so covering them can take one page more than their length rounds up to; and a sequence
//! never needs more pages than a full-length one. Token s of a slot lives at ring position s % slotTokens.
struct KVCacheLayout
{
    int32_t maxBatchSize = {};
    DataType dataType = DataType::kHALF;
    int32_t tokensPerPage = {};
    int32_t maxTokensPerStep = {}; //!< C above: the config's, or maxSequenceLength when it is 0
    int32_t capPadded = {};        //!< the largest layer slotTokens: maxSequenceLength rounded up to whole pages when
                                   //!< any layer has full attention (or there are no layers)
    int32_t pagesPerSlot = {};     //!< group 0's pagesPerSequence
    int32_t minPages = {};         //!< group 0's minPages
    int32_t numPages = {};         //!< group 0's numPages
    int64_t elementBytes = {};
    KVQuantization quantization = KVQuantization::kNONE;
    std::vector<KVLayerLayout> layers = {};
    std::vector<KVPageGroupLayout> groups = {};
    int64_t cacheBytes = {};   //!< sum of layerBytes and scaleBytes
    int64_t bytesPerPage = {}; //!< the sum of the groups' bytesPerPage: one page id in every layer (one group: K and V
                               //!< of one page id across all layers), data and scales
    //! S above: the config's maxSequenceLength (what a PageManager built from this layout bounds sequences by).
    int32_t maxSequenceLength = {};
    //! State slots of every state layer: maxBatchSize (one per running sequence) + numCheckpointSlots; 0 without
    //! state layers. A slot index means the same sequence (or checkpoint) in every state layer.
    int32_t numStateSlots = {};
    int32_t numCheckpointSlots = {}; //!< the config's
    std::vector<StateLayerLayout> stateLayers = {};
    int64_t stateBytesPerSlot = {}; //!< sum of the state layers' slotBytes: one sequence's state over all of them
    //! Sum of the state layers' layerBytes. cacheBytes counts pages only; the cache allocates cacheBytes + stateBytes.
    int64_t stateBytes = {};
};

//! Validates `config` and returns its layout; throws InvalidConfigError naming the field, value and limit of the
//! first broken rule. Needs no GPU and allocates no device memory.
KVCacheLayout computeLayout(KVCacheConfig const& config);

//! Returns the largest numPages whose cache fits in `budgetBytes` (capped by the int32 page-id limit), which may be
//! below the minimum; the state slots come off the budget first (0 pages when they alone exceed it); throws
//! InvalidConfigError if `config` (numPages aside) is invalid or has several page groups (use splitBudget), and
//! InvalidArgumentError for a negative budget.
int64_t maxPagesForBudget(KVCacheConfig const& config, int64_t budgetBytes);

//! A budget split across page groups (splitBudget).
struct BudgetSplit
{
    //! Full-length sequences every group can hold at once.
    int64_t sequences = {};
    //! Pages per half for each group: sequences * pagesPerSequence (may be below a group's minimum).
    std::vector<int64_t> numPagesPerGroup = {};
    //! Bytes the cache takes with those pages, its state slots included.
    int64_t bytes = {};
    //! Bytes of the state slots (KVCacheLayout::stateBytes), a fixed part of `bytes` whatever the pages: numStateSlots
    //! does not grow with the page count. 0 without state layers.
    int64_t stateBytes = {};
};

//! Splits `budgetBytes` across the page groups of `config` so that every group holds the same number of concurrent
//! full-length sequences, the most that fit (capped by the int32 page-id limit); closed form, no GPU. The state slots
//! come off the budget first; when they alone exceed it, sequences is 0 and bytes is stateBytes. Throws
//! InvalidConfigError if `config` (page counts aside) is invalid and InvalidArgumentError for a negative budget.
BudgetSplit splitBudget(KVCacheConfig const& config, int64_t budgetBytes);

//! Largest numPages: V page ids in a flat [2 * numPages, ...] pool must fit in int32.
inline constexpr int32_t kMAX_NUM_PAGES = INT32_MAX / 2;

} // namespace kvcache::rt
