// Cases f and j of kvcache-bench-allocator (bench_allocator.cpp lists them all): whole serving workloads on hybrid
// models against their full-attention twins (hybrid_serving_sim.cpp), and on a recurrent hybrid model under state
// checkpoints against its attention-only twin and vLLM's rule (state_checkpoint_sim.cpp). Each checks its own work
// and reports hit rates. See docs/benchmarks.md.

#include "bench_allocator_serving.h"

#include "bench_main.h"
#include "hybrid_serving_sim.h"
#include "state_checkpoint_sim.h"

#include "kvcache/core/kv_cache_layout.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace kvcache::bench
{
namespace
{

// Case f: hybrid models against their full-attention twins

//! Seeds of case f: each iteration runs one.
constexpr int32_t kHYBRID_SEEDS = 5;

//! Runs one seed an iteration of `run` on the full-attention twin, then on the hybrid model, and reports the hit rates
//! (adopted tokens over prompt tokens offered, after warm-up, summed over the iterations). With `sameBytes`, checks
//! that the hybrid cache takes at most the twin's bytes.
template <typename Run>
void hybridAgainstTwin(
    benchmark::State& state, rt::KVCacheConfig const& twin, rt::KVCacheConfig const& hybrid, bool sameBytes, Run&& run)
{
    HybridRunResult twinTotal;
    HybridRunResult hybridTotal;
    uint64_t seed = 1;
    for (auto _ : state)
    {
        HybridRunResult const t = run(twin, seed);
        HybridRunResult const h = run(hybrid, seed);
        ++seed;
        check(t.offeredTokens == h.offeredTokens && t.admitted == h.admitted,
            "the twin and the hybrid model were offered different prompts");
        check(!sameBytes || h.cacheBytes <= t.cacheBytes,
            "the hybrid cache takes " + std::to_string(h.cacheBytes) + " bytes, more than the twin's "
                + std::to_string(t.cacheBytes));
        for (HybridRunResult* total : {&twinTotal, &hybridTotal})
        {
            HybridRunResult const& one = total == &twinTotal ? t : h;
            total->offeredTokens += one.offeredTokens;
            total->adoptedTokens += one.adoptedTokens;
            for (size_t k = 0; k < one.offeredByKind.size(); ++k)
            {
                total->offeredByKind[k] += one.offeredByKind[k];
                total->adoptedByKind[k] += one.adoptedByKind[k];
            }
            total->admitted += one.admitted;
            total->evictedPages += one.evictedPages;
            total->nanoseconds += one.nanoseconds;
            total->numPagesPerGroup = one.numPagesPerGroup;
            total->cacheBytes = one.cacheBytes;
        }
        state.SetIterationTime((t.nanoseconds + h.nanoseconds) * 1e-9);
    }
    auto rate = [](HybridRunResult const& r)
    { return static_cast<double>(r.adoptedTokens) / static_cast<double>(std::max<int64_t>(r.offeredTokens, 1)); };
    state.counters["twin_hit_rate"] = rate(twinTotal);
    state.counters["hybrid_hit_rate"] = rate(hybridTotal);
    state.counters["hybrid_over_twin"] = rate(hybridTotal) / std::max(rate(twinTotal), 1e-12);
    char const* const kinds[] = {"new", "repeat", "follow_up"};
    for (size_t k = 0; k < 3; ++k)
    {
        auto kindRate = [k](HybridRunResult const& r) {
            return static_cast<double>(r.adoptedByKind[k])
                / static_cast<double>(std::max<int64_t>(r.offeredByKind[k], 1));
        };
        state.counters[std::string("twin_hit_rate_") + kinds[k]] = kindRate(twinTotal);
        state.counters[std::string("hybrid_hit_rate_") + kinds[k]] = kindRate(hybridTotal);
    }
    state.counters["admitted"] = static_cast<double>(hybridTotal.admitted);
    state.counters["twin_evicted"] = static_cast<double>(twinTotal.evictedPages);
    state.counters["hybrid_evicted"] = static_cast<double>(hybridTotal.evictedPages);
    state.counters["twin_ms"] = twinTotal.nanoseconds * 1e-6;
    state.counters["hybrid_ms"] = hybridTotal.nanoseconds * 1e-6;
    state.counters["twin_bytes"] = static_cast<double>(twinTotal.cacheBytes);
    state.counters["hybrid_bytes"] = static_cast<double>(hybridTotal.cacheBytes);
    for (size_t g = 0; g < hybridTotal.numPagesPerGroup.size(); ++g)
    {
        state.counters["hybrid_pages_g" + std::to_string(g)] = static_cast<double>(hybridTotal.numPagesPerGroup[g]);
    }
    state.counters["twin_pages"] = static_cast<double>(twinTotal.numPagesPerGroup.at(0));
}

//! hybrid_prefix/MODEL/SPLIT/P: one iteration runs the workload of hybrid_serving_sim.cpp with one seed on the
//! full-attention twin, then on the hybrid model whose cache takes at most the twin's bytes (split per SPLIT).
void hybridPrefix(benchmark::State& state, HybridModelShape shape, HybridSplit split, int32_t tokensPerPage)
{
    guarded(state,
        [&]
        {
            rt::KVCacheConfig const twin = twinConfig(shape, tokensPerPage);
            int64_t const twinBytes = rt::computeLayout(twin).cacheBytes;
            rt::KVCacheConfig const hybrid = hybridConfig(shape, tokensPerPage, split, twinBytes);
            hybridAgainstTwin(state, twin, hybrid, true, runHybridWorkload);
        });
}

//! hot_prefix/SPARE: the hot-prefix workload of hybrid_serving_sim.cpp, one seed an iteration, on the full-attention
//! twin and on the hybrid model whose windowed group has SPARE pages beyond the running batch's largest need.
void hotPrefix(benchmark::State& state, int32_t sparePages)
{
    guarded(state,
        [&]
        {
            hybridAgainstTwin(state, hotPrefixConfig(false, sparePages), hotPrefixConfig(true, sparePages), false,
                runHotPrefixWorkload);
        });
}

// Case j: a recurrent hybrid model under state checkpoints, its attention-only twin and vLLM's rule

//! Seeds of case j: each iteration runs one.
constexpr int32_t kCHECKPOINT_SEEDS = 3;
//! The twin's pages (16 tokens each): the running batch fits at its largest and the cache churns.
constexpr int32_t kCHECKPOINT_TWIN_PAGES = 16'384;

//! state_prefix/SLOTS/INTERVAL: one iteration runs the workload of state_checkpoint_sim.cpp with one seed on the
//! full-attention twin, on the attention-only cache, on the model with SLOTS checkpoint slots under PageManager's
//! boundaries (and one every INTERVAL pages), and on the same model under vLLM's rule, all in the twin's bytes. Hit
//! rates are adopted tokens over prompt tokens offered after warm-up, summed over the iterations; adopt_ns is the mean
//! time of one adoptPrefix() call.
void statePrefix(benchmark::State& state, int32_t checkpointSlots, int32_t intervalPages)
{
    guarded(state,
        [&]
        {
            constexpr std::array<CheckpointRule, 4> kRULES = {CheckpointRule::kTWIN, CheckpointRule::kATTENTION_ONLY,
                CheckpointRule::kKVCACHE, CheckpointRule::kVLLM_BLOCKS};
            std::array<rt::KVCacheConfig, 4> configs;
            for (size_t r = 0; r < kRULES.size(); ++r)
            {
                configs[r] = checkpointConfig(kRULES[r], checkpointSlots, kCHECKPOINT_TWIN_PAGES);
            }
            std::array<CheckpointRunResult, 4> totals{};
            uint64_t seed = 1;
            for (auto _ : state)
            {
                double nanoseconds = 0;
                std::array<CheckpointRunResult, 4> runs{};
                for (size_t r = 0; r < kRULES.size(); ++r)
                {
                    runs[r] = runCheckpointWorkload(configs[r], kRULES[r], intervalPages, seed);
                    check(runs[r].offeredTokens == runs[0].offeredTokens && runs[r].admitted == runs[0].admitted,
                        "the caches were offered different prompts");
                    check(runs[r].bytes <= runs[0].bytes,
                        "a cache takes " + std::to_string(runs[r].bytes) + " bytes, more than the twin's "
                            + std::to_string(runs[0].bytes));
                    CheckpointRunResult& total = totals[r];
                    total.offeredTokens += runs[r].offeredTokens;
                    total.adoptedTokens += runs[r].adoptedTokens;
                    total.admitted += runs[r].admitted;
                    total.adoptNanoseconds += runs[r].adoptNanoseconds;
                    total.adoptCalls += runs[r].adoptCalls;
                    total.checkpointsSaved += runs[r].checkpointsSaved;
                    total.checkpointsRestored += runs[r].checkpointsRestored;
                    total.checkpointsDropped += runs[r].checkpointsDropped;
                    total.numPages = runs[r].numPages;
                    nanoseconds += runs[r].adoptNanoseconds;
                }
                ++seed;
                state.SetIterationTime(nanoseconds * 1e-9);
            }
            auto rate = [](CheckpointRunResult const& r) {
                return static_cast<double>(r.adoptedTokens)
                    / static_cast<double>(std::max<int64_t>(r.offeredTokens, 1));
            };
            auto adoptNs = [](CheckpointRunResult const& r)
            { return r.adoptNanoseconds / static_cast<double>(std::max<int64_t>(r.adoptCalls, 1)); };
            char const* const names[] = {"twin", "attention", "kvcache", "vllm"};
            for (size_t r = 0; r < totals.size(); ++r)
            {
                std::string const name = names[r];
                state.counters[name + "_hit_rate"] = rate(totals[r]);
                state.counters[name + "_adopt_ns"] = adoptNs(totals[r]);
                state.counters[name + "_pages"] = static_cast<double>(totals[r].numPages);
                if (r > 0)
                {
                    state.counters[name + "_over_twin"] = rate(totals[r]) / std::max(rate(totals[0]), 1e-12);
                }
                if (r > 1)
                {
                    state.counters[name + "_saved"] = static_cast<double>(totals[r].checkpointsSaved);
                    state.counters[name + "_restored"] = static_cast<double>(totals[r].checkpointsRestored);
                    state.counters[name + "_dropped"] = static_cast<double>(totals[r].checkpointsDropped);
                }
            }
            state.counters["kvcache_adopt_over_attention"] = adoptNs(totals[2]) / std::max(adoptNs(totals[1]), 1e-12);
            state.counters["admitted"] = static_cast<double>(totals[0].admitted);
            state.counters["vllm_block_tokens"] = static_cast<double>(vllmBlockTokens());
        });
}

} // namespace

void registerServingCases()
{
    for (HybridModelShape const& shape : {kGPT_OSS_LIKE, kGEMMA3_LIKE})
    {
        for (auto const& [splitName, split] : {std::pair{"split_budget", HybridSplit::kSPLIT_BUDGET},
                 std::pair{"minimum_windowed", HybridSplit::kMINIMUM_WINDOWED}})
        {
            for (int32_t const tokensPerPage : {16, 128})
            {
                std::string const name =
                    std::string("hybrid_prefix/") + shape.name + "/" + splitName + "/" + std::to_string(tokensPerPage);
                benchmark::RegisterBenchmark(name.c_str(), hybridPrefix, shape, split, tokensPerPage)
                    ->UseManualTime()
                    ->Iterations(kHYBRID_SEEDS)
                    ->Unit(benchmark::kMillisecond);
            }
        }
    }
    for (int32_t const spare : {40, 80})
    {
        benchmark::RegisterBenchmark(("hot_prefix/" + std::to_string(spare)).c_str(), hotPrefix, spare)
            ->UseManualTime()
            ->Iterations(kHYBRID_SEEDS)
            ->Unit(benchmark::kMillisecond);
    }
    for (int32_t const slots : {64, 128, 256, 384})
    {
        for (int32_t const interval : {0, 32})
        {
            std::string const name = "state_prefix/" + std::to_string(slots) + "/" + std::to_string(interval);
            benchmark::RegisterBenchmark(name.c_str(), statePrefix, slots, interval)
                ->UseManualTime()
                ->Iterations(kCHECKPOINT_SEEDS)
                ->Unit(benchmark::kMillisecond);
        }
    }
}

} // namespace kvcache::bench
