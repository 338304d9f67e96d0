#!/usr/bin/env python3
"""A hybrid transformers model served over kvcache: the attention layer's K and V live in kvcache's pages and the gated
delta net layers' convolution and recurrent states in its state slots; the logits at every position served are
compared with transformers' own run of the whole sequence.

The model is transformers' Qwen3NextForCausalLM with random weights, float32: three gated delta net layers and one
gated full-attention layer (Qwen3-Next's pattern), dense MLPs. The runtime around it runs the fork's state copies
with copy_states and its page copies with copy_pages, sets the states of a new sequence to zero, and runs each layer
with the model's own modules and functions (transformers' torch gated delta rule and convolution update) on the
states gathered through the step's slot table (StepArguments.state_slots, on the device) and scattered back through
it. Attention reads the pages through the step's tables from StepArguments, in torch.

The batch is continuous: a chunked prefill, a fork (the child's state copied from its parent's slot), sequences that
join later and one that is freed while the others go on. Prefix caching is on: each prefill stops where the page
manager asks for a state checkpoint (checkpoint_boundary), and the runtime saves the state there (checkpoint_state);
a later sequence whose prompt starts with an earlier one's adopts its pages and gets its state restored from the
checkpoint (adopt_prefix), then runs only the rest. Every page and state slot is filled with NaN first, so a state or
token the runtime did not set shows in the logits.

Needs a GPU, torch and transformers; exits 77 with the reason without them, 1 when the logits differ from
transformers' by more than float32 arithmetic explains.
"""

import sys

import kvcache

TOKENS_PER_PAGE = 16
LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
VOCAB = 512
HIDDEN = 256
HEAD_DIM = 64
KV_HEADS = 2
QO_HEADS = 4
K_HEADS, V_HEADS, K_DIM, V_DIM, CONV_KERNEL = 2, 4, 32, 32, 4
CONV_DIM = 2 * K_HEADS * K_DIM + V_HEADS * V_DIM
MAX_BATCH = 4
MAX_SEQUENCE = 256
MAX_TOKENS_PER_STEP = 128
# Relative L2 error of the logits against transformers' run: both float32, so only the order of the arithmetic
# differs (the gated delta rule's chunks start at other tokens when a prefill is split); a lost or mixed-up state or
# page costs orders of magnitude more.
BOUND = 1e-3

# The batch: A and B start at step 0 (B's 115-token prompt in chunks of at most MAX_CHUNK), C forks from A before
# step 2, D joins at step 3; B is freed before step 4, where E joins with A's 40-token prompt followed by 10 tokens
# of its own. Each prompt's prefill stops at the boundary the page manager asks for, whose state the runtime then
# checkpoints; E adopts A's first two pages and restores A's state after them from that checkpoint. After its prompt
# each sequence is fed DECODE tokens, one a step.
PROMPTS = {"A": 40, "B": 115, "D": 29}
OWN_PROMPT = {"E": ("A", 40, 10)}  # E's prompt: A's first 40 tokens, then 10 of its own
DECODE = 8
MAX_CHUNK = 70
JOIN = {0: ["A", "B"], 3: ["D"], 4: ["E"]}
FORK = (2, "A", "C")
FREE = (4, "B")
STEPS = 11
CHECKPOINT_SLOTS = 4
EXPECTED_ADOPTED = {"E": 32}  # A's two whole pages before its prompt's last token


