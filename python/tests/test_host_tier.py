"""HostTier and the sequence files over its host pages. The host tests check the arguments refused before any CUDA call;
the GPU tests take the `torch` fixture (skipped without a GPU or torch, failed under KVCACHE_REQUIRE_GPU=1) and run on
a hybrid cache (a full attention group with a latent layer, a sliding-window group of two layers). Device pools hold
distinct values (K and V differ, layers differ, never 0) and every destination is poisoned before a transfer writes it;
the host page bytes expected are laid out from docs/tiers.md's rule (the group's layers in order, K then V, layers from
tests/layout_model.py), never read back from kvcache."""

import gc
import weakref

import pytest

import kvcache
from test_gpu import fill_distinct, pools_of
from test_sequence_file import POISON, make_config, model

POISON16 = ((POISON << 8) | POISON) - (1 << 16)  # the int16 whose two bytes are POISON
METHODS = [kvcache.HostTierMethod.COPY_ENGINE, kvcache.HostTierMethod.KERNEL, kvcache.HostTierMethod.AUTO]


# Host tests: no GPU needed.


def test_methods_and_limits_are_the_cpp_ones():
    assert [method.value for method in METHODS] == [1, 2, 0]
    assert kvcache.HOST_TIER_KERNEL_MAX_BYTES == 4 << 20
    assert (kvcache.HOST_TIER_MAX_SMS, kvcache.HOST_TIER_MAX_CHUNKS, kvcache.SEQUENCE_FILE_VERSION) == (8, 256, 3)
    assert kvcache.SEQUENCE_FILE_OLDEST_VERSION == 2


def test_a_tier_needs_a_cache():
    config = make_config()
    for cache, name in (("cache", "str"), (None, "NoneType"), (3, "int"), (kvcache.PageManager(config), "PageManager"),
                        (config, "Config")):
        with pytest.raises(TypeError, match=f"cache is a {name}; expected a KVCacheManager"):
            kvcache.HostTier(cache, 0, 4)


def test_sequence_functions_check_their_arguments_before_any_cuda_call(tmp_path):
    path = tmp_path / "seq.kvseq"
    with pytest.raises(TypeError, match="tier is a str; expected a HostTier"):
        kvcache.save_sequence(path, "tier", [0], 1)
    with pytest.raises(TypeError, match="tier is a NoneType; expected a HostTier"):
        kvcache.load_sequence(str(path), None, [0])
    with pytest.raises(TypeError, match="path is a int"):
        kvcache.save_sequence(3, "tier", [0], 1)  # the path is checked first
    with pytest.raises(TypeError, match="path is a list"):
        kvcache.load_sequence([str(path)], None, [0])
    assert not path.exists()


# GPU tests.


def make_cache(torch, dtype=kvcache.DataType.FLOAT16, stream=None):
    return kvcache.KVCacheManager(make_config(dtype), torch.cuda.current_stream() if stream is None else stream)


def host_bytes(torch, tier, host_page):
    """A copy of host page `host_page`'s bytes (the view waits for the tier's transfers touching it)."""
    return torch.from_dlpack(tier.host_page_view(host_page)).clone()


def poison_host_pages(torch, tier, host_pages):
    for host_page in host_pages:
        torch.from_dlpack(tier.host_page_view(host_page)).fill_(POISON)


def poison_pools(torch, pools):
    for pool in pools:
        pool.view(torch.uint8).fill_(POISON)


def model_host_page(torch, before, group, page):
    """The bytes a host page holds after offloading `page` of the pools `before`: the group's layers in order, each
    layer's K page then its V page (a latent layer: its one page)."""
    parts = [before[layer][half, page].reshape(-1).view(torch.uint8)
             for layer in model()[group].layers for half in range(before[layer].shape[0])]
    return torch.cat(parts).cpu()


def expected_pools(torch, before, group, moves):
    """Every pool poisoned except pages `dst` of the group's layers, which hold `before`'s page `src` (moves: (src,
    dst) pairs)."""
    expected = [torch.full_like(old, POISON16) for old in before]
    for layer in model()[group].layers:
        for src, dst in moves:
            expected[layer][:, dst] = before[layer][:, src]
    return expected


def assert_pools(torch, pools, expected):
    torch.cuda.synchronize()
    for layer, (pool, exp) in enumerate(zip(pools, expected)):
        assert torch.equal(pool.view(torch.int16), exp), f"layer {layer}"


def assert_poisoned(torch, tier, host_pages):
    for host_page in host_pages:
        assert bool((host_bytes(torch, tier, host_page) == POISON).all()), f"host page {host_page}"


