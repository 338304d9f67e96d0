"""FlashInfer as a real client of pages written by write_tokens_paged, read through the CSR tables PageTableBuffers
builds (NHD: a pool view is FlashInfer's paged layout), against float32 attention computed in torch.

float16 pages: BatchPrefillWithPagedKVCacheWrapper and BatchDecodeWithPagedKVCacheWrapper read the pool views for a
full-attention layer and a sliding-window layer (window_left = W - 1, released pages left out of the tables), with
prefix pages shared between two sequences. Outputs are compared with a float32 attention from the sequences' whole K/V
history.

Quantized pages, on FlashInfer's FA2 backend: FP8 E4M3 per tensor (the host-held layer scales as run's k_scale /
v_scale), FP8 E4M3 per token and head (plan's use_token_head_sf, the float32 scale pool as run's kv_cache_sf) and NVFP4
(uint8 codes, the FP8 block scales of the scale pool as kv_cache_sf, the host-held global scales as k_scale / v_scale),
every argument taken from KVCacheManager.attention_arguments as docs/flashinfer.md shows.
K and V of several sequences go into pages a PageManager hands out (the write quantizes; its positions and tables
are the step's StepArguments); the decode (CUDA-core and
tensor-core where FlashInfer has both) and prefill wrappers read the pool and scale pool views zero-copy. For each
format:
- what the pages hold: the outputs against a float32 attention over K and V dequantized in torch from the pool views
  by docs/layout.md's read-back rules, within the float16 test's tolerance (FlashInfer computes in float16 and float32
  from the same codes and scales);
- the quantization error: the relative L2 error against a float32 attention over the values written (before
  quantization), within QUANTIZED_TOLERANCE; each measured error is recorded as a test property (the JUnit XML);
- moved pages: rows over a sequence forked from the first one (its shared partly filled page moved to a copy by
  copy_pages as step() asked, then written past the parent's end), over copies of its pages made by copy_pages and
  over its pages offloaded to a HostTier and onboarded into other pages give bitwise the first row's output, in the
  same launch.
Full attention only (the float16 test covers sliding windows).

Without a GPU or torch the tests skip (and fail under KVCACHE_REQUIRE_GPU=1); where flashinfer is not importable they
skip, also under KVCACHE_REQUIRE_GPU=1."""

import math

import pytest

import kvcache

TOKENS = 16
HEADS = 2
QO_HEADS = 4
DIM = 64
WINDOW = 32
STEP = 16
UNUSED = kvcache.UNUSED_PAGE_ENTRY
# Sequence A holds 70 tokens, B 50; B shares A's first two pages (32 tokens) in both groups. In the windowed group A's
# last step (tokens 54-69) reaches back to token 54 - (W - 1) = 23, so its page 0 is released; B's step (34-49) reaches
# token 3, so B keeps all four.
LENGTHS = (70, 50)
FULL_PAGES = ([0, 1, 2, 3, 4], [0, 1, 5, 6])
WINDOW_PAGES = ([UNUSED, 1, 2, 3, 4], [0, 1, 5, 6])

# Quantized pages: sequences A, B and C, each with a partly filled last page; A's pages are then forked, copied and
# onboarded. Head dimension 128, 6 sequences of at most 8 pages.
QUANTIZED_DIM = 128
QUANTIZED_LENGTHS = (70, 50, 33)
MAX_SEQUENCES = 6
MAX_PAGES = 8
POISON = 0x7B  # NaN-free in E4M3 (352) and E2M1; a float32 scale of 0x7B7B7B7B (1.3e36) sends a misread to inf
FP8_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
Q = kvcache.KVQuantization
STORAGE = {Q.FP8_PER_TENSOR: kvcache.DataType.FP8_E4M3, Q.FP8_PER_TOKEN_HEAD: kvcache.DataType.FP8_E4M3,
           Q.NVFP4: kvcache.DataType.UINT8}
