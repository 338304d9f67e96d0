#!/usr/bin/env python3
"""A transformers model served over kvcache: its K and V live in kvcache's pages, FlashInfer reads them, and the
logits at every position served are compared with transformers' own run of the whole sequence.

The model is transformers' Qwen3ForCausalLM with random weights: grouped-query attention with q and k norms, and
layers alternating full attention with a sliding window (a windowed page group). The runtime around it uses only
kvcache's API and FlashInfer, with no per-step array built by hand:
- PageManager.step() takes the step's (sequence, tokens) entries and returns the page copies, which copy_pages runs;
- StepArguments builds, in one call and one upload, the token positions (the rotary embedding's position ids and the
  write's rows), qo_indptr and each page group's tables, at their group's width;
- write_tokens_paged writes each layer's new K and V (quantizing in the quantized formats);
- attention_arguments gives FlashInfer's quantization arguments for each layer (docs/flashinfer.md).

The batch is continuous: a chunked prefill, a fork (copy-on-write of the shared partly filled page), a sequence that
joins after the first steps and one that finishes and is freed while the others go on. Tokens are fixed in advance
(teacher forcing), so every served position has a reference logit.

Formats: float16, FP8 per tensor, FP8 per token and head, NVFP4. The per-tensor scales (FP8 per tensor, NVFP4's
global scales) are calibrated from WriteCounters over a first run of the same batch, which is then freed. The
quantized formats are compared with a bound on the relative error of the logits (the quantization's own error); a
page read from the wrong place costs far more.

Needs a GPU, torch, transformers and flashinfer; exits 77 with the reason without them. Exits 1 when a format's
logits are outside their bound or a write placed a token outside the tables.
"""

import argparse
import copy
import sys

import kvcache

TOKENS_PER_PAGE = 16
HEAD_DIM = 128
KV_HEADS = 2
QO_HEADS = 4
WINDOW = 32
LAYER_TYPES = ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]
VOCAB = 512
MAX_BATCH = 4
MAX_SEQUENCE = 256
MAX_TOKENS_PER_STEP = 128
Q = kvcache.KVQuantization
STORAGE = {Q.NONE: kvcache.DataType.FLOAT16, Q.FP8_PER_TENSOR: kvcache.DataType.FP8_E4M3,
           Q.FP8_PER_TOKEN_HEAD: kvcache.DataType.FP8_E4M3, Q.NVFP4: kvcache.DataType.UINT8}
# Bound on the relative L2 error of the served logits against transformers' float32 run: float16 rounding for
# float16 pages; for the quantized formats, the error their codes add.
BOUNDS = {Q.NONE: 0.01, Q.FP8_PER_TENSOR: 0.08, Q.FP8_PER_TOKEN_HEAD: 0.08, Q.NVFP4: 0.25}

# The schedule: each step lists (sequence name, tokens to add). "C" forks from "A" before step 3; "D" joins at step 4;
# "B" (prefilled in two chunks) is freed after step 5.
PROMPTS = {"A": 50, "B": 90, "D": 37}
SCHEDULE = [
    [("A", 50), ("B", 45)],
    [("A", 1), ("B", 45)],
    [("A", 1), ("B", 1)],
    [("A", 1), ("C", 1), ("B", 1), ("D", 37)],
    [("A", 1), ("C", 1), ("B", 1), ("D", 1)],
    [("C", 1), ("A", 1), ("D", 1)],
    [("A", 1), ("C", 1), ("D", 1)],
]
FORK = (2, "A", "C")  # before step 2 (0-based), C forks from A
FREE = (5, "B")  # before step 5, B is freed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quantization", choices=[q.name.lower() for q in BOUNDS], action="append",
                        help="formats to serve (default: all)")
    args = parser.parse_args()
    reason = kvcache.gpu_unavailable_reason()
    try:
        import torch
        import transformers
        import flashinfer
    except ImportError as error:
        reason = reason or f"{error.name} is not importable"
    if reason or not torch.cuda.is_available():
        print(f"serve_transformers.py needs a GPU, torch, transformers and flashinfer: "
              f"{reason or 'torch.cuda.is_available() is False'}")
        return 77

    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=QO_HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, max_position_embeddings=512,
        use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0, layer_types=LAYER_TYPES,
        tie_word_embeddings=False)
    reference_model = transformers.Qwen3ForCausalLM(config).to("cuda", torch.float32).eval()
    model = copy.deepcopy(reference_model).half()  # the served model: the same weights in float16

    tokens = sequence_tokens(torch)
    with torch.no_grad():
        reference = {name: reference_model(ids[None]).logits[0] for name, ids in tokens.items()}

    formats = [q for q in BOUNDS if args.quantization is None or q.name.lower() in args.quantization]
    failed = False
    for quantization in formats:
        failed |= not serve_and_check(torch, flashinfer, model, tokens, reference, quantization)
    return 1 if failed else 0


