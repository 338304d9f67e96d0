// Page bookkeeping on the host (kvcache/paging/page_allocator.h, kvcache/paging/page_manager.h), shaped like the vLLM
// baseline's cases (shared/anchors/vllm-blockpool, bench_vllm_alloc.py), with the same sizes, seeds' roles and
// simulation rules:
//   a. one page allocated and freed on a 100,000-page pool with half of it in use;
//   b. an 8192-token request's pages (512 at 16 tokens a page, 64 at 128) allocated and freed;
//   c. the prefix lookup of an 8192-token prompt whose first 75% is cached, hashing included;
//   d. caching a prompt's full pages;
//   e. a continuous-batching simulation: 256 sequences sharing a 2048-token prefix, one step() for every decode;
//   f. (ours, no baseline) a serving workload with shared prefixes, repeats and follow-ups on hybrid models (sliding
//      window and full attention) and their full-attention twins of the same device bytes, and one of a few hot
//      prefixes with random endings (hybrid_serving_sim.cpp);
//   j. (ours) a serving workload on a recurrent hybrid model (Qwen3-Next-like) under state checkpoints, against its
//      attention-only twin of the same bytes and vLLM's rule of a state per block (state_checkpoint_sim.cpp).
// Cases a-e are here; f and j, which run whole serving workloads, are in bench_allocator_serving.cpp.
// No GPU. Counters: ns_per_op (and ns_per_page) for a-d, ns_per_sequence_step and prefix_hit_rate for e, the hit rate
// of each model of f and j; wall time from a steady clock. A case whose check fails stops with an error and makes the
// process exit 1. See docs/benchmarks.md.

#include "bench_allocator_serving.h"
#include "bench_main.h"
#include "serving_workload.h"

#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/paging/page_allocator.h"
#include "kvcache/paging/page_manager.h"

#ifdef KVCACHE_BENCH_EVENTS
#include "kvcache/events/kv_event_publisher.h"
#endif

#include <benchmark/benchmark.h>
#include <sched.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/page_manager_inputs.h"

namespace kvcache::bench
{
namespace
{

//! The baseline's pool: POOL_BLOCKS in bench_vllm_alloc.py.
constexpr int32_t kPOOL_PAGES = 100'000;
//! The baseline's request: PROMPT tokens.
constexpr int32_t kREQUEST_TOKENS = 8192;
//! The baseline's vocabulary (VOCAB): token ids are drawn from [0, kVOCAB).
constexpr int32_t kVOCAB = 151'936;
//! Case c: the share of the prompt a donor sequence holds (PROMPT * 3 // 4).
constexpr int32_t kCACHED_TOKENS = kREQUEST_TOKENS * 3 / 4;

//! Case e, the baseline's Sim defaults: concurrency, shared prefix, 1 / p_finish, max_out, pool tokens, user tokens
//! of a prompt, warm-up and timed steps of its full run.
constexpr int32_t kSIM_SEQUENCES = 256;
constexpr int32_t kSIM_PREFIX_TOKENS = 2048;
constexpr int32_t kSIM_FINISH_ONE_IN = 512;
constexpr int32_t kSIM_MAX_OUTPUT = 4096;
constexpr int32_t kSIM_POOL_TOKENS = 600'000;
constexpr int32_t kSIM_MIN_USER_TOKENS = 64;
constexpr int32_t kSIM_MAX_USER_TOKENS = 1024;
constexpr int32_t kSIM_WARM_STEPS = 500;
constexpr int32_t kSIM_TIMED_STEPS = 1500;
//! Longest sequence of case e: the longest prompt and every output token but the last (never appended).
constexpr int32_t kSIM_MAX_LENGTH = kSIM_PREFIX_TOKENS + kSIM_MAX_USER_TOKENS + kSIM_MAX_OUTPUT - 1;

using Clock = std::chrono::steady_clock;
using Rng = std::mt19937_64;

//! CPU time of the calling thread in nanoseconds: unlike the steady clock, it stops while the thread waits for a core
//! that other processes hold, which makes runs on a shared machine comparable.
double threadCpuNanoseconds()
{
    timespec now{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) * 1e9 + static_cast<double>(now.tv_nsec);
}

//! batching_sim's step thread on one CPU (KVCACHE_BENCH_STEP_CPU=N), the threads each simulation starts (the
//! publisher's) on the process's other CPUs except those that share N's core (its hyperthread siblings), whose work
//! would slow the step's own: pinning the whole process (taskset) would put them on the step's CPU too.
class StepThreadPin
{
public:
    StepThreadPin()
    {
        char const* const value = std::getenv("KVCACHE_BENCH_STEP_CPU");
        if (value == nullptr || *value == '\0')
        {
            return;
        }
        mCpu = std::atoi(value);
        check(
            sched_getaffinity(0, sizeof(mAll), &mAll) == 0 && mCpu >= 0 && mCpu < CPU_SETSIZE && CPU_ISSET(mCpu, &mAll),
            std::string("KVCACHE_BENCH_STEP_CPU is ") + value + "; it must be a CPU this process may run on");
        mOthers = mAll;
        for (int const sibling : coreSiblings(mCpu))
        {
            CPU_CLR(sibling, &mOthers);
        }
        check(CPU_COUNT(&mOthers) > 0,
            std::string("KVCACHE_BENCH_STEP_CPU is ") + value + "; the process needs a CPU of another core besides it");
    }
    ~StepThreadPin()
    {
        if (mCpu >= 0)
        {
            sched_setaffinity(0, sizeof(mAll), &mAll);
        }
    }
    StepThreadPin(StepThreadPin const&) = delete;
    StepThreadPin& operator=(StepThreadPin const&) = delete;

