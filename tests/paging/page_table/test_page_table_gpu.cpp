// PageTableBuffers on a GPU: uploads at fixed addresses, the build after next waiting for an upload (the next need
// not), uploads on two streams landing in build order, failed builds, moves, destruction with an upload in flight,
// builds refused inside a capture, and a captured kernel that reads the block table replaying with the rebuilt tables.
// The batches and reference tables are tests/support/page_table_reference.h.

#include "kvcache/core/errors.h"
#include "kvcache/paging/page_table.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "support/cuda_raii.h"
#include "support/error_matchers.h"
#include "support/gpu_test.h"
#include "support/page_op_reference.h"
#include "support/page_table_reference.h"

namespace
{

namespace rt = kvcache::rt;
using kvcache::test::throwsNaming;
using namespace kvcache::test::page_tables;

//! Builds `batch` into `tables` on `stream`.
void build(rt::PageTableBuffers& tables, Batch const& batch, cudaStream_t stream)
{
    std::vector<rt::SequencePages> const sequences = batch.sequences();
    tables.build(sequences.data(), batch.count(), stream);
}

//! What a GPU test starts from: a stream, tables of `sizes` made on it, and a seeded generator of batches.
struct TablesUnderTest
{
    TablesUnderTest(Sizes const& tableSizes, uint64_t seed)
        : sizes(tableSizes)
        , tables(sizes.maxBatchSize, sizes.maxPagesPerSequence, sizes.tokensPerPage, stream.get())
        , rng(seed)
    {
    }

    //! Returns `count` random sequences whose pages are drawn from room for twice the table.
    Batch randomBatch(int32_t count)
    {
        return ::randomBatch(rng, sizes, count, 2 * sizes.maxBatchSize * sizes.maxPagesPerSequence);
    }
    //! Builds `batch` on the stream.
    void build(Batch const& batch)
    {
        ::build(tables, batch, stream.get());
    }
    //! Returns the device tables after the work queued on the stream.
    Tables device() const
    {
        return downloadTables(deviceViews(tables), sizes, stream.get());
    }
    //! Returns the staging tables.
    Tables host() const
    {
        return readTables(hostViews(tables), sizes);
    }

