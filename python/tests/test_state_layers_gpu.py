"""State layers on the GPU: the cache's state views, and recurrent layers whose state lives in the cache's state slots,
read and written through the slot table PageManager.state_slots gives, as a runtime does.

The layers are torch references written from the published formulas (tests/recurrent_reference.py: a Qwen3-Next-like
gated delta net with its convolution, a small Mamba2 mixer) and, when `fla` imports, FLA's Triton kernels of the gated
delta rule. A run split into chunks over several steps must equal one run over the whole sequence, a fork's two
continuations two independent runs, and the slots of every other sequence (and the free and checkpoint slots), filled
with distinct non-zero values first, must keep them bit for bit. Each test takes the `torch` fixture: skipped without a
GPU or torch, failed under KVCACHE_REQUIRE_GPU=1; the FLA tests skip when fla does not import."""

import gc
import weakref

import pytest

import kvcache
from recurrent_reference import DEVICE, GatedDeltaNetLayer, Mamba2Layer, gated_delta_rule

BATCH = 4
CHECKPOINTS = 1
SLOTS = BATCH + CHECKPOINTS  # num_state_slots, by the layout's rule
TOKENS_PER_PAGE = 16
MAX_LENGTH = 256


def state_layer(shapes, dtypes=None):
    dtypes = dtypes or {}
    return kvcache.StateLayerConfig([kvcache.StateTensorConfig(name, shape, dtypes.get(name, kvcache.DataType.FLOAT32))
                                     for name, shape in shapes.items()])


def make_config(state_layers, checkpoints=CHECKPOINTS):
    return kvcache.Config(layer_configs=[(1, 16)], max_batch_size=BATCH, max_sequence_length=MAX_LENGTH,
                          tokens_per_page=TOKENS_PER_PAGE, state_layer_configs=state_layers,
                          num_checkpoint_slots=checkpoints)


def make_cache(torch, state_layers, checkpoints=CHECKPOINTS):
    return kvcache.KVCacheManager(make_config(state_layers, checkpoints), torch.cuda.current_stream())


class StateRuntime:
    """What a runtime does around a step's recurrent kernels: the PageManager step, its state copies, the slot table
    uploaded to a device buffer at a fixed address, initial (zero) states for sequences of length 0, then per layer
    the states gathered through the table, the kernel, and the new states scattered back through it."""

    def __init__(self, torch, layers):
        self.torch = torch
        self.layers = layers
        self.cache = make_cache(torch, [state_layer(layer.state_shapes()) for layer in layers])
        self.pages = kvcache.PageManager(self.cache)
        self.views = [{name: torch.from_dlpack(self.cache.state_view(index, name)) for name in layer.state_shapes()}
                      for index, layer in enumerate(layers)]
        self.slot_table = torch.full((BATCH,), -1, dtype=torch.int32, device=DEVICE)

    def poison(self):
        """Fills every slot of every state tensor with values distinct per slot, tensor and layer, none zero; returns
        copies of them."""
        offset = 1.0
        for layer in self.views:
            for view in layer.values():
                count = view[0].numel()
                for slot in range(view.shape[0]):
                    values = self.torch.arange(1, count + 1, device=DEVICE, dtype=self.torch.float32) / count
                    view[slot].copy_((values + offset).view(view[slot].shape))
                    offset += 2.0
        return [{name: view.clone() for name, view in layer.items()} for layer in self.views]

    def begin_step(self, chunks):
        """chunks: [(sequence, length or token ids)]. Steps the page manager, runs its copies, uploads the slot table
        and zeroes the states of new sequences; returns the rows (int64 device tensor, one per chunk)."""
        torch = self.torch
        new = [sequence for sequence, _ in chunks if self.pages.length(sequence) == 0]
        copies = self.pages.step([(sequence, tokens if isinstance(tokens, list) else list(range(tokens)))
                                  for sequence, tokens in chunks])
        for group, pairs in enumerate(copies):
            if pairs:
                self.cache.copy_pages(pairs, group=group)
        self.cache.copy_states(self.pages.last_state_copies())
        count = len(chunks)
        self.slot_table[:count].copy_(torch.tensor(self.pages.state_slots([s for s, _ in chunks]), dtype=torch.int32))
        if new:
            new_rows = torch.tensor(self.pages.state_slots(new), dtype=torch.int64, device=DEVICE)
            for layer in self.views:
                for view in layer.values():
                    view.index_fill_(0, new_rows, 0.0)
        return self.slot_table[:count].long()

    def run_layers(self, rows, inputs):
        """inputs[i][l]: chunk i's inputs of layer l. Returns outputs[i][l]."""
        outputs = [[None] * len(self.layers) for _ in inputs]
        for index, layer in enumerate(self.layers):
            gathered = {name: view.index_select(0, rows) for name, view in self.views[index].items()}
            new_states = {name: [] for name in gathered}
            for i, chunk in enumerate(inputs):
                out, state = layer.run(chunk[index], {name: tensor[i] for name, tensor in gathered.items()})
                outputs[i][index] = out
                for name in new_states:
                    new_states[name].append(state[name])
            for name, view in self.views[index].items():
                view.index_copy_(0, rows, self.torch.stack(new_states[name]))
        return outputs

    def state_of(self, sequence, index):
        slot = self.pages.state_slot(sequence)
        return {name: view[slot].clone() for name, view in self.views[index].items()}


