// Host states of the host tier against a model written here: a state slot's bytes packed state layer by state layer,
// each layer's tensors in config order, sizes worked out from the config by hand. Round trips byte for byte into
// another slot with every other slot untouched, a transfer on another stream waiting for one in flight on its host
// state, sequence files holding a state slot with the pages, and the refusals made before anything is enqueued or
// written, nothing changed.

#include "kvcache/core/errors.h"
#include "kvcache/memory/kv_cache_manager.h"
#include "kvcache/tiers/host_tier.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::CudaStream;
using kvcache::test::throwsNaming;

constexpr uint8_t kPOISON = 0xA5;

//! Distinct bytes for every state layer, tensor, slot and byte (never all zero, K-and-V style distinct per tensor).
uint8_t stateByte(int64_t layer, int64_t tensor, int64_t slot, int64_t offset)
{
    uint64_t h = static_cast<uint64_t>(layer + 1) * 0x9E3779B97F4A7C15ULL
        ^ static_cast<uint64_t>(tensor + 1) * 0xC2B2AE3D27D4EB4FULL
        ^ static_cast<uint64_t>(slot + 1) * 0x165667B19E3779F9ULL
        ^ static_cast<uint64_t>(offset) * 0x27D4EB2F165667C5ULL;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 32;
    auto const byte = static_cast<uint8_t>(h);
    return byte == kPOISON ? static_cast<uint8_t>(byte + 1) : byte;
}

//! One state tensor of the model: its state layer, index and bytes a slot, worked out by hand.
struct ModelTensor
{
    int32_t layer;
    int32_t tensor;
    int64_t slotBytes;
};

//! A cache with two state layers and 4 slots (3 sequences + 1 checkpoint). Layer 0: conv [6, 3] bfloat16 = 36 bytes a
//! slot and recurrent [2, 4, 4] float32 = 128 bytes; layer 1: ssm [7] int8 = 7 bytes. A packed slot: 36 + 128 + 7 =
//! 171 bytes, in that order.
class StateCase
{
public:
    StateCase()
    {
        rt::KVCacheConfig const config =
            kvcache::test::ConfigBuilder({rt::KVLayerConfig{2, 64}})
                .maxBatchSize(3)
                .maxSequenceLength(64)
                .tokensPerPage(16)
                .stateLayers({rt::StateLayerConfig{{rt::StateTensorConfig{"conv", {6, 3}, rt::DataType::kBF16},
                                  rt::StateTensorConfig{"recurrent", {2, 4, 4}, rt::DataType::kFLOAT}}},
                    rt::StateLayerConfig{{rt::StateTensorConfig{"ssm", {7}, rt::DataType::kINT8}}}})
                .numCheckpointSlots(1)
                .build();
        cache = std::make_unique<rt::KVCacheManager>(config, stream.get());
        for (ModelTensor const& tensor : tensors)
        {
            for (int32_t slot = 0; slot < kSLOTS; ++slot)
            {
                std::vector<uint8_t> bytes(static_cast<size_t>(tensor.slotBytes));
                for (int64_t b = 0; b < tensor.slotBytes; ++b)
                {
                    bytes[static_cast<size_t>(b)] = stateByte(tensor.layer, tensor.tensor, slot, b);
                }
                kvcache::test::uploadBytes(slotAddress(tensor, slot), bytes, stream.get());
            }
        }
        stream.synchronize();
    }