    //! Lets this thread, and the threads it starts from now on, run on any CPU of the process's set but the step
    //! CPU's core.
    void unpin() noexcept
    {
        if (mCpu >= 0)
        {
            sched_setaffinity(0, sizeof(mOthers), &mOthers);
        }
    }
    //! Pins this thread to the CPU asked for, if any.
    void pin()
    {
        if (mCpu >= 0)
        {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(mCpu, &one);
            check(sched_setaffinity(0, sizeof(one), &one) == 0, "sched_setaffinity failed");
        }
    }

private:
    //! The CPUs that share `cpu`'s core, itself among them, as Linux lists them ("2,18" or "2-3"); just `cpu` where the
    //! list cannot be read.
    static std::vector<int> coreSiblings(int cpu)
    {
        std::ifstream file("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list");
        std::vector<int> cpus;
        std::string range;
        while (std::getline(file, range, ','))
        {
            size_t const dash = range.find('-');
            int const first = std::stoi(range.substr(0, dash));
            int const last = dash == std::string::npos ? first : std::stoi(range.substr(dash + 1));
            for (int c = first; c <= last && c < CPU_SETSIZE; ++c)
            {
                cpus.push_back(c);
            }
        }
        if (cpus.empty())
        {
            cpus.push_back(cpu);
        }
        return cpus;
    }