def zero_state(torch, layer):
    return {name: torch.zeros(shape, device=DEVICE) for name, shape in layer.state_shapes().items()}


def slice_inputs(inputs, start, end):
    return {name: tensor[start:end] for name, tensor in inputs.items()}


def assert_untouched(torch, runtime, poisoned, used_slots):
    for index, layer in enumerate(runtime.views):
        for name, view in layer.items():
            for slot in range(view.shape[0]):
                if slot not in used_slots:
                    assert torch.equal(view[slot], poisoned[index][name][slot]), \
                        f"state layer {index} tensor {name!r}: slot {slot}, no sequence's under test, changed"


def assert_matches(torch, got, expected, what):
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")


# --- the views ---------------------------------------------------------------------------------------------------


def test_state_views_are_every_slot_of_each_tensor(torch):
    gdn = {"conv": [768, 3], "recurrent": [4, 64, 64]}
    mamba = {"conv": [160, 3], "ssm": [4, 32, 16]}
    cache = make_cache(torch, [state_layer(gdn, {"conv": kvcache.DataType.BFLOAT16}),
                               state_layer(mamba, {"conv": kvcache.DataType.FLOAT16})])
    assert (cache.num_state_layers(), cache.num_state_slots()) == (2, SLOTS)
    expected_dtypes = [{"conv": torch.bfloat16, "recurrent": torch.float32},
                       {"conv": torch.float16, "ssm": torch.float32}]
    for layer, shapes in enumerate([gdn, mamba]):
        for index, (name, shape) in enumerate(shapes.items()):
            by_index, by_name = cache.state_view(layer, index), cache.state_view(layer, name)
            assert by_index.shape == by_name.shape == (SLOTS, *shape)
            assert by_index.data_ptr == by_name.data_ptr
            tensor = torch.from_dlpack(by_name)
            assert tensor.dtype == expected_dtypes[layer][name] and tensor.is_contiguous()
            assert tensor.data_ptr() == by_index.data_ptr
    # The second tensor starts 256-byte aligned after the first: conv of layer 0 is 5 x 768 x 3 x 2 = 23,040 bytes (a
    # multiple of 256), of layer 1 5 x 160 x 3 x 2 = 4,800, rounded up to 4,864.
    assert cache.state_view(0, 1).data_ptr - cache.state_view(0, 0).data_ptr == 23040
    assert cache.state_view(1, 1).data_ptr - cache.state_view(1, 0).data_ptr == 4864
    # Zero-copy: what one view's tensor writes, a tensor made from another view of it reads.
    writer = torch.from_dlpack(cache.state_view(0, "recurrent"))
    writer[3].fill_(2.5)
    reader = torch.from_dlpack(cache.state_view(0, 1))
    assert torch.equal(reader[3], torch.full((4, 64, 64), 2.5, device=DEVICE))
    # The layers' allocations are distinct: filling one leaves the other as it was.
    other = torch.from_dlpack(cache.state_view(1, "ssm"))
    other.fill_(-1.0)
    writer.fill_(7.0)
    assert torch.equal(other, torch.full_like(other, -1.0))


def test_state_views_keep_the_cache_alive(torch):
    cache = make_cache(torch, [state_layer({"ssm": [2, 4, 4]})])
    alive = weakref.ref(cache)
    tensor = torch.from_dlpack(cache.state_view(0, "ssm"))
    del cache
    gc.collect()
    assert alive() is not None
    tensor.fill_(3.0)
    assert tensor.sum().item() == 3.0 * SLOTS * 2 * 4 * 4
    del tensor
    gc.collect()
    assert alive() is None


