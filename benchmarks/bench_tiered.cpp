// The tiered prefix cache's bookkeeping on the host (src/tiers/tiered/tiered_prefix_cache_core.h), no GPU:
//   g. tiered_hit_rate/hostNx/P: the prefix hit rate of device pages plus a host tier N times as large (4, 1, 0.25) on
//   the serving workload of
//      serving_workload.cpp, against the device cache alone, a PageManager of the combined capacity and an independent
//      LRU prefix cache of the combined capacity (tiered_serving_sim.cpp);
//   h. tiered_admit/HASH/16: an admission that onboards an 8192-token prompt from the host tier (adoptPrefix's miss,
//      hashNextPages, the host lookups, the run's adoption), against adoptPrefix of the same prompt cached on the
//      device, and against an admission that computes the prompt (adoptPrefix's miss + append), timed alternately in
//      one loop;
//   i. tiered_hybrid/hostNx/MODEL/SPLIT/P: case f's hybrid models and their full-attention twins, each on the device
//      alone and with host tiers N times each group's pages (4, 0.25): the hybrid's tiered hit rate against the twin's;
//   j. tiered_disk_page/32x8x128/16: a disk tier page's file written and read back on this machine, against plain
//      stdio of the same bytes.
// Transfers go to a mover that moves no bytes: what is timed is the decisions, not PCIe (for that, bench_host_tier).
// A case whose check fails stops with an error and makes the process exit 1. See docs/benchmarks.md.

#include "bench_main.h"
#include "tiered_serving_sim.h"
#include "tiers/tiered/tiered_prefix_cache_core.h"

