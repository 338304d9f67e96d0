// The step argument building (src/paging/page_table/step_arguments_build.h, no GPU) against an independent
// construction from PageManager::pages(), length() and stateSlot(): steps of prefill and decode entries, a full and a
// windowed group (the windowed group's rows as wide as its pagesPerSequence, far fewer than its sequences' pages),
// forks, entries of 0 tokens, two staging regions in turn, state slots with and without state layers (with them also
// by hand, from the slot order of PageManager's comment); and the refusals, which name the field, the value and the
// limit and leave the region as it was.

#include "paging/page_table/step_arguments_build.h"

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_manager.h"
#include "kvcache/paging/step_arguments.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/error_matchers.h"
#include "support/page_manager_inputs.h"
#include "support/page_table_reference.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::ConfigBuilder;
using kvcache::test::throwsNaming;
using namespace kvcache::test::page_tables;

constexpr int32_t kMAX_BATCH = 4;
constexpr int32_t kMAX_TOKENS = 16;
constexpr int32_t kTOKENS_PER_PAGE = 4;
constexpr int32_t kMAX_LENGTH = 96;

//! A full-attention layer (group 0: 24 pages a sequence) and one with a window of 6 tokens (group 1): with 16 tokens a
//! step a sequence holds at most ceil((6 - 1 + 16) / 4) + 1 = 7 windowed pages, while it covers up to 24.
rt::KVCacheConfig twoGroups()
{
    return ConfigBuilder({{1, 8}, {1, 8, 6}})
        .maxBatchSize(kMAX_BATCH)
        .maxSequenceLength(kMAX_LENGTH)
        .tokensPerPage(kTOKENS_PER_PAGE)
        .maxTokensPerStep(kMAX_TOKENS)
        .numPagesPerGroup({200, 60});
}

//! twoGroups() with a Mamba2-like state layer (a conv and an SSM state) and 2 checkpoint slots: state slots
//! [0, kMAX_BATCH) for the sequences.
rt::KVCacheConfig twoGroupsWithState()
{
    std::vector<rt::StateLayerConfig> const stateLayers{
        rt::StateLayerConfig{{rt::StateTensorConfig{"conv", {8, 3}, rt::DataType::kHALF},
            rt::StateTensorConfig{"ssm", {2, 4, 4}, rt::DataType::kFLOAT}}}};
    return ConfigBuilder({{1, 8}, {1, 8, 6}})
        .maxBatchSize(kMAX_BATCH)
        .maxSequenceLength(kMAX_LENGTH)
        .tokensPerPage(kTOKENS_PER_PAGE)
        .maxTokensPerStep(kMAX_TOKENS)
        .numPagesPerGroup({200, 60})
        .stateLayers(stateLayers)
        .numCheckpointSlots(2);
}

//! A step entry as the test holds it: the sequence and its new tokens.
struct Entry
{
    rt::SequenceId sequence;
    std::vector<int32_t> tokens;
};

//! Returns the SequenceAppend list of `entries` (pointing into them).
std::vector<rt::SequenceAppend> appendsOf(std::vector<Entry> const& entries)
{
    std::vector<rt::SequenceAppend> appends;
    for (Entry const& entry : entries)
    {
        appends.push_back({entry.sequence, entry.tokens.data(), static_cast<int32_t>(entry.tokens.size()), nullptr, 0});
    }
    return appends;
}

//! The step arguments of the documentation, written from the manager's pages() and length() alone.
struct Expected
{
    int32_t tokenCount = 0;
    std::vector<int32_t> qoIndptr;
    //! maxBatchSize rows: each entry's stateSlot(), then -1.
    std::vector<int32_t> stateSlots;
    //! Two int32 a row (sequence, position), maxTokensPerStep rows.
    std::vector<int32_t> positions;
    std::vector<Tables> groups;
};

