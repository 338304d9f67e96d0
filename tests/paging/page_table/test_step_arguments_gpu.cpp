// StepArgumentBuffers on a GPU: one upload a build lands every argument (positions, qoIndptr, the token count, the
// state slots and each group's tables, the windowed one at its own width) at addresses that never change; refused
// builds and builds inside a capture leave host and device as they were. The host fill is tested against an independent
// construction in test_step_arguments_build.cpp; here the device copies are checked against the host copies and by
// hand.

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_manager.h"
#include "kvcache/paging/step_arguments.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "support/config_builder.h"
#include "support/cuda_raii.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/page_manager_inputs.h"
#include "support/page_table_reference.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::ConfigBuilder;
using kvcache::test::throwsNaming;
using kvcache::test::page_tables::downloadInts;

class StepArgumentsGpuTest : public kvcache::test::GpuTest
{
};

//! Every array of the arguments, flattened: the token count, qoIndptr, the state slots, positions, then each group's
//! six arrays.
std::vector<int32_t> everything(rt::StepArgumentBuffers const& arguments, bool device, cudaStream_t stream)
{
    auto const read = [&](int32_t const* host, int32_t const* deviceArray, int64_t count)
    {
        return device ? downloadInts(deviceArray, static_cast<size_t>(count), stream)
                      : std::vector<int32_t>(host, host + count);
    };
    int32_t const rows = arguments.maxBatchSize();
    std::vector<int32_t> all;
    auto const add = [&](std::vector<int32_t> const& part) { all.insert(all.end(), part.begin(), part.end()); };
    int32_t const hostCount = arguments.tokenCount();
    add(device ? downloadInts(arguments.deviceTokenCount(), 1, stream) : std::vector<int32_t>{hostCount});
    add(read(arguments.hostQoIndptr(), arguments.deviceQoIndptr(), rows + 1));
    add(read(arguments.hostStateSlots(), arguments.deviceStateSlots(), rows));
    add(read(reinterpret_cast<int32_t const*>(arguments.hostPositions()),
        reinterpret_cast<int32_t const*>(arguments.devicePositions()), 2 * int64_t{arguments.maxTokensPerStep()}));
    for (int32_t g = 0; g < arguments.numGroups(); ++g)
    {
        int64_t const entries = int64_t{rows} * arguments.maxPagesPerSequence(g);
        add(read(arguments.hostIndptr(g), arguments.deviceIndptr(g), rows + 1));
        add(read(arguments.hostIndices(g), arguments.deviceIndices(g), arguments.usedIndices(g)));
        add(read(arguments.hostLastPageLen(g), arguments.deviceLastPageLen(g), rows));
        add(read(arguments.hostFirstToken(g), arguments.deviceFirstToken(g), rows));
        add(read(arguments.hostResidentTokens(g), arguments.deviceResidentTokens(g), rows));
        add(read(arguments.hostBlockTable(g), arguments.deviceBlockTable(g), entries));
    }
    return all;
}

