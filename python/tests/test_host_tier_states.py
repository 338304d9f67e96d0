"""Host states of a HostTier: a sequence's state slot (every state layer and tensor) offloaded to pinned host memory and
onboarded into another slot. The expected host bytes are laid out from docs/layout.md's rule (state layers in order,
each layer's tensors in config order, back to back), from the cache's public state views, never from the tier. Every
slot holds distinct non-zero values and every destination is poisoned first. GPU tests take the `torch` fixture
(skipped without a GPU or torch, failed under KVCACHE_REQUIRE_GPU=1)."""

import pytest

import kvcache
from test_state_layers_gpu import SLOTS, make_cache, make_config, state_layer

POISON = 0xA5
SHAPES = [{"conv": [6, 3], "recurrent": [2, 4, 4]}, {"ssm": [7]}]
DTYPES = [{"conv": kvcache.DataType.BFLOAT16}, {"ssm": kvcache.DataType.INT8}]
# By hand: conv 6 * 3 * 2 bytes, recurrent 2 * 4 * 4 * 4 bytes, ssm 7 bytes.
PACKED_BYTES = 36 + 128 + 7


def test_a_file_without_a_state_says_so(np, tmp_path):
    layout = kvcache.compute_layout(make_config([state_layer(s, d) for s, d in zip(SHAPES, DTYPES)]))
    geometry = kvcache.page_geometry(layout, 0)
    path = tmp_path / "pages.kvseq"
    kvcache.write_sequence_file(path, geometry, 3, np.full((1, geometry.bytes_per_page), 7, dtype=np.uint8))
    info = kvcache.read_sequence_file_info(path)
    assert (info.version, info.state_tensors, info.state_bytes) == (3, [], 0)
    assert (kvcache.SEQUENCE_FILE_VERSION, kvcache.SEQUENCE_FILE_OLDEST_VERSION) == (3, 2)


def test_the_tier_checks_its_cache_before_its_host_states():
    with pytest.raises(TypeError, match="cache is a str; expected a KVCacheManager"):
        kvcache.HostTier("cache", 0, 4, num_host_states=1)


def state_cache(torch):
    cache = make_cache(torch, [state_layer(s, d) for s, d in zip(SHAPES, DTYPES)])
    views = [[torch.from_dlpack(cache.state_view(layer, name)) for name in shapes] for layer, shapes in enumerate(SHAPES)]
    for layer, tensors in enumerate(views):
        for index, view in enumerate(tensors):
            raw = view.view(torch.uint8).reshape(SLOTS, -1)
            count = raw.shape[1]
            for slot in range(SLOTS):
                values = (torch.arange(count, device=raw.device) * 7 + 31 * slot + 53 * index + 97 * layer) % 251 + 1
                raw[slot].copy_(torch.where(values == POISON, values + 1, values).to(torch.uint8))
    torch.cuda.synchronize()
    return cache, views


def packed_slot(torch, views, slot):
    return torch.cat([view[slot].reshape(-1).view(torch.uint8) for tensors in views for view in tensors]).cpu()


def host_state(torch, tier, index):
    return torch.from_dlpack(tier.host_state_view(index)).clone()


def test_a_state_slot_round_trips_into_another_slot(torch):
    cache, views = state_cache(torch)
    before = [packed_slot(torch, views, slot) for slot in range(SLOTS)]
    assert before[0].numel() == PACKED_BYTES
    tier = kvcache.HostTier(cache, 0, 2, num_host_states=3)
    assert (tier.num_host_states(), tier.host_state_bytes(), tier.num_free_host_states()) == (3, PACKED_BYTES, 3)
    for index in range(3):
        torch.from_dlpack(tier.host_state_view(index)).fill_(POISON)
    tier.offload_states([(1, 2), (4, 0)])  # slot 4 is the checkpoint slot
    assert torch.equal(host_state(torch, tier, 2), before[1])
    assert torch.equal(host_state(torch, tier, 0), before[4])
    assert torch.equal(host_state(torch, tier, 1), torch.full((PACKED_BYTES,), POISON, dtype=torch.uint8))
    for slot in (3, 0):
        for tensors in views:
            for view in tensors:
                view[slot].view(torch.uint8).fill_(POISON)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    tier.onboard_states([(3, 2), (0, 0)], stream)
    stream.synchronize()
    expected = {3: 1, 0: 4}
    for slot in range(SLOTS):
        source = expected.get(slot, slot)
        assert torch.equal(packed_slot(torch, views, slot), before[source]), f"slot {slot} should hold slot {source}'s"


