#pragma once

// Inputs the state checkpoint tests share: a config with one state layer and checkpoint slots, options with a fixed
// hash seed and a checkpoint interval, a step's state copies as (source, destination) pairs, and a prefix's hash.

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_manager.h"

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/page_manager_inputs.h"

namespace kvcache::test
{

//! Tokens a page and the longest sequence of checkpointConfig().
constexpr int32_t kCHECKPOINT_TOKENS_PER_PAGE = 4;
constexpr int32_t kCHECKPOINT_MAX_LENGTH = 64;

using TokenList = std::vector<int32_t>;
//! State slot copies as (source, destination) pairs.
using SlotCopyPairs = std::vector<std::pair<int32_t, int32_t>>;

//! `layers` (default one full-attention layer), 4 tokens a page, 64 tokens a sequence, `maxBatchSize` sequences,
//! `numPages` pages (0: the minimum), one state layer and `checkpointSlots` checkpoint slots (no state layer when
//! negative).
inline rt::KVCacheConfig checkpointConfig(
    int32_t maxBatchSize, int32_t checkpointSlots, int32_t numPages, std::vector<rt::KVLayerConfig> layers = {{1, 8}})
{
    ConfigBuilder builder(std::move(layers));
    builder.maxBatchSize(maxBatchSize)
        .maxSequenceLength(kCHECKPOINT_MAX_LENGTH)
        .tokensPerPage(kCHECKPOINT_TOKENS_PER_PAGE)
        .maxTokensPerStep(kCHECKPOINT_MAX_LENGTH)
        .numPages(numPages);
    if (checkpointSlots >= 0)
    {
        builder.stateLayers({rt::StateLayerConfig{{rt::StateTensorConfig{"ssm", {2, 4, 4}, rt::DataType::kFLOAT}}}})
            .numCheckpointSlots(checkpointSlots);
    }
    return builder;
}

//! Options with a fixed hash seed, a checkpoint every `intervalPages` pages (0: none) and prefix caching on or off.
inline rt::PageManagerOptions checkpointOptions(int32_t intervalPages = 0, bool prefixCaching = true)
{
    rt::PageManagerOptions o = seededOptions(0, 11, prefixCaching);
    o.checkpointIntervalPages = intervalPages;
    return o;
}

//! Returns `copies` as (source, destination) pairs.
inline SlotCopyPairs pairsOf(std::vector<rt::StateSlotCopy> const& copies)
{
    SlotCopyPairs pairs;
    for (rt::StateSlotCopy const& copy : copies)
    {
        pairs.emplace_back(copy.src, copy.dst);
    }
    return pairs;
}

//! Returns the hash of the first `pages` whole pages of `tokens` without salt, from the manager's hasher.
inline rt::PageHash prefixHash(rt::PageManager const& manager, TokenList const& tokens, int32_t pages)
{
    std::vector<rt::PageHash> hashes(static_cast<size_t>(pages));
    manager.hasher().chain(
        manager.hasher().root(nullptr, 0), tokens.data(), pages, kCHECKPOINT_TOKENS_PER_PAGE, hashes.data());
    return hashes.back();
}

} // namespace kvcache::test
