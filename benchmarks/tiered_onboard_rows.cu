// The tiered prefix cache's onboard path on the GPU: TieredPrefixCache::admit() of a prompt whose pages are all on the
// host tier, timed from the call to the stream's end (the adoption's bookkeeping, the host lookups, the onboard list
// and the transfers), against HostTier::onboard() of the same host pages into the same device pages by the same tier
// (the link as the host tier measures it), timed the same way and alternated with it in one loop. Rows
// `tiered/admit/<pages>` for 8, 64 and 256 pages of the host tier benchmark's geometry (2 MiB a page). Before timing,
// the first admission is checked: the cache is filled with hashed bytes, the prompt's pages are copied out (K and V of
// the first and the last layer), evicted to the host, every device page is poisoned, and the admitted pages must hold
// the copied bytes again.

#include "host_tier_harness.h"

#include "kvcache/core/errors.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/paging/page_manager.h"
#include "kvcache/tiers/tiered_prefix_cache.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/cuda_raii.h"

namespace kvcache::bench
{
namespace
{

using Clock = std::chrono::steady_clock;

//! What every device page is reset to before the checked admission.
constexpr uint32_t kPOISON = 0xA5A5A5A5U;
//! Pages a prompt's run holds in each row.
constexpr int32_t kRUN_PAGES[] = {8, 64, 256};

void check(bool condition, std::string const& what)
{
    if (!condition)
    {
        throw std::runtime_error("tiered/admit: " + what);
    }
}

//! K and V of the first and the last layer of each page, concatenated: the bytes the check compares.
std::vector<uint8_t> sampledBytes(
    rt::KVCacheManager const& cache, int32_t const* pages, int32_t count, cudaStream_t stream)
{
    std::vector<uint8_t> bytes;
    for (int32_t const layer : {0, kLAYERS - 1})
    {
        int64_t const pageBytes = cache.layout().layers[static_cast<size_t>(layer)].pageBytes;
        for (void const* pool : {cache.kPoolPtr(layer), cache.vPoolPtr(layer)})
        {
            for (int32_t i = 0; i < count; ++i)
            {
                std::vector<uint8_t> const part =
                    test::downloadBytes(static_cast<char const*>(pool) + pages[i] * pageBytes, pageBytes, stream);
                bytes.insert(bytes.end(), part.begin(), part.end());
            }
        }
    }
    return bytes;
}

double seconds(Clock::time_point start, Clock::time_point end)
{
    return std::chrono::duration<double>(end - start).count();
}

double median(std::vector<double> values)
{
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
}

void tieredRow(int32_t runPages)
{
    test::CudaStream stream;
    rt::KVCacheManager cache(tierConfig(rt::DataType::kHALF, rt::KVQuantization::kNONE), stream.get());
    rt::PageManager manager(cache.layout());
    rt::TieredPrefixCacheOptions options;
    options.numHostPages = {kHOST_PAGES};
    rt::TieredPrefixCache tiered(cache, manager, options);
    tiered.hostTier(0).waitUntilReady();
    int64_t const hostPageBytes = tiered.hostTier(0).hostPageBytes();

    // One token past the run's pages: an admission leaves the last prompt token to compute.
    std::vector<int32_t> prompt(static_cast<size_t>(runPages * kTIER_TOKENS_PER_PAGE + 1));
    std::iota(prompt.begin(), prompt.end(), 1000 * runPages);
    auto const count = static_cast<int32_t>(prompt.size());

    fillHashed(cache, stream.get());
    rt::SequenceId const writer = manager.create();
    rt::SequenceAppend const append{writer, prompt.data(), count};
    tiered.step(&append, 1, stream.get());
    rt::SequencePages const written = manager.pages(writer, 0);
    std::vector<uint8_t> const expected = sampledBytes(cache, written.pages, runPages, stream.get());
    manager.free(writer);
    tiered.evictCached(0, kPAGES, stream.get());
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    check(tiered.numHostPagesHeld(0) == runPages,
        "the host tier holds " + std::to_string(tiered.numHostPagesHeld(0)) + " pages, not "
            + std::to_string(runPages));

    std::vector<int32_t> all(kPAGES);
    std::iota(all.begin(), all.end(), 0);
    rt::resetPages(cache, all, stream.get(), kPOISON);

    // The same copies for the baseline: the run's host pages, found by the prompt's hashes, into the admitted pages.
    std::vector<rt::PageHash> hashes(static_cast<size_t>(runPages));
    rt::SequenceId const probe = manager.create();
    manager.hashNextPages(probe, prompt.data(), count, hashes.data());
    manager.free(probe);

    std::vector<rt::HostTierEntry> entries;
    std::vector<double> admitSeconds;
    std::vector<double> onboardSeconds;
    int32_t const reps = repetitions() + 2;
    for (int32_t r = 0; r < reps; ++r)
    {
        rt::SequenceId const sequence = manager.create();
        Clock::time_point const admitStart = Clock::now();
        rt::TieredAdmission const admission = tiered.admit(sequence, prompt.data(), count, stream.get());
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream.get()));
        Clock::time_point const admitEnd = Clock::now();
        check(admission.deviceTokens == 0 && admission.hostTokens == runPages * kTIER_TOKENS_PER_PAGE,
            "admit found " + std::to_string(admission.deviceTokens) + " tokens on the device and "
                + std::to_string(admission.hostTokens) + " on the host");
        rt::SequencePages const admitted = manager.pages(sequence, 0);
        if (r == 0)
        {
            check(sampledBytes(cache, admitted.pages, runPages, stream.get()) == expected,
                "the admitted pages do not hold the bytes their prompt's pages held before eviction");
            for (int32_t i = 0; i < runPages; ++i)
            {
                int32_t const hostPage = tiered.findHostPage(0, hashes[static_cast<size_t>(i)]);
                check(hostPage >= 0, "no host page holds page " + std::to_string(i) + "'s hash");
                entries.push_back({admitted.pages[i], hostPage});
            }
        }
        Clock::time_point const onboardStart = Clock::now();
        tiered.hostTier(0).onboard(cache, entries, stream.get());
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream.get()));
        Clock::time_point const onboardEnd = Clock::now();
        if (r >= 2)
        {
            admitSeconds.push_back(seconds(admitStart, admitEnd));
            onboardSeconds.push_back(seconds(onboardStart, onboardEnd));
        }
        // Back to the start, untimed: the admitted pages are cached on the device once the sequence is freed; their
        // hashes are on the host already, so evicting them copies nothing.
        manager.free(sequence);
        tiered.evictCached(0, kPAGES, stream.get());
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    }
    rt::TieredPrefixCacheStats const stats = tiered.stats();
    check(stats.offloadedPages == runPages,
        "the tier offloaded " + std::to_string(stats.offloadedPages) + " pages; a page came back to the host twice");

    ContiguousBuffers buffers(hostPageBytes);
    double const contiguous = contiguousSeconds(stream.get(), buffers, false, runPages * hostPageBytes);
    double const admit = median(admitSeconds);
    double const onboard = median(onboardSeconds);
    double const bytes = static_cast<double>(runPages * hostPageBytes);
    std::printf("tiered/admit/%d: admit %.1f us (%.2f GB/s), HostTier::onboard of the same pages %.1f us (%.2f GB/s), "
                "ratio %.3f; contiguous cudaMemcpyAsync %.2f GB/s (GPU time); check ok\n",
        runPages, admit * 1e6, bytes / admit * 1e-9, onboard * 1e6, bytes / onboard * 1e-9, onboard / admit,
        bytes / contiguous * 1e-9);
}

} // namespace

void tieredRows()
{
    for (int32_t const runPages : kRUN_PAGES)
    {
        tieredRow(runPages);
    }
}

} // namespace kvcache::bench