Expected expectedArguments(rt::PageManager const& manager, std::vector<Entry> const& entries)
{
    Expected expected;
    expected.qoIndptr.push_back(0);
    for (size_t b = 0; b < entries.size(); ++b)
    {
        int32_t const length = manager.length(entries[b].sequence);
        auto const appended = static_cast<int32_t>(entries[b].tokens.size());
        for (int32_t position = length - appended; position < length; ++position)
        {
            expected.positions.push_back(static_cast<int32_t>(b));
            expected.positions.push_back(position);
        }
        expected.tokenCount += appended;
        expected.qoIndptr.push_back(expected.tokenCount);
        expected.stateSlots.push_back(manager.stateSlot(entries[b].sequence));
    }
    expected.qoIndptr.resize(kMAX_BATCH + 1, expected.tokenCount);
    expected.stateSlots.resize(kMAX_BATCH, -1);
    while (expected.positions.size() < 2 * size_t{kMAX_TOKENS})
    {
        expected.positions.push_back(-1);
        expected.positions.push_back(0);
    }
    for (int32_t g = 0; g < manager.numGroups(); ++g)
    {
        Batch batch;
        for (Entry const& entry : entries)
        {
            rt::SequencePages const pages = manager.pages(entry.sequence, g);
            batch.pages.emplace_back(pages.pages, pages.pages + pages.numPages);
            batch.tokens.push_back(manager.length(entry.sequence));
        }
        Sizes const sizes{
            kMAX_BATCH, manager.layout().groups[static_cast<size_t>(g)].pagesPerSequence, kTOKENS_PER_PAGE};
        expected.groups.push_back(referenceTables(batch, sizes));
    }
    return expected;
}

//! Returns the arguments `region` holds, read through `shape`'s offsets.
Expected readArguments(rt::detail::StepArgumentShape const& shape, std::vector<int32_t> const& region)
{
    Expected actual;
    actual.tokenCount = region[static_cast<size_t>(shape.tokenCountOffset())];
    int32_t const* const qoIndptr = region.data() + shape.qoIndptrOffset();
    actual.qoIndptr.assign(qoIndptr, qoIndptr + shape.maxBatchSize + 1);
    int32_t const* const stateSlots = region.data() + shape.stateSlotsOffset();
    actual.stateSlots.assign(stateSlots, stateSlots + shape.maxBatchSize);
    int32_t const* const positions = region.data() + shape.positionsOffset();
    actual.positions.assign(positions, positions + 2 * int64_t{shape.maxTokensPerStep});
    for (int32_t g = 0; g < shape.numGroups(); ++g)
    {
        rt::detail::PageTableShape const& group = shape.groups[static_cast<size_t>(g)];
        int32_t const* const start = region.data() + shape.groupOffsets[static_cast<size_t>(g)];
        TableViews const views{start + group.indptrOffset(), start + group.indicesOffset(),
            start + group.lastPageLenOffset(), start + group.blockTableOffset(), start + group.firstTokenOffset(),
            start + group.residentTokensOffset()};
        actual.groups.push_back(
            readTables(views, Sizes{group.maxBatchSize, group.maxPagesPerSequence, group.tokensPerPage}));
    }
    return actual;
}

::testing::AssertionResult sameArguments(Expected const& expected, Expected const& actual)
{
    if (expected.tokenCount != actual.tokenCount)
    {
        return ::testing::AssertionFailure()
            << "token count " << actual.tokenCount << ", expected " << expected.tokenCount;
    }
    if (expected.qoIndptr != actual.qoIndptr)
    {
        return ::testing::AssertionFailure() << "qoIndptr differs";
    }
    if (expected.stateSlots != actual.stateSlots)
    {
        return ::testing::AssertionFailure() << "state slots differ";
    }
    if (expected.positions != actual.positions)
    {
        return ::testing::AssertionFailure() << "positions differ";
    }
    for (size_t g = 0; g < expected.groups.size(); ++g)
    {
        ::testing::AssertionResult const same = sameTables(expected.groups[g], actual.groups[g]);
        if (!same)
        {
            return ::testing::AssertionFailure() << "group " << g << ": " << same.message();
        }
    }
    return ::testing::AssertionSuccess();
}