def test_state_misuse_raises_named_errors_and_changes_nothing(torch):
    cache, views = state_cache(torch)
    before = [packed_slot(torch, views, slot) for slot in range(SLOTS)]
    tier = kvcache.HostTier(cache, 0, 2, num_host_states=2)
    for index in range(2):
        torch.from_dlpack(tier.host_state_view(index)).fill_(POISON)
    with pytest.raises(kvcache.OutOfRangeError, match=rf"entries\[1\]\.slot is {SLOTS}, outside \[0, {SLOTS}\)"):
        tier.offload_states([(0, 0), (SLOTS, 1)])
    with pytest.raises(kvcache.OutOfRangeError, match=r"entries\[0\]\.hostState is 2, outside \[0, 2\)"):
        tier.onboard_states([(0, 2)])
    with pytest.raises(kvcache.InvalidArgumentError, match="host state 1 .*more than once"):
        tier.offload_states([(0, 1), (2, 1)])
    with pytest.raises(kvcache.OutOfRangeError, match=r"host state 2 is outside \[0, 2\)"):
        tier.host_state_view(2)
    one = tier.allocate_host_states(1)
    with pytest.raises(kvcache.OutOfMemoryError, match="count is 2; the tier has 1 free host states"):
        tier.allocate_host_states(2)
    assert tier.num_free_host_states() == 1
    with pytest.raises(kvcache.InvalidArgumentError, match="not handed out"):
        tier.release_host_states([1 - one[0]])
    tier.release_host_states(one)
    assert tier.num_free_host_states() == 2
    torch.cuda.synchronize()
    for index in range(2):
        assert torch.equal(host_state(torch, tier, index), torch.full((PACKED_BYTES,), POISON, dtype=torch.uint8))
    for slot in range(SLOTS):
        assert torch.equal(packed_slot(torch, views, slot), before[slot]), f"slot {slot} changed"
    plain = make_cache(torch, [], checkpoints=0)
    with pytest.raises(kvcache.InvalidArgumentError, match="numHostStates is 1; the cache has no state layers"):
        kvcache.HostTier(plain, 0, 2, num_host_states=1)
    with pytest.raises(kvcache.InvalidArgumentError, match="no state layers"):
        kvcache.HostTier(plain, 0, 2).offload_states([(0, 0)])


def test_a_sequence_file_carries_the_state_with_the_pages(torch, tmp_path):
    cache, views = state_cache(torch)
    before = [packed_slot(torch, views, slot) for slot in range(SLOTS)]
    tier = kvcache.HostTier(cache, 0, 2, num_host_states=2)
    tier.offload([(1, 0)])
    tier.offload_states([(2, 0)])
    path, plain = tmp_path / "with_state.kvseq", tmp_path / "pages_only.kvseq"
    kvcache.save_sequence(path, tier, [0], 16, host_state=0)
    kvcache.save_sequence(plain, tier, [0], 16)
    info = kvcache.read_sequence_file_info(path)
    assert (info.version, info.state_bytes) == (3, PACKED_BYTES)
    assert [(t.state_layer, t.tensor, t.shape, t.slot_bytes) for t in info.state_tensors] == [
        (0, 0, [6, 3], 36), (0, 1, [2, 4, 4], 128), (1, 0, [7], 7)]
    assert kvcache.read_sequence_file_info(plain).state_tensors == []
    page = torch.from_dlpack(tier.host_page_view(0)).clone()

    torch.from_dlpack(tier.host_page_view(1)).fill_(POISON)
    torch.from_dlpack(tier.host_state_view(1)).fill_(POISON)
    assert kvcache.load_sequence(path, tier, [1], host_state=1) == 16
    assert torch.equal(torch.from_dlpack(tier.host_page_view(1)), page)
    assert torch.equal(host_state(torch, tier, 1), before[2])
    for tensors in views:
        for view in tensors:
            view[3].view(torch.uint8).fill_(POISON)
    tier.onboard_states([(3, 1)])
    torch.cuda.synchronize()
    assert torch.equal(packed_slot(torch, views, 3), before[2])

    torch.from_dlpack(tier.host_state_view(1)).fill_(POISON)
    with pytest.raises(kvcache.InvalidArgumentError, match="holds no state"):
        kvcache.load_sequence(plain, tier, [1], host_state=1)
    with pytest.raises(kvcache.OutOfRangeError, match=r"hostState is 2, outside \[0, 2\)"):
        kvcache.load_sequence(path, tier, [1], host_state=2)
    assert torch.equal(host_state(torch, tier, 1), torch.full((PACKED_BYTES,), POISON, dtype=torch.uint8))
