// The serving workload of cases f and g (serving_workload.h).
//
// kSERVING_RUNNING sequences run at once. Each step appends one decoded token to every running sequence; a sequence
// that has produced its output tokens is freed, and a new request is admitted in its place: create(), admit() of its
// prompt, then the tokens the cache did not hold in chunks of at most kSERVING_CHUNK tokens (a chunked prefill).
// Requests come from a seeded generator that never looks at the cache, so every cache sees the same requests in the
// same order:
//   - half are new: one of 24 system prompts (256 to 2048 tokens) plus 64 to 1024 user tokens;
//   - a quarter repeat the prompt of one of the last 512 requests exactly;
//   - a quarter follow up one of the last 512 finished conversations: its prompt and output plus 32 to 256 user
//     tokens (a new request instead when that would pass 6144 tokens).
// Outputs are 16 to 256 tokens.

#include "serving_workload.h"

#include "request_stream.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvcache::bench
{

ServingShape servingShape()
{
    // The stream's rules (see the top of this file). Draws 0 and 3 are new requests, 1 a repeat, 2 a follow-up.
    RequestShape const requests = RequestShape()
                                      .sharedPrompts(24, {256, 2048}, 777)
                                      .kindsInOrder(1, 1, 1, 1)
                                      .followUps({32, 256}, 6144)
                                      .newAfterSharedPrompt({64, 1024})
                                      .outputs({16, 256})
                                      .keep(512);
    return ServingShape{requests, kSERVING_RUNNING, kSERVING_CHUNK, kSERVING_WARM_STEPS, kSERVING_MEASURED_STEPS};
}

ServingResult runServingWorkload(ServingCache& cache, uint64_t seed, ServingShape const& shape)
{
    ServingResult result;
    bool measuring = false;
    auto start = std::chrono::steady_clock::now();
    serveRequests<RunningRequest>(
        shape, seed,
        [&](RunningRequest& entry)
        {
            std::vector<int32_t> const& prompt = entry.request.prompt;
            int32_t const length = entry.promptLength();
            entry.id = cache.create();
            ServingHit const hit = cache.admit(entry.id, prompt.data(), length);
            for (int32_t at = hit.deviceTokens + hit.hostTokens; at < length; at += shape.chunk)
            {
                rt::SequenceAppend const chunk{entry.id, prompt.data() + at, std::min(shape.chunk, length - at)};
                cache.step(&chunk, 1);
            }
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
        },
        [&](int32_t step, std::vector<rt::SequenceAppend> const& appends)
        {
            if (step == shape.warmSteps)
            {
                measuring = true;
                cache.measuring();
                start = std::chrono::steady_clock::now();
            }
            cache.step(appends.data(), static_cast<int32_t>(appends.size()));
        },
        [](RunningRequest&) {},
        [&](RunningRequest& entry)
        {
            int32_t const expected = entry.finishedLength();
            int32_t const held = cache.length(entry.id);
            if (held != expected)
            {
                throw std::runtime_error("check failed: a finished sequence holds " + std::to_string(held)
                    + " tokens, not " + std::to_string(expected));
            }
            cache.free(entry.id);
        });
    result.nanoseconds = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    return result;
}

} // namespace kvcache::bench
