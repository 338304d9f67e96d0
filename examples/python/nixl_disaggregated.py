#!/usr/bin/env python3
"""Disaggregated prefill and decode over NIXL: two processes, each with its own kvcache cache on the GPU.

The prefill process writes a prompt's keys and values with kvcache.write_tokens into pages of 16 tokens, registers
its cache with a NIXL agent and writes what the decode process needs (its agent metadata, its cache's transfer
description, the prompt's pages per group, and the bytes it wrote, for the check) to a file. The decode process has
pages of 64 tokens: it allocates the prompt's pages, pulls them from the prefill process through NIXL, layer by layer,
and checks every byte of every token both sides hold (values and scales, K and V, a windowed group included) against
what the prefill process wrote. Both caches also hold two recurrent state layers (a hybrid model's): the decode
process pulls the prompt's state slot into its own sequence's slot and checks it byte for byte, and that no other
slot changed. Then it notifies the prefill process, which exits.

    python nixl_disaggregated.py --quantization nvfp4                      # both processes, then the check
    python nixl_disaggregated.py --role prefill --exchange DIR &           # or each process alone
    python nixl_disaggregated.py --role decode --exchange DIR

With --bench, it also times pulling eight interleaved sequences' pages (one pull_many per group: its transfers name
descriptors of lists each side prepared once) against NIXL moving one contiguous buffer of the same bytes between the
same two processes, and prints the ratio and the host time to start the pulls.

Needs torch with CUDA, kvcache and NIXL (pip install nixl-cu13; kvcache does not depend on it).
"""

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import kvcache
from kvcache.nixl import NixlPages

LAYERS = [(8, 128), (8, 128, 96), (4, 64)]  # (KV heads, head size[, sliding window])
PROMPT_TOKENS = 600
CHUNK = 128  # tokens per step: the windowed group releases pages as the prompt grows
# Two state layers, as a gated delta net keeps them: a short convolution's window and the recurrent state.
STATE_LAYERS = [[("conv", [3, 1024], kvcache.DataType.BFLOAT16), ("recurrent", [8, 64, 128], kvcache.DataType.FLOAT32)],
                [("conv", [3, 512], kvcache.DataType.BFLOAT16)]]
POISON = 0xEE
DTYPES = {"none": kvcache.DataType.FLOAT16, "fp8_per_token_head": kvcache.DataType.FP8_E4M3,
          "nvfp4": kvcache.DataType.UINT8}
QUANTIZATIONS = {"none": kvcache.KVQuantization.NONE, "fp8_per_token_head": kvcache.KVQuantization.FP8_PER_TOKEN_HEAD,
                 "nvfp4": kvcache.KVQuantization.NVFP4}


def make_cache(args, tokens_per_page, batch=8):
    states = [kvcache.StateLayerConfig([kvcache.StateTensorConfig(name, shape, dtype) for name, shape, dtype in layer])
              for layer in STATE_LAYERS]
    config = kvcache.Config(layer_configs=LAYERS, max_batch_size=batch, max_sequence_length=4096,
                            tokens_per_page=tokens_per_page, max_tokens_per_step=CHUNK,
                            kv_cache_type=DTYPES[args.quantization], quantization=QUANTIZATIONS[args.quantization],
                            state_layer_configs=states)
    cache = kvcache.KVCacheManager(config)
    if args.quantization == "nvfp4":
        for layer in range(len(LAYERS)):
            cache.set_layer_scales(layer, kvcache.LayerScales(0.5 + layer, 0.25 + layer))
    return cache, kvcache.PageManager(cache, enable_prefix_caching=False)


def append_prompt(manager, sequences, num_tokens):
    """Appends num_tokens tokens to every sequence, CHUNK at a time, the sequences interleaved step by step."""
    steps = []
    for start in range(0, num_tokens, CHUNK):
        count = min(CHUNK, num_tokens - start)
        manager.step([(s, list(range(start, start + count))) for s in sequences])
        steps.append((start, count))
    return steps