    int mCpu = -1;
    cpu_set_t mAll{};
    cpu_set_t mOthers{};
};

double nanosecondsSince(Clock::time_point start)
{
    return std::chrono::duration<double, std::nano>(Clock::now() - start).count();
}

//! Reports the time of one operation (an iteration) and of one page of it, in nanoseconds, from the steady clock
//! read around the timed loop.
void reportNanoseconds(benchmark::State& state, Clock::time_point start, int64_t pagesPerOp)
{
    double const nanoseconds = nanosecondsSince(start);
    double const iterations = static_cast<double>(state.iterations());
    state.counters["ns_per_op"] = nanoseconds / iterations;
    state.counters["ns_per_page"] = nanoseconds / (iterations * static_cast<double>(pagesPerOp));
}

//! What the batching simulation does with KV events each step: nothing (not recorded), take the batch
//! (PageManager::takeEvents), or take and publish it (kvcache::events, a PUB socket on loopback with no subscriber).
enum class SimEvents
{
    kOFF,
    kTAKEN,
    kPUBLISHED,
};

//! The simulation's random numbers, drawn inside the timed steps: SplitMix64 (serving_workload.h), a few instructions
//! a draw. std::mt19937_64 behind
//! std::uniform_int_distribution took about a third of a step's time here, which is the harness's cost, not the
//! page manager's (the baseline's draws are Python's random.randint).
using SimRng = SplitMix64;

std::vector<int32_t> randomTokens(Rng& rng, int32_t count)
{
    std::uniform_int_distribution<int32_t> token(0, kVOCAB - 1);
    std::vector<int32_t> tokens(static_cast<size_t>(count));
    for (int32_t& id : tokens)
    {
        id = token(rng);
    }
    return tokens;
}

//! One full-attention layer whose only page group has `numPages` pages: the manager's pool is the baseline's
//! num_blocks. maxBatchSize 1 keeps the config's minimum pool (maxBatchSize * capPadded / tokensPerPage) below it;
//! how many sequences live at once is PageManagerOptions::maxSequences.
rt::KVCacheConfig poolConfig(int32_t tokensPerPage, int32_t numPages, int32_t maxSequenceLength)
{
    rt::KVCacheConfig config;
    config.numAttentionLayers = 1;
    config.maxBatchSize = 1;
    config.maxSequenceLength = maxSequenceLength;
    config.layerConfigs = {{8, 128}};
    config.tokensPerPage = tokensPerPage;
    config.numPages = numPages;
    return config;
}

rt::PageManagerOptions managerOptions(rt::PageHashAlgorithm algorithm, int32_t maxSequences)
{
    // A fixed seed: every run hashes the same bytes the same way.
    rt::PageManagerOptions options = test::seededOptions(maxSequences, 1);
    options.hashAlgorithm = algorithm;
    return options;
}

// Cases a and b: PageAllocator

//! allocate_free/N: N single-page allocate() calls, then N single-page release() calls, on a pool with half its pages
//! in use (the baseline's case a holds half its pool too). N = 1 is a decode step's new page.
void allocateFree(benchmark::State& state)
{
    int32_t const count = static_cast<int32_t>(state.range(0));
    rt::PageAllocator allocator(kPOOL_PAGES);
    std::vector<int32_t> held(kPOOL_PAGES / 2);
    allocator.allocate(static_cast<int32_t>(held.size()), held.data());
    std::vector<int32_t> pages(static_cast<size_t>(count));
    Clock::time_point const start = Clock::now();
    for (auto _ : state)
    {
        for (int32_t& page : pages)
        {
            page = allocator.allocate();
            benchmark::DoNotOptimize(page);
        }
        for (int32_t const page : pages)
        {
            allocator.release(page);
        }
        benchmark::ClobberMemory();
    }
    reportNanoseconds(state, start, count);
}

//! request_allocate_free/N: one allocate(N, list) and one release(list, N) on a pool of kPOOL_PAGES free pages (the
//! baseline's case b starts from an empty pool too). N = 8192 / tokensPerPage.
void requestAllocateFree(benchmark::State& state)
{
    int32_t const count = static_cast<int32_t>(state.range(0));
    rt::PageAllocator allocator(kPOOL_PAGES);
    std::vector<int32_t> pages(static_cast<size_t>(count));
    Clock::time_point const start = Clock::now();
    for (auto _ : state)
    {
        allocator.allocate(count, pages.data());
        benchmark::DoNotOptimize(pages.data());
        allocator.release(pages.data(), count);
        benchmark::ClobberMemory();
    }
    reportNanoseconds(state, start, count);
}

// Case c: prefix lookup

//! A kPOOL_PAGES-page manager where a donor sequence holds an 8192-token prompt whose first kCACHED_TOKENS tokens a
//! query prompt shares (the baseline's donor stays running, so its pages are used, not merely cached).
struct PrefixWorkload
{
    rt::PageManager manager;
    std::vector<int32_t> query;

