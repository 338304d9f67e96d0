// A continuous-batching run of a PageManager driving a real KVCacheManager, as a serving loop drives them: requests
// arrive with a shared system prompt (two salts, so two tenants), adopt cached prefixes, prefill, fork for parallel
// sampling, decode one token a step and leave at random lengths. Each step the queued copies run with copyPages, the
// page tables are built from PageManager::pages, and a kernel writes each appended token's K and V into the pool
// through the DEVICE block table. Pages a step hands out are poisoned before anything writes them.
//
// After every step every cached token of every live sequence is read back and compared with a host reference that
// knows only which tokens each sequence holds (forks share their parent's history, adopted prefixes are the prompt's
// own tokens): K and V are a function of (salt, token id, position, layer, half, head, dim), not of the sequence, so
// an adopted or shared page is right by construction and a wrong page id, a missing copy or a missing write shows.
// Bytes are located with support/layout_model.h, not with LayerRef. The copy lists are checked against the
// copy-on-write rule, windowed groups against the release rule, prefix hits against a donor that stays alive.

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/memory/layer_ref.h"
#include "kvcache/memory/page_ops.h"
#include "kvcache/paging/page_manager.h"
#include "kvcache/paging/page_table.h"

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/gpu_test.h"
#include "support/hashed_value.cuh"
#include "support/layout_model.h"

