"""Transfer descriptors from Python, and the NIXL adapter moving pages between two NIXL agents over host memory.

The caches' pools are NumPy buffers laid out as kvcache lays out a cache (layout_transfer_description), so these run
without a GPU. The pulled bytes are checked against the documented layout (per pool half: [pages, tokens per page,
heads, bytes per head]), with the remote filled with distinct bytes and the local poisoned. Pulls name descriptors of
prepared lists, except where tensor-parallel ranks split a layer's heads differently (then ranges). The NIXL tests skip
when nixl is not importable (the wheel is nixl-cu13, installed with --no-deps).
"""

import time

import numpy as np
import pytest

import kvcache


LAYERS = [(2, 16), (1, 32)]  # (KV heads, head size) of the model


def _config(tokens_per_page, dtype=kvcache.DataType.FLOAT16, layers=LAYERS, batch=2):
    return kvcache.Config(layer_configs=layers, max_batch_size=batch, max_sequence_length=256,
                          tokens_per_page=tokens_per_page, kv_cache_type=dtype)


class HostCache:
    """A cache's pools as NumPy buffers and its transfer description; for rank `rank` of `tp`, `config` is the rank's
    and `model` the whole model's."""

    def __init__(self, config, fill, model=None, tp=1, rank=0):
        self.layout = kvcache.compute_layout(config)
        self.config = config
        shard = {"model_config": model, "tp": tp, "rank": rank}
        sizes = kvcache.transfer_registration(
            kvcache.layout_transfer_description(self.layout, [0] * self._parts(), **shard))
        rng = np.random.default_rng(fill)
        self.pools = [rng.integers(1, 255, size=int(size), dtype=np.uint8) if fill else np.full(int(size), 0xEE, np.uint8)
                      for _, size, _ in sizes]
        self.description = kvcache.layout_transfer_description(self.layout, [p.ctypes.data for p in self.pools],
                                                               **shard)

    def _parts(self):
        """Pool bases the description takes: one per layer of each group (float16 pages have one part a layer), then
        one per state layer."""
        return sum(len(group.layers) for group in self.layout.groups) + len(self.layout.state_layers)

    def state_slot(self, layer, tensor, slot):
        """The bytes of `slot` of a state tensor, from the documented rule: tensor t of a state layer starts at its
        offset_bytes (the end of the one before, rounded up to 256 bytes), slot n slot_bytes * n bytes into it."""
        pool = self.pools[len(self.pools) - len(self.layout.state_layers) + layer]
        t = self.layout.state_layers[layer].tensors[tensor]
        start = t.offset_bytes + slot * t.slot_bytes
        return pool[start:start + t.slot_bytes]

    def tokens(self, pool, pages, num_tokens):
        """Rows [num_tokens, bytes per token] of both halves of `pool` for a sequence on `pages`, from the layout
        rule: a pool is [2 halves, num_pages, tokens_per_page, bytes per token]."""
        p = self.layout.tokens_per_page
        halves = self.pools[pool].reshape(2, self.layout.groups[0].num_pages, p, -1)
        rows = np.concatenate([halves[:, page] for page in pages], axis=1)
        return rows[:, :num_tokens]


def _nixl():
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError as error:
        pytest.skip(f"nixl is not importable ({error}); .ci/install-deps installs nixl-cu13 with --no-deps")
    return nixl_agent, nixl_agent_config


def test_descriptors_from_python_match_the_layout():
    local = HostCache(_config(16), 0)
    remote = HostCache(_config(16), 5)
    [(mine, theirs, layer_ends)] = kvcache.transfer_descriptors(local.description, [3, 4], [remote.description],
                                                                [9, 2], 0, 32)
    # Per layer, K pages 3-4 (adjacent locally, not remotely: two ranges), then V: four ranges per layer.
    assert list(layer_ends) == [4, 8]
    assert mine.shape == (8, 3) and theirs.shape == (8, 3)
    page_bytes = 16 * 2 * 16 * 2  # tokens x heads x head size x float16
    assert mine[0].tolist() == [local.pools[0].ctypes.data + 3 * page_bytes, page_bytes, 0]
    assert theirs[1].tolist() == [remote.pools[0].ctypes.data + 2 * page_bytes, page_bytes, 0]
    assert kvcache.transfer_mismatch(local.description, remote.description, 0) == ""
    other = HostCache(_config(16, dtype=kvcache.DataType.BFLOAT16), 1)
    assert "dataType" in kvcache.transfer_mismatch(local.description, other.description, 0)
    with pytest.raises(kvcache.InvalidArgumentError, match="remotes\\[0\\]"):
        kvcache.transfer_descriptors(local.description, [0, 1], [other.description], [0, 1], 0, 32)
    with pytest.raises(kvcache.InvalidArgumentError, match="magic"):
        kvcache.transfer_registration(b"not a description")


