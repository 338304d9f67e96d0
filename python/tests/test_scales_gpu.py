"""Quantized caches' scales through torch: the scale pool views (shape, dtype, strides, placement), the scales the
write op stores in them, the host-held layer scales and what misuse raises. Each test takes the `torch` fixture:
skipped without a GPU or torch, failed under KVCACHE_REQUIRE_GPU=1. Expected shapes and sizes come from the geometry
below, expected scales and codes from torch on the host (float32 divisions between tensors, torch's own float8
conversion) by docs/layout.md's "Quantization rules", never from kvcache."""

import gc
import math
import weakref

import pytest

import kvcache
from kvcache import _kvcache

TOKENS = 16
SEQ = 64
BATCH = 2
PAGES = BATCH * SEQ // TOKENS  # 8 pages a half: the minimum, the only page group
LATENT = kvcache.KVLayerKind.LATENT
# (heads, head_dim, halves) of each layer: two KV layers around a latent one. Head dims are multiples of 16.
LAYERS = [(2, 32, 2), (1, 64, 1), (4, 16, 2)]
CONFIGS = [(2, 32), (1, 64, 0, LATENT), (4, 16)]
FP8_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
POISON = 0x7B
# DLPack type codes from the specification (dlpack.h): kDLFloat 2, kDLFloat8_e4m3fn 10.
DLPACK_FLOAT32 = (2, 32, 1)
DLPACK_FP8_E4M3FN = (10, 8, 1)
Q = kvcache.KVQuantization
STORAGE = {Q.NONE: kvcache.DataType.FLOAT16, Q.FP8_PER_TENSOR: kvcache.DataType.FP8_E4M3,
           Q.FP8_PER_TOKEN_HEAD: kvcache.DataType.FP8_E4M3, Q.NVFP4: kvcache.DataType.UINT8}
# Each written token: (table row, position); the rows' pages below.
ROWS = [[3, 5, 0, 6], [7, 1]]
POSITIONS = [(0, p) for p in range(0, 40, 3)] + [(1, p) for p in range(1, 20, 2)]


def make_cache(torch, quantization, layers=CONFIGS):
    config = kvcache.Config(layer_configs=layers, max_batch_size=BATCH, max_sequence_length=SEQ,
                            tokens_per_page=TOKENS, kv_cache_type=STORAGE[quantization], quantization=quantization)
    return kvcache.KVCacheManager(config, torch.cuda.current_stream())


def contiguous_strides(shape):
    strides, step = [], 1
    for extent in reversed(shape):
        strides.insert(0, step)
        step *= extent
    return tuple(strides)


def divide(torch, a, b):
    """a / b elementwise in float32 on the host, b a tensor of a's shape (no scalar path that might multiply by a
    reciprocal instead)."""
    return a / (b if isinstance(b, torch.Tensor) else torch.full_like(a, b))


def token_values(torch, heads, dim, seed):
    """[n, heads, dim] float32 on the GPU, magnitudes from 1e-3 to 1e3 across tokens, one head of zeros."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    n = len(POSITIONS)
    magnitudes = torch.logspace(-3, 3, n, device="cuda")[:, None, None]
    values = torch.randn(n, heads, dim, device="cuda", generator=generator) * magnitudes
    values[1, heads - 1] = 0.0
    return values


def placement(torch):
    """Pages, offsets and token addresses (CPU int64) of POSITIONS in ROWS."""
    pages = torch.tensor([ROWS[row][position // TOKENS] for row, position in POSITIONS])
    offsets = torch.tensor([position % TOKENS for _, position in POSITIONS])
    return pages, offsets, pages * TOKENS + offsets


def write_paged(torch, cache, layer, k, v):
    """Writes k and v at POSITIONS through write_tokens_paged and the CSR table of ROWS; no bad position."""
    stream = torch.cuda.current_stream()
    tables = kvcache.PageTableBuffers(BATCH, SEQ // TOKENS, TOKENS, stream)
    tables.build([(row, len(row) * TOKENS) for row in ROWS])
    positions = torch.tensor(POSITIONS, dtype=torch.int32, device="cuda")
    errors = torch.zeros(1, dtype=torch.int32, device="cuda")
    kvcache.write_tokens_paged(cache, layer, k, v, tables.indptr(), tables.indices(), tables.first_token(), positions,
                               stream, error_count=errors)
    torch.cuda.synchronize()
    assert errors.item() == 0


def per_token_head(torch, values):
    """docs/layout.md's FP8 per token and head on the host: (scales [n, H] = amax / 448, codes [n, H, D] as uint8)."""
    values = values.cpu()
    scales = divide(torch, values.abs().amax(dim=-1), FP8_MAX)
    divisors = scales[..., None].expand_as(values).contiguous()
    scaled = torch.where(divisors > 0, divide(torch, values, divisors), values * 0.0)  # zero scale: signed zeros
    return scales, scaled.to(torch.float8_e4m3fn).view(torch.uint8)