def main() -> int:
    reason = kvcache.gpu_unavailable_reason()
    try:
        import torch
        import transformers
    except ImportError as error:
        reason = reason or f"{error.name} is not importable"
    if reason or not torch.cuda.is_available():
        print(f"serve_hybrid.py needs a GPU, torch and transformers: "
              f"{reason or 'torch.cuda.is_available() is False'}")
        return 77
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

    # float32 throughout, with TF32 off, so that the comparison measures the serving and not the precision.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    config = transformers.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=512, num_hidden_layers=len(LAYER_TYPES),
        layer_types=LAYER_TYPES, num_attention_heads=QO_HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
        linear_num_key_heads=K_HEADS, linear_num_value_heads=V_HEADS, linear_key_head_dim=K_DIM,
        linear_value_head_dim=V_DIM, linear_conv_kernel_dim=CONV_KERNEL, num_experts=0, mlp_only_layers=[],
        max_position_embeddings=512)
    model = transformers.Qwen3NextForCausalLM(config).to("cuda", torch.float32).eval()

    with torch.no_grad():
        runtime = Runtime(torch, model, qwen3_next)
        fed, served, adopted = serve(runtime)
        # transformers' own run of each sequence's tokens, from the first; the served logits start where the
        # sequence's own steps did (E's after the prefix it adopted).
        reference = {name: model(ids[None]).logits[0][adopted[name]:] for name, ids in fed.items()}
    torch.cuda.synchronize()

    errors, norms, positions = 0.0, 0.0, 0
    for name, got in served.items():
        expected = reference[name]
        assert got.shape == expected.shape, f"{name}: {tuple(got.shape)} served, {tuple(expected.shape)} expected"
        errors += float((got - expected).square().sum())
        norms += float(expected.square().sum())
        positions += got.shape[0]
    relative = (errors / norms) ** 0.5
    unwritten = runtime.unwritten.item()
    stats = runtime.manager.stats()
    restored = all(adopted[name] == length for name, length in EXPECTED_ADOPTED.items())
    ok = relative <= BOUND and unwritten == 0 and restored and stats.checkpoints_restored == len(EXPECTED_ADOPTED)
    print(f"qwen3_next, {len(LAYER_TYPES) - 1} gated delta net layers and 1 attention layer: {positions} positions in "
          f"{len(served)} sequences (one forked), logits relative L2 error {relative:.2e} (bound {BOUND:.0e})"
          f"{'' if ok else '  FAILED'}")
    print(f"checkpoints saved {stats.checkpoints_saved}, restored {stats.checkpoints_restored}; prefix adopted from a "
          f"checkpoint: " + ", ".join(f"{name} {adopted[name]} tokens" for name in EXPECTED_ADOPTED))
    if not restored:
        print(f"FAILED: expected adopted prefixes {EXPECTED_ADOPTED}")
    if unwritten:
        print(f"FAILED: {unwritten} tokens lie outside the page tables and were not written")
    return 0 if ok else 1


