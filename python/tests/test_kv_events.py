"""KV events and prefix counters of a PageManager through Python (take_events, counters, prometheus_text): events
checked against hashes recomputed here with hashlib from the documented page hash, and counters of a run whose hits are
known. No GPU."""

import hashlib
import struct
import typing

import pytest

import kvcache

P = 4  # tokens per page
SEED = bytes(range(32))


def make_manager(**options):
    config = kvcache.Config(layer_configs=[(1, 8)], max_batch_size=4, max_sequence_length=64, tokens_per_page=P,
                            max_tokens_per_step=64)
    return kvcache.PageManager(config, hash_seed=SEED, **options)


def sha(data):
    return hashlib.sha256(data).digest()[:16]


def root(salt):
    return sha(struct.pack("<QQI", 0, 0, 0) + SEED + struct.pack("<Q", len(salt)) + salt)


def page_hash(parent, tokens, extra=b""):
    return sha(parent + struct.pack("<IIQ", 1, len(tokens), len(extra)) + struct.pack(f"<{len(tokens)}i", *tokens)
               + extra)


def test_no_events_unless_asked():
    manager = make_manager()
    sequence = manager.create()
    manager.append(sequence, list(range(9)))
    assert manager.take_events() == []


def test_stored_and_removed_events():
    manager = make_manager(record_events=True)
    assert manager.take_events() == [{"type": "AllBlocksCleared"}]
    sequence = manager.create(salt=b"ab")
    tokens = list(range(100, 109))
    # A key at position 5: page 1, offset 1.
    manager.append(sequence, tokens, extra_keys=[(5, 0x1111, 0x2222)])
    key = struct.pack("<iQQ", 1, 0x1111, 0x2222)
    page0 = page_hash(root(b"ab"), tokens[:4])
    page1 = page_hash(page0, tokens[4:8], key)
    assert manager.take_events() == [{
        "type": "BlockStored", "medium": "GPU", "group_idx": 0, "block_hashes": [page0, page1],
        "parent_block_hash": None, "token_ids": tokens[:8], "block_size": P, "extra_keys": [[b"ab"], [key]]}]
    # The event's hashes are the manager's own (hash_next_pages gives them as (lo, hi)).
    other = manager.create(salt=b"ab")
    (lo, hi), _ = manager.hash_next_pages(other, tokens[:8], extra_keys=[(5, 0x1111, 0x2222)])
    assert lo.to_bytes(8, "little") + hi.to_bytes(8, "little") == page0
    manager.free(other)

    manager.free(sequence)
    assert manager.evict_cached(0, 2) == 2
    # free() lets go of the last page first, so page 1 is the oldest cached page.
    assert manager.take_events() == [{"type": "BlockRemoved", "medium": "GPU", "group_idx": 0,
                                      "block_hashes": [page1, page0]}]


def test_counters_of_a_run_whose_hits_are_known():
    manager = make_manager()
    prompt = list(range(1, 14))  # 13 tokens: 3 whole pages before the last token
    for salt in (b"a", b"a", b"b", None):
        sequence = manager.create(salt=salt)
        hit = manager.adopt_prefix(sequence, prompt)
        manager.append(sequence, prompt[hit:])
        manager.free(sequence)
    counters = manager.counters()
    assert counters["prefix_query_tokens"] == 52
    assert counters["prefix_hit_tokens"] == {"device": 12}
    assert counters["evicted_pages"] == {"device": 0}
    assert counters["tenants"] == [
        {"salt": b"a", "other": False, "query_tokens": 26, "device_hit_tokens": 12, "host_hit_tokens": 0,
         "disk_hit_tokens": 0},
        {"salt": b"b", "other": False, "query_tokens": 13, "device_hit_tokens": 0, "host_hit_tokens": 0,
         "disk_hit_tokens": 0},
        {"salt": b"", "other": False, "query_tokens": 13, "device_hit_tokens": 0, "host_hit_tokens": 0,
         "disk_hit_tokens": 0},
    ]
    text = manager.prometheus_text("serving")
    assert 'serving_prefix_hit_tokens_total{tier="device"} 12\n' in text
    assert 'serving_tenant_prefix_query_tokens_total{tenant="61"} 26\n' in text
    assert "# TYPE serving_prefix_query_tokens_total counter\n" in text