def test_state_view_misuse_raises_naming_the_index_or_name(torch):
    cache = make_cache(torch, [state_layer({"conv": [8, 3], "ssm": [2, 4, 4]})])
    with pytest.raises(kvcache.OutOfRangeError, match=r"state layer index is 1; it must be in \[0, 1\)"):
        cache.state_view(1, 0)
    with pytest.raises(kvcache.OutOfRangeError, match=r"state layer index is -1"):
        cache.state_view(-1, 0)
    with pytest.raises(kvcache.OutOfRangeError, match=r"tensor index is 2; state layer 0 has 2 tensors"):
        cache.state_view(0, 2)
    with pytest.raises(kvcache.OutOfRangeError, match=r"tensor index is 4294967296"):
        cache.state_view(0, 2**32)
    with pytest.raises(kvcache.InvalidArgumentError, match=r'no tensor "recurrent"; its tensors: "conv", "ssm"'):
        cache.state_view(0, "recurrent")
    with pytest.raises(TypeError, match="tensor is a float"):
        cache.state_view(0, 1.0)
    with pytest.raises(TypeError, match="tensor is a bool"):
        cache.state_view(0, True)
    plain = make_cache(torch, [], checkpoints=0)
    assert (plain.num_state_layers(), plain.num_state_slots()) == (0, 0)
    with pytest.raises(kvcache.OutOfRangeError, match=r"must be in \[0, 0\) \(num_state_layers\)"):
        plain.state_view(0, "conv")


# --- copy_states ---------------------------------------------------------------------------------------------------


def copy_states_runtime(torch):
    """Two state layers of three tensors in three dtypes, every slot filled with distinct values."""
    shapes = [{"conv": [96, 3], "recurrent": [2, 8, 8]}, {"ssm": [3, 5, 7]}]
    dtypes = [{"conv": kvcache.DataType.BFLOAT16}, {}]
    runtime = StateRuntime.__new__(StateRuntime)
    runtime.torch = torch
    runtime.cache = make_cache(torch, [state_layer(s, d) for s, d in zip(shapes, dtypes)])
    runtime.views = [{name: torch.from_dlpack(runtime.cache.state_view(index, name)) for name in layer}
                     for index, layer in enumerate(shapes)]
    return runtime, runtime.poison()


@pytest.mark.parametrize("form", ["list", "int32 array", "int64 array"])
def test_copy_states_copies_each_slot_in_every_layer_and_tensor(torch, np, form):
    runtime, before = copy_states_runtime(torch)
    pairs = [(0, 3), (4, 1), (0, 2)]  # one source twice; slot 4 is the checkpoint slot
    argument = {"list": pairs, "int32 array": np.array(pairs, dtype=np.int32),
                "int64 array": np.array(pairs, dtype=np.int64)}[form]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    runtime.cache.copy_states(argument, stream)
    torch.cuda.current_stream().wait_stream(stream)
    expected_source = {3: 0, 1: 4, 2: 0}
    for index, layer in enumerate(runtime.views):
        for name, view in layer.items():
            for slot in range(SLOTS):
                source = expected_source.get(slot, slot)
                assert torch.equal(view[slot], before[index][name][source]), \
                    f"state layer {index} tensor {name!r}: slot {slot} should hold slot {source}'s values"
    runtime.cache.copy_states([])  # no copies: nothing launched, nothing changed
    runtime.cache.synchronize()


