// KVEventReplay: the replay buffer and the ROUTER socket a thread of its own serves; the frame and socket rules the
// publisher shares.
#include "events/kv_event_replay.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <chrono>

namespace kvcache::rt::detail
{
namespace
{

int64_t fromBigEndian(uint8_t const* bytes)
{
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i)
    {
        bits = (bits << 8) | bytes[i];
    }
    return static_cast<int64_t>(bits);
}

} // namespace

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

std::string openEndpoint(zmq::socket_t& socket, char const* field, std::string const& endpoint, bool bind)
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

KVEventReplay::KVEventReplay(zmq::context_t& context, std::string const& endpoint, int64_t batches)
    : mSocket(context, zmq::socket_type::router)
{
    mSocket.set(zmq::sockopt::linger, 0);
    // A ROUTER drops what a full peer queue cannot take; a replay must arrive whole or end early, so a reply waits for
    // room (kSEND_WAIT_MS at most) and a peer that is gone fails the send.
    mSocket.set(zmq::sockopt::router_mandatory, 1);
    mSocket.set(zmq::sockopt::sndtimeo, kSEND_WAIT_MS);
    mEndpoint = openEndpoint(mSocket, "replayEndpoint", endpoint, true);
    mKept.resize(static_cast<size_t>(batches));
    mThread = std::thread([this] { serve(); });
}

KVEventReplay::~KVEventReplay()
{
    mRunning = false;
    if (mThread.joinable())
    {
        mThread.join();
    }
}

void KVEventReplay::keep(int64_t sequence, std::vector<uint8_t> const& payload)
{
    std::lock_guard<std::mutex> lock(mMutex);
    Kept& slot = mKept[mNextKept];
    slot.sequence = sequence;
    slot.payload.assign(payload.begin(), payload.end());
    mNextKept = (mNextKept + 1) % mKept.size();
}

void KVEventReplay::serve()
{
    std::vector<zmq::message_t> request;
    std::vector<Kept> answer;
    while (mRunning)
    {
        zmq::pollitem_t item{mSocket.handle(), 0, ZMQ_POLLIN, 0};
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
                if (!mSocket.recv(request.back(), zmq::recv_flags::dontwait))
                {
                    request.pop_back();
                    break;
                }
            } while (request.back().more());
            if (request.size() != 3 || request[1].size() != 0 || request[2].size() != 8)
            {
                ++mBadRequests;
                continue;
            }
            int64_t const start = fromBigEndian(static_cast<uint8_t const*>(request[2].data()));
            answer.clear();
            {
                std::lock_guard<std::mutex> lock(mMutex);
                ++mReplays;
                for (size_t i = 0; i < mKept.size(); ++i)
                {
                    Kept const& slot = mKept[(mNextKept + i) % mKept.size()];
                    if (slot.sequence >= 0 && slot.sequence >= start)
                    {
                        answer.push_back(slot);
                    }
                }
            }
            bool whole = true;
            for (size_t i = 0; i < answer.size() && whole; ++i)
            {
                whole = mRunning
                    && sendReply(request[0], answer[i].sequence, answer[i].payload.data(), answer[i].payload.size());
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

//! False when the peer's queue stayed full for kSEND_WAIT_MS (the replay then ends without its end marker, and the
//! client asks again). A peer that is gone throws.
bool KVEventReplay::sendReply(zmq::message_t const& identity, int64_t sequence, uint8_t const* data, size_t size)
{
    std::array<uint8_t, 8> const sequenceBytes = bigEndian(sequence);
    // The first frame waits for room; a message's later frames always follow it.
    if (!mSocket.send(zmq::buffer(identity.data(), identity.size()), zmq::send_flags::sndmore))
    {
        return false;
    }
    mSocket.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
    mSocket.send(zmq::buffer(sequenceBytes), zmq::send_flags::sndmore);
    mSocket.send(zmq::const_buffer(data, size), zmq::send_flags::none);
    return true;
}

} // namespace kvcache::rt::detail