//! Returns a region of `shape`, poisoned and then written with the arguments of an empty step.
std::vector<int32_t> emptyStepRegion(rt::detail::StepArgumentShape const& shape)
{
    std::vector<int32_t> region(static_cast<size_t>(shape.elements()));
    std::memset(region.data(), kPOISON_BYTE, region.size() * sizeof(int32_t));
    rt::detail::writeEmptyStepArguments(shape, region.data());
    return region;
}

//! Returns `count` token ids.
std::vector<int32_t> someTokens(int32_t count, int32_t first)
{
    std::vector<int32_t> tokens;
    for (int32_t t = 0; t < count; ++t)
    {
        tokens.push_back(first + t);
    }
    return tokens;
}

//! Drives a manager through steps and builds each step's arguments into two regions in turn, as the staging does.
struct StepsUnderTest
{
    //! Without state layers: 8 sequences; with them, kMAX_BATCH (their state slots).
    explicit StepsUnderTest(bool withState = false)
        : manager(
            withState ? twoGroupsWithState() : twoGroups(), kvcache::test::seededOptions(withState ? kMAX_BATCH : 8, 3))
        , shape(rt::detail::makeStepArgumentShape(manager, kMAX_BATCH, kMAX_TOKENS))
        , regions{emptyStepRegion(shape), emptyStepRegion(shape)}
    {
    }

    //! Runs `entries` as a step, then build(entries).
    ::testing::AssertionResult step(std::vector<Entry> const& entries)
    {
        std::vector<rt::SequenceAppend> const appends = appendsOf(entries);
        manager.step(appends.data(), static_cast<int32_t>(appends.size()));
        return build(entries);
    }

    //! Builds the arguments of `entries` (appended already) into the next region and checks them against the
    //! independent construction.
    ::testing::AssertionResult build(std::vector<Entry> const& entries)
    {
        std::vector<rt::SequenceAppend> const appends = appendsOf(entries);
        std::vector<int32_t>& region = regions[builds++ % 2];
        int64_t const elements = rt::detail::buildStepArguments(
            shape, manager, appends.data(), static_cast<int32_t>(appends.size()), region.data(), scratch);
        Expected const expected = expectedArguments(manager, entries);
        // The upload reaches through the last group's indices in use.
        int64_t const uploaded = shape.groupOffsets[shape.groups.size() - 1] + shape.groups.back().indicesOffset()
            + static_cast<int64_t>(expected.groups.back().indices.size());
        if (elements != uploaded)
        {
            return ::testing::AssertionFailure() << "upload of " << elements << " elements, expected " << uploaded;
        }
        return sameArguments(expected, readArguments(shape, region));
    }

    rt::PageManager manager;
    rt::detail::StepArgumentShape shape;
    std::vector<int32_t> regions[2];
    rt::detail::StepScratch scratch;
    int32_t builds = 0;
};

TEST(StepArgumentsBuildTest, TheShapeLaysOutEachGroupAtItsOwnWidth)
{
    rt::PageManager const manager(twoGroups(), kvcache::test::seededOptions(8, 3));
    rt::detail::StepArgumentShape const shape = rt::detail::makeStepArgumentShape(manager, kMAX_BATCH, kMAX_TOKENS);
    ASSERT_EQ(shape.numGroups(), 2);
    // Full attention: 96 / 4 = 24 pages; the window: ceil((6 - 1 + 16) / 4) + 1 = 7.
    EXPECT_EQ(shape.groups[0].maxPagesPerSequence, 24);
    EXPECT_EQ(shape.groups[1].maxPagesPerSequence, 7);
    // 128-byte parts (32 int32): the count, qoIndptr (5), the state slots (4), positions (32), then the groups.
    EXPECT_EQ(shape.qoIndptrOffset(), 32);
    EXPECT_EQ(shape.stateSlotsOffset(), 64);
    EXPECT_EQ(shape.positionsOffset(), 96);
    EXPECT_EQ(shape.groupOffsets[0], 128);
    EXPECT_EQ(shape.groupOffsets[1], 128 + shape.groups[0].elements());
    EXPECT_EQ(shape.elements(), shape.groupOffsets[1] + shape.groups[1].elements());
}