    PrefixWorkload(int32_t tokensPerPage, rt::PageHashAlgorithm algorithm)
        : manager(poolConfig(tokensPerPage, kPOOL_PAGES, kREQUEST_TOKENS), managerOptions(algorithm, 4))
    {
        Rng rng(3);
        std::vector<int32_t> const prefix = randomTokens(rng, kCACHED_TOKENS);
        std::vector<int32_t> donor = prefix;
        std::vector<int32_t> const donorTail = randomTokens(rng, kREQUEST_TOKENS - kCACHED_TOKENS);
        donor.insert(donor.end(), donorTail.begin(), donorTail.end());
        query = prefix;
        std::vector<int32_t> const queryTail = randomTokens(rng, kREQUEST_TOKENS - kCACHED_TOKENS);
        query.insert(query.end(), queryTail.begin(), queryTail.end());
        rt::SequenceId const holder = manager.create();
        manager.append(rt::SequenceAppend{holder, donor.data(), kREQUEST_TOKENS});
        check(manager.counts(0).used == kREQUEST_TOKENS / tokensPerPage,
            "the donor holds " + std::to_string(manager.counts(0).used) + " pages");
    }
};

//! prefix_lookup/HASH/P: create() + adoptPrefix() of the query prompt + free(): hashes the prompt's pages up to the
//! first miss (kCACHED_TOKENS / P + 1 pages), looks each up and takes the hits, then lets them go again (the baseline's
//! get_computed_blocks takes no reference, so nothing of it needs undoing; our free() is extra work, timed).
void prefixLookup(benchmark::State& state, int32_t tokensPerPage, rt::PageHashAlgorithm algorithm)
{
    guarded(state,
        [&]
        {
            PrefixWorkload work(tokensPerPage, algorithm);
            int32_t hit = 0;
            Clock::time_point const start = Clock::now();
            for (auto _ : state)
            {
                rt::SequenceId const query = work.manager.create();
                hit = work.manager.adoptPrefix(query, work.query.data(), kREQUEST_TOKENS);
                work.manager.free(query);
            }
            reportNanoseconds(state, start, kREQUEST_TOKENS / tokensPerPage);
            check(hit == kCACHED_TOKENS,
                "adoptPrefix found " + std::to_string(hit) + " tokens cached, not " + std::to_string(kCACHED_TOKENS));
            work.manager.checkInvariants();
        });
}

//! prefix_admit/HASH/P: the whole admission of the query prompt: create() + adoptPrefix() + append() of the 2048
//! tokens not cached + free(). It hashes every full page of the prompt (as the baseline's case c does), takes the
//! hits, allocates and registers the rest. The query's own pages, cached by free(), are evicted untimed so every
//! iteration finds the same kCACHED_TOKENS.
void prefixAdmit(benchmark::State& state, int32_t tokensPerPage, rt::PageHashAlgorithm algorithm)
{
    guarded(state,
        [&]
        {
            PrefixWorkload work(tokensPerPage, algorithm);
            int32_t const ownPages = (kREQUEST_TOKENS - kCACHED_TOKENS) / tokensPerPage;
            double nanoseconds = 0;
            for (auto _ : state)
            {
                Clock::time_point const start = Clock::now();
                rt::SequenceId const query = work.manager.create();
                int32_t const hit = work.manager.adoptPrefix(query, work.query.data(), kREQUEST_TOKENS);
                work.manager.append(rt::SequenceAppend{query, work.query.data() + hit, kREQUEST_TOKENS - hit});
                work.manager.free(query);
                nanoseconds += nanosecondsSince(start);
                state.PauseTiming();
                check(hit == kCACHED_TOKENS, "adoptPrefix found " + std::to_string(hit) + " tokens cached");
                int32_t const evicted = work.manager.evictCached(0, ownPages + 1);
                check(evicted == ownPages,
                    "free() cached " + std::to_string(evicted) + " pages of the query, not "
                        + std::to_string(ownPages));
                state.ResumeTiming();
            }
            double const iterations = static_cast<double>(state.iterations());
            state.counters["ns_per_op"] = nanoseconds / iterations;
            state.counters["ns_per_page"] = nanoseconds / (iterations * (kREQUEST_TOKENS / tokensPerPage));
            work.manager.checkInvariants();
        });
}

// Case d: caching a prompt's full pages

//! prompt_cache/HASH/P: create() + append() of an 8192-token prompt on an empty kPOOL_PAGES-page manager: every page
//! taken, hashed and registered. free() and the eviction that empties the cache again are untimed. The baseline's
//! case d times cache_full_blocks alone, with the hashes computed beforehand and the blocks allocated untimed; to
//! compare like with like, each iteration also times the same hash chain alone through the manager's hasher
//! (hash_ns_per_op) and reports the rest (ns_per_op_without_hash: taking and registering the pages).
void promptCache(benchmark::State& state, int32_t tokensPerPage, rt::PageHashAlgorithm algorithm)
{
    guarded(state,
        [&]
        {
            int32_t const numPages = kREQUEST_TOKENS / tokensPerPage;
            rt::PageManager manager(
                poolConfig(tokensPerPage, kPOOL_PAGES, kREQUEST_TOKENS), managerOptions(algorithm, 4));
            Rng rng(4);
            std::vector<int32_t> const prompt = randomTokens(rng, kREQUEST_TOKENS);
            rt::PageHasher const& hasher = manager.hasher();
            std::vector<rt::PageHash> hashes(static_cast<size_t>(numPages));
            double appendNanoseconds = 0;
            double hashNanoseconds = 0;
            for (auto _ : state)
            {
                Clock::time_point const start = Clock::now();
                rt::SequenceId const sequence = manager.create();
                manager.append(rt::SequenceAppend{sequence, prompt.data(), kREQUEST_TOKENS});
                appendNanoseconds += nanosecondsSince(start);
                state.PauseTiming();
                manager.free(sequence);
                int32_t const evicted = manager.evictCached(0, numPages + 1);
                check(evicted == numPages,
                    "append() registered " + std::to_string(evicted) + " pages, not " + std::to_string(numPages));
                // The chain as append() hashes it: whole pages without extra keys go through chain().
                Clock::time_point const hashStart = Clock::now();
                hasher.chain(hasher.root(nullptr, 0), prompt.data(), numPages, tokensPerPage, hashes.data());
                benchmark::DoNotOptimize(hashes.data());
                hashNanoseconds += nanosecondsSince(hashStart);
                state.ResumeTiming();
            }
            double const iterations = static_cast<double>(state.iterations());
            state.counters["ns_per_op"] = appendNanoseconds / iterations;
            state.counters["ns_per_page"] = appendNanoseconds / (iterations * numPages);
            state.counters["hash_ns_per_op"] = hashNanoseconds / iterations;
            state.counters["ns_per_op_without_hash"] = (appendNanoseconds - hashNanoseconds) / iterations;
            manager.checkInvariants();
        });
}

// Case e: continuous batching

//! The baseline's Sim on a PageManager. Each step: one step() appends every running sequence's previously sampled
//! token; each waiting prompt is then admitted (create(), adoptPrefix(), append() of the tokens not cached); every
//! running sequence samples a token and finishes with probability 1/512 or at kSIM_MAX_OUTPUT output tokens; finished
//! ones are freed and each is replaced by a waiting prompt (the shared prefix plus 64..1024 random tokens). The whole
//! step is timed, the prompt's random tokens included, as in the baseline.
class Simulation
{
public:
    Simulation(
        int32_t tokensPerPage, rt::PageHashAlgorithm algorithm, uint64_t seed, SimEvents events = SimEvents::kOFF)
        : mManager(poolConfig(tokensPerPage, kSIM_POOL_TOKENS / tokensPerPage, kSIM_MAX_LENGTH),
            eventOptions(managerOptions(algorithm, 2 * kSIM_SEQUENCES), events))
        , mRng(seed)
        , mWaiting(kSIM_SEQUENCES)
        , mEventsMode(events)
    {
#ifdef KVCACHE_BENCH_EVENTS
        if (events == SimEvents::kPUBLISHED)
        {
            rt::KVEventPublisherOptions options;
            options.endpoint = "tcp://127.0.0.1:*";
            mPublisher = std::make_unique<rt::KVEventPublisher>(options);
        }
#endif
        Rng prefixRng(12345);
        mPrefix = randomTokens(prefixRng, kSIM_PREFIX_TOKENS);
        mRunning.reserve(kSIM_SEQUENCES);
        mStill.reserve(kSIM_SEQUENCES);
        mAppends.reserve(2 * kSIM_SEQUENCES);
        for (std::vector<int32_t>& prompt : mWaiting)
        {
            prompt.reserve(kSIM_PREFIX_TOKENS + kSIM_MAX_USER_TOKENS);
        }
        for (int32_t i = 0; i < kSIM_SEQUENCES; ++i)
        {
            arrive();
        }
    }

