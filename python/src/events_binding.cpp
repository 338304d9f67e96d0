// KVEventPublisher in Python: kvcache::events' publisher, fed straight from a PageManager's or a TieredPrefixCache's
// recorded events, so that a Python runtime publishes vLLM's wire format without building one object per event. The
// class exists in every build, so the module's names do not depend on it; without kvcache::events
// (KVCACHE_PYTHON_EVENTS unset) it cannot be made.
#include "bindings.h"
#include "page_manager_handle.h"

#include <kvcache/core/errors.h>
#include <kvcache/events/kv_event_publisher.h>

#include <fmt/format.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace kvcache::python
{

namespace
{

#if KVCACHE_PYTHON_EVENTS
using Publisher = rt::KVEventPublisher;
constexpr bool kAVAILABLE = true;
#else
//! Stands in for kvcache::events' publisher in a build without it: it cannot be made, so no other call runs.
struct Publisher
{
    explicit Publisher(rt::KVEventPublisherOptions const&)
    {
        throw std::runtime_error(
            "KVEventPublisher: this kvcache was built without kvcache::events (KVCACHE_BUILD_EVENTS; "
            "Debian: cppzmq-dev, libmsgpack-cxx-dev)");
    }
    int64_t publishSwap(rt::KVEventBatch&)
    {
        return -1;
    }
    bool flush(int32_t)
    {
        return false;
    }
    bool waitForSubscriber(int32_t)
    {
        return false;
    }
    int32_t numSubscribers() const
    {
        return 0;
    }
    std::string const& endpoint() const
    {
        return mNone;
    }
    std::string const& replayEndpoint() const
    {
        return mNone;
    }
    rt::KVEventPublisherStats stats() const
    {
        return {};
    }
    std::string mNone;
};
constexpr bool kAVAILABLE = false;
#endif

//! A publisher and the batch the sources' events are taken into (reused).
struct PublisherHandle
{
    explicit PublisherHandle(rt::KVEventPublisherOptions const& options)
        : publisher(options)
    {
    }
    Publisher publisher;
    rt::KVEventBatch batch;
};

rt::KVEventEncoding encodingArgument(std::string const& encoding)
{
    if (encoding == "map")
    {
        return rt::KVEventEncoding::kTAGGED_MAP;
    }
    if (encoding == "array")
    {
        return rt::KVEventEncoding::kTAGGED_ARRAY;
    }
    throw rt::InvalidArgumentError(
        fmt::format("KVEventPublisher: encoding is \"{}\"; it must be \"map\" or \"array\"", encoding));
}

} // namespace

void bindEvents(nb::module_& m)
{
    // The keyword arguments' defaults are the C++ options' own.
    rt::KVEventPublisherOptions const defaults;
    nb::class_<PublisherHandle>(m, "KVEventPublisher",
        "Publishes KV events in vLLM's wire format over ZeroMQ (kvcache::events): three frames a message (topic, "
        "8-byte big-endian sequence number, msgpack batch), an optional ROUTER replay socket, never blocking the "
        "caller (docs/kv_events.md). Needs a build with kvcache::events: see available().")
        .def(
            "__init__",
            [](PublisherHandle* self, std::string const& endpoint, std::string const& replayEndpoint,
                std::string const& topic, std::string const& encoding, std::optional<int32_t> dataParallelRank,
                int32_t replayBatches, int64_t queueBytes, int32_t sendHighWaterMark, int32_t lingerMs)
            {
                rt::KVEventPublisherOptions options;
                options.endpoint = endpoint;
                options.replayEndpoint = replayEndpoint;
                options.topic = topic;
                options.encoding = encodingArgument(encoding);
                options.dataParallelRank = dataParallelRank;
                options.replayBatches = replayBatches;
                options.queueBytes = queueBytes;
                options.sendHighWaterMark = sendHighWaterMark;
                options.lingerMs = lingerMs;
                new (self) PublisherHandle(options);
            },
            nb::arg("endpoint") = defaults.endpoint, nb::kw_only(),
            nb::arg("replay_endpoint") = defaults.replayEndpoint, nb::arg("topic") = defaults.topic,
            nb::arg("encoding") = "map", nb::arg("data_parallel_rank") = nb::none(),
            nb::arg("replay_batches") = defaults.replayBatches, nb::arg("queue_bytes") = defaults.queueBytes,
            nb::arg("send_high_water_mark") = defaults.sendHighWaterMark, nb::arg("linger_ms") = defaults.lingerMs,
            "Opens the sockets. endpoint is bound when it holds '*' or '::' or is ipc:// or inproc:// "
            "('tcp://127.0.0.1:*' binds a free port: see endpoint), connected otherwise; replay_endpoint (bound) is "
            "empty for no replays; encoding 'map' (vLLM's current form) or 'array' (the older positional form); "
            "queue_bytes: the queue between publish and the sending thread (a batch that finds no room is dropped); "
            "linger_ms: how long closing lets sent batches reach subscribers.")
        .def_static(
            "available", []() { return kAVAILABLE; },
            "Whether this build has kvcache::events; without it, making a KVEventPublisher raises RuntimeError.")
        .def(
            "publish",
            [](PublisherHandle& h, nb::handle source)
            {
                if (!takeTieredEvents(source, h.batch))
                {
                    pageManagerArgument(source, "source").manager.takeEvents(h.batch);
                }
                // h.batch comes back cleared, its buffers kept for the next take.
                return h.publisher.publishSwap(h.batch);
            },
            nb::arg("source"),
            "Takes the events `source` (a PageManager or a TieredPrefixCache, made with record_events=True) recorded "
            "since its last take and queues them as one batch; returns its sequence number, or -1 when there were "
            "none. Call it once per step, after the step.")
        .def(
            "flush", [](PublisherHandle& h, int32_t timeoutMs) { return h.publisher.flush(timeoutMs); },
            nb::arg("timeout_ms"), nb::call_guard<nb::gil_scoped_release>(),
            "Waits until every batch published so far is sent or dropped; False after timeout_ms.")
        .def(
            "wait_for_subscriber",
            [](PublisherHandle& h, int32_t timeoutMs) { return h.publisher.waitForSubscriber(timeoutMs); },
            nb::arg("timeout_ms"), nb::call_guard<nb::gil_scoped_release>(),
            "Returns True once a subscriber has subscribed, False after timeout_ms.")
        .def(
            "num_subscribers", [](PublisherHandle const& h) { return h.publisher.numSubscribers(); },
            "The subscriptions the PUB socket has seen (subscribes less unsubscribes).")
        .def_prop_ro(
            "endpoint", [](PublisherHandle const& h) { return h.publisher.endpoint(); },
            "The PUB endpoint as bound or connected (a bound '*' port resolved).")
        .def_prop_ro(
            "replay_endpoint", [](PublisherHandle const& h) { return h.publisher.replayEndpoint(); },
            "The replay endpoint as bound; empty without one.")
        .def(
            "stats",
            [](PublisherHandle const& h)
            {
                rt::KVEventPublisherStats const stats = h.publisher.stats();
                nb::dict out;
                out["batches"] = stats.batches;
                out["events"] = stats.events;
                out["dropped_batches"] = stats.droppedBatches;
                out["replays"] = stats.replays;
                out["bad_replay_requests"] = stats.badReplayRequests;
                return out;
            },
            "Counters since construction as a dict: batches, events, dropped_batches, replays, "
            "bad_replay_requests.");
}

} // namespace kvcache::python
