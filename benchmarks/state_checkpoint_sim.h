#pragma once

// Case j of kvcache-bench-allocator: prefix hit rate of a model with recurrent state layers (Qwen3-Next-like: one
// full-attention layer to three gated delta net layers) under state checkpoints, against its attention-only twin of the
// same device bytes and against vLLM's rule (states kept at block boundaries only, a block as large as a state slot).
// See state_checkpoint_sim.cpp and docs/benchmarks.md.

#include "kvcache/core/kv_cache_config.h"

#include <cstdint>

namespace kvcache::bench
{

//! The cache a run simulates, and how its runtime keeps states.
enum class CheckpointRule : int32_t
{
    //! The full-attention twin: every layer full attention (48 layers), no state; the device bytes all compare to.
    kTWIN = 0,
    //! The model's 12 full-attention layers alone, no state layers, in the twin's bytes: every cached page prefix is
    //! adoptable, as if states came free (a bound, and the reference for adoptPrefix()'s time).
    kATTENTION_ONLY = 1,
    //! The model with state checkpoints at PageManager's boundaries: the prompt's last whole page, where a match ends,
    //! every intervalPages pages.
    kKVCACHE = 2,
    //! The model under vLLM's rule: a checkpoint at every block boundary only, a block holding as many tokens as one
    //! state layer's slot takes bytes in one attention layer (rounded up to 16).
    kVLLM_BLOCKS = 3,
};

//! What one run measured (after warm-up).
struct CheckpointRunResult
{
    int64_t offeredTokens = 0;
    int64_t adoptedTokens = 0;
    int64_t admitted = 0;
    //! Time in adoptPrefix() calls, and the calls.
    double adoptNanoseconds = 0;
    int64_t adoptCalls = 0;
    int64_t checkpointsSaved = 0;
    int64_t checkpointsRestored = 0;
    int64_t checkpointsDropped = 0;
    int32_t numPages = 0;
    //! The cache's device bytes: pages and state slots.
    int64_t bytes = 0;
};

//! The Qwen3-Next-like model: 12 full-attention layers (2 KV heads of 256) and 36 gated delta net layers (a conv state
//! {8192, 3} and a recurrent state {32, 128, 128}, both 16-bit), 16 tokens a page.
struct QwenNextLike
{
    static constexpr int32_t kFULL_LAYERS = 12;
    static constexpr int32_t kSTATE_LAYERS = 36;
    static constexpr int32_t kTOKENS_PER_PAGE = 16;
};

//! Returns the config of `rule`: the twin with `twinPages` pages, the others with as many pages as fit in the twin's
//! bytes beside their state slots (the running sequences' and `checkpointSlots` checkpoint slots with state layers).
rt::KVCacheConfig checkpointConfig(CheckpointRule rule, int32_t checkpointSlots, int32_t twinPages);

//! Returns vLLM's block for the model: the tokens whose attention bytes of one layer reach one state layer's slot,
//! rounded up to a multiple of 16.
int32_t vllmBlockTokens();

//! Runs the workload seeded by `seed` on a manager of `config` under `rule`; `intervalPages` as
//! PageManagerOptions::checkpointIntervalPages (kKVCACHE only). Throws std::runtime_error when a check fails.
CheckpointRunResult runCheckpointWorkload(
    rt::KVCacheConfig const& config, CheckpointRule rule, int32_t intervalPages, uint64_t seed);

} // namespace kvcache::bench