# Bound on the relative L2 error against float32 attention over the unquantized values (K ~ N(0, 1), V ~ N(0, 4),
# float16 inputs). Measured on an H200 with FlashInfer reading these formats: 3.0% (FP8 per tensor), 2.9% (FP8 per
# token and head), 10.6% (NVFP4). A float32 model of the quantization rules on this test's shapes (head_dim 128,
# 70/50/33 tokens, one decode query or 16 prefill queries a sequence) gives 3.2-3.9% for both FP8 formats and
# 11.3-13.5% for NVFP4 over five seeds. The bounds leave at least 1.5x over the model's worst and about 2x over the
# measured errors; a misread scale, code or half (K's scales on V) costs tens of percent and more.
QUANTIZED_TOLERANCE = {Q.FP8_PER_TENSOR: 0.06, Q.FP8_PER_TOKEN_HEAD: 0.06, Q.NVFP4: 0.20}
# Decode paths: FP8 per tensor also on the CUDA-core kernel; per-token-head scales and NVFP4 are tensor-core only
# (attention_arguments' tensor_core_decode, checked against this table).
DECODE_TENSOR_CORES = {Q.FP8_PER_TENSOR: (False, True), Q.FP8_PER_TOKEN_HEAD: (True,), Q.NVFP4: (True,)}


@pytest.fixture
def flashinfer(torch):
    return pytest.importorskip("flashinfer")


def reference_attention(torch, q, keys, values, positions, window):
    """float32 attention of queries q [n, qo_heads, D] at absolute `positions` over keys/values [len, kv_heads, D]
    (qo_heads a multiple of kv_heads), causal, and within the last `window` tokens when window > 0."""
    group = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1)
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) / math.sqrt(q.shape[-1])
    key_positions = torch.arange(keys.shape[0], device="cuda")
    query_positions = torch.tensor(positions, device="cuda")
    allowed = key_positions[None, :] <= query_positions[:, None]
    if window > 0:
        allowed &= key_positions[None, :] >= query_positions[:, None] - (window - 1)
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)


def write_sequences(torch, cache, layer, tables, histories, stream):
    """Writes every token of both sequences through the table form; returns the error count (tokens before a row's
    first token: pages the window released)."""
    positions = [(s, p) for s, length in enumerate(LENGTHS) for p in range(length)]
    keys = torch.cat([h[0] for h in histories])
    values = torch.cat([h[1] for h in histories])
    pairs = torch.tensor(positions, dtype=torch.int32, device="cuda")
    errors = torch.zeros(1, dtype=torch.int32, device="cuda")
    kvcache.write_tokens_paged(cache, layer, keys, values, tables.indptr(), tables.indices(), tables.first_token(),
                               pairs, stream, error_count=errors)
    torch.cuda.synchronize()
    return errors.item()


def test_flashinfer_reads_pages_written_by_write_tokens(torch, flashinfer):
    stream = torch.cuda.current_stream()
    config = kvcache.Config(layer_configs=[(HEADS, DIM), (HEADS, DIM, WINDOW)], max_batch_size=2,
                            max_sequence_length=128, tokens_per_page=TOKENS, kv_cache_type=kvcache.DataType.FLOAT16,
                            max_tokens_per_step=STEP)
    cache = kvcache.KVCacheManager(config, stream)
    generator = torch.Generator(device="cuda").manual_seed(0)

    def random(*shape):
        return torch.randn(*shape, device="cuda", generator=generator).half()

    history_a = (random(LENGTHS[0], HEADS, DIM), random(LENGTHS[0], HEADS, DIM))
    # B's first 32 tokens are A's: the shared pages hold them once.
    history_b = tuple(torch.cat([h[:32], random(LENGTHS[1] - 32, HEADS, DIM)]) for h in history_a)
    histories = (history_a, history_b)
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")

    for layer, (pages, window) in enumerate(((FULL_PAGES, 0), (WINDOW_PAGES, WINDOW))):
        tables = kvcache.PageTableBuffers(2, 8, TOKENS, stream)
        tables.build([(pages[s], LENGTHS[s]) for s in range(2)])
        pool = torch.from_dlpack(cache.pool_view(layer))
        pool.view(torch.uint8).fill_(0x7B)  # NaN-free poison: a page read by mistake changes the output
        released = sum(TOKENS for s in range(2) for p in pages[s] if p == UNUSED)
        assert write_sequences(torch, cache, layer, tables, histories, stream) == released

        indptr = torch.from_dlpack(tables.indptr())[:3]
        indices = torch.from_dlpack(tables.indices())[: int(indptr[-1])]
        last_page_len = torch.from_dlpack(tables.last_page_len())[:2]
        first_token = torch.from_dlpack(tables.first_token())[:2].tolist()
        resident = torch.from_dlpack(tables.resident_tokens())[:2].tolist()
        assert [LENGTHS[s] - first_token[s] for s in range(2)] == resident
        paged_cache = (pool[0], pool[1])

        # Decode: one query a sequence at its last position.
        q = random(2, QO_HEADS, DIM)
        decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        decode.plan(indptr, indices, last_page_len, QO_HEADS, HEADS, DIM, TOKENS, window_left=window - 1,
                    q_data_type=torch.float16, kv_data_type=torch.float16)
        out = decode.run(q, paged_cache)
        for s in range(2):
            expected = reference_attention(torch, q[s:s + 1], *histories[s], [LENGTHS[s] - 1], window)
            torch.testing.assert_close(out[s:s + 1].float(), expected, atol=3e-3, rtol=3e-2)

        # Prefill: each sequence's last STEP tokens as causal queries.
        q = random(2 * STEP, QO_HEADS, DIM)
        qo_indptr = torch.tensor([0, STEP, 2 * STEP], dtype=torch.int32, device="cuda")
        prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        prefill.plan(qo_indptr, indptr, indices, last_page_len, QO_HEADS, HEADS, DIM, TOKENS, causal=True,
                     window_left=window - 1, q_data_type=torch.float16, kv_data_type=torch.float16)
        out = prefill.run(q, paged_cache)
        for s in range(2):
            positions = list(range(LENGTHS[s] - STEP, LENGTHS[s]))
            expected = reference_attention(torch, q[s * STEP:(s + 1) * STEP], *histories[s], positions, window)
            torch.testing.assert_close(out[s * STEP:(s + 1) * STEP].float(), expected, atol=3e-3, rtol=3e-2)


