// Case f: a serving workload whose prompts share prefixes, run on a hybrid model and on its full-attention twin.
//
// kRUNNING sequences run at once. Each step appends one decoded token to every running sequence; a sequence that has
// produced its output tokens is freed, and a new request is admitted in its place: create(), adoptPrefix() of its
// prompt, then append() of the tokens not found cached in chunks of at most kCHUNK tokens (the config's
// maxTokensPerStep, a chunked prefill). Requests come from a seeded generator that never looks at the manager, so both
// models see the same requests in the same order:
//   - half are new: one of kFAMILIES system prompts (256 to 2048 tokens) plus 64 to 1024 user tokens;
//   - a quarter repeat the prompt of one of the last kHISTORY requests exactly;
//   - a quarter follow up one of the last kHISTORY finished conversations: its prompt and output plus 32 to 256 user
//     tokens (a new request instead when that would pass kMAX_FOLLOW_UP tokens).
// Outputs are 16 to 256 tokens. The pool of the twin holds kTWIN_POOL_TOKENS tokens: the running batch fits at its
// largest, and the cache churns (the workload writes several times the pool in new tokens).

#include "hybrid_serving_sim.h"

#include "kvcache/kv_cache_layout.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <stdexcept>
#include <utility>

namespace kvcache::bench
{
namespace
{

namespace rt = kvcache::rt;

constexpr int32_t kRUNNING = 32;
constexpr int32_t kMAX_LENGTH = 8192;
constexpr int32_t kCHUNK = 2048;
constexpr int64_t kTWIN_POOL_TOKENS = 262'144;
constexpr int32_t kFAMILIES = 24;
constexpr int32_t kMIN_FAMILY_TOKENS = 256;
constexpr int32_t kMAX_FAMILY_TOKENS = 2048;
constexpr int32_t kMIN_USER_TOKENS = 64;
constexpr int32_t kMAX_USER_TOKENS = 1024;
constexpr int32_t kMIN_FOLLOW_UP_TOKENS = 32;
constexpr int32_t kMAX_FOLLOW_UP_TOKENS = 256;
constexpr int32_t kMAX_FOLLOW_UP = 6144;
constexpr int32_t kMIN_OUTPUT = 16;
constexpr int32_t kMAX_OUTPUT = 256;
constexpr int32_t kHISTORY = 512;
constexpr int32_t kVOCAB = 151'936;
constexpr int32_t kWARM_STEPS = 2000;
constexpr int32_t kMEASURED_STEPS = 8000;

//! SplitMix64 with a multiply for bounded draws (as case e's SimRng).
class Random
{
public:
    explicit Random(uint64_t seed)
        : mState(seed)
    {
    }
    uint64_t next() noexcept
    {
        uint64_t z = (mState += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        return z ^ (z >> 31);
    }
    //! A draw from [low, high].
    int32_t between(int32_t low, int32_t high) noexcept
    {
        uint64_t const span = static_cast<uint64_t>(high - low + 1);
        return low + static_cast<int32_t>(((next() >> 32) * span) >> 32);
    }

private:
    uint64_t mState;
};

//! One request: its prompt and the output tokens it will produce.
struct Request
{
    //! 0 new, 1 repeat, 2 follow-up.
    int32_t kind = 0;
    std::vector<int32_t> prompt;
    std::vector<int32_t> output;
};

//! The request stream: depends on its seed only.
class RequestSource
{
public:
    explicit RequestSource(uint64_t seed)
        : mRandom(seed)
    {
        Random familyRandom(777);
        for (int32_t f = 0; f < kFAMILIES; ++f)
        {
            std::vector<int32_t>& family = mFamilies.emplace_back();
            family.resize(static_cast<size_t>(familyRandom.between(kMIN_FAMILY_TOKENS, kMAX_FAMILY_TOKENS)));
            for (int32_t& token : family)
            {
                token = familyRandom.between(0, kVOCAB - 1);
            }
        }
    }

    Request next()
    {
        Request request;
        int32_t const kind = mRandom.between(0, 3);
        if (kind == 1 && !mPrompts.empty())
        {
            request.kind = 1;
            request.prompt =
                mPrompts[static_cast<size_t>(mRandom.between(0, static_cast<int32_t>(mPrompts.size()) - 1))];
        }
        else if (kind == 2 && !mConversations.empty())
        {
            request.prompt = mConversations[static_cast<size_t>(
                mRandom.between(0, static_cast<int32_t>(mConversations.size()) - 1))];
            appendRandom(request.prompt, mRandom.between(kMIN_FOLLOW_UP_TOKENS, kMAX_FOLLOW_UP_TOKENS));
            request.kind = 2;
            if (static_cast<int32_t>(request.prompt.size()) > kMAX_FOLLOW_UP)
            {
                request.prompt.clear();
            }
        }
        if (request.prompt.empty())
        {
            request.kind = 0;
            request.prompt = mFamilies[static_cast<size_t>(mRandom.between(0, kFAMILIES - 1))];
            appendRandom(request.prompt, mRandom.between(kMIN_USER_TOKENS, kMAX_USER_TOKENS));
        }
        appendRandom(request.output, mRandom.between(kMIN_OUTPUT, kMAX_OUTPUT));
        remember(mPrompts, mNextPrompt, request.prompt);
        return request;
    }