def nvfp4_block_scales(torch, values, global_scale):
    """docs/layout.md's NVFP4 block scale codes [n, H, D/16] (uint8) for the half's global scale `global_scale`."""
    n, heads, dim = values.shape
    amax = values.cpu().view(n, heads, dim // NVFP4_BLOCK, NVFP4_BLOCK).abs().amax(dim=-1)
    blocks = divide(torch, divide(torch, amax, E2M1_MAX), global_scale)
    return blocks.clamp(max=FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)  # E4M3 saturates at 448


@pytest.mark.parametrize("quantization", [Q.FP8_PER_TOKEN_HEAD, Q.NVFP4])
def test_scale_views_follow_the_geometry(torch, quantization):
    cache = make_cache(torch, quantization)
    per_token = quantization == Q.FP8_PER_TOKEN_HEAD
    spans = []
    for layer, (heads, dim, halves) in enumerate(LAYERS):
        view = cache.scale_pool_view(layer)
        shape = (halves, PAGES, TOKENS, heads) if per_token else (halves, PAGES, TOKENS, heads, dim // NVFP4_BLOCK)
        element_bytes = 4 if per_token else 1
        assert view.shape == shape and view.ndim == len(shape)
        assert view.strides == contiguous_strides(shape)
        assert view.dtype == (kvcache.DataType.FLOAT32 if per_token else kvcache.DataType.FP8_E4M3)
        assert view.nbytes == math.prod(shape) * element_bytes == cache.layout().layers[layer].scale_bytes
        assert view.owner is cache
        assert view.__dlpack_device__() == (2, cache.device())  # kDLCUDA
        capsule = _kvcache._describe_capsule(view.__dlpack__(stream=-1, max_version=(1, 0)))
        assert capsule["dtype"] == (DLPACK_FLOAT32 if per_token else DLPACK_FP8_E4M3FN)
        assert (capsule["shape"], capsule["strides"], capsule["data"]) == (shape, view.strides, view.data_ptr)
        scales = torch.from_dlpack(view)
        assert scales.dtype == (torch.float32 if per_token else torch.float8_e4m3fn)
        assert tuple(scales.shape) == shape and scales.stride() == view.strides and scales.is_contiguous()
        assert scales.data_ptr() == view.data_ptr and scales.device == torch.device("cuda", cache.device())
        assert view.data_ptr % 256 == 0  # an allocation of its own
        pool = cache.pool_view(layer)
        spans += [(view.data_ptr, view.data_ptr + view.nbytes), (pool.data_ptr, pool.data_ptr + pool.nbytes)]
    spans.sort()
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # nothing overlaps


def test_the_write_stores_amax_over_448_a_token_and_head(torch):
    cache = make_cache(torch, Q.FP8_PER_TOKEN_HEAD)
    layer = 0
    heads, dim, _ = LAYERS[layer]
    scales = torch.from_dlpack(cache.scale_pool_view(layer))
    pool = torch.from_dlpack(cache.pool_view(layer))
    assert pool.dtype == torch.float8_e4m3fn
    scales.fill_(-1.0)
    pool.view(torch.uint8).fill_(POISON)
    k = token_values(torch, heads, dim, 1)
    v = token_values(torch, heads, dim, 2) * 0.5
    write_paged(torch, cache, layer, k, v)

    pages, offsets, addresses = placement(torch)
    expected_scales = torch.full(tuple(scales.shape), -1.0)
    expected_codes = torch.full(tuple(pool.shape), POISON, dtype=torch.uint8)
    for half, values in ((0, k), (1, v)):
        half_scales, codes = per_token_head(torch, values)
        assert bool((half_scales[1, heads - 1] == 0).all())  # the zero head
        expected_scales[half, pages, offsets] = half_scales
        expected_codes[half, pages, offsets] = codes
    assert torch.equal(scales.cpu(), expected_scales)  # every written scale, and nothing else touched
    assert torch.equal(pool.view(torch.uint8).cpu(), expected_codes)

    # Read back: code times scale.
    k_out = torch.zeros(len(POSITIONS), heads, dim, device="cuda")
    v_out = torch.zeros_like(k_out)
    kvcache.read_tokens(cache, layer, k_out, v_out, addresses.cuda(), torch.cuda.current_stream())
    torch.cuda.synchronize()
    for half, out in ((0, k_out), (1, v_out)):
        codes = expected_codes[half, pages, offsets].view(torch.float8_e4m3fn).float()
        assert torch.equal(out.cpu(), codes * expected_scales[half, pages, offsets][..., None])


@pytest.mark.parametrize("quantization", [Q.FP8_PER_TOKEN_HEAD, Q.NVFP4])
def test_a_latent_layer_has_one_half_of_scales(torch, quantization):
    cache = make_cache(torch, quantization)
    layer = 1
    heads, dim, _ = LAYERS[layer]
    scales = torch.from_dlpack(cache.scale_pool_view(layer))
    assert scales.shape[0] == 1
    scales.view(torch.uint8).fill_(POISON)
    latent = token_values(torch, heads, dim, 3)
    if quantization == Q.NVFP4:
        global_scale = float(divide(torch, latent.abs().amax().cpu(), FP8_MAX * E2M1_MAX))
        cache.set_layer_scales(layer, kvcache.LayerScales(global_scale, 1.0))  # v: kept, unused
        expected = nvfp4_block_scales(torch, latent, global_scale)
    else:
        expected = per_token_head(torch, latent)[0].view(torch.uint8).view(len(POSITIONS), heads, 4)
    pages, offsets, addresses = placement(torch)
    kvcache.write_tokens(cache, layer, latent, None, addresses.cuda(), torch.cuda.current_stream())
    torch.cuda.synchronize()
    bytes_view = scales.view(torch.uint8).cpu()
    written = torch.full(tuple(bytes_view.shape), POISON, dtype=torch.uint8)
    written.view(1, PAGES, TOKENS, heads, -1)[0, pages, offsets] = expected
    assert torch.equal(bytes_view, written)


def test_nvfp4_block_scales_follow_the_set_global_scales(torch):
    cache = make_cache(torch, Q.NVFP4)
    layer = 0
    heads, dim, _ = LAYERS[layer]
    scales = torch.from_dlpack(cache.scale_pool_view(layer))
    assert scales.dtype == torch.float8_e4m3fn
    assert tuple(torch.from_dlpack(cache.pool_view(layer)).shape) == (2, PAGES, TOKENS, heads, dim // 2)
    scales.view(torch.uint8).fill_(POISON)
    k = token_values(torch, heads, dim, 4)
    v = token_values(torch, heads, dim, 5) * 3.0
    # The calibration docs/layout.md names: amax of the half / (448 * 6), here a float32 value.
    global_scales = [float(divide(torch, values.abs().amax().cpu(), FP8_MAX * E2M1_MAX)) for values in (k, v)]
    assert cache.layer_scales(layer) == kvcache.LayerScales(1.0, 1.0)
    cache.set_layer_scales(layer, kvcache.LayerScales(*global_scales))
    assert cache.layer_scales(layer) == kvcache.LayerScales(*global_scales)
    write_paged(torch, cache, layer, k, v)

    pages, offsets, _ = placement(torch)
    expected = torch.full(tuple(scales.shape), POISON, dtype=torch.uint8)
    for half, (values, global_scale) in enumerate(zip((k, v), global_scales)):
        expected[half, pages, offsets] = nvfp4_block_scales(torch, values, global_scale)
    assert torch.equal(scales.view(torch.uint8).cpu(), expected)
    assert int(expected[0, pages, offsets].max()) == 0x7E  # the largest block lands on 448, as calibrated


def test_the_per_tensor_write_divides_by_the_set_scales(torch):
    cache = make_cache(torch, Q.FP8_PER_TENSOR)
    layer = 0
    heads, dim, _ = LAYERS[layer]
    set_scales = kvcache.LayerScales(0.5, 0.25)
    cache.set_layer_scales(layer, set_scales)
    pool = torch.from_dlpack(cache.pool_view(layer))
    pool.view(torch.uint8).fill_(POISON)
    generator = torch.Generator(device="cuda").manual_seed(6)
    k, v = (torch.randn(len(POSITIONS), heads, dim, device="cuda", generator=generator) for _ in range(2))
    write_paged(torch, cache, layer, k, v)
    pages, offsets, _ = placement(torch)
    expected = torch.full(tuple(pool.shape), POISON, dtype=torch.uint8)
    for half, (values, scale) in enumerate(((k, set_scales.k), (v, set_scales.v))):
        codes = divide(torch, values.cpu(), scale).to(torch.float8_e4m3fn).view(torch.uint8)
        expected[half, pages, offsets] = codes
    assert torch.equal(pool.view(torch.uint8).cpu(), expected)


def test_scale_views_keep_the_cache_alive(torch):
    cache = make_cache(torch, Q.FP8_PER_TOKEN_HEAD)
    alive = weakref.ref(cache)
    scales = torch.from_dlpack(cache.scale_pool_view(0))
    view = cache.scale_pool_view(2)
    del cache
    gc.collect()
    assert alive() is not None
    scales.fill_(0.5)
    torch.cuda.synchronize()
    assert scales.mean().item() == 0.5
    del scales
    gc.collect()
    assert alive() is not None  # the view still holds it
    del view
    gc.collect()
    assert alive() is None


def test_scale_calls_name_the_layer_and_the_quantization(torch):
    per_token = make_cache(torch, Q.FP8_PER_TOKEN_HEAD)
    for bad in (3, -1):
        with pytest.raises(kvcache.OutOfRangeError,
                           match=rf"KVCacheManager::scalePoolView: layer index {bad} is out of range \[0, 3\)"):
            per_token.scale_pool_view(bad)
    with pytest.raises(IndexError, match=r"layer index is 1099511627776; it must be in \[0, 3\)"):
        per_token.scale_pool_view(2**40)
    for call, name in ((per_token.layer_scales, "layerScales"),
                       (lambda layer: per_token.set_layer_scales(layer, kvcache.LayerScales()), "setLayerScales")):
        with pytest.raises(kvcache.InvalidArgumentError,
                           match=rf"KVCacheManager::{name}: KVCacheConfig.quantization is fp8_per_token_head, which "
                                 r"keeps no host-held layer scales; they exist for fp8_per_tensor and nvfp4"):
            call(0)
        with pytest.raises(kvcache.OutOfRangeError, match=rf"KVCacheManager::{name}: layer index 3 is out of range"):
            call(3)

    plain = make_cache(torch, Q.NONE)
    with pytest.raises(ValueError, match=r"KVCacheManager::scalePoolView: KVCacheConfig.quantization is none, which "
                                         r"keeps no scale pools; they exist for fp8_per_token_head and nvfp4"):
        plain.scale_pool_view(0)
    with pytest.raises(kvcache.InvalidArgumentError, match="quantization is none, which keeps no host-held"):
        plain.layer_scales(0)

    per_tensor = make_cache(torch, Q.FP8_PER_TENSOR)
    with pytest.raises(kvcache.InvalidArgumentError, match="is fp8_per_tensor, which keeps no scale pools"):
        per_tensor.scale_pool_view(0)
    with pytest.raises(TypeError):
        per_tensor.set_layer_scales(0, (0.5, 0.5))


@pytest.mark.parametrize("quantization, limit", [(Q.FP8_PER_TENSOR, ">= 0"), (Q.NVFP4, "> 0")])
def test_set_layer_scales_refuses_a_bad_scale_and_changes_nothing(torch, quantization, limit):
    cache = make_cache(torch, quantization)
    name = "fp8_per_tensor" if quantization == Q.FP8_PER_TENSOR else "nvfp4"
    for layer in range(len(LAYERS)):
        assert cache.layer_scales(layer) == kvcache.LayerScales(1.0, 1.0)
    kept = kvcache.LayerScales(0.1, 2.0)
    cache.set_layer_scales(2, kept)
    assert cache.layer_scales(2) == kept and cache.layer_scales(2).k != 0.1  # float32
    copy = cache.layer_scales(2)
    copy.k = 4.0  # a copy: the cache keeps its own
    assert cache.layer_scales(2) == kept
    bad = [("k", float("nan"), 1.0, "nan"), ("v", 1.0, -1.0, "-1"), ("k", float("inf"), 1.0, "inf"),
           ("v", 1.0, float("-inf"), "-inf")]
    if quantization == Q.NVFP4:
        bad.append(("k", 0.0, 1.0, "0"))
    else:
        cache.set_layer_scales(0, kvcache.LayerScales(0.0, 0.0))  # per tensor: a zero scale is allowed
        assert cache.layer_scales(0) == kvcache.LayerScales(0.0, 0.0)
        cache.set_layer_scales(0, kvcache.LayerScales())
    for field, k, v, shown in bad:
        with pytest.raises(kvcache.InvalidArgumentError,
                           match=rf"KVCacheManager::setLayerScales: LayerScales\.{field} of layer 2 is {shown}; "
                                 rf"quantization {name} needs a finite scale {limit}"):
            cache.set_layer_scales(2, kvcache.LayerScales(k, v))
        assert cache.layer_scales(2) == kept
    with pytest.raises(kvcache.OutOfRangeError, match="layer index 3 is out of range"):
        cache.set_layer_scales(3, kvcache.LayerScales(float("nan")))  # the index first


def test_a_sequence_file_records_the_set_scales(torch, tmp_path):
    layers = [(2, 32), (1, 32, 0, LATENT)]
    cache = make_cache(torch, Q.FP8_PER_TENSOR, layers)
    cache.set_layer_scales(0, kvcache.LayerScales(0.5, 0.25))
    cache.set_layer_scales(1, kvcache.LayerScales(0.75, 2.0))
    tier = kvcache.HostTier(cache, 0, 2)
    host_pages = tier.allocate_host_pages(1)
    path = tmp_path / "scaled.kvseq"
    kvcache.save_sequence(path, tier, host_pages, 10)
    recorded = kvcache.read_sequence_file_info(path).layer_scales
    # The latent layer has no V: the file records 0 for it.
    assert recorded == [kvcache.LayerScales(0.5, 0.25), kvcache.LayerScales(0.75, 0.0)]

    fresh = make_cache(torch, Q.FP8_PER_TENSOR, layers)
    fresh_tier = kvcache.HostTier(fresh, 0, 2)
    mismatch = r"its layerScales\[0\]\.k is 0\.5; the destination's is 1 "
    with pytest.raises(kvcache.InvalidArgumentError, match=mismatch):
        kvcache.load_sequence(path, fresh_tier, [0])
    for layer, scales in enumerate(recorded):  # the restore docs/layout.md describes
        fresh.set_layer_scales(layer, scales)
    assert kvcache.load_sequence(path, fresh_tier, [0]) == 10


@pytest.mark.parametrize("quantization", list(STORAGE), ids=lambda quantization: quantization.name)
def test_attention_arguments_carry_each_formats_scales(torch, quantization):
    cache = make_cache(torch, quantization)
    host_scales = quantization in (Q.FP8_PER_TENSOR, Q.NVFP4)
    set_scales = [kvcache.LayerScales(0.25, 0.75), kvcache.LayerScales(0.5, 0.125), kvcache.LayerScales(2.0, 4.0)]
    if host_scales:
        for layer, scales in enumerate(set_scales):
            cache.set_layer_scales(layer, scales)
    for layer, (heads, dim, halves) in enumerate(LAYERS):
        arguments = cache.attention_arguments(layer)
        assert arguments["quantization"] == quantization
        # What a kernel multiplies by: the host scales where the format has them (none for a latent layer's V).
        k_scale = set_scales[layer].k if host_scales else 1.0
        v_scale = set_scales[layer].v if host_scales and halves == 2 else 1.0
        assert (arguments["k_scale"], arguments["v_scale"]) == (k_scale, v_scale)
        assert arguments["token_head_scales"] == (quantization == Q.FP8_PER_TOKEN_HEAD)
        assert arguments["tensor_core_decode"] == (quantization in (Q.FP8_PER_TOKEN_HEAD, Q.NVFP4))
        if quantization not in (Q.FP8_PER_TOKEN_HEAD, Q.NVFP4):
            assert arguments["k_scale_pool"] is None and arguments["v_scale_pool"] is None
            continue
        # The halves of the scale pool: K at its start, V one half (PAGES pages of TOKENS x heads scales) on.
        shape = (PAGES, TOKENS, heads) if quantization == Q.FP8_PER_TOKEN_HEAD else (PAGES, TOKENS, heads, dim // 16)
        half_bytes = math.prod(shape) * (4 if quantization == Q.FP8_PER_TOKEN_HEAD else 1)
        base = torch.from_dlpack(cache.scale_pool_view(layer)).data_ptr()
        k_pool = torch.from_dlpack(arguments["k_scale_pool"])
        assert tuple(k_pool.shape) == shape and k_pool.data_ptr() == base
        assert k_pool.dtype == (torch.float32 if quantization == Q.FP8_PER_TOKEN_HEAD else torch.float8_e4m3fn)
        if halves == 1:
            assert arguments["v_scale_pool"] is None
        else:
            v_pool = torch.from_dlpack(arguments["v_scale_pool"])
            assert tuple(v_pool.shape) == shape and v_pool.data_ptr() == base + half_bytes
    with pytest.raises(kvcache.OutOfRangeError, match="attentionArguments: layer index 3"):
        cache.attention_arguments(3)


def write_counted(torch, cache, layer, k, v, counters):
    """Writes k and v at POSITIONS (token addresses from ROWS), counting into `counters`."""
    _, _, addresses = placement(torch)
    kvcache.write_tokens(cache, layer, k, v, addresses.cuda(), torch.cuda.current_stream(), counters=counters)


@pytest.mark.parametrize("quantization", [Q.FP8_PER_TENSOR, Q.FP8_PER_TOKEN_HEAD, Q.NVFP4],
                         ids=lambda quantization: quantization.name)
def test_write_counters_record_the_amax_and_calibrate_the_scales(torch, quantization):
    cache = make_cache(torch, quantization)
    layer = 0
    heads, dim, _ = LAYERS[layer]
    k = token_values(torch, heads, dim, 11)
    v = 3 * token_values(torch, heads, dim, 12)  # distinct halves, distinct amax
    counters = kvcache.WriteCounters(cache)
    assert counters.num_layers == 3
    # Poisoned pages; counters starting from values that are not zero, so that a raise shows as one.
    torch.from_dlpack(cache.pool_view(layer)).view(torch.uint8).fill_(POISON)
    amax = torch.from_dlpack(counters.amax())
    saturated = torch.from_dlpack(counters.saturated())
    assert tuple(amax.shape) == (3, 2) and tuple(saturated.shape) == (3, 2)
    amax.fill_(0.5)
    saturated.fill_(7)
    if quantization != Q.FP8_PER_TOKEN_HEAD:
        # Scales four times too small: the largest values clip.
        divisor = FP8_MAX if quantization == Q.FP8_PER_TENSOR else FP8_MAX * E2M1_MAX
        cache.set_layer_scales(layer, kvcache.LayerScales(*(float(x.abs().max()) / divisor / 4 for x in (k, v))))
    write_counted(torch, cache, layer, k, v, counters)
    observed = counters.read()
    assert len(observed) == 3
    assert observed[layer].k_amax == float(k.abs().max()) and observed[layer].v_amax == float(v.abs().max())
    assert (observed[1].k_amax, observed[1].k_saturated) == (0.5, 7)  # other layers untouched
    assert torch.equal(amax[layer].cpu(), torch.tensor([observed[layer].k_amax, observed[layer].v_amax]))
    if quantization == Q.FP8_PER_TENSOR:
        # |x / s| > 464 clips (up to 464 rounds to 448): counted in torch from the inputs.
        scales = cache.layer_scales(layer)
        expected = [int((divide(torch, x.cpu(), s).abs() > 464).sum()) for x, s in ((k, scales.k), (v, scales.v))]
        assert (observed[layer].k_saturated, observed[layer].v_saturated) == (7 + expected[0], 7 + expected[1])
        assert expected[0] > 0 and expected[1] > 0
    elif quantization == Q.FP8_PER_TOKEN_HEAD:
        assert (observed[layer].k_saturated, observed[layer].v_saturated) == (7, 7)  # amax / 448 never clips
    else:
        assert observed[layer].k_saturated > 7 and observed[layer].v_saturated > 7
    if quantization == Q.FP8_PER_TOKEN_HEAD:
        with pytest.raises(kvcache.InvalidArgumentError, match="fp8_per_token_head"):
            cache.calibrate_layer_scales(layer, observed[layer])
        return
    # Calibrated from the counters, the same values fit: nothing clips per tensor. NVFP4 still may clip in blocks
    # whose scale is a subnormal E4M3 (a few steps of 2^-9, so rounding it may halve it), fewer than before.
    cache.calibrate_layer_scales(layer, observed[layer])
    assert cache.layer_scales(layer) == kvcache.calibrated_scales(quantization, observed[layer].k_amax,
                                                                  observed[layer].v_amax)
    counters.reset()
    write_counted(torch, cache, layer, k, v, counters)
    again = counters.read()[layer]
    if quantization == Q.FP8_PER_TENSOR:
        assert (again.k_saturated, again.v_saturated) == (0, 0)
    else:
        assert again.k_saturated < observed[layer].k_saturated - 7
        assert again.v_saturated < observed[layer].v_saturated - 7


def test_write_counters_are_refused_where_they_do_not_belong(torch):
    plain = make_cache(torch, Q.NONE)
    quantized = make_cache(torch, Q.NVFP4)
    heads, dim, _ = LAYERS[0]
    k = token_values(torch, heads, dim, 13)
    with pytest.raises(kvcache.InvalidArgumentError, match="deviceCounters.*quantization none"):
        write_counted(torch, plain, 0, k, k, kvcache.WriteCounters(plain))
    with pytest.raises(kvcache.InvalidArgumentError, match="another KVCacheManager"):
        write_counted(torch, quantized, 0, k, k, kvcache.WriteCounters(plain))
    with pytest.raises(kvcache.InvalidArgumentError, match="counters must be a WriteCounters"):
        write_counted(torch, quantized, 0, k, k, torch.zeros(6, device="cuda"))
