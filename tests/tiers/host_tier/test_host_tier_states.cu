// The host tier's host state contract, instantiated over every variant of support/host_tier_contract.h whose cache
// has state layers: state slots round trip bit for bit into other slots against the independent state model
// (support/host_state_reference.h), every other slot and page unchanged; an onboard on another stream waits for the
// offload in flight on its host state; the host state pool; sequence files holding a state with the pages; and every
// refusal, with the named error and nothing changed. test_host_tier_contract.cu checks that caches without state layers
// refuse every state call.

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/tiers/host_tier.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "support/cuda_raii.h"
#include "support/error_matchers.h"
#include "support/held_stream.cuh"
#include "support/host_tier_contract.h"

namespace kvcache::rt
{
namespace
{

using test::CudaStream;
using test::hostStateContents;
using test::kHOST_STATE_POISON;
using test::poisonHostState;
using test::throwsNaming;

//! The contract's fixture, over the variants with state layers.
class HostTierStateContract : public test::HostTierContract
{
protected:
    //! Returns a tier of two host pages and the variant's host states, each host state poisoned.
    std::unique_ptr<HostTier> makeStateTier()
    {
        auto tier = makeTier(2, options());
        for (int32_t hostState = 0; hostState < tier->numHostStates(); ++hostState)
        {
            poisonHostState(*tier, hostState);
        }
        return tier;
    }
    //! Returns what a poisoned host state holds.
    std::vector<uint8_t> poisonedHostState()
    {
        return std::vector<uint8_t>(static_cast<size_t>(states().slotBytes()), kHOST_STATE_POISON);
    }
    //! Checks that every host state of `tier` is still poisoned and every page and state slot is what the models hold.
    ::testing::AssertionResult nothingChangedWithStates(HostTier& tier)
    {
        for (int32_t hostState = 0; hostState < tier.numHostStates(); ++hostState)
        {
            if (hostStateContents(tier, hostState) != poisonedHostState())
            {
                return ::testing::AssertionFailure() << "host state " << hostState << " was written";
            }
        }
        return nothingChanged(tier, {});
    }
};

TEST_P(HostTierStateContract, AStateSlotRoundTripsIntoAnotherSlotBitwise)
{
    auto const tier = makeStateTier();
    ASSERT_EQ(tier->numHostStates(), 3);
    ASSERT_EQ(tier->hostStateBytes(), states().slotBytes());
    ASSERT_EQ(states().numSlots(), 4);
    std::vector<uint8_t> const slot1 = states().slot(1);
    std::vector<uint8_t> const slot3 = states().slot(3);
    tier->offloadStates(cut().cache(), {{1, 2}, {3, 0}}, cut().stream());
    ASSERT_NE(tier->lastEvent(), nullptr);
    EXPECT_EQ(hostStateContents(*tier, 2), slot1);
    EXPECT_EQ(hostStateContents(*tier, 0), slot3);
    EXPECT_EQ(hostStateContents(*tier, 1), poisonedHostState()) << "host state 1 was not offloaded to";

    // Slot 1's state into slot 2 and slot 3's into slot 0, both poisoned first; slots 1 and 3 keep their own.
    states().poison(2, kHOST_STATE_POISON);
    states().poison(0, kHOST_STATE_POISON);
    tier->onboardStates(cut().cache(), {{2, 2}, {0, 0}}, cut().stream());
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(cut().stream()));
    states().expect(2, slot1);
    states().expect(0, slot3);
    EXPECT_TRUE(states().matchesReference());
    EXPECT_TRUE(cut().matchesReference()) << "a state transfer touched a page";
    EXPECT_FALSE(tier->isHostStateBusy(2));
    EXPECT_EQ(cudaEventQuery(tier->lastEvent()), cudaSuccess);
}

TEST_P(HostTierStateContract, AnOnboardOnAnotherStreamWaitsForTheOffloadOfItsHostState)
{
    auto const tier = makeStateTier();
    std::vector<uint8_t> const slot3 = states().slot(3);
    CudaStream other;
    // The cache's stream is held back, so the offload into host state 0 is still queued when `other` onboards it.
    test::HeldStream const held(cut().stream());
    tier->offloadStates(cut().cache(), {{3, 0}}, cut().stream());
    bool const busy = tier->isHostStateBusy(0);
    EXPECT_TRUE(busy || held.released());
    tier->onboardStates(cut().cache(), {{2, 0}}, other.get());
    other.synchronize();
    // Had `other` not waited, slot 2 would hold the poisoned host state.
    states().expect(2, slot3);
    EXPECT_TRUE(states().matchesReference());
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(cut().stream()));
    EXPECT_FALSE(tier->isHostStateBusy(0));
    int32_t const both[] = {0, 1};
    tier->synchronizeHostStates(both, 2);
    EXPECT_EQ(cudaEventQuery(tier->lastEvent()), cudaSuccess);
}