    Sizes sizes;
    kvcache::test::CudaStream stream;
    rt::PageTableBuffers tables;
    std::mt19937_64 rng;
};

//! Writes kPOISON_BYTE over every device array of `tables`, ordered on `stream`.
void poisonDevice(rt::PageTableBuffers const& tables, cudaStream_t stream)
{
    size_t const rows = static_cast<size_t>(tables.maxBatchSize());
    size_t const entries = rows * static_cast<size_t>(tables.maxPagesPerSequence());
    TableViews const views = deviceViews(tables);
    for (auto const& [array, count] : {std::pair{views.indptr, rows + 1}, std::pair{views.lastPageLen, rows},
             std::pair{views.blockTable, entries}, std::pair{views.indices, entries}})
    {
        KVCACHE_CUDA_TRY(cudaMemsetAsync(const_cast<int32_t*>(array), kPOISON_BYTE, count * sizeof(int32_t), stream));
    }
}

//! Holds `stream` for 100 ms (a host function), then sets `done`: work queued after it waits that long.
void holdStream(cudaStream_t stream, std::atomic<bool>& done)
{
    KVCACHE_CUDA_TRY(cudaLaunchHostFunc(
        stream,
        [](void* flag)
        {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            static_cast<std::atomic<bool>*>(flag)->store(true);
        },
        &done));
}

class PageTableGpuTest : public kvcache::test::GpuTest
{
};

TEST_F(PageTableGpuTest, UploadsGiveTheReferenceTablesAtAddressesThatNeverChange)
{
    TablesUnderTest tut({16, 12, 16}, 77);
    EXPECT_EQ(tut.tables.count(), 0);
    ASSERT_TRUE(sameTables(referenceTables({}, tut.sizes), tut.device())) << "the tables before the first build";

    TableViews const addresses = deviceViews(tut.tables);
    for (int32_t const* array : {addresses.lastPageLen, addresses.blockTable, addresses.indices})
    {
        EXPECT_EQ((array - addresses.indptr) * 4 % 128, 0);
    }
    for (int32_t const count : buildCounts(tut.rng, tut.sizes.maxBatchSize, 12))
    {
        SCOPED_TRACE("count " + std::to_string(count));
        Batch const batch = tut.randomBatch(count);
        poisonDevice(tut.tables, tut.stream.get());
        tut.build(batch);
        Tables const expected = referenceTables(batch, tut.sizes);
        ASSERT_TRUE(sameTables(expected, tut.device()));
        ASSERT_TRUE(sameTables(expected, tut.host()));
        EXPECT_EQ(tut.tables.count(), count);
        EXPECT_EQ(tut.tables.uploadBytes(),
            4 * ((addresses.indices - addresses.indptr) + static_cast<int64_t>(expected.indices.size())))
            << "the upload moves indptr, lastPageLen, the block table and the indices in use";
        TableViews const now = deviceViews(tut.tables);
        EXPECT_TRUE(now.indptr == addresses.indptr && now.indices == addresses.indices
            && now.lastPageLen == addresses.lastPageLen && now.blockTable == addresses.blockTable);
    }
}

//! Device arrays as large as `sizes`' tables, poisoned on `stream`, into which a copy of the device tables is queued.
struct TableSnapshot
{
    TableSnapshot(Sizes const& sizes, cudaStream_t stream)
        : rows(static_cast<size_t>(sizes.maxBatchSize))
        , entries(rows * static_cast<size_t>(sizes.maxPagesPerSequence))
        , indptr(rows + 1)
        , indices(entries)
        , lastPageLen(rows)
        , blockTable(entries)
        , firstToken(rows)
        , residentTokens(rows)
    {
        for (auto* array : {&indptr, &indices, &lastPageLen, &blockTable, &firstToken, &residentTokens})
        {
            array->fillBytes(kPOISON_BYTE, stream);
        }
    }
    //! Queues a copy of the device tables of `tables` on `stream`.
    void copy(rt::PageTableBuffers const& tables, cudaStream_t stream)
    {
        TableViews const device = deviceViews(tables);
        for (auto const& [from, to, count] : {std::tuple{device.indptr, &indptr, rows + 1},
                 std::tuple{device.indices, &indices, entries}, std::tuple{device.lastPageLen, &lastPageLen, rows},
                 std::tuple{device.blockTable, &blockTable, entries}, std::tuple{device.firstToken, &firstToken, rows},
                 std::tuple{device.residentTokens, &residentTokens, rows}})
        {
            KVCACHE_TEST_CUDA(
                cudaMemcpyAsync(to->get(), from, count * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream));
        }
    }
    //! Returns the snapshot's tables after the work queued on `stream`.
    Tables download(Sizes const& sizes, cudaStream_t stream) const
    {
        TableViews const views{
            indptr.get(), indices.get(), lastPageLen.get(), blockTable.get(), firstToken.get(), residentTokens.get()};
        return downloadTables(views, sizes, stream);
    }

