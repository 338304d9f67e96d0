#pragma once

// The serving workload of cases f (hybrid_serving_sim.cpp) and g (tiered_serving_sim.cpp): a seeded request stream
// whose prompts share prefixes, repeat and follow up earlier conversations, and the serving loop that runs it on a
// cache behind ServingCache. The stream never looks at the cache, so every cache a case compares sees the same
// requests in the same order. See serving_workload.cpp for the rules and docs/benchmarks.md for the figures.

#include "request_stream.h"
#include "split_mix64.h"

#include "kvcache/paging/page_manager.h"

#include <array>
#include <cstdint>
#include <vector>

namespace kvcache::bench
{

//! Sequences running at once.
inline constexpr int32_t kSERVING_RUNNING = 32;
//! The longest sequence (a follow-up's prompt plus its output stays below it).
inline constexpr int32_t kSERVING_MAX_LENGTH = 8192;
//! Prefill chunk: prompt tokens a cache is given in one append (the configs' maxTokensPerStep).
inline constexpr int32_t kSERVING_CHUNK = 2048;
//! Untimed warm-up steps, then measured ones.
inline constexpr int32_t kSERVING_WARM_STEPS = 2000;
inline constexpr int32_t kSERVING_MEASURED_STEPS = 8000;

//! Tokens a cache already held of one prompt when it was admitted, by where they came from.
struct ServingHit
{
    int32_t deviceTokens = 0;
    //! Tokens brought back from a second tier (0 for a cache of one tier).
    int32_t hostTokens = 0;
};

//! The cache a serving loop runs on: sequence ids are the cache's own. Any call may throw to stop the run.
class ServingCache
{
public:
    virtual ~ServingCache() = default;
    //! Starts an empty sequence.
    virtual rt::SequenceId create() = 0;
    //! Gives the cache the whole prompt of the empty `sequence`; returns what it already held (the sequence now holds
    //! those tokens, at most count - 1).
    virtual ServingHit admit(rt::SequenceId sequence, int32_t const* tokens, int32_t count) = 0;
    //! Appends tokens to sequences: a prefill chunk (one append) or a decode step (one token each).
    virtual void step(rt::SequenceAppend const* appends, int32_t count) = 0;
    //! Returns the tokens `sequence` holds.
    virtual int32_t length(rt::SequenceId sequence) const = 0;
    //! Ends `sequence`; its pages stay cached for later prompts.
    virtual void free(rt::SequenceId sequence) = 0;
    //! Called once, when the measured steps begin (a cache that counts its own work resets or snapshots it here).
    virtual void measuring()
    {
    }

protected:
    ServingCache() = default;
    ServingCache(ServingCache const&) = default;
    ServingCache& operator=(ServingCache const&) = default;
};

//! What a serving loop measured (after warm-up).
struct ServingResult
{
    int64_t offeredTokens = 0; //!< prompt tokens given to admit()
    int64_t deviceTokens = 0;  //!< tokens it found on the device (or in the cache's one tier)
    int64_t hostTokens = 0;    //!< tokens it found in the second tier
    //! Offered and found (both tiers) per kind of request: new, repeat, follow-up.
    std::array<int64_t, 3> offeredByKind = {};
    std::array<int64_t, 3> hitByKind = {};
    int64_t admitted = 0;   //!< requests admitted
    double nanoseconds = 0; //!< wall time of the measured steps
};

//! The workload of cases f and g (serving_workload.cpp): the requests described there, the kSERVING_* sizes.
ServingShape servingShape();

//! Runs the workload of `shape` seeded by `seed` on `cache`: shape.running sequences, each step one decoded token a
//! running sequence, a finished one freed and a request admitted in its place (admit(), then the rest of its prompt in
//! chunks of shape.chunk tokens). Throws std::runtime_error when a finished sequence holds other than its prompt and
//! output but the last token, and what the cache throws.
ServingResult runServingWorkload(ServingCache& cache, uint64_t seed, ServingShape const& shape = servingShape());

//! A ServingCache over a PageManager: adoptPrefix(), step(), free() (case f's manager, and case g's one-tier caches).
class PageManagerServing : public ServingCache
{
public:
    explicit PageManagerServing(rt::PageManager& manager)
        : mManager(&manager)
    {
    }
    rt::SequenceId create() override
    {
        return mManager->create();
    }
    ServingHit admit(rt::SequenceId sequence, int32_t const* tokens, int32_t count) override
    {
        return ServingHit{mManager->adoptPrefix(sequence, tokens, count), 0};
    }
    void step(rt::SequenceAppend const* appends, int32_t count) override
    {
        mManager->step(appends, count);
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
        mEvictedBefore = mManager->stats().evictedPages;
    }
    //! Pages the manager evicted since the measured steps began.
    int64_t evictedPages() const
    {
        return mManager->stats().evictedPages - mEvictedBefore;
    }

private:
    rt::PageManager* mManager;
    int64_t mEvictedBefore = 0;
};

} // namespace kvcache::bench
