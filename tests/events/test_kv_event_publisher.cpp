// Host tests of KVEventPublisher over loopback TCP (random free ports): bad options refused with named errors; a
// subscriber receives each batch as three frames (topic, sequence number, payload); a subscriber that never reads
// never blocks publish(), drops are counted, and the replay socket hands back every batch from a sequence number on;
// publishSwap() sends exactly what was recorded and clears the batch, which keeps its buffers; a full publisher queue
// drops what does not fit, and a batch larger than the whole queue is dropped.

#include "kvcache/core/errors.h"
#include "kvcache/events/kv_event_publisher.h"
#include "kvcache/paging/kv_events.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "support/error_matchers.h"

namespace kvcache::rt
{
namespace
{

using test::throwsNaming;
using Bytes = std::vector<uint8_t>;

int64_t sequenceOf(zmq::message_t const& frame)
{
    EXPECT_EQ(frame.size(), 8u);
    auto const* bytes = static_cast<uint8_t const*>(frame.data());
    uint64_t value = 0;
    for (size_t i = 0; i < 8; ++i)
    {
        value = (value << 8) | bytes[i];
    }
    return static_cast<int64_t>(value);
}

Bytes bytesOf(zmq::message_t const& frame)
{
    auto const* data = static_cast<uint8_t const*>(frame.data());
    return Bytes(data, data + frame.size());
}

//! Receives one multipart message, waiting at most 5 s for it; empty when none came.
std::vector<zmq::message_t> receive(zmq::socket_t& socket)
{
    std::vector<zmq::message_t> parts;
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(5000)) == 0)
    {
        return parts;
    }
    do
    {
        parts.emplace_back();
        EXPECT_TRUE(socket.recv(parts.back(), zmq::recv_flags::none));
    } while (parts.back().more());
    return parts;
}

//! A SUB socket of its own context, subscribed to `prefix` and connected to `publisher`, which has seen it subscribe.
struct Subscriber
{
    zmq::context_t context;
    zmq::socket_t socket{context, zmq::socket_type::sub};

    Subscriber(KVEventPublisher& publisher, std::string const& prefix)
    {
        socket.set(zmq::sockopt::subscribe, prefix);
        socket.connect(publisher.endpoint());
        EXPECT_TRUE(publisher.waitForSubscriber(5000)) << "the subscriber was not seen";
    }
};

//! A batch of one stored event of `pages` pages of 16 tokens, its hashes and tokens derived from `seed`.
KVEventBatch batchOf(uint64_t seed, int32_t pages)
{
    KVEventBatch batch;
    batch.beginStored(0, KVEventMedium::kGPU, 16, nullptr);
    std::vector<int32_t> tokens(16);
    for (int32_t p = 0; p < pages; ++p)
    {
        for (int32_t t = 0; t < 16; ++t)
        {
            tokens[static_cast<size_t>(t)] = static_cast<int32_t>(seed * 1000 + static_cast<uint64_t>(p * 16 + t));
        }
        batch.addStoredPage(PageHash{seed, static_cast<uint64_t>(p)}, tokens.data(), nullptr, 0, 0);
    }
    return batch;
}

//! Records into `batch` (empty) a removal of `seed` pages, then one stored event of `pages` pages of 16 tokens as
//! batchOf() makes them, whose first page carries a 3-byte salt when `salted`.
void recordInto(KVEventBatch& batch, uint64_t seed, int32_t pages, bool salted)
{
    for (uint64_t r = 0; r < seed % 3; ++r)
    {
        batch.addRemoved(1, KVEventMedium::kGPU, PageHash{r, seed});
    }
    batch.beginStored(0, KVEventMedium::kGPU, 16, nullptr);
    std::vector<int32_t> tokens(16);
    uint8_t const salt[3] = {7, static_cast<uint8_t>(seed), 9};
    for (int32_t p = 0; p < pages; ++p)
    {
        for (int32_t t = 0; t < 16; ++t)
        {
            tokens[static_cast<size_t>(t)] = static_cast<int32_t>(seed * 1000 + static_cast<uint64_t>(p * 16 + t));
        }
        bool const withSalt = salted && p == 0;
        batch.addStoredPage(
            PageHash{seed, static_cast<uint64_t>(p)}, tokens.data(), withSalt ? salt : nullptr, withSalt ? 3 : 0, 0);
    }
}

