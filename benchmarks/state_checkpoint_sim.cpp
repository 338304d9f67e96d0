// Case j: a serving workload on a Qwen3-Next-like model (state_checkpoint_sim.h) under two rules for what prefix a
// request can resume from, against two caches without state layers.
//
// kRUNNING sequences run at once. Each step appends one decoded token to every running sequence; a sequence that has
// produced its output (16 to 128 tokens) is freed and a request admitted in its place: create(), adoptPrefix(), then
// the rest of the prompt in chunks of at most kCHUNK tokens. Requests come from a seeded generator that never looks at
// the cache, so every rule sees the same requests. Prompts hold 100 to 2000 tokens:
//   - 40% are new: the start of one of 16 shared prompts (64 to 1024 tokens) and at least 16 user tokens;
//   - 35% repeat the prompt of one of the last 256 requests exactly;
//   - 25% follow up one of the last 256 finished conversations: its prompt and output plus 32 to 256 user tokens
//     (a new request instead when that passes 2000 tokens).
// The runtime of the two caches with state layers ends a prefill chunk at the boundary where a checkpoint is wanted and
// calls checkpointState() after that step; in decode, after each step, for a sequence whose length is such a boundary.

#include "state_checkpoint_sim.h"

#include "bench_main.h"
#include "request_stream.h"

#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/paging/page_manager.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "support/page_manager_inputs.h"

