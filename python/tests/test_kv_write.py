"""write_tokens / read_tokens / write_tokens_paged through torch, and the page tables' per-sequence arrays. Each GPU test
takes the `torch` fixture (skipped without a GPU or torch, failed under KVCACHE_REQUIRE_GPU=1). Expectations are
computed in torch from the inputs and the pool views (conversions by torch's own casts), never by kvcache."""

import pytest

import kvcache

TOKENS = 16
SEQ = 128
BATCH = 2
UNUSED = kvcache.UNUSED_PAGE_ENTRY


def make_cache(torch, dtype, layers):
    config = kvcache.Config(layer_configs=layers, max_batch_size=BATCH, max_sequence_length=SEQ,
                            tokens_per_page=TOKENS, kv_cache_type=dtype, max_tokens_per_step=16)
    return kvcache.KVCacheManager(config, torch.cuda.current_stream())


def torch_type(torch, dtype):
    return {kvcache.DataType.FLOAT16: torch.float16, kvcache.DataType.BFLOAT16: torch.bfloat16,
            kvcache.DataType.FLOAT32: torch.float32}[dtype]


def poisoned_pool(torch, cache, layer):
    pool = torch.from_dlpack(cache.pool_view(layer))
    pool.view(torch.uint8).fill_(0x7B)
    torch.cuda.synchronize()
    return pool


def strided_tokens(torch, n, heads, dim, dtype, seed):
    """[n, heads, dim] with a token stride and a head stride beyond the packed ones (a slice of a larger tensor)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    big = torch.randn(n, heads + 1, dim + 8, device="cuda", generator=generator).to(dtype)
    return big[:, :heads, :dim]


def mixed_addresses(torch, n, slots, seed):
    """n distinct addresses of [0, slots), every fifth one skipped (-1)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    addresses = torch.randperm(slots, device="cuda", generator=generator)[:n].to(torch.int64)
    addresses[4::5] = -1
    return addresses


@pytest.mark.parametrize("cache_dtype", [kvcache.DataType.FLOAT16, kvcache.DataType.BFLOAT16,
                                         kvcache.DataType.FLOAT32])
@pytest.mark.parametrize("input_name", ["float16", "bfloat16", "float32"])
def test_write_tokens_converts_and_places_every_token(torch, cache_dtype, input_name):
    heads, dim = 2, 32
    cache = make_cache(torch, cache_dtype, [(heads, dim), (1, 16)])
    stream = torch.cuda.current_stream()
    pool = poisoned_pool(torch, cache, 0)
    before = pool.clone()
    slots = pool.shape[1] * TOKENS
    n = 40
    k = strided_tokens(torch, n, heads, dim, getattr(torch, input_name), 1)
    v = strided_tokens(torch, n, heads, dim, getattr(torch, input_name), 2)
    addresses = mixed_addresses(torch, n, slots, 3)
    errors = torch.zeros(1, dtype=torch.int32, device="cuda")
    kvcache.write_tokens(cache, 0, k, v, addresses, stream, error_count=errors, group=0)
    torch.cuda.synchronize()

    cache_type = torch_type(torch, cache_dtype)
    expected = before.clone()
    valid = addresses >= 0
    for half, source in ((0, k), (1, v)):
        flat = expected[half].view(slots, heads, dim)
        flat[addresses[valid]] = source[valid].to(cache_type)
    assert torch.equal(pool.view(torch.uint8), expected.view(torch.uint8))
    assert errors.item() == 0

    # Read back into the cache's type: exactly what the pool holds; skipped rows keep their poison.
    k_out = torch.full((n, heads, dim), 7, dtype=cache_type, device="cuda")
    v_out = torch.full((n, heads, dim), 7, dtype=cache_type, device="cuda")
    kvcache.read_tokens(cache, 0, k_out, v_out, addresses, stream)
    torch.cuda.synchronize()
    for out, source in ((k_out, k), (v_out, v)):
        assert torch.equal(out[valid].view(torch.uint8), source[valid].to(cache_type).contiguous().view(torch.uint8))
        assert bool((out[~valid] == 7).all())


