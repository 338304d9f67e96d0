// Case f: the serving workload of serving_workload.cpp, run on a hybrid model and on its full-attention twin. The pool
// of the twin holds kTWIN_POOL_TOKENS tokens: the running batch fits at its largest, and the cache churns (the workload
// writes several times the pool in new tokens). The hot-prefix workload: a few shared prefixes that every prompt starts
// with and random suffixes that no later prompt shares, so that what a hybrid cache keeps for the prefixes competes
// with what it keeps at the suffixes' ends.

#include "hybrid_serving_sim.h"

#include "bench_main.h"

#include "kvcache/core/kv_cache_layout.h"

#include <algorithm>
#include <utility>

#include "support/page_manager_inputs.h"

namespace kvcache::bench
{
namespace
{

constexpr int32_t kRUNNING = kSERVING_RUNNING;
constexpr int64_t kTWIN_POOL_TOKENS = 262'144;

rt::PageManagerOptions options()
{
    rt::PageManagerOptions o = test::seededOptions(kRUNNING, 3);
    o.hashAlgorithm = rt::PageHashAlgorithm::kXXH3_128;
    return o;
}

//! The model's layers, windowed ones with `window` tokens (0: the full-attention twin).
rt::KVCacheConfig modelConfig(HybridModelShape const& shape, int32_t tokensPerPage, int32_t window)
{
    rt::KVCacheConfig config;
    config.numAttentionLayers = shape.numLayers;
    // maxBatchSize 1 keeps each group's minimum below the pools set here; maxSequences bounds the sequences.
    config.maxBatchSize = 1;
    config.maxSequenceLength = kSERVING_MAX_LENGTH;
    config.tokensPerPage = tokensPerPage;
    config.maxTokensPerStep = kSERVING_CHUNK;
    for (int32_t i = 0; i < shape.numLayers; ++i)
    {
        bool const full = (i + 1) % (shape.windowedPerFull + 1) == 0;
        config.layerConfigs.push_back({shape.numKVHeads, shape.headDim, full ? 0 : window});
    }
    return config;
}

} // namespace

rt::KVCacheConfig twinConfig(HybridModelShape const& shape, int32_t tokensPerPage)
{
    rt::KVCacheConfig config = modelConfig(shape, tokensPerPage, 0);
    config.numPages = static_cast<int32_t>(kTWIN_POOL_TOKENS / tokensPerPage);
    return config;
}

rt::KVCacheConfig hybridConfig(
    HybridModelShape const& shape, int32_t tokensPerPage, HybridSplit split, int64_t budgetBytes)
{
    rt::KVCacheConfig config = modelConfig(shape, tokensPerPage, shape.window);
    rt::KVCacheLayout const layout = rt::computeLayout(config);
    std::vector<int64_t> pages;
    if (split == HybridSplit::kSPLIT_BUDGET)
    {
        pages = rt::splitBudget(config, budgetBytes).numPagesPerGroup;
    }
    else
    {
        int64_t windowedBytes = 0;
        int32_t full = -1;
        for (size_t g = 0; g < layout.groups.size(); ++g)
        {
            rt::KVPageGroupLayout const& group = layout.groups[g];
            pages.push_back(group.slidingWindow == 0 ? 0 : int64_t{kRUNNING} * group.pagesPerSequence);
            windowedBytes += pages.back() * group.bytesPerPage;
            full = group.slidingWindow == 0 ? static_cast<int32_t>(g) : full;
        }
        check(full >= 0, "the hybrid model has no full-attention group");
        pages[static_cast<size_t>(full)] =
            (budgetBytes - windowedBytes) / layout.groups[static_cast<size_t>(full)].bytesPerPage;
    }
    for (int64_t const count : pages)
    {
        config.numPagesPerGroup.push_back(static_cast<int32_t>(count));
    }
    return config;
}

namespace
{

//! The pages of the hot-prefix workload's full-attention pools: every prefix, and the running batch many times over.
constexpr int32_t kHOT_FULL_PAGES = 4096;

ServingShape hotPrefixShape()
{
    // Every draw is a new request: no repeats, no follow-ups.
    RequestShape const requests = RequestShape()
                                      .sharedPrompts(kHOT_PREFIXES, {256, 256}, 4242)
                                      .kindsInOrder(1, 0, 0, 0)
                                      .newAfterSharedPrompt({16, 256})
                                      .outputs({8, 64})
                                      .keep(1);
    return ServingShape{requests, kHOT_RUNNING, kHOT_CHUNK, 1000, 8000};
}

HybridRunResult runOn(rt::KVCacheConfig const& config, uint64_t seed, ServingShape const& shape)
{
    rt::PageManager manager(config, options());
    PageManagerServing serving(manager);
    ServingResult const run = runServingWorkload(serving, seed, shape);
    HybridRunResult result;
    for (rt::KVPageGroupLayout const& group : manager.layout().groups)
    {
        result.numPagesPerGroup.push_back(group.numPages);
    }
    result.cacheBytes = manager.layout().cacheBytes;
    result.offeredTokens = run.offeredTokens;
    result.adoptedTokens = run.deviceTokens;
    result.offeredByKind = run.offeredByKind;
    result.adoptedByKind = run.hitByKind;
    result.admitted = run.admitted;
    result.evictedPages = serving.evictedPages();
    result.nanoseconds = run.nanoseconds;
    manager.checkInvariants();
    return result;
}

} // namespace

HybridRunResult runHybridWorkload(rt::KVCacheConfig const& config, uint64_t seed)
{
    return runOn(config, seed, servingShape());
}

rt::KVCacheConfig hotPrefixConfig(bool hybrid, int32_t sparePages)
{
    rt::KVCacheConfig config;
    config.numAttentionLayers = 2;
    config.maxBatchSize = 1;
    config.maxSequenceLength = 1024;
    config.tokensPerPage = 16;
    // A chunk of one page keeps the windowed group's running need (pagesPerSequence) close to what a decoding
    // sequence holds, so that the spare pages are what the cache has for prefixes.
    config.maxTokensPerStep = kHOT_CHUNK;
    config.layerConfigs = {{8, 64, hybrid ? kHOT_WINDOW : 0}, {8, 64, 0}};
    if (!hybrid)
    {
        config.numPages = kHOT_FULL_PAGES;
        return config;
    }
    rt::KVCacheLayout const layout = rt::computeLayout(config);
    for (rt::KVPageGroupLayout const& group : layout.groups)
    {
        config.numPagesPerGroup.push_back(
            group.slidingWindow == 0 ? kHOT_FULL_PAGES : kHOT_RUNNING * group.pagesPerSequence + sparePages);
    }
    return config;
}

HybridRunResult runHotPrefixWorkload(rt::KVCacheConfig const& config, uint64_t seed)
{
    return runOn(config, seed, hotPrefixShape());
}

} // namespace kvcache::bench