TEST_F(StepArgumentsGpuTest, OneUploadABuildLandsEveryArgumentAtAddressesThatNeverChange)
{
    kvcache::test::CudaStream stream;
    // Full attention (24 pages a sequence) and a window of 6 tokens (ceil((6 - 1 + 16) / 4) + 1 = 7 pages).
    rt::PageManager manager(ConfigBuilder({{1, 8}, {1, 8, 6}})
                                .maxBatchSize(4)
                                .maxSequenceLength(96)
                                .tokensPerPage(4)
                                .maxTokensPerStep(16)
                                .numPagesPerGroup({200, 60}),
        kvcache::test::seededOptions(8, 5));
    rt::StepArgumentBuffers arguments(manager, 4, 16, stream.get());
    ASSERT_EQ(arguments.maxPagesPerSequence(1), 7);
    rt::TokenPosition const* const positions = arguments.devicePositions();
    rt::DevicePageTable const windowed = arguments.table(1);

    rt::SequenceId const a = manager.create();
    rt::SequenceId const b = manager.create();
    std::vector<int32_t> const prompt(10, 3);
    std::vector<rt::SequenceAppend> entries{{a, prompt.data(), 10, nullptr, 0}, {b, prompt.data(), 5, nullptr, 0}};
    manager.step(entries.data(), 2);
    arguments.build(manager, entries.data(), 2, stream.get());
    // By hand: rows 0-9 are a's tokens 0-9, rows 10-14 b's 0-4, row 15 padding.
    std::vector<int32_t> const rows = downloadInts(reinterpret_cast<int32_t const*>(positions), 32, stream.get());
    EXPECT_EQ(rows[18], 0);
    EXPECT_EQ(rows[19], 9);
    EXPECT_EQ(rows[20], 1);
    EXPECT_EQ(rows[21], 0);
    EXPECT_EQ(rows[30], -1);
    EXPECT_EQ(rows[31], 0);
    EXPECT_EQ(downloadInts(arguments.deviceTokenCount(), 1, stream.get()), (std::vector<int32_t>{15}));
    EXPECT_EQ(everything(arguments, true, stream.get()), everything(arguments, false, stream.get()));

    // Decode until the window has released pages: the windowed rows stay 7 wide.
    int32_t const token = 1;
    for (int32_t round = 0; round < 60; ++round)
    {
        entries = {{b, &token, 1, nullptr, 0}, {a, &token, round % 2, nullptr, 0}};
        manager.step(entries.data(), 2);
        arguments.build(manager, entries.data(), 2, stream.get());
    }
    EXPECT_GT(arguments.hostFirstToken(1)[0], 0);
    EXPECT_EQ(arguments.devicePositions(), positions);
    EXPECT_EQ(arguments.table(1).indptr, windowed.indptr);
    EXPECT_EQ(everything(arguments, true, stream.get()), everything(arguments, false, stream.get()));

    // A refused build and one inside a capture leave both copies as they were.
    std::vector<int32_t> const before = everything(arguments, false, stream.get());
    rt::SequenceAppend const tooMany{a, nullptr, 1000, nullptr, 0};
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
        [&] { arguments.build(manager, &tooMany, 1, stream.get()); }, {"entries[0].count is 1000"}));
    KVCACHE_TEST_CUDA(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
    bool const refused = throwsNaming<rt::InvalidArgumentError>(
        [&] { arguments.build(manager, entries.data(), 2, stream.get()); }, {"stream is capturing a CUDA graph"});
    cudaGraph_t graph = nullptr;
    KVCACHE_TEST_CUDA(cudaStreamEndCapture(stream.get(), &graph));
    if (graph != nullptr)
    {
        KVCACHE_TEST_CUDA(cudaGraphDestroy(graph));
    }
    EXPECT_TRUE(refused);
    EXPECT_EQ(everything(arguments, false, stream.get()), before);
    EXPECT_EQ(everything(arguments, true, stream.get()), before);

    // A move hands over the same device buffers.
    rt::StepArgumentBuffers moved(std::move(arguments));
    EXPECT_EQ(moved.devicePositions(), positions);
    EXPECT_EQ(arguments.devicePositions(), nullptr); // NOLINT(bugprone-use-after-move): the moved-from state
    EXPECT_EQ(everything(moved, true, stream.get()), before);
}

TEST_F(StepArgumentsGpuTest, TheStateSlotsOfEachBuildReachTheDevice)
{
    kvcache::test::CudaStream stream;
    std::vector<rt::StateLayerConfig> const stateLayers{
        rt::StateLayerConfig{{rt::StateTensorConfig{"conv", {8, 3}, rt::DataType::kHALF}}}};
    rt::PageManager manager(
        ConfigBuilder({{1, 8}}).maxBatchSize(4).maxSequenceLength(64).tokensPerPage(4).maxTokensPerStep(8).stateLayers(
            stateLayers),
        kvcache::test::seededOptions(4, 5));
    rt::StepArgumentBuffers arguments(manager, 4, 8, stream.get());
    int32_t const* const slots = arguments.deviceStateSlots();
    // Before any build: the empty step's -1 everywhere.
    EXPECT_EQ(downloadInts(slots, 4, stream.get()), (std::vector<int32_t>(4, -1)));

    rt::SequenceId const a = manager.create();
    rt::SequenceId const b = manager.create();
    rt::SequenceId const c = manager.create();
    rt::SequenceId const d = manager.fork(a);
    int32_t const token = 1;
    // By hand: a, b, c in slots 0, 1, 2, the fork d in 3; rows in another order.
    std::vector<rt::SequenceAppend> entries{
        {c, &token, 1, nullptr, 0}, {d, &token, 1, nullptr, 0}, {a, &token, 1, nullptr, 0}, {b, &token, 1, nullptr, 0}};
    manager.step(entries.data(), 4);
    arguments.build(manager, entries.data(), 4, stream.get());
    EXPECT_EQ(downloadInts(slots, 4, stream.get()), (std::vector<int32_t>{2, 3, 0, 1}));
    // Each smaller build, one into each staging region, puts -1 back on the device where the larger one wrote.
    entries = {{b, &token, 1, nullptr, 0}, {d, &token, 1, nullptr, 0}};
    manager.step(entries.data(), 2);
    arguments.build(manager, entries.data(), 2, stream.get());
    EXPECT_EQ(downloadInts(slots, 4, stream.get()), (std::vector<int32_t>{1, 3, -1, -1}));
    entries = {{a, &token, 1, nullptr, 0}};
    manager.step(entries.data(), 1);
    arguments.build(manager, entries.data(), 1, stream.get());
    EXPECT_EQ(downloadInts(slots, 4, stream.get()), (std::vector<int32_t>{0, -1, -1, -1}));
    EXPECT_EQ(arguments.deviceStateSlots(), slots);
    EXPECT_EQ(everything(arguments, true, stream.get()), everything(arguments, false, stream.get()));
}

} // namespace