namespace kvcache::bench
{
namespace
{

constexpr int32_t kRUNNING = 32;
constexpr int32_t kMAX_LENGTH = 2304;
constexpr int32_t kCHUNK = 2048;

//! The stream's rules (see the top of this file), kRUNNING sequences in prefill chunks of kCHUNK tokens, 1000 untimed
//! steps and 4000 measured ones.
ServingShape checkpointShape()
{
    // Draws 0 to 6 are repeats, 7 to 11 follow-ups, 12 to 19 new requests.
    RequestShape const requests = RequestShape()
                                      .sharedPrompts(16, {64, 1024}, 4242)
                                      .kindsInOrder(0, 7, 5, 8)
                                      .followUps({32, 256}, 2000)
                                      .newOfLength({100, 2000}, 16)
                                      .outputs({16, 128})
                                      .keep(256);
    return ServingShape{requests, kRUNNING, kCHUNK, 1000, 4000};
}

//! The model's config: `attentionLayers` full-attention layers (2 KV heads of 256), and the 36 gated delta net layers
//! with `checkpointSlots` checkpoint slots when `withState`.
rt::KVCacheConfig modelConfig(int32_t attentionLayers, bool withState, int32_t checkpointSlots, int32_t numPages)
{
    rt::KVCacheConfig config;
    config.numAttentionLayers = attentionLayers;
    config.maxBatchSize = kRUNNING;
    config.maxSequenceLength = kMAX_LENGTH;
    config.tokensPerPage = QwenNextLike::kTOKENS_PER_PAGE;
    config.maxTokensPerStep = kCHUNK;
    config.numPages = numPages;
    for (int32_t i = 0; i < attentionLayers; ++i)
    {
        config.layerConfigs.push_back({2, 256, 0});
    }
    if (withState)
    {
        for (int32_t i = 0; i < QwenNextLike::kSTATE_LAYERS; ++i)
        {
            config.stateLayerConfigs.push_back(
                rt::StateLayerConfig{{rt::StateTensorConfig{"conv", {8192, 3}, rt::DataType::kBF16},
                    rt::StateTensorConfig{"recurrent", {32, 128, 128}, rt::DataType::kBF16}}});
        }
        config.numCheckpointSlots = checkpointSlots;
    }
    return config;
}

rt::PageManagerOptions managerOptions(int32_t intervalPages)
{
    rt::PageManagerOptions o = test::seededOptions(kRUNNING, 1);
    o.hashAlgorithm = rt::PageHashAlgorithm::kXXH3_128;
    o.checkpointIntervalPages = intervalPages;
    return o;
}

} // namespace

int32_t vllmBlockTokens()
{
    rt::KVCacheLayout const layout = rt::computeLayout(modelConfig(QwenNextLike::kFULL_LAYERS, true, 1, 0));
    int64_t const stateLayerBytes = layout.stateLayers.at(0).slotBytes;
    int64_t const tokenLayerBytes =
        layout.groups.at(0).bytesPerPage / layout.tokensPerPage / QwenNextLike::kFULL_LAYERS;
    int64_t const tokens = (stateLayerBytes + tokenLayerBytes - 1) / tokenLayerBytes;
    return static_cast<int32_t>((tokens + 15) / 16 * 16);
}

rt::KVCacheConfig checkpointConfig(CheckpointRule rule, int32_t checkpointSlots, int32_t twinPages)
{
    constexpr int32_t kTWIN_LAYERS = QwenNextLike::kFULL_LAYERS + QwenNextLike::kSTATE_LAYERS;
    if (rule == CheckpointRule::kTWIN)
    {
        return modelConfig(kTWIN_LAYERS, false, 0, twinPages);
    }
    int64_t const twinBytes = rt::computeLayout(modelConfig(kTWIN_LAYERS, false, 0, twinPages)).cacheBytes;
    bool const withState = rule != CheckpointRule::kATTENTION_ONLY;
    rt::KVCacheLayout const layout =
        rt::computeLayout(modelConfig(QwenNextLike::kFULL_LAYERS, withState, checkpointSlots, 0));
    int64_t const pages = (twinBytes - layout.stateBytes) / layout.groups.at(0).bytesPerPage;
    check(pages >= layout.minPages,
        std::to_string(checkpointSlots) + " checkpoint slots leave " + std::to_string(pages)
            + " pages, below the running batch's " + std::to_string(layout.minPages));
    return modelConfig(QwenNextLike::kFULL_LAYERS, withState, checkpointSlots, static_cast<int32_t>(pages));
}

CheckpointRunResult runCheckpointWorkload(
    rt::KVCacheConfig const& config, CheckpointRule rule, int32_t intervalPages, uint64_t seed)
{
    rt::PageManager manager(config, managerOptions(rule == CheckpointRule::kKVCACHE ? intervalPages : 0));
    int32_t const block = vllmBlockTokens();
    // The length at which the runtime saves the sequence's state next, -1 for none.
    auto const boundaryOf = [&](rt::SequenceId id) -> int32_t
    {
        switch (rule)
        {
        case CheckpointRule::kKVCACHE: return manager.checkpointBoundary(id);
        case CheckpointRule::kVLLM_BLOCKS: return (manager.length(id) / block + 1) * block;
        default: return -1;
        }
    };
    struct Running : RunningRequest
    {
        int32_t boundary = -1; //!< the length at which its state is saved next
    };
    ServingShape const shape = checkpointShape();
    CheckpointRunResult result;
    bool measuring = false;
    rt::PageManagerStats before{};
    serveRequests<Running>(
        shape, seed,
        [&](Running& entry)
        {
            std::vector<int32_t> const& prompt = entry.request.prompt;
            int32_t const length = entry.promptLength();
            entry.id = manager.create();
            auto const start = std::chrono::steady_clock::now();
            int32_t const hit = manager.adoptPrefix(entry.id, prompt.data(), length);
            double const nanoseconds =
                std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
            for (int32_t at = hit; at < length;)
            {
                int32_t const boundary = boundaryOf(entry.id);
                int32_t end = std::min(length, at + shape.chunk);
                end = boundary > at && boundary < end ? boundary : end;
                rt::SequenceAppend const chunk{entry.id, prompt.data() + at, end - at};
                manager.step(&chunk, 1);
                at = end;
                if (at == boundary)
                {
                    manager.checkpointState(entry.id);
                }
            }
            entry.boundary = boundaryOf(entry.id);
            if (measuring)
            {
                result.offeredTokens += length;
                result.adoptedTokens += hit;
                result.adoptNanoseconds += nanoseconds;
                ++result.adoptCalls;
                ++result.admitted;
            }
        },
        [&](int32_t step, std::vector<rt::SequenceAppend> const& appends)
        {
            if (step == shape.warmSteps)
            {
                measuring = true;
                before = manager.stats();
            }
            manager.step(appends.data(), static_cast<int32_t>(appends.size()));
        },
        [&](Running& entry)
        {
            if (manager.length(entry.id) == entry.boundary)
            {
                manager.checkpointState(entry.id);
                entry.boundary = boundaryOf(entry.id);
            }
        },
        [&](Running& entry)
        {
            check(
                manager.length(entry.id) == entry.finishedLength(), "a finished sequence holds other than its tokens");
            manager.free(entry.id);
        });
    manager.checkInvariants();
    rt::PageManagerStats const after = manager.stats();
    result.checkpointsSaved = after.checkpointsSaved - before.checkpointsSaved;
    result.checkpointsRestored = after.checkpointsRestored - before.checkpointsRestored;
    result.checkpointsDropped = after.checkpointsDropped - before.checkpointsDropped;
    rt::KVCacheLayout const& layout = manager.layout();
    result.numPages = layout.numPages;
    result.bytes = layout.cacheBytes + layout.stateBytes;
    return result;
}

} // namespace kvcache::bench
