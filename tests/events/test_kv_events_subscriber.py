"""A router's view of kvcache's KV events: subscribes to a serving run (kv_events_serving_run) with pyzmq, decodes
every batch with msgspec structs written here from vLLM's documented schema (vllm/distributed/kv_events.py: the tagged
map form and the older positional form), and checks that

- the stored and removed events, applied in order, give exactly the pages each group has registered at the end of the
  run, also when batches are missed and the rest is asked for again through the replay socket;
- each stored page's hash is what a router recomputes from the event alone: kvcache's SHA-256 chain over the parent
  hash, the token ids and the extra keys (the salt of a sequence's first page starts the chain).
"""

import hashlib
import os
import struct
import subprocess
from typing import Any, Optional, Union

import msgspec
import pytest
import zmq

DRIVER = os.environ.get("KVCACHE_EVENTS_SERVING_RUN")
EXAMPLE = os.environ.get("KVCACHE_CONTINUOUS_BATCHING")

pytestmark = pytest.mark.skipif(DRIVER is None, reason="KVCACHE_EVENTS_SERVING_RUN is not set (run through ctest)")


def schema(array_like):
    """vLLM's event structs, in the map form (array_like False) or the positional form."""

    class BlockStored(msgspec.Struct, tag=True, array_like=array_like, omit_defaults=True):
        block_hashes: list[Union[bytes, int]]
        parent_block_hash: Optional[Union[bytes, int]]
        token_ids: list[int]
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str]
        lora_name: Optional[str]
        extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
        group_idx: Optional[int] = None

    class BlockRemoved(msgspec.Struct, tag=True, array_like=array_like, omit_defaults=True):
        block_hashes: list[Union[bytes, int]]
        medium: Optional[str]
        group_idx: Optional[int] = None

    class AllBlocksCleared(msgspec.Struct, tag=True, array_like=array_like, omit_defaults=True):
        pass

    class KVEventBatch(msgspec.Struct, array_like=array_like, omit_defaults=True):
        ts: float
        events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]
        data_parallel_rank: Optional[int] = None

    return msgspec.msgpack.Decoder(KVEventBatch), BlockStored, BlockRemoved, AllBlocksCleared