def sequence_tokens(torch):
    """Each sequence's whole token list: its prompt and the tokens fed at its decode steps. C is A's first tokens up
    to the fork, then tokens of its own."""
    lengths = {name: 0 for name in ("A", "B", "C", "D")}
    for index, step in enumerate(SCHEDULE):
        if index == FORK[0]:
            lengths["C"] = lengths["A"]
        for name, count in step:
            lengths[name] += count
    generator = torch.Generator(device="cuda").manual_seed(1)
    tokens = {name: torch.randint(0, VOCAB, (length,), device="cuda", generator=generator)
              for name, length in lengths.items()}
    fork_length = sum(count for step in SCHEDULE[:FORK[0]] for name, count in step if name == "A")
    tokens["C"][:fork_length] = tokens["A"][:fork_length]
    return tokens


class Runtime:
    """The serving side: a cache in one format, its page manager, the step arguments and one FlashInfer prefill
    wrapper per page group."""

    def __init__(self, torch, flashinfer, model, quantization):
        self.torch, self.model = torch, model
        self.stream = torch.cuda.current_stream()
        layers = [(KV_HEADS, HEAD_DIM, WINDOW if kind == "sliding_attention" else 0) for kind in LAYER_TYPES]
        config = kvcache.Config(layer_configs=layers, max_batch_size=MAX_BATCH, max_sequence_length=MAX_SEQUENCE,
                                tokens_per_page=TOKENS_PER_PAGE, kv_cache_type=STORAGE[quantization],
                                quantization=quantization, max_tokens_per_step=MAX_TOKENS_PER_STEP)
        # On torch's stream: the cache's page operations and torch's kernels are ordered without events.
        self.cache = kvcache.KVCacheManager(config, self.stream)
        self.quantization = quantization
        self.poison()
        self.manager = kvcache.PageManager(self.cache, enable_prefix_caching=False)
        self.arguments = kvcache.StepArguments(self.manager, MAX_BATCH, MAX_TOKENS_PER_STEP, self.stream)
        self.counters = kvcache.WriteCounters(self.cache) if quantization != Q.NONE else None
        self.unwritten = torch.zeros(1, dtype=torch.int32, device="cuda")
        workspace = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
        self.wrappers = [flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
                         for _ in range(self.cache.num_groups())]
        self.groups = [self.cache.group_of(layer) for layer in range(len(LAYER_TYPES))]
        self.windows = [WINDOW if kind == "sliding_attention" else 0 for kind in LAYER_TYPES]

    def poison(self):
        """Fills every pool and scale pool with a finite pattern, so attention over a token no write placed goes
        wrong: FlashInfer reads every token its tables list."""
        for layer in range(self.cache.num_layers()):
            self.torch.from_dlpack(self.cache.pool_view(layer)).view(self.torch.uint8).fill_(0x3B)
            if self.quantization in (Q.FP8_PER_TOKEN_HEAD, Q.NVFP4):
                self.torch.from_dlpack(self.cache.scale_pool_view(layer)).view(self.torch.uint8).fill_(0x3B)

    def layer_arguments(self, layer):
        """(kv data type, paged cache, plan's and run's keyword arguments) of a layer, from attention_arguments as
        docs/flashinfer.md shows."""
        torch = self.torch
        pool = torch.from_dlpack(self.cache.pool_view(layer))
        arguments = self.cache.attention_arguments(layer)
        plan, run = {}, {}
        if arguments["token_head_scales"]:
            plan["use_token_head_sf"] = True
        elif self.quantization != Q.NONE:
            run["k_scale"], run["v_scale"] = arguments["k_scale"], arguments["v_scale"]
        if arguments["k_scale_pool"] is not None:
            run["kv_cache_sf"] = tuple(torch.from_dlpack(arguments[half]) for half in ("k_scale_pool", "v_scale_pool"))
        return pool.dtype, (pool[0], pool[1]), plan, run

    def step(self, entries):
        """Runs one step: entries is [(sequence, token ids tensor)]. Returns the logits of every new token, one
        tensor [tokens, vocab] per entry."""
        torch, model = self.torch, self.model
        appends = [(sequence, ids.tolist()) for sequence, ids in entries]
        copies = self.manager.step(appends)
        for group, pairs in enumerate(copies):
            if pairs:
                self.cache.copy_pages(pairs, self.stream, group=group)
        self.arguments.build(appends, self.stream)
        positions = torch.from_dlpack(self.arguments.positions())
        qo_indptr = torch.from_dlpack(self.arguments.qo_indptr())
        for group, wrapper in enumerate(self.wrappers):
            layer = self.groups.index(group)
            kv_type, _, plan, _ = self.layer_arguments(layer)
            wrapper.plan(qo_indptr, torch.from_dlpack(self.arguments.indptr(group)),
                         torch.from_dlpack(self.arguments.indices(group)),
                         torch.from_dlpack(self.arguments.last_page_len(group)), QO_HEADS, KV_HEADS, HEAD_DIM,
                         TOKENS_PER_PAGE, causal=True, window_left=self.windows[layer] - 1,
                         q_data_type=torch.float16, kv_data_type=kv_type, **plan)

        inner = model.model
        hidden = inner.embed_tokens(torch.cat([ids for _, ids in entries]))
        cos, sin = inner.rotary_emb(hidden[None], positions[:, 1].long()[None])
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]  # [tokens, 1, head_dim]
        count = hidden.shape[0]
        for layer, block in enumerate(inner.layers):
            attention = block.self_attn
            x = block.input_layernorm(hidden)
            q = attention.q_norm(attention.q_proj(x).view(count, QO_HEADS, HEAD_DIM))
            k = attention.k_norm(attention.k_proj(x).view(count, KV_HEADS, HEAD_DIM))
            v = attention.v_proj(x).view(count, KV_HEADS, HEAD_DIM)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            group = self.groups[layer]
            kvcache.write_tokens_paged(self.cache, layer, k.contiguous(), v.contiguous(), self.arguments.indptr(group),
                                       self.arguments.indices(group), self.arguments.first_token(group),
                                       self.arguments.positions(), self.stream, error_count=self.unwritten,
                                       counters=self.counters)
            _, paged_cache, _, run = self.layer_arguments(layer)
            out = self.wrappers[group].run(q.contiguous(), paged_cache, **run)
            hidden = hidden + attention.o_proj(out.reshape(count, QO_HEADS * HEAD_DIM))
            hidden = hidden + block.mlp(block.post_attention_layernorm(hidden))
        logits = model.lm_head(inner.norm(hidden)).float()
        rows = self.arguments.host_qo_indptr()
        return [logits[rows[b]:rows[b + 1]] for b in range(len(entries))]

    def calibrate(self):
        """Sets each layer's per-tensor scales from the amax its writes observed."""
        for layer, observed in enumerate(self.counters.read(self.stream)):
            self.cache.calibrate_layer_scales(layer, observed)
        self.counters.reset(self.stream)