#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/core/page_geometry.h"
#include "kvcache/paging/page_manager.h"
#include "kvcache/tiers/sequence_file.h"

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kvcache::bench
{
namespace
{

using Clock = std::chrono::steady_clock;

//! Case g's seeds: each iteration runs one.
constexpr int32_t kSEEDS = 5;
//! Case h's prompt, pages and prefill chunk (servingPoolConfig's maxTokensPerStep).
constexpr int32_t kPROMPT_TOKENS = kSERVING_MAX_LENGTH;
constexpr int32_t kADMIT_TOKENS_PER_PAGE = 16;
constexpr int32_t kADMIT_CHUNK = kSERVING_CHUNK;
constexpr int32_t kADMIT_POOL_PAGES = 2048;

double rate(int64_t found, int64_t offered)
{
    return static_cast<double>(found) / static_cast<double>(std::max<int64_t>(offered, 1));
}

void addRun(ServingResult& total, ServingResult const& run)
{
    total.offeredTokens += run.offeredTokens;
    total.deviceTokens += run.deviceTokens;
    total.hostTokens += run.hostTokens;
    for (size_t k = 0; k < run.offeredByKind.size(); ++k)
    {
        total.offeredByKind[k] += run.offeredByKind[k];
        total.hitByKind[k] += run.hitByKind[k];
    }
    total.admitted += run.admitted;
    total.nanoseconds += run.nanoseconds;
}

//! Adds every counter of `run` to `total`.
void addStats(rt::TieredPrefixCacheStats& total, rt::TieredPrefixCacheStats const& run)
{
    total.admissions += run.admissions;
    total.queryTokens += run.queryTokens;
    total.deviceHitTokens += run.deviceHitTokens;
    total.hostHitTokens += run.hostHitTokens;
    total.missedTokens += run.missedTokens;
    total.offloadedPages += run.offloadedPages;
    total.alreadyOnHostPages += run.alreadyOnHostPages;
    total.droppedPages += run.droppedPages;
    total.evictedHostPages += run.evictedHostPages;
    total.onboardedPages += run.onboardedPages;
    total.spilledPages += run.spilledPages;
    total.alreadyOnDiskPages += run.alreadyOnDiskPages;
    total.evictedDiskPages += run.evictedDiskPages;
    total.restoredPages += run.restoredPages;
    total.diskFailures += run.diskFailures;
}

//! Runs `runOne(seed)` once an iteration, seeds 1, 2, ..., each iteration timed by its result `timed`; returns the last
//! run with the results `served` and the statistics `stats` summed over every run (its page counts are every run's).
template <typename Result, typename RunOne>
Result summedOverSeeds(benchmark::State& state, RunOne&& runOne, ServingResult Result::*timed,
    std::initializer_list<ServingResult Result::*> served,
    std::initializer_list<rt::TieredPrefixCacheStats Result::*> stats)
{
    Result total;
    uint64_t seed = 1;
    for (auto _ : state)
    {
        Result run = runOne(seed++);
        state.SetIterationTime((run.*timed).nanoseconds * 1e-9);
        for (ServingResult Result::*const member : served)
        {
            addRun(run.*member, total.*member);
        }
        for (rt::TieredPrefixCacheStats Result::*const member : stats)
        {
            addStats(run.*member, total.*member);
        }
        total = std::move(run);
    }
    return total;
}

// Case g

//! tiered_hit_rate/P: one iteration runs one seed on the four caches; hit rates are summed over the iterations.
void tieredHitRate(benchmark::State& state, int32_t tokensPerPage, int32_t hostQuarters, int32_t diskQuarters)
{
    guarded(state,
        [&]
        {
            TieredRunResult const total = summedOverSeeds(state,
                [&](uint64_t seed) { return runTieredWorkload(tokensPerPage, hostQuarters, diskQuarters, seed); },
                &TieredRunResult::tiered,
                {&TieredRunResult::device, &TieredRunResult::tiered, &TieredRunResult::combined,
                    &TieredRunResult::oracle},
                {&TieredRunResult::tieredStats});
            auto const hits = [](ServingResult const& r) { return r.deviceTokens + r.hostTokens; };
            int64_t const offered = total.device.offeredTokens;
            double const oracle = rate(hits(total.oracle), offered);
            state.counters["device_hit_rate"] = rate(hits(total.device), offered);
            state.counters["tiered_hit_rate"] = rate(hits(total.tiered), offered);
            state.counters["tiered_device_hit_rate"] = rate(total.tiered.deviceTokens, offered);
            state.counters["tiered_host_hit_rate"] = rate(total.tiered.hostTokens, offered);
            state.counters["combined_hit_rate"] = rate(hits(total.combined), offered);
            state.counters["oracle_hit_rate"] = oracle;
            state.counters["tiered_over_oracle"] = rate(hits(total.tiered), offered) / std::max(oracle, 1e-12);
            char const* const kinds[] = {"new", "repeat", "follow_up"};
            for (size_t k = 0; k < 3; ++k)
            {
                std::string const kind = kinds[k];
                int64_t const byKind = total.device.offeredByKind[k];
                state.counters["device_hit_rate_" + kind] = rate(total.device.hitByKind[k], byKind);
                state.counters["tiered_hit_rate_" + kind] = rate(total.tiered.hitByKind[k], byKind);
                state.counters["oracle_hit_rate_" + kind] = rate(total.oracle.hitByKind[k], byKind);
            }
            state.counters["admitted"] = static_cast<double>(total.device.admitted);
            state.counters["device_pages"] = static_cast<double>(total.devicePages);
            state.counters["host_pages"] = static_cast<double>(total.hostPages);
            state.counters["disk_pages"] = static_cast<double>(total.diskPages);
            state.counters["spilled"] = static_cast<double>(total.tieredStats.spilledPages);
            state.counters["restored"] = static_cast<double>(total.tieredStats.restoredPages);
            state.counters["offloaded"] = static_cast<double>(total.tieredStats.offloadedPages);
            state.counters["already_on_host"] = static_cast<double>(total.tieredStats.alreadyOnHostPages);
            state.counters["host_evicted"] = static_cast<double>(total.tieredStats.evictedHostPages);
            state.counters["dropped"] = static_cast<double>(total.tieredStats.droppedPages);
            state.counters["onboarded"] = static_cast<double>(total.tieredStats.onboardedPages);
            state.counters["device_ms"] = total.device.nanoseconds * 1e-6;
            state.counters["tiered_ms"] = total.tiered.nanoseconds * 1e-6;
        });
}

// Case i

//! tiered_hybrid/hostNx/MODEL/SPLIT/P: one iteration runs one seed on the four caches.
void tieredHybrid(
    benchmark::State& state, HybridModelShape shape, HybridSplit split, int32_t tokensPerPage, int32_t hostQuarters)
{
    guarded(state,
        [&]
        {
            HybridTieredResult const total = summedOverSeeds(state,
                [&](uint64_t seed) { return runHybridTieredWorkload(shape, split, tokensPerPage, hostQuarters, seed); },
                &HybridTieredResult::hybridTiered,
                {&HybridTieredResult::twinDevice, &HybridTieredResult::twinTiered, &HybridTieredResult::hybridDevice,
                    &HybridTieredResult::hybridTiered},
                {&HybridTieredResult::hybridStats, &HybridTieredResult::twinStats});
            auto const hits = [](ServingResult const& r) { return r.deviceTokens + r.hostTokens; };
            int64_t const offered = total.twinDevice.offeredTokens;
            double const twinTiered = rate(hits(total.twinTiered), offered);
            double const hybridTiered = rate(hits(total.hybridTiered), offered);
            state.counters["twin_device_hit_rate"] = rate(hits(total.twinDevice), offered);
            state.counters["twin_tiered_hit_rate"] = twinTiered;
            state.counters["hybrid_device_hit_rate"] = rate(hits(total.hybridDevice), offered);
            state.counters["hybrid_tiered_hit_rate"] = hybridTiered;
            state.counters["hybrid_tiered_device_share"] = rate(total.hybridTiered.deviceTokens, offered);
            state.counters["hybrid_over_twin_tiered"] = hybridTiered / std::max(twinTiered, 1e-12);
            char const* const kinds[] = {"new", "repeat", "follow_up"};
            for (size_t k = 0; k < 3; ++k)
            {
                int64_t const byKind = total.twinDevice.offeredByKind[k];
                state.counters[std::string("twin_tiered_hit_rate_") + kinds[k]] =
                    rate(total.twinTiered.hitByKind[k], byKind);
                state.counters[std::string("hybrid_tiered_hit_rate_") + kinds[k]] =
                    rate(total.hybridTiered.hitByKind[k], byKind);
            }
            state.counters["twin_pages"] = static_cast<double>(total.twinPages);
            for (size_t g = 0; g < total.hybridPages.size(); ++g)
            {
                state.counters["hybrid_pages_group" + std::to_string(g)] = static_cast<double>(total.hybridPages[g]);
            }
            state.counters["twin_onboarded"] = static_cast<double>(total.twinStats.onboardedPages);
            state.counters["hybrid_onboarded"] = static_cast<double>(total.hybridStats.onboardedPages);
            state.counters["hybrid_host_evicted"] = static_cast<double>(total.hybridStats.evictedHostPages);
        });
}

// Case h

//! A mover that moves nothing, every host page usable.
class NoBytesMover final : public rt::detail::TierMover
{
public:
    int64_t usableHostPages(int32_t) const override
    {
        return kADMIT_POOL_PAGES;
    }
    void offload(int32_t, rt::HostTierEntry const*, int32_t) override
    {
    }
    void onboard(int32_t, rt::HostTierEntry const*, int32_t) override
    {
    }
    void copy(int32_t, rt::PageCopy const*, int32_t) override
    {
    }
    void offloadStates(rt::HostStateEntry const*, int32_t) override
    {
    }
    void onboardStates(rt::HostStateEntry const*, int32_t) override
    {
    }
    void spill(int32_t, int32_t, int32_t, int32_t) override
    {
    }
    void restore(int32_t, int32_t, int32_t, int32_t) override
    {
    }
};

rt::PageManagerOptions admitOptions(rt::PageHashAlgorithm algorithm)
{
    rt::PageManagerOptions options;
    options.maxSequences = 4;
    options.hashAlgorithm = algorithm;
    return options;
}

//! Appends `prompt` to a new sequence in kADMIT_CHUNK pieces through `append` and frees it: its full pages stay
//! cached on the device.
template <typename Append>
void cachePrompt(rt::PageManager& manager, std::vector<int32_t> const& prompt, Append&& append)
{
    rt::SequenceId const sequence = manager.create();
    for (int32_t at = 0; at < kPROMPT_TOKENS; at += kADMIT_CHUNK)
    {
        append(rt::SequenceAppend{sequence, prompt.data() + at, kADMIT_CHUNK});
    }
    manager.free(sequence);
}

//! tiered_admit/HASH/16. Two managers hold the same 8192-token prompt. In `adopt`, its pages are cached on the device;
//! an operation is create() + adoptPrefix() + free(), 511 pages adopted (the last token is left to compute). In
//! `tiered`, the core offloaded every page to its host tier and the device holds none; an operation is create() +
//! TieredPrefixCacheCore::admit() + free(): adoptPrefix's miss, the hashes of the 511 pages, their host lookups and
//! pins, the run's adoption (each page looked up on the device, taken and registered under the lookup's hash) and the
//! onboard lists. The pages the tiered operation left cached on the device are evicted again, untimed (they are on the
//! host already: nothing is copied), so every iteration starts from the same state. `computed` times the admission
//! without a second tier, the floor of any admission that does not adopt: create() + adoptPrefix() (a miss) + append()
//! of the same 8176 tokens in 2048-token chunks + free(), its pages evicted untimed. The three operations alternate in
//! one loop, so the machine's noise falls on all.
void tieredAdmit(benchmark::State& state, rt::PageHashAlgorithm algorithm)
{
    guarded(state,
        [&]
        {
            std::mt19937_64 rng(11);
            std::uniform_int_distribution<int32_t> token(0, 151'935);
            std::vector<int32_t> prompt(kPROMPT_TOKENS);
            for (int32_t& id : prompt)
            {
                id = token(rng);
            }
            int32_t const expected = (kPROMPT_TOKENS - 1) / kADMIT_TOKENS_PER_PAGE * kADMIT_TOKENS_PER_PAGE;
            int32_t const pages = expected / kADMIT_TOKENS_PER_PAGE;

            rt::PageManager adopt(
                servingPoolConfig(kADMIT_TOKENS_PER_PAGE, kADMIT_POOL_PAGES), admitOptions(algorithm));
            cachePrompt(adopt, prompt, [&](rt::SequenceAppend const& a) { adopt.append(a); });

            rt::PageManager tiered(
                servingPoolConfig(kADMIT_TOKENS_PER_PAGE, kADMIT_POOL_PAGES), admitOptions(algorithm));
            NoBytesMover mover;
            rt::detail::TieredPrefixCacheCore core(tiered, {kADMIT_POOL_PAGES});
            cachePrompt(tiered, prompt, [&](rt::SequenceAppend const& a) { core.step(mover, &a, 1); });
            core.evictCached(mover, 0, kADMIT_POOL_PAGES);
            check(core.hostMap(0).size() == kPROMPT_TOKENS / kADMIT_TOKENS_PER_PAGE,
                "the host tier holds " + std::to_string(core.hostMap(0).size()) + " pages");

            // The cost of the same admission with no second tier: adoptPrefix misses and the runtime appends (and
            // computes) the tokens; the tiered admission appends the same pages, so this part of it is no overhead.
            rt::PageManager computed(
                servingPoolConfig(kADMIT_TOKENS_PER_PAGE, kADMIT_POOL_PAGES), admitOptions(algorithm));

            double adoptNanoseconds = 0;
            double tieredNanoseconds = 0;
            double computedNanoseconds = 0;
            for (auto _ : state)
            {
                Clock::time_point const adoptStart = Clock::now();
                rt::SequenceId const a = adopt.create();
                int32_t const adopted = adopt.adoptPrefix(a, prompt.data(), kPROMPT_TOKENS);
                adopt.free(a);
                Clock::time_point const tieredStart = Clock::now();
                rt::SequenceId const t = tiered.create();
                rt::TieredAdmission const admission = core.admit(mover, t, prompt.data(), kPROMPT_TOKENS, nullptr, 0);
                tiered.free(t);
                Clock::time_point const computedStart = Clock::now();
                rt::SequenceId const c = computed.create();
                int32_t const missed = computed.adoptPrefix(c, prompt.data(), kPROMPT_TOKENS);
                for (int32_t at = 0; at < expected; at += kADMIT_CHUNK)
                {
                    computed.append(rt::SequenceAppend{c, prompt.data() + at, std::min(kADMIT_CHUNK, expected - at)});
                }
                computed.free(c);
                Clock::time_point const end = Clock::now();
                adoptNanoseconds += std::chrono::duration<double, std::nano>(tieredStart - adoptStart).count();
                tieredNanoseconds += std::chrono::duration<double, std::nano>(computedStart - tieredStart).count();
                computedNanoseconds += std::chrono::duration<double, std::nano>(end - computedStart).count();
                state.PauseTiming();
                check(adopted == expected, "adoptPrefix found " + std::to_string(adopted) + " tokens");
                check(admission.deviceTokens == 0 && admission.hostTokens == expected,
                    "admit found " + std::to_string(admission.deviceTokens) + " tokens on the device and "
                        + std::to_string(admission.hostTokens) + " on the host");
                int32_t const evicted = core.evictCached(mover, 0, kADMIT_POOL_PAGES);
                check(evicted == pages, "the admission left " + std::to_string(evicted) + " pages cached");
                check(missed == 0 && computed.evictCached(0, kADMIT_POOL_PAGES) == pages,
                    "the computed admission found " + std::to_string(missed) + " tokens or left other than "
                        + std::to_string(pages) + " pages cached");
                state.ResumeTiming();
            }
            double const iterations = static_cast<double>(state.iterations());
            state.counters["adopt_ns_per_op"] = adoptNanoseconds / iterations;
            state.counters["tiered_ns_per_op"] = tieredNanoseconds / iterations;
            state.counters["tiered_ns_per_page"] = tieredNanoseconds / (iterations * pages);
            state.counters["computed_ns_per_op"] = computedNanoseconds / iterations;
            state.counters["tiered_over_adopt"] = tieredNanoseconds / adoptNanoseconds;
            state.counters["tiered_over_computed"] = tieredNanoseconds / computedNanoseconds;
            core.checkInvariants();
            tiered.checkInvariants();
            adopt.checkInvariants();
            computed.checkInvariants();
            check(core.stats().offloadedPages == pages + 1,
                "pages were copied to the host again: " + std::to_string(core.stats().offloadedPages) + " offloads");
        });
}

// Case j

//! Writes `bytes` bytes at `data` to a new file `path` with stdio (no checksum, no fsync) and reads them back into
//! `out`; returns the two times in microseconds.
std::pair<double, double> plainFile(std::string const& path, char const* data, char* out, size_t bytes)
{
    auto const t0 = Clock::now();
    std::FILE* file = std::fopen(path.c_str(), "wb");
    check(file != nullptr && std::fwrite(data, 1, bytes, file) == bytes, "cannot write " + path);
    check(std::fclose(file) == 0, "cannot close " + path);
    auto const t1 = Clock::now();
    file = std::fopen(path.c_str(), "rb");
    check(file != nullptr && std::fread(out, 1, bytes, file) == bytes, "cannot read " + path);
    std::fclose(file);
    auto const t2 = Clock::now();
    return {std::chrono::duration<double, std::micro>(t1 - t0).count(),
        std::chrono::duration<double, std::micro>(t2 - t1).count()};
}

//! tiered_disk_page/32x8x128/16: what the disk tier does a page on this machine's temporary directory: a one-page
//! sequence file written (a spill: checksums, write, fsync, rename) and read back (a restore: read, checks, copy), a
//! float16 page of 32 layers of 8 x 128 at 16 tokens (2 MiB), against a plain stdio write and read of the same bytes to
//! one file (the file system's own cost), alternately in one loop. Every read is checked against the page.
void diskPage(benchmark::State& state)
{
    guarded(state,
        [&]
        {
            rt::KVCacheConfig config;
            config.numAttentionLayers = 32;
            config.maxBatchSize = 1;
            config.maxSequenceLength = kSERVING_MAX_LENGTH;
            config.tokensPerPage = 16;
            config.layerConfigs.assign(32, rt::KVLayerConfig{8, 128});
            rt::PageGeometry const geometry = rt::pageGeometry(rt::computeLayout(config), 0);
            auto const bytes = static_cast<size_t>(geometry.bytesPerPage);
            std::vector<char> page(bytes);
            std::mt19937_64 rng(5);
            for (char& byte : page)
            {
                byte = static_cast<char>(rng());
            }
            std::vector<char> back(bytes);
            std::filesystem::path const directory =
                std::filesystem::temp_directory_path() / ("kvcache-bench-disk-" + std::to_string(::getpid()));
            std::filesystem::create_directories(directory);
            std::string const file = (directory / "page.kvseq").string();
            std::string const plain = (directory / "page.raw").string();
            void const* written[] = {page.data()};
            void* read[] = {back.data()};
            double fileWrite = 0;
            double fileRead = 0;
            double plainWrite = 0;
            double plainRead = 0;
            for (auto _ : state)
            {
                auto const t0 = Clock::now();
                rt::writeSequenceFile(file, geometry, 16, written, 1);
                auto const t1 = Clock::now();
                std::memset(back.data(), 0, bytes);
                auto const t2 = Clock::now();
                rt::readSequenceFile(file, geometry, read, 1);
                auto const t3 = Clock::now();
                check(std::memcmp(back.data(), page.data(), bytes) == 0, "the page file read back other bytes");
                fileWrite += std::chrono::duration<double, std::micro>(t1 - t0).count();
                fileRead += std::chrono::duration<double, std::micro>(t3 - t2).count();
                std::memset(back.data(), 0, bytes);
                auto const [writeUs, readUs] = plainFile(plain, page.data(), back.data(), bytes);
                check(std::memcmp(back.data(), page.data(), bytes) == 0, "the plain file read back other bytes");
                plainWrite += writeUs;
                plainRead += readUs;
                state.SetIterationTime(std::chrono::duration<double>(t1 - t0 + (t3 - t2)).count());
            }
            std::filesystem::remove_all(directory);
            double const n = static_cast<double>(state.iterations());
            state.counters["page_bytes"] = static_cast<double>(bytes);
            state.counters["file_write_us"] = fileWrite / n;
            state.counters["file_read_us"] = fileRead / n;
            state.counters["plain_write_us"] = plainWrite / n;
            state.counters["plain_read_us"] = plainRead / n;
            state.counters["file_write_GBps"] = static_cast<double>(bytes) * n / fileWrite * 1e-3;
            state.counters["file_read_GBps"] = static_cast<double>(bytes) * n / fileRead * 1e-3;
        });
}

void registerAll()
{
    // Host tiers 4x the device pool (the reference setting), 1x and 0.25x: this workload's reuse fits in about twice the
    // device pool, so only the smaller tiers churn and let the host tier's LRU order decide what is found; the 0.25x
    // tier with a disk tier of 4x behind it.
    struct Tiers
    {
        char const* name;
        int32_t hostQuarters;
        int32_t diskQuarters;
    };
    for (Tiers const tiers :
        {Tiers{"host4x", 16, 0}, Tiers{"host1x", 4, 0}, Tiers{"host0.25x", 1, 0}, Tiers{"host0.25x_disk4x", 1, 16}})
    {
        for (int32_t const tokensPerPage : {16, 128})
        {
            std::string const name = std::string("tiered_hit_rate/") + tiers.name + "/" + std::to_string(tokensPerPage);
            benchmark::RegisterBenchmark(
                name.c_str(), tieredHitRate, tokensPerPage, tiers.hostQuarters, tiers.diskQuarters)
                ->UseManualTime()
                ->Iterations(kSEEDS)
                ->Unit(benchmark::kMillisecond);
        }
    }
    for (auto const& [hostName, hostQuarters] : {std::pair{"host4x", 16}, std::pair{"host0.25x", 1}})
    {
        for (HybridModelShape const& shape : {kGPT_OSS_LIKE, kGEMMA3_LIKE})
        {
            for (auto const& [splitName, split] : {std::pair{"split_budget", HybridSplit::kSPLIT_BUDGET},
                     std::pair{"minimum_windowed", HybridSplit::kMINIMUM_WINDOWED}})
            {
                for (int32_t const tokensPerPage : {16, 128})
                {
                    std::string const name = std::string("tiered_hybrid/") + hostName + "/" + shape.name + "/"
                        + splitName + "/" + std::to_string(tokensPerPage);
                    benchmark::RegisterBenchmark(name.c_str(), tieredHybrid, shape, split, tokensPerPage, hostQuarters)
                        ->UseManualTime()
                        ->Iterations(kSEEDS)
                        ->Unit(benchmark::kMillisecond);
                }
            }
        }
    }
    benchmark::RegisterBenchmark("tiered_disk_page/32x8x128/16", diskPage)
        ->UseManualTime()
        ->Iterations(50)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("tiered_admit/sha256/16", tieredAdmit, rt::PageHashAlgorithm::kSHA256)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("tiered_admit/xxh3_128/16", tieredAdmit, rt::PageHashAlgorithm::kXXH3_128)
        ->Unit(benchmark::kMicrosecond);
}

} // namespace
} // namespace kvcache::bench

int main(int argc, char** argv)
{
    return kvcache::bench::runBenchmarks(argc, argv, "kvcache-bench-tiered", kvcache::bench::registerAll);
}