def test_copy_states_misuse_raises_and_changes_nothing(torch, np):
    runtime, before = copy_states_runtime(torch)
    cache = runtime.cache
    with pytest.raises(kvcache.OutOfRangeError, match=r"copies\[1\]\.dst is slot 5; state slots must be in \[0, 5\)"):
        cache.copy_states([(0, 1), (2, 5)])
    with pytest.raises(kvcache.OutOfRangeError, match=r"copies\[0\]\.src is slot -1"):
        cache.copy_states([(-1, 1)])
    with pytest.raises(kvcache.InvalidArgumentError, match="slot 3 is a destination more than once"):
        cache.copy_states([(0, 3), (1, 3)])
    with pytest.raises(kvcache.InvalidArgumentError, match="slot 1 is both a source and a destination"):
        cache.copy_states([(0, 1), (1, 2)])
    with pytest.raises(kvcache.InvalidArgumentError, match="pairs is a device array"):
        cache.copy_states(torch.tensor([[0, 1]], dtype=torch.int32, device=DEVICE))
    with pytest.raises(kvcache.InvalidArgumentError, match=r"pairs\[0\] is a int; expected a \(src, dst\) pair"):
        cache.copy_states([0, 1])
    with pytest.raises(TypeError, match="pairs is a float"):
        cache.copy_states(1.5)
    with pytest.raises(kvcache.InvalidArgumentError, match=r"pairs\[0\] is 2147483648; state slots must fit in int32"):
        cache.copy_states([(2**31, 1)])
    torch.cuda.synchronize()
    for index, layer in enumerate(runtime.views):
        for name, view in layer.items():
            assert torch.equal(view, before[index][name]), f"state layer {index} tensor {name!r} changed"
    plain = make_cache(torch, [], checkpoints=0)
    plain.copy_states([])
    with pytest.raises(kvcache.InvalidArgumentError, match="no state layers"):
        plain.copy_states([(0, 1)])


# --- torch references ----------------------------------------------------------------------------------------------


def test_reference_layers_split_across_steps_equal_one_run(torch):
    layers = [GatedDeltaNetLayer(torch), Mamba2Layer(torch)]
    runtime = StateRuntime(torch, layers)
    poisoned = runtime.poison()
    idle = runtime.pages.create()  # alive, never stepped: its slot keeps its values
    a, b = runtime.pages.create(), runtime.pages.create()
    splits = {a: [5, 1, 17, 1, 40], b: [1, 30, 9, 2, 22]}  # per step; a's steps and b's run together
    inputs = {s: [layer.inputs(sum(lengths), seed=10 * n + i) for i, layer in enumerate(layers)]
              for n, (s, lengths) in enumerate(splits.items())}
    outputs = {a: [[] for _ in layers], b: [[] for _ in layers]}
    position = {a: 0, b: 0}
    for step in range(len(splits[a])):
        chunks = [(s, splits[s][step]) for s in (b, a)]  # b's row first: the table, not the order, picks the slot
        rows = runtime.begin_step(chunks)
        chunk_inputs = [[slice_inputs(inputs[s][i], position[s], position[s] + n) for i in range(len(layers))]
                        for s, n in chunks]
        step_outputs = runtime.run_layers(rows, chunk_inputs)
        for (s, n), outs in zip(chunks, step_outputs):
            for i, out in enumerate(outs):
                outputs[s][i].append(out)
            position[s] += n
    for s in (a, b):
        for i, layer in enumerate(layers):
            expected_out, expected_state = layer.run(inputs[s][i], zero_state(torch, layer))
            assert_matches(torch, torch.cat(outputs[s][i]), expected_out, f"sequence {s}, layer {i} outputs")
            state = runtime.state_of(s, i)
            for name in expected_state:
                assert_matches(torch, state[name], expected_state[name], f"sequence {s}, layer {i} state {name}")
    assert runtime.pages.state_slot(idle) not in runtime.pages.state_slots([a, b])
    assert_untouched(torch, runtime, poisoned, set(runtime.pages.state_slots([a, b])))


