// Host tests of the library's internal adoption of a run of pages by their hashes
// (src/paging/page_manager/page_manager_internal.h, what the tiered prefix cache admits through): each group holds the
// pages it has registered and takes fresh pages, registered under the run's hashes, for the rest; a windowed group
// takes only the window at the run's end and lets go of the adopted prefix's pages that window leaves; a run that does
// not fit and a call the sequence cannot take change nothing. With state layers a run ends at a checkpoint, the
// device's or one the caller brings into a checkpoint slot the call takes, and is refused, changing nothing, without.

#include "paging/page_manager/page_manager_internal.h"

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_hash.h"
#include "kvcache/paging/page_manager.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/page_manager_inputs.h"

namespace kvcache::rt::detail
{
namespace
{

using test::throwsNaming;
using test::tokensFrom;

constexpr int32_t kP = 4;
constexpr int32_t kWINDOW = 6;

//! Full attention (group 0) and a window of kWINDOW tokens (group 1), `numPages` pages each (at least 10), 40 tokens a
//! sequence.
KVCacheConfig hybrid(int32_t numPages)
{
    return test::ConfigBuilder({{1, 8, kWINDOW}, {1, 8}})
        .maxBatchSize(1)
        .maxSequenceLength(40)
        .tokensPerPage(kP)
        .maxTokensPerStep(40)
        .numPagesPerGroup({numPages, numPages});
}

//! The first page the window needs before token `position`, from the rule: tokens more than kWINDOW - 1 back are out.
int32_t firstWindowPage(int32_t position)
{
    return std::max(0, position - kWINDOW + 1) / kP;
}

//! The entries [0, count) of `sequence` in `group`.
std::vector<int32_t> entriesOf(PageManager const& manager, SequenceId sequence, int32_t group, int32_t count)
{
    SequencePages const pages = manager.pages(sequence, group);
    return {pages.pages, pages.pages + count};
}

//! The hashes of `sequence`'s next pages over `tokens`, and the run they describe.
struct HashedRun
{
    std::vector<PageHash> hashes;
    NextPageHashes known;
};
HashedRun hashRun(
    PageManager const& manager, SequenceId sequence, std::vector<int32_t> const& tokens, int32_t from, int32_t pages)
{
    HashedRun run{std::vector<PageHash>(static_cast<size_t>(pages)), {}};
    run.known = PageManagerInternal::hashNextPages(
        manager, sequence, tokens.data() + from, pages * kP, run.hashes.data(), nullptr, 0);
    return run;
}

//! One full-attention group of 16 pages, 2 sequences (state slots 0 and 1), one state layer and `checkpointSlots`
//! checkpoint slots (state slots 2, 3, ...).
KVCacheConfig withState(int32_t checkpointSlots)
{
    return test::ConfigBuilder({{1, 8}})
        .maxBatchSize(2)
        .maxSequenceLength(32)
        .tokensPerPage(kP)
        .maxTokensPerStep(32)
        .numPages(16)
        .stateLayers({StateLayerConfig{{StateTensorConfig{"ssm", {4}, DataType::kFLOAT}}}})
        .numCheckpointSlots(checkpointSlots);
}

using CopyPairs = std::vector<std::pair<int32_t, int32_t>>;

CopyPairs pendingPairs(PageManager const& manager)
{
    CopyPairs pairs;
    for (StateSlotCopy const& copy : manager.pendingStateCopies())
    {
        pairs.emplace_back(copy.src, copy.dst);
    }
    return pairs;
}

//! Appends prompt[0, pages * kP) to a new sequence, checkpoints it there (`checkpoint`), hands the save out, appends
//! the rest and frees it: the prompt's pages stay cached.
void serveAndCheckpoint(PageManager& manager, std::vector<int32_t> const& prompt, int32_t pages, bool checkpoint)
{
    SequenceId const id = manager.create();
    manager.append({id, prompt.data(), pages * kP, nullptr, 0});
    if (checkpoint)
    {
        ASSERT_TRUE(manager.checkpointState(id));
    }
    manager.append({id, prompt.data() + pages * kP, static_cast<int32_t>(prompt.size()) - pages * kP, nullptr, 0});
    manager.free(id);
}

//! Expects `sequence`'s adoption of `run`'s first `pages` pages, with a state brought from the host when
//! `bringsState`, refused: no slot handed out and the sequence left empty.
void expectRunRefused(PageManager& manager, SequenceId sequence, HashedRun const& run, int32_t pages, bool bringsState)
{
    std::vector<std::vector<FreshPage>> fresh;
    int32_t fillSlot = 7;
    EXPECT_FALSE(PageManagerInternal::adoptRun(manager, run.known, pages, fresh, bringsState, &fillSlot));
    EXPECT_EQ(fillSlot, -1);
    EXPECT_EQ(manager.length(sequence), 0);
}

//! Expects a new sequence's run of `prompt`'s first 4 pages, its state brought from the host, refused.
void expectRunWithAHostStateRefused(PageManager& manager, std::vector<int32_t> const& prompt)
{
    SequenceId const second = manager.create();
    expectRunRefused(manager, second, hashRun(manager, second, prompt, 0, 4), 4, true);
}

TEST(PageManagerAdoptRun, WithStateLayersARunEndsAtTheDevicesCheckpointOrOneTheCallerBrings)
{
    PageManager manager(withState(2), test::seededOptions(2, 3));
    std::vector<int32_t> const prompt = tokensFrom(100, 5 * kP + 1);
    // Checkpointed after 3 pages (slot 2); the 5 pages stay cached.
    serveAndCheckpoint(manager, prompt, 3, true);
    ASSERT_EQ(manager.numCheckpoints(), 1);
    SequenceId const second = manager.create();
    HashedRun const run = hashRun(manager, second, prompt, 0, 5);
    // No checkpoint after 5 pages, none brought: refused, nothing changed.
    expectRunRefused(manager, second, run, 5, false);
    EXPECT_EQ(manager.counts(0).cached, 5);
    EXPECT_TRUE(pendingPairs(manager).empty());
    // The device's checkpoint after 3 pages: held pages, its restore queued (slot 2 into the sequence's).
    int32_t const slot = manager.stateSlot(second);
    std::vector<std::vector<FreshPage>> fresh;
    int32_t fillSlot = 7;
    ASSERT_TRUE(PageManagerInternal::adoptRun(manager, run.known, 3, fresh, true, &fillSlot));
    EXPECT_EQ(fillSlot, -1) << "the device's checkpoint serves; nothing to fill";
    EXPECT_EQ(manager.length(second), 3 * kP);
    EXPECT_EQ(pendingPairs(manager), (CopyPairs{{2, slot}}));
    EXPECT_EQ(manager.numCheckpoints(), 1);
    manager.checkInvariants();

    // Pages 4 and 5 with a state the caller holds: the empty checkpoint slot (3) becomes the checkpoint after 5 pages,
    // the restore out of it replaces the one queued before.
    HashedRun const rest = hashRun(manager, second, prompt, 3 * kP, 2);
    ASSERT_TRUE(PageManagerInternal::adoptRun(manager, rest.known, 2, fresh, true, &fillSlot));
    EXPECT_EQ(fillSlot, 3);
    EXPECT_EQ(manager.length(second), 5 * kP);
    EXPECT_EQ(manager.checkpointSlot(rest.hashes[1]), 3);
    EXPECT_EQ(manager.numCheckpoints(), 2);
    EXPECT_EQ(pendingPairs(manager), (CopyPairs{{3, slot}}));
    EXPECT_EQ(manager.stats().checkpointsRestored, 1) << "one adoption, one state restored";
    manager.checkInvariants();
}

TEST(PageManagerAdoptRun, WithStateLayersARunIsRefusedWhenItsCheckpointCannotBeRestored)
{
    std::vector<int32_t> const prompt = tokensFrom(300, 4 * kP + 1);
    {
        // A checkpoint still filling (its save not handed out): the host's copy is not taken instead.
        PageManager manager(withState(2), test::seededOptions(2, 3));
        SequenceId const first = manager.create();
        manager.append({first, prompt.data(), 4 * kP, nullptr, 0});
        ASSERT_TRUE(manager.checkpointState(first));
        expectRunWithAHostStateRefused(manager, prompt);
        EXPECT_EQ(pendingPairs(manager).size(), 1u) << "only the save";
        manager.checkInvariants();
    }
    {
        // Every checkpoint slot busy (its save queued): no slot for the host's state.
        PageManager manager(withState(1), test::seededOptions(2, 3));
        std::vector<int32_t> const other = tokensFrom(700, 2 * kP);
        serveAndCheckpoint(manager, prompt, 4, false);
        SequenceId const busy = manager.create();
        manager.append({busy, other.data(), 2 * kP, nullptr, 0});
        ASSERT_TRUE(manager.checkpointState(busy));
        expectRunWithAHostStateRefused(manager, prompt);
        EXPECT_EQ(manager.counts(0).cached, 4);
        manager.checkInvariants();
    }
    {
        // No checkpoint slots: the manager keeps no checkpoints, so no run's state can be restored.
        PageManager manager(withState(0), test::seededOptions(2, 3));
        serveAndCheckpoint(manager, prompt, 4, false);
        SequenceId const second = manager.create();
        HashedRun const run = hashRun(manager, second, prompt, 0, 4);
        std::vector<std::vector<FreshPage>> fresh;
        EXPECT_FALSE(PageManagerInternal::adoptRun(manager, run.known, 4, fresh, true));
        EXPECT_EQ(PageManagerInternal::checkpointGroup(manager), -1);
    }
}

TEST(PageManagerAdoptRun, HoldsThePagesEachGroupHasAndTakesFreshOnesForTheRest)
{
    PageManager manager(hybrid(16), test::seededOptions(4, 3));
    std::vector<int32_t> const prompt = tokensFrom(100, 6 * kP + 1);
    SequenceId const first = manager.create();
    manager.append({first, prompt.data(), 6 * kP + 1, nullptr, 0});
    std::vector<int32_t> const fullPages = entriesOf(manager, first, 0, 6);
    manager.free(first);
    // The windowed group loses every page; the full-attention group keeps its six cached.
    manager.evictCached(1, manager.counts(1).cached);
    ASSERT_EQ(manager.counts(0).cached, 6);
    SequenceId const second = manager.create();
    ASSERT_EQ(manager.adoptPrefix(second, prompt.data(), 6 * kP + 1), 0) << "no window on the device";

    HashedRun const run = hashRun(manager, second, prompt, 0, 6);
    std::vector<std::vector<FreshPage>> fresh;
    ASSERT_TRUE(PageManagerInternal::adoptRun(manager, run.known, 6, fresh));
    ASSERT_EQ(fresh.size(), 2u);
    EXPECT_TRUE(fresh[0].empty()) << "the full-attention group had every page";
    EXPECT_EQ(entriesOf(manager, second, 0, 6), fullPages);
    EXPECT_EQ(manager.counts(0).cached, 0);
    // The windowed group: the window before token 24, fresh, in index order; nothing before it.
    int32_t const window = firstWindowPage(6 * kP);
    ASSERT_EQ(fresh[1].size(), static_cast<size_t>(6 - window));
    std::vector<int32_t> const windowed = entriesOf(manager, second, 1, 6);
    for (int32_t p = 0; p < 6; ++p)
    {
        if (p < window)
        {
            EXPECT_EQ(windowed[static_cast<size_t>(p)], kUNUSED_PAGE_ENTRY) << "windowed entry " << p;
        }
        else
        {
            EXPECT_EQ(fresh[1][static_cast<size_t>(p - window)].index, p);
            EXPECT_EQ(fresh[1][static_cast<size_t>(p - window)].page, windowed[static_cast<size_t>(p)]);
        }
    }
    EXPECT_EQ(manager.length(second), 6 * kP);
    EXPECT_NO_THROW(manager.checkInvariants());

    // The fresh pages are registered under the run's hashes: once the sequence is freed, the prompt adopts the run from
    // the device.
    manager.free(second);
    SequenceId const third = manager.create();
    EXPECT_EQ(manager.adoptPrefix(third, prompt.data(), 6 * kP + 1), 6 * kP);
    EXPECT_NO_THROW(manager.checkInvariants());
}

TEST(PageManagerAdoptRun, ExtendsAnAdoptedPrefixAndLetsGoOfTheWindowItLeaves)
{
    PageManager manager(hybrid(16), test::seededOptions(4, 5));
    std::vector<int32_t> const prompt = tokensFrom(300, 8 * kP + 1);
    // A donor holds the prompt's first two pages, so that they are cached in both groups after it is freed.
    SequenceId const donor = manager.create();
    manager.append({donor, prompt.data(), 2 * kP + 1, nullptr, 0});
    manager.free(donor);
    SequenceId const sequence = manager.create();
    ASSERT_EQ(manager.adoptPrefix(sequence, prompt.data(), 8 * kP + 1), 2 * kP);
    std::vector<int32_t> const adoptedWindow = entriesOf(manager, sequence, 1, 2);
    int32_t const adoptedFirst = firstWindowPage(2 * kP);
    ASSERT_GE(adoptedWindow[static_cast<size_t>(adoptedFirst)], 0);

    HashedRun const run = hashRun(manager, sequence, prompt, 2 * kP, 6);
    EXPECT_EQ(run.known.firstPage, 2);
    std::vector<std::vector<FreshPage>> fresh;
    int64_t const cachedBefore = manager.counts(1).cached;
    ASSERT_TRUE(PageManagerInternal::adoptRun(manager, run.known, 6, fresh));
    EXPECT_EQ(manager.length(sequence), 8 * kP);
    EXPECT_EQ(fresh[0].size(), 6u) << "pages 2-7, none cached";
    // The window before token 32 starts past the adopted pages: they are let go (cached again, registered).
    int32_t const window = firstWindowPage(8 * kP);
    ASSERT_GE(window, 2);
    EXPECT_EQ(fresh[1].size(), static_cast<size_t>(8 - window));
    std::vector<int32_t> const windowed = entriesOf(manager, sequence, 1, 8);
    for (int32_t p = 0; p < window; ++p)
    {
        EXPECT_EQ(windowed[static_cast<size_t>(p)], kUNUSED_PAGE_ENTRY) << "windowed entry " << p;
    }
    EXPECT_EQ(manager.counts(1).cached, cachedBefore + (2 - adoptedFirst));
    EXPECT_NO_THROW(manager.checkInvariants());
}

TEST(PageManagerAdoptRun, ARunThatDoesNotFitChangesNothing)
{
    PageManager manager(hybrid(10), test::seededOptions(4, 7));
    std::vector<int32_t> const prompt = tokensFrom(500, 6 * kP + 1);
    // Another sequence holds seven pages of each group: three left, the run of six needs six in full attention.
    SequenceId const holder = manager.create();
    std::vector<int32_t> const other = tokensFrom(40, 7 * kP);
    manager.append({holder, other.data(), 7 * kP, nullptr, 0});
    SequenceId const sequence = manager.create();
    HashedRun const run = hashRun(manager, sequence, prompt, 0, 6);
    std::vector<std::vector<FreshPage>> fresh;
    PageGroupCounts const before = manager.counts(0);
    EXPECT_FALSE(PageManagerInternal::adoptRun(manager, run.known, 6, fresh));
    EXPECT_EQ(manager.length(sequence), 0);
    EXPECT_EQ(manager.counts(0).free, before.free);
    EXPECT_EQ(manager.counts(0).used, before.used);
    EXPECT_NO_THROW(manager.checkInvariants());
    // Three pages fit.
    EXPECT_TRUE(PageManagerInternal::adoptRun(manager, run.known, 3, fresh));
    EXPECT_EQ(manager.length(sequence), 3 * kP);
    EXPECT_EQ(manager.counts(0).free, 0);
    EXPECT_NO_THROW(manager.checkInvariants());
}

TEST(PageManagerAdoptRun, RefusesARunTheSequenceCannotTakeAndChangesNothing)
{
    PageManager manager(hybrid(16), test::seededOptions(4, 9));
    std::vector<int32_t> const prompt = tokensFrom(7, 4 * kP);
    SequenceId const a = manager.create();
    SequenceId const b = manager.create();
    HashedRun const run = hashRun(manager, a, prompt, 0, 3);
    std::vector<std::vector<FreshPage>> fresh;
    auto const unchanged = [&]
    {
        EXPECT_EQ(manager.length(a), 0);
        EXPECT_EQ(manager.counts(0).used, 0);
        EXPECT_EQ(manager.counts(1).used, 0);
        EXPECT_NO_THROW(manager.checkInvariants());
    };
    for (int32_t const pages : {0, 4, -1})
    {
        EXPECT_TRUE(
            throwsNaming<InvalidArgumentError>([&] { PageManagerInternal::adoptRun(manager, run.known, pages, fresh); },
                {"adoptRun", "pages is " + std::to_string(pages), "[1, 3]"}));
        unchanged();
    }
    // Another sequence whose chain the hashes do not continue: b holds a page of other tokens.
    std::vector<int32_t> const other = tokensFrom(900, kP);
    manager.append({b, other.data(), kP, nullptr, 0});
    NextPageHashes ofB = run.known;
    ofB.sequence = b;
    ofB.firstPage = 1;
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { PageManagerInternal::adoptRun(manager, ofB, 3, fresh); }, {"adoptRun", "hash chain"}));
    EXPECT_EQ(manager.length(b), kP);
    // A sequence that moved on since the hashes were taken.
    manager.append({a, prompt.data(), 3, nullptr, 0});
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { PageManagerInternal::adoptRun(manager, run.known, 3, fresh); },
        {"adoptRun", "3 tokens", "0 whole pages"}));
    EXPECT_EQ(manager.length(a), 3);
    EXPECT_NO_THROW(manager.checkInvariants());

    // Prefix caching off: nothing is registered, so nothing can be adopted by hash.
    PageManager plain(hybrid(16), test::seededOptions(2, 9, false));
    SequenceId const c = plain.create();
    HashedRun const plainRun = hashRun(plain, c, prompt, 0, 2);
    EXPECT_TRUE(
        throwsNaming<InvalidArgumentError>([&] { PageManagerInternal::adoptRun(plain, plainRun.known, 2, fresh); },
            {"adoptRun", "prefix caching is off"}));
    EXPECT_EQ(plain.length(c), 0);
}

} // namespace
} // namespace kvcache::rt::detail