namespace kvcache::test
{
namespace
{

//! Threads per block of the writing kernel (one block an appended token).
constexpr int32_t kWRITE_THREADS = 64;
//! What every page holds before a step writes it: float16 NaN in both half-words, equal to no written value.
constexpr uint32_t kPOISON_PATTERN = 0x7E007E00u;
//! The cache's bytes before the first step: 0xFFFF is a float16 NaN too.
constexpr int kBACKGROUND_BYTE = 0xFF;
//! Token ids are drawn from [0, kVOCABULARY).
constexpr int32_t kVOCABULARY = 500;
//! Salts of the two tenants: sequences of different salts never share a page.
constexpr int32_t kSALTS[] = {11, 23};

//! Returns the value of (head, dim) of token id `token` at `position` in `layer`'s K (kv 0) or V (kv 1) for a
//! sequence of salt `salt`: an integer in [1, 1000], exact in float16, hashed from every argument, negative for V.
__host__ __device__ float tokenValue(
    int32_t salt, int32_t token, int32_t position, int32_t layer, int32_t kv, int32_t head, int32_t dim)
{
    uint32_t const values[] = {static_cast<uint32_t>(salt), static_cast<uint32_t>(token),
        static_cast<uint32_t>(position), static_cast<uint32_t>(layer), static_cast<uint32_t>(kv),
        static_cast<uint32_t>(head), static_cast<uint32_t>(dim)};
    return test::hashedValue(values, 7, kv != 0);
}

//! One token appended in a step: its row of the page tables, its position, its id and its sequence's salt.
struct AppendedToken
{
    int32_t row;
    int32_t position;
    int32_t token;
    int32_t salt;
};

//! Writes the K and V of appended token blockIdx.x into `layer`, on the page the device block table gives for its row
//! and position; counts (and skips) a page id outside the pool instead of writing through it.
__global__ void writeAppendedTokensKernel(rt::LayerRef ref, int32_t const* blockTable, int32_t const* firstToken,
    int32_t maxPagesPerSequence, AppendedToken const* tokens, int32_t layer, int32_t* badPages)
{
    AppendedToken const t = tokens[blockIdx.x];
    // Rows start at the first resident page (a window's released pages are left out).
    int32_t const page =
        blockTable[int64_t{t.row} * maxPagesPerSequence + (t.position - firstToken[t.row]) / ref.tokensPerPage];
    if (page < 0 || page >= ref.numPages)
    {
        if (threadIdx.x == 0)
        {
            atomicAdd(badPages, 1);
        }
        return;
    }
    int32_t const slot = t.position % ref.tokensPerPage;
    for (int32_t i = static_cast<int32_t>(threadIdx.x); i < ref.numKVHeads * ref.headDim;
         i += static_cast<int32_t>(blockDim.x))
    {
        int32_t const head = i / ref.headDim;
        int32_t const dim = i % ref.headDim;
        ref.k<__half>(page, slot, head)[dim] =
            __float2half_rn(tokenValue(t.salt, t.token, t.position, layer, 0, head, dim));
        ref.v<__half>(page, slot, head)[dim] =
            __float2half_rn(tokenValue(t.salt, t.token, t.position, layer, 1, head, dim));
    }
}

//! Returns the bits of `value` rounded to float16.
uint16_t halfBits(float value)
{
    __half_raw const raw = __half_raw(__float2half_rn(value));
    return raw.x;
}

//! What the test knows of a sequence, kept without asking the PageManager.
struct ModelSequence
{
    rt::SequenceId id = -1;
    int32_t salt = 0;
    //! Token ids the cache holds, in order.
    std::vector<int32_t> tokens;
    //! Prompt tokens still to prefill.
    std::vector<int32_t> pending;
    //! The length at which the sequence leaves.
    int32_t targetLength = 0;
    //! Forks to make once the prompt is prefilled (parallel sampling: samples - 1).
    int32_t forksLeft = 0;
    //! The first position appended by the latest step that appended to it (-1 before any); forks inherit it.
    int32_t lastAppendStart = -1;
    //! A donor of the system prompt: never appended to after its prefill, never freed until the end.
    bool pinned = false;
};

//! The knobs of one run.
struct RunOptions
{
    //! Steps of the run; the cache is checked after each.
    int32_t rounds{};
    //! Tokens of the prompt every request starts with (prefix reuse).
    int32_t systemPromptTokens{};
    //! Most tokens a request adds to the system prompt.
    int32_t maxUserTokens{};
    //! Most forks of one request (parallel samples).
    int32_t maxSamples{};
    uint32_t seed{};
};

//! A KVCacheManager and a PageManager of one config, the page tables, and the host model of every live sequence.
class ContinuousBatchingRun
{
public:
    ContinuousBatchingRun(rt::KVCacheConfig const& config, RunOptions const& options)
        : mConfig(config)
        , mOptions(options)
        , mModel(modelLayout(config))
        , mCache(config, mStream.get())
        , mPages(config)
        , mRandom(options.seed)
        , mBadPages(1)
    {
        mTokensPerPage = config.tokensPerPage;
        mMaxPagesPerSequence = (config.maxSequenceLength + mTokensPerPage - 1) / mTokensPerPage;
        mMaxStepTokens = config.maxTokensPerStep > 0 ? config.maxTokensPerStep : config.maxSequenceLength;
        for (int32_t g = 0; g < mPages.numGroups(); ++g)
        {
            // A windowed group's entries cover the whole length (kUNUSED_PAGE_ENTRY for released pages), so its rows
            // are as long as a full-attention group's.
            mTables.emplace_back(mPages.maxSequences(), mMaxPagesPerSequence, mTokensPerPage, mStream.get());
        }
        for (int32_t layer = 0; layer < mCache.numLayers(); ++layer)
        {
            KVCACHE_CUDA_TRY(cudaMemsetAsync(mCache.kPoolPtr(layer), kBACKGROUND_BYTE,
                static_cast<size_t>(mModel.layers[static_cast<size_t>(layer)].layerBytes), mStream.get()));
        }
        mBadPages.fillBytes(0, mStream.get());
        for (int32_t salt : kSALTS)
        {
            std::vector<int32_t>& prompt = mSystemPrompts[salt];
            for (int32_t i = 0; i < options.systemPromptTokens; ++i)
            {
                prompt.push_back(randomToken());
            }
        }
    }

