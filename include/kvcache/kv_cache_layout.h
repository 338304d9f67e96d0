#pragma once

#include "kvcache/kv_cache_config.h"

#include <cstdint>
#include <vector>

namespace kvcache::rt
{

//! Sizes of one layer's buffer; element counts are per half (K or V).
struct KVLayerLayout
{
    int32_t numKVHeads = {};
    int32_t headDim = {};
    int64_t pageElems = {};  //!< tokensPerPage * numKVHeads * headDim
    int64_t pageBytes = {};  //!< pageElems * element size
    int64_t halfElems = {};  //!< numPages * pageElems; the V pool starts this many elements after K
    int64_t layerBytes = {}; //!< 2 * halfElems * element size: the whole allocation
};

//! The layout maths of a validated config: what every view, kernel and accounting figure derives from.
struct KVCacheLayout
{
    int32_t maxBatchSize = {};
    DataType dataType = DataType::kHALF;
    int32_t tokensPerPage = {};
    int32_t capPadded = {};    //!< maxSequenceLength rounded up to whole pages
    int32_t pagesPerSlot = {}; //!< capPadded / tokensPerPage
    int32_t minPages = {};     //!< maxBatchSize * pagesPerSlot
    int32_t numPages = {};     //!< config's numPages, or minPages when it is 0
    int64_t elementBytes = {};
    std::vector<KVLayerLayout> layers = {};
    int64_t cacheBytes = {};   //!< sum of layerBytes
    int64_t bytesPerPage = {}; //!< K and V of one page id across all layers
};

//! Validates `config` and returns its layout; throws InvalidConfigError naming the field, value and limit of the
//! first broken rule. Needs no GPU and allocates no device memory.
KVCacheLayout computeLayout(KVCacheConfig const& config);

//! Returns the largest numPages whose cache fits in `budgetBytes` (capped by the int32 page-id limit), which may be
//! below the minimum; throws InvalidConfigError if `config` (numPages aside) is invalid and InvalidArgumentError for a
//! negative budget.
int64_t maxPagesForBudget(KVCacheConfig const& config, int64_t budgetBytes);

//! Largest numPages: V page ids in a flat [2 * numPages, ...] pool must fit in int32.
inline constexpr int32_t kMAX_NUM_PAGES = INT32_MAX / 2;

} // namespace kvcache::rt