def make_quantized_cache(torch, quantization):
    """One full-attention layer of HEADS x QUANTIZED_DIM in `quantization`."""
    config = kvcache.Config(layer_configs=[(HEADS, QUANTIZED_DIM)], max_batch_size=MAX_SEQUENCES,
                            max_sequence_length=MAX_PAGES * TOKENS, tokens_per_page=TOKENS,
                            kv_cache_type=STORAGE[quantization], quantization=quantization)
    return kvcache.KVCacheManager(config, torch.cuda.current_stream())


def calibrate(cache, quantization, keys, values):
    """Sets the host-held scales by the calibration docs/layout.md names: amax / 448 (FP8 per tensor), amax / (448 * 6)
    (NVFP4), from all of K and all of V."""
    if quantization == Q.FP8_PER_TOKEN_HEAD:
        return
    divisor = FP8_MAX if quantization == Q.FP8_PER_TENSOR else FP8_MAX * E2M1_MAX
    cache.set_layer_scales(0, kvcache.LayerScales(*(float(x.abs().max().float() / divisor) for x in (keys, values))))


def write_step(torch, cache, arguments, entries, keys, values):
    """Writes keys / values [n, HEADS, QUANTIZED_DIM], the new tokens of the step `entries` that manager.step() just
    took, into layer 0: the step's positions and tables come from StepArguments, none built by hand."""
    stream = torch.cuda.current_stream()
    arguments.build(entries, stream)
    errors = torch.zeros(1, dtype=torch.int32, device="cuda")
    kvcache.write_tokens_paged(cache, 0, keys, values, arguments.indptr(0), arguments.indices(0),
                               arguments.first_token(0), arguments.positions(), stream, error_count=errors)
    torch.cuda.synchronize()
    assert errors.item() == 0


def dequantized(torch, cache, quantization):
    """The float32 values [2, num_pages, P, H, D] the pools hold, by docs/layout.md's read-back rules, computed in torch
    from the pool and scale pool views."""
    pool = torch.from_dlpack(cache.pool_view(0))
    if quantization == Q.FP8_PER_TENSOR:
        scales = cache.layer_scales(0)
        return torch.stack([pool[0].float() * scales.k, pool[1].float() * scales.v])
    scale_pool = torch.from_dlpack(cache.scale_pool_view(0))
    if quantization == Q.FP8_PER_TOKEN_HEAD:
        return pool.float() * scale_pool[..., None]
    # NVFP4: value 2i of a head in the low nibble of byte i; (e2m1 * block scale) * global scale.
    codes = torch.stack([pool & 0xF, pool >> 4], dim=-1).flatten(-2).long()
    values = torch.tensor(E2M1_VALUES, device="cuda")[codes]
    blocks = scale_pool.float().repeat_interleave(NVFP4_BLOCK, dim=-1)
    scales = cache.layer_scales(0)
    return values * blocks * torch.tensor([scales.k, scales.v], device="cuda").view(2, 1, 1, 1, 1)


