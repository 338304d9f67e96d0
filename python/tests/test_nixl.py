"""Transfer descriptors from Python, and the NIXL adapter moving pages between two NIXL agents over host memory.

The caches' pools are NumPy buffers laid out as kvcache lays out a cache (layout_transfer_description), so these run
without a GPU. The pulled bytes are checked against the documented layout (per pool half: [pages, tokens per page,
bytes per token]), with the remote filled with distinct bytes and the local poisoned. The NIXL tests skip when nixl is
not importable (the wheel is nixl-cu13, installed with --no-deps).
"""

import time

import numpy as np
import pytest

import kvcache


def _config(tokens_per_page, dtype=kvcache.DataType.FLOAT16):
    return kvcache.Config(layer_configs=[(2, 16), (1, 32)], max_batch_size=2, max_sequence_length=256,
                          tokens_per_page=tokens_per_page, kv_cache_type=dtype)


class HostCache:
    """A cache's pools as NumPy buffers and its transfer description."""

    def __init__(self, config, fill):
        self.layout = kvcache.compute_layout(config)
        self.config = config
        sizes = kvcache.transfer_registration(kvcache.layout_transfer_description(self.layout, [0] * self._parts()))
        rng = np.random.default_rng(fill)
        self.pools = [rng.integers(1, 255, size=int(size), dtype=np.uint8) if fill else np.full(int(size), 0xEE, np.uint8)
                      for _, size, _ in sizes]
        self.description = kvcache.layout_transfer_description(self.layout, [p.ctypes.data for p in self.pools])

    def _parts(self):
        return sum(len(group.layers) for group in self.layout.groups)

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


@pytest.mark.parametrize("local_page, remote_page, per_layer", [(16, 16, True), (64, 16, True), (16, 64, False)])
def test_nixl_pulls_pages_between_two_agents(local_page, remote_page, per_layer):
    nixl_agent, nixl_agent_config = _nixl()
    from kvcache.nixl import NixlPages

    local = HostCache(_config(local_page), 0)
    remote = HostCache(_config(remote_page), 7)
    config = nixl_agent_config(backends=["UCX"])
    decode = NixlPages(nixl_agent(f"decode-{local_page}-{remote_page}", config), local.description, "DRAM")
    prefill = NixlPages(nixl_agent(f"prefill-{local_page}-{remote_page}", config), remote.description, "DRAM")
    peer = decode.add_peer(*prefill.metadata())
    num_tokens = 150
    local_pages = list(range(num_tokens // local_page + 1))[::-1]
    remote_pages = [(5 * i + 1) % remote.layout.groups[0].num_pages for i in range(num_tokens // remote_page + 1)]
    pull = decode.pull([peer], local_pages, remote_pages, 0, num_tokens, notification=b"request-1",
                       per_layer=per_layer)
    assert pull.num_layers == 2
    pull.wait_layer(1)
    pull.wait()
    for pool in range(len(local.pools)):
        got = local.tokens(pool, local_pages, num_tokens)
        expected = remote.tokens(pool, remote_pages, num_tokens)
        assert np.array_equal(got, expected), f"pool {pool}"
    # The prefill side hears that the pull is over (the notification travels asynchronously: poll for it).
    deadline = time.monotonic() + 10
    while not prefill.agent.check_remote_xfer_done(decode.agent.name, b"request-1"):
        assert time.monotonic() < deadline, "the prefill side got no notification"
    decode.close()
    prefill.close()
