"""Token write peers in one run, on the same data: 8192 tokens of 8 KV heads x 128, float16, 16-token pages at random
page ids (a prefill-sized write).

- float16 cache: kvcache.write_tokens, flashinfer.page.append_paged_kv_cache, a torch index_put_ into the flattened
  pool, and a contiguous copy of the same bytes (K and V each read once and written once).
- quantized caches (docs/layout.md, "Quantized pages"): kvcache.write_tokens quantizing into an FP8 per tensor, an FP8
  per token and head and an NVFP4 cache. Beside NVFP4, FlashInfer's own quantize-and-append,
  flashinfer.page.nvfp4_quantize_append_paged_kv_cache, into the same cache's pools and scale pool with the same global
  scales. Beside FP8 per tensor, torch's division and cast followed by flashinfer.page.append_paged_kv_cache: FlashInfer
  has no FP8 quantize-and-append of K and V alone (rope_quantize_fp8_append_paged_kv_cache also applies RoPE and
  quantizes the queries). Each format against a contiguous copy moving as many bytes: the float16 input read plus the
  codes and scales written, as a copy of half that traffic (which reads and writes it all).

Prints microseconds a call, GB/s of the bytes the row's copy moves, and each time as a ratio to that copy. FlashInfer is
optional (its rows are skipped without it). Where its rows run, what they wrote is checked against kvcache's write of
the same tokens: equal for float16, and for the quantized rows at least 99% of the bytes at the written tokens equal
(FlashInfer's NVFP4 kernel multiplies by reciprocals where docs/layout.md's rules divide, and torch divides in float16
before the cast, so a value at a rounding boundary may land on the neighbouring code); the shares are printed.

Usage: python python/bench/bench_kv_write.py [--tokens N] [--reps N]
"""

import argparse

import torch

import kvcache