def publisher_or_skip():
    """KVEventPublisher and a pyzmq + msgspec subscriber, or a skip naming what is missing."""
    if not kvcache.KVEventPublisher.available():
        with pytest.raises(RuntimeError, match="built without kvcache::events"):
            kvcache.KVEventPublisher()
        pytest.skip("kvcache was built without kvcache::events (Debian: cppzmq-dev, libmsgpack-cxx-dev)")
    zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (the subscriber side of the test)")
    msgspec = pytest.importorskip("msgspec", reason="msgspec is not installed (the subscriber side of the test)")
    return zmq, msgspec


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_publisher_sends_what_the_manager_recorded(encoding):
    zmq, msgspec = publisher_or_skip()

    # vLLM's event structs (vllm/distributed/kv_events.py), written here from its documented schema.
    array_like = encoding == "array"

    class BlockStored(msgspec.Struct, tag=True, array_like=array_like, omit_defaults=True):
        block_hashes: list
        parent_block_hash: typing.Optional[bytes]
        token_ids: list
        block_size: int
        lora_id: typing.Optional[int]
        medium: typing.Optional[str]
        lora_name: typing.Optional[str]
        extra_keys: typing.Optional[list] = None
        group_idx: typing.Optional[int] = None

    class BlockRemoved(msgspec.Struct, tag=True, array_like=array_like, omit_defaults=True):
        block_hashes: list
        medium: typing.Optional[str]
        group_idx: typing.Optional[int] = None

    class AllBlocksCleared(msgspec.Struct, tag=True, array_like=array_like, omit_defaults=True):
        pass

    class KVEventBatch(msgspec.Struct, array_like=array_like, omit_defaults=True):
        ts: float
        events: list[typing.Union[BlockStored, BlockRemoved, AllBlocksCleared]]
        data_parallel_rank: typing.Optional[int] = None

    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    publisher = kvcache.KVEventPublisher("tcp://127.0.0.1:*", topic="kv@pod@model", encoding=encoding,
                                         data_parallel_rank=3)
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect(publisher.endpoint)
    try:
        assert publisher.wait_for_subscriber(10000)
        manager = make_manager(record_events=True)
        prompts = [list(range(7 * n, 7 * n + 13)) for n in range(3)]
        sequences = []
        assert publisher.publish(manager) == 0  # AllBlocksCleared, made with the manager
        for prompt in prompts:
            sequence = manager.create()
            manager.append(sequence, prompt)
            sequences.append(sequence)
            assert publisher.publish(manager) >= 1
        assert publisher.publish(manager) == -1  # nothing new: no batch
        manager.free(sequences[0])
        assert manager.evict_cached(0, 1) == 1
        last = publisher.publish(manager)
        assert publisher.flush(10000)
        assert publisher.stats()["dropped_batches"] == 0

        held, received = set(), []
        while not received or received[-1] < last:
            assert sub.poll(10000), "no batch within 10 s"
            topic, sequence_bytes, payload = sub.recv_multipart()
            assert topic == b"kv@pod@model"
            received.append(struct.unpack(">q", sequence_bytes)[0])
            batch = decoder.decode(payload)
            assert batch.data_parallel_rank == 3
            for event in batch.events:
                if isinstance(event, BlockStored):
                    held.update(event.block_hashes)
                elif isinstance(event, BlockRemoved):
                    held.difference_update(event.block_hashes)
                else:
                    held.clear()
        assert received == list(range(last + 1))
        # Every whole page of every prompt, hashed here from the documented chain, less the one evicted page.
        expected = set()
        for prompt in prompts:
            parent = root(b"")
            for start in range(0, len(prompt) - P + 1, P):
                parent = page_hash(parent, prompt[start:start + P])
                expected.add(parent)
        assert len(expected) == 9
        assert len(held) == 8 and held < expected
    finally:
        sub.close(linger=0)
        context.term()


def test_publisher_refuses_bad_options():
    publisher_or_skip()
    with pytest.raises(kvcache.InvalidArgumentError, match='encoding is "json"'):
        kvcache.KVEventPublisher("tcp://127.0.0.1:*", encoding="json")
    with pytest.raises(kvcache.InvalidArgumentError, match="options.lingerMs"):
        kvcache.KVEventPublisher("tcp://127.0.0.1:*", linger_ms=-1)
    with pytest.raises(TypeError, match="source"):
        kvcache.KVEventPublisher("tcp://127.0.0.1:*").publish(object())


def test_a_retention_duration_is_refused_out_of_range():
    manager = make_manager()
    sequence = manager.create()
    manager.append(sequence, list(range(8)))
    manager.set_retention(sequence, 0, 8, 90, duration_ms=60000)
    assert manager.retention_priority(0, manager.pages(sequence, 0)[0][0]) == 90
    with pytest.raises(kvcache.InvalidArgumentError, match="durationMs is -3"):
        manager.set_retention(sequence, 0, 8, 90, duration_ms=-3)