def flashinfer_arguments(torch, cache, quantization):
    """(kv_data_type, paged_kv_cache, plan's keyword arguments, run's keyword arguments, the decode wrapper's
    use_tensor_cores choices) for the layer's pools, from cache.attention_arguments as docs/flashinfer.md shows."""
    pool = torch.from_dlpack(cache.pool_view(0))
    kv_type = torch.uint8 if quantization == Q.NVFP4 else torch.float8_e4m3fn
    assert pool.dtype == kv_type
    arguments = cache.attention_arguments(0)
    assert arguments["quantization"] == quantization
    plan, run = {}, {}
    if arguments["token_head_scales"]:
        # Every scale is in kv_cache_sf; k_scale and v_scale are 1.0 and left out.
        plan["use_token_head_sf"] = True
    else:
        run["k_scale"], run["v_scale"] = arguments["k_scale"], arguments["v_scale"]
    if arguments["k_scale_pool"] is not None:
        run["kv_cache_sf"] = tuple(torch.from_dlpack(arguments[half]) for half in ("k_scale_pool", "v_scale_pool"))
    decode_paths = (True,) if arguments["tensor_core_decode"] else (False, True)
    assert decode_paths == DECODE_TENSOR_CORES[quantization]
    return kv_type, (pool[0], pool[1]), plan, run, decode_paths