Bytes payloadOf(KVEventBatch const& batch, double ts, KVEventPublisherOptions const& options)
{
    Bytes out;
    encodeKVEventBatch(batch, ts, options.encoding, options.dataParallelRank, out);
    return out;
}

//! The publisher's counts once every queued batch has been sent or dropped.
KVEventPublisherStats statsOnceFlushed(KVEventPublisher& publisher)
{
    EXPECT_TRUE(publisher.flush(10000)) << "the queue did not drain";
    return publisher.stats();
}

TEST(KVEventPublisher, RefusesBadOptionsNamingThem)
{
    KVEventPublisherOptions options;
    options.endpoint = "";
    EXPECT_TRUE(
        throwsNaming<InvalidArgumentError>([&] { KVEventPublisher p(options); }, {"options.endpoint", "empty"}));
    options.endpoint = "bogus://nowhere";
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { KVEventPublisher p(options); }, {"options.endpoint", "bogus://nowhere", "connected"}));
    options.endpoint = "tcp://127.0.0.1:*";
    options.replayEndpoint = "tcp://256.1.1.1:*";
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { KVEventPublisher p(options); }, {"options.replayEndpoint", "tcp://256.1.1.1:*", "bound"}));
    options.replayEndpoint = "";
    options.replayBatches = 0;
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { KVEventPublisher p(options); }, {"options.replayBatches", "is 0", "[1, 1048576]"}));
    options.replayBatches = 1;
    options.sendHighWaterMark = -3;
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { KVEventPublisher p(options); }, {"options.sendHighWaterMark", "-3", "[1, 16777216]"}));
    options.sendHighWaterMark = 1;
    options.lingerMs = 60001;
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { KVEventPublisher p(options); }, {"options.lingerMs", "60001", "[0, 60000]"}));
    options.lingerMs = 0;
    options.queueBytes = 0;
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { KVEventPublisher p(options); }, {"options.queueBytes", "is 0", "[65536, 17179869184]"}));
    options.queueBytes = (int64_t{1} << 16) + 32;
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>(
        [&] { KVEventPublisher p(options); }, {"options.queueBytes", "65568", "multiple of 64"}));
    options.queueBytes = int64_t{1} << 16;
    options.encoding = static_cast<KVEventEncoding>(5);
    EXPECT_TRUE(throwsNaming<InvalidArgumentError>([&] { KVEventPublisher p(options); }, {"options.encoding", "5"}));
}