def test_reference_fork_continuations_equal_independent_runs(torch):
    layers = [GatedDeltaNetLayer(torch), Mamba2Layer(torch)]
    runtime = StateRuntime(torch, layers)
    poisoned = runtime.poison()
    runtime.pages.create()  # an idle neighbour
    parent = runtime.pages.create()
    prefix, continuation = 21, 19
    full = {seed: [layer.inputs(prefix + continuation, seed=seed + i) for i, layer in enumerate(layers)]
            for seed in (100, 200)}
    # Both branches share the prefix: the child's inputs are branch 200's continuation after branch 100's prefix.
    branch = {100: full[100], 200: [{name: torch.cat([full[100][i][name][:prefix], full[200][i][name][prefix:]])
                                     for name in full[100][i]} for i in range(len(layers))]}
    rows = runtime.begin_step([(parent, prefix)])
    runtime.run_layers(rows, [[slice_inputs(branch[100][i], 0, prefix) for i in range(len(layers))]])
    child = runtime.pages.fork(parent)
    assert runtime.pages.pending_state_copies() == [(runtime.pages.state_slot(parent), runtime.pages.state_slot(child))]
    rows = runtime.begin_step([(parent, continuation), (child, continuation)])
    for i in range(len(layers)):  # the copy ran before the kernels: the child's slot holds the parent's state
        for name, state in runtime.state_of(child, i).items():
            assert torch.equal(state, runtime.state_of(parent, i)[name]), f"layer {i} {name}: fork copy"
    outputs = runtime.run_layers(rows, [[slice_inputs(branch[seed][i], prefix, prefix + continuation)
                                         for i in range(len(layers))] for seed in (100, 200)])
    for sequence, seed, outs in ((parent, 100, outputs[0]), (child, 200, outputs[1])):
        for i, layer in enumerate(layers):
            expected_out, expected_state = layer.run(branch[seed][i], zero_state(torch, layer))
            assert_matches(torch, outs[i], expected_out[prefix:], f"branch {seed}, layer {i} outputs")
            for name, state in runtime.state_of(sequence, i).items():
                assert_matches(torch, state, expected_state[name], f"branch {seed}, layer {i} state {name}")
    assert_untouched(torch, runtime, poisoned, set(runtime.pages.state_slots([parent, child])))


def test_reference_state_restored_from_a_checkpoint_after_a_host_round_trip_equals_one_run(torch):
    layers = [GatedDeltaNetLayer(torch), Mamba2Layer(torch)]
    runtime = StateRuntime(torch, layers)
    poisoned = runtime.poison()
    pages = runtime.pages
    prefix = 2 * TOKENS_PER_PAGE
    first_prompt = list(range(500, 500 + prefix + 7))  # the last whole page before its last token ends at `prefix`
    second_prompt = first_prompt[:prefix] + list(range(900, 923))
    first_inputs = [layer.inputs(len(first_prompt), seed=400 + i) for i, layer in enumerate(layers)]
    tail_inputs = [layer.inputs(len(second_prompt), seed=600 + i) for i, layer in enumerate(layers)]
    second_inputs = [{name: torch.cat([first_inputs[i][name][:prefix], tail_inputs[i][name][prefix:]])
                      for name in first_inputs[i]} for i in range(len(layers))]

    first = pages.create()
    assert pages.adopt_prefix(first, first_prompt) == 0
    assert pages.checkpoint_boundary(first) == prefix
    rows = runtime.begin_step([(first, first_prompt[:prefix])])
    runtime.run_layers(rows, [[slice_inputs(first_inputs[i], 0, prefix) for i in range(len(layers))]])
    first_slot = pages.state_slot(first)
    assert pages.checkpoint_state(first)
    [(source, checkpoint)] = pages.pending_state_copies()
    assert source == first_slot and checkpoint >= BATCH
    rows = runtime.begin_step([(first, first_prompt[prefix:])])  # the save runs before this step's kernels
    runtime.run_layers(rows, [[slice_inputs(first_inputs[i], prefix, len(first_prompt)) for i in range(len(layers))]])
    pages.free(first)

    # The checkpoint goes to a host state and back; in between its device slot holds other values.
    expected_checkpoint = [layer.run(slice_inputs(first_inputs[i], 0, prefix), zero_state(torch, layer))[1]
                           for i, layer in enumerate(layers)]
    tier = kvcache.HostTier(runtime.cache, 0, 1, num_host_states=1)
    [host] = tier.allocate_host_states(1)
    tier.offload_states([(checkpoint, host)])
    tier.synchronize_host_states([host])
    for index, layer in enumerate(runtime.views):
        for name, view in layer.items():
            view[checkpoint].fill_(-7.5)
            assert not torch.equal(view[checkpoint], expected_checkpoint[index][name])
    tier.onboard_states([(checkpoint, host)])
    tier.synchronize_host_states([host])
    for index in range(len(layers)):
        for name, view in runtime.views[index].items():
            assert_matches(torch, view[checkpoint], expected_checkpoint[index][name],
                           f"layer {index} {name}: checkpoint after the host round trip")

    second = pages.create()
    assert pages.adopt_prefix(second, second_prompt) == prefix
    assert pages.pending_state_copies() == [(checkpoint, pages.state_slot(second))]
    rows = runtime.begin_step([(second, second_prompt[prefix:])])
    outputs = runtime.run_layers(rows, [[slice_inputs(second_inputs[i], prefix, len(second_prompt))
                                         for i in range(len(layers))]])
    for i, layer in enumerate(layers):
        expected_out, expected_state = layer.run(second_inputs[i], zero_state(torch, layer))
        assert_matches(torch, outputs[0][i], expected_out[prefix:], f"layer {i} outputs after the restored checkpoint")
        for name, state in runtime.state_of(second, i).items():
            assert_matches(torch, state, expected_state[name], f"layer {i} state {name} after the restored checkpoint")
    assert pages.stats().checkpoints_restored == 1
    assert_untouched(torch, runtime, poisoned, {first_slot, pages.state_slot(second), checkpoint})