    //! Runs one step and returns its wall time in nanoseconds.
    double step()
    {
        Clock::time_point const start = Clock::now();
        mAppends.clear();
        for (Sequence& sequence : mRunning)
        {
            mAppends.push_back(rt::SequenceAppend{sequence.id, &sequence.lastToken, 1});
        }
        mManager.step(mAppends.data(), static_cast<int32_t>(mAppends.size()));
        // Admissions one by one after the decodes, as the baseline's scheduler does: a prompt's pages are registered
        // before the next prompt looks its prefix up, so prompts admitted together share the prefix (folding them
        // into the decodes' step() would make the first wave of 256 miss it and overflow the pool).
        for (int32_t w = 0; w < mNumWaiting; ++w)
        {
            std::vector<int32_t> const& prompt = mWaiting[static_cast<size_t>(w)];
            int32_t const length = static_cast<int32_t>(prompt.size());
            rt::SequenceId const id = mManager.create();
            int32_t const hit = mManager.adoptPrefix(id, prompt.data(), length);
            mManager.append(rt::SequenceAppend{id, prompt.data() + hit, length - hit});
            mHitTokens += hit;
            mPromptTokens += length;
            if (mCheckHits && hit != kSIM_PREFIX_TOKENS)
            {
                mBadHits += 1;
            }
            mRunning.push_back(Sequence{id, 0, 0, length});
        }
        mAdmitted += mNumWaiting;
        mNumWaiting = 0;
        mStill.clear();
        int32_t finished = 0;
        for (Sequence& sequence : mRunning)
        {
            sequence.lastToken = mRng.below(kVOCAB);
            ++sequence.numOutput;
            if (mRng.below(kSIM_FINISH_ONE_IN) == 0 || sequence.numOutput >= kSIM_MAX_OUTPUT)
            {
                mManager.free(sequence.id);
                ++finished;
            }
            else
            {
                mStill.push_back(sequence);
            }
        }
        mRunning.swap(mStill);
        for (int32_t i = 0; i < finished; ++i)
        {
            arrive();
        }
        if (mEventsMode != SimEvents::kOFF)
        {
            // One batch a step, as a runtime hands it to a publisher.
            mManager.takeEvents(mEvents);
            mNumEvents += static_cast<int64_t>(mEvents.events().size());
#ifdef KVCACHE_BENCH_EVENTS
            if (mPublisher)
            {
                mPublisher->publishSwap(mEvents);
            }
#endif
        }
        return nanosecondsSince(start);
    }