class Run:
    """The driver process: its endpoints, then (after the run) its last sequence number, seed and registered hashes."""

    def __init__(self, encoding, steps, seed):
        self.process = subprocess.Popen([DRIVER, encoding, str(steps), str(seed)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        words = self.process.stdout.readline().split()
        assert words[0] == "endpoints", words
        self.endpoint, self.replay_endpoint = words[1], words[2]

    def finish(self):
        self.registered = {}
        for line in self.process.stdout:
            words = line.split()
            if words[0] == "last":
                self.last = int(words[1])
            elif words[0] == "dropped":
                self.dropped = int(words[1])
            elif words[0] == "seed":
                self.seed = bytes.fromhex(words[1])
            elif words[0] == "registered":
                self.registered.setdefault(int(words[1]), set()).add(bytes.fromhex(words[2]))
            elif words[0] == "end":
                break

    def close(self):
        self.process.stdin.write("quit\n")
        self.process.stdin.flush()
        assert self.process.wait(timeout=30) == 0


def receive_all(sub, last, topic=b"kv@test@model"):
    """Every (sequence, payload) the subscriber gets, up to sequence `last`."""
    batches = []
    while not batches or batches[-1][0] < last:
        assert sub.poll(10000), "no batch within 10 s"
        got, sequence, payload = sub.recv_multipart()
        assert got == topic
        batches.append((struct.unpack(">q", sequence)[0], payload))
    return batches


def replay(context, endpoint, start):
    dealer = context.socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", struct.pack(">q", start)])
    batches = []
    while True:
        assert dealer.poll(10000), "no replay answer within 10 s"
        empty, sequence, payload = dealer.recv_multipart()
        assert empty == b""
        sequence = struct.unpack(">q", sequence)[0]
        if sequence == -1:
            assert payload == b""
            break
        batches.append((sequence, payload))
    dealer.close(linger=0)
    return batches


def sha(data):
    return hashlib.sha256(data).digest()[:16]


def recompute(seed, parent, tokens, extra):
    """kvcache's page hash (include/kvcache/paging/page_hash.h), as a router would compute it from an event."""
    return sha(parent + struct.pack("<II", 1, len(tokens)) + struct.pack("<Q", len(extra))
               + struct.pack(f"<{len(tokens)}i", *tokens) + extra)


def root(seed, salt):
    return sha(struct.pack("<QQI", 0, 0, 0) + seed + struct.pack("<Q", len(salt)) + salt)


def apply(held, decoded, types, seed, checked):
    """Applies one decoded batch to `held` ((medium, group) -> hashes), checking each stored page's hash (unless the
    seed is None: unknown)."""
    stored_type, removed_type, cleared_type = types
    for event in decoded.events:
        if isinstance(event, cleared_type):
            held.clear()
        elif isinstance(event, stored_type):
            size = event.block_size
            assert len(event.token_ids) == size * len(event.block_hashes)
            keys = event.extra_keys or [None] * len(event.block_hashes)
            parent = event.parent_block_hash
            for index, block in enumerate(event.block_hashes):
                page_keys = list(keys[index] or ())
                if parent is None:
                    # A sequence's first page: its salt, when it has one, is the first extra key.
                    salt = page_keys.pop(0) if page_keys and len(page_keys[0]) != 20 else b""
                    checked["salted"] += 1 if salt else 0
                    parent = root(seed, salt) if seed is not None else None
                checked["keyed"] += 1 if page_keys else 0
                tokens = event.token_ids[index * size:(index + 1) * size]
                assert seed is None or recompute(seed, parent, tokens, b"".join(page_keys)) == block
                checked["stored"] += 1
                target = held.setdefault((event.medium, event.group_idx), set())
                assert block not in target, "stored twice"
                target.add(block)
                parent = block
        else:
            target = held.setdefault((event.medium, event.group_idx), set())
            for block in event.block_hashes:
                assert block in target, "removed without being stored"
                target.remove(block)
                checked["removed"] += 1


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_events_reconstruct_the_cached_pages(encoding):
    decoder, *types = schema(array_like=encoding == "array")
    context = zmq.Context()
    run = Run(encoding, 400, 5)
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect(run.endpoint)
    try:
        run.finish()
        assert run.dropped == 0
        batches = receive_all(sub, run.last)
        assert [sequence for sequence, _ in batches] == list(range(run.last + 1))

        # Every batch, in order.
        held, checked = {}, {"stored": 0, "removed": 0, "salted": 0, "keyed": 0}
        for _, payload in batches:
            decoded = decoder.decode(payload)
            assert decoded.data_parallel_rank == 0
            apply(held, decoded, types, run.seed, checked)
        gpu = {group: hashes for (medium, group), hashes in held.items() if medium == "GPU" and hashes}
        assert gpu == run.registered
        assert sum(len(hashes) for hashes in run.registered.values()) > 10
        # The run reached what it is for: evictions, salted sequences, pages with an extra key, both groups.
        assert all(count > 10 for count in checked.values()), checked
        assert set(run.registered) == {0, 1}

        # Batches [40, 60) missed: the subscriber asks for everything from 40 on again.
        held = {}
        for sequence, payload in batches[:40]:
            apply(held, decoder.decode(payload), types, run.seed, checked)
        replayed = replay(context, run.replay_endpoint, 40)
        assert [sequence for sequence, _ in replayed] == list(range(40, run.last + 1))
        assert [payload for _, payload in replayed] == [payload for _, payload in batches[40:]]
        for _, payload in replayed:
            apply(held, decoder.decode(payload), types, run.seed, checked)
        gpu = {group: hashes for (medium, group), hashes in held.items() if medium == "GPU" and hashes}
        assert gpu == run.registered
    finally:
        run.close()
        sub.close(linger=0)
        context.term()


@pytest.mark.skipif(EXAMPLE is None, reason="KVCACHE_CONTINUOUS_BATCHING is not set (the examples are not built)")
def test_continuous_batching_example_publishes_its_run():
    """The example's --kv-events: a subscriber that follows the whole run holds, at the end, as many pages per group as
    the example says its prefix cache holds."""
    decoder, *types = schema(array_like=False)
    process = subprocess.Popen([EXAMPLE, "--requests", "60", "--samples", "3", "--tokens-per-page", "8",
                                "--system-prompt", "40", "--user-tokens", "16", "--new-tokens", "24", "--batch", "8",
                                "--chunk", "16", "--kv-events", "tcp://127.0.0.1:*", "--kv-events-wait-ms", "20000"],
                               stdout=subprocess.PIPE, text=True)
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        words = process.stdout.readline().split()
        assert words[:3] == ["kv", "events:", "publishing"], words
        sub.connect(words[-1])
        output = process.stdout.read()
        assert process.wait(timeout=60) == 0, output
        published = [line.split() for line in output.splitlines() if line.strip().startswith("kv events")]
        assert len(published) == 1, output
        batches, dropped = int(published[0][2].replace(",", "")), int(published[0][-2].replace(",", ""))
        assert dropped == 0, output
        cached = [int(line.split()[-1]) for line in output.splitlines() if line.startswith("cached pages:")]
        assert len(cached) == 1 and cached[0] > 0, output

        received = receive_all(sub, batches - 1, topic=b"")
        assert [sequence for sequence, _ in received] == list(range(batches))
        held, checked = {}, {"stored": 0, "removed": 0, "salted": 0, "keyed": 0}
        for _, payload in received:
            apply(held, decoder.decode(payload), types, None, checked)
        assert len(held.get(("GPU", 0), set())) == cached[0]
        assert checked["removed"] > 0, "the run evicted nothing: the check would not see removals"
    finally:
        if process.poll() is None:
            process.kill()
        sub.close(linger=0)
        context.term()
