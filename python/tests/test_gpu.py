"""GPU tests through torch: zero-copy views, page operations from host and device lists, CUDA graphs, lifetimes and
page tables. Each takes the `torch` fixture: skipped without a GPU or torch, failed under KVCACHE_REQUIRE_GPU=1.
Expectations come from torch copies of the data taken before the operation, never from kvcache."""

import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

import kvcache

TOKENS = 16
LAYERS = [(2, 32), (1, 16)]  # distinct head shapes: per-layer buffers
BATCH = 2
SEQ = 64
MIN_PAGES = BATCH * SEQ // TOKENS  # 8


def make_cache(stream=None, dtype=kvcache.DataType.FLOAT16, layers=LAYERS, num_pages=0):
    config = kvcache.Config(layer_configs=layers, max_batch_size=BATCH, max_sequence_length=SEQ,
                            tokens_per_page=TOKENS, kv_cache_type=dtype, num_pages=num_pages)
    return kvcache.KVCacheManager(config, stream)


def torch_dtypes(torch):
    return {
        kvcache.DataType.FLOAT16: torch.float16,
        kvcache.DataType.BFLOAT16: torch.bfloat16,
        kvcache.DataType.FLOAT32: torch.float32,
        kvcache.DataType.FP8_E4M3: torch.float8_e4m3fn,
        kvcache.DataType.FP8_E5M2: torch.float8_e5m2,
        kvcache.DataType.INT8: torch.int8,
        kvcache.DataType.UINT8: torch.uint8,
    }


def fill_distinct(torch, pools):
    """Writes a distinct 16-bit pattern to every element of every layer (K and V differ, layers differ), through the
    DLPack views, and returns copies of what was written."""
    offset = 1
    for pool in pools:
        bits = pool.view(torch.int16)
        count = bits.numel()
        values = (torch.arange(count, device="cuda", dtype=torch.int64) + offset) % 32749 + 1
        bits.copy_(values.view(bits.shape).to(torch.int16))
        offset += count
    return [pool.view(torch.int16).clone() for pool in pools]


def pools_of(torch, cache):
    return [torch.from_dlpack(cache.pool_view(layer)) for layer in range(cache.num_layers())]


def test_views_are_the_cache_memory(torch):
    cache = make_cache(torch.cuda.current_stream())
    for layer, (heads, dim) in enumerate(LAYERS):
        pool = torch.from_dlpack(cache.pool_view(layer))
        assert pool.is_cuda and pool.dtype == torch.float16
        assert tuple(pool.shape) == (2, MIN_PAGES, TOKENS, heads, dim)
        assert pool.is_contiguous()
        assert pool.data_ptr() == cache.k_pool_ptr(layer)
        k_pool = torch.from_dlpack(cache.k_pool(layer))
        v_pool = torch.from_dlpack(cache.v_pool(layer))
        assert k_pool.data_ptr() == cache.k_pool_ptr(layer)
        assert v_pool.data_ptr() == cache.v_pool_ptr(layer)
        assert cache.v_pool_ptr(layer) - cache.k_pool_ptr(layer) == MIN_PAGES * TOKENS * heads * dim * 2
        assert tuple(k_pool.shape) == (MIN_PAGES, TOKENS, heads, dim)
        ref = cache.layer_ref(layer)
        assert (ref.k_pool, ref.v_pool, ref.page_stride) == (cache.k_pool_ptr(layer), cache.v_pool_ptr(layer),
                                                             TOKENS * heads * dim)


def test_slot_view_addresses_the_pool_through_the_identity_page_table(torch):
    cache = make_cache(torch.cuda.current_stream())
    heads, dim = LAYERS[0]
    slot = torch.from_dlpack(cache.slot_view(0))
    pool = torch.from_dlpack(cache.pool_view(0))
    assert tuple(slot.shape) == (2, BATCH, SEQ, heads, dim)
    pool.fill_(0)
    slot[1, 1, 37, 1, 5] = 3.0  # V, slot 1, token 37: page 1 * 4 + 37 // 16 = 6, token 5
    assert pool[1, 6, 5, 1, 5].item() == 3.0
    assert pool.sum().item() == 3.0
    with pytest.raises(kvcache.InvalidConfigError):
        make_cache(torch.cuda.current_stream(), num_pages=MIN_PAGES + 4).slot_view(0)