def part_bytes(cache, layer):
    """The layer's pools as raw bytes [halves, pages, tokens per page, bytes per token]: data, then page scales."""
    views = [cache.pool_view(layer)]
    if cache.get_config().quantization in (kvcache.KVQuantization.FP8_PER_TOKEN_HEAD, kvcache.KVQuantization.NVFP4):
        views.append(cache.scale_pool_view(layer))
    parts = []
    for view in views:
        tensor = torch.from_dlpack(view)
        raw = tensor.view(torch.uint8) if tensor.element_size() == 1 else tensor.contiguous().view(torch.uint8)
        parts.append(raw.reshape(raw.shape[0], raw.shape[1], raw.shape[2], -1))
    return parts


def token_rows(cache, manager, sequence, layer):
    """Per part, the sequence's tokens [halves, length, bytes per token] (rows of released pages zero) and a mask of
    the tokens whose page is held."""
    group = cache.group_of(layer)
    pages, length = manager.pages(sequence, group)
    p = cache.tokens_per_page()
    held = np.repeat(np.array(pages) != kvcache.UNUSED_PAGE_ENTRY, p)[:length]
    rows = []
    for part in part_bytes(cache, layer):
        index = torch.tensor([max(page, 0) for page in pages], device=part.device)
        gathered = part[:, index].reshape(part.shape[0], len(pages) * p, part.shape[3])[:, :length]
        rows.append(gathered.cpu().numpy())
    return rows, held