    //! Records a finished request's prompt and output as a conversation a later request may follow up.
    void finished(Request const& request)
    {
        std::vector<int32_t> conversation = request.prompt;
        conversation.insert(conversation.end(), request.output.begin(), request.output.end());
        remember(mConversations, mNextConversation, conversation);
    }

private:
    void appendRandom(std::vector<int32_t>& tokens, int32_t count)
    {
        for (int32_t i = 0; i < count; ++i)
        {
            tokens.push_back(mRandom.between(0, kVOCAB - 1));
        }
    }
    static void remember(std::vector<std::vector<int32_t>>& ring, size_t& next, std::vector<int32_t> const& tokens)
    {
        if (ring.size() < static_cast<size_t>(kHISTORY))
        {
            ring.push_back(tokens);
            return;
        }
        ring[next] = tokens;
        next = (next + 1) % ring.size();
    }

    Random mRandom;
    std::vector<std::vector<int32_t>> mFamilies;
    std::vector<std::vector<int32_t>> mPrompts;
    std::vector<std::vector<int32_t>> mConversations;
    size_t mNextPrompt = 0;
    size_t mNextConversation = 0;
};

void check(bool condition, std::string const& message)
{
    if (!condition)
    {
        throw std::runtime_error("check failed: " + message);
    }
}

rt::PageManagerOptions options()
{
    rt::PageManagerOptions o;
    o.maxSequences = kRUNNING;
    o.hashAlgorithm = rt::PageHashAlgorithm::kXXH3_128;
    std::array<uint8_t, 32> seed{};
    for (size_t i = 0; i < seed.size(); ++i)
    {
        seed[i] = static_cast<uint8_t>(i * 5 + 3);
    }
    o.hashSeed = seed;
    return o;
}

//! The model's layers, windowed ones with `window` tokens (0: the full-attention twin).
rt::KVCacheConfig modelConfig(HybridModelShape const& shape, int32_t tokensPerPage, int32_t window)
{
    rt::KVCacheConfig config;
    config.numAttentionLayers = shape.numLayers;
    // maxBatchSize 1 keeps each group's minimum below the pools set here; maxSequences bounds the sequences.
    config.maxBatchSize = 1;
    config.maxSequenceLength = kMAX_LENGTH;
    config.tokensPerPage = tokensPerPage;
    config.maxTokensPerStep = kCHUNK;
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

HybridRunResult runHybridWorkload(rt::KVCacheConfig const& config, uint64_t seed)
{
    struct Running
    {
        rt::SequenceId id = -1;
        Request request;
        int32_t produced = 0; //!< output tokens sampled; all but the last are appended
    };
    rt::PageManager manager(config, options());
    RequestSource source(seed);
    std::vector<Running> running;
    std::vector<Running> still;
    std::vector<rt::SequenceAppend> appends;
    HybridRunResult result;
    for (rt::KVPageGroupLayout const& group : manager.layout().groups)
    {
        result.numPagesPerGroup.push_back(group.numPages);
    }
    result.cacheBytes = manager.layout().cacheBytes;
    bool measuring = false;
    int64_t evictedBefore = 0;
    auto admit = [&]
    {
        Running entry;
        entry.request = source.next();
        std::vector<int32_t> const& prompt = entry.request.prompt;
        int32_t const length = static_cast<int32_t>(prompt.size());
        entry.id = manager.create();
        int32_t const hit = manager.adoptPrefix(entry.id, prompt.data(), length);
        for (int32_t at = hit; at < length; at += kCHUNK)
        {
            manager.append(rt::SequenceAppend{entry.id, prompt.data() + at, std::min(kCHUNK, length - at)});
        }
        entry.produced = 1;
        if (measuring)
        {
            result.offeredTokens += length;
            result.adoptedTokens += hit;
            result.offeredByKind[static_cast<size_t>(entry.request.kind)] += length;
            result.adoptedByKind[static_cast<size_t>(entry.request.kind)] += hit;
            ++result.admitted;
        }
        running.push_back(std::move(entry));
    };
    for (int32_t i = 0; i < kRUNNING; ++i)
    {
        admit();
    }
    auto start = std::chrono::steady_clock::now();
    for (int32_t step = 0; step < kWARM_STEPS + kMEASURED_STEPS; ++step)
    {
        if (step == kWARM_STEPS)
        {
            measuring = true;
            evictedBefore = manager.stats().evictedPages;
            start = std::chrono::steady_clock::now();
        }
        appends.clear();
        for (Running& entry : running)
        {
            if (entry.produced < static_cast<int32_t>(entry.request.output.size()))
            {
                appends.push_back(rt::SequenceAppend{entry.id, entry.request.output.data() + entry.produced - 1, 1});
            }
        }
        manager.step(appends.data(), static_cast<int32_t>(appends.size()));
        still.clear();
        for (Running& entry : running)
        {
            if (entry.produced < static_cast<int32_t>(entry.request.output.size()))
            {
                ++entry.produced;
                still.push_back(std::move(entry));
                continue;
            }
            int32_t const expected =
                static_cast<int32_t>(entry.request.prompt.size() + entry.request.output.size()) - 1;
            check(manager.length(entry.id) == expected,
                "a finished sequence holds " + std::to_string(manager.length(entry.id)) + " tokens, not "
                    + std::to_string(expected));
            manager.free(entry.id);
            source.finished(entry.request);
        }
        running.swap(still);
        while (static_cast<int32_t>(running.size()) < kRUNNING)
        {
            admit();
        }
    }
    result.nanoseconds = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    result.evictedPages = manager.stats().evictedPages - evictedBefore;
    manager.checkInvariants();
    return result;
}

} // namespace kvcache::bench
