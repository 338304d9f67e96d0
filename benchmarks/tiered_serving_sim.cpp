// Case g: the serving workload of serving_workload.cpp on four caches, one full-attention layer each:
//   - device: a PageManager of kDEVICE_POOL_TOKENS (the hybrid twin's pool of case f: the running batch fits at its
//     largest and the cache churns);
//   - tiered: the same PageManager under TieredPrefixCacheCore, the bookkeeping of TieredPrefixCache, with host tiers
//     of hostQuarters / 4 times the device pool. Its TierMover moves no bytes (host only, no GPU): every decision (what
//     is offloaded, which host page is given up, what an admission onboards) is the class's own;
//   - combined: a PageManager of the device and host pages together, what one tier of the combined capacity keeps;
//   - oracle: LruPrefixOracle below, written from the rule and not from the library: pages keyed by a chained hash,
//     one LRU order over the combined capacity, a prompt hits its longest cached prefix.
// A hit rate is tokens found (adopted, or onboarded) over prompt tokens offered, after warm-up.
// Case i runs the same workload on a hybrid model of case f and on its full-attention twin, each on the device alone
// and under the two tiers (host tiers 4x each group's device pages).

#include "tiered_serving_sim.h"

#include "bench_main.h"
#include "tiers/tiered/tiered_prefix_cache_core.h"

#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/paging/page_manager.h"