def test_the_hybrid_cache_is_the_model(torch):
    cache = make_cache(torch)
    for group, expected in enumerate(model()):
        assert cache.group(group).layers == expected.layers
        assert cache.group(group).num_pages == 2 * expected.pages_per_sequence
    assert (cache.group(0).num_pages, cache.group(1).num_pages) == (16, 8)


@pytest.mark.parametrize("group", [0, 1])
@pytest.mark.parametrize("method", METHODS, ids=lambda method: method.name)
def test_offload_then_onboard_into_other_pages_is_byte_exact(torch, group, method):
    numpy = pytest.importorskip("numpy")
    stream = torch.cuda.current_stream()
    cache = make_cache(torch)
    pools = pools_of(torch, cache)
    before = fill_distinct(torch, pools)
    host_page_bytes = model()[group].bytes_per_page
    # Two host pages staged at a time: the copy engine takes the five entries in three rounds.
    tier = kvcache.HostTier(cache, group, 8, staging_bytes=2 * (2 * host_page_bytes + host_page_bytes // 2))
    assert (tier.group(), tier.device(), tier.num_host_pages()) == (group, cache.device(), 8)
    assert (tier.host_page_bytes(), tier.num_staging_host_pages()) == (host_page_bytes, 2)
    assert tier.geometry() == kvcache.page_geometry(cache.layout(), group)
    tier.wait_until_ready()
    assert tier.num_pinned_host_pages() == 8 and tier.num_free_host_pages() == 8
    poison_host_pages(torch, tier, range(8))

    last = cache.group(group).num_pages - 1
    out = [(last, 3), (0, 0), (5, 6), (6, 7), (1, 1)]  # scattered; 5 and 6 adjacent on both sides
    used = tier.offload(numpy.array(out, dtype=numpy.int32), stream, method=method)
    assert used == (kvcache.HostTierMethod.KERNEL if method == kvcache.HostTierMethod.AUTO else method)
    assert tier.last_event() != 0
    for page, host_page in out:
        assert torch.equal(host_bytes(torch, tier, host_page), model_host_page(torch, before, group, page)), page
    assert_poisoned(torch, tier, [2, 4, 5])

    poison_pools(torch, pools)
    into = [(2, 3), (last, 0), (3, 6), (4, 7), (6, 1)]  # pages in another order
    assert tier.onboard(into, stream, method=method) == used
    moves = [(dict((h, p) for p, h in out)[host_page], page) for page, host_page in into]
    assert_pools(torch, pools, expected_pools(torch, before, group, moves))


def test_transfers_on_a_stream_object_other_than_the_caches(torch):
    side = torch.cuda.Stream()
    cache = make_cache(torch, stream=side)
    pools = pools_of(torch, cache)  # ordered after the cache's stream
    before = fill_distinct(torch, pools)
    tier = kvcache.HostTier(cache, 0, 2)
    poison_host_pages(torch, tier, [0, 1])
    other = torch.cuda.Stream()

    class ProtocolStream:
        def __cuda_stream__(self):
            return (0, other.cuda_stream)

    other.wait_stream(torch.cuda.current_stream())  # after the fill
    tier.offload([(9, 1)], ProtocolStream())
    tier.synchronize_host_pages([1])
    assert not tier.is_host_page_busy(1)
    assert torch.equal(host_bytes(torch, tier, 1), model_host_page(torch, before, 0, 9))
    assert_poisoned(torch, tier, [0])
    torch.cuda.current_stream().wait_stream(other)
    poison_pools(torch, pools)
    side.wait_stream(torch.cuda.current_stream())
    tier.onboard([(4, 1)])  # on the cache's stream, `side`
    side.synchronize()
    assert_pools(torch, pools, expected_pools(torch, before, 0, [(9, 4)]))


def test_device_lists_replay_in_a_graph_and_count_bad_entries(torch):
    stream = torch.cuda.current_stream()
    cache = make_cache(torch)
    pools = pools_of(torch, cache)
    before = fill_distinct(torch, pools)
    group = 1  # the sliding window's pages
    num_pages = cache.group(group).num_pages
    tier = kvcache.HostTier(cache, group, 6)
    poison_host_pages(torch, tier, range(6))
    entries = torch.full((4, 2), kvcache.UNUSED_PAGE_ENTRY, dtype=torch.int32, device="cuda")
    count = torch.tensor([2], dtype=torch.int32, device="cuda")
    errors = torch.zeros(1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        method = tier.offload(entries, torch.cuda.current_stream(), count=count, error_count=errors)
    assert method == kvcache.HostTierMethod.KERNEL
    torch.cuda.synchronize()
    assert_poisoned(torch, tier, range(6))  # capturing ran nothing

    # Two entries of the count; the rest of the list is ignored.
    entries.copy_(torch.tensor([[7, 1], [3, 4], [5, 0], [6, 2]], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(host_bytes(torch, tier, 1), model_host_page(torch, before, group, 7))
    assert torch.equal(host_bytes(torch, tier, 4), model_host_page(torch, before, group, 3))
    assert_poisoned(torch, tier, [0, 2, 3, 5])

    # A new list: an unused entry skipped, a page and a host page out of range skipped and counted.
    count.fill_(4)
    entries.copy_(torch.tensor([[2, 0], [kvcache.UNUSED_PAGE_ENTRY, 2], [num_pages, 3], [1, 6]], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(host_bytes(torch, tier, 0), model_host_page(torch, before, group, 2))
    assert_poisoned(torch, tier, [2, 3, 5])
    assert errors.item() == 2

    # Onboard from a device list ([2n] form), not captured.
    poison_pools(torch, pools)
    back = torch.tensor([4, 1, 5, 0], dtype=torch.int32, device="cuda")
    assert tier.onboard(back, stream) == kvcache.HostTierMethod.KERNEL
    expected = expected_pools(torch, before, group, [(7, 4), (2, 5)])
    assert_pools(torch, pools, expected)
    with pytest.raises(kvcache.InvalidArgumentError, match="COPY_ENGINE"):
        tier.onboard(back, stream, method=kvcache.HostTierMethod.COPY_ENGINE)
    with pytest.raises(kvcache.InvalidArgumentError, match="entries has 3 int32 values"):
        tier.onboard(back[:3], stream)
    with pytest.raises(kvcache.InvalidArgumentError, match="int32"):
        tier.onboard(back.to(torch.int64), stream)
    with pytest.raises(kvcache.InvalidArgumentError, match="count must be a device int32 array of one element"):
        tier.onboard(back, stream, count=torch.ones(2, dtype=torch.int32, device="cuda"))
    assert_pools(torch, pools, expected)


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the refused call captured nothing
def test_a_host_list_transfer_refuses_a_capturing_stream(torch):
    cache = make_cache(torch)
    tier = kvcache.HostTier(cache, 0, 2)
    torch.cuda.synchronize()
    with pytest.raises(kvcache.InvalidArgumentError, match="capturing"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            tier.offload([(1, 0)], torch.cuda.current_stream())


def test_a_saved_sequence_loads_into_a_fresh_cache_byte_exact(torch, tmp_path):
    stream = torch.cuda.current_stream()
    cache = make_cache(torch)
    before = fill_distinct(torch, pools_of(torch, cache))
    fresh = make_cache(torch)
    fresh_pools = pools_of(torch, fresh)
    poison_pools(torch, fresh_pools)
    moves = {0: [(5, 2), (1, 9), (3, 0)], 1: [(5, 2), (1, 7), (3, 0)]}  # (page saved, page it is onboarded into)
    expected = [torch.full_like(old, POISON16) for old in before]
    for group, group_moves in moves.items():
        pages = [src for src, _ in group_moves]
        tier = kvcache.HostTier(cache, group, 4)
        host_pages = tier.allocate_host_pages(3)
        assert host_pages == [0, 1, 2]
        tier.offload(list(zip(pages, host_pages)), stream)
        path = tmp_path / f"group{group}.kvseq"
        kvcache.save_sequence(path, tier, host_pages, 40)  # waits for the offload
        info = kvcache.read_sequence_file_info(path)
        assert (info.page_count, info.token_count) == (3, 40) and info.geometry == tier.geometry()

        fresh_tier = kvcache.HostTier(fresh, group, 4)
        poison_host_pages(torch, fresh_tier, range(4))
        loaded = [3, 0, 2]
        assert kvcache.load_sequence(str(path), fresh_tier, loaded) == 40
        for page, host_page in zip(pages, loaded):
            assert torch.equal(host_bytes(torch, fresh_tier, host_page), model_host_page(torch, before, group, page))
        assert_poisoned(torch, fresh_tier, [1])
        fresh_tier.onboard([(dst, host_page) for (_, dst), host_page in zip(group_moves, loaded)], stream)
        for layer in model()[group].layers:
            for src, dst in group_moves:
                expected[layer][:, dst] = before[layer][:, src]
    assert_pools(torch, fresh_pools, expected)

    # Refused loads leave every host page as it was.
    other = kvcache.HostTier(make_cache(torch, kvcache.DataType.BFLOAT16), 0, 4)
    window = kvcache.HostTier(fresh, 1, 4)
    full = kvcache.HostTier(fresh, 0, 4)
    for tier in (other, window, full):
        poison_host_pages(torch, tier, range(4))
    with pytest.raises(kvcache.InvalidArgumentError, match="dataType"):
        kvcache.load_sequence(tmp_path / "group0.kvseq", other, [0, 1, 2])
    with pytest.raises(kvcache.InvalidArgumentError, match="another geometry"):
        kvcache.load_sequence(tmp_path / "group0.kvseq", window, [0, 1, 2])  # the wrong group
    with pytest.raises(kvcache.InvalidArgumentError, match="holds 3 pages; the destination list has 2"):
        kvcache.load_sequence(tmp_path / "group0.kvseq", full, [0, 1])
    with pytest.raises(kvcache.InvalidArgumentError, match="host page 1 is listed more than once"):
        kvcache.load_sequence(tmp_path / "group0.kvseq", full, [1, 0, 1])
    with pytest.raises(kvcache.OutOfRangeError, match="host page 4"):
        kvcache.load_sequence(tmp_path / "group0.kvseq", full, [0, 1, 4])
    with pytest.raises(kvcache.OutOfRangeError, match="host page -1"):
        kvcache.save_sequence(tmp_path / "bad.kvseq", full, [0, -1], 2)
    with pytest.raises(kvcache.InvalidArgumentError, match="tokenCount is 49"):
        kvcache.save_sequence(tmp_path / "bad.kvseq", full, [0, 1, 2], 49)  # full attention: at most 3 * 16
    assert not (tmp_path / "bad.kvseq").exists()
    for tier in (other, window, full):
        assert_poisoned(torch, tier, range(4))


def test_misuse_raises_named_errors_and_changes_nothing(torch):
    numpy = pytest.importorskip("numpy")
    stream = torch.cuda.current_stream()
    cache = make_cache(torch)
    pools = pools_of(torch, cache)
    before = fill_distinct(torch, pools)
    full, window = (kvcache.HostTier(cache, group, 4) for group in (0, 1))
    for tier in (full, window):
        poison_host_pages(torch, tier, range(4))
    n_full, n_window = cache.group(0).num_pages, cache.group(1).num_pages
    assert n_window <= 12 < n_full  # page 12 is a page of the full attention group only

    with pytest.raises(kvcache.OutOfRangeError,
                       match=rf"entries\[1\]\.page is page {n_full}; page ids must be in \[0, {n_full}\)"):
        full.offload([(1, 0), (n_full, 1)], stream)
    with pytest.raises(kvcache.OutOfRangeError, match=r"entries\[0\]\.page is page -1"):
        full.onboard([(-1, 0)], stream)
    with pytest.raises(kvcache.OutOfRangeError,
                       match=r"entries\[1\]\.hostPage is host page 4; host pages must be in \[0, 4\)"):
        full.offload([(1, 0), (2, 4)], stream, method=kvcache.HostTierMethod.COPY_ENGINE)
    with pytest.raises(kvcache.InvalidArgumentError, match="host page 0 is listed more than once"):
        full.offload([(1, 0), (2, 0)], stream)
    with pytest.raises(kvcache.InvalidArgumentError, match="page 3 is listed more than once"):
        full.onboard(numpy.array([[3, 0], [3, 1]], dtype=numpy.int32), stream)
    with pytest.raises(kvcache.OutOfRangeError,
                       match=rf"entries\[0\]\.page is page 12; page ids must be in \[0, {n_window}\)"):
        window.onboard([(12, 0)], stream)  # a page id of the other group
    with pytest.raises(kvcache.InvalidArgumentError, match="count and error_count"):
        full.offload([(1, 0)], stream, count=torch.ones(1, dtype=torch.int32, device="cuda"))
    with pytest.raises(kvcache.InvalidArgumentError, match=r"entries\[0\] is a tuple; expected a \(page, host_page\)"):
        full.offload([(1, 0, 2)], stream)
    with pytest.raises(kvcache.InvalidArgumentError, match=r"entries\[0\] is 4294967296; ids must fit in int32"):
        full.offload([(2**32, 0)], stream)
    with pytest.raises(kvcache.InvalidArgumentError, match=r"entries\[1\] is 4294967296"):
        full.offload(numpy.array([[1, 0], [2**32, 1]], dtype=numpy.int64), stream)
    with pytest.raises(TypeError, match="entries is a int"):
        full.offload(5, stream)
    with pytest.raises(TypeError, match=r"entries\[0\] is a str; ids must be ints"):
        full.offload([(1, "0")], stream)
    with pytest.raises(TypeError, match="stream is a str"):
        full.offload([(1, 0)], "stream")
    with pytest.raises(TypeError):
        full.offload([(1, 0)], stream, method="KERNEL")
    with pytest.raises(kvcache.OutOfRangeError, match="host page 4 is outside"):
        full.host_page_view(4)
    with pytest.raises(kvcache.OutOfRangeError, match="host page 4 is outside"):
        full.is_host_page_busy(4)
    with pytest.raises(kvcache.OutOfRangeError, match="host page -1 is outside"):
        full.synchronize_host_pages([0, -1])

    with pytest.raises(kvcache.OutOfRangeError, match="group is 2"):
        kvcache.HostTier(cache, 2, 4)
    with pytest.raises(kvcache.InvalidArgumentError, match="group is 4294967296"):
        kvcache.HostTier(cache, 2**32, 4)
    with pytest.raises(kvcache.InvalidArgumentError, match="numHostPages is 0"):
        kvcache.HostTier(cache, 0, 0)
    with pytest.raises(kvcache.InvalidArgumentError, match="chunkBytes is 0"):
        kvcache.HostTier(cache, 0, 4, chunk_bytes=0)
    with pytest.raises(kvcache.InvalidArgumentError, match="stagingBytes is -1"):
        kvcache.HostTier(cache, 0, 4, staging_bytes=-1)

    # Host page bookkeeping, all or nothing.
    with pytest.raises(kvcache.OutOfMemoryError, match="count is 5; the tier has 4 free host pages"):
        full.allocate_host_pages(5)
    with pytest.raises(kvcache.InvalidArgumentError, match="count is -1"):
        full.allocate_host_pages(-1)
    assert full.num_free_host_pages() == 4
    assert full.allocate_host_pages(3) == [0, 1, 2]
    with pytest.raises(kvcache.InvalidArgumentError, match="host page 1 is listed more than once"):
        full.release_host_pages([1, 1])
    with pytest.raises(kvcache.InvalidArgumentError, match="host page 3, which is not handed out"):
        full.release_host_pages([1, 3])
    with pytest.raises(kvcache.OutOfRangeError, match="host page 4 is outside"):
        full.release_host_pages([4])
    assert full.num_free_host_pages() == 1
    full.release_host_pages(numpy.array([1], dtype=numpy.int32))
    assert full.allocate_host_pages(2) == [1, 3]

    assert_pools(torch, pools, before)
    for tier in (full, window):
        assert_poisoned(torch, tier, range(4))


def test_pinned_host_pages_grow_chunk_by_chunk(torch):
    cache = make_cache(torch)
    before = fill_distinct(torch, pools_of(torch, cache))
    host_page_bytes = model()[0].bytes_per_page
    tier = kvcache.HostTier(cache, 0, 12, chunk_bytes=host_page_bytes)  # one host page a chunk
    assert 1 <= tier.num_pinned_host_pages() <= 12
    tier.wait_until_ready()
    assert tier.num_pinned_host_pages() == 12
    poison_host_pages(torch, tier, [11, 0])
    tier.offload([(4, 11), (3, 0)])
    assert torch.equal(host_bytes(torch, tier, 11), model_host_page(torch, before, 0, 4))
    assert torch.equal(host_bytes(torch, tier, 0), model_host_page(torch, before, 0, 3))


def test_the_tier_keeps_its_cache_alive(torch):
    cache = make_cache(torch)
    before = fill_distinct(torch, pools_of(torch, cache))
    cache_alive = weakref.ref(cache)
    tier = kvcache.HostTier(cache, 1, 2)
    del cache
    gc.collect()
    assert cache_alive() is not None
    tier.offload([(6, 1)])  # on the cache's stream: the cache is still there
    view = tier.host_page_view(1)
    tier_alive = weakref.ref(tier)
    del tier
    gc.collect()
    assert tier_alive() is not None and cache_alive() is not None  # the view holds the tier, which holds the cache
    assert torch.equal(torch.from_dlpack(view).clone(), model_host_page(torch, before, 1, 6))
    del view
    gc.collect()
    assert tier_alive() is None and cache_alive() is None