def test_separate_view_addresses_k_and_v_of_the_pool(torch):
    cache = make_cache(torch.cuda.current_stream())
    heads, dim = LAYERS[0]
    k, v = (torch.from_dlpack(half) for half in cache.separate_view(0))
    pool = torch.from_dlpack(cache.pool_view(0))
    assert tuple(k.shape) == tuple(v.shape) == (BATCH, SEQ, heads, dim)
    assert (k.data_ptr(), v.data_ptr()) == (cache.k_pool_ptr(0), cache.v_pool_ptr(0))
    pool.fill_(-1.0)
    k[1, 37, 1, 5] = 3.0  # slot 1, token 37: page 1 * 4 + 37 // 16 = 6, token 5
    v[1, 37, 1, 5] = 5.0
    assert pool[0, 6, 5, 1, 5].item() == 3.0
    assert pool[1, 6, 5, 1, 5].item() == 5.0
    assert int((pool != -1.0).sum().item()) == 2


@pytest.mark.parametrize("dtype", [kvcache.DataType.FLOAT16, kvcache.DataType.BFLOAT16, kvcache.DataType.FLOAT32,
                                   kvcache.DataType.FP8_E4M3, kvcache.DataType.FP8_E5M2, kvcache.DataType.INT8,
                                   kvcache.DataType.UINT8])
def test_every_cache_dtype_reaches_torch(torch, dtype):
    cache = make_cache(torch.cuda.current_stream(), dtype=dtype)
    pool = torch.from_dlpack(cache.pool_view(1))
    assert pool.dtype == torch_dtypes(torch)[dtype]
    assert pool.element_size() == kvcache.data_type_size(dtype)
    assert pool.data_ptr() == cache.k_pool_ptr(1)


def test_host_list_copy_moves_every_byte_of_every_layer(torch):
    # The cache has its own stream: torch's writes and reads are ordered against it by the stream arguments.
    cache = make_cache()
    current = torch.cuda.current_stream()
    pools = pools_of(torch, cache)
    before = fill_distinct(torch, pools)
    pairs = [(0, 5), (3, 1), (6, 2)]
    cache.copy_pages(pairs, stream=current)
    torch.cuda.synchronize()
    for pool, old in zip(pools, before):
        expected = old.clone()
        for src, dst in pairs:
            expected[:, dst] = old[:, src]
        assert torch.equal(pool.view(torch.int16), expected)

    # On the cache's stream; the next from_dlpack orders torch's stream after it with an event (no host sync).
    numpy = pytest.importorskip("numpy")
    current.synchronize()
    cache.copy_pages(numpy.array([[7, 4]], dtype=numpy.int32))
    again = torch.from_dlpack(cache.pool_view(0))
    assert torch.equal(again.view(torch.int16)[:, 4], before[0][:, 7])


def test_reset_pages_fills_the_pattern_and_nothing_else(torch):
    cache = make_cache(torch.cuda.current_stream())
    pools = pools_of(torch, cache)
    before = fill_distinct(torch, pools)
    cache.reset_pages([4, 0], pattern=0x3C003C00)  # two float16 1.0 values
    torch.cuda.synchronize()
    for pool, old in zip(pools, before):
        expected = old.clone()
        expected[:, [4, 0]] = 0x3C00
        assert torch.equal(pool.view(torch.int16), expected)


def test_bad_host_lists_raise_before_launching(torch):
    cache = make_cache(torch.cuda.current_stream())
    pools = pools_of(torch, cache)
    before = fill_distinct(torch, pools)
    with pytest.raises(IndexError):
        cache.copy_pages([(0, 1), (2, MIN_PAGES)])
    with pytest.raises(ValueError):
        cache.copy_pages([(0, 1), (2, 1)])  # a destination listed twice
    with pytest.raises(ValueError):
        cache.reset_pages([3, 3])
    with pytest.raises(IndexError):
        cache.pool_view(len(LAYERS))
    torch.cuda.synchronize()
    for pool, old in zip(pools, before):
        assert torch.equal(pool.view(torch.int16), old)