def test_descriptor_runs_name_each_run_of_the_smaller_page():
    from kvcache.nixl import descriptor_runs, layer_indices

    # Local pages of 64 tokens, remote of 16: runs of 16 tokens, four per local page. 70 tokens are five runs.
    local, remote = descriptor_runs([[5, 1]], [[30, 7, 8, 9, 10]], 70, 64, 16, 8, 40)
    assert local.tolist() == [20, 21, 22, 23, 4]
    assert remote.tolist() == [30, 7, 8, 9, 10]
    # Two sequences; runs of a page a window released on either side move nothing.
    local, remote = descriptor_runs([[2, 3], [-1, 4]], np.array([[6, 7, 0, 1], [5, 2, -1, 3]]), [32, 30], 16, 8,
                                    8, 8)
    assert local.tolist() == [4, 5, 6, 7, 9]
    assert remote.tolist() == [6, 7, 0, 1, 3]
    # Per block of a layer (here K, V of 10 descriptors each): the runs, then the runs again 10 further.
    assert layer_indices(np.array([3, 1]), 2, 10).tolist() == [3, 1, 13, 11]
    with pytest.raises(kvcache.InvalidArgumentError, match="num_tokens\\[0\\] is -1"):
        descriptor_runs([[0]], [[0]], -1, 16, 16, 8, 8)
    with pytest.raises(kvcache.InvalidArgumentError, match="remote_pages\\[0\\] holds 1 pages; its 20 tokens need 2"):
        descriptor_runs([[0, 1]], [[0]], 20, 16, 16, 8, 8)
    with pytest.raises(kvcache.OutOfRangeError, match="local_pages\\[1\\]\\[1\\] is page 8, outside \\[0, 8\\)"):
        descriptor_runs([[0], [1, 8]], [[0], [1, 2]], [10, 20], 16, 16, 8, 8)


def test_prepared_descriptors_from_python():
    cache = HostCache(_config(16), 0)
    pages = cache.layout.groups[0].num_pages
    blocks, layer_ends, num_pages, per_page = kvcache.transfer_prepared_descriptors(cache.description, 0, 4)
    assert (num_pages, per_page) == (pages, 4)
    assert list(layer_ends) == [2, 4]
    # Layer 0's V half: a quarter page (4 tokens x 2 heads x 16 x float16) a descriptor, four a page.
    assert blocks[1].tolist() == [cache.pools[0].ctypes.data + pages * 1024, 256, 0, 256, 4 * pages]
    assert kvcache.transfer_prepared_plan(cache.description, [HostCache(_config(64), 1).description], 0) == (16, [0, 0])
    with pytest.raises(kvcache.InvalidArgumentError, match="tokensPerDescriptor is 5"):
        kvcache.transfer_prepared_descriptors(cache.description, 0, 5)


def _state_config(ssm_type=kvcache.DataType.FLOAT32):
    """Two state layers, 4 running sequences and 3 checkpoint slots: 7 slots. Per slot: conv 8 x 3 float16 (48
    bytes), ssm 2 x 4 x 4 (128 bytes as float32); short_conv 33 int8."""
    tensor = kvcache.StateTensorConfig
    layers = [kvcache.StateLayerConfig([tensor("conv", [8, 3], kvcache.DataType.FLOAT16), tensor("ssm", [2, 4, 4], ssm_type)]),
              kvcache.StateLayerConfig([tensor("short_conv", [33], kvcache.DataType.INT8)])]
    return kvcache.Config(layer_configs=LAYERS, max_batch_size=4, max_sequence_length=256, tokens_per_page=16,
                          state_layer_configs=layers, num_checkpoint_slots=3)


STATE_TENSORS = [(0, 0), (0, 1), (1, 0)]  # (state layer, tensor)


def _assert_states_moved(local, remote, local_slots, remote_slots):
    """Every slot of every state tensor: a pulled slot holds the remote's, every other slot is still poisoned."""
    for layer, tensor in STATE_TENSORS:
        for slot in range(7):
            got = local.state_slot(layer, tensor, slot)
            if slot in local_slots:
                source = remote_slots[local_slots.index(slot)]
                assert np.array_equal(got, remote.state_slot(layer, tensor, source)), (layer, tensor, slot)
            else:
                assert (got == 0xEE).all(), (layer, tensor, slot)


