// KVEventPublisher: the PUB side (the owner's thread), the replay buffer, and the ROUTER side (a thread of its own).
#include "kvcache/events/kv_event_publisher.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <zmq.hpp>

namespace kvcache::rt
{
namespace
{

//! Returns `value` as 8 bytes, big-endian.
std::array<uint8_t, 8> bigEndian(int64_t value)
{
    std::array<uint8_t, 8> bytes{};
    auto const bits = static_cast<uint64_t>(value);
    for (int i = 0; i < 8; ++i)
    {
        bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    }
    return bytes;
}

int64_t fromBigEndian(uint8_t const* bytes)
{
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i)
    {
        bits = (bits << 8) | bytes[i];
    }
    return static_cast<int64_t>(bits);
}

//! Whether vLLM binds `endpoint` (else it connects).
bool binds(std::string const& endpoint)
{
    return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos
        || endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0;
}

void checkRange(char const* field, int64_t value, int64_t low, int64_t high)
{
    if (value < low || value > high)
    {
        throw InvalidArgumentError(
            fmt::format("KVEventPublisher: options.{} is {}; it must be in [{}, {}]", field, value, low, high));
    }
}

//! Binds or connects `socket` to `endpoint` and returns the endpoint as ZeroMQ reports it; throws InvalidArgumentError
//! naming `field`.
std::string open(zmq::socket_t& socket, char const* field, std::string const& endpoint, bool bind)
{
    if (endpoint.empty())
    {
        throw InvalidArgumentError(fmt::format(
            "KVEventPublisher: options.{} is empty; it must be a ZeroMQ endpoint such as tcp://*:5557", field));
    }
    try
    {
        if (bind)
        {
            socket.bind(endpoint);
            return socket.get(zmq::sockopt::last_endpoint);
        }
        socket.connect(endpoint);
        return endpoint;
    }
    catch (zmq::error_t const& error)
    {
        throw InvalidArgumentError(fmt::format("KVEventPublisher: options.{} is \"{}\"; it cannot be {}: {}", field,
            endpoint, bind ? "bound" : "connected", error.what()));
    }
}

} // namespace

struct KVEventPublisher::Impl
{
    //! One batch kept for replay.
    struct Kept
    {
        int64_t sequence = -1;
        std::vector<uint8_t> payload;
    };
    //! One batch waiting for the sending thread.
    struct Queued
    {
        int64_t sequence = -1;
        double timestamp = 0;
        KVEventBatch batch;
    };

    KVEventPublisherOptions options;
    zmq::context_t context{1};
    zmq::socket_t pub{context, zmq::socket_type::xpub};
    zmq::socket_t replay;
    std::string pubEndpoint;
    std::string replayEndpoint;

    //! The queue publish() fills and the sending thread empties, a ring of options.queueBatches slots whose batches
    //! keep their buffers, under queueMutex.
    std::mutex queueMutex;
    std::condition_variable queueChanged;
    std::vector<Queued> queue;
    size_t queueHead = 0;
    size_t queueSize = 0;
    int64_t nextSequence = 0;
    //! Batches the sending thread has finished with (sent or dropped), all of them below nextSequence.
    int64_t finished = 0;
    //! Whether the sending thread waits on queueChanged (else it looks at the queue before it waits again), and
    //! whether it waits as an idle thread does, without looking again within kBUSY_LOOK: only then, or when the queue
    //! is half full, does publish() pay for a wake-up.
    bool senderWaiting = false;
    bool senderIdle = false;
    //! Cleared batches whose buffers the sending thread is done with, for the next publish to fill (publish) or hand
    //! back (publishSwap), so that a steady stream of batches allocates nothing; at most kMAX_SPARES (reserved), the
    //! most recent last. More would only keep memory that a burst once needed.
    std::vector<KVEventBatch> spares;
    static constexpr size_t kMAX_SPARES = 64;

    //! How long one replay reply waits for room in the client's queue before the replay ends; it also bounds how long
    //! a stuck client can delay the publisher's destruction.
    static constexpr int kREPLAY_SEND_WAIT_MS = 500;

    //! The replay buffer, a ring of options.replayBatches payloads (only with a replay endpoint), under `mutex`.
    std::mutex mutex;
    std::vector<Kept> kept;
    size_t nextKept = 0;

    std::atomic<int64_t> batches{0};
    std::atomic<int64_t> events{0};
    std::atomic<int64_t> dropped{0};
    std::atomic<int64_t> replays{0};
    std::atomic<int64_t> badReplays{0};
    std::atomic<int32_t> subscriptions{0};
    std::atomic<bool> running{true};
    std::thread sender;
    std::thread replayer;

