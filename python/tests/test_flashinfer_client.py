"""FlashInfer as a real client of pages written by write_tokens_paged: BatchPrefillWithPagedKVCacheWrapper and
BatchDecodeWithPagedKVCacheWrapper (NHD) read the pool views through the CSR tables PageTableBuffers builds, for a
full-attention layer and a sliding-window layer (window_left = W - 1, released pages left out of the tables), with
prefix pages shared between two sequences. Outputs are compared with a float32 attention computed in torch from the
sequences' whole K/V history. Skips when flashinfer is not importable (also under KVCACHE_REQUIRE_GPU=1)."""

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


@pytest.fixture
def flashinfer(torch):
    return pytest.importorskip("flashinfer")


def reference_attention(torch, q, keys, values, positions, window):
    """float32 attention of queries q [n, QO_HEADS, D] at absolute `positions` over keys/values [len, HEADS, D]."""
    group = QO_HEADS // HEADS
    k = keys.float().repeat_interleave(group, dim=1)
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) / math.sqrt(DIM)
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