    //! Slot `slot` of `tensor`, through the public view: index `slot` of the first dimension.
    void* slotAddress(ModelTensor const& tensor, int32_t slot) const
    {
        return static_cast<char*>(cache->stateView(tensor.layer, tensor.tensor).rawPointer()) + slot * tensor.slotBytes;
    }
    //! The packed bytes of slot `slot` as first written.
    std::vector<uint8_t> expectedPacked(int32_t slot) const
    {
        std::vector<uint8_t> packed;
        for (ModelTensor const& tensor : tensors)
        {
            for (int64_t b = 0; b < tensor.slotBytes; ++b)
            {
                packed.push_back(stateByte(tensor.layer, tensor.tensor, slot, b));
            }
        }
        return packed;
    }
    //! The device bytes of slot `slot`, packed in the model's order.
    std::vector<uint8_t> deviceSlot(int32_t slot) const
    {
        std::vector<uint8_t> packed;
        for (ModelTensor const& tensor : tensors)
        {
            auto const part = kvcache::test::downloadBytes(slotAddress(tensor, slot), tensor.slotBytes, stream.get());
            packed.insert(packed.end(), part.begin(), part.end());
        }
        return packed;
    }
    void poisonSlot(int32_t slot)
    {
        for (ModelTensor const& tensor : tensors)
        {
            KVCACHE_CUDA_TRY(cudaMemsetAsync(
                slotAddress(tensor, slot), kPOISON, static_cast<size_t>(tensor.slotBytes), stream.get()));
        }
        stream.synchronize();
    }

    static constexpr int32_t kSLOTS = 4;
    static constexpr int64_t kPACKED_BYTES = 36 + 128 + 7;
    std::vector<ModelTensor> const tensors{{0, 0, 36}, {0, 1, 128}, {1, 0, 7}};
    CudaStream stream;
    std::unique_ptr<rt::KVCacheManager> cache;
};

std::vector<uint8_t> hostStateContents(rt::HostTier& tier, int32_t hostState)
{
    auto const* data = static_cast<uint8_t const*>(tier.hostStateData(hostState));
    return std::vector<uint8_t>(data, data + tier.hostStateBytes());
}

void poisonHostState(rt::HostTier& tier, int32_t hostState)
{
    std::memset(tier.hostStateData(hostState), kPOISON, static_cast<size_t>(tier.hostStateBytes()));
}

std::vector<uint8_t> poisonState()
{
    return std::vector<uint8_t>(static_cast<size_t>(StateCase::kPACKED_BYTES), kPOISON);
}

using HostTierStatesTest = kvcache::test::GpuTest;

TEST_F(HostTierStatesTest, AStateSlotRoundTripsIntoAnotherSlotByteForByte)
{
    StateCase setup;
    rt::HostTierOptions options;
    options.numHostStates = 3;
    rt::HostTier tier(*setup.cache, 0, 2, options);
    ASSERT_EQ(tier.numHostStates(), 3);
    ASSERT_EQ(tier.hostStateBytes(), StateCase::kPACKED_BYTES);
    for (int32_t h = 0; h < 3; ++h)
    {
        poisonHostState(tier, h);
    }
    cudaStream_t const stream = setup.stream.get();
    tier.offloadStates(*setup.cache, {{1, 2}, {3, 0}}, stream);
    ASSERT_NE(tier.lastEvent(), nullptr);
    EXPECT_EQ(hostStateContents(tier, 2), setup.expectedPacked(1));
    EXPECT_EQ(hostStateContents(tier, 0), setup.expectedPacked(3));
    EXPECT_EQ(hostStateContents(tier, 1), poisonState()) << "host state 1 was not offloaded to";

    // Slot 1's state into slot 2 and slot 3's into slot 0; slots 1 and 3 keep their own.
    setup.poisonSlot(2);
    setup.poisonSlot(0);
    tier.onboardStates(*setup.cache, {{2, 2}, {0, 0}}, stream);
    setup.stream.synchronize();
    EXPECT_EQ(setup.deviceSlot(2), setup.expectedPacked(1));
    EXPECT_EQ(setup.deviceSlot(0), setup.expectedPacked(3));
    EXPECT_EQ(setup.deviceSlot(1), setup.expectedPacked(1));
    EXPECT_EQ(setup.deviceSlot(3), setup.expectedPacked(3));
}