    //! KV events taken since construction.
    int64_t numEvents() const noexcept
    {
        return mNumEvents;
    }

    //! Sequences the step about to run works on (running and waiting): the baseline's denominator.
    int64_t sequencesInStep() const noexcept
    {
        return static_cast<int64_t>(mRunning.size()) + mNumWaiting;
    }

    //! From now on, counts prefix hits and admissions afresh and checks that every admission finds exactly the shared
    //! prefix cached (whole pages at 16 and 128 tokens a page; the prefix is always held by a running sequence).
    void startMeasuring() noexcept
    {
        mHitTokens = 0;
        mPromptTokens = 0;
        mAdmitted = 0;
        mCheckHits = true;
    }

    //! Throws when an admission missed the prefix, when a running sequence's length is not its prompt plus its
    //! output tokens but the last, or when the manager's state is inconsistent.
    void verify() const
    {
        check(mBadHits == 0, std::to_string(mBadHits) + " admissions did not find the shared prefix");
        for (Sequence const& sequence : mRunning)
        {
            int32_t const expected = sequence.promptLength + sequence.numOutput - 1;
            check(mManager.length(sequence.id) == expected,
                "a running sequence holds " + std::to_string(mManager.length(sequence.id)) + " tokens, not "
                    + std::to_string(expected));
        }
        mManager.checkInvariants();
    }