TEST_P(HostTierStateContract, BadStateTransfersAreRefusedWithNothingChanged)
{
    auto const tier = makeStateTier();
    KVCacheManager const& cache = cut().cache();
    cudaStream_t const stream = cut().stream();
    int32_t const slots = states().numSlots();
    auto const hostStates = static_cast<int32_t>(tier->numHostStates());
    std::string const slotRange = "[0, " + std::to_string(slots) + ")";
    std::string const hostStateRange = "[0, " + std::to_string(hostStates) + ")";
    // Caches of other state layouts: none, one slot more, a tensor of other bytes.
    KVCacheConfig moreSlots = GetParam().config;
    ++moreSlots.numCheckpointSlots;
    KVCacheConfig widerTensor = GetParam().config;
    ++widerTensor.stateLayerConfigs.at(0).tensors.at(0).shape.at(0);
    KVCacheManager const statelessCache(test::withoutStateLayers(GetParam().config), stream);
    KVCacheManager const moreSlotsCache(moreSlots, stream);
    KVCacheManager const widerTensorCache(widerTensor, stream);
    CudaStream capturing;
    for (bool const toHost : {true, false})
    {
        std::string const what = toHost ? "HostTier::offloadStates" : "HostTier::onboardStates";
        SCOPED_TRACE(what);
        auto const call =
            [&](KVCacheManager const& target, HostStateEntry const* entries, int32_t count, cudaStream_t on)
        {
            if (toHost)
            {
                tier->offloadStates(target, entries, count, on);
            }
            else
            {
                tier->onboardStates(target, entries, count, on);
            }
        };
        auto const list = [&](std::vector<HostStateEntry> const& entries)
        { call(cache, entries.data(), static_cast<int32_t>(entries.size()), stream); };
        std::vector<HostStateEntry> const one{{0, 0}};
        test::expectListsRefused<HostStateEntry>(what,
            {{{{0, 0}, {slots, 1}}, true, {"entries[1].slot is " + std::to_string(slots), slotRange}},
                {{{-1, 0}}, true, {"entries[0].slot is -1"}},
                {{{0, 0}, {1, hostStates}}, true,
                    {"entries[1].hostState is " + std::to_string(hostStates), hostStateRange}},
                {{{0, 1}, {2, 1}}, false, {"host state 1 is listed more than once"}},
                {{{3, 0}, {3, 1}}, false, {"slot 3 is listed more than once"}}},
            list);
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&] { call(cache, nullptr, 2, stream); }, {what, "count is 2 with a null list"}));
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&] { call(cache, one.data(), -1, stream); }, {what, "count is -1", ">= 0"}));
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&] { call(statelessCache, one.data(), 1, stream); }, {what, "no state layers"}));
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { call(moreSlotsCache, one.data(), 1, stream); },
            {what, "the cache has " + std::to_string(slots + 1) + " state slots"}));
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&] { call(widerTensorCache, one.data(), 1, stream); }, {what, "state layer 0 tensor 0"}));
        KVCACHE_CUDA_TRY(cudaStreamBeginCapture(capturing.get(), cudaStreamCaptureModeRelaxed));
        EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
            [&] { call(cache, one.data(), 1, capturing.get()); }, {what, "the stream is capturing"}));
        cudaGraph_t graph = nullptr;
        KVCACHE_CUDA_TRY(cudaStreamEndCapture(capturing.get(), &graph));
        KVCACHE_CUDA_TRY(cudaGraphDestroy(graph));
    }
    // Host states outside the tier: each query names it and the limit.
    EXPECT_TRUE(throwsNaming<OutOfRangeError>([&] { static_cast<void>(tier->hostStateData(hostStates)); },
        {"host state " + std::to_string(hostStates), hostStateRange}));
    EXPECT_TRUE(throwsNaming<OutOfRangeError>(
        [&] { static_cast<void>(tier->isHostStateBusy(-1)); }, {"isHostStateBusy", "host state -1"}));
    EXPECT_TRUE(throwsNaming<OutOfRangeError>([&] { tier->synchronizeHostStates(&hostStates, 1); },
        {"synchronizeHostStates", "host state " + std::to_string(hostStates)}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { tier->synchronizeHostStates(nullptr, 1); }, {"synchronizeHostStates", "count is 1", "null"}));
    EXPECT_TRUE(nothingChangedWithStates(*tier));
    EXPECT_EQ(tier->lastEvent(), nullptr) << "a refused transfer recorded an event";
}