#include <array>
#include <list>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvcache::bench
{
namespace
{

constexpr int64_t kDEVICE_POOL_TOKENS = 262'144;

rt::PageManagerOptions managerOptions()
{
    rt::PageManagerOptions options;
    options.maxSequences = kSERVING_RUNNING;
    options.hashAlgorithm = rt::PageHashAlgorithm::kXXH3_128;
    return options;
}

//! A mover that moves nothing: each group's host tier is as large as asked and every host page usable at once. Counts
//! the pages it was asked to move, to check the core's counters against.
class NullMover final : public rt::detail::TierMover
{
public:
    explicit NullMover(std::vector<int64_t> numHostPages)
        : mNumHostPages(std::move(numHostPages))
    {
    }
    int64_t usableHostPages(int32_t group) const override
    {
        return mNumHostPages.at(static_cast<size_t>(group));
    }
    void offload(int32_t, rt::HostTierEntry const*, int32_t count) override
    {
        offloaded += count;
    }
    void onboard(int32_t, rt::HostTierEntry const*, int32_t count) override
    {
        onboarded += count;
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

    int64_t offloaded = 0;
    int64_t onboarded = 0;

private:
    std::vector<int64_t> mNumHostPages;
};

//! The two tiers: admissions through the core (adopt, then onboard), every append through its step() so that the
//! evictions are offloaded; create, length and free on the manager (the runtime's calls).
class TieredServing final : public ServingCache
{
public:
    TieredServing(
        rt::PageManager& manager, std::vector<int64_t> const& numHostPages, std::vector<int64_t> const& numDiskPages)
        : mManager(&manager)
        , mMover(numHostPages)
        , mCore(manager, numHostPages, numDiskPages)
    {
    }
    rt::SequenceId create() override
    {
        return mManager->create();
    }
    ServingHit admit(rt::SequenceId sequence, int32_t const* tokens, int32_t count) override
    {
        rt::TieredAdmission const admission = mCore.admit(mMover, sequence, tokens, count, nullptr, 0);
        return ServingHit{admission.deviceTokens, admission.hostTokens};
    }
    void step(rt::SequenceAppend const* appends, int32_t count) override
    {
        mCore.step(mMover, appends, count);
    }
    int32_t length(rt::SequenceId sequence) const override
    {
        return mManager->length(sequence);
    }
    void free(rt::SequenceId sequence) override
    {
        mManager->free(sequence);
    }
    void measuring() override
    {
        mCore.resetStats();
        mMover.offloaded = 0;
        mMover.onboarded = 0;
    }
    //! Checks the core's invariants and its counters against the mover's; returns the counters.
    rt::TieredPrefixCacheStats checkedStats() const
    {
        mCore.checkInvariants();
        rt::TieredPrefixCacheStats const& stats = mCore.stats();
        check(stats.offloadedPages == mMover.offloaded && stats.onboardedPages == mMover.onboarded,
            "the core counted " + std::to_string(stats.offloadedPages) + " offloaded and "
                + std::to_string(stats.onboardedPages) + " onboarded pages, the mover moved "
                + std::to_string(mMover.offloaded) + " and " + std::to_string(mMover.onboarded));
        return stats;
    }

private:
    rt::PageManager* mManager;
    NullMover mMover;
    rt::detail::TieredPrefixCacheCore mCore;
};

//! The oracle: an LRU prefix cache of `capacity` pages, independent of the library. A full page is keyed by a chained
//! 64-bit hash of its parent's key and its tokens (random tokens, so a collision is beyond reach). Pages that running
//! sequences hold are pinned; the others are kept in one least-recently-used order and the least recent goes when the
//! pages held (each page once, and each running sequence's partial last page) pass the capacity. A prompt hits its
//! longest cached run of whole pages, at most count - 1 tokens (adoptPrefix's rule: the last token is computed). A
//! sequence's pages are released last page first, so that a prefix's first pages are the last to go (a page is of no
//! use without its parents).
class LruPrefixOracle final : public ServingCache
{
public:
    LruPrefixOracle(int32_t tokensPerPage, int64_t capacity)
        : mTokensPerPage(tokensPerPage)
        , mCapacity(capacity)
    {
    }
    rt::SequenceId create() override
    {
        mSequences.emplace(mNextId, Sequence{});
        return mNextId++;
    }
    ServingHit admit(rt::SequenceId sequence, int32_t const* tokens, int32_t count) override
    {
        Sequence& state = mSequences.at(sequence);
        int32_t const maxPages = (count - 1) / mTokensPerPage;
        uint64_t key = kCHAIN_START;
        for (int32_t p = 0; p < maxPages; ++p)
        {
            uint64_t const next = chain(key, tokens + int64_t{p} * mTokensPerPage);
            auto const found = mPages.find(next);
            if (found == mPages.end())
            {
                break;
            }
            hold(found->second);
            state.pages.push_back(next);
            key = next;
        }
        state.key = key;
        state.length = static_cast<int32_t>(state.pages.size()) * mTokensPerPage;
        return ServingHit{state.length, 0};
    }
    void step(rt::SequenceAppend const* appends, int32_t count) override
    {
        for (int32_t i = 0; i < count; ++i)
        {
            Sequence& state = mSequences.at(appends[i].sequence);
            for (int32_t t = 0; t < appends[i].count; ++t)
            {
                mPartialPages += state.tail.empty() ? 1 : 0;
                state.tail.push_back(appends[i].tokens[t]);
                ++state.length;
                if (static_cast<int32_t>(state.tail.size()) == mTokensPerPage)
                {
                    state.key = chain(state.key, state.tail.data());
                    state.tail.clear();
                    --mPartialPages;
                    auto const [entry, added] = mPages.try_emplace(state.key);
                    if (added)
                    {
                        entry->second.key = state.key;
                        entry->second.inLru = false;
                    }
                    hold(entry->second);
                    state.pages.push_back(state.key);
                }
            }
        }
        evictToCapacity();
    }
    int32_t length(rt::SequenceId sequence) const override
    {
        return mSequences.at(sequence).length;
    }
    void free(rt::SequenceId sequence) override
    {
        Sequence& state = mSequences.at(sequence);
        for (auto key = state.pages.rbegin(); key != state.pages.rend(); ++key)
        {
            Page& page = mPages.at(*key);
            if (--page.holders == 0)
            {
                mLru.push_front(page.key);
                page.lruPosition = mLru.begin();
                page.inLru = true;
            }
        }
        mPartialPages -= state.tail.empty() ? 0 : 1;
        mSequences.erase(sequence);
        evictToCapacity();
    }

private:
    static constexpr uint64_t kCHAIN_START = 0x6A09E667F3BCC908ULL;

    struct Page
    {
        uint64_t key = 0;
        int32_t holders = 0;
        bool inLru = false;
        std::list<uint64_t>::iterator lruPosition;
    };
    struct Sequence
    {
        std::vector<uint64_t> pages;
        std::vector<int32_t> tail;
        uint64_t key = kCHAIN_START;
        int32_t length = 0;
    };

    static uint64_t mix(uint64_t z) noexcept
    {
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        return z ^ (z >> 31);
    }
    uint64_t chain(uint64_t parent, int32_t const* tokens) const noexcept
    {
        uint64_t key = mix(parent + 0x9E3779B97F4A7C15ULL);
        for (int32_t t = 0; t < mTokensPerPage; ++t)
        {
            key = mix(key ^ static_cast<uint32_t>(tokens[t]));
        }
        return key;
    }
    void hold(Page& page)
    {
        if (page.inLru)
        {
            mLru.erase(page.lruPosition);
            page.inLru = false;
        }
        ++page.holders;
    }
    void evictToCapacity()
    {
        while (static_cast<int64_t>(mPages.size()) + mPartialPages > mCapacity && !mLru.empty())
        {
            mPages.erase(mLru.back());
            mLru.pop_back();
        }
    }

    int32_t mTokensPerPage;
    int64_t mCapacity;
    std::unordered_map<uint64_t, Page> mPages;
    //! Unheld pages, the most recently released first.
    std::list<uint64_t> mLru;
    std::unordered_map<rt::SequenceId, Sequence> mSequences;
    int64_t mPartialPages = 0;
    rt::SequenceId mNextId = 0;
};

//! Runs the workload on the tiers over a manager made from `config`, each group's host tier hostQuarters / 4 times its
//! device pages and its disk tier diskQuarters / 4 times (none for 0); returns the result and the core's checked
//! counters.
std::pair<ServingResult, rt::TieredPrefixCacheStats> runTiered(
    rt::KVCacheConfig const& config, int32_t hostQuarters, int32_t diskQuarters, uint64_t seed)
{
    rt::PageManager manager(config, managerOptions());
    std::vector<int64_t> hostPages;
    std::vector<int64_t> diskPages;
    for (rt::KVPageGroupLayout const& group : manager.layout().groups)
    {
        hostPages.push_back(int64_t{group.numPages} * hostQuarters / 4);
        if (diskQuarters > 0)
        {
            diskPages.push_back(int64_t{group.numPages} * diskQuarters / 4);
        }
    }
    TieredServing tiered(manager, hostPages, diskPages);
    ServingResult const result = runServingWorkload(tiered, seed);
    rt::TieredPrefixCacheStats const stats = tiered.checkedStats();
    manager.checkInvariants();
    check(stats.deviceHitTokens == result.deviceTokens && stats.hostHitTokens == result.hostTokens,
        "the tiered cache's counters disagree with its admissions");
    return {result, stats};
}

ServingResult runOnManager(int32_t tokensPerPage, int64_t numPages, uint64_t seed)
{
    rt::PageManager manager(servingPoolConfig(tokensPerPage, numPages), managerOptions());
    PageManagerServing serving(manager);
    ServingResult const result = runServingWorkload(serving, seed);
    manager.checkInvariants();
    return result;
}

} // namespace

//! One full-attention layer of `numPages` pages; maxBatchSize 1 keeps the config's minimum pool below it and
//! PageManagerOptions::maxSequences bounds the sequences.
rt::KVCacheConfig servingPoolConfig(int32_t tokensPerPage, int64_t numPages)
{
    rt::KVCacheConfig config;
    config.numAttentionLayers = 1;
    config.maxBatchSize = 1;
    config.maxSequenceLength = kSERVING_MAX_LENGTH;
    config.tokensPerPage = tokensPerPage;
    config.maxTokensPerStep = kSERVING_CHUNK;
    config.layerConfigs = {{8, 128}};
    config.numPages = static_cast<int32_t>(numPages);
    return config;
}

TieredRunResult runTieredWorkload(int32_t tokensPerPage, int32_t hostQuarters, int32_t diskQuarters, uint64_t seed)
{
    TieredRunResult result;
    result.devicePages = kDEVICE_POOL_TOKENS / tokensPerPage;
    result.hostPages = result.devicePages * hostQuarters / 4;
    result.diskPages = result.devicePages * diskQuarters / 4;
    result.device = runOnManager(tokensPerPage, result.devicePages, seed);
    std::tie(result.tiered, result.tieredStats) =
        runTiered(servingPoolConfig(tokensPerPage, result.devicePages), hostQuarters, diskQuarters, seed);
    int64_t const capacity = result.devicePages + result.hostPages + result.diskPages;
    result.combined = runOnManager(tokensPerPage, capacity, seed);
    LruPrefixOracle oracle(tokensPerPage, capacity);
    result.oracle = runServingWorkload(oracle, seed);
    for (ServingResult const* run : {&result.tiered, &result.combined, &result.oracle})
    {
        check(run->offeredTokens == result.device.offeredTokens && run->admitted == result.device.admitted,
            "the caches were offered different prompts");
    }
    return result;
}

HybridTieredResult runHybridTieredWorkload(
    HybridModelShape const& shape, HybridSplit split, int32_t tokensPerPage, int32_t hostQuarters, uint64_t seed)
{
    rt::KVCacheConfig const twin = twinConfig(shape, tokensPerPage);
    rt::KVCacheConfig const hybrid = hybridConfig(shape, tokensPerPage, split, rt::computeLayout(twin).cacheBytes);
    HybridTieredResult result;
    for (auto const& [config, device, tiered, stats] :
        {std::tuple{&twin, &result.twinDevice, &result.twinTiered, &result.twinStats},
            std::tuple{&hybrid, &result.hybridDevice, &result.hybridTiered, &result.hybridStats}})
    {
        rt::PageManager manager(*config, managerOptions());
        PageManagerServing serving(manager);
        *device = runServingWorkload(serving, seed);
        manager.checkInvariants();
        std::tie(*tiered, *stats) = runTiered(*config, hostQuarters, 0, seed);
    }
    for (ServingResult const* run : {&result.twinTiered, &result.hybridDevice, &result.hybridTiered})
    {
        check(run->offeredTokens == result.twinDevice.offeredTokens && run->admitted == result.twinDevice.admitted,
            "the caches were offered different prompts");
    }
    for (rt::KVPageGroupLayout const& group : rt::computeLayout(hybrid).groups)
    {
        result.hybridPages.push_back(group.numPages);
    }
    result.twinPages = rt::computeLayout(twin).groups.at(0).numPages;
    return result;
}

} // namespace kvcache::bench
