#pragma once

// A seeded stream of serving requests: prompts that share prefixes, repeat earlier prompts exactly and follow up
// earlier conversations. The serving workload (serving_workload.cpp, cases f and g) and case j
// (state_checkpoint_sim.cpp) draw their requests from it, each with its own lengths and shares. The stream never looks
// at a cache, so every cache a case compares sees the same requests in the same order. Both also run their requests
// the same way: serveRequests, the continuous-batching loop over RunningRequest, sized by a ServingShape.

#include "split_mix64.h"

#include "kvcache/paging/page_manager.h"

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace kvcache::bench
{

//! Token ids are drawn from [0, kREQUEST_VOCAB).
inline constexpr int32_t kREQUEST_VOCAB = 151'936;

//! Lengths drawn from [min, max].
struct TokenRange
{
    int32_t min = 0;
    int32_t max = 0;
};

//! The shared prompts new requests start from: their count, their lengths and their own seed.
struct PromptFamilies
{
    int32_t count = 0;
    TokenRange tokens;
    uint64_t seed = 0;
};

//! A follow-up's prompt: the conversation and `userTokens` user tokens; a new request instead when that passes
//! `maxTokens` tokens.
struct FollowUpPrompts
{
    TokenRange userTokens;
    int32_t maxTokens = 0;
};

//! A new prompt, from one family. With `lengthIsPrompt`, a length drawn from `tokens`: the family's start fills all
//! but the last `minUserTokens` (the whole family when it is shorter) and user tokens the rest (minUserTokens <=
//! tokens.min). Otherwise the whole family and `tokens` user tokens.
struct NewPrompts
{
    bool lengthIsPrompt = false;
    TokenRange tokens;
    int32_t minUserTokens = 0;
};

//! The lengths and shares of a request stream. A workload writes its shape with the setters, a rule each, so that the
//! shape reads as its rules.
struct RequestShape
{
    //! Each request draws a kind from [0, kindDraws): a draw in [firstRepeatDraw, firstRepeatDraw + repeatDraws)
    //! repeats one of the last `history` prompts, one of the next `followUpDraws` draws follows up one of the last
    //! `history` finished conversations, and any other draw (or a repeat or follow-up with nothing to draw on) makes a
    //! new prompt.
    int32_t kindDraws = 0;
    int32_t firstRepeatDraw = 0;
    int32_t repeatDraws = 0;
    int32_t followUpDraws = 0;
    PromptFamilies families;
    FollowUpPrompts followUp;
    NewPrompts newPrompt;
    //! Output tokens a request produces.
    TokenRange outputTokens;
    //! Prompts and finished conversations kept for repeats and follow-ups.
    int32_t history = 0;

    //! `count` shared prompts of `tokens` tokens each, drawn from their own `seed`.
    RequestShape& sharedPrompts(int32_t count, TokenRange tokens, uint64_t seed)
    {
        families = PromptFamilies{count, tokens, seed};
        return *this;
    }
    //! The kinds' draws in order: `newFirst` new, `repeatCount` repeats, `followUpCount` follow-ups, `newLast` new.
    RequestShape& kindsInOrder(int32_t newFirst, int32_t repeatCount, int32_t followUpCount, int32_t newLast)
    {
        kindDraws = newFirst + repeatCount + followUpCount + newLast;
        firstRepeatDraw = newFirst;
        repeatDraws = repeatCount;
        followUpDraws = followUpCount;
        return *this;
    }
    //! A follow-up adds `userTokens` to the conversation; it is a new request instead past `maxTokens` tokens.
    RequestShape& followUps(TokenRange userTokens, int32_t maxTokens)
    {
        followUp = FollowUpPrompts{userTokens, maxTokens};
        return *this;
    }
    //! A new prompt is a whole shared prompt and `userTokens` user tokens.
    RequestShape& newAfterSharedPrompt(TokenRange userTokens)
    {
        newPrompt = NewPrompts{false, userTokens, 0};
        return *this;
    }
    //! A new prompt has `tokens` tokens: a shared prompt's start and at least `minUserTokens` user tokens.
    RequestShape& newOfLength(TokenRange tokens, int32_t minUserTokens)
    {
        newPrompt = NewPrompts{true, tokens, minUserTokens};
        return *this;
    }
    //! A request produces `tokens` output tokens.
    RequestShape& outputs(TokenRange tokens)
    {
        outputTokens = tokens;
        return *this;
    }
    //! The stream keeps the last `count` prompts and finished conversations.
    RequestShape& keep(int32_t count)
    {
        history = count;
        return *this;
    }
};

//! A serving loop's requests, its sequences at once, its prefill chunk and its steps.
struct ServingShape
{
    RequestShape requests;
    int32_t running = 0;
    int32_t chunk = 0;
    int32_t warmSteps = 0;
    int32_t measuredSteps = 0;
};

//! One request: its prompt and the output tokens it will produce.
struct Request
{
    //! 0 new, 1 repeat, 2 follow-up.
    int32_t kind = 0;
    std::vector<int32_t> prompt;
    std::vector<int32_t> output;
};

//! A request in decode: its sequence and the output tokens sampled so far, all but the last appended (the last is
//! appended at the next step, as a runtime appends the token it just sampled).
struct RunningRequest
{
    rt::SequenceId id = -1;
    Request request;
    int32_t produced = 0;

    //! Whether an output token remains to be sampled: the request takes part in the next step.
    bool decoding() const
    {
        return produced < static_cast<int32_t>(request.output.size());
    }

    //! The tokens of its prompt.
    int32_t promptLength() const
    {
        return static_cast<int32_t>(request.prompt.size());
    }

    //! The tokens its sequence holds once it has finished: the prompt and all output tokens but the last.
    int32_t finishedLength() const
    {
        return static_cast<int32_t>(request.prompt.size() + request.output.size()) - 1;
    }
};

//! Fills `appends` with one decode step: the last sampled token of every request of `running` still decoding.
//! `Running` is RunningRequest or a type derived from it.
template <typename Running>
void decodeAppends(std::vector<Running> const& running, std::vector<rt::SequenceAppend>& appends)
{
    appends.clear();
    for (RunningRequest const& entry : running)
    {
        if (entry.decoding())
        {
            appends.push_back(rt::SequenceAppend{entry.id, entry.request.output.data() + entry.produced - 1, 1});
        }
    }
}

//! The request stream of `shape`: depends on the shape and the seed only.
class RequestStream
{
public:
    RequestStream(RequestShape const& shape, uint64_t seed);

    Request next();

    //! Records a finished request's prompt and output as a conversation a later request may follow up.
    void finished(Request const& request);

private:
    //! Returns a length drawn from `range`.
    int32_t drawLength(TokenRange range);
    void appendRandom(std::vector<int32_t>& tokens, int32_t count);
    void remember(std::vector<std::vector<int32_t>>& ring, size_t& next, std::vector<int32_t> const& tokens) const;

    RequestShape mShape;
    SplitMix64 mRandom;
    std::vector<std::vector<int32_t>> mFamilies;
    std::vector<std::vector<int32_t>> mPrompts;
    std::vector<std::vector<int32_t>> mConversations;
    size_t mNextPrompt = 0;
    size_t mNextConversation = 0;
};

//! Runs shape.warmSteps + shape.measuredSteps decode steps of continuous batching over the request stream of
//! shape.requests seeded by `seed`, shape.running requests at a time. A request drawn from the stream goes to
//! `admit(entry)`, which creates its sequence and prefills its prompt (its first output token is then sampled). Each
//! step hands the running requests' next tokens to `step(index, appends)`; then a request with more to produce goes to
//! `decoded(entry)`, and a finished one to `finished(entry)`, which frees its sequence, and back to the stream; new
//! requests take the finished ones' places. `Running` is RunningRequest or a type derived from it.
template <typename Running, typename Admit, typename Step, typename Decoded, typename Finished>
void serveRequests(
    ServingShape const& shape, uint64_t seed, Admit&& admit, Step&& step, Decoded&& decoded, Finished&& finished)
{
    RequestStream source(shape.requests, seed);
    std::vector<Running> running;
    std::vector<Running> still;
    std::vector<rt::SequenceAppend> appends;
    auto const fill = [&]
    {
        while (static_cast<int32_t>(running.size()) < shape.running)
        {
            Running entry;
            entry.request = source.next();
            admit(entry);
            entry.produced = 1;
            running.push_back(std::move(entry));
        }
    };
    fill();
    for (int32_t index = 0; index < shape.warmSteps + shape.measuredSteps; ++index)
    {
        decodeAppends(running, appends);
        step(index, appends);
        still.clear();
        for (Running& entry : running)
        {
            if (entry.decoding())
            {
                ++entry.produced;
                decoded(entry);
                still.push_back(std::move(entry));
                continue;
            }
            finished(entry);
            source.finished(entry.request);
        }
        running.swap(still);
        fill();
    }
}

} // namespace kvcache::bench