class Runtime:
    """The cache (one attention layer, three state layers), its page manager and the step arguments."""

    def __init__(self, torch, model, qwen3_next):
        self.torch, self.model, self.qwen3_next = torch, model, qwen3_next
        self.stream = torch.cuda.current_stream()
        float32 = kvcache.DataType.FLOAT32
        state = kvcache.StateLayerConfig([kvcache.StateTensorConfig("conv", [CONV_DIM, CONV_KERNEL - 1], float32),
                                          kvcache.StateTensorConfig("recurrent", [V_HEADS, K_DIM, V_DIM], float32)])
        self.linear = [i for i, kind in enumerate(LAYER_TYPES) if kind == "linear_attention"]
        self.attention = [i for i, kind in enumerate(LAYER_TYPES) if kind == "full_attention"]
        config = kvcache.Config(layer_configs=[(KV_HEADS, HEAD_DIM)] * len(self.attention), max_batch_size=MAX_BATCH,
                                max_sequence_length=MAX_SEQUENCE, tokens_per_page=TOKENS_PER_PAGE,
                                kv_cache_type=float32, max_tokens_per_step=MAX_TOKENS_PER_STEP,
                                state_layer_configs=[state] * len(self.linear),
                                num_checkpoint_slots=CHECKPOINT_SLOTS)
        # On torch's stream: the cache's copies and torch's kernels are ordered without events.
        self.cache = kvcache.KVCacheManager(config, self.stream)
        self.pools = [torch.from_dlpack(self.cache.pool_view(i)) for i in range(len(self.attention))]
        self.states = [{name: torch.from_dlpack(self.cache.state_view(i, name)) for name in ("conv", "recurrent")}
                       for i in range(len(self.linear))]
        for tensor in self.pools + [view for layer in self.states for view in layer.values()]:
            tensor.fill_(float("nan"))
        self.manager = kvcache.PageManager(self.cache)
        self.arguments = kvcache.StepArguments(self.manager, MAX_BATCH, MAX_TOKENS_PER_STEP, self.stream)
        self.unwritten = torch.zeros(1, dtype=torch.int32, device="cuda")

    def step(self, entries):
        """Runs one step: entries is [(sequence, token ids tensor)]. Returns each entry's logits [tokens, vocab]."""
        torch, model = self.torch, self.model
        new = [sequence for sequence, _ in entries if self.manager.length(sequence) == 0]
        appends = [(sequence, ids.tolist()) for sequence, ids in entries]
        copies = self.manager.step(appends)
        for group, pairs in enumerate(copies):
            if pairs:
                self.cache.copy_pages(pairs, self.stream, group=group)
        self.cache.copy_states(self.manager.last_state_copies(), self.stream)
        for slot in self.manager.state_slots(new):
            for layer in self.states:
                for view in layer.values():
                    view[slot].zero_()
        self.arguments.build(appends, self.stream)
        positions = torch.from_dlpack(self.arguments.positions())
        slots = torch.from_dlpack(self.arguments.state_slots()).long()  # the slot table: row b is entry b's slot
        rows = self.arguments.host_qo_indptr()

        inner = model.model
        hidden = inner.embed_tokens(torch.cat([ids for _, ids in entries]))
        cos, sin = inner.rotary_emb(hidden[None], positions[:, 1].long()[None])
        for index, block in enumerate(inner.layers):
            x = block.input_layernorm(hidden)
            if index in self.linear:
                # As a batched kernel does: the entries' states gathered through the slot table, updated, scattered
                # back through it.
                states = self.states[self.linear.index(index)]
                conv, recurrent = (states[name].index_select(0, slots) for name in ("conv", "recurrent"))
                mixed = torch.cat([self.gated_delta_net(block.linear_attn, x[rows[b]:rows[b + 1]], conv[b],
                                                        recurrent[b]) for b in range(len(entries))])
                states["conv"].index_copy_(0, slots, conv)
                states["recurrent"].index_copy_(0, slots, recurrent)
            else:
                mixed = self.attend(block.self_attn, self.attention.index(index), x, cos, sin, positions, rows)
            hidden = hidden + mixed
            hidden = hidden + block.mlp(block.post_attention_layernorm(hidden))
        logits = model.lm_head(inner.norm(hidden))
        return [logits[rows[b]:rows[b + 1]] for b in range(len(entries))]

    def gated_delta_net(self, module, x, conv_state, recurrent_state):
        """One sequence's tokens x [n, hidden] through a gated delta net layer from the states in its slot (views),
        which it updates in place: the layer's forward, with the states taken from and given back to the cache."""
        torch, functions = self.torch, self.qwen3_next
        n = x.shape[0]
        query, key, value, z, b, a = module.fix_query_key_value_ordering(module.in_proj_qkvz(x[None]),
                                                                         module.in_proj_ba(x[None]))
        mixed = torch.cat([t.reshape(1, n, -1) for t in (query, key, value)], dim=-1).transpose(1, 2)
        window = conv_state[None].clone()  # [1, conv_dim, kernel - 1]: the last inputs before these tokens
        mixed = functions.causal_conv1d_update(mixed, window, module.conv1d.weight.squeeze(1), module.conv1d.bias,
                                               module.activation)
        conv_state.copy_(window[0])
        query, key, value = torch.split(mixed.transpose(1, 2), [module.key_dim, module.key_dim, module.value_dim], -1)
        query = query.reshape(1, n, -1, module.head_k_dim)
        key = key.reshape(1, n, -1, module.head_k_dim)
        value = value.reshape(1, n, -1, module.head_v_dim)
        beta = b.sigmoid()
        g = -module.A_log.float().exp() * torch.nn.functional.softplus(a.float() + module.dt_bias)
        repeat = module.num_v_heads // module.num_k_heads
        if repeat > 1:
            query, key = query.repeat_interleave(repeat, dim=2), key.repeat_interleave(repeat, dim=2)
        out, final = functions.torch_chunk_gated_delta_rule(query, key, value, g=g, beta=beta,
                                                            initial_state=recurrent_state[None],
                                                            output_final_state=True, use_qk_l2norm_in_kernel=True)
        recurrent_state.copy_(final[0])
        out = module.norm(out.reshape(-1, module.head_v_dim), z.reshape(-1, module.head_v_dim))
        return module.out_proj(out.reshape(n, -1))

    def attend(self, attention, layer, x, cos, sin, positions, rows):
        """The gated attention layer: its new K and V written into the pages by write_tokens_paged, then each
        entry's queries against its pages, gathered through the step's tables."""
        torch = self.torch
        count = x.shape[0]
        query, gate = torch.chunk(attention.q_proj(x).view(count, -1, HEAD_DIM * 2), 2, dim=-1)
        query = attention.q_norm(query)
        key = attention.k_norm(attention.k_proj(x).view(count, -1, HEAD_DIM))
        value = attention.v_proj(x).view(count, -1, HEAD_DIM)
        query, key = self.qwen3_next.apply_rotary_pos_emb(query, key, cos[0], sin[0], unsqueeze_dim=1)
        group = self.cache.group_of(layer)
        kvcache.write_tokens_paged(self.cache, layer, key.contiguous(), value.contiguous(),
                                   self.arguments.indptr(group), self.arguments.indices(group),
                                   self.arguments.first_token(group), self.arguments.positions(), self.stream,
                                   error_count=self.unwritten)
        indices = torch.from_dlpack(self.arguments.indices(group)).long()
        indptr = self.arguments.host_indptr(group)
        last_page_len = self.arguments.host_last_page_len(group)
        outputs = []
        for b in range(len(rows) - 1):
            pages = indices[indptr[b]:indptr[b + 1]]
            length = (len(pages) - 1) * TOKENS_PER_PAGE + last_page_len[b]
            keys, values = (self.pools[layer][half][pages].reshape(-1, KV_HEADS, HEAD_DIM)[:length] for half in (0, 1))
            outputs.append(causal_attention(torch, query[rows[b]:rows[b + 1]], keys, values,
                                            positions[rows[b]:rows[b + 1], 1], attention.scaling))
        out = torch.cat(outputs).reshape(count, -1) * torch.sigmoid(gate.reshape(count, -1))
        return attention.o_proj(out)


