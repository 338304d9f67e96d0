// KVEventPublisher: the queue the owner's thread fills and the sending thread that empties it onto the PUB socket.
#include "kvcache/events/kv_event_publisher.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <zmq.hpp>

#include "events/kv_event_replay.h"

namespace kvcache::rt
{
namespace
{

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

} // namespace

struct KVEventPublisher::Impl
{
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
    //! Only with a replay endpoint. Declared after the context, so that its socket closes first.
    std::unique_ptr<detail::KVEventReplay> replay;
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

    std::atomic<int64_t> batches{0};
    std::atomic<int64_t> events{0};
    std::atomic<int64_t> dropped{0};
    std::atomic<int32_t> subscriptions{0};
    std::atomic<bool> running{true};
    std::thread sender;

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
        pubEndpoint = detail::openEndpoint(pub, "endpoint", options.endpoint, binds(options.endpoint));
        if (!options.replayEndpoint.empty())
        {
            replay = std::make_unique<detail::KVEventReplay>(context, options.replayEndpoint, options.replayBatches);
            replayEndpoint = replay->endpoint();
        }
        queue.resize(static_cast<size_t>(options.queueBatches));
        spares.reserve(kMAX_SPARES);
        sender = std::thread([this] { sendQueued(); });
    }

    //! Lets the sending thread finish what is queued and joins it (the replay thread stops with `replay`).
    void stop() noexcept
    {
        {
            std::lock_guard<std::mutex> lock(queueMutex);
            running = false;
        }
        queueChanged.notify_all();
        if (sender.joinable())
        {
            sender.join();
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
                std::array<uint8_t, 8> const sequenceBytes = detail::bigEndian(sequence);
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
                if (replay)
                {
                    replay->keep(sequence, payload);
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
    if (mImpl->replay)
    {
        stats.replays = mImpl->replay->replays();
        stats.badReplayRequests = mImpl->replay->badRequests();
    }
    return stats;
}

} // namespace kvcache::rt
