#!/usr/bin/env python3
"""Paged decode attention in PyTorch over a kvcache pool view.

Builds a two-layer cache, prefills three sequences at pages handed out by a PageAllocator, forks one sequence (shared
full pages, copy-on-write of its partial last page with copy_pages), and runs a decode step. Each step builds the page
tables with PageTableBuffers, and each layer writes its new K and V with kvcache.write_tokens_paged (torch tensors,
zero copy; every token placed by its (sequence, position) in the CSR tables), then runs paged attention in torch that
reads K and V from torch.from_dlpack(cache.pool_view(layer)) through the block table. Each result is checked against a
dense float32 attention over the same tokens. Needs a GPU and torch; exits 77 with a message without one.
"""

import math
import sys

import kvcache

TOKENS_PER_PAGE = 16
LAYERS = [(4, 64), (2, 128)]  # (num_kv_heads, head_dim) per layer
QUERY_HEADS_PER_KV_HEAD = 2  # grouped-query attention
MAX_BATCH = 4
MAX_SEQUENCE = 256


def main() -> int:
    reason = kvcache.gpu_unavailable_reason()
    try:
        import torch
    except ImportError:
        reason = reason or "torch is not installed"
    if reason or not torch.cuda.is_available():
        print(f"paged_attention.py needs a GPU and torch: {reason or 'torch.cuda.is_available() is False'}")
        return 77

    torch.manual_seed(0)
    stream = torch.cuda.current_stream()
    config = kvcache.Config(layer_configs=LAYERS, max_batch_size=MAX_BATCH, max_sequence_length=MAX_SEQUENCE,
                            tokens_per_page=TOKENS_PER_PAGE, kv_cache_type=kvcache.DataType.FLOAT16)
    # On torch's stream, so that torch's kernels and the cache's page operations are ordered without events.
    cache = kvcache.KVCacheManager(config, stream)
    pools = [torch.from_dlpack(cache.pool_view(layer)) for layer in range(cache.num_layers())]
    assert pools[0].data_ptr() == cache.k_pool_ptr(0)  # zero copy
    print(f"cache: {cache.num_layers()} layers, {cache.num_pages()} pages of {TOKENS_PER_PAGE} tokens, "
          f"{cache.allocated_bytes() / 2**20:.1f} MiB; pool view of layer 0: {tuple(pools[0].shape)}")

    # Poison every page with a finite value (float16 61280): attention that reads a token no write placed goes wrong.
    # Not NaN, since the torch attention below also reads the padding of each page and gives it zero weight.
    cache.reset_pages(list(range(cache.num_pages())), stream, pattern=0x7B7B7B7B)

    allocator = kvcache.PageAllocator(cache.num_pages())
    # Take and give back a few pages, so that sequences get pages out of order.
    allocator.release(allocator.allocate(5)[::-1])
    # The tables every write and the attention read; rebuilt each step at the same device addresses.
    tables = kvcache.PageTableBuffers(MAX_BATCH, cache.layout().pages_per_slot, TOKENS_PER_PAGE, stream)
    # Every write counts here the tokens the tables do not place (not written).
    unwritten = torch.zeros(1, dtype=torch.int32, device="cuda")

    # Dense float32 K/V per sequence and layer: the reference's data. The cache holds their float16 roundings, which
    # the write makes.
    lengths = [37, 70, 5]
    dense = [[(torch.randn(n, h, d, device="cuda"), torch.randn(n, h, d, device="cuda")) for h, d in LAYERS]
             for n in lengths]
    pages = [allocator.allocate(math.ceil(n / TOKENS_PER_PAGE)) for n in lengths]

    # Prefill: each layer writes every prompt token of every sequence in one call.
    tables.build(list(zip(pages, lengths)))
    prompt = [(sequence, position) for sequence, n in enumerate(lengths) for position in range(n)]
    for layer in range(len(LAYERS)):
        keys, values = (torch.cat([history[layer][kv] for history in dense]) for kv in range(2))
        write_new_tokens(torch, cache, layer, tables, prompt, keys, values, unwritten)

    # Fork sequence 0: share its full pages, copy its partial last page (copy-on-write) before the child writes.
    parent = 0
    full = lengths[parent] // TOKENS_PER_PAGE
    child_pages = pages[parent][:full]
    for page in child_pages:
        allocator.retain(page)
    last = allocator.allocate()
    cache.copy_pages([(pages[parent][full], last)], stream)  # every layer, K and V, one launch
    child_pages = child_pages + [last]
    pages.append(child_pages)
    lengths.append(lengths[parent])
    dense.append(dense[parent])  # the child's history is its parent's (the histories are not changed below)

    # Decode step: every sequence appends one token of its own (the child's differs from the parent's).
    step = list(enumerate(lengths))  # the (sequence, position) of each new token
    for sequence, length in step:
        if length % TOKENS_PER_PAGE == 0:
            pages[sequence].append(allocator.allocate())
    lengths = [length + 1 for length in lengths]
    allocator.check_invariants()
    tables.build(list(zip(pages, lengths)))
    block_table = torch.from_dlpack(tables.block_table())
    last_page_len = torch.from_dlpack(tables.last_page_len())
    batch = len(lengths)

    worst = 0.0
    for layer, (heads, dim) in enumerate(LAYERS):
        # The layer's step: write the new tokens, then attention reads the pool view.
        new_k, new_v = (torch.randn(batch, heads, dim, device="cuda") for _ in range(2))
        write_new_tokens(torch, cache, layer, tables, step, new_k, new_v, unwritten)
        query = torch.randn(batch, heads * QUERY_HEADS_PER_KV_HEAD, dim, device="cuda")
        paged = paged_decode_attention(torch, query, pools[layer], block_table[:batch], last_page_len[:batch])
        for sequence in range(batch):
            k, v = (torch.cat([dense[sequence][layer][kv], new[sequence:sequence + 1]])
                    for kv, new in enumerate((new_k, new_v)))
            reference = dense_attention(torch, query[sequence], k.half().float(), v.half().float())
            error = (paged[sequence] - reference).abs().max().item()
            worst = error if math.isnan(error) else max(worst, error)  # a NaN stays, and fails below
    print(f"{batch} sequences (one forked), {len(LAYERS)} layers: paged vs dense float32 max abs error {worst:.2e}")
    if unwritten.item() != 0:
        print(f"FAILED: {unwritten.item()} tokens lie outside the page tables and were not written")
        return 1
    if not worst <= 1e-3:
        print("FAILED: paged attention differs from the dense reference")
        return 1
    return 0


