#pragma once

// The measurement machinery of the host tier benchmark: its geometry, median timing behind a spin kernel, scattered
// entry lists, the rate rows (offload or onboard by each method against one contiguous cudaMemcpyAsync of the same
// bytes) and the one-off round-trip check. The rows themselves are in bench_host_tier.cu.

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/tiers/host_tier.h"

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "support/cuda_raii.h"

namespace kvcache::bench
{

//! The geometry every row measures: 32 layers of 8 KV heads x 128, 16 tokens a page, K and V, kPAGES device pages
//! per half and layer, kHOST_PAGES host pages.
constexpr int32_t kLAYERS = 32;
constexpr int32_t kTIER_TOKENS_PER_PAGE = 16;
constexpr int32_t kPAGES = 1024;
constexpr int32_t kHOST_PAGES = 512;
//! The largest list a row moves; the contiguous baseline's buffers are this many host pages.
constexpr int32_t kMAX_COUNT = 256;

//! About a millisecond of spinning: longer than any call here takes to enqueue.
constexpr long long kSPIN_CYCLES = 2'000'000;

//! Sets the timed repetitions of every median (--reps); at least 1.
void setRepetitions(int32_t reps);
//! Returns the timed repetitions of every median (20 unless set).
int32_t repetitions();

//! Enqueues a one-thread kernel that spins `cycles` clock cycles on `stream`.
void enqueueSpin(cudaStream_t stream, long long cycles);

//! Returns the median seconds of the repetitions of `enqueue` on `stream`, each timed with events, after two untimed
//! ones. A spin kernel ahead of the start event keeps the stream busy while the host enqueues, so the events time the
//! GPU's work alone, not the host's (host time is reported apart).
double medianSeconds(cudaStream_t stream, std::function<void()> const& enqueue);

//! Times `first` and `second` in turns (each after the spin, as medianSeconds) and returns their median seconds.
std::array<double, 2> medianTurns(
    cudaStream_t stream, std::function<void()> const& first, std::function<void()> const& second);

//! Returns the config of the benchmark's geometry with `type` values under `quantization`.
rt::KVCacheConfig tierConfig(rt::DataType type, rt::KVQuantization quantization);

//! Returns `count` entries of distinct pages of [0, kPAGES) and distinct host pages of [0, kHOST_PAGES), both in a
//! pseudo-random order fixed by `seed`.
std::vector<rt::HostTierEntry> scatteredEntries(int32_t count, uint32_t seed);

//! Returns "kernel", "copy_engine" or "auto".
char const* methodName(rt::HostTierMethod method);

//! A device buffer and a pinned buffer of kMAX_COUNT host pages each: the contiguous baseline's ends, and where the
//! check gathers device pages.
struct ContiguousBuffers
{
    explicit ContiguousBuffers(int64_t hostPageBytes);

    int64_t bytes;
    test::DeviceArray<char> device;
    test::PinnedHostBuffer pinned;
};

//! Enqueues one cudaMemcpyAsync of `bytes` between the buffers on `stream`, device to host (`toHost`) or host to
//! device: the contiguous baseline.
void enqueueContiguous(cudaStream_t stream, ContiguousBuffers& buffers, bool toHost, int64_t bytes);

//! Returns the median seconds of one enqueueContiguous.
double contiguousSeconds(cudaStream_t stream, ContiguousBuffers& buffers, bool toHost, int64_t bytes);

//! Times an offload (`toHost`) or onboard of `entries` by the copy engine and by the kernel, each in turns with the
//! contiguous copy of the same bytes, prints one line a method, `<prefix><direction>/<method>/<count>: <GB/s>,
//! contiguous <GB/s>, ratio <contiguous seconds / seconds>` (medians), and, with `hostEnqueue`, the host's median time
//! to enqueue a call. Returns the median seconds of the copy engine [0] and of the kernel [1].
std::array<double, 2> measureRates(std::string const& prefix, rt::HostTier& tier, rt::KVCacheManager const& cache,
    std::vector<rt::HostTierEntry> const& entries, bool toHost, ContiguousBuffers& buffers, cudaStream_t stream,
    bool hostEnqueue);

//! Fills every byte of `cache`'s data and scale pools with a hash of its layer, pool and offset, so that K, V and their
//! scales all differ and checkRoundTrip knows every byte without a copy of the cache.
void fillHashed(rt::KVCacheManager const& cache, cudaStream_t stream);

//! Checks one round trip by `method` of the pages and host pages of `entries` (after fillHashed), bit for bit, data
//! and scales: poisons the host pages, offloads, compares every host page with the page's bytes laid out as
//! docs/layout.md says (test::pageSegments' order); then resets the pages to a poison pattern (data and scales),
//! onboards, gathers every page's segments into `buffers.pinned` and compares them again. Throws std::runtime_error
//! naming the host page or page, the layer and the part (K, V, K scales, V scales) that holds the wrong bytes.
void checkRoundTrip(rt::HostTier& tier, rt::KVCacheManager const& cache, std::vector<rt::HostTierEntry> const& entries,
    rt::HostTierMethod method, ContiguousBuffers& buffers, cudaStream_t stream);

//! The tiered prefix cache's onboard rows (tiered_onboard_rows.cu): an admission from the host tier against the host
//! tier's own onboard of the same pages, after a bitwise check. Throws std::runtime_error when the check fails.
void tieredRows();

} // namespace kvcache::bench
