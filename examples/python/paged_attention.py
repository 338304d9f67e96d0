#!/usr/bin/env python3
"""Paged decode attention in PyTorch over a kvcache pool view.

Builds a two-layer cache, writes three sequences' K and V through torch.from_dlpack(cache.pool_view(layer)) at pages
handed out by a PageAllocator, forks one sequence (shared full pages, copy-on-write of its partial last page with
copy_pages), builds the block table with PageTableBuffers, and runs a decode step of paged attention in torch that
reads K and V through the block table. Each result is checked against a dense float32 attention over the same
tokens. Needs a GPU and torch; exits 77 with a message without one.
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

    allocator = kvcache.PageAllocator(cache.num_pages())
    # Take and give back a few pages, so that sequences get pages out of order.
    allocator.release(allocator.allocate(5)[::-1])

    # Dense float32 K/V per sequence and layer: the reference's data. The cache holds their float16 roundings.
    lengths = [37, 70, 5]
    dense = [[(torch.randn(n, h, d, device="cuda"), torch.randn(n, h, d, device="cuda")) for h, d in LAYERS]
             for n in lengths]
    pages = []
    for sequence, length in enumerate(lengths):
        owned = allocator.allocate(math.ceil(length / TOKENS_PER_PAGE))
        pages.append(owned)
        for layer, pool in enumerate(pools):
            write_tokens(torch, pool, owned, 0, *dense[sequence][layer])

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
    dense.append([(k.clone(), v.clone()) for k, v in dense[parent]])

    # Decode step: every sequence appends one token of its own (the child's differs from the parent's).
    for sequence in range(len(lengths)):
        position = lengths[sequence]
        if position % TOKENS_PER_PAGE == 0:
            pages[sequence].append(allocator.allocate())
        for layer, (heads, dim) in enumerate(LAYERS):
            k, v = (torch.randn(1, heads, dim, device="cuda") for _ in range(2))
            write_tokens(torch, pools[layer], pages[sequence], position, k, v)
            old_k, old_v = dense[sequence][layer]
            dense[sequence][layer] = (torch.cat([old_k, k]), torch.cat([old_v, v]))
        lengths[sequence] += 1
    allocator.check_invariants()

    tables = kvcache.PageTableBuffers(MAX_BATCH, cache.layout().pages_per_slot, TOKENS_PER_PAGE, stream)
    tables.build(list(zip(pages, lengths)))
    block_table = torch.from_dlpack(tables.block_table())
    last_page_len = torch.from_dlpack(tables.last_page_len())
    batch = len(lengths)

    worst = 0.0
    for layer, (heads, dim) in enumerate(LAYERS):
        query = torch.randn(batch, heads * QUERY_HEADS_PER_KV_HEAD, dim, device="cuda")
        paged = paged_decode_attention(torch, query, pools[layer], block_table[:batch], last_page_len[:batch])
        for sequence in range(batch):
            k, v = dense[sequence][layer]
            reference = dense_attention(torch, query[sequence], k.half().float(), v.half().float())
            worst = max(worst, (paged[sequence] - reference).abs().max().item())
    print(f"{batch} sequences (one forked), {len(LAYERS)} layers: paged vs dense float32 max abs error {worst:.2e}")
    if worst > 1e-3:
        print("FAILED: paged attention differs from the dense reference")
        return 1
    return 0


def write_tokens(torch, pool, pages, start, k, v):
    """Writes tokens [start, start + len(k)) of a sequence whose pages are `pages` into a [2, pages, P, H, D] pool."""
    positions = torch.arange(start, start + k.shape[0], device="cuda")
    page_ids = torch.tensor(pages, device="cuda")[positions // TOKENS_PER_PAGE]
    pool[0, page_ids, positions % TOKENS_PER_PAGE] = k.to(pool.dtype)
    pool[1, page_ids, positions % TOKENS_PER_PAGE] = v.to(pool.dtype)


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
