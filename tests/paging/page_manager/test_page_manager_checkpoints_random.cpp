// Random runs of a PageManager's state checkpoints (the "State checkpoints" paragraph of
// kvcache/paging/page_manager.h) against the model of the header's rules (tests/support/state_checkpoint_model.h):
// creates, prompts adopted and appended up to the boundaries asked for, saves, forks, frees and empty steps, with the
// queued copies, the checkpoints held and the slot of each prefix compared after every operation.

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "support/page_manager_inputs.h"
#include "support/state_checkpoint_inputs.h"
#include "support/state_checkpoint_model.h"

namespace kvcache::test
{
namespace
{

constexpr int32_t kPAGE = kCHECKPOINT_TOKENS_PER_PAGE;
constexpr int32_t kMAX_LENGTH = kCHECKPOINT_MAX_LENGTH;

void randomRun(uint32_t seed, int32_t numSlots, int32_t intervalPages)
{
    SCOPED_TRACE(::testing::Message() << "seed " << seed << ", " << numSlots << " slots, every " << intervalPages);
    constexpr int32_t kBATCH = 4;
    rt::PageManager manager(checkpointConfig(kBATCH, numSlots, 4096), checkpointOptions(intervalPages));
    CheckpointModel model(numSlots, kBATCH, intervalPages, kPAGE, kMAX_LENGTH);
    std::mt19937 random(seed);
    // Three families of 40 tokens: prompts share their prefixes; suffixes from 2 tokens often coincide too.
    std::vector<TokenList> families;
    for (int32_t f = 0; f < 3; ++f)
    {
        families.push_back(tokensFrom(1000 * (f + 1), 40));
    }
    std::map<rt::SequenceId, TokenList> prompts;
    std::vector<rt::SequenceId> live;
    int64_t hits = 0;
    int64_t saves = 0;
    auto const check = [&]
    {
        ASSERT_EQ(pairsOf(manager.pendingStateCopies()), model.queued());
        ASSERT_EQ(manager.numCheckpoints(), model.held());
        std::vector<TokenList> const prefixes = model.prefixes();
        for (size_t c = 0; c < prefixes.size(); ++c)
        {
            if (!prefixes[c].empty())
            {
                auto const pages = static_cast<int32_t>(prefixes[c].size()) / kPAGE;
                ASSERT_EQ(
                    manager.checkpointSlot(prefixHash(manager, prefixes[c], pages)), kBATCH + static_cast<int32_t>(c));
            }
        }
        manager.checkInvariants();
    };
    for (int32_t op = 0; op < 2500; ++op)
    {
        int32_t const kind = static_cast<int32_t>(random() % 10);
        if (kind < 3 && manager.numSequences() < kBATCH)
        {
            rt::SequenceId id = -1;
            try
            {
                id = manager.create();
            }
            catch (rt::InvalidArgumentError const&)
            {
                continue; // the free rows are held until the next step
            }
            model.create(id, manager.stateSlot(id));
            TokenList prompt = families[random() % families.size()];
            prompt.resize(4 + random() % 37);
            for (auto extra = random() % 13; extra > 0; --extra)
            {
                prompt.push_back(static_cast<int32_t>(random() % 2));
            }
            int32_t const adopted = manager.adoptPrefix(id, prompt.data(), static_cast<int32_t>(prompt.size()));
            ASSERT_EQ(adopted, model.adopt(id, prompt));
            hits += adopted > 0 ? 1 : 0;
            prompts[id] = prompt;
            live.push_back(id);
        }
        else if (kind < 6 && !live.empty())
        {
            // A prefill chunk, or a decoded token past the prompt, ending at the boundary asked for when it comes
            // first; the state saved there.
            rt::SequenceId const id = live[random() % live.size()];
            TokenList const& prompt = prompts.at(id);
            auto const length = static_cast<int32_t>(model.tokens(id).size());
            int32_t const boundary = manager.checkpointBoundary(id);
            ASSERT_EQ(boundary, model.boundary(id));
            int32_t end = length < static_cast<int32_t>(prompt.size())
                ? std::min(static_cast<int32_t>(prompt.size()), length + 1 + static_cast<int32_t>(random() % 16))
                : length + 1;
            end = boundary > length ? std::min(end, boundary) : end;
            if (end > kMAX_LENGTH)
            {
                continue;
            }
            TokenList chunk;
            for (int32_t t = length; t < end; ++t)
            {
                chunk.push_back(t < static_cast<int32_t>(prompt.size()) ? prompt[static_cast<size_t>(t)] : 7);
            }
            rt::SequenceAppend const append{id, chunk.data(), static_cast<int32_t>(chunk.size())};
            ASSERT_EQ(pairsOf(manager.append(append).stateCopies()), model.step({{id, chunk}}));
            if (end == boundary)
            {
                bool const kept = manager.checkpointState(id);
                ASSERT_EQ(kept, model.checkpoint(id));
                saves += kept ? 1 : 0;
            }
        }
        else if (kind < 7 && !live.empty())
        {
            // A save at any whole page the runtime chooses.
            rt::SequenceId const id = live[random() % live.size()];
            auto const length = static_cast<int32_t>(model.tokens(id).size());
            if (length > 0 && length % kPAGE == 0)
            {
                ASSERT_EQ(manager.checkpointState(id), model.checkpoint(id));
            }
        }
        else if (kind < 8 && !live.empty() && manager.numSequences() < kBATCH)
        {
            rt::SequenceId const parent = live[random() % live.size()];
            rt::SequenceId child = -1;
            try
            {
                child = manager.fork(parent);
            }
            catch (rt::InvalidArgumentError const&)
            {
                continue;
            }
            model.fork(parent, child, manager.stateSlot(child));
            prompts[child] = prompts.at(parent);
            live.push_back(child);
        }
        else if (kind < 9 && !live.empty())
        {
            size_t const index = random() % live.size();
            manager.free(live[index]);
            model.free(live[index]);
            live.erase(live.begin() + static_cast<int64_t>(index));
        }
        else
        {
            ASSERT_EQ(pairsOf(manager.step(nullptr, 0).stateCopies()), model.step({}));
        }
        check();
        if (::testing::Test::HasFatalFailure())
        {
            return;
        }
    }
    // The run must have exercised what it checks.
    EXPECT_GT(hits, 20);
    EXPECT_GT(saves, 20);
    EXPECT_EQ(manager.stats().evictedPages, 0);
    EXPECT_EQ(manager.stats().checkpointsRestored, hits);
}

TEST(StateCheckpoints, RandomRunsFollowTheModel)
{
    for (uint32_t seed = 1; seed <= 3; ++seed)
    {
        randomRun(seed, 3, 0);
        randomRun(seed + 100, 1, 2);
        randomRun(seed + 200, 8, 5);
    }
}

} // namespace
} // namespace kvcache::test