    explicit Impl(KVEventPublisherOptions const& opts)
        : options(opts)
    {
        checkRange("replayBatches", options.replayBatches, 1, int64_t{1} << 20);
        checkRange("queueBatches", options.queueBatches, 1, int64_t{1} << 20);
        checkRange("sendHighWaterMark", options.sendHighWaterMark, 1, int64_t{1} << 24);
        checkRange("lingerMs", options.lingerMs, 0, 60000);
        if (options.encoding != KVEventEncoding::kTAGGED_MAP && options.encoding != KVEventEncoding::kTAGGED_ARRAY)
        {
            throw InvalidArgumentError(fmt::format("KVEventPublisher: options.encoding is {}; it must be kTAGGED_MAP "
                                                   "(0) or kTAGGED_ARRAY (1)",
                static_cast<int32_t>(options.encoding)));
        }
        pub.set(zmq::sockopt::linger, options.lingerMs);
        pub.set(zmq::sockopt::sndhwm, options.sendHighWaterMark);
        // A full subscriber queue makes a non-blocking send fail instead of dropping silently, so drops are counted;
        // every subscribe and unsubscribe is passed on, so subscribers are counted.
        pub.set(zmq::sockopt::xpub_nodrop, 1);
        pub.set(zmq::sockopt::xpub_verboser, 1);
        pubEndpoint = open(pub, "endpoint", options.endpoint, binds(options.endpoint));
        if (!options.replayEndpoint.empty())
        {
            replay = zmq::socket_t(context, zmq::socket_type::router);
            replay.set(zmq::sockopt::linger, 0);
            // A ROUTER drops what a full peer queue cannot take; a replay must arrive whole or end early, so a reply
            // waits for room (kREPLAY_SEND_WAIT_MS at most) and a peer that is gone fails the send.
            replay.set(zmq::sockopt::router_mandatory, 1);
            replay.set(zmq::sockopt::sndtimeo, kREPLAY_SEND_WAIT_MS);
            replayEndpoint = open(replay, "replayEndpoint", options.replayEndpoint, true);
            kept.resize(static_cast<size_t>(options.replayBatches));
        }
        queue.resize(static_cast<size_t>(options.queueBatches));
        spares.reserve(kMAX_SPARES);
        sender = std::thread([this] { sendQueued(); });
        if (replay)
        {
            try
            {
                replayer = std::thread([this] { serveReplays(); });
            }
            catch (...)
            {
                stop();
                throw;
            }
        }
    }

    //! Lets the threads finish and joins them.
    void stop() noexcept
    {
        {
            std::lock_guard<std::mutex> lock(queueMutex);
            running = false;
        }
        queueChanged.notify_all();
        for (std::thread* thread : {&sender, &replayer})
        {
            if (thread->joinable())
            {
                thread->join();
            }
        }
    }

    ~Impl()
    {
        stop();
    }

    //! Counts the subscribe (first byte 1) and unsubscribe (0) messages waiting on the PUB socket (sending thread).
    void drainSubscriptions()
    {
        zmq::message_t message;
        while (pub.recv(message, zmq::recv_flags::dontwait))
        {
            if (message.size() > 0)
            {
                subscriptions += static_cast<uint8_t const*>(message.data())[0] == 1 ? 1 : -1;
            }
        }
    }

    //! How long the sending thread, having just sent, waits before it looks at the queue again unasked: publish()
    //! does not wake it meanwhile, which saves the publishing thread a system call a batch while batches keep coming.
    static constexpr std::chrono::milliseconds kBUSY_LOOK{1};
    //! How long the idle sending thread waits before it counts the subscriptions again.
    static constexpr std::chrono::milliseconds kIDLE_LOOK{10};

    //! Counts a batch of `numEvents` events published while the queue is full: lost, its sequence number a gap.
    //! Under queueMutex.
    int64_t dropFull(size_t numEvents)
    {
        int64_t const sequence = nextSequence++;
        ++batches;
        events += static_cast<int64_t>(numEvents);
        ++dropped;
        ++finished;
        return sequence;
    }

    //! Puts a batch of `eventCount` events into the queue's next slot with `fill(slot)` and returns its sequence
    //! number; when the queue is full, the batch is dropped (its number taken and counted) and `full()` runs. Wakes the
    //! sending thread when it is idle or the queue is half full. `fill` runs first: when it throws, nothing is counted.
    template <typename Fill, typename Full>
    int64_t enqueue(size_t eventCount, double timestamp, Fill&& fill, Full&& full)
    {
        int64_t sequence = 0;
        bool wake = false;
        {
            std::lock_guard<std::mutex> lock(queueMutex);
            if (queueSize == queue.size())
            {
                int64_t const lost = dropFull(eventCount);
                full();
                return lost;
            }
            Queued& slot = queue[(queueHead + queueSize) % queue.size()];
            fill(slot);
            slot.sequence = nextSequence++;
            slot.timestamp = timestamp;
            ++batches;
            events += static_cast<int64_t>(eventCount);
            ++queueSize;
            sequence = slot.sequence;
            wake = senderWaiting && (senderIdle || 2 * queueSize >= queue.size());
        }
        if (wake)
        {
            queueChanged.notify_all();
        }
        return sequence;
    }

