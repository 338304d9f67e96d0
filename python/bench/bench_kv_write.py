"""Token write peers on one pool, in one run: kvcache.write_tokens, flashinfer.page.append_paged_kv_cache, a torch
index_put_ into the flattened pool, and a contiguous copy of the same bytes (K and V each read once and written once).
A prefill-sized write: 8192 tokens of 8 KV heads x 128, float16, 16-token pages at random page ids. Prints microseconds
a call and each time as a ratio to the contiguous copy. FlashInfer is optional (its row is skipped without it).

Usage: python python/bench/bench_kv_write.py [--tokens N] [--reps N]
"""

import argparse

import torch

import kvcache

TOKENS_PER_PAGE = 16
HEADS = 8
DIM = 128


def time_call(call, reps):
    call()
    call()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        call()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e3 / reps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    n = args.tokens
    pages = (n + TOKENS_PER_PAGE - 1) // TOKENS_PER_PAGE
    stream = torch.cuda.current_stream()
    config = kvcache.Config(layer_configs=[(HEADS, DIM)], max_batch_size=1, max_sequence_length=pages * TOKENS_PER_PAGE,
                            tokens_per_page=TOKENS_PER_PAGE, kv_cache_type=kvcache.DataType.FLOAT16)
    cache = kvcache.KVCacheManager(config, stream)
    pool = torch.from_dlpack(cache.pool_view(0))  # [2, pages, P, H, D]
    k = torch.randn(n, HEADS, DIM, device="cuda").half()
    v = torch.randn(n, HEADS, DIM, device="cuda").half()
    page_ids = torch.randperm(pages, device="cuda").to(torch.int32)
    positions = torch.arange(n, device="cuda", dtype=torch.int32)
    addresses = (page_ids[positions // TOKENS_PER_PAGE].long() * TOKENS_PER_PAGE + positions % TOKENS_PER_PAGE)
    flat_k = pool[0].view(-1, HEADS, DIM)
    flat_v = pool[1].view(-1, HEADS, DIM)
    source = torch.empty(2 * k.numel(), dtype=torch.float16, device="cuda")
    target = torch.empty_like(source)

    rows = []
    copy_us = time_call(lambda: target.copy_(source), args.reps)
    rows.append(("contiguous copy", copy_us))
    rows.append(("kvcache.write_tokens",
                 time_call(lambda: kvcache.write_tokens(cache, 0, k, v, addresses, stream), args.reps)))

    def index_put():
        flat_k.index_put_((addresses,), k)
        flat_v.index_put_((addresses,), v)

    rows.append(("torch index_put_", time_call(index_put, args.reps)))
    try:
        import flashinfer
    except ImportError:
        flashinfer = None
    if flashinfer is not None:
        kv_indptr = torch.tensor([0, pages], dtype=torch.int32, device="cuda")
        last_page_len = torch.tensor([n - (pages - 1) * TOKENS_PER_PAGE], dtype=torch.int32, device="cuda")
        batch_indices = torch.zeros(n, dtype=torch.int32, device="cuda")
        rows.append(("flashinfer append_paged_kv_cache", time_call(
            lambda: flashinfer.page.append_paged_kv_cache(k, v, batch_indices, positions, (pool[0], pool[1]), page_ids,
                                                          kv_indptr, last_page_len, "NHD"), args.reps)))
        # Both wrote the same tokens to the same places: check the pool agrees with ours.
        kvcache.write_tokens(cache, 0, k, v, addresses, stream)
        torch.cuda.synchronize()
        assert torch.equal(flat_k[addresses], k) and torch.equal(flat_v[addresses], v)

    bytes_moved = 2 * k.numel() * k.element_size()
    print(f"{n} tokens, {HEADS}x{DIM} float16, {bytes_moved / 2**20:.1f} MiB of K and V, {args.reps} reps")
    for name, us in rows:
        print(f"{name:34s} {us:9.2f} us {bytes_moved / us * 1e-3:8.1f} GB/s {us / copy_us:7.3f} x copy")


if __name__ == "__main__":
    main()