# --- FLA's kernels -------------------------------------------------------------------------------------------------

HEADS, KEY_DIM, VALUE_DIM = 4, 64, 64


@pytest.fixture
def fla_ops(torch):
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError as error:
        pytest.skip(f"fla (fla-core, FLA's Triton kernels) is not importable: {error}")
    return {"chunk": chunk_gated_delta_rule, "fused_recurrent": fused_recurrent_gated_delta_rule}


class FlaGatedDeltaRule:
    """FLA's gated delta rule as one state layer ("recurrent" [H, K, V] float32): a batch of chunks run in one
    varlen call, initial states gathered from the slots through the table and final states scattered back."""

    def __init__(self, torch, kernel):
        self.torch, self.kernel = torch, kernel
        self.scale = KEY_DIM ** -0.5

    def state_shapes(self):
        return {"recurrent": [HEADS, KEY_DIM, VALUE_DIM]}

    def inputs(self, length, seed):
        torch = self.torch
        generator = torch.Generator(device=DEVICE).manual_seed(seed)
        q = torch.nn.functional.normalize(
            torch.randn(length, HEADS, KEY_DIM, device=DEVICE, generator=generator), dim=-1)
        k = torch.nn.functional.normalize(
            torch.randn(length, HEADS, KEY_DIM, device=DEVICE, generator=generator), dim=-1)
        v = torch.randn(length, HEADS, VALUE_DIM, device=DEVICE, generator=generator)
        g = torch.nn.functional.logsigmoid(torch.randn(length, HEADS, device=DEVICE, generator=generator) + 2)
        beta = torch.sigmoid(torch.randn(length, HEADS, device=DEVICE, generator=generator))
        return {"q": q, "k": k, "v": v, "g": g, "beta": beta}

    def run_batch(self, chunks, initial_state):
        """chunks: one inputs dict a sequence; initial_state [N, H, K, V]. Returns (outputs a sequence, states)."""
        torch = self.torch
        lengths = [chunk["q"].shape[0] for chunk in chunks]
        cu_seqlens = torch.tensor([0] + lengths, device=DEVICE).cumsum(0)
        packed = {name: torch.cat([chunk[name] for chunk in chunks]).unsqueeze(0) for name in chunks[0]}
        # By keyword: the fused recurrent kernel takes gk and gv between g and beta.
        out, final = self.kernel(packed["q"], packed["k"], packed["v"], g=packed["g"], beta=packed["beta"],
                                 scale=self.scale, initial_state=initial_state, output_final_state=True,
                                 cu_seqlens=cu_seqlens)
        return list(out[0].split(lengths)), final

    def run(self, inputs, state):
        out, final = self.run_batch([inputs], state["recurrent"].unsqueeze(0))
        return out[0], {"recurrent": final[0]}

    def run_slots(self, runtime, rows, chunks):
        """The step's kernel on the cache: states read from and written to the rows of the slot table."""
        view = runtime.views[0]["recurrent"]
        out, final = self.run_batch(chunks, view.index_select(0, rows).contiguous())
        view.index_copy_(0, rows, final.to(view.dtype))
        return out

    def reference(self, inputs):
        """The gated delta rule in float64 from a zero state (recurrent_reference.gated_delta_rule)."""
        torch = self.torch
        wide = {name: tensor.double() for name, tensor in inputs.items()}
        return gated_delta_rule(torch, wide["q"], wide["k"], wide["v"], wide["g"], wide["beta"],
                                torch.zeros(HEADS, KEY_DIM, VALUE_DIM, device=DEVICE, dtype=torch.float64),
                                self.scale)