TEST(StepArgumentsBuildTest, StepsOfPrefillDecodeForksAndEmptyEntriesGiveTheIndependentArguments)
{
    StepsUnderTest sut;
    rt::PageManager& manager = sut.manager;
    rt::SequenceId const a = manager.create();
    rt::SequenceId const b = manager.create();
    // Prefill: 10 and 6 tokens.
    ASSERT_TRUE(sut.step({{a, someTokens(10, 100)}, {b, someTokens(6, 200)}}));
    // Decode both, and a new sequence's prefill of 9 tokens in the same step.
    rt::SequenceId const c = manager.create();
    ASSERT_TRUE(sut.step({{a, {1}}, {c, someTokens(9, 300)}, {b, {2}}}));
    // A fork of a: its first write copies the shared partial page. b takes no token this step (a row, no queries).
    rt::SequenceId const d = manager.fork(a);
    ASSERT_TRUE(sut.step({{d, {7}}, {b, {}}, {a, {8}}}));
    // Decode until the sequences are far longer than the window's 7 pages, the batch shrinking and growing.
    for (int32_t round = 0; round < 70; ++round)
    {
        SCOPED_TRACE("round " + std::to_string(round));
        std::vector<Entry> entries;
        if (round % 5 != 4)
        {
            entries.push_back({a, {round}});
        }
        entries.push_back({d, {round + 1}});
        if (round % 3 == 0)
        {
            entries.push_back({c, {}});
        }
        if (round < 20)
        {
            entries.push_back({b, someTokens(round % 4, round)});
        }
        ASSERT_TRUE(sut.step(entries));
    }
    // The windowed rows now start far into their sequences; the full rows hold every page.
    EXPECT_GT(manager.length(d), 7 * kTOKENS_PER_PAGE * 2);
    rt::SequencePages const windowed = manager.pages(d, 1);
    EXPECT_GT(windowed.numPages, 7);
    // An empty step, then one after the largest: padding returns where rows were used.
    ASSERT_TRUE(sut.step({}));
    ASSERT_TRUE(sut.step({{a, {1}}, {d, {2}}, {c, {}}, {b, {3}}}));
    manager.free(d);
    ASSERT_TRUE(sut.step({{b, {4}}}));
}

TEST(StepArgumentsBuildTest, StateSlotsFollowForksAndReusedSlotsAndPadWithMinusOne)
{
    StepsUnderTest sut(true);
    rt::PageManager& manager = sut.manager;
    rt::detail::StepArgumentShape const& shape = sut.shape;
    auto const slotsOf = [&](int32_t region)
    {
        int32_t const* const slots = sut.regions[region].data() + shape.stateSlotsOffset();
        return std::vector<int32_t>(slots, slots + kMAX_BATCH);
    };
    rt::SequenceId const a = manager.create();
    rt::SequenceId const b = manager.create();
    rt::SequenceId const c = manager.create();
    ASSERT_TRUE(sut.step({{a, someTokens(5, 1)}, {b, someTokens(3, 10)}, {c, someTokens(2, 20)}}));
    // By hand: slots 0, 1, 2 in creation order; row 3 padding (region 0).
    EXPECT_EQ(slotsOf(0), (std::vector<int32_t>{0, 1, 2, -1}));
    // A fork of a takes the unused slot 3; b freed, e takes b's slot 1 (the most recently freed first).
    rt::SequenceId const d = manager.fork(a);
    manager.free(b);
    rt::SequenceId const e = manager.create();
    ASSERT_EQ(manager.stateSlot(e), 1);
    // Rows in an order unlike the slots', one entry of 0 tokens (region 1).
    ASSERT_TRUE(sut.step({{d, {7}}, {e, someTokens(4, 30)}, {a, {8}}, {c, {}}}));
    EXPECT_EQ(slotsOf(1), (std::vector<int32_t>{3, 1, 0, 2}));
    ASSERT_TRUE(sut.step({{c, {1}}, {d, {2}}, {e, {3}}, {a, {4}}}));
    EXPECT_EQ(slotsOf(0), (std::vector<int32_t>{2, 3, 1, 0}));
    // A smaller build into each region puts -1 back where the larger one wrote slots.
    ASSERT_TRUE(sut.step({{e, {5}}}));
    EXPECT_EQ(slotsOf(1), (std::vector<int32_t>{1, -1, -1, -1}));
    ASSERT_TRUE(sut.step({}));
    EXPECT_EQ(slotsOf(0), (std::vector<int32_t>{-1, -1, -1, -1}));
    // A sequence listed twice (a build of arguments only: a step appends to a sequence once): two rows of its slot.
    ASSERT_TRUE(sut.build({{d, {}}, {a, {}}, {d, {}}}));
    EXPECT_EQ(slotsOf(1), (std::vector<int32_t>{3, 0, 3, -1}));
}