    int64_t hitTokens() const noexcept
    {
        return mHitTokens;
    }
    int64_t promptTokens() const noexcept
    {
        return mPromptTokens;
    }
    int64_t admitted() const noexcept
    {
        return mAdmitted;
    }
    rt::PageManager const& manager() const noexcept
    {
        return mManager;
    }

private:
    struct Sequence
    {
        rt::SequenceId id = -1;
        //! The token sampled last, appended by the next step.
        int32_t lastToken = 0;
        int32_t numOutput = 0;
        int32_t promptLength = 0;
    };

    void arrive()
    {
        std::vector<int32_t>& prompt = mWaiting[static_cast<size_t>(mNumWaiting++)];
        prompt.assign(mPrefix.begin(), mPrefix.end());
        int32_t const count = kSIM_MIN_USER_TOKENS + mRng.below(kSIM_MAX_USER_TOKENS - kSIM_MIN_USER_TOKENS + 1);
        for (int32_t i = 0; i < count; ++i)
        {
            prompt.push_back(mRng.below(kVOCAB));
        }
    }

    static rt::PageManagerOptions eventOptions(rt::PageManagerOptions options, SimEvents events)
    {
        options.recordEvents = events != SimEvents::kOFF;
        return options;
    }

    rt::PageManager mManager;
    SimRng mRng;
    std::vector<int32_t> mPrefix;
    std::vector<Sequence> mRunning;
    std::vector<Sequence> mStill;
    //! Prompt buffers reused across arrivals; the first mNumWaiting wait.
    std::vector<std::vector<int32_t>> mWaiting;
    int32_t mNumWaiting = 0;
    std::vector<rt::SequenceAppend> mAppends;
    int64_t mHitTokens = 0;
    int64_t mPromptTokens = 0;
    int64_t mAdmitted = 0;
    int64_t mBadHits = 0;
    bool mCheckHits = false;
    SimEvents mEventsMode = SimEvents::kOFF;
    rt::KVEventBatch mEvents;
    int64_t mNumEvents = 0;
#ifdef KVCACHE_BENCH_EVENTS
    std::unique_ptr<rt::KVEventPublisher> mPublisher;
#endif
};

//! batching_sim/HASH/P: one iteration is one run of the baseline's case e with its own seed: kSIM_WARM_STEPS untimed
//! steps, then kSIM_TIMED_STEPS timed ones. ns_per_sequence_step divides the timed steps' time by the sequences each
//! step worked on (running + waiting), summed over the steps; cpu_ns_per_sequence_step does the same with the thread's
//! CPU time.
void batchingSim(
    benchmark::State& state, int32_t tokensPerPage, rt::PageHashAlgorithm algorithm, SimEvents events = SimEvents::kOFF)
{
    guarded(state,
        [&]
        {
            double nanoseconds = 0;
            double cpuNanoseconds = 0;
            int64_t sequenceSteps = 0;
            int64_t hitTokens = 0;
            int64_t promptTokens = 0;
            int64_t admitted = 0;
            int64_t evicted = 0;
            int64_t numEvents = 0;
            uint64_t seed = 1;
            StepThreadPin pin;
            for (auto _ : state)
            {
                pin.unpin();
                Simulation simulation(tokensPerPage, algorithm, seed++, events);
                pin.pin();
                for (int32_t i = 0; i < kSIM_WARM_STEPS; ++i)
                {
                    simulation.step();
                }
                simulation.startMeasuring();
                int64_t const evictedBefore = simulation.manager().stats().evictedPages;
                int64_t const eventsBefore = simulation.numEvents();
                double runNanoseconds = 0;
                double const cpuStart = threadCpuNanoseconds();
                for (int32_t i = 0; i < kSIM_TIMED_STEPS; ++i)
                {
                    sequenceSteps += simulation.sequencesInStep();
                    runNanoseconds += simulation.step();
                }
                cpuNanoseconds += threadCpuNanoseconds() - cpuStart;
                simulation.verify();
                state.SetIterationTime(runNanoseconds * 1e-9);
                nanoseconds += runNanoseconds;
                hitTokens += simulation.hitTokens();
                promptTokens += simulation.promptTokens();
                admitted += simulation.admitted();
                evicted += simulation.manager().stats().evictedPages - evictedBefore;
                numEvents += simulation.numEvents() - eventsBefore;
            }
            double const steps = static_cast<double>(state.iterations()) * kSIM_TIMED_STEPS;
            state.counters["ns_per_sequence_step"] = nanoseconds / static_cast<double>(sequenceSteps);
            state.counters["cpu_ns_per_sequence_step"] = cpuNanoseconds / static_cast<double>(sequenceSteps);
            state.counters["steps_per_s"] = steps * 1e9 / nanoseconds;
            state.counters["prefix_hit_rate"] =
                static_cast<double>(hitTokens) / static_cast<double>(promptTokens > 0 ? promptTokens : 1);
            state.counters["admits_per_step"] = static_cast<double>(admitted) / steps;
            state.counters["evictions_per_step"] = static_cast<double>(evicted) / steps;
            if (events != SimEvents::kOFF)
            {
                state.counters["events_per_s"] = static_cast<double>(numEvents) * 1e9 / nanoseconds;
                state.counters["events_per_step"] = static_cast<double>(numEvents) / steps;
            }
        });
}

// Registration

struct HashCase
{
    char const* name;
    rt::PageHashAlgorithm algorithm;
};

void registerAll()
{
    benchmark::RegisterBenchmark("allocate_free", allocateFree)->Arg(1);
    // 16 and 128 tokens a page: the baseline's two block sizes.
    benchmark::RegisterBenchmark("request_allocate_free", requestAllocateFree)
        ->Arg(kREQUEST_TOKENS / 16)
        ->Arg(kREQUEST_TOKENS / 128);
    // SHA-256 is vLLM's default prefix-cache hash; XXH3-128 is set against its xxhash option.
    for (HashCase const hash :
        {HashCase{"sha256", rt::PageHashAlgorithm::kSHA256}, HashCase{"xxh3_128", rt::PageHashAlgorithm::kXXH3_128}})
    {
        for (int32_t const tokensPerPage : {16, 128})
        {
            std::string const suffix = std::string("/") + hash.name + "/" + std::to_string(tokensPerPage);
            benchmark::RegisterBenchmark(
                ("prefix_lookup" + suffix).c_str(), prefixLookup, tokensPerPage, hash.algorithm);
            benchmark::RegisterBenchmark(("prefix_admit" + suffix).c_str(), prefixAdmit, tokensPerPage, hash.algorithm);
            benchmark::RegisterBenchmark(("prompt_cache" + suffix).c_str(), promptCache, tokensPerPage, hash.algorithm);
            // The baseline runs 3 (--repeats 3) to 7 seeds of its simulation; each iteration here is one seed.
            benchmark::RegisterBenchmark(
                ("batching_sim" + suffix).c_str(), batchingSim, tokensPerPage, hash.algorithm, SimEvents::kOFF)
                ->UseManualTime()
                ->Iterations(3)
                ->Unit(benchmark::kMillisecond);
        }
        // The same simulation with KV events on (16 tokens a page, where a step stores the most pages a token):
        // taken once a step, and also published.
        std::string const suffix = std::string("/") + hash.name + "/16";
        benchmark::RegisterBenchmark(
            ("batching_sim_events_taken" + suffix).c_str(), batchingSim, 16, hash.algorithm, SimEvents::kTAKEN)
            ->UseManualTime()
            ->Iterations(3)
            ->Unit(benchmark::kMillisecond);
#ifdef KVCACHE_BENCH_EVENTS
        benchmark::RegisterBenchmark(
            ("batching_sim_events_published" + suffix).c_str(), batchingSim, 16, hash.algorithm, SimEvents::kPUBLISHED)
            ->UseManualTime()
            ->Iterations(3)
            ->Unit(benchmark::kMillisecond);
#endif
    }
    registerServingCases();
    benchmark::AddCustomContext("pool_pages", std::to_string(kPOOL_PAGES));
    benchmark::AddCustomContext("request_tokens", std::to_string(kREQUEST_TOKENS));
    benchmark::AddCustomContext("sim_pool_tokens", std::to_string(kSIM_POOL_TOKENS));
}

} // namespace
} // namespace kvcache::bench

int main(int argc, char** argv)
{
    return kvcache::bench::runBenchmarks(argc, argv, "kvcache-bench-allocator", kvcache::bench::registerAll);
}