def rotate(x, cos, sin):
    """The rotary embedding (the rotate-half form): x [tokens, heads, head_dim]."""
    half = x.shape[-1] // 2
    rotated = x.new_empty(x.shape)
    rotated[..., :half] = -x[..., half:]
    rotated[..., half:] = x[..., :half]
    return x * cos + rotated * sin


def serve(runtime, tokens):
    """Serves the schedule. Returns each sequence's logits at every position it was fed."""
    torch = runtime.torch
    sequences, fed, logits = {}, {}, {}
    for index, step in enumerate(SCHEDULE):
        if index == FORK[0]:
            sequences[FORK[2]] = runtime.manager.fork(sequences[FORK[1]])
            fed[FORK[2]] = fed[FORK[1]]
            logits[FORK[2]] = list(logits[FORK[1]])
        if index == FREE[0]:
            runtime.manager.free(sequences.pop(FREE[1]))
        entries = []
        for name, count in step:
            if name not in sequences:
                sequences[name] = runtime.manager.create()
                fed[name], logits[name] = 0, []
            entries.append((sequences[name], tokens[name][fed[name]:fed[name] + count]))
            fed[name] += count
        for (name, _), out in zip(step, runtime.step(entries)):
            logits[name].append(out)
    for sequence in sequences.values():
        runtime.manager.free(sequence)
    runtime.manager.check_invariants()
    return {name: torch.cat(parts) for name, parts in logits.items()}


def serve_and_check(torch, flashinfer, model, tokens, reference, quantization):
    runtime = Runtime(torch, flashinfer, model, quantization)
    with torch.no_grad():
        if quantization in (Q.FP8_PER_TENSOR, Q.NVFP4):
            serve(runtime, tokens)  # the calibration run
            runtime.calibrate()
            runtime.poison()
        served = serve(runtime, tokens)
    torch.cuda.synchronize()
    errors, norms, agree, positions = 0.0, 0.0, 0, 0
    for name, got in served.items():
        expected = reference[name]
        errors += float((got - expected).square().sum())
        norms += float(expected.square().sum())
        agree += int((got.argmax(-1) == expected.argmax(-1)).sum())
        positions += got.shape[0]
    relative = (errors / norms) ** 0.5
    saturated = ""
    if runtime.counters is not None:
        counts = runtime.counters.read(runtime.stream)
        saturated = f", values clipped {sum(c.k_saturated + c.v_saturated for c in counts)}"
    unwritten = runtime.unwritten.item()
    ok = relative <= BOUNDS[quantization] and unwritten == 0
    print(f"{quantization.name:<20} {positions} positions in {len(served)} sequences: logits relative L2 error "
          f"{relative:.2e} (bound {BOUNDS[quantization]:.0e}), same argmax at {agree}/{positions}{saturated}"
          f"{'' if ok else '  FAILED'}")
    if unwritten:
        print(f"FAILED: {unwritten} tokens lie outside the page tables and were not written")
    return ok


if __name__ == "__main__":
    sys.exit(main())