    //! Runs every round, checking after each; GoogleTest failures record what went wrong.
    void run()
    {
        // The donors arrive first and alone, so their full pages are the first with their hashes: registered, and
        // held until the end, so every later prompt of their salt must find them.
        for (int32_t salt : kSALTS)
        {
            ModelSequence& donor = arrive(salt, {}, 1);
            donor.pinned = true;
        }
        while (hasPending())
        {
            runStep();
            if (::testing::Test::HasFatalFailure())
            {
                return;
            }
        }
        for (int32_t round = 0; round < mOptions.rounds; ++round)
        {
            leave();
            forkSamples();
            admit();
            runStep();
            if (::testing::Test::HasFatalFailure())
            {
                return;
            }
        }
        for (ModelSequence const& sequence : mLive)
        {
            mPages.free(sequence.id);
        }
        mLive.clear();
        mPages.checkInvariants();
        for (int32_t g = 0; g < mPages.numGroups(); ++g)
        {
            rt::PageGroupCounts const counts = mPages.counts(g);
            EXPECT_EQ(counts.used, 0) << "group " << g;
            EXPECT_EQ(counts.shared, 0) << "group " << g;
            EXPECT_EQ(counts.free + counts.cached, mModel.groups[static_cast<size_t>(g)].numPages) << "group " << g;
        }
    }

    //! Returns the stats the run ended with.
    rt::PageManagerStats stats() const
    {
        return mPages.stats();
    }
    //! Returns how many sequences forked from another.
    int32_t forks() const
    {
        return mForks;
    }
    //! Returns how many checks of the whole cache ran.
    int32_t checks() const
    {
        return mChecks;
    }

private:
    int32_t randomToken()
    {
        return std::uniform_int_distribution<int32_t>(0, kVOCABULARY - 1)(mRandom);
    }
    int32_t randomInt(int32_t low, int32_t high)
    {
        return std::uniform_int_distribution<int32_t>(low, high)(mRandom);
    }
    bool hasPending() const
    {
        return std::any_of(
            mLive.begin(), mLive.end(), [](ModelSequence const& sequence) { return !sequence.pending.empty(); });
    }
    int32_t numLive() const
    {
        return static_cast<int32_t>(mLive.size());
    }

    //! Creates a sequence of `salt` whose prompt is the system prompt then `userTokens`, adopts its cached prefix and
    //! checks the hit against the donor of its salt.
    ModelSequence& arrive(int32_t salt, std::vector<int32_t> const& userTokens, int32_t samples)
    {
        std::vector<int32_t> prompt = mSystemPrompts.at(salt);
        prompt.insert(prompt.end(), userTokens.begin(), userTokens.end());
        int32_t const count = static_cast<int32_t>(prompt.size());

        rt::SequenceOptions options;
        options.salt = &salt;
        options.saltBytes = sizeof(salt);
        ModelSequence sequence;
        sequence.id = mPages.create(options);
        sequence.salt = salt;
        int32_t const hit = mPages.adoptPrefix(sequence.id, prompt.data(), count);
        EXPECT_EQ(hit % mTokensPerPage, 0) << "adoptPrefix gives whole pages";
        EXPECT_LE(hit, count - 1) << "adoptPrefix leaves the last prompt token to compute";
        EXPECT_GE(hit, 0);
        bool const donorAlive = std::any_of(
            mLive.begin(), mLive.end(), [&](ModelSequence const& other) { return other.pinned && other.salt == salt; });
        if (mSaltsSeen.insert(salt).second)
        {
            // Pages of the other salt hold the same system prompt tokens: only the salt keeps them apart.
            EXPECT_EQ(hit, 0) << "the first prompt of salt " << salt << " found pages cached";
        }
        else if (donorAlive)
        {
            // The donor holds the system prompt's full pages, registered when it computed them.
            int32_t const sharedPages = std::min(mOptions.systemPromptTokens, count - 1) / mTokensPerPage;
            EXPECT_GE(hit, sharedPages * mTokensPerPage) << "salt " << salt << ", prompt of " << count << " tokens";
        }
        EXPECT_EQ(mPages.length(sequence.id), hit);
        sequence.tokens.assign(prompt.begin(), prompt.begin() + hit);
        sequence.pending.assign(prompt.begin() + hit, prompt.end());
        sequence.lastAppendStart = -1;
        sequence.targetLength = randomInt(count + 1, mConfig.maxSequenceLength);
        sequence.forksLeft = samples - 1;
        mLive.push_back(sequence);
        return mLive.back();
    }