    size_t rows;
    size_t entries;
    kvcache::test::DeviceArray<int32_t> indptr;
    kvcache::test::DeviceArray<int32_t> indices;
    kvcache::test::DeviceArray<int32_t> lastPageLen;
    kvcache::test::DeviceArray<int32_t> blockTable;
    kvcache::test::DeviceArray<int32_t> firstToken;
    kvcache::test::DeviceArray<int32_t> residentTokens;
};

TEST_F(PageTableGpuTest, TheBuildAfterNextWaitsForAnUploadAndCopiesBetweenBuildsSeeEachBuild)
{
    TablesUnderTest tut({8, 6, 16}, 5);
    Batch const first = tut.randomBatch(8);
    Batch const second = tut.randomBatch(5);
    Batch const third = tut.randomBatch(7);
    TableSnapshot afterFirst(tut.sizes, tut.stream.get());
    TableSnapshot afterSecond(tut.sizes, tut.stream.get());

    // The first upload queues behind a held stream, so it is still pending when the next builds start. The second
    // writes the other staging region and need not wait (100 ms is far more than a build takes); the third writes the
    // first's region again and must wait, or it would rewrite the staging under the first copy.
    std::atomic<bool> released{false};
    holdStream(tut.stream.get(), released);
    tut.build(first);
    afterFirst.copy(tut.tables, tut.stream.get());
    tut.build(second);
    EXPECT_FALSE(released.load()) << "the second build waited for the first upload";
    EXPECT_TRUE(sameTables(referenceTables(second, tut.sizes), tut.host())) << "the host copies before any upload ran";
    afterSecond.copy(tut.tables, tut.stream.get());
    tut.build(third);
    EXPECT_TRUE(released.load()) << "the third build returned before the first upload could have run";

    EXPECT_TRUE(sameTables(referenceTables(first, tut.sizes), afterFirst.download(tut.sizes, tut.stream.get())))
        << "the copy queued after the first build";
    EXPECT_TRUE(sameTables(referenceTables(second, tut.sizes), afterSecond.download(tut.sizes, tut.stream.get())))
        << "the copy queued after the second build";
    EXPECT_TRUE(sameTables(referenceTables(third, tut.sizes), tut.device()));
    EXPECT_TRUE(sameTables(referenceTables(third, tut.sizes), tut.host()));
}

TEST_F(PageTableGpuTest, AnUploadOnAnotherStreamLandsAfterTheLastOne)
{
    TablesUnderTest tut({6, 5, 16}, 17);
    kvcache::test::CudaStream other;
    Batch const first = tut.randomBatch(6);
    Batch const second = tut.randomBatch(4);
    // The first upload waits 100 ms behind a held stream; the second, on another stream, must land after it.
    std::atomic<bool> released{false};
    holdStream(tut.stream.get(), released);
    tut.build(first);
    build(tut.tables, second, other.get());
    tut.stream.synchronize();
    other.synchronize();
    EXPECT_TRUE(sameTables(referenceTables(second, tut.sizes), tut.device()))
        << "the first upload overwrote the second";
    // And back on the first stream, after an upload held up on the other.
    Batch const third = tut.randomBatch(5);
    Batch const fourth = tut.randomBatch(2);
    std::atomic<bool> releasedOther{false};
    holdStream(other.get(), releasedOther);
    build(tut.tables, third, other.get());
    tut.build(fourth);
    other.synchronize();
    tut.stream.synchronize();
    EXPECT_TRUE(sameTables(referenceTables(fourth, tut.sizes), tut.device()))
        << "the third upload overwrote the fourth";
}

TEST_F(PageTableGpuTest, ARefusedBuildLeavesTheHostAndDeviceTablesAsTheyWere)
{
    TablesUnderTest tut(kBAD_BUILD_SIZES, 0);
    Batch const good = goodBatch();
    tut.build(good);
    Tables const expected = referenceTables(good, tut.sizes);
    for (BadBuild const& bad : badBuilds())
    {
        EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>(
            [&] { tut.tables.build(bad.list(), bad.count, tut.stream.get()); }, bad.named))
            << bad.named.front();
        ASSERT_TRUE(sameTables(expected, tut.host())) << bad.named.front();
        ASSERT_TRUE(sameTables(expected, tut.device())) << bad.named.front();
        EXPECT_EQ(tut.tables.count(), good.count());
    }
}

TEST_F(PageTableGpuTest, ABuildOnACapturingStreamIsRefused)
{
    TablesUnderTest tut({2, 2, 16}, 0);
    Batch const batch{{{4, 2}}, {20}};
    KVCACHE_TEST_CUDA(cudaStreamBeginCapture(tut.stream.get(), cudaStreamCaptureModeThreadLocal));
    bool const refused =
        throwsNaming<rt::InvalidArgumentError>([&] { tut.build(batch); }, {"build: stream is capturing a CUDA graph"});
    cudaGraph_t graph = nullptr;
    KVCACHE_TEST_CUDA(cudaStreamEndCapture(tut.stream.get(), &graph));
    if (graph != nullptr)
    {
        KVCACHE_TEST_CUDA(cudaGraphDestroy(graph));
    }
    EXPECT_TRUE(refused);
    EXPECT_TRUE(sameTables(referenceTables({}, tut.sizes), tut.device())) << "the refused build uploaded";

    tut.build(batch);
    EXPECT_TRUE(sameTables(referenceTables(batch, tut.sizes), tut.device()));
}