def write_prompt(cache, manager, sequence, steps, seed):
    """Writes random keys and values for each step's tokens into every layer (quantized as the cache says)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    p = cache.tokens_per_page()
    for start, count in steps:
        for layer, shape in enumerate(LAYERS):
            heads, dim = shape[0], shape[1]
            k = torch.randn(count, heads, dim, device="cuda", dtype=torch.float16, generator=generator)
            v = torch.randn(count, heads, dim, device="cuda", dtype=torch.float16, generator=generator) * 2 + 1
            pages, _ = manager.pages(sequence, cache.group_of(layer))
            addresses = torch.tensor([pages[t // p] * p + t % p for t in range(start, start + count)],
                                     dtype=torch.int64, device="cuda")
            kvcache.write_tokens(cache, layer, k, v, addresses)
    torch.cuda.synchronize()


def state_bytes(cache):
    """Every state tensor as raw bytes [slots, bytes a slot], in state layer and tensor order."""
    views = []
    for layer, tensors in enumerate(STATE_LAYERS):
        for tensor in range(len(tensors)):
            view = torch.from_dlpack(cache.state_view(layer, tensor))
            views.append(view.view(torch.uint8).reshape(view.shape[0], -1))
    return views


def agent(name):
    from nixl._api import nixl_agent, nixl_agent_config
    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def prefill(args):
    cache, manager = make_cache(args, 16)
    sequences = [manager.create() for _ in range(8 if args.bench else 1)]
    steps = append_prompt(manager, sequences, PROMPT_TOKENS if not args.bench else 2048)
    for i, sequence in enumerate(sequences):
        write_prompt(cache, manager, sequence, steps, seed=100 + i)
    for raw in state_bytes(cache):  # what a recurrent kernel would have left in every slot
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, device="cuda"))
    [state_slot] = manager.state_slots([sequences[0]])
    pages = NixlPages.for_cache(agent("prefill"), cache)
    if args.bench:  # registered before the metadata is taken: the metadata lists what the peer may read
        buffer = torch.randint(0, 255, (args.bench_bytes,), dtype=torch.uint8, device="cuda")
        contiguous = pages.agent.register_memory(buffer)
    metadata, description = pages.metadata()
    record = {"metadata": metadata, "description": description, "tokens": manager.length(sequences[0]),
              "pages": [[manager.pages(s, g)[0] for g in range(manager.num_groups())] for s in sequences],
              "rows": [token_rows(cache, manager, sequences[0], layer) for layer in range(len(LAYERS))],
              "state_slot": state_slot, "states": [raw[state_slot].cpu().numpy() for raw in state_bytes(cache)]}
    if args.bench:
        record["contiguous"] = (buffer.data_ptr(), buffer.numel(), buffer.device.index)
    exchange = Path(args.exchange)
    (exchange / "prefill.tmp").write_bytes(pickle.dumps(record))
    os.replace(exchange / "prefill.tmp", exchange / "prefill.pkl")
    deadline = time.monotonic() + 300
    while not pages.agent.check_remote_xfer_done("decode", b"pulled"):
        if time.monotonic() > deadline:
            sys.exit("prefill: no notification from the decode process")
        time.sleep(0.001)
    if args.bench:
        pages.agent.deregister_memory(contiguous)
    pages.close()
    print("prefill: the decode process pulled the prompt")


def bench(args, pages, peer, record, cache, manager):
    """Times pulling the eight sequences' pages against one contiguous buffer of the same bytes; returns the ratio."""
    groups = manager.num_groups()
    local = [manager.create() for _ in record["pages"]]
    append_prompt(manager, local, record["tokens"])

    def start_pulls(per_layer):
        """One pull per group, of every sequence: the group's transfers name descriptors of the prepared lists."""
        return [pages.pull_many([peer], [manager.pages(s, g)[0] for s in local],
                                [remote[g] for remote in record["pages"]], g, record["tokens"], per_layer=per_layer)
                for g in range(groups)]

    def pull_all(per_layer):
        for pull in start_pulls(per_layer):
            pull.wait()

    moved = 0
    for s, remote in zip(local, record["pages"]):
        for g in range(groups):
            [(mine, _, _)] = kvcache.transfer_descriptors(pages.description, manager.pages(s, g)[0],
                                                          [pages._peers[peer]], remote[g], g, record["tokens"])
            moved += int(mine[:, 1].sum())
    address, size, device = record["contiguous"]
    size = min(size, moved)
    buffer = torch.empty(size, dtype=torch.uint8, device="cuda")
    registered = pages.agent.register_memory(buffer)
    local_descs = pages.agent.get_xfer_descs([(buffer.data_ptr(), size, buffer.device.index)], "VRAM")
    remote_descs = pages.agent.get_xfer_descs([(address, size, device)], "VRAM")

    def pull_contiguous():
        handle = pages.agent.initialize_xfer("READ", local_descs, remote_descs, peer)
        pages.agent.transfer(handle)
        while pages.agent.check_xfer_state(handle) != "DONE":
            pass
        pages.agent.release_xfer_handle(handle)

    def timed(run):
        run()
        best = float("inf")
        for _ in range(args.reps):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
        return best

    results = []
    for _ in range(2):  # two rounds, alternating, so drift shows
        for per_layer in (False, True):
            pages_s = timed(lambda: pull_all(per_layer))
            contiguous_s = timed(pull_contiguous)
            results.append((per_layer, pages_s, contiguous_s))
    pages.agent.deregister_memory(registered)
    for per_layer, pages_s, contiguous_s in results:
        print(f"bench: {moved / 1e6:.1f} MB of pages ({'a transfer per layer' if per_layer else 'a transfer per pull'}) "
              f"in {pages_s * 1e3:.3f} ms ({moved / pages_s / 1e9:.1f} GB/s), one contiguous buffer in "
              f"{contiguous_s * 1e3:.3f} ms ({size / contiguous_s / 1e9:.1f} GB/s): "
              f"{(moved / pages_s) / (size / contiguous_s):.3f} of contiguous")
    prepared = all(pages.uses_prepared_lists([peer], g) for g in range(groups))
    for per_layer in (False, True):
        start = time.perf_counter()
        pulls = start_pulls(per_layer)
        started = time.perf_counter() - start
        for pull in pulls:
            pull.wait()
        how = "a transfer per layer" if per_layer else "a transfer per pull"
        named = "named in prepared lists" if prepared else "built from ranges"
        print(f"bench: {len(local)} sequences x {groups} groups: transfers ({how}) {named} and started in "
              f"{started * 1e3:.3f} ms on the host")