def check_quantized(torch, out, q, queries, histories, held, quantization, name, record_property):
    """out [rows * queries, QO_HEADS, QUANTIZED_DIM]: each of the first len(QUANTIZED_LENGTHS) rows against float32
    attention over what the pages hold (`held`) and, as one relative L2 error, over the values written (`histories`);
    the rows after them bitwise equal to the first."""
    errors, norms = 0.0, 0.0
    for s, length in enumerate(QUANTIZED_LENGTHS):
        rows = slice(s * queries, (s + 1) * queries)
        positions = list(range(length - queries, length))
        expected = reference_attention(torch, q[rows], *held[s], positions, 0)
        torch.testing.assert_close(out[rows].float(), expected, atol=3e-3, rtol=3e-2, msg=lambda m: f"{name}: {m}")
        unquantized = reference_attention(torch, q[rows], *histories[s], positions, 0)
        errors += float((out[rows].float() - unquantized).square().sum())
        norms += float(unquantized.square().sum())
    relative = (errors / norms) ** 0.5
    record_property(f"{name}_relative_l2", round(relative, 5))
    assert relative <= QUANTIZED_TOLERANCE[quantization], f"{name}: relative L2 error {relative:.4f}"
    first = out[:queries]
    for row in range(len(QUANTIZED_LENGTHS), out.shape[0] // queries):
        assert torch.equal(out[row * queries:(row + 1) * queries], first), f"{name}: row {row} differs from row 0"


@pytest.mark.parametrize("quantization", list(QUANTIZED_TOLERANCE), ids=lambda quantization: quantization.name)
def test_flashinfer_reads_quantized_pages(torch, flashinfer, quantization, record_property):
    stream = torch.cuda.current_stream()
    cache = make_quantized_cache(torch, quantization)
    torch.from_dlpack(cache.pool_view(0)).view(torch.uint8).fill_(POISON)
    if quantization != Q.FP8_PER_TENSOR:
        torch.from_dlpack(cache.scale_pool_view(0)).view(torch.uint8).fill_(POISON)
    generator = torch.Generator(device="cuda").manual_seed(0)

    def random(*shape):
        return torch.randn(*shape, device="cuda", generator=generator).half()

    histories = [(random(n, HEADS, QUANTIZED_DIM), 2 * random(n, HEADS, QUANTIZED_DIM)) for n in QUANTIZED_LENGTHS]
    keys = torch.cat([h[0] for h in histories])
    values = torch.cat([h[1] for h in histories])
    calibrate(cache, quantization, keys, values)

    manager = kvcache.PageManager(cache, enable_prefix_caching=False)
    arguments = kvcache.StepArguments(manager, MAX_SEQUENCES, sum(QUANTIZED_LENGTHS), stream)
    sequences = [manager.create() for _ in QUANTIZED_LENGTHS]
    prefill = [(s, list(range(n))) for s, n in zip(sequences, QUANTIZED_LENGTHS)]
    assert manager.step(prefill) == [[]]
    rows = [manager.pages(s, 0) for s in sequences]
    write_step(torch, cache, arguments, prefill, keys, values)

    # A's pages, moved three ways. A fork shares them; the child's first token lands in the shared partly filled
    # page, which step() moves to a copy that copy_pages makes; the child's token then goes into the copy.
    a_pages, a_length = rows[0]
    child = manager.fork(sequences[0])
    child_step = [(child, [a_length])]
    copies = manager.step(child_step)
    child_pages, _ = manager.pages(child, 0)
    assert copies == [[(a_pages[-1], child_pages[-1])]] and child_pages[:-1] == a_pages[:-1]
    cache.copy_pages(copies[0], stream)
    extra = random(1, HEADS, QUANTIZED_DIM)
    write_step(torch, cache, arguments, child_step, extra, 2 * extra)
    copied, onboarded = manager.create(), manager.create()
    manager.step([(copied, list(range(a_length))), (onboarded, list(range(a_length)))])
    copied_pages, _ = manager.pages(copied, 0)
    onboarded_pages, _ = manager.pages(onboarded, 0)
    cache.copy_pages(list(zip(a_pages, copied_pages)), stream)
    tier = kvcache.HostTier(cache, 0, len(a_pages))
    tier.wait_until_ready()
    host_pages = tier.allocate_host_pages(len(a_pages))
    tier.offload(list(zip(a_pages, host_pages)), stream)
    tier.onboard(list(zip(onboarded_pages, host_pages)), stream)
    torch.cuda.synchronize()

    # Rows A, B, C, then A's three moved copies over A's tokens (the child's row stops before its own token).
    table_rows = rows + [(pages, a_length) for pages in (child_pages, copied_pages, onboarded_pages)]
    count = len(table_rows)
    tables = kvcache.PageTableBuffers(MAX_SEQUENCES, MAX_PAGES, TOKENS, stream)
    tables.build(table_rows)
    indptr = torch.from_dlpack(tables.indptr())[: count + 1]
    indices = torch.from_dlpack(tables.indices())[: int(indptr[-1])]
    last_page_len = torch.from_dlpack(tables.last_page_len())[:count]

    values_held = dequantized(torch, cache, quantization)
    held = [tuple(values_held[half][pages].reshape(-1, HEADS, QUANTIZED_DIM)[:length] for half in (0, 1))
            for pages, length in rows]
    kv_type, paged_cache, plan_options, run_options, decode_paths = flashinfer_arguments(torch, cache, quantization)
    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")

    def queries_for_rows(queries):
        """Random queries for A, B and C; A's again for its three copies."""
        q = random(len(QUANTIZED_LENGTHS) * queries, QO_HEADS, QUANTIZED_DIM)
        return torch.cat([q] + [q[:queries]] * (count - len(QUANTIZED_LENGTHS)))

    # Decode: one query a sequence at its last position.
    q = queries_for_rows(1)
    for tensor_cores in decode_paths:
        decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores,
                                                               backend="fa2")
        decode.plan(indptr, indices, last_page_len, QO_HEADS, HEADS, QUANTIZED_DIM, TOKENS, q_data_type=torch.float16,
                    kv_data_type=kv_type, **plan_options)
        out = decode.run(q, paged_cache, **run_options)
        name = f"decode_{'tensor_cores' if tensor_cores else 'cuda_cores'}"
        check_quantized(torch, out, q, 1, histories, held, quantization, name, record_property)

    # Prefill: each sequence's last STEP tokens as causal queries.
    q = queries_for_rows(STEP)
    qo_indptr = torch.arange(count + 1, dtype=torch.int32, device="cuda") * STEP
    prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
    prefill.plan(qo_indptr, indptr, indices, last_page_len, QO_HEADS, HEADS, QUANTIZED_DIM, TOKENS, causal=True,
                 q_data_type=torch.float16, kv_data_type=kv_type, **plan_options)
    out = prefill.run(q, paged_cache, **run_options)
    check_quantized(torch, out, q, STEP, histories, held, quantization, "prefill", record_property)