TEST_F(HostTierStatesTest, AnOnboardOnAnotherStreamWaitsForTheOffloadOfItsHostState)
{
    StateCase setup;
    rt::HostTierOptions options;
    options.numHostStates = 1;
    rt::HostTier tier(*setup.cache, 0, 2, options);
    poisonHostState(tier, 0);
    setup.poisonSlot(2);
    CudaStream other;
    // Without the tier's wait, the onboard could read the host state before the offload wrote it.
    tier.offloadStates(*setup.cache, {{3, 0}}, setup.stream.get());
    tier.onboardStates(*setup.cache, {{2, 0}}, other.get());
    other.synchronize();
    EXPECT_EQ(setup.deviceSlot(2), setup.expectedPacked(3));
}

TEST_F(HostTierStatesTest, BadInputIsRefusedWithNothingChanged)
{
    StateCase setup;
    rt::HostTierOptions options;
    options.numHostStates = 2;
    rt::HostTier tier(*setup.cache, 0, 2, options);
    poisonHostState(tier, 0);
    poisonHostState(tier, 1);
    cudaStream_t const stream = setup.stream.get();
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] {
            tier.offloadStates(*setup.cache, {{0, 0}, {4, 1}}, stream);
        },
        {"entries[1].slot", "4", "[0, 4)"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] {
            tier.onboardStates(*setup.cache, {{-1, 0}}, stream);
        },
        {"entries[0].slot", "-1"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] {
            tier.offloadStates(*setup.cache, {{0, 0}, {1, 2}}, stream);
        },
        {"entries[1].hostState", "2", "[0, 2)"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            tier.offloadStates(*setup.cache, {{0, 1}, {2, 1}}, stream);
        },
        {"host state 1", "more than once"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            tier.onboardStates(*setup.cache, {{3, 0}, {3, 1}}, stream);
        },
        {"slot 3", "more than once"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { tier.offloadStates(*setup.cache, nullptr, 2, stream); }, {"null", "2"}));
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { tier.offloadStates(*setup.cache, nullptr, -1, stream); }, {"count", "-1"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>([&] { tier.hostStateData(2); }, {"host state 2", "[0, 2)"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>([&] { tier.isHostStateBusy(-1); }, {"host state -1"}));
    for (int32_t h = 0; h < 2; ++h)
    {
        EXPECT_EQ(hostStateContents(tier, h), poisonState()) << "a refused call wrote host state " << h;
    }
    for (int32_t slot = 0; slot < StateCase::kSLOTS; ++slot)
    {
        EXPECT_EQ(setup.deviceSlot(slot), setup.expectedPacked(slot)) << "a refused call wrote slot " << slot;
    }

    // Capacity: nothing handed out when the request does not fit.
    std::vector<int32_t> const one = tier.allocateHostStates(1);
    EXPECT_EQ(one.size(), 1U);
    EXPECT_TRUE(throwsNaming<rt::OutOfMemoryError>(
        [&] { tier.allocateHostStates(2); }, {"allocateHostStates", "count is 2", "1 free host states"}));
    EXPECT_EQ(tier.numFreeHostStates(), 1);
    int32_t const notHandedOut = 1 - one[0];
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { tier.releaseHostStates(&notHandedOut, 1); }, {"hostStates[0]", "not handed out"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&]
        {
            int32_t const outside = 2;
            tier.releaseHostStates(&outside, 1);
        },
        {"host state 2", "[0, 2)"}));
    EXPECT_EQ(tier.numFreeHostStates(), 1);
    tier.releaseHostStates(one.data(), 1);
    EXPECT_EQ(tier.numFreeHostStates(), 2);

    // The options: a negative count, and host states for a cache without state layers.
    rt::HostTierOptions negative;
    negative.numHostStates = -1;
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::HostTier(*setup.cache, 0, 2, negative); }, {"numHostStates", "-1"}));
    rt::KVCacheManager stateless(kvcache::test::ConfigBuilder({rt::KVLayerConfig{2, 64}})
                                     .maxBatchSize(3)
                                     .maxSequenceLength(64)
                                     .tokensPerPage(16)
                                     .build(),
        stream);
    rt::HostTierOptions wanted;
    wanted.numHostStates = 1;
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::HostTier(stateless, 0, 2, wanted); }, {"numHostStates", "1", "no state layers"}));
    rt::HostTier plain(stateless, 0, 2);
    EXPECT_EQ(plain.numHostStates(), 0);
    EXPECT_EQ(plain.hostStateBytes(), 0);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            plain.offloadStates(stateless, {{0, 0}}, stream);
        },
        {"no state layers"}));
    EXPECT_TRUE(
        throwsNaming<rt::OutOfMemoryError>([&] { plain.allocateHostStates(1); }, {"count is 1", "numHostStates is 0"}));
    // A tier with states against a cache of another state layout.
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] {
            tier.offloadStates(stateless, {{0, 0}}, stream);
        },
        {"no state layers"}));
}