def test_bad_addresses_are_counted_and_count_limits_the_tokens(torch):
    cache = make_cache(torch, kvcache.DataType.FLOAT16, [(1, 16)])
    stream = torch.cuda.current_stream()
    pool = poisoned_pool(torch, cache, 0)
    slots = pool.shape[1] * TOKENS
    before = pool.clone()
    k = torch.randn(6, 1, 16, device="cuda").half()
    v = torch.randn(6, 1, 16, device="cuda").half()
    addresses = torch.tensor([0, slots, 5, slots + 100, 9, 11], dtype=torch.int64, device="cuda")
    count = torch.tensor([5], dtype=torch.int32, device="cuda")
    errors = torch.zeros(1, dtype=torch.int32, device="cuda")
    kvcache.write_tokens(cache, 0, k, v, addresses, stream, count=count, error_count=errors)
    torch.cuda.synchronize()
    assert errors.item() == 2
    expected = before.clone()
    for i in (0, 2, 4):  # token 5 lies past the count
        expected[0].view(slots, 1, 16)[addresses[i]] = k[i]
        expected[1].view(slots, 1, 16)[addresses[i]] = v[i]
    assert torch.equal(pool.view(torch.int16), expected.view(torch.int16))


def test_bad_arguments_raise_before_launching(torch):
    cache = make_cache(torch, kvcache.DataType.FLOAT16, [(2, 32), (1, 64, 0, kvcache.KVLayerKind.LATENT)])
    k = torch.zeros(4, 2, 32, device="cuda", dtype=torch.float16)
    addresses = torch.zeros(4, dtype=torch.int64, device="cuda")
    with pytest.raises(kvcache.InvalidArgumentError, match="k has shape"):
        kvcache.write_tokens(cache, 0, k[:, :1], k, addresses)
    with pytest.raises(kvcache.InvalidArgumentError, match="DLPack type code"):
        kvcache.write_tokens(cache, 0, k.int(), k, addresses)
    with pytest.raises(kvcache.InvalidArgumentError, match="latent"):
        kvcache.write_tokens(cache, 1, torch.zeros(4, 1, 64, device="cuda").half(), k, addresses)
    with pytest.raises(kvcache.InvalidArgumentError, match="token_addresses"):
        kvcache.write_tokens(cache, 0, k, k, addresses[:3])
    with pytest.raises(kvcache.InvalidArgumentError, match="contiguous"):
        kvcache.read_tokens(cache, 0, k.transpose(0, 1).contiguous().transpose(0, 1), k, addresses)
    with pytest.raises(kvcache.OutOfRangeError, match="layerIdx is 5"):
        kvcache.write_tokens(cache, 5, k, k, addresses)


def test_latent_layers_write_k_alone_and_show_through_the_latent_pool_view(torch):
    rank, rope = 48, 16
    cache = make_cache(torch, kvcache.DataType.BFLOAT16, [(1, rank + rope, 0, kvcache.KVLayerKind.LATENT), (2, 32)])
    view = torch.from_dlpack(cache.latent_pool_view(0))
    assert tuple(view.shape) == (cache.num_pages(), TOKENS, rank + rope)
    assert view.data_ptr() == cache.k_pool_ptr(0)
    with pytest.raises(kvcache.InvalidArgumentError, match="latent"):
        cache.latent_pool_view(1)
    view.view(torch.uint8).fill_(0x7B)
    n = 20
    latent = torch.randn(n, 1, rank + rope, device="cuda", dtype=torch.bfloat16)
    addresses = torch.arange(n, dtype=torch.int64, device="cuda") + 3 * TOKENS
    kvcache.write_tokens(cache, 0, latent, None, addresses, torch.cuda.current_stream())
    torch.cuda.synchronize()
    ckv, kpe = view[..., :rank], view[..., rank:]
    flat_ckv = ckv.reshape(-1, rank)
    flat_kpe = kpe.reshape(-1, rope)
    assert torch.equal(flat_ckv[addresses], latent[:, 0, :rank])
    assert torch.equal(flat_kpe[addresses], latent[:, 0, rank:])