TOKENS_PER_PAGE = 16
HEADS = 8
DIM = 128
FP8_MAX = 448.0
E2M1_MAX = 6.0
Q = kvcache.KVQuantization
# (name, quantization, storage type, bytes a (token, head, half) stores: codes and scales).
FORMATS = [("FP8 per tensor", Q.FP8_PER_TENSOR, kvcache.DataType.FP8_E4M3, DIM),
           ("FP8 per token-head", Q.FP8_PER_TOKEN_HEAD, kvcache.DataType.FP8_E4M3, DIM + 4),
           ("NVFP4", Q.NVFP4, kvcache.DataType.UINT8, DIM // 2 + DIM // 16)]
MIN_AGREEMENT = 0.99


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


def time_copy(nbytes, reps):
    """A contiguous device-to-device copy of `nbytes`."""
    source = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    return time_call(lambda: target.copy_(source), reps)


def make_cache(pages, dtype=kvcache.DataType.FLOAT16, quantization=Q.NONE):
    config = kvcache.Config(layer_configs=[(HEADS, DIM)], max_batch_size=1, max_sequence_length=pages * TOKENS_PER_PAGE,
                            tokens_per_page=TOKENS_PER_PAGE, kv_cache_type=dtype, quantization=quantization)
    return kvcache.KVCacheManager(config, torch.cuda.current_stream())


def written_bytes(cache, quantization, addresses):
    """The bytes layer 0 holds at `addresses`, K and V: {"codes": ..., "scales": ...} (scales where the cache keeps a
    scale pool)."""
    pool = torch.from_dlpack(cache.pool_view(0)).view(torch.uint8)  # [2, pages, P, H, bytes]
    slots = pool.shape[1] * pool.shape[2]
    pools = {"codes": pool}
    if quantization in (Q.FP8_PER_TOKEN_HEAD, Q.NVFP4):
        pools["scales"] = torch.from_dlpack(cache.scale_pool_view(0)).view(torch.uint8)
    return {what: torch.cat([half.reshape(slots, -1)[addresses].flatten() for half in bytes_of])
            for what, bytes_of in pools.items()}


class Peers:
    """The write's data and where it goes, in kvcache's and FlashInfer's forms."""

    def __init__(self, n):
        self.n = n
        self.pages = (n + TOKENS_PER_PAGE - 1) // TOKENS_PER_PAGE
        self.k = torch.randn(n, HEADS, DIM, device="cuda").half()
        self.v = torch.randn(n, HEADS, DIM, device="cuda").half()
        self.page_ids = torch.randperm(self.pages, device="cuda").to(torch.int32)
        self.positions = torch.arange(n, device="cuda", dtype=torch.int32)
        self.addresses = (self.page_ids[self.positions // TOKENS_PER_PAGE].long() * TOKENS_PER_PAGE
                          + self.positions % TOKENS_PER_PAGE)
        # FlashInfer's CSR form: one sequence over every page.
        self.kv_indptr = torch.tensor([0, self.pages], dtype=torch.int32, device="cuda")
        self.last_page_len = torch.tensor([n - (self.pages - 1) * TOKENS_PER_PAGE], dtype=torch.int32, device="cuda")
        self.batch_indices = torch.zeros(n, dtype=torch.int32, device="cuda")
        self.input_bytes = 2 * self.k.numel() * self.k.element_size()

    def append(self, flashinfer, k, v, pool):
        flashinfer.page.append_paged_kv_cache(k, v, self.batch_indices, self.positions, (pool[0], pool[1]),
                                              self.page_ids, self.kv_indptr, self.last_page_len, "NHD")


def float16_section(peers, flashinfer, reps):
    """(title, bytes the copy moves, rows of (name, us), agreements: none) for the float16 cache; checks FlashInfer's
    append."""
    stream = torch.cuda.current_stream()
    k, v, addresses = peers.k, peers.v, peers.addresses
    cache = make_cache(peers.pages)
    pool = torch.from_dlpack(cache.pool_view(0))  # [2, pages, P, H, D]
    flat_k = pool[0].view(-1, HEADS, DIM)
    flat_v = pool[1].view(-1, HEADS, DIM)
    rows = [("contiguous copy", time_copy(peers.input_bytes, reps)),
            ("kvcache.write_tokens", time_call(lambda: kvcache.write_tokens(cache, 0, k, v, addresses, stream), reps))]

    def index_put():
        flat_k.index_put_((addresses,), k)
        flat_v.index_put_((addresses,), v)

    rows.append(("torch index_put_", time_call(index_put, reps)))
    if flashinfer is not None:
        rows.append(("flashinfer append_paged_kv_cache", time_call(lambda: peers.append(flashinfer, k, v, pool), reps)))
        # Both wrote the same tokens to the same places: check the pool agrees with ours.
        kvcache.write_tokens(cache, 0, k, v, addresses, stream)
        torch.cuda.synchronize()
        assert torch.equal(flat_k[addresses], k) and torch.equal(flat_v[addresses], v)
    mib = peers.input_bytes / 2**20
    return f"float16 cache: {mib:.1f} MiB read, {mib:.1f} MiB written", peers.input_bytes, rows, []


def quantized_section(peers, flashinfer, reps, name, quantization, dtype, bytes_per_head):
    """As float16_section for a quantized cache, the copy moving the write's traffic; the agreements are the shares of
    the codes and of the scales the peer row wrote equal to kvcache's write, as (what, share) pairs."""
    stream = torch.cuda.current_stream()
    k, v, addresses = peers.k, peers.v, peers.addresses
    cache = make_cache(peers.pages, dtype, quantization)
    if quantization != Q.FP8_PER_TOKEN_HEAD:
        # docs/layout.md's calibration from the data: amax / 448 (FP8 per tensor), amax / (448 * 6) (NVFP4).
        divisor = FP8_MAX if quantization == Q.FP8_PER_TENSOR else FP8_MAX * E2M1_MAX
        cache.set_layer_scales(0, kvcache.LayerScales(*(float(x.abs().max().float() / divisor) for x in (k, v))))
    written = 2 * peers.n * HEADS * bytes_per_head
    copy_bytes = (peers.input_bytes + written) // 2
    rows = [("contiguous copy", time_copy(copy_bytes, reps)),
            ("kvcache.write_tokens", time_call(lambda: kvcache.write_tokens(cache, 0, k, v, addresses, stream), reps))]
    agreements = []
    if flashinfer is not None and quantization in (Q.FP8_PER_TENSOR, Q.NVFP4):
        kvcache.write_tokens(cache, 0, k, v, addresses, stream)
        ours = written_bytes(cache, quantization, addresses)
        pool = torch.from_dlpack(cache.pool_view(0))
        scales = cache.layer_scales(0)
        if quantization == Q.NVFP4:
            scale_pool = torch.from_dlpack(cache.scale_pool_view(0))  # float8_e4m3fn [2, pages, P, H, D / 16]

            def peer():
                flashinfer.page.nvfp4_quantize_append_paged_kv_cache(
                    k, v, peers.batch_indices, peers.positions, (pool[0], pool[1]), (scale_pool[0], scale_pool[1]),
                    peers.page_ids, peers.kv_indptr, peers.last_page_len, scales.k, scales.v, "NHD")

            peer_name = "flashinfer nvfp4_quantize_append_paged_kv_cache"
        else:

            def peer():
                fp8 = torch.float8_e4m3fn
                peers.append(flashinfer, (k / scales.k).to(fp8), (v / scales.v).to(fp8), pool)

            peer_name = "torch (x / scale).to(fp8) + flashinfer append"
        rows.append((peer_name, time_call(peer, reps)))
        torch.cuda.synchronize()
        theirs = written_bytes(cache, quantization, addresses)
        for what in ours:
            agreements.append((f"{peer_name}: {what} equal to kvcache's at the written tokens",
                               float((ours[what] == theirs[what]).float().mean())))
    title = (f"{name} cache: {peers.input_bytes / 2**20:.1f} MiB read, {written / 2**20:.1f} MiB of codes and scales "
             f"written; the copy moves {copy_bytes / 2**20:.1f} MiB")
    return title, copy_bytes, rows, agreements


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    try:
        import flashinfer
    except ImportError:
        flashinfer = None
    peers = Peers(args.tokens)
    sections = [float16_section(peers, flashinfer, args.reps)]
    for name, quantization, dtype, bytes_per_head in FORMATS:
        sections.append(quantized_section(peers, flashinfer, args.reps, name, quantization, dtype, bytes_per_head))

    print(f"{args.tokens} tokens, {HEADS}x{DIM} float16, {peers.input_bytes / 2**20:.1f} MiB of K and V, "
          f"{args.reps} reps" + ("" if flashinfer is not None else "; flashinfer not importable: its rows skipped"))
    failed = []
    for title, copy_bytes, rows, agreements in sections:
        print(title)
        copy_us = rows[0][1]
        for name, us in rows:
            print(f"{name:48s} {us:9.2f} us {copy_bytes / us * 1e-3:8.1f} GB/s {us / copy_us:7.3f} x copy")
        for what, share in agreements:
            print(f"  {what}: {100 * share:.3f}%")
            if share < MIN_AGREEMENT:
                failed.append(what)
    assert not failed, f"fewer than {100 * MIN_AGREEMENT:.0f}% of the bytes agree: {failed}"


if __name__ == "__main__":
    main()