TEST(KVEventPublisher, SubscriberReceivesEachBatchAsThreeFrames)
{
    for (KVEventEncoding const encoding : {KVEventEncoding::kTAGGED_MAP, KVEventEncoding::kTAGGED_ARRAY})
    {
        KVEventPublisherOptions options;
        options.endpoint = "tcp://127.0.0.1:*";
        options.topic = "kv@pod@model";
        options.encoding = encoding;
        options.dataParallelRank = 1;
        KVEventPublisher publisher(options);
        ASSERT_EQ(publisher.endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << publisher.endpoint();
        Subscriber subscriber(publisher, "kv@");
        zmq::socket_t& sub = subscriber.socket;
        EXPECT_EQ(publisher.numSubscribers(), 1);

        EXPECT_EQ(publisher.publish(KVEventBatch{}), -1) << "an empty batch is not sent";
        for (uint64_t i = 0; i < 3; ++i)
        {
            EXPECT_EQ(publisher.publish(batchOf(i, 2), 10.0 + static_cast<double>(i)), static_cast<int64_t>(i));
        }
        for (uint64_t i = 0; i < 3; ++i)
        {
            std::vector<zmq::message_t> const parts = receive(sub);
            ASSERT_EQ(parts.size(), 3u);
            EXPECT_EQ(parts[0].to_string(), "kv@pod@model");
            EXPECT_EQ(sequenceOf(parts[1]), static_cast<int64_t>(i));
            EXPECT_EQ(bytesOf(parts[2]), payloadOf(batchOf(i, 2), 10.0 + static_cast<double>(i), options));
        }
        KVEventPublisherStats const stats = statsOnceFlushed(publisher);
        EXPECT_EQ(stats.batches, 3);
        EXPECT_EQ(stats.events, 3);
        EXPECT_EQ(stats.droppedBatches, 0);
    }
}

TEST(KVEventPublisher, SlowSubscriberNeverBlocksDropsAreCountedAndReplayRecovers)
{
    KVEventPublisherOptions options;
    options.endpoint = "tcp://127.0.0.1:*";
    options.replayEndpoint = "tcp://127.0.0.1:*";
    options.sendHighWaterMark = 2;
    options.replayBatches = 4000;
    KVEventPublisher publisher(options);
    zmq::context_t context;
    zmq::socket_t sub(context, zmq::socket_type::sub);
    sub.set(zmq::sockopt::rcvhwm, 1);
    sub.set(zmq::sockopt::rcvbuf, 4096);
    sub.set(zmq::sockopt::subscribe, "");
    sub.connect(publisher.endpoint());
    ASSERT_TRUE(publisher.waitForSubscriber(5000));

    // The subscriber reads nothing while batches of 64 pages (1024 tokens) are published, until some are dropped.
    constexpr int64_t kMAX_BATCHES = 4000;
    double slowest = 0;
    int64_t published = 0;
    while (published < kMAX_BATCHES && (publisher.stats().droppedBatches == 0 || published < 200))
    {
        auto const start = std::chrono::steady_clock::now();
        EXPECT_EQ(publisher.publish(batchOf(static_cast<uint64_t>(published), 64), 1.0), published);
        slowest = std::max(slowest, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        ++published;
    }
    KVEventPublisherStats const stats = statsOnceFlushed(publisher);
    EXPECT_GT(stats.droppedBatches, 0) << "published " << published;
    EXPECT_EQ(stats.batches, published);
    // A send that waited for the subscriber would wait forever; this bound only catches a gross stall.
    EXPECT_LT(slowest, 1.0);

    // The subscriber now reads what reached it: increasing sequence numbers with gaps where batches were dropped.
    std::vector<int64_t> received;
    zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
    while (zmq::poll(&item, 1, std::chrono::milliseconds(500)) > 0)
    {
        std::vector<zmq::message_t> const parts = receive(sub);
        ASSERT_EQ(parts.size(), 3u);
        received.push_back(sequenceOf(parts[1]));
    }
    ASSERT_FALSE(received.empty());
    EXPECT_LT(static_cast<int64_t>(received.size()), published);
    for (size_t i = 1; i < received.size(); ++i)
    {
        EXPECT_GT(received[i], received[i - 1]);
    }

    // Replay from the first batch it missed: every batch from there, in order, then -1 with an empty payload.
    int64_t missed = 0;
    while (missed < static_cast<int64_t>(received.size()) && received[static_cast<size_t>(missed)] == missed)
    {
        ++missed;
    }
    zmq::socket_t dealer(context, zmq::socket_type::dealer);
    dealer.connect(publisher.replayEndpoint());
    Bytes start(8);
    for (int i = 0; i < 8; ++i)
    {
        start[static_cast<size_t>(i)] = static_cast<uint8_t>(static_cast<uint64_t>(missed) >> (56 - 8 * i));
    }
    dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
    dealer.send(zmq::buffer(start), zmq::send_flags::none);
    for (int64_t sequence = missed; sequence <= published; ++sequence)
    {
        std::vector<zmq::message_t> const parts = receive(dealer);
        ASSERT_EQ(parts.size(), 3u) << "sequence " << sequence;
        EXPECT_EQ(parts[0].size(), 0u);
        if (sequence == published)
        {
            EXPECT_EQ(sequenceOf(parts[1]), -1);
            EXPECT_EQ(parts[2].size(), 0u);
            break;
        }
        ASSERT_EQ(sequenceOf(parts[1]), sequence);
        EXPECT_EQ(bytesOf(parts[2]), payloadOf(batchOf(static_cast<uint64_t>(sequence), 64), 1.0, options));
    }
    EXPECT_EQ(publisher.stats().replays, 1);

    // A malformed request (no empty frame) is counted and answered with nothing.
    dealer.send(zmq::buffer(start), zmq::send_flags::none);
    zmq::pollitem_t replies{dealer.handle(), 0, ZMQ_POLLIN, 0};
    EXPECT_EQ(zmq::poll(&replies, 1, std::chrono::milliseconds(300)), 0);
    EXPECT_EQ(publisher.stats().badReplayRequests, 1);
}

// A replay longer than a ZeroMQ queue holds (1000 messages by default on each side, and a client reading nothing for
// a while) arrives whole: 3000 batches of 64 pages, about 40 MB, every one in order, then the end marker.
TEST(KVEventPublisher, AReplayLongerThanTheQueuesArrivesWhole)
{
    KVEventPublisherOptions options;
    options.endpoint = "tcp://127.0.0.1:*";
    options.replayEndpoint = "tcp://127.0.0.1:*";
    options.replayBatches = 3000;
    KVEventPublisher publisher(options);
    constexpr int64_t kBATCHES = 3000;
    for (int64_t i = 0; i < kBATCHES; ++i)
    {
        ASSERT_EQ(publisher.publish(batchOf(static_cast<uint64_t>(i), 64), 2.0), i);
        if (i % 500 == 499)
        {
            ASSERT_TRUE(publisher.flush(10000)); // the queue never fills: every batch is kept
        }
    }
    ASSERT_EQ(statsOnceFlushed(publisher).droppedBatches, 0);

    zmq::context_t context;
    zmq::socket_t dealer(context, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::rcvhwm, 1);
    dealer.set(zmq::sockopt::rcvbuf, 4096);
    dealer.connect(publisher.replayEndpoint());
    Bytes const start(8, 0);
    dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
    dealer.send(zmq::buffer(start), zmq::send_flags::none);
    std::this_thread::sleep_for(std::chrono::milliseconds(200)); // the replay fills every queue meanwhile
    for (int64_t sequence = 0; sequence <= kBATCHES; ++sequence)
    {
        std::vector<zmq::message_t> const parts = receive(dealer);
        ASSERT_EQ(parts.size(), 3u) << "sequence " << sequence;
        if (sequence == kBATCHES)
        {
            EXPECT_EQ(sequenceOf(parts[1]), -1);
            break;
        }
        ASSERT_EQ(sequenceOf(parts[1]), sequence);
        if (sequence % 997 == 0)
        {
            EXPECT_EQ(bytesOf(parts[2]), payloadOf(batchOf(static_cast<uint64_t>(sequence), 64), 2.0, options));
        }
    }
}

TEST(KVEventPublisher, PublishSwapSendsWhatWasRecordedAndHandsBackACleanBatch)
{
    // One batch object recorded into and published again and again, by swap and (every third) by copy, large and
    // small, with and without keys, so that the queue's buffers grow and come back from the sending thread: each
    // message is exactly the encoding of a batch built afresh, and the batch comes back empty every time, keeping
    // its buffers.
    KVEventPublisherOptions options;
    options.endpoint = "tcp://127.0.0.1:*";
    KVEventPublisher publisher(options);
    Subscriber subscriber(publisher, "");
    zmq::socket_t& sub = subscriber.socket;

    constexpr uint64_t kBATCHES = 24;
    auto const pagesOf = [](uint64_t i) { return static_cast<int32_t>(i % 4 == 0 ? 40 : 1 + i % 3); };
    KVEventBatch batch;
    for (uint64_t i = 0; i < kBATCHES; ++i)
    {
        ASSERT_TRUE(batch.empty());
        ASSERT_TRUE(
            batch.hashes().empty() && batch.tokens().empty() && batch.pageKeys().empty() && batch.keyBytes().empty());
        recordInto(batch, i, pagesOf(i), i % 2 == 0);
        double const ts = 100.0 + static_cast<double>(i);
        if (i % 3 == 2)
        {
            EXPECT_EQ(publisher.publish(batch, ts), static_cast<int64_t>(i));
            batch.clear();
        }
        else
        {
            size_t const tokensHeld = batch.tokens().capacity();
            size_t const hashesHeld = batch.hashes().capacity();
            EXPECT_EQ(publisher.publishSwap(batch, ts), static_cast<int64_t>(i));
            EXPECT_EQ(batch.tokens().capacity(), tokensHeld) << "batch " << i << " came back without its buffers";
            EXPECT_EQ(batch.hashes().capacity(), hashesHeld) << "batch " << i << " came back without its buffers";
        }
        if (i == kBATCHES / 2)
        {
            // Everything sent: the next batches are queued behind bytes the sending thread has finished with.
            ASSERT_TRUE(publisher.flush(5000));
        }
    }
    EXPECT_TRUE(batch.empty());
    KVEventBatch empty;
    EXPECT_EQ(publisher.publishSwap(empty), -1) << "an empty batch is not sent";
    for (uint64_t i = 0; i < kBATCHES; ++i)
    {
        std::vector<zmq::message_t> const parts = receive(sub);
        ASSERT_EQ(parts.size(), 3u);
        EXPECT_EQ(sequenceOf(parts[1]), static_cast<int64_t>(i));
        KVEventBatch expected;
        recordInto(expected, i, pagesOf(i), i % 2 == 0);
        EXPECT_EQ(bytesOf(parts[2]), payloadOf(expected, 100.0 + static_cast<double>(i), options)) << "batch " << i;
    }
    KVEventPublisherStats const stats = statsOnceFlushed(publisher);
    EXPECT_EQ(stats.batches, static_cast<int64_t>(kBATCHES));
    EXPECT_EQ(stats.droppedBatches, 0);
}

//! Publishes 2000 batches, each through `publishOne(publisher, i)`, into a queue of 64 KiB that holds a few of them:
//! some find no room (the sending thread is busy with those before). Each still gets its sequence number, and every
//! batch ends up sent or dropped.
template <typename PublishOne>
void expectAFullQueueDropsAndCounts(PublishOne&& publishOne)
{
    KVEventPublisherOptions options;
    options.endpoint = "tcp://127.0.0.1:*";
    options.queueBytes = int64_t{1} << 16;
    KVEventPublisher publisher(options);
    for (int64_t i = 0; i < 2000; ++i)
    {
        ASSERT_EQ(publishOne(publisher, i), i);
    }
    KVEventPublisherStats const stats = statsOnceFlushed(publisher);
    EXPECT_EQ(stats.batches, 2000);
    EXPECT_GT(stats.droppedBatches, 0);
    EXPECT_LT(stats.droppedBatches, 2000);
}

TEST(KVEventPublisher, AFullQueueDropsAndCountsTheBatch)
{
    KVEventBatch const batch = batchOf(1, 256);
    expectAFullQueueDropsAndCounts([&](KVEventPublisher& publisher, int64_t) { return publisher.publish(batch, 1.0); });
}

TEST(KVEventPublisher, PublishSwapIntoAFullQueueDropsCountsAndClears)
{
    KVEventBatch batch;
    expectAFullQueueDropsAndCounts(
        [&](KVEventPublisher& publisher, int64_t i)
        {
            recordInto(batch, static_cast<uint64_t>(i), 64, false);
            int64_t const sequence = publisher.publishSwap(batch, 1.0);
            EXPECT_TRUE(batch.empty()) << "batch " << i;
            return sequence;
        });
}

TEST(KVEventPublisher, ABatchLargerThanTheQueueIsDroppedAndTheNextOneSent)
{
    KVEventPublisherOptions options;
    options.endpoint = "tcp://127.0.0.1:*";
    options.queueBytes = int64_t{1} << 16;
    KVEventPublisher publisher(options);
    Subscriber subscriber(publisher, "");
    zmq::socket_t& sub = subscriber.socket;

    // 1024 pages of 16 tokens: 64 KiB of token ids alone.
    EXPECT_EQ(publisher.publish(batchOf(1, 1024), 1.0), 0);
    EXPECT_EQ(publisher.publish(batchOf(2, 2), 2.0), 1);
    std::vector<zmq::message_t> const parts = receive(sub);
    ASSERT_EQ(parts.size(), 3u);
    EXPECT_EQ(sequenceOf(parts[1]), 1) << "the batch too large for the queue was sent";
    EXPECT_EQ(bytesOf(parts[2]), payloadOf(batchOf(2, 2), 2.0, options));
    KVEventPublisherStats const stats = statsOnceFlushed(publisher);
    EXPECT_EQ(stats.batches, 2);
    EXPECT_EQ(stats.droppedBatches, 1);
}

} // namespace
} // namespace kvcache::rt