    //! Frees the sequences that reached their length (never the donors).
    void leave()
    {
        for (auto it = mLive.begin(); it != mLive.end();)
        {
            if (!it->pinned && it->pending.empty() && it->forksLeft == 0
                && static_cast<int32_t>(it->tokens.size()) >= it->targetLength)
            {
                mPages.free(it->id);
                EXPECT_FALSE(mPages.contains(it->id));
                it = mLive.erase(it);
            }
            else
            {
                ++it;
            }
        }
    }

    //! Forks each prefilled sequence still owed samples, while there is room.
    void forkSamples()
    {
        size_t const liveBefore = mLive.size();
        for (size_t i = 0; i < liveBefore; ++i)
        {
            while (mLive[i].pending.empty() && mLive[i].forksLeft > 0 && numLive() < mPages.maxSequences())
            {
                ModelSequence child = mLive[i];
                child.id = mPages.fork(mLive[i].id);
                child.forksLeft = 0;
                child.targetLength =
                    randomInt(static_cast<int32_t>(child.tokens.size()) + 1, mConfig.maxSequenceLength);
                --mLive[i].forksLeft;
                ++mForks;
                EXPECT_EQ(mPages.length(child.id), static_cast<int32_t>(child.tokens.size()));
                for (int32_t g = 0; g < mPages.numGroups(); ++g)
                {
                    rt::SequencePages const parent = mPages.pages(mLive[i].id, g);
                    rt::SequencePages const forked = mPages.pages(child.id, g);
                    ASSERT_EQ(forked.numPages, parent.numPages) << "group " << g;
                    EXPECT_TRUE(std::equal(parent.pages, parent.pages + parent.numPages, forked.pages))
                        << "a fork shares its parent's pages, group " << g;
                }
                mLive.push_back(child);
            }
            // No room for every sample: the rest are dropped rather than wait for ever.
            mLive[i].forksLeft = 0;
        }
    }

    //! Admits new requests while room remains for them and their samples.
    void admit()
    {
        int32_t const arrivals = randomInt(0, 2);
        for (int32_t i = 0; i < arrivals; ++i)
        {
            int32_t const samples = randomInt(1, mOptions.maxSamples);
            if (numLive() + samples > mPages.maxSequences())
            {
                return;
            }
            int32_t const salt = kSALTS[randomInt(0, 1)];
            std::vector<int32_t> user(static_cast<size_t>(randomInt(1, mOptions.maxUserTokens)));
            for (int32_t& token : user)
            {
                token = randomToken();
            }
            arrive(salt, user, samples);
        }
    }

