#pragma once

// The optional component kvcache::events (find_package(kvcache COMPONENTS events)): KV events in vLLM's wire format
// over ZeroMQ, for cache-aware routers (llm-d's KV cache manager, NVIDIA Dynamo's KV router, ...). The core library
// records the events (kvcache/paging/kv_events.h); this component encodes and publishes them.

#include "kvcache/paging/kv_events.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvcache::rt
{

//! How events are encoded in msgpack, both as vLLM's kv_events.py defines them (msgspec structs).
enum class KVEventEncoding : int32_t
{
    //! vLLM's current form: the batch a map {ts, events, data_parallel_rank (omitted when absent)}, each event a map
    //! whose first key, "type", names it: BlockStored {block_hashes, parent_block_hash, token_ids, block_size,
    //! lora_id, medium, lora_name, extra_keys (omitted when no page has any), group_idx}, BlockRemoved {block_hashes,
    //! medium, group_idx}, AllBlocksCleared {}.
    kTAGGED_MAP = 0,
    //! The older positional form that llm-d's decoder reads: the batch an array [ts, events, data_parallel_rank or
    //! nil], each event an array led by its name: ["BlockStored", block_hashes, parent_block_hash, token_ids,
    //! block_size, lora_id, medium, lora_name, extra_keys, group_idx], ["BlockRemoved", block_hashes, medium,
    //! group_idx], ["AllBlocksCleared"].
    kTAGGED_ARRAY = 1,
};

//! Returns "tagged-map" or "tagged-array", or "unknown" for a value outside the enumeration; never throws.
char const* toString(KVEventEncoding encoding) noexcept;

//! Appends to `out` the msgpack encoding of `batch` at `timestamp` (seconds since the epoch, float64), as vLLM's
//! KVEventBatch. Block hashes are the 16 bytes of the page hash's digest (msgpack bin: lo then hi, little-endian;
//! vLLM's ExternalBlockHash is bytes or int, and routers such as llm-d key on bytes as they come or hash token_ids
//! themselves). lora_id and lora_name are nil, medium "GPU", "CPU" or "DISK", group_idx the page group. extra_keys
//! holds per page nil or an array: the sequence's salt as bin (its first page only), then each extra key as the 20
//! bytes the page hash mixes in (bin: the offset in the page as int32, key.lo, key.hi, little-endian). Integers take
//! msgpack's shortest form, as msgspec writes them. Throws std::bad_alloc.
void encodeKVEventBatch(KVEventBatch const& batch, double timestamp, KVEventEncoding encoding,
    std::optional<int32_t> dataParallelRank, std::vector<uint8_t>& out);

//! Where and how a KVEventPublisher publishes.
struct KVEventPublisherOptions
{
    //! The PUB endpoint. As vLLM: bound when it holds "*" or "::" or is ipc:// or inproc:// ("tcp://127.0.0.1:*"
    //! binds a free port: see KVEventPublisher::endpoint()), connected otherwise.
    std::string endpoint = "tcp://*:5557";
    //! The ROUTER endpoint of replays (always bound); empty for none.
    std::string replayEndpoint = {};
    //! The first frame of every message (vLLM's topic, e.g. "kv@<pod>@<model>"); may be empty.
    std::string topic = {};
    KVEventEncoding encoding = KVEventEncoding::kTAGGED_MAP;
    //! The batch's data_parallel_rank; absent: nil (omitted in the map form).
    std::optional<int32_t> dataParallelRank = {};
    //! Batches kept for replay, the most recent; [1, 1 << 20].
    int32_t replayBatches = 10000;
    //! Bytes of the queue between publish() and the sending thread, allocated and written once at construction; a
    //! multiple of 64 in [1 << 16, 1 << 34]. A queued batch takes 64 bytes and its arrays, each rounded up to 64 bytes
    //! (about 80 bytes a stored page of 16 tokens). A batch published while the queue has no room for it is dropped
    //! (counted), its sequence number a gap no replay fills.
    int64_t queueBytes = int64_t{16} << 20;
    //! Messages queued per subscriber before a batch is dropped (ZeroMQ's send high-water mark); [1, 1 << 24].
    int32_t sendHighWaterMark = 100000;
    //! How long the destructor lets batches already sent reach their subscribers (ZeroMQ's linger), in milliseconds;
    //! [0, 60000]. 0 drops what has not left at close, so a publisher that ends its process at once should set some.
    int32_t lingerMs = 0;
};

//! A KVEventPublisher's counters since construction.
struct KVEventPublisherStats
{
    //! Batches given a sequence number (sent or dropped), and their events.
    int64_t batches = 0;
    int64_t events = 0;
    //! Batches not sent: refused because a subscriber's queue was full (they stay in the replay buffer), or published
    //! while the publisher's own queue was full (lost).
    int64_t droppedBatches = 0;
    //! Replay requests served, and requests refused as malformed.
    int64_t replays = 0;
    int64_t badReplayRequests = 0;
};

//! Publishes KV event batches as vLLM does: a ZeroMQ PUB socket, each message three frames: the topic, the batch's
//! sequence number (8 bytes, big-endian; 0, 1, 2, ... a batch), the msgpack payload (encodeKVEventBatch). A subscriber
//! that sees a gap asks the ROUTER replay socket (replayEndpoint) for the batches from a sequence number on: it sends
//! an empty frame and the 8-byte big-endian start, and receives [empty, sequence, payload] for each batch still kept
//! from there, then [empty, -1 as 8 bytes, empty].
//!
//! publish() never blocks, takes no lock and allocates nothing: it copies the batch with its sequence number into the
//! queue (a ring of bytes allocated once, options.queueBytes), and a thread of the publisher's own encodes and sends
//! it. publish() wakes that thread only when it is idle or the queue is half full; while batches keep coming, the
//! thread looks at the queue every millisecond, so a batch waits at most about a millisecond. That thread sends without
//! waiting and the PUB side refuses (ZMQ_XPUB_NODROP) a batch that some subscriber's queue has no room for; the batch
//! is then counted as dropped, for everyone, and stays available for replay. Replay requests are served by another
//! thread of the publisher's. One owner calls publish() and flush(); the other calls may come from any thread. Neither
//! copyable nor movable.
class KVEventPublisher
{
public:
    //! Opens the sockets. Throws InvalidArgumentError naming the option, its value and the limit (or ZeroMQ's reason)
    //! for an option out of range, an empty or malformed endpoint, or one that cannot be bound or connected; nothing
    //! is left open then.
    explicit KVEventPublisher(KVEventPublisherOptions const& options = {});
    //! Sends what is queued (without waiting for any subscriber), stops the threads and closes the sockets, waiting
    //! up to options.lingerMs for sent batches to leave; never throws.
    ~KVEventPublisher();
    KVEventPublisher(KVEventPublisher const&) = delete;
    KVEventPublisher& operator=(KVEventPublisher const&) = delete;

    //! Queues a copy of `batch` (nothing when it is empty) for sending, stamped with the current time; returns its
    //! sequence number, or -1 when empty. Never throws.
    int64_t publish(KVEventBatch const& batch) noexcept;
    //! publish() at `timestamp` (seconds since the epoch).
    int64_t publish(KVEventBatch const& batch, double timestamp) noexcept;
    //! publish(), then clears `batch`, which keeps its buffers (queued or dropped, `batch` comes back cleared). A
    //! runtime that takes each step's events into the same batch (PageManager::takeEvents) and publishes it this way
    //! records each step into memory its own core holds and, once the buffers have grown, allocates nothing. Never
    //! throws.
    int64_t publishSwap(KVEventBatch& batch) noexcept;
    //! publishSwap() at `timestamp` (seconds since the epoch).
    int64_t publishSwap(KVEventBatch& batch, double timestamp) noexcept;
    //! Waits until every batch published so far is sent or dropped; returns false after `timeoutMs` milliseconds.
    bool flush(int32_t timeoutMs);

    //! Returns the number of subscriptions the PUB socket has seen (subscribe less unsubscribe messages), as the
    //! sending thread last counted them (it looks at least every 10 ms).
    int32_t numSubscribers() const noexcept;
    //! Returns once a subscriber has subscribed (true) or after `timeoutMs` milliseconds (false).
    bool waitForSubscriber(int32_t timeoutMs);

    //! Returns the PUB endpoint as bound or connected (a bound "*" port resolved), and the replay endpoint (empty
    //! without one).
    std::string const& endpoint() const noexcept;
    std::string const& replayEndpoint() const noexcept;
    KVEventPublisherStats stats() const noexcept;

private:
    struct Impl;
    std::unique_ptr<Impl> mImpl;
};

} // namespace kvcache::rt
