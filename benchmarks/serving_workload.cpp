// The serving workload of cases f and g (serving_workload.h).
//
// kSERVING_RUNNING sequences run at once. Each step appends one decoded token to every running sequence; a sequence
// that has produced its output tokens is freed, and a new request is admitted in its place: create(), admit() of its
// prompt, then the tokens the cache did not hold in chunks of at most kSERVING_CHUNK tokens (a chunked prefill).
// Requests come from a seeded generator that never looks at the cache, so every cache sees the same requests in the
// same order:
//   - half are new: one of kFAMILIES system prompts (256 to 2048 tokens) plus 64 to 1024 user tokens;
//   - a quarter repeat the prompt of one of the last kHISTORY requests exactly;
//   - a quarter follow up one of the last kHISTORY finished conversations: its prompt and output plus 32 to 256 user
//     tokens (a new request instead when that would pass kMAX_FOLLOW_UP tokens).
// Outputs are 16 to 256 tokens.

#include "serving_workload.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvcache::bench
{
namespace
{

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
        SplitMix64 familyRandom(777);
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

    SplitMix64 mRandom;
    std::vector<std::vector<int32_t>> mFamilies;
    std::vector<std::vector<int32_t>> mPrompts;
    std::vector<std::vector<int32_t>> mConversations;
    size_t mNextPrompt = 0;
    size_t mNextConversation = 0;
};

} // namespace

ServingResult runServingWorkload(ServingCache& cache, uint64_t seed)
{
    struct Running
    {
        rt::SequenceId id = -1;
        Request request;
        int32_t produced = 0; //!< output tokens sampled; all but the last are appended
    };
    RequestSource source(seed);
    std::vector<Running> running;
    std::vector<Running> still;
    std::vector<rt::SequenceAppend> appends;
    ServingResult result;
    bool measuring = false;
    auto admit = [&]
    {
        Running entry;
        entry.request = source.next();
        std::vector<int32_t> const& prompt = entry.request.prompt;
        int32_t const length = static_cast<int32_t>(prompt.size());
        entry.id = cache.create();
        ServingHit const hit = cache.admit(entry.id, prompt.data(), length);
        for (int32_t at = hit.deviceTokens + hit.hostTokens; at < length; at += kSERVING_CHUNK)
        {
            rt::SequenceAppend const chunk{entry.id, prompt.data() + at, std::min(kSERVING_CHUNK, length - at)};
            cache.step(&chunk, 1);
        }
        entry.produced = 1;
        if (measuring)
        {
            auto const kind = static_cast<size_t>(entry.request.kind);
            result.offeredTokens += length;
            result.deviceTokens += hit.deviceTokens;
            result.hostTokens += hit.hostTokens;
            result.offeredByKind[kind] += length;
            result.hitByKind[kind] += hit.deviceTokens + hit.hostTokens;
            ++result.admitted;
        }
        running.push_back(std::move(entry));
    };
    for (int32_t i = 0; i < kSERVING_RUNNING; ++i)
    {
        admit();
    }
    auto start = std::chrono::steady_clock::now();
    for (int32_t step = 0; step < kSERVING_WARM_STEPS + kSERVING_MEASURED_STEPS; ++step)
    {
        if (step == kSERVING_WARM_STEPS)
        {
            measuring = true;
            cache.measuring();
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
        cache.step(appends.data(), static_cast<int32_t>(appends.size()));
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
            int32_t const held = cache.length(entry.id);
            if (held != expected)
            {
                throw std::runtime_error("check failed: a finished sequence holds " + std::to_string(held)
                    + " tokens, not " + std::to_string(expected));
            }
            cache.free(entry.id);
            source.finished(entry.request);
        }
        running.swap(still);
        while (static_cast<int32_t>(running.size()) < kSERVING_RUNNING)
        {
            admit();
        }
    }
    result.nanoseconds = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    return result;
}

} // namespace kvcache::bench