TEST_F(HostTierStatesTest, ASequenceFileCarriesTheStateWithThePages)
{
    StateCase setup;
    rt::HostTierOptions options;
    options.numHostStates = 2;
    rt::HostTier tier(*setup.cache, 0, 2, options);
    cudaStream_t const stream = setup.stream.get();
    std::filesystem::path const dir = std::filesystem::temp_directory_path()
        / ("kvcache_host_tier_states_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
    std::filesystem::create_directories(dir);
    std::string const path = (dir / "with_state.kvseq").string();
    std::string const plainPath = (dir / "pages_only.kvseq").string();

    // Page 1 of the cache to host page 0 and slot 1's state to host state 0, saved together.
    tier.offload(*setup.cache, {{1, 0}}, stream);
    tier.offloadStates(*setup.cache, {{1, 0}}, stream);
    int32_t const hostPage0 = 0;
    rt::saveSequence(path, tier, *setup.cache, &hostPage0, 1, 16, 0);
    rt::saveSequence(plainPath, tier, *setup.cache, &hostPage0, 1, 16);
    auto const* const page0 = static_cast<uint8_t const*>(tier.hostPageData(0));
    std::vector<uint8_t> const pageBytes(page0, page0 + tier.hostPageBytes());

    // Loaded into host page 1 and host state 1, both poisoned first, then onboarded into slot 3.
    std::memset(tier.hostPageData(1), kPOISON, static_cast<size_t>(tier.hostPageBytes()));
    poisonHostState(tier, 1);
    int32_t const hostPage1 = 1;
    EXPECT_EQ(rt::loadSequence(path, tier, *setup.cache, &hostPage1, 1, 1), 16);
    auto const* const page1 = static_cast<uint8_t const*>(tier.hostPageData(1));
    EXPECT_EQ(std::vector<uint8_t>(page1, page1 + tier.hostPageBytes()), pageBytes);
    EXPECT_EQ(hostStateContents(tier, 1), setup.expectedPacked(1));
    setup.poisonSlot(3);
    tier.onboardStates(*setup.cache, {{3, 1}}, stream);
    setup.stream.synchronize();
    EXPECT_EQ(setup.deviceSlot(3), setup.expectedPacked(1));

    // A file without a state, or a host state out of range: refused, host state 1 untouched.
    poisonHostState(tier, 1);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { rt::loadSequence(plainPath, tier, *setup.cache, &hostPage1, 1, 1); }, {"holds no state"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] { rt::loadSequence(path, tier, *setup.cache, &hostPage1, 1, 2); }, {"hostState is 2", "[0, 2)"}));
    EXPECT_TRUE(throwsNaming<rt::OutOfRangeError>(
        [&] { rt::saveSequence(path, tier, *setup.cache, &hostPage0, 1, 16, -1); }, {"hostState is -1"}));
    EXPECT_EQ(hostStateContents(tier, 1), poisonState());
    // The pages-only load of a file with a state reads the pages.
    EXPECT_EQ(rt::loadSequence(path, tier, *setup.cache, &hostPage1, 1), 16);
    EXPECT_EQ(hostStateContents(tier, 1), poisonState());
    std::filesystem::remove_all(dir);
}

} // namespace
