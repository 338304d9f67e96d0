#!/usr/bin/env python3
"""Host cost of a NIXL pull's descriptor indices (kvcache.nixl) against building its ranges.

The batch of docs/benchmarks.md: 256 sequences of 64 pages through 64 layers (float16, 8 KV heads of 128, 16 tokens
per page), page ids a shuffled permutation of the pool on both sides. It times what kvcache.nixl computes for one
pull_many of the batch through prepared lists:

- runs: descriptor_runs, which descriptor of one block each run of tokens is on each side;
- per-layer lists: the above, then layer_indices for each block count the group's layers have: the index lists every
  layer's transfer takes (per_layer=True, the default), shared by the layers;
- one list: the above, then every layer's indices joined into one list per side (per_layer=False);

and, for comparison, transfer_descriptors' ranges for the same batch, one call per sequence (what a pull built
before). Host only: no NIXL, no GPU; the pools are made-up addresses.

    python python/bench/bench_nixl_indices.py [--repeats N] [--local-page P] [--remote-page P] [--lists]
"""

import argparse
import time

import numpy as np

import kvcache
from kvcache.nixl import descriptor_runs, joined_indices, layer_indices

SEQUENCES = 256
PAGES = 64  # per sequence, of 16 tokens
LAYERS = 64


def description(tokens_per_page, address):
    config = kvcache.Config(layer_configs=[(8, 128)] * LAYERS, max_batch_size=SEQUENCES,
                            max_sequence_length=PAGES * 16, tokens_per_page=tokens_per_page)
    layout = kvcache.compute_layout(config)
    parts = sum(len(group.layers) for group in layout.groups)
    sizes = kvcache.transfer_registration(kvcache.layout_transfer_description(layout, [0] * parts))
    bases = (address + np.concatenate([[0], np.cumsum([int(size) for _, size, _ in sizes])[:-1]])).tolist()
    return kvcache.layout_transfer_description(layout, bases), layout.groups[0].num_pages


def page_table(pool_pages, tokens_per_page, seed):
    pages = PAGES * 16 // tokens_per_page
    return np.random.default_rng(seed).permutation(pool_pages)[:SEQUENCES * pages].astype(np.int32).reshape(
        SEQUENCES, pages)


def best(repeats, run):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times), float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--local-page", type=int, default=16)
    parser.add_argument("--remote-page", type=int, default=16)
    parser.add_argument("--lists", action="store_true", help="page ids as Python lists (PageManager.pages gives "
                        "those) rather than [sequences, pages] arrays")
    args = parser.parse_args()
    local, local_pool = description(args.local_page, 0x7000_0000_0000)
    remote, remote_pool = description(args.remote_page, 0x5000_0000_0000)
    local_pages = page_table(local_pool, args.local_page, 1)
    remote_pages = page_table(remote_pool, args.remote_page, 2)
    if args.lists:
        local_pages, remote_pages = local_pages.tolist(), remote_pages.tolist()
    tokens = PAGES * 16
    run_tokens, sources = kvcache.transfer_prepared_plan(local, [remote], 0)
    assert min(sources) == 0, "the benchmark's layers come whole from the remote"
    sides = [kvcache.transfer_prepared_descriptors(d, 0, run_tokens) for d in (local, remote)]
    blocks_per_layer = [[int(end - start) for start, end in zip(np.concatenate([[0], ends[:-1]]), ends)]
                        for _, ends, _, _ in sides]
    per_block = [num_pages * per_page for _, _, num_pages, per_page in sides]
    layer_starts = [(np.concatenate([[0], ends[:-1]]) * n).tolist() for (_, ends, _, _), n in zip(sides, per_block)]

    def runs():
        return descriptor_runs(local_pages, remote_pages, tokens, args.local_page, args.remote_page, local_pool,
                               remote_pool)

    def per_layer_lists():
        result = []
        for side, side_runs in enumerate(runs()):
            shared = {blocks: layer_indices(side_runs, blocks, per_block[side])
                      for blocks in set(blocks_per_layer[side])}
            result.append(shared)
        return result

    def one_list():
        shared = per_layer_lists()
        return [joined_indices(list(range(LAYERS)), layer_starts[side], blocks_per_layer[side], shared[side])
                for side in range(2)]

    def ranges():
        return [kvcache.transfer_descriptors(local, mine, [remote], theirs, 0, tokens)
                for mine, theirs in zip(local_pages, remote_pages)]

    count = len(runs()[0])
    shared = sum(len(lists) for lists in per_layer_lists()[0].values())
    whole = len(one_list()[0])
    num_ranges = sum(len(r[0][0]) for r in ranges())
    print(f"{SEQUENCES} sequences x {PAGES} pages of 16 tokens x {LAYERS} layers, local pages of {args.local_page}, "
          f"remote of {args.remote_page}, page ids as {'lists' if args.lists else 'arrays'}; best and median of "
          f"{args.repeats}:")
    for name, run, size in (("runs", runs, f"{count} runs"),
                            ("per-layer lists", per_layer_lists, f"{shared} indices a side, shared by the layers"),
                            ("one list", one_list, f"{whole} indices a side"),
                            ("ranges", ranges, f"{num_ranges} ranges a side")):
        low, median = best(args.repeats if name != "ranges" else max(3, args.repeats // 10), run)
        print(f"  {name:16s} {low * 1e3:8.3f} ms  {median * 1e3:8.3f} ms  ({size})")


if __name__ == "__main__":
    main()