    //! One step: appends, page bookkeeping checks, poison, copies, page tables, the writing kernels, the cache check.
    void runStep()
    {
        int32_t const numGroups = mPages.numGroups();
        // Before: every live sequence's entries, and how many entries hold each page.
        std::vector<std::vector<std::vector<int32_t>>> before(static_cast<size_t>(numGroups));
        std::vector<std::map<int32_t, int32_t>> holders(static_cast<size_t>(numGroups));
        for (int32_t g = 0; g < numGroups; ++g)
        {
            for (ModelSequence const& sequence : mLive)
            {
                rt::SequencePages const pages = mPages.pages(sequence.id, g);
                before[g].emplace_back(pages.pages, pages.pages + pages.numPages);
                for (int32_t page : before[g].back())
                {
                    if (page != rt::kUNUSED_PAGE_ENTRY)
                    {
                        ++holders[g][page];
                    }
                }
            }
        }

        // The step's appends: the next prompt chunk, or one sampled token.
        std::vector<std::vector<int32_t>> chunks(mLive.size());
        std::vector<rt::SequenceAppend> appends;
        std::vector<size_t> appendedRows;
        std::vector<AppendedToken> appended;
        for (size_t row = 0; row < mLive.size(); ++row)
        {
            ModelSequence const& sequence = mLive[row];
            std::vector<int32_t>& chunk = chunks[row];
            if (!sequence.pending.empty())
            {
                size_t const count = std::min(sequence.pending.size(), static_cast<size_t>(mMaxStepTokens));
                chunk.assign(sequence.pending.begin(), sequence.pending.begin() + static_cast<std::ptrdiff_t>(count));
            }
            else if (!sequence.pinned && static_cast<int32_t>(sequence.tokens.size()) < sequence.targetLength)
            {
                chunk.push_back(randomToken());
            }
            if (chunk.empty())
            {
                continue;
            }
            rt::SequenceAppend append;
            append.sequence = sequence.id;
            append.tokens = chunk.data();
            append.count = static_cast<int32_t>(chunk.size());
            appends.push_back(append);
            appendedRows.push_back(row);
            for (size_t i = 0; i < chunk.size(); ++i)
            {
                appended.push_back(AppendedToken{static_cast<int32_t>(row),
                    static_cast<int32_t>(sequence.tokens.size() + i), chunk[i], sequence.salt});
            }
        }
        rt::StepCopies const stepCopies = mPages.step(appends.data(), static_cast<int32_t>(appends.size()));
        mPages.checkInvariants();

        // Each group: the copies the copy-on-write rule asks for, and the pages the step handed out.
        for (int32_t g = 0; g < numGroups; ++g)
        {
            std::vector<rt::PageCopy> expectedCopies;
            std::vector<int32_t> fresh;
            for (size_t a = 0; a < appends.size(); ++a)
            {
                size_t const row = appendedRows[a];
                std::vector<int32_t> const& old = before[g][row];
                int32_t const oldLength = static_cast<int32_t>(mLive[row].tokens.size());
                rt::SequencePages const now = mPages.pages(mLive[row].id, g);
                int32_t const newLength = oldLength + appends[a].count;
                ASSERT_EQ(now.numTokens, newLength);
                ASSERT_EQ(now.numPages, (newLength + mTokensPerPage - 1) / mTokensPerPage);
                // In the step's order: out-of-window pages are let go, a shared partial last page is copied, new
                // pages are taken (from pages nobody holds, possibly ones an earlier entry just let go).
                for (int32_t i = 0; i < now.numPages && static_cast<size_t>(i) < old.size(); ++i)
                {
                    if (old[static_cast<size_t>(i)] != rt::kUNUSED_PAGE_ENTRY && now.pages[i] == rt::kUNUSED_PAGE_ENTRY)
                    {
                        --holders[g][old[static_cast<size_t>(i)]];
                    }
                }
                int32_t const partial = oldLength % mTokensPerPage != 0 ? oldLength / mTokensPerPage : -1;
                if (partial >= 0 && old[static_cast<size_t>(partial)] != rt::kUNUSED_PAGE_ENTRY
                    && holders[g][old[static_cast<size_t>(partial)]] > 1)
                {
                    int32_t const shared = old[static_cast<size_t>(partial)];
                    expectedCopies.push_back(rt::PageCopy{shared, now.pages[partial]});
                    --holders[g][shared];
                }
                for (int32_t i = 0; i < now.numPages; ++i)
                {
                    int32_t const page = now.pages[i];
                    bool const kept = static_cast<size_t>(i) < old.size() && old[static_cast<size_t>(i)] == page;
                    if (page != rt::kUNUSED_PAGE_ENTRY && !kept)
                    {
                        EXPECT_TRUE(i >= oldLength / mTokensPerPage)
                            << "group " << g << ": a full page of sequence " << mLive[row].id << " changed";
                        EXPECT_EQ(holders[g][page], 0)
                            << "group " << g << ": page " << page << " handed out while another sequence held it";
                        ++holders[g][page];
                        fresh.push_back(page);
                    }
                }
            }
            std::vector<rt::PageCopy> const& copies = stepCopies[g];
            ASSERT_EQ(copies.size(), expectedCopies.size()) << "group " << g;
            for (size_t i = 0; i < copies.size(); ++i)
            {
                EXPECT_EQ(copies[i].src, expectedCopies[i].src) << "group " << g << ", copy " << i;
                EXPECT_EQ(copies[i].dst, expectedCopies[i].dst) << "group " << g << ", copy " << i;
            }
            std::vector<int32_t> sorted = fresh;
            std::sort(sorted.begin(), sorted.end());
            ASSERT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end())
                << "group " << g << ": one page handed out twice in a step";

            // Poison what the step handed out, copy destinations included, so a missing copy or write shows; then
            // run the copies, one call for the group.
            rt::PageOpTarget target;
            target.group = g;
            rt::resetPages(mCache, fresh, mStream.get(), kPOISON_PATTERN, target);
            rt::copyPages(mCache, copies, mStream.get(), target);
        }