TEST(StepArgumentsBuildTest, WithoutStateLayersEveryStateSlotRowIsMinusOne)
{
    StepsUnderTest sut;
    rt::PageManager& manager = sut.manager;
    ASSERT_TRUE(manager.layout().stateLayers.empty());
    rt::SequenceId const a = manager.create();
    rt::SequenceId const b = manager.create();
    ASSERT_TRUE(sut.step({{a, someTokens(5, 1)}, {b, someTokens(3, 10)}}));
    ASSERT_TRUE(sut.step({{b, {1}}, {a, {2}}}));
    ASSERT_TRUE(sut.build({{b, {1}}, {a, {2}}, {b, {}}, {a, {}}}));
    for (std::vector<int32_t> const& region : sut.regions)
    {
        int32_t const* const slots = region.data() + sut.shape.stateSlotsOffset();
        EXPECT_EQ((std::vector<int32_t>(slots, slots + kMAX_BATCH)), (std::vector<int32_t>(kMAX_BATCH, -1)));
    }
}

TEST(StepArgumentsBuildTest, APrefillOfMaxTokensPerStepFillsEveryPositionRow)
{
    StepsUnderTest sut;
    rt::SequenceId const a = sut.manager.create();
    rt::SequenceId const b = sut.manager.create();
    ASSERT_TRUE(sut.step({{a, someTokens(11, 1)}, {b, someTokens(5, 50)}}));
    // Rows 0-10 are a's positions 0-10, rows 11-15 b's 0-4: no padding row is left.
    rt::detail::StepArgumentShape const& shape = sut.shape;
    int32_t const* const positions = sut.regions[0].data() + shape.positionsOffset();
    EXPECT_EQ(positions[2 * 10], 0);
    EXPECT_EQ(positions[2 * 10 + 1], 10);
    EXPECT_EQ(positions[2 * 11], 1);
    EXPECT_EQ(positions[2 * 11 + 1], 0);
    EXPECT_EQ(positions[2 * 15 + 1], 4);
    int32_t const* const qoIndptr = sut.regions[0].data() + shape.qoIndptrOffset();
    EXPECT_EQ((std::vector<int32_t>(qoIndptr, qoIndptr + kMAX_BATCH + 1)), (std::vector<int32_t>{0, 11, 16, 16, 16}));
}