    int64_t publish(KVEventBatch const& batch, double timestamp)
    {
        if (batch.empty())
        {
            return -1;
        }
        return enqueue(
            batch.events().size(), timestamp,
            [&](Queued& slot)
            {
                if (!spares.empty())
                {
                    slot.batch = std::move(spares.back());
                    spares.pop_back();
                }
                slot.batch = batch;
            },
            [] {});
    }

    int64_t publishSwap(KVEventBatch& batch, double timestamp) noexcept
    {
        if (batch.empty())
        {
            return -1;
        }
        return enqueue(
            batch.events().size(), timestamp,
            [&](Queued& slot)
            {
                // The sending thread took the slot's buffers, so nothing is freed here (but what a failed copy left).
                slot.batch = std::move(batch);
                if (!spares.empty())
                {
                    batch = std::move(spares.back());
                    spares.pop_back();
                }
                batch.clear();
            },
            [&] { batch.clear(); });
    }

    bool flush(int32_t timeoutMs)
    {
        std::unique_lock<std::mutex> lock(queueMutex);
        if (senderWaiting && queueSize > 0)
        {
            // The sending thread may be waiting out kBUSY_LOOK: no need to.
            queueChanged.notify_all();
        }
        return queueChanged.wait_for(
            lock, std::chrono::milliseconds(timeoutMs), [this] { return finished == nextSequence; });
    }