def test_windowed_tables_leave_released_pages_out(torch):
    tables = kvcache.PageTableBuffers(3, 8, TOKENS, torch.cuda.current_stream())
    tables.build([([UNUSED, UNUSED, 3, 5], 60), ([6, 0], 20), ([], 0)])
    torch.cuda.synchronize()
    assert torch.from_dlpack(tables.indptr()).tolist() == [0, 2, 4, 4]
    assert torch.from_dlpack(tables.indices())[:4].tolist() == [3, 5, 6, 0]
    assert torch.from_dlpack(tables.first_token()).tolist() == [2 * TOKENS, 0, 0]
    assert torch.from_dlpack(tables.resident_tokens()).tolist() == [60 - 2 * TOKENS, 20, 0]
    assert tables.host_first_token() == [2 * TOKENS, 0, 0]
    assert tables.host_resident_tokens() == [60 - 2 * TOKENS, 20, 0]
    assert torch.from_dlpack(tables.block_table())[0].tolist() == [3, 5] + [UNUSED] * 6
    with pytest.raises(kvcache.InvalidArgumentError, match=r"pages\[1\] is -1"):
        tables.build([([3, UNUSED, 5], 40)])


def test_the_paged_form_writes_what_the_address_form_writes(torch):
    cache = make_cache(torch, kvcache.DataType.FLOAT16, [(2, 32), (1, 16, 32)])
    stream = torch.cuda.current_stream()
    layer = 1  # the windowed layer's own group
    tables = kvcache.PageTableBuffers(2, 8, TOKENS, stream)
    tables.build([([UNUSED, UNUSED, 3, 5], 60), ([6, 0, 2], 40)])
    positions = torch.tensor([[0, 32], [0, 59], [1, 0], [1, 39], [-1, 0], [0, 31], [1, 48], [2, 0]],
                             dtype=torch.int32, device="cuda")
    # The same tokens as addresses, from the rows above: resident pages from the first token on.
    addresses = torch.tensor([3 * TOKENS + 0, 5 * TOKENS + 11, 6 * TOKENS + 0, 2 * TOKENS + 7, -1, 10**9, 10**9, 10**9],
                             dtype=torch.int64, device="cuda")
    k = torch.randn(8, 1, 16, device="cuda").half()
    v = torch.randn(8, 1, 16, device="cuda").half()
    results = []
    for paged in (True, False):
        pool = poisoned_pool(torch, cache, layer)
        errors = torch.zeros(1, dtype=torch.int32, device="cuda")
        if paged:
            kvcache.write_tokens_paged(cache, layer, k, v, tables.indptr(),
                                       tables.indices(), tables.first_token(), positions, stream, error_count=errors)
        else:
            kvcache.write_tokens(cache, layer, k, v, addresses, stream, error_count=errors)
        torch.cuda.synchronize()
        assert errors.item() == 3
        results.append(pool.clone())
    assert torch.equal(results[0].view(torch.int16), results[1].view(torch.int16))


def test_a_captured_write_replays_with_new_addresses(torch):
    cache = make_cache(torch, kvcache.DataType.FLOAT16, [(2, 32)])
    pool = poisoned_pool(torch, cache, 0)
    slots = pool.shape[1] * TOKENS
    k = torch.randn(8, 2, 32, device="cuda").half()
    v = torch.randn(8, 2, 32, device="cuda").half()
    addresses = torch.full((8,), -1, dtype=torch.int64, device="cuda")
    count = torch.zeros(1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kvcache.write_tokens(cache, 0, k, v, addresses, torch.cuda.current_stream(), count=count)
    torch.cuda.synchronize()
    for shift, used in ((0, 8), (40, 3)):
        pool.view(torch.uint8).fill_(0x7B)
        before = pool.clone()
        addresses.copy_(torch.arange(8, device="cuda") * 3 + shift)
        count.fill_(used)
        graph.replay()
        torch.cuda.synchronize()
        expected = before.clone()
        expected[0].view(slots, 2, 32)[addresses[:used]] = k[:used]
        expected[1].view(slots, 2, 32)[addresses[:used]] = v[:used]
        assert torch.equal(pool.view(torch.int16), expected.view(torch.int16))