TEST(StepArgumentsBuildTest, BadStepsNameTheFieldAndLeaveTheRegionAsItWas)
{
    StepsUnderTest sut;
    rt::PageManager& manager = sut.manager;
    rt::SequenceId const a = manager.create();
    rt::SequenceId const b = manager.create();
    rt::SequenceId const gone = manager.create();
    ASSERT_TRUE(sut.step({{a, someTokens(6, 1)}, {b, someTokens(3, 9)}, {gone, {5}}}));
    manager.free(gone);
    std::vector<int32_t>& region = sut.regions[0];
    std::vector<int32_t> const before = region;
    auto const refused = [&](std::vector<rt::SequenceAppend> const& appends, int32_t count,
                             std::vector<std::string> const& named, bool nullList = false)
    {
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&]
            {
                rt::detail::buildStepArguments(
                    sut.shape, manager, nullList ? nullptr : appends.data(), count, region.data(), sut.scratch);
            },
            named))
            << named.front();
        EXPECT_EQ(region, before) << "a refused build changed the region: " << named.front();
    };
    rt::SequenceAppend const one{a, nullptr, 1, nullptr, 0};
    refused({one, one, one, one, one}, 5, {"StepArgumentBuffers::build: count is 5", "[0, 4]", "maxBatchSize"});
    refused({one}, -1, {"count is -1", "[0, 4]"});
    refused({}, 2, {"entries is null with count 2"}, true);
    refused({one, {gone, nullptr, 1, nullptr, 0}}, 2,
        {"entries[1].sequence is " + std::to_string(gone), "holds no such sequence"});
    refused({one, {12345, nullptr, 0, nullptr, 0}}, 2, {"entries[1].sequence is 12345"});
    refused({{b, nullptr, 4, nullptr, 0}}, 1, {"entries[0].count is 4", "[0, 3]", "length of sequence"});
    refused({one, {b, nullptr, -1, nullptr, 0}}, 2, {"entries[1].count is -1", "[0, 3]"});
    // 6 + 3 + 6 + 3 = 18 tokens of a step that takes 16.
    rt::SequenceAppend const allOfA{a, nullptr, 6, nullptr, 0};
    rt::SequenceAppend const allOfB{b, nullptr, 3, nullptr, 0};
    refused({allOfA, allOfB, allOfA, allOfB}, 4, {"add up to 18 tokens", "at most 16", "maxTokensPerStep"});
    // A manager of other groups.
    rt::PageManager const other(
        ConfigBuilder({{1, 8}}).maxBatchSize(kMAX_BATCH).maxSequenceLength(kMAX_LENGTH).tokensPerPage(kTOKENS_PER_PAGE),
        kvcache::test::seededOptions(8, 3));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&]
        { rt::detail::buildStepArguments(sut.shape, other, nullptr, 0, region.data(), sut.scratch); },
        {"the manager has 1 page groups", "sized for 2"}));
    EXPECT_EQ(region, before);
    // The next good build is exact.
    ASSERT_TRUE(sut.step({{a, {1}}, {b, {2}}}));
    ASSERT_TRUE(sut.step({{b, {3}}}));
}

TEST(StepArgumentsBuildTest, NonPositiveSizesAreRefusedNamingTheField)
{
    rt::PageManager const manager(twoGroups(), kvcache::test::seededOptions(8, 3));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::detail::makeStepArgumentShape(manager, 0, kMAX_TOKENS); }, {"maxBatchSize is 0", "> 0"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::detail::makeStepArgumentShape(manager, kMAX_BATCH, -3); }, {"maxTokensPerStep is -3", "> 0"}));
    // The same checks run before any CUDA call in the constructor.
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::StepArgumentBuffers(manager, 0, kMAX_TOKENS, nullptr); }, {"maxBatchSize is 0"}));
}

TEST(StepArgumentsBuildTest, AnEmptyObjectOwnsNothingAndRefusesToBuild)
{
    rt::PageManager const manager(twoGroups(), kvcache::test::seededOptions(8, 3));
    rt::StepArgumentBuffers arguments;
    EXPECT_EQ(arguments.numGroups(), 0);
    EXPECT_EQ(arguments.maxBatchSize(), 0);
    EXPECT_EQ(arguments.devicePositions(), nullptr);
    EXPECT_EQ(arguments.hostQoIndptr(), nullptr);
    EXPECT_EQ(arguments.deviceStateSlots(), nullptr);
    EXPECT_EQ(arguments.hostStateSlots(), nullptr);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { arguments.build(manager, nullptr, 0, nullptr); }, {"StepArgumentBuffers::build", "owns no buffers"}));
    EXPECT_THROW(static_cast<void>(arguments.table(0)), rt::OutOfRangeError);
}

} // namespace
