// Host tests of the publisher's queue (src/events/kv_event_packed.h, detail::KVEventRing): every array of every batch
// comes back as it was recorded, in order, across many wraps of the ring; a ring without room refuses a batch and
// keeps what it holds; a batch larger than the ring is refused; a writer and a reader on two threads agree on every
// byte.

#include "kvcache/paging/kv_events.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "events/kv_event_packed.h"

namespace kvcache::rt::detail
{
namespace
{

//! Records into `batch` (empty) what `sequence` says: sequence % 4 removals, then one stored event of
//! 1 + sequence % `maxPages` pages of 16 tokens, with a parent for odd sequences and a salt of 3 bytes and one extra
//! key on its first page when sequence % 3 == 0. Every value is derived from `sequence`.
void recordFor(KVEventBatch& batch, uint64_t sequence, int32_t maxPages)
{
    for (uint64_t r = 0; r < sequence % 4; ++r)
    {
        batch.addRemoved(2, KVEventMedium::kCPU, PageHash{sequence, 1000 + r});
    }
    PageHash const parent{sequence, 77};
    batch.beginStored(1, KVEventMedium::kGPU, 16, sequence % 2 == 1 ? &parent : nullptr);
    auto const pages = static_cast<int32_t>(1 + sequence % static_cast<uint64_t>(maxPages));
    std::vector<int32_t> tokens(16);
    std::vector<uint8_t> keys(3 + 20);
    for (size_t k = 0; k < keys.size(); ++k)
    {
        keys[k] = static_cast<uint8_t>(sequence * 7 + k);
    }
    for (int32_t p = 0; p < pages; ++p)
    {
        for (int32_t t = 0; t < 16; ++t)
        {
            tokens[static_cast<size_t>(t)] = static_cast<int32_t>(sequence * 4096 + static_cast<uint64_t>(p * 16 + t));
        }
        bool const keyed = sequence % 3 == 0 && p == 0;
        batch.addStoredPage(PageHash{sequence, static_cast<uint64_t>(p)}, tokens.data(), keyed ? keys.data() : nullptr,
            keyed ? 3 : 0, keyed ? 1 : 0);
    }
}

//! Whether `record` holds exactly the batch recordFor(sequence, maxPages) records, stamped sequence / 8 seconds.
::testing::AssertionResult holds(KVEventRecord const& record, uint64_t sequence, int32_t maxPages)
{
    KVEventBatch expected;
    recordFor(expected, sequence, maxPages);
    if (record.sequence != static_cast<int64_t>(sequence) || record.timestamp != static_cast<double>(sequence) / 8)
    {
        return ::testing::AssertionFailure()
            << "record " << record.sequence << " at " << record.timestamp << " where " << sequence << " was expected";
    }
    KVEventArrays const& got = record.arrays;
    if (got.numEvents != expected.events().size())
    {
        return ::testing::AssertionFailure()
            << "sequence " << sequence << ": " << got.numEvents << " events, not " << expected.events().size();
    }
    for (size_t e = 0; e < got.numEvents; ++e)
    {
        KVEvent const& a = got.events[e];
        KVEvent const& b = expected.events()[e];
        if (a.type != b.type || a.medium != b.medium || a.group != b.group || a.tokensPerPage != b.tokensPerPage
            || a.hasParent != b.hasParent || a.hasKeys != b.hasKeys || a.parent != b.parent
            || a.firstHash != b.firstHash || a.numHashes != b.numHashes || a.firstToken != b.firstToken
            || a.numTokens != b.numTokens)
        {
            return ::testing::AssertionFailure() << "sequence " << sequence << ": event " << e << " differs";
        }
    }
    for (size_t h = 0; h < expected.hashes().size(); ++h)
    {
        if (got.hashes[h] != expected.hashes()[h])
        {
            return ::testing::AssertionFailure() << "sequence " << sequence << ": hash " << h << " differs";
        }
    }
    for (size_t t = 0; t < expected.tokens().size(); ++t)
    {
        if (got.tokens[t] != expected.tokens()[t])
        {
            return ::testing::AssertionFailure() << "sequence " << sequence << ": token " << t << " differs";
        }
    }
    for (size_t k = 0; k < expected.pageKeys().size(); ++k)
    {
        KVEventPageKeys const& a = got.pageKeys[k];
        KVEventPageKeys const& b = expected.pageKeys()[k];
        if (a.offset != b.offset || a.saltBytes != b.saltBytes || a.numKeys != b.numKeys)
        {
            return ::testing::AssertionFailure() << "sequence " << sequence << ": page keys " << k << " differ";
        }
    }
    for (size_t b = 0; b < expected.keyBytes().size(); ++b)
    {
        if (got.keyBytes[b] != expected.keyBytes()[b])
        {
            return ::testing::AssertionFailure() << "sequence " << sequence << ": key byte " << b << " differs";
        }
    }
    return ::testing::AssertionSuccess();
}

bool pushFor(KVEventRing& ring, uint64_t sequence, int32_t maxPages)
{
    KVEventBatch batch;
    recordFor(batch, sequence, maxPages);
    return ring.push(batch, static_cast<int64_t>(sequence), static_cast<double>(sequence) / 8);
}

TEST(KVEventRing, EveryBatchComesBackWholeAndInOrderAcrossWraps)
{
    // 8 KiB: a record of 1 to 12 pages takes 0.3 to 1.4 KiB, so the 600 records wrap the ring about 60 times, each
    // time at another offset.
    KVEventRing ring(8192);
    KVEventRecord record;
    EXPECT_FALSE(ring.front(record)) << "a new ring holds nothing";
    uint64_t popped = 0;
    for (uint64_t pushed = 0; pushed < 600; ++pushed)
    {
        ASSERT_TRUE(pushFor(ring, pushed, 12)) << "record " << pushed << " found no room";
        // Two records queued at times, so that a record waits while the next one wraps.
        if (pushed % 3 == 0)
        {
            continue;
        }
        while (popped <= pushed)
        {
            ASSERT_TRUE(ring.front(record)) << "record " << popped << " missing";
            ASSERT_TRUE(holds(record, popped, 12));
            ring.pop();
            ++popped;
        }
        EXPECT_FALSE(ring.front(record));
    }
    EXPECT_GT(ring.written(), 20 * ring.capacity()) << "the test did not wrap the ring";
    EXPECT_EQ(ring.finished(), ring.written());
}

TEST(KVEventRing, ARingWithoutRoomRefusesTheBatchAndKeepsWhatItHolds)
{
    KVEventRing ring(8192);
    uint64_t pushed = 0;
    // Records of 4 pages (sequences 3, 7, 11, ...), about 0.7 KiB each.
    while (pushFor(ring, 4 * pushed + 3, 4))
    {
        ++pushed;
        ASSERT_LT(pushed, 100u) << "the ring never filled";
    }
    uint64_t const written = ring.written();
    EXPECT_GE(pushed, 5u);
    EXPECT_FALSE(pushFor(ring, 4 * pushed + 3, 4)) << "a refused batch found room on a second try";
    EXPECT_EQ(ring.written(), written) << "a refused batch changed the ring";
    EXPECT_TRUE(ring.halfFull()) << "a ring that refuses a batch is at least half full";
    KVEventRecord record;
    for (uint64_t i = 0; i < pushed; ++i)
    {
        ASSERT_TRUE(ring.front(record));
        ASSERT_TRUE(holds(record, 4 * i + 3, 4));
        ring.pop();
    }
    EXPECT_FALSE(ring.front(record));
    EXPECT_FALSE(ring.halfFull());
    // Room again once the reader has finished.
    EXPECT_TRUE(pushFor(ring, 4 * pushed + 3, 4));
}

TEST(KVEventRing, ABatchLargerThanTheRingIsRefused)
{
    KVEventRing ring(4096);
    // 64 pages: 4 KiB of tokens alone.
    EXPECT_FALSE(pushFor(ring, 63, 64));
    EXPECT_EQ(ring.written(), 0u);
    KVEventRecord record;
    EXPECT_FALSE(ring.front(record));
    EXPECT_TRUE(pushFor(ring, 1, 64));
    ASSERT_TRUE(ring.front(record));
    EXPECT_TRUE(holds(record, 1, 64));
}

TEST(KVEventRing, AWriterAndAReaderOnTwoThreadsAgreeOnEveryBatch)
{
    constexpr uint64_t kBATCHES = 20000;
    KVEventRing ring(16384);
    // Both threads give up at the deadline, so that a ring that loses track of its records fails instead of hanging.
    auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    auto const late = [&] { return std::chrono::steady_clock::now() > deadline; };
    std::vector<uint64_t> mismatches;
    uint64_t read = 0;
    std::thread reader(
        [&]
        {
            KVEventRecord record;
            while (read < kBATCHES && !late())
            {
                if (!ring.front(record))
                {
                    std::this_thread::yield();
                    continue;
                }
                if (!holds(record, read, 20))
                {
                    mismatches.push_back(read);
                }
                ring.pop();
                ++read;
            }
        });
    uint64_t written = 0;
    uint64_t refusals = 0;
    KVEventBatch batch;
    for (; written < kBATCHES && !late(); ++written)
    {
        batch.clear();
        recordFor(batch, written, 20);
        while (!ring.push(batch, static_cast<int64_t>(written), static_cast<double>(written) / 8) && !late())
        {
            ++refusals;
            std::this_thread::yield();
        }
    }
    reader.join();
    EXPECT_EQ(written, kBATCHES) << "the writer found no room before the deadline";
    EXPECT_EQ(read, kBATCHES) << "the reader found no record before the deadline";
    EXPECT_TRUE(mismatches.empty()) << mismatches.size() << " batches read back wrong, the first "
                                    << (mismatches.empty() ? 0 : mismatches.front());
    EXPECT_EQ(ring.finished(), ring.written());
    EXPECT_GT(refusals, 0u) << "the ring was never full: the test did not make the writer wait";
}

} // namespace
} // namespace kvcache::rt::detail