        // The model catches up with the step.
        for (size_t a = 0; a < appends.size(); ++a)
        {
            ModelSequence& sequence = mLive[appendedRows[a]];
            std::vector<int32_t> const& chunk = chunks[appendedRows[a]];
            sequence.lastAppendStart = static_cast<int32_t>(sequence.tokens.size());
            sequence.tokens.insert(sequence.tokens.end(), chunk.begin(), chunk.end());
            if (!sequence.pending.empty())
            {
                sequence.pending.erase(sequence.pending.begin(), sequence.pending.begin() + appends[a].count);
            }
        }

        // Page tables of every live sequence, row = its index in mLive, then the kernels write through them.
        std::vector<rt::SequencePages> rows(mLive.size());
        for (int32_t g = 0; g < numGroups; ++g)
        {
            for (size_t row = 0; row < mLive.size(); ++row)
            {
                rows[row] = mPages.pages(mLive[row].id, g);
            }
            mTables[static_cast<size_t>(g)].build(rows.data(), static_cast<int32_t>(rows.size()), mStream.get());
        }
        if (!appended.empty())
        {
            DeviceArray<AppendedToken> const deviceTokens(appended, mStream.get());
            for (int32_t layer = 0; layer < mCache.numLayers(); ++layer)
            {
                rt::PageTableBuffers const& table = mTables[static_cast<size_t>(mCache.groupOf(layer))];
                writeAppendedTokensKernel<<<static_cast<unsigned>(appended.size()), kWRITE_THREADS, 0, mStream.get()>>>(
                    mCache.layerRef(layer), table.deviceBlockTable(), table.deviceFirstToken(),
                    table.maxPagesPerSequence(), deviceTokens.get(), layer, mBadPages.get());
                KVCACHE_CUDA_TRY(cudaGetLastError());
            }
        }
        checkCache();
    }

    //! Compares every cached token of every live sequence with the model, and each windowed group's entries with the
    //! release rule.
    void checkCache()
    {
        ++mChecks;
        ASSERT_EQ(mBadPages.download(mStream.get())[0], 0) << "the block table gave a page outside the pool";
        int32_t const tokensPerPage = mTokensPerPage;
        for (int32_t layer = 0; layer < mCache.numLayers(); ++layer)
        {
            ModelLayer const& model = mModel.layers[static_cast<size_t>(layer)];
            int32_t const group = mCache.groupOf(layer);
            int32_t const window = static_cast<int32_t>(model.slidingWindow);
            std::vector<uint8_t> const bytes = downloadBytes(mCache.kPoolPtr(layer), model.layerBytes, mStream.get());
            int64_t mismatches = 0;
            for (ModelSequence const& sequence : mLive)
            {
                rt::SequencePages const pages = mPages.pages(sequence.id, group);
                int32_t const length = static_cast<int32_t>(sequence.tokens.size());
                ASSERT_EQ(pages.numTokens, length);
                ASSERT_EQ(pages.numPages, (length + tokensPerPage - 1) / tokensPerPage);
                for (int32_t i = 0; i < pages.numPages; ++i)
                {
                    // A windowed group releases a page once all its tokens lie more than window - 1 tokens before the
                    // first token of the latest append.
                    bool const released = window > 0 && sequence.lastAppendStart >= 0
                        && (i + 1) * tokensPerPage <= sequence.lastAppendStart - window + 1;
                    ASSERT_EQ(pages.pages[i] == rt::kUNUSED_PAGE_ENTRY, released)
                        << "layer " << layer << ", sequence " << sequence.id << ", page entry " << i << " of "
                        << pages.numPages << ", last append at " << sequence.lastAppendStart << ", window " << window;
                }
                for (int32_t position = 0; position < length; ++position)
                {
                    int32_t const page = pages.pages[position / tokensPerPage];
                    if (page == rt::kUNUSED_PAGE_ENTRY)
                    {
                        continue;
                    }
                    int32_t const token = sequence.tokens[static_cast<size_t>(position)];
                    for (int32_t kv = 0; kv < 2; ++kv)
                    {
                        for (int32_t head = 0; head < model.numKVHeads; ++head)
                        {
                            for (int32_t dim = 0; dim < model.headDim; ++dim)
                            {
                                uint16_t const expected =
                                    halfBits(tokenValue(sequence.salt, token, position, layer, kv, head, dim));
                                uint16_t got = 0;
                                std::memcpy(&got,
                                    &bytes[static_cast<size_t>(
                                        mModel.poolByteOffset(layer, kv, page, position % tokensPerPage, head, dim))],
                                    sizeof(got));
                                if (got != expected && mismatches++ < 5)
                                {
                                    ADD_FAILURE()
                                        << "layer " << layer << (kv == 0 ? " K" : " V") << ", sequence " << sequence.id
                                        << " (salt " << sequence.salt << "), position " << position << " on page "
                                        << page << ", head " << head << ", dim " << dim << ": got 0x" << std::hex << got
                                        << ", expected 0x" << expected << std::dec;
                                }
                            }
                        }
                    }
                }
            }
            ASSERT_EQ(mismatches, 0) << "layer " << layer << " after check " << mChecks;
        }
    }