def decode(args):
    exchange = Path(args.exchange)
    deadline = time.monotonic() + 300
    while not (exchange / "prefill.pkl").exists():
        if time.monotonic() > deadline:
            sys.exit("decode: the prefill process wrote nothing")
        time.sleep(0.05)
    record = pickle.loads((exchange / "prefill.pkl").read_bytes())
    cache, manager = make_cache(args, 64, batch=16)
    pages = NixlPages.for_cache(agent("decode"), cache)
    peer = pages.add_peer(record["metadata"], record["description"])
    other = manager.create()  # holds slot 0, so the pulled state lands in another slot than it left
    sequence = manager.create()
    append_prompt(manager, [other, sequence], record["tokens"])
    states = state_bytes(cache)
    for raw in states:
        raw.fill_(POISON)
    torch.cuda.synchronize()
    [slot] = manager.state_slots([sequence])
    state_pull = pages.pull_states(peer, [slot], [record["state_slot"]])
    for group in range(manager.num_groups()):
        mismatch = pages.mismatch(peer, group)
        assert mismatch == "", mismatch
        pull = pages.pull([peer], manager.pages(sequence, group)[0], record["pages"][0][group], group,
                          record["tokens"])
        for layer in range(pull.num_layers):
            pull.wait_layer(layer)  # a decode step could run this layer's attention now
        pull.wait()
    state_pull.wait()
    torch.cuda.synchronize()
    checked = 0
    for index, (raw, theirs) in enumerate(zip(states, record["states"])):
        mine = raw.cpu().numpy()
        if not np.array_equal(mine[slot], theirs):
            sys.exit(f"decode: state tensor {index}: slot {slot} differs from the prefill's slot "
                     f"{record['state_slot']}")
        if not (np.delete(mine, slot, axis=0) == POISON).all():
            sys.exit(f"decode: state tensor {index}: a slot other than {slot} was written")
        checked += int(theirs.size)
    for layer in range(len(LAYERS)):
        rows, held = token_rows(cache, manager, sequence, layer)
        their_rows, their_held = record["rows"][layer]
        both = held & their_held
        assert both.sum() > 0, f"layer {layer}: no token held on both sides"
        for part, (mine, theirs) in enumerate(zip(rows, their_rows)):
            if not np.array_equal(mine[:, both], theirs[:, both]):
                bad = np.argwhere(mine[:, both] != theirs[:, both])[0]
                sys.exit(f"decode: layer {layer} part {part}: byte {tuple(bad)} differs")
            checked += int(mine[:, both].size)
    print(f"decode: {record['tokens']} tokens of {len(LAYERS)} layers ({args.quantization}) pulled from pages of 16 "
          f"into pages of 64 tokens, and the state of {len(STATE_LAYERS)} state layers from slot "
          f"{record['state_slot']} into slot {slot}: {checked} bytes equal")
    if args.bench:
        bench(args, pages, peer, record, cache, manager)
    pages.agent.send_notif(peer, b"pulled")
    pages.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["both", "prefill", "decode"], default="both")
    parser.add_argument("--exchange", help="folder both processes read and write (default: a temporary one)")
    parser.add_argument("--quantization", choices=sorted(QUANTIZATIONS), default="none")
    parser.add_argument("--bench", action="store_true")
    parser.add_argument("--bench-bytes", type=int, default=256 << 20)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--decode-prefix", default="", help="command the decode process runs under (both: e.g. "
                        "'compute-sanitizer --tool memcheck')")
    args = parser.parse_args()
    if args.role == "prefill":
        return prefill(args)
    if args.role == "decode":
        return decode(args)
    with tempfile.TemporaryDirectory() as exchange:
        common = [sys.argv[0], "--exchange", exchange, "--quantization", args.quantization, "--reps", str(args.reps),
                  "--bench-bytes", str(args.bench_bytes)] + (["--bench"] if args.bench else [])
        first = subprocess.Popen([sys.executable] + common + ["--role", "prefill"])
        second = subprocess.run(args.decode_prefix.split() + [sys.executable] + common + ["--role", "decode"])
        code = first.wait(timeout=300)
        sys.exit(second.returncode or code)


if __name__ == "__main__":
    main()