    //! The sending thread: encodes and sends each queued batch in order, keeps it for replay, and counts the
    //! subscriptions; it finishes what is queued before it stops.
    void sendQueued()
    {
        KVEventBatch batch;
        std::vector<uint8_t> payload;
        // Whether the last look at the queue found a batch: then the thread waits only kBUSY_LOOK, unwoken.
        bool busy = false;
        while (true)
        {
            int64_t sequence = 0;
            double timestamp = 0;
            {
                std::unique_lock<std::mutex> lock(queueMutex);
                if (queueSize == 0 && running)
                {
                    senderWaiting = true;
                    senderIdle = !busy;
                    queueChanged.wait_for(
                        lock, busy ? kBUSY_LOOK : kIDLE_LOOK, [this] { return queueSize > 0 || !running; });
                    senderWaiting = false;
                    senderIdle = false;
                }
                if (queueSize == 0)
                {
                    if (!running)
                    {
                        return;
                    }
                    busy = false;
                    lock.unlock();
                    drainSubscriptions();
                    continue;
                }
                busy = true;
                Queued& slot = queue[queueHead];
                sequence = slot.sequence;
                timestamp = slot.timestamp;
                // The slot is left holding no buffers, for publishSwap(); `batch`'s went back to the spares (or, when
                // those were full, are freed here).
                batch = std::move(slot.batch);
                queueHead = (queueHead + 1) % queue.size();
                --queueSize;
            }
            try
            {
                drainSubscriptions();
                payload.clear();
                encodeKVEventBatch(batch, timestamp, options.encoding, options.dataParallelRank, payload);
                std::array<uint8_t, 8> const sequenceBytes = bigEndian(sequence);
                // The parts of one message go out together or not at all: only the first send can be refused.
                bool const sent =
                    pub.send(zmq::buffer(options.topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait)
                        .has_value();
                if (sent)
                {
                    pub.send(zmq::buffer(sequenceBytes), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
                    pub.send(zmq::buffer(payload), zmq::send_flags::dontwait);
                }
                if (!sent)
                {
                    // Written only then: the counters' cache line stays with the publishing thread.
                    ++dropped;
                }
                if (!kept.empty())
                {
                    std::lock_guard<std::mutex> lock(mutex);
                    Kept& slot = kept[nextKept];
                    slot.sequence = sequence;
                    slot.payload.assign(payload.begin(), payload.end());
                    nextKept = (nextKept + 1) % kept.size();
                }
            }
            catch (std::exception const&)
            {
                // Memory or ZeroMQ failed for this batch: it is lost like a refused one, and the thread goes on.
                ++dropped;
            }
            {
                std::lock_guard<std::mutex> lock(queueMutex);
                ++finished;
                batch.clear();
                if (spares.size() < kMAX_SPARES)
                {
                    spares.push_back(std::move(batch));
                }
            }
            queueChanged.notify_all();
        }
    }

    //! The replay thread: answers each request with the kept batches from its start on, oldest first, then the end
    //! marker.
    void serveReplays()
    {
        std::vector<zmq::message_t> request;
        std::vector<Kept> answer;
        while (running)
        {
            zmq::pollitem_t item{replay.handle(), 0, ZMQ_POLLIN, 0};
            try
            {
                if (zmq::poll(&item, 1, std::chrono::milliseconds(50)) == 0)
                {
                    continue;
                }
                request.clear();
                do
                {
                    request.emplace_back();
                    if (!replay.recv(request.back(), zmq::recv_flags::dontwait))
                    {
                        request.pop_back();
                        break;
                    }
                } while (request.back().more());
                if (request.size() != 3 || request[1].size() != 0 || request[2].size() != 8)
                {
                    ++badReplays;
                    continue;
                }
                int64_t const start = fromBigEndian(static_cast<uint8_t const*>(request[2].data()));
                answer.clear();
                {
                    std::lock_guard<std::mutex> lock(mutex);
                    ++replays;
                    for (size_t i = 0; i < kept.size(); ++i)
                    {
                        Kept const& slot = kept[(nextKept + i) % kept.size()];
                        if (slot.sequence >= 0 && slot.sequence >= start)
                        {
                            answer.push_back(slot);
                        }
                    }
                }
                bool whole = true;
                for (size_t i = 0; i < answer.size() && whole; ++i)
                {
                    whole = running
                        && sendReply(
                            request[0], answer[i].sequence, answer[i].payload.data(), answer[i].payload.size());
                }
                if (whole)
                {
                    sendReply(request[0], -1, nullptr, 0);
                }
            }
            catch (std::exception const&)
            {
                // A failed replay (memory, a peer gone) must not end the thread: the client asks again.
            }
        }
    }

    //! Sends one reply; false when the peer's queue stayed full for kREPLAY_SEND_WAIT_MS (the replay then ends
    //! without its end marker, and the client asks again). A peer that is gone throws.
    bool sendReply(zmq::message_t const& identity, int64_t sequence, uint8_t const* data, size_t size)
    {
        std::array<uint8_t, 8> const sequenceBytes = bigEndian(sequence);
        // The first frame waits for room; a message's later frames always follow it.
        if (!replay.send(zmq::buffer(identity.data(), identity.size()), zmq::send_flags::sndmore))
        {
            return false;
        }
        replay.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
        replay.send(zmq::buffer(sequenceBytes), zmq::send_flags::sndmore);
        replay.send(zmq::const_buffer(data, size), zmq::send_flags::none);
        return true;
    }
};

KVEventPublisher::KVEventPublisher(KVEventPublisherOptions const& options)
    : mImpl(std::make_unique<Impl>(options))
{
}

KVEventPublisher::~KVEventPublisher() = default;

int64_t KVEventPublisher::publish(KVEventBatch const& batch)
{
    auto const now = std::chrono::system_clock::now().time_since_epoch();
    return publish(batch, std::chrono::duration<double>(now).count());
}

int64_t KVEventPublisher::publish(KVEventBatch const& batch, double timestamp)
{
    return mImpl->publish(batch, timestamp);
}

int64_t KVEventPublisher::publishSwap(KVEventBatch& batch) noexcept
{
    auto const now = std::chrono::system_clock::now().time_since_epoch();
    return publishSwap(batch, std::chrono::duration<double>(now).count());
}

int64_t KVEventPublisher::publishSwap(KVEventBatch& batch, double timestamp) noexcept
{
    return mImpl->publishSwap(batch, timestamp);
}

bool KVEventPublisher::flush(int32_t timeoutMs)
{
    return mImpl->flush(timeoutMs);
}

int32_t KVEventPublisher::numSubscribers() const noexcept
{
    return mImpl->subscriptions;
}

bool KVEventPublisher::waitForSubscriber(int32_t timeoutMs)
{
    auto const deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
    while (numSubscribers() == 0)
    {
        if (std::chrono::steady_clock::now() >= deadline)
        {
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
}

std::string const& KVEventPublisher::endpoint() const noexcept
{
    return mImpl->pubEndpoint;
}

std::string const& KVEventPublisher::replayEndpoint() const noexcept
{
    return mImpl->replayEndpoint;
}

KVEventPublisherStats KVEventPublisher::stats() const noexcept
{
    KVEventPublisherStats stats;
    stats.batches = mImpl->batches;
    stats.events = mImpl->events;
    stats.droppedBatches = mImpl->dropped;
    stats.replays = mImpl->replays;
    stats.badReplayRequests = mImpl->badReplays;
    return stats;
}

} // namespace kvcache::rt