TEST_F(PageTableGpuTest, MovesHandOverTheSameDeviceTables)
{
    TablesUnderTest tut({3, 4, 8}, 31);
    Batch const first = tut.randomBatch(3);
    tut.build(first);
    TableViews const addresses = deviceViews(tut.tables);

    rt::PageTableBuffers moved(std::move(tut.tables));
    EXPECT_EQ(tut.tables.deviceIndptr(), nullptr);
    EXPECT_EQ(tut.tables.hostBlockTable(), nullptr);
    EXPECT_EQ(tut.tables.count(), 0);
    EXPECT_TRUE(throwsNaming<rt::InvalidArgumentError>([&] { tut.build(first); }, {"owns no buffers"}));
    EXPECT_EQ(moved.deviceBlockTable(), addresses.blockTable);
    EXPECT_EQ(moved.count(), 3);

    rt::PageTableBuffers target(1, 1, 1, tut.stream.get());
    target = std::move(moved);
    EXPECT_EQ(target.deviceIndices(), addresses.indices);
    EXPECT_EQ(target.maxPagesPerSequence(), tut.sizes.maxPagesPerSequence);
    EXPECT_TRUE(sameTables(referenceTables(first, tut.sizes), downloadTables(addresses, tut.sizes, tut.stream.get())));
    Batch const second = tut.randomBatch(2);
    build(target, second, tut.stream.get());
    EXPECT_TRUE(sameTables(referenceTables(second, tut.sizes), downloadTables(addresses, tut.sizes, tut.stream.get())));

    // A self-move gives the tables up rather than keeping half a state.
    rt::PageTableBuffers& alias = target;
    target = std::move(alias);
    EXPECT_EQ(target.deviceIndptr(), nullptr);
}

TEST_F(PageTableGpuTest, DestroyingTheTablesWaitsForTheirUploadInFlight)
{
    kvcache::test::CudaStream stream;
    std::atomic<bool> released{false};
    {
        rt::PageTableBuffers tables(4, 4, 16, stream.get());
        holdStream(stream.get(), released);
        build(tables, Batch{{{1, 2, 3}, {4}}, {40, 16}}, stream.get());
    }
    EXPECT_TRUE(released.load()) << "the destructor freed the staging before the upload reading it had run";
    stream.synchronize();
}

TEST_F(PageTableGpuTest, ACapturedKernelReadingTheBlockTableReplaysWithTheRebuiltTables)
{
    kvcache::test::CacheUnderTest cut(kvcache::test::smallConfig(), 29);
    std::mt19937_64 rng(29);
    constexpr uint32_t kPATTERN = 0xC0FFEE11U;
    Sizes const sizes{4, 8, cut.cache().tokensPerPage()};
    rt::PageTableBuffers tables(sizes.maxBatchSize, sizes.maxPagesPerSequence, sizes.tokensPerPage, cut.stream());
    Batch batch = randomBatch(rng, sizes, 4, cut.numPages());
    build(tables, batch, cut.stream());

    // resetPagesDevice reads its page list from device memory: here the whole block table, padding skipped.
    kvcache::test::CapturedGraph graph(cut.stream(),
        [&]
        {
            rt::resetPagesDevice(cut.cache(), tables.deviceBlockTable(), sizes.maxBatchSize * sizes.maxPagesPerSequence,
                nullptr, cut.stream(), kPATTERN);
        });
    ASSERT_TRUE(cut.matchesReference()) << "capturing ran something";
    for (int32_t const count : {4, 2, 3, 0})
    {
        SCOPED_TRACE("count " + std::to_string(count));
        if (count != 4)
        {
            cut.refill();
            batch = randomBatch(rng, sizes, count, cut.numPages());
            build(tables, batch, cut.stream());
        }
        graph.launch(cut.stream());
        cut.reference().reset(batch.allPages(), kPATTERN);
        ASSERT_TRUE(cut.matchesReference()) << "the replay reset other pages than the rebuilt table lists";
    }
}

} // namespace