def write_new_tokens(torch, cache, layer, tables, positions, k, v, unwritten):
    """Writes rows k, v [n, H, D] (float32, rounded to the cache's float16 by the write) into layer `layer`'s pages,
    row i at the (sequence, position) pair positions[i] of the CSR tables, in one launch on torch's stream."""
    pairs = torch.tensor(positions, dtype=torch.int32, device="cuda")  # [n, 2]
    kvcache.write_tokens_paged(cache, layer, k, v, tables.indptr(), tables.indices(), tables.first_token(), pairs,
                               torch.cuda.current_stream(), error_count=unwritten)


def paged_decode_attention(torch, query, pool, block_table, last_page_len):
    """One query token per sequence against the tokens its block table lists: query [B, Hq, D], pool
    [2, pages, P, H, D], block_table [B, max pages] (-1 padded), last_page_len [B]. Float32 math on the cache's
    values."""
    batch, query_heads, dim = query.shape
    heads = pool.shape[3]
    pages_held = (block_table >= 0).sum(dim=1)
    lengths = (pages_held - 1).clamp(min=0) * TOKENS_PER_PAGE + last_page_len
    gathered = pool[:, block_table.clamp(min=0).long()]  # [2, B, max pages, P, H, D]
    keys = gathered[0].reshape(batch, -1, heads, dim).float()
    values = gathered[1].reshape(batch, -1, heads, dim).float()
    group = query_heads // heads
    keys = keys.repeat_interleave(group, dim=2)
    values = values.repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,bthd->bht", query, keys) / math.sqrt(dim)
    valid = torch.arange(keys.shape[1], device=query.device)[None, :] < lengths[:, None]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    return torch.einsum("bht,bthd->bhd", scores.softmax(dim=-1), values)


def dense_attention(torch, query, keys, values):
    """query [Hq, D], keys/values [T, H, D] in float32: the reference."""
    group = query.shape[0] // keys.shape[1]
    keys = keys.repeat_interleave(group, dim=1)
    values = values.repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,thd->ht", query, keys) / math.sqrt(query.shape[-1])
    return torch.einsum("ht,thd->hd", scores.softmax(dim=-1), values)


if __name__ == "__main__":
    sys.exit(main())