    rt::KVCacheConfig mConfig;
    RunOptions mOptions;
    LayoutModel mModel;
    CudaStream mStream;
    rt::KVCacheManager mCache;
    rt::PageManager mPages;
    std::mt19937 mRandom;
    DeviceArray<int32_t> mBadPages;
    std::vector<rt::PageTableBuffers> mTables;
    std::vector<ModelSequence> mLive;
    std::map<int32_t, std::vector<int32_t>> mSystemPrompts;
    //! Salts of every sequence created so far: a prompt of a salt never seen before can hit nothing.
    std::set<int32_t> mSaltsSeen;
    int32_t mTokensPerPage{};
    int32_t mMaxPagesPerSequence{};
    int32_t mMaxStepTokens{};
    int32_t mForks{};
    int32_t mChecks{};
};

class PageManagerGpuTest : public GpuTest
{
};

//! Runs `options` on `config` and checks that the run exercised what it claims to check: forks, prefix hits,
//! copy-on-write and, when `expectEvictions`, evictions.
void runAndCheck(rt::KVCacheConfig const& config, RunOptions const& options, bool expectEvictions)
{
    ContinuousBatchingRun run(config, options);
    run.run();
    rt::PageManagerStats const stats = run.stats();
    EXPECT_GT(run.forks(), 0);
    EXPECT_GT(stats.prefixHitTokens, 0);
    EXPECT_GT(stats.copyOnWritePages, 0);
    if (expectEvictions)
    {
        EXPECT_GT(stats.evictedPages, 0);
    }
    EXPECT_GE(run.checks(), options.rounds);
}

TEST_F(PageManagerGpuTest, ContinuousBatchingOneGroup)
{
    // Two layers of different shapes, 10 sequences of up to 96 tokens in pages of 8: 120 pages, every page of which
    // the run fills, so cached pages get evicted.
    rt::KVCacheConfig const config =
        ConfigBuilder({{2, 32}, {1, 64}}).maxBatchSize(10).maxSequenceLength(96).tokensPerPage(8);
    runAndCheck(config, RunOptions{160, 21, 20, 3, 7}, true); // 21 tokens: two full pages and a partial one
}

TEST_F(PageManagerGpuTest, ContinuousBatchingFullAndSlidingWindow)
{
    // Full attention (group 0) and a window of 20 (group 1), prompts prefilled 16 tokens a step: the windowed group
    // keeps ceil((19 + 16) / 8) + 1 = 6 pages a sequence and releases the rest.
    rt::KVCacheConfig const config = ConfigBuilder({{2, 32}, {1, 64, 20}, {2, 16, 20}})
                                         .maxBatchSize(8)
                                         .maxSequenceLength(96)
                                         .tokensPerPage(8)
                                         .maxTokensPerStep(16);
    runAndCheck(config, RunOptions{160, 37, 30, 2, 11}, false);
}

} // namespace
} // namespace kvcache::test