TEST_P(HostTierStateContract, HostStatesAreHandedOutAndTakenBackWithTheirRefusals)
{
    auto const tier = makeStateTier();
    ASSERT_EQ(tier->numFreeHostStates(), 3);
    std::vector<int32_t> two = tier->allocateHostStates(2);
    ASSERT_EQ(two.size(), 2U);
    EXPECT_NE(two[0], two[1]);
    EXPECT_EQ(tier->numFreeHostStates(), 1);
    EXPECT_TRUE(throwsNaming<OutOfMemoryError>(
        [&] { tier->allocateHostStates(2); }, {"allocateHostStates", "count is 2", "1 free host states"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { tier->allocateHostStates(-1); }, {"count is -1"}));
    // The one not handed out: 0 + 1 + 2 less the two.
    int32_t const notHandedOut = 3 - two[0] - two[1];
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { tier->releaseHostStates(&notHandedOut, 1); },
        {"releaseHostStates", "hostStates[0] is host state " + std::to_string(notHandedOut), "not handed out"}));
    int32_t const outside = 3;
    EXPECT_TRUE(
        throwsNaming<OutOfRangeError>([&] { tier->releaseHostStates(&outside, 1); }, {"host state 3", "[0, 3)"}));
    std::vector<int32_t> const twice{two[0], two[0]};
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { tier->releaseHostStates(twice.data(), 2); }, {"host state " + std::to_string(two[0]), "more than once"}));
    EXPECT_EQ(tier->numFreeHostStates(), 1);
    tier->releaseHostStates(two.data(), 2);
    EXPECT_EQ(tier->numFreeHostStates(), 3);
    EXPECT_TRUE(nothingChangedWithStates(*tier));
}

TEST_P(HostTierStateContract, ASequenceFileCarriesTheStateWithThePages)
{
    auto const tier = makeStateTier();
    KVCacheManager const& cache = cut().cache();
    cudaStream_t const stream = cut().stream();
    std::filesystem::path const dir = std::filesystem::temp_directory_path()
        / ("kvcache_host_tier_states_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_"
            + GetParam().name);
    std::filesystem::create_directories(dir);
    std::string const path = (dir / "with_state.kvseq").string();
    std::string const plainPath = (dir / "pages_only.kvseq").string();
    int32_t const tokens = GetParam().config.tokensPerPage;

    // A page to host page 0 and slot 1's state to host state 0, saved together, and the page alone.
    int32_t const page = cut().randomPages(1, group())[0];
    std::vector<uint8_t> const slot1 = states().slot(1);
    tier->offload(cache, {{page, 0}}, stream);
    tier->offloadStates(cache, {{1, 0}}, stream);
    int32_t const hostPage0 = 0;
    saveSequence(path, *tier, cache, &hostPage0, 1, tokens, 0);
    saveSequence(plainPath, *tier, cache, &hostPage0, 1, tokens);

    // Loaded into host page 1 and host state 1, both poisoned, then onboarded into slot 3, poisoned too.
    int32_t const hostPage1 = 1;
    EXPECT_EQ(loadSequence(path, *tier, cache, &hostPage1, 1, 1), tokens);
    EXPECT_EQ(test::hostPageContents(*tier, 1), test::expectedHostPage(cut().reference(), group(), page));
    EXPECT_EQ(hostStateContents(*tier, 1), slot1);
    states().poison(3, kHOST_STATE_POISON);
    tier->onboardStates(cache, {{3, 1}}, stream);
    KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
    states().expect(3, slot1);
    EXPECT_TRUE(states().matchesReference());

    // A file without a state, a host state out of range or a cache without state layers: refused, host state 1 and
    // host page 1 untouched.
    poisonHostState(*tier, 1);
    test::poisonHostPage(*tier, 1);
    auto const hostStates = static_cast<int32_t>(tier->numHostStates());
    KVCacheManager const statelessCache(test::withoutStateLayers(GetParam().config), stream);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { loadSequence(plainPath, *tier, cache, &hostPage1, 1, 1); }, {"readSequenceFile", "holds no state"}));
    EXPECT_TRUE(throwsNaming<OutOfRangeError>([&] { loadSequence(path, *tier, cache, &hostPage1, 1, hostStates); },
        {"hostState is " + std::to_string(hostStates), "[0, " + std::to_string(hostStates) + ")"}));
    EXPECT_TRUE(throwsNaming<OutOfRangeError>(
        [&] { saveSequence(path, *tier, cache, &hostPage0, 1, tokens, -1); }, {"saveSequence", "hostState is -1"}));
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { loadSequence(path, *tier, statelessCache, &hostPage1, 1, 1); }, {"no state layers"}));
    EXPECT_EQ(hostStateContents(*tier, 1), poisonedHostState());
    EXPECT_EQ(test::hostPageContents(*tier, 1), poisonedHostPage());
    // The pages-only load of a file with a state reads the pages and leaves the host states alone.
    EXPECT_EQ(loadSequence(path, *tier, cache, &hostPage1, 1), tokens);
    EXPECT_EQ(test::hostPageContents(*tier, 1), test::expectedHostPage(cut().reference(), group(), page));
    EXPECT_EQ(hostStateContents(*tier, 1), poisonedHostState());
    std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(EveryVariantWithStateLayers, HostTierStateContract,
    ::testing::ValuesIn(test::hostTierStateVariants()), test::variantName);

} // namespace
} // namespace kvcache::rt
