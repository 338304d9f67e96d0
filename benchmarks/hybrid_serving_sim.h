#pragma once

// Case f of kvcache-bench-allocator: prefix hit rate of hybrid models (sliding-window and full-attention layers)
// against their full-attention twins of the same device bytes, on one serving workload. See hybrid_serving_sim.cpp and
// docs/benchmarks.md.

#include "serving_workload.h"

#include "kvcache/paging/page_manager.h"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace kvcache::bench
{

//! The attention layers of a hybrid model: a repeating pattern of `windowedPerFull` sliding-window layers of `window`
//! tokens followed by one full-attention layer, `numLayers` layers in all, every layer numKVHeads x headDim.
struct HybridModelShape
{
    char const* name;
    int32_t numLayers;
    int32_t windowedPerFull;
    int32_t window;
    int32_t numKVHeads;
    int32_t headDim;
};

//! gpt-oss-20b: 24 layers alternating sliding window (128 tokens) and full attention, 8 KV heads of 64.
inline constexpr HybridModelShape kGPT_OSS_LIKE{"gpt_oss_like", 24, 1, 128, 8, 64};
//! Gemma-3-12B: 48 layers, five sliding-window layers (1024 tokens) to one full-attention layer, 8 KV heads of 256.
inline constexpr HybridModelShape kGEMMA3_LIKE{"gemma3_like", 48, 5, 1024, 8, 256};

//! How the hybrid model's bytes are split between its page groups.
enum class HybridSplit : int32_t
{
    //! rt::splitBudget: every group holds the same number of full-length sequences.
    kSPLIT_BUDGET = 0,
    //! The windowed groups get the pages of the running batch at its largest (kRUNNING sequences, each at the group's
    //! pagesPerSequence) and nothing more; every other byte goes to the full-attention group.
    kMINIMUM_WINDOWED = 1,
};

//! What one run of the workload measured on one manager.
struct HybridRunResult
{
    int64_t offeredTokens = 0; //!< prompt tokens given to adoptPrefix() after warm-up
    int64_t adoptedTokens = 0; //!< tokens it returned
    //! The same per kind of request: new, repeat, follow-up.
    std::array<int64_t, 3> offeredByKind = {};
    std::array<int64_t, 3> adoptedByKind = {};
    int64_t admitted = 0;     //!< requests admitted after warm-up
    int64_t evictedPages = 0; //!< pages evicted after warm-up, all groups
    double nanoseconds = 0;   //!< wall time of the measured steps
    std::vector<int32_t> numPagesPerGroup;
    int64_t cacheBytes = 0;
};

//! The hot-prefix workload of case f (hot_prefix/SPARE): one sliding-window layer of kHOT_WINDOW tokens and one
//! full-attention layer, 16 tokens a page; kHOT_RUNNING sequences at once, prefilled kHOT_CHUNK tokens a step; every
//! prompt is one of kHOT_PREFIXES shared prefixes of 256 tokens followed by 16 to 256 random tokens, and produces 8 to
//! 64 tokens. A prefix hit at 256 tokens needs its window's 5 windowed pages.
inline constexpr int32_t kHOT_WINDOW = 80;
inline constexpr int32_t kHOT_PREFIXES = 6;
inline constexpr int32_t kHOT_RUNNING = 8;
inline constexpr int32_t kHOT_CHUNK = 16;

//! Returns the hot-prefix model's config: the hybrid one (`hybrid`) with its windowed group at the running batch's
//! largest need plus `sparePages`, or its full-attention twin; the full-attention pools hold every prefix and more.
rt::KVCacheConfig hotPrefixConfig(bool hybrid, int32_t sparePages);
//! Runs the hot-prefix workload seeded by `seed` on a manager made from `config`, as runHybridWorkload does.
HybridRunResult runHotPrefixWorkload(rt::KVCacheConfig const& config, uint64_t seed);

//! Runs the serving workload (seeded by `seed`, the same requests whatever the manager) on a manager made from
//! `config`: kSERVING_WARM_STEPS untimed steps, then kSERVING_MEASURED_STEPS measured ones. Throws std::runtime_error
//! when a step runs out of pages (the workload is sized so that it must not) or a check fails.
HybridRunResult runHybridWorkload(rt::KVCacheConfig const& config, uint64_t seed);

//! Returns the hybrid config of `shape` at `tokensPerPage`, its pages split per `split` so that its cache takes at most
//! `budgetBytes`.
rt::KVCacheConfig hybridConfig(
    HybridModelShape const& shape, int32_t tokensPerPage, HybridSplit split, int64_t budgetBytes);
//! Returns the full-attention twin of `shape` (the same layers without windows) with the workload's pool at
//! `tokensPerPage`.
rt::KVCacheConfig twinConfig(HybridModelShape const& shape, int32_t tokensPerPage);

} // namespace kvcache::bench