def test_state_descriptors_from_python():
    local = HostCache(_state_config(), 0)
    remote = HostCache(_state_config(), 4)
    assert [(t.offset_bytes, t.slot_bytes) for t in local.layout.state_layers[0].tensors] == [(0, 48), (512, 128)]
    assert kvcache.transfer_state_mismatch(local.description, remote.description) == ""
    mine, theirs, layer_ends = kvcache.transfer_state_descriptors(local.description, [0, 5], remote.description, [6, 1])
    assert list(layer_ends) == [4, 6]
    ssm = local.pools[2].ctypes.data + 512
    assert mine[2].tolist() == [ssm, 128, 0]
    assert theirs[3].tolist() == [remote.pools[2].ctypes.data + 512 + 128, 128, 0]
    # Apply the rows as a transfer library would: each row names bytes of one pool on each side.
    for (to, size, _), (source, _, _) in zip(mine.tolist(), theirs.tolist()):
        to_pool = next(p for p in local.pools if p.ctypes.data <= to < p.ctypes.data + p.size)
        from_pool = next(p for p in remote.pools if p.ctypes.data <= source < p.ctypes.data + p.size)
        offset, start = to - to_pool.ctypes.data, source - from_pool.ctypes.data
        to_pool[offset:offset + size] = from_pool[start:start + size]
    _assert_states_moved(local, remote, [0, 5], [6, 1])

    blocks, ends, slots = kvcache.transfer_prepared_state_descriptors(local.description)
    assert slots == 7 and list(ends) == [2, 3]
    assert blocks[1].tolist() == [ssm, 128, 0, 128, 7]
    other = HostCache(_state_config(kvcache.DataType.BFLOAT16), 1)
    assert "state layer 0 tensor 1's dataType is float32" in kvcache.transfer_state_mismatch(local.description,
                                                                                             other.description)
    with pytest.raises(kvcache.InvalidArgumentError, match="dataType"):
        kvcache.transfer_state_descriptors(local.description, [0], other.description, [0])
    with pytest.raises(kvcache.OutOfRangeError, match="remoteSlots\\[1\\] is slot 7, outside \\[0, 7\\)"):
        kvcache.transfer_state_descriptors(local.description, [0, 1], remote.description, [0, 7])
    with pytest.raises(kvcache.InvalidArgumentError, match="local_slots holds 1 slots and remote_slots 2"):
        kvcache.transfer_state_descriptors(local.description, [0], remote.description, [0, 1])


def _agents(name, local, remotes):
    """A NixlPages per cache over DRAM, the local one with every remote added as a peer."""
    nixl_agent, nixl_agent_config = _nixl()
    from kvcache.nixl import NixlPages

    config = nixl_agent_config(backends=["UCX"])
    decode = NixlPages(nixl_agent(f"decode-{name}", config), local.description, "DRAM")
    prefills = [NixlPages(nixl_agent(f"prefill-{name}-{i}", config), remote.description, "DRAM")
                for i, remote in enumerate(remotes)]
    peers = [decode.add_peer(*prefill.metadata()) for prefill in prefills]
    return decode, prefills, peers