def test_cuda_graph_replays_copy_pages_with_updated_device_lists(torch):
    cache = make_cache(torch.cuda.current_stream())
    pools = pools_of(torch, cache)
    state = fill_distinct(torch, pools)
    capacity = 4
    pairs = torch.full((capacity, 2), kvcache.UNUSED_PAGE_ENTRY, dtype=torch.int32, device="cuda")
    count = torch.zeros(1, dtype=torch.int32, device="cuda")
    errors = torch.zeros(1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cache.copy_pages(pairs, stream=torch.cuda.current_stream(), count=count, error_count=errors)
    torch.cuda.synchronize()
    # Capturing ran nothing.
    for pool, old in zip(pools, state):
        assert torch.equal(pool.view(torch.int16), old)

    for lists in ([(0, 5), (3, 1)], [(2, 6), (7, 4), (99, 0)]):
        pairs.fill_(kvcache.UNUSED_PAGE_ENTRY)
        pairs[: len(lists)] = torch.tensor(lists, dtype=torch.int32, device="cuda")
        count.fill_(len(lists))
        graph.replay()
        torch.cuda.synchronize()
        expected = [old.clone() for old in state]
        for exp, old in zip(expected, state):
            for src, dst in lists:
                if src < MIN_PAGES:
                    exp[:, dst] = old[:, src]
        for pool, exp in zip(pools, expected):
            assert torch.equal(pool.view(torch.int16), exp)
        state = expected
    assert errors.item() == 1  # the (99, 0) pair: never dereferenced, counted once


def test_device_page_list_reset_and_the_cuda_array_interface(torch):
    cache = make_cache(torch.cuda.current_stream())
    pools = pools_of(torch, cache)
    before = fill_distinct(torch, pools)

    class InterfaceOnly:
        """A device array known only by __cuda_array_interface__ (as Numba or older CuPy offer)."""

        def __init__(self, tensor):
            self.tensor = tensor
            self.__cuda_array_interface__ = tensor.__cuda_array_interface__

    pages = torch.tensor([6, kvcache.UNUSED_PAGE_ENTRY, 1], dtype=torch.int32, device="cuda")
    cache.reset_pages(InterfaceOnly(pages), stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    for pool, old in zip(pools, before):
        expected = old.clone()
        expected[:, [6, 1]] = 0
        assert torch.equal(pool.view(torch.int16), expected)
    with pytest.raises(ValueError, match="int32"):
        cache.reset_pages(pages.to(torch.int64))


def test_streams_given_as_objects(torch):
    side = torch.cuda.Stream()
    cache = make_cache(side)
    assert cache.stream() == side.cuda_stream

    class ProtocolStream:
        def __init__(self, handle):
            self.handle = handle

        def __cuda_stream__(self):
            return (0, self.handle)

    pools = pools_of(torch, cache)
    before = fill_distinct(torch, pools)
    torch.cuda.synchronize()
    cache.copy_pages([(1, 0)], stream=ProtocolStream(side.cuda_stream))
    side.synchronize()
    assert torch.equal(pools[0].view(torch.int16)[:, 0], before[0][:, 1])


def test_views_keep_the_cache_alive_after_del(torch):
    cache = make_cache(torch.cuda.current_stream())
    alive = weakref.ref(cache)
    tensor = torch.from_dlpack(cache.pool_view(0))
    view = cache.k_pool(1)
    del cache
    gc.collect()
    assert alive() is not None
    tensor.fill_(1.5)
    torch.cuda.synchronize()
    assert tensor.float().mean().item() == 1.5
    del tensor
    gc.collect()
    assert alive() is not None  # the view still holds it
    del view
    gc.collect()
    assert alive() is None


def test_latent_layers_have_one_half(torch):
    cache = make_cache(torch.cuda.current_stream(), layers=[(1, 64, 0, kvcache.KVLayerKind.LATENT), (2, 32)])
    pool = torch.from_dlpack(cache.pool_view(0))
    assert tuple(pool.shape) == (1, MIN_PAGES, TOKENS, 1, 64)
    assert cache.v_pool_ptr(0) == 0
    with pytest.raises(ValueError, match="latent"):
        cache.v_pool(0)


def test_page_tables_are_device_tensors_at_fixed_addresses(torch):
    tables = kvcache.PageTableBuffers(4, 8, TOKENS, torch.cuda.current_stream())
    numpy = pytest.importorskip("numpy")
    tables.build([([3, 1, 7], 40), ([], 0), (numpy.array([5], dtype=numpy.int32), 16)])
    indptr = torch.from_dlpack(tables.indptr())
    block = torch.from_dlpack(tables.block_table())
    assert indptr.tolist() == [0, 3, 3, 4, 4]
    assert torch.from_dlpack(tables.indices())[:4].tolist() == [3, 1, 7, 5]
    assert torch.from_dlpack(tables.last_page_len()).tolist() == [40 - 2 * TOKENS, 0, TOKENS, 0]
    unused = kvcache.UNUSED_PAGE_ENTRY
    assert block.tolist() == [[3, 1, 7] + [unused] * 5, [unused] * 8, [5] + [unused] * 7, [unused] * 8]
    address = indptr.data_ptr()
    tables.build([([2], 1)])
    assert torch.from_dlpack(tables.indptr()).data_ptr() == address
    assert indptr.tolist() == [0, 1, 1, 1, 1]
    with pytest.raises(ValueError):
        tables.build([([1, 2], 1)])  # 1 token cannot fill 2 pages
    assert tables.count() == 1


def test_the_paged_attention_example_runs(torch):
    example = Path(__file__).resolve().parents[2] / "examples" / "python" / "paged_attention.py"
    result = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "max abs error" in result.stdout
