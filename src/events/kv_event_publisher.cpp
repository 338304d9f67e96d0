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

#include "events/kv_event_packed.h"
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
    //! Where the sending thread waits: not at all, for kBUSY_LOOK after a batch (unwoken unless the queue is half
    //! full), or idle, for kIDLE_LOOK (woken by the next batch).
    enum Wait : int32_t
    {
        kNOT_WAITING = 0,
        kBUSY = 1,
        kIDLE = 2,
    };

    KVEventPublisherOptions options;
    zmq::context_t context{1};
    zmq::socket_t pub{context, zmq::socket_type::xpub};
    //! Only with a replay endpoint. Declared after the context, so that its socket closes first.
    std::unique_ptr<detail::KVEventReplay> replay;
    std::string pubEndpoint;
    std::string replayEndpoint;

    //! The queue: the owner's thread writes each batch into it, the sending thread reads them in order.
    std::unique_ptr<detail::KVEventRing> queue;

    //! Counters: `batches`, `events` and `droppedFull` written by the owner only (beside its next sequence number),
    //! `droppedSends` by the sending thread only, so neither takes the other's cache line.
    alignas(64) std::atomic<int64_t> batches{0};
    std::atomic<int64_t> events{0};
    std::atomic<int64_t> droppedFull{0};
    int64_t nextSequence = 0;
    alignas(64) std::atomic<int64_t> droppedSends{0};
    std::atomic<int32_t> subscriptions{0};

    //! The sending thread sleeps on `wake` under `wakeMutex`; flush() waits on `done`.
    alignas(64) std::mutex wakeMutex;
    std::condition_variable wake;
    std::condition_variable done;
    std::atomic<int32_t> waiting{kNOT_WAITING};
    std::atomic<bool> flushing{false};
    std::atomic<bool> running{true};
    std::thread sender;

    explicit Impl(KVEventPublisherOptions const& opts)
        : options(opts)
    {
        checkRange("replayBatches", options.replayBatches, 1, int64_t{1} << 20);
        checkRange("queueBytes", options.queueBytes, int64_t{1} << 16, int64_t{1} << 34);
        if (options.queueBytes % 64 != 0)
        {
            throw InvalidArgumentError(fmt::format(
                "KVEventPublisher: options.queueBytes is {}; it must be a multiple of 64", options.queueBytes));
        }
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
        queue = std::make_unique<detail::KVEventRing>(static_cast<size_t>(options.queueBytes));
        sender = std::thread([this] { sendQueued(); });
    }

    //! Lets the sending thread finish what is queued and joins it (the replay thread stops with `replay`).
    void stop() noexcept
    {
        {
            std::lock_guard<std::mutex> lock(wakeMutex);
            running = false;
        }
        wake.notify_all();
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

    //! Adds to a counter only this thread writes, without a locked instruction.
    static void addOwn(std::atomic<int64_t>& counter, int64_t value) noexcept
    {
        counter.store(counter.load(std::memory_order_relaxed) + value, std::memory_order_relaxed);
    }

    //! Queues a copy of `batch` stamped with `timestamp` and returns its sequence number; when the queue has no room
    //! for it, the batch is dropped (its number taken and counted). Never throws.
    int64_t publish(KVEventBatch const& batch, double timestamp) noexcept
    {
        if (batch.empty())
        {
            return -1;
        }
        int64_t const sequence = nextSequence++;
        addOwn(batches, 1);
        addOwn(events, static_cast<int64_t>(batch.events().size()));
        if (!queue->push(batch, sequence, timestamp))
        {
            addOwn(droppedFull, 1);
            return sequence;
        }
        // push() published the record with a sequentially consistent store, so this look cannot pass it and miss a
        // sending thread just going idle.
        int32_t const wait = waiting.load(std::memory_order_seq_cst);
        if (wait == kIDLE || (wait == kBUSY && queue->halfFull()))
        {
            {
                std::lock_guard<std::mutex> lock(wakeMutex);
            }
            wake.notify_all();
        }
        return sequence;
    }

    int64_t publishSwap(KVEventBatch& batch, double timestamp) noexcept
    {
        int64_t const sequence = publish(batch, timestamp);
        batch.clear();
        return sequence;
    }

    bool flush(int32_t timeoutMs)
    {
        uint64_t const queued = queue->written();
        std::unique_lock<std::mutex> lock(wakeMutex);
        flushing.store(true, std::memory_order_seq_cst);
        // The sending thread may be waiting out kBUSY_LOOK: no need to.
        wake.notify_all();
        bool const finished =
            done.wait_for(lock, std::chrono::milliseconds(timeoutMs), [&] { return queue->finished() == queued; });
        flushing.store(false, std::memory_order_relaxed);
        return finished;
    }

    //! Waits for a batch for up to `look` (sending thread); returns early when one is queued, when flush() asks or
    //! when the publisher stops.
    void waitForBatch(Wait kind, std::chrono::milliseconds look)
    {
        std::unique_lock<std::mutex> lock(wakeMutex);
        waiting.store(kind, std::memory_order_seq_cst);
        wake.wait_for(
            lock, look, [&] { return queue->waiting() || !running || flushing.load(std::memory_order_relaxed); });
        waiting.store(kNOT_WAITING, std::memory_order_relaxed);
    }

    //! Encodes `record` and sends it on the PUB socket, and keeps it for replay (sending thread).
    void send(detail::KVEventRecord const& record, std::vector<uint8_t>& payload)
    {
        try
        {
            drainSubscriptions();
            payload.clear();
            detail::encodeKVEventArrays(
                record.arrays, record.timestamp, options.encoding, options.dataParallelRank, payload);
            std::array<uint8_t, 8> const sequenceBytes = detail::bigEndian(record.sequence);
            // The parts of one message go out together or not at all: only the first send can be refused.
            bool const sent =
                pub.send(zmq::buffer(options.topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait)
                    .has_value();
            if (sent)
            {
                pub.send(zmq::buffer(sequenceBytes), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
                pub.send(zmq::buffer(payload), zmq::send_flags::dontwait);
            }
            else
            {
                ++droppedSends;
            }
            if (replay)
            {
                replay->keep(record.sequence, payload);
            }
        }
        catch (std::exception const&)
        {
            // Memory or ZeroMQ failed for this batch: it is lost like a refused one, and the thread goes on.
            ++droppedSends;
        }
    }

    //! The sending thread: encodes and sends each queued batch in order, keeps it for replay, and counts the
    //! subscriptions; it finishes what is queued before it stops.
    void sendQueued()
    {
        std::vector<uint8_t> payload;
        // Whether the last look at the queue found a batch: then the thread waits only kBUSY_LOOK, unwoken.
        bool busy = false;
        detail::KVEventRecord record;
        while (true)
        {
            if (!queue->front(record))
            {
                if (!running)
                {
                    return;
                }
                drainSubscriptions();
                waitForBatch(busy ? kBUSY : kIDLE, busy ? kBUSY_LOOK : kIDLE_LOOK);
                busy = false;
                continue;
            }
            busy = true;
            send(record, payload);
            queue->pop();
            if (flushing.load(std::memory_order_seq_cst))
            {
                {
                    std::lock_guard<std::mutex> lock(wakeMutex);
                }
                done.notify_all();
            }
        }
    }
};

KVEventPublisher::KVEventPublisher(KVEventPublisherOptions const& options)
    : mImpl(std::make_unique<Impl>(options))
{
}

KVEventPublisher::~KVEventPublisher() = default;

int64_t KVEventPublisher::publish(KVEventBatch const& batch) noexcept
{
    auto const now = std::chrono::system_clock::now().time_since_epoch();
    return publish(batch, std::chrono::duration<double>(now).count());
}

int64_t KVEventPublisher::publish(KVEventBatch const& batch, double timestamp) noexcept
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
    stats.droppedBatches = mImpl->droppedFull + mImpl->droppedSends;
    if (mImpl->replay)
    {
        stats.replays = mImpl->replay->replays();
        stats.badReplayRequests = mImpl->replay->badRequests();
    }
    return stats;
}

} // namespace kvcache::rt