def assert_within_kernel_error(got, whole, reference, what):
    """got (a run through the slots) must be as close to `whole` (the kernel's one run) as the kernel's own error
    against the float64 reference allows: a state lost or mixed up between steps is off by the state's size."""
    reference = reference.to(whole.dtype)
    magnitude = reference.abs().max().item()
    kernel_error = (whole - reference).abs().max().item()
    assert kernel_error <= 0.02 * magnitude, f"{what}: the kernel's one run is {kernel_error} from the reference"
    difference = (got - whole).abs().max().item()
    assert difference <= 8 * kernel_error + 1e-5 * magnitude, \
        f"{what}: {difference} from the kernel's one run (its error against the reference: {kernel_error})"


@pytest.mark.parametrize("kernel", ["chunk", "fused_recurrent"])
def test_fla_split_across_steps_equals_one_run(torch, fla_ops, kernel):
    layer = FlaGatedDeltaRule(torch, fla_ops[kernel])
    runtime = StateRuntime(torch, [layer])
    poisoned = runtime.poison()
    runtime.pages.create()  # an idle neighbour
    a, b = runtime.pages.create(), runtime.pages.create()
    # Splits inside and across FLA's 64-token chunks, and single tokens (decode).
    splits = {a: [37, 64, 1, 100, 1], b: [1, 70, 63, 2, 30]}
    inputs = {s: layer.inputs(sum(lengths), seed=n + 7) for n, (s, lengths) in enumerate(splits.items())}
    outputs = {a: [], b: []}
    position = {a: 0, b: 0}
    for step in range(len(splits[a])):
        chunks = [(s, splits[s][step]) for s in (a, b)]
        rows = runtime.begin_step(chunks)
        step_inputs = [slice_inputs(inputs[s], position[s], position[s] + n) for s, n in chunks]
        outs = layer.run_slots(runtime, rows, step_inputs)
        for (s, n), out in zip(chunks, outs):
            outputs[s].append(out)
            position[s] += n
    for s in (a, b):
        whole_out, whole_state = layer.run(inputs[s], zero_state(torch, layer))
        reference_out, reference_state = layer.reference(inputs[s])
        assert_within_kernel_error(torch.cat(outputs[s]), whole_out, reference_out, f"{kernel}: sequence {s} outputs")
        assert_within_kernel_error(runtime.state_of(s, 0)["recurrent"], whole_state["recurrent"], reference_state,
                                   f"{kernel}: sequence {s} final state")
    assert_untouched(torch, runtime, poisoned, set(runtime.pages.state_slots([a, b])))


@pytest.mark.parametrize("kernel", ["chunk", "fused_recurrent"])
def test_fla_fork_continuations_equal_independent_runs(torch, fla_ops, kernel):
    layer = FlaGatedDeltaRule(torch, fla_ops[kernel])
    runtime = StateRuntime(torch, [layer])
    poisoned = runtime.poison()
    parent = runtime.pages.create()
    runtime.pages.create()  # an idle neighbour, between the parent's slot and the child's
    prefix, continuation = 90, 45
    first, second = layer.inputs(prefix + continuation, seed=300), layer.inputs(prefix + continuation, seed=400)
    branches = [first, {name: torch.cat([first[name][:prefix], second[name][prefix:]]) for name in first}]
    rows = runtime.begin_step([(parent, prefix)])
    layer.run_slots(runtime, rows, [slice_inputs(first, 0, prefix)])
    child = runtime.pages.fork(parent)
    rows = runtime.begin_step([(child, continuation), (parent, continuation)])
    assert torch.equal(runtime.state_of(child, 0)["recurrent"], runtime.state_of(parent, 0)["recurrent"]), \
        "the fork copy did not give the child the parent's state before the kernels"
    outs = layer.run_slots(runtime, rows, [slice_inputs(branch, prefix, prefix + continuation)
                                           for branch in (branches[1], branches[0])])
    for sequence, branch, out in ((child, branches[1], outs[0]), (parent, branches[0], outs[1])):
        whole_out, whole_state = layer.run(branch, zero_state(torch, layer))
        reference_out, reference_state = layer.reference(branch)
        assert_within_kernel_error(out, whole_out[prefix:], reference_out[prefix:],
                                   f"{kernel}: sequence {sequence} continuation")
        assert_within_kernel_error(runtime.state_of(sequence, 0)["recurrent"], whole_state["recurrent"],
                                   reference_state, f"{kernel}: sequence {sequence} final state")
    assert_untouched(torch, runtime, poisoned, set(runtime.pages.state_slots([parent, child])))