def causal_attention(torch, query, keys, values, query_positions, scaling):
    """query [n, Hq, D] at absolute positions; keys / values [length, H, D] of positions 0 .. length - 1."""
    group = query.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query, keys) * scaling
    allowed = torch.arange(keys.shape[0], device=query.device)[None, :] <= query_positions[:, None]
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values)


def serve(runtime):
    """Serves the batch. Returns each sequence's tokens fed (from its first), its logits at every position its own
    steps fed, and the length of the prefix it adopted."""
    torch, manager = runtime.torch, runtime.manager
    generator = torch.Generator(device="cuda").manual_seed(1)

    def random_tokens(count):
        return torch.randint(0, VOCAB, (count,), device="cuda", generator=generator)

    sequences, tokens, prompt, fed, logits, adopted = {}, {}, {}, {}, {}, {}
    for index in range(STEPS):
        if index == FORK[0]:
            parent, child = FORK[1], FORK[2]
            sequences[child] = manager.fork(sequences[parent])
            tokens[child] = torch.cat([tokens[parent][:fed[parent]], random_tokens(DECODE)])
            prompt[child], fed[child], adopted[child] = fed[parent], fed[parent], 0
            logits[child] = list(logits[parent])
        if index == FREE[0]:
            manager.free(sequences.pop(FREE[1]))
        for name in JOIN.get(index, []):
            if name in OWN_PROMPT:
                donor, shared, own = OWN_PROMPT[name]
                tokens[name] = torch.cat([tokens[donor][:shared], random_tokens(own + DECODE)])
                prompt[name] = shared + own
            else:
                tokens[name] = random_tokens(PROMPTS[name] + DECODE)
                prompt[name] = PROMPTS[name]
            sequences[name] = manager.create()
            # The longest cached prefix that ends at a state checkpoint; its restore is queued for the next step.
            adopted[name] = manager.adopt_prefix(sequences[name], tokens[name][:prompt[name]].tolist())
            fed[name], logits[name] = adopted[name], []
        entries, names, checkpoints = [], [], []
        for name, sequence in sequences.items():
            start = fed[name]
            if start < prompt[name]:
                end = min(prompt[name], start + MAX_CHUNK)
                boundary = manager.checkpoint_boundary(sequence)
                if start < boundary < end:
                    end = boundary
                if end == boundary:
                    checkpoints.append(sequence)
            elif start < len(tokens[name]):
                end = start + 1
            else:
                continue
            entries.append((sequence, tokens[name][start:end]))
            names.append(name)
            fed[name] = end
        for name, out in zip(names, runtime.step(entries)):
            logits[name].append(out)
        for sequence in checkpoints:
            # The state after the boundary, in the sequence's slot once this step's kernels ran, saved by a copy
            # before the next step's.
            manager.checkpoint_state(sequence)
    for sequence in sequences.values():
        manager.free(sequence)
    manager.check_invariants()
    fed_tokens = {name: tokens[name][:fed[name]] for name in tokens}
    return fed_tokens, {name: torch.cat(parts) for name, parts in logits.items()}, adopted


if __name__ == "__main__":
    sys.exit(main())
