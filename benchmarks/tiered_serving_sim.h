#pragma once

// Cases g and i of kvcache-bench-tiered: the prefix hit rate of a two-tier cache (device pages and a host tier several
// times larger, TieredPrefixCache's bookkeeping with a mover that moves no bytes) on the serving workload of
// serving_workload.cpp, against the device cache alone, a PageManager of the combined capacity, and an independent
// model: an LRU prefix cache of the combined capacity (g); and on hybrid models against their full-attention twins (i).
// See tiered_serving_sim.cpp and docs/benchmarks.md.

#include "hybrid_serving_sim.h"
#include "serving_workload.h"

#include "kvcache/tiers/tiered_prefix_cache.h"

#include <cstdint>
#include <vector>

namespace kvcache::bench
{

//! One seed of case g: the same requests on each cache.
struct TieredRunResult
{
    //! The device cache alone (a PageManager of devicePages).
    ServingResult device;
    //! The two tiers: deviceTokens adopted, hostTokens onboarded.
    ServingResult tiered;
    //! A PageManager of devicePages + hostPages + diskPages.
    ServingResult combined;
    //! LruPrefixOracle of devicePages + hostPages + diskPages.
    ServingResult oracle;
    //! The tiered cache's counters over the measured steps.
    rt::TieredPrefixCacheStats tieredStats;
    int64_t devicePages = 0;
    int64_t hostPages = 0;
    int64_t diskPages = 0;
};

//! One full-attention layer of `numPages` pages at `tokensPerPage`, sequences up to kSERVING_MAX_LENGTH tokens, appends
//! of up to kSERVING_CHUNK tokens.
rt::KVCacheConfig servingPoolConfig(int32_t tokensPerPage, int64_t numPages);

//! Runs the workload seeded by `seed` on the four caches at `tokensPerPage`: a device pool of the hybrid twin's
//! 262,144 tokens, a host tier of `hostQuarters` / 4 times that and a disk tier of `diskQuarters` / 4 times (none for
//! 0). Throws std::runtime_error when a check fails.
TieredRunResult runTieredWorkload(int32_t tokensPerPage, int32_t hostQuarters, int32_t diskQuarters, uint64_t seed);

//! One seed of case i: a hybrid model and its full-attention twin (case f's configs, the same device bytes), each on
//! the device alone and under the two tiers.
struct HybridTieredResult
{
    ServingResult twinDevice;
    ServingResult twinTiered;
    ServingResult hybridDevice;
    ServingResult hybridTiered;
    rt::TieredPrefixCacheStats twinStats;
    rt::TieredPrefixCacheStats hybridStats;
    int64_t twinPages = 0;
    std::vector<int32_t> hybridPages;
};

//! Runs the workload seeded by `seed` on `shape`'s hybrid config (pages split per `split` within the twin's bytes) and
//! on its twin, each alone and with host tiers of hostQuarters / 4 times each group's pages. Throws std::runtime_error
//! when a check fails.
HybridTieredResult runHybridTieredWorkload(
    HybridModelShape const& shape, HybridSplit split, int32_t tokensPerPage, int32_t hostQuarters, uint64_t seed);

} // namespace kvcache::bench
