// The replay side of KVEventPublisher, and the frame and socket rules both sides share.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

namespace kvcache::rt::detail
{

//! Returns `value` as 8 bytes, big-endian: how a message's sequence number goes on the wire.
std::array<uint8_t, 8> bigEndian(int64_t value);

//! Binds or connects `socket` to `endpoint` and returns the endpoint as ZeroMQ reports it (a bound "*" port
//! resolved); throws InvalidArgumentError naming `field` of KVEventPublisherOptions.
std::string openEndpoint(zmq::socket_t& socket, char const* field, std::string const& endpoint, bool bind);

//! The replay buffer, a ring of the last `batches` payloads sent, and the ROUTER socket that serves it from a thread
//! of its own: each request (identity, empty frame, 8-byte big-endian start) is answered with every kept batch from
//! `start` on, oldest first, then an end marker (sequence -1, no payload).
class KVEventReplay
{
public:
    //! Binds a ROUTER socket of `context` to `endpoint` (options.replayEndpoint) and starts serving it. Throws
    //! InvalidArgumentError when the endpoint cannot be bound; nothing is left running then.
    KVEventReplay(zmq::context_t& context, std::string const& endpoint, int64_t batches);
    //! Stops the thread, which ends a replay it is sending within kSEND_WAIT_MS; never throws.
    ~KVEventReplay();
    KVEventReplay(KVEventReplay const&) = delete;
    KVEventReplay& operator=(KVEventReplay const&) = delete;

    //! Keeps `payload`, sent as `sequence`, in place of the oldest kept batch. Throws std::bad_alloc.
    void keep(int64_t sequence, std::vector<uint8_t> const& payload);

    std::string const& endpoint() const noexcept
    {
        return mEndpoint;
    }
    //! Requests answered, and requests refused because they were not three frames with an 8-byte start.
    int64_t replays() const noexcept
    {
        return mReplays;
    }
    int64_t badRequests() const noexcept
    {
        return mBadRequests;
    }

private:
    struct Kept
    {
        int64_t sequence = -1;
        std::vector<uint8_t> payload;
    };

    //! How long one reply waits for room in the client's queue before the replay ends; it also bounds how long a
    //! stuck client can delay the publisher's destruction.
    static constexpr int kSEND_WAIT_MS = 500;

    void serve();
    bool sendReply(zmq::message_t const& identity, int64_t sequence, uint8_t const* data, size_t size);

    zmq::socket_t mSocket;
    std::string mEndpoint;
    //! Under mMutex.
    std::mutex mMutex;
    std::vector<Kept> mKept;
    size_t mNextKept = 0;
    std::atomic<int64_t> mReplays{0};
    std::atomic<int64_t> mBadRequests{0};
    std::atomic<bool> mRunning{true};
    std::thread mThread;
};

} // namespace kvcache::rt::detail