def _assert_pulled(local, remote, local_pages, remote_pages, num_tokens):
    """Checks every byte of the tokens both sides hold, and that tokens of pages released on the remote side stayed
    poisoned on the local side."""
    p, q = local.layout.tokens_per_page, remote.layout.tokens_per_page
    held = np.array([local_pages[t // p] >= 0 and remote_pages[t // q] >= 0 for t in range(num_tokens)], dtype=bool)
    mine = [max(page, 0) for page in local_pages]
    for pool in range(len(local.pools)):
        got = local.tokens(pool, mine, num_tokens)
        expected = remote.tokens(pool, [max(page, 0) for page in remote_pages], num_tokens)
        assert np.array_equal(got[:, held], expected[:, held]), f"pool {pool}"
        released = [t for t in np.flatnonzero(~held) if local_pages[t // p] >= 0]
        assert (got[:, released] == 0xEE).all(), f"pool {pool}: a released page's tokens were written"


def _assert_head(local, remote, pool, local_head, remote_head, local_pages, remote_pages, num_tokens):
    """Checks that head `local_head` of the local pool `pool` holds head `remote_head` of the remote's, every token."""
    def head(cache, pages, index):
        rows = cache.tokens(pool, pages, num_tokens)
        heads = cache.config.layer_configs[pool].num_kv_heads  # one group; each layer's data is one pool
        return rows.reshape(2, num_tokens, heads, -1)[:, :, index]

    assert np.array_equal(head(local, local_pages, local_head), head(remote, remote_pages, remote_head)), \
        f"pool {pool}: local head {local_head}"


@pytest.mark.parametrize("per_layer", [True, False])
@pytest.mark.parametrize("local_page, remote_page", [(16, 16), (64, 16), (16, 64)])
def test_nixl_pulls_pages_between_two_agents(local_page, remote_page, per_layer):
    local = HostCache(_config(local_page), 0)
    remote = HostCache(_config(remote_page), 7)
    decode, [prefill], [peer] = _agents(f"{local_page}-{remote_page}-{per_layer}", local, [remote])
    assert decode.uses_prepared_lists([peer], 0)
    num_tokens = 150
    local_pages = list(range(num_tokens // local_page + 1))[::-1]
    remote_pages = [(5 * i + 1) % remote.layout.groups[0].num_pages for i in range(num_tokens // remote_page + 1)]
    pull = decode.pull([peer], local_pages, remote_pages, 0, num_tokens, notification=b"request-1",
                       per_layer=per_layer)
    assert pull.num_layers == 2
    pull.wait_layer(1)
    pull.wait()
    _assert_pulled(local, remote, local_pages, remote_pages, num_tokens)
    # The prefill side hears that the pull is over (the notification travels asynchronously: poll for it).
    deadline = time.monotonic() + 10
    while not prefill.agent.check_remote_xfer_done(decode.agent.name, b"request-1"):
        assert time.monotonic() < deadline, "the prefill side got no notification"
    decode.close()
    prefill.close()


@pytest.mark.parametrize("per_layer", [True, False])
def test_nixl_pulls_several_sequences_in_one_pull(per_layer):
    local = HostCache(_config(64, batch=4), 0)
    remote = HostCache(_config(16, batch=4), 3)
    decode, [prefill], [peer] = _agents(f"many-{per_layer}", local, [remote])
    # Three sequences: the second's first remote pages were released (a window), the third is shorter.
    local_pages = [[4, 0], [1, 6, 2], [5]]
    remote_pages = [[2, 9, 4, 11, 0, 30], [-1, -1, 5, 6, 7, 8, 12, 13, 14, 15], [40, 41, 42]]
    num_tokens = [90, 150, 33]
    pull = decode.pull_many([peer], local_pages, remote_pages, 0, num_tokens, per_layer=per_layer)
    pull.wait()
    for mine, theirs, n in zip(local_pages, remote_pages, num_tokens):
        _assert_pulled(local, remote, mine, theirs, n)
    decode.close()
    prefill.close()


def test_nixl_tensor_parallel_pulls():
    model = _config(16)
    rank_config = _config(16, layers=[(1, 16), (1, 32)])  # layer 0's two heads split, layer 1's one replicated
    ranks = [HostCache(rank_config, 11 + rank, model, 2, rank) for rank in range(2)]
    pages, remote_pages, n = [3, 1], [0, 2], 20

    # tp 2 -> 1: layer 0 comes in one-head slices from both ranks: ranges, as transfer_descriptors gives them.
    whole = HostCache(model, 0, model, 1, 0)
    decode, prefills, peers = _agents("tp2-tp1", whole, ranks)
    assert not decode.uses_prepared_lists(peers, 0)
    decode.pull(peers, pages, remote_pages, 0, n).wait()
    _assert_head(whole, ranks[0], 0, 0, 0, pages, remote_pages, n)
    _assert_head(whole, ranks[1], 0, 1, 0, pages, remote_pages, n)
    _assert_head(whole, ranks[0], 1, 0, 0, pages, remote_pages, n)  # replicated: from the first listed
    for closing in [decode] + prefills:
        closing.close()

    # tp 1 -> 2: rank 1 takes model head 1 of layer 0 (a slice: ranges) and the replicated layer.
    local = HostCache(rank_config, 0, model, 2, 1)
    source = HostCache(model, 19, model, 1, 0)
    decode, prefills, peers = _agents("tp1-tp2", local, [source])
    assert not decode.uses_prepared_lists(peers, 0)
    decode.pull(peers, pages, remote_pages, 0, n).wait()
    _assert_head(local, source, 0, 0, 1, pages, remote_pages, n)
    _assert_head(local, source, 1, 0, 0, pages, remote_pages, n)
    for closing in [decode] + prefills:
        closing.close()

    # tp 2 -> 2, rank for rank: every layer whole from the rank holding the same heads: prepared lists.
    local = HostCache(rank_config, 0, model, 2, 1)
    decode, prefills, peers = _agents("tp2-tp2", local, ranks)
    assert decode.uses_prepared_lists(peers, 0)
    decode.pull(peers, pages, remote_pages, 0, n).wait()
    _assert_head(local, ranks[1], 0, 0, 0, pages, remote_pages, n)
    _assert_head(local, ranks[0], 1, 0, 0, pages, remote_pages, n)  # replicated: from the first listed
    for closing in [decode] + prefills:
        closing.close()


def test_nixl_pulls_state_slots():
    local = HostCache(_state_config(), 0)
    remote = HostCache(_state_config(), 9)
    decode, [prefill], [peer] = _agents("states", local, [remote])
    pull = decode.pull_states(peer, [3, 0, 6], [1, 2, 5], notification=b"states-1")
    pull.wait()
    _assert_states_moved(local, remote, [3, 0, 6], [1, 2, 5])
    with pytest.raises(kvcache.OutOfRangeError, match="local_slots\\[0\\] is slot 7"):
        decode.pull_states(peer, [7], [0])
    decode.close()
    prefill.close()
