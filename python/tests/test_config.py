"""Config fields, validation messages and the layout maths, against tests/layout_model.py. No GPU."""

import pytest

import kvcache
from layout_model import ELEMENT_BYTES, ModelLayer, ceil_div, model_groups

LAYERS = [(8, 128), (2, 64), (4, 96)]


def make_config(**overrides):
    fields = dict(layer_configs=LAYERS, max_batch_size=3, max_sequence_length=1000, tokens_per_page=64)
    fields.update(overrides)
    return kvcache.Config(**fields)


def test_fields_round_trip_with_python_names():
    config = make_config(kv_cache_type=kvcache.DataType.BFLOAT16, num_pages=100, max_tokens_per_step=256)
    assert config.num_attention_layers == 3
    assert config.max_batch_size == 3
    assert config.max_sequence_length == 1000
    assert config.tokens_per_page == 64
    assert config.num_pages == 100
    assert config.max_tokens_per_step == 256
    assert config.kv_cache_type == kvcache.DataType.BFLOAT16
    assert config.mem_pool == 0
    assert [(layer.num_kv_heads, layer.head_dim) for layer in config.layer_configs] == LAYERS
    config.num_pages_per_group = [7]
    assert config.num_pages_per_group == [7]


def test_layer_configs_take_tuples_and_objects():
    config = make_config(
        layer_configs=[(8, 64, 128), kvcache.KVLayerConfig(1, 576, kind=kvcache.KVLayerKind.LATENT), [2, 32]]
    )
    first, second, third = config.layer_configs
    assert (first.num_kv_heads, first.head_dim, first.sliding_window, first.kind) == (8, 64, 128, kvcache.KVLayerKind.KV)
    assert (second.num_kv_heads, second.head_dim, second.kind) == (1, 576, kvcache.KVLayerKind.LATENT)
    assert (third.num_kv_heads, third.head_dim, third.sliding_window) == (2, 32, 0)


@pytest.mark.parametrize("dtype", [d for d in kvcache.DataType if d.name in ELEMENT_BYTES])
def test_uniform_layout_matches_the_model(dtype):
    config = make_config(kv_cache_type=dtype)
    layout = kvcache.compute_layout(config)
    element = ELEMENT_BYTES[dtype.name]
    tokens = 64
    cap_padded = ceil_div(1000, tokens) * tokens
    min_pages = 3 * cap_padded // tokens
    assert layout.cap_padded == cap_padded
    assert layout.pages_per_slot == cap_padded // tokens
    assert layout.min_pages == min_pages
    assert layout.num_pages == min_pages
    assert layout.element_bytes == element
    total = 0
    for (heads, dim), layer in zip(LAYERS, layout.layers):
        page_elems = tokens * heads * dim
        assert layer.page_elems == page_elems
        assert layer.page_bytes == page_elems * element
        assert layer.half_elems == min_pages * page_elems
        assert layer.layer_bytes == 2 * min_pages * page_elems * element
        assert layer.num_halves == 2
        total += layer.layer_bytes
    assert layout.cache_bytes == total
    assert layout.bytes_per_page == sum(2 * tokens * h * d * element for h, d in LAYERS)


def test_retained_pages_extend_every_layer():
    layout = kvcache.compute_layout(make_config(num_pages=200))
    assert layout.num_pages == 200
    assert all(layer.half_elems == 200 * layer.page_elems for layer in layout.layers)


def test_hybrid_groups_match_the_model():
    layers = [ModelLayer(8, 64, 128), ModelLayer(8, 64), ModelLayer(1, 576, 0, True), ModelLayer(4, 64, 4096)]
    config = kvcache.Config(
        layer_configs=[
            (8, 64, 128),
            (8, 64),
            (1, 576, 0, kvcache.KVLayerKind.LATENT),
            (4, 64, 4096),
        ],
        max_batch_size=2,
        max_sequence_length=8192,
        tokens_per_page=16,
        max_tokens_per_step=512,
    )
    layout = kvcache.compute_layout(config)
    expected = model_groups(layers, 8192, 16, 512, 2)
    assert len(layout.groups) == len(expected)
    for group, model in zip(layout.groups, expected):
        assert group.sliding_window == model.window
        assert group.pages_per_sequence == model.pages_per_sequence
        assert group.slot_tokens == model.pages_per_sequence * 16
        assert group.min_pages == 2 * model.pages_per_sequence
        assert group.num_pages == group.min_pages
        assert list(group.layers) == model.layers
        assert group.bytes_per_page == model.bytes_per_page
    latent = layout.layers[2]
    assert latent.num_halves == 1
    assert latent.kind == kvcache.KVLayerKind.LATENT
    assert latent.layer_bytes == latent.half_elems * 2
    assert layout.bytes_per_page == sum(model.bytes_per_page for model in expected)


def test_max_pages_for_budget_is_the_floor_of_budget_over_page_bytes():
    config = make_config()
    page_bytes = sum(2 * 64 * h * d * 2 for h, d in LAYERS)
    for pages in (0, 1, 57, 1000):
        assert kvcache.max_pages_for_budget(config, pages * page_bytes) == pages
        assert kvcache.max_pages_for_budget(config, pages * page_bytes + page_bytes - 1) == pages


def test_split_budget_gives_every_group_the_same_sequences():
    layers = [ModelLayer(8, 64, 256), ModelLayer(8, 64)]
    config = kvcache.Config(layer_configs=[(8, 64, 256), (8, 64)], max_batch_size=4, max_sequence_length=4096,
                            tokens_per_page=32, max_tokens_per_step=128)
    groups = model_groups(layers, 4096, 32, 128, 2)
    sequence_bytes = sum(g.pages_per_sequence * g.bytes_per_page for g in groups)
    budget = 10 * sequence_bytes + sequence_bytes // 2
    split = kvcache.split_budget(config, budget)
    assert split.sequences == 10
    assert list(split.num_pages_per_group) == [10 * g.pages_per_sequence for g in groups]
    assert split.bytes == 10 * sequence_bytes


@pytest.mark.parametrize(
    "overrides, words",
    [
        (dict(max_batch_size=0), ["maxBatchSize", "0", "> 0"]),
        (dict(max_sequence_length=-5), ["maxSequenceLength", "-5", "> 0"]),
        (dict(tokens_per_page=48), ["tokensPerPage", "48", "power of two", "1024"]),
        (dict(kv_cache_type=kvcache.DataType.INT32), ["kvCacheType", "int32"]),
        (dict(num_attention_layers=5), ["numAttentionLayers", "5"]),
    ],
)
def test_bad_configs_raise_invalid_config_error_naming_field_value_and_limit(overrides, words):
    config = make_config(**overrides)
    with pytest.raises(kvcache.InvalidConfigError) as error:
        kvcache.compute_layout(config)
    for word in words:
        assert word in str(error.value)
    with pytest.raises(ValueError):
        kvcache.compute_layout(config)


def test_out_of_int32_values_are_refused_when_set():
    config = make_config()
    with pytest.raises(ValueError, match=r"Config\.max_batch_size is 4294967296; it must fit in int32"):
        config.max_batch_size = 2**32
    assert config.max_batch_size == 3  # unchanged
    with pytest.raises(ValueError, match=r"Config\.layer_configs\[1\]\.head_dim is 3000000000"):
        make_config(layer_configs=[(1, 1), (1, 3_000_000_000)])
    with pytest.raises(ValueError, match=r"layer_configs\[0\] has 5 fields"):
        make_config(layer_configs=[(1, 2, 3, kvcache.KVLayerKind.KV, 5)])
    with pytest.raises(TypeError):
        make_config(layer_configs=["8x128"])


def test_negative_budget_is_an_invalid_argument():
    with pytest.raises(kvcache.InvalidArgumentError, match="-1"):
        kvcache.max_pages_for_budget(make_config(), -1)


@pytest.mark.parametrize("layers, message", [
    ([("a", 128)], r"Config.layer_configs\[0\].num_kv_heads is a str; expected an int"),
    ([(8, 128), (2, 64.0)], r"Config.layer_configs\[1\].head_dim is a float; expected an int"),
    ([(8, 128, None)], r"Config.layer_configs\[0\].sliding_window is a NoneType; expected an int"),
    ([(8, 128, 0, "KV")], r"Config.layer_configs\[0\].kind is a str; expected a KVLayerKind"),
    (5, r"Config.layer_configs is a int; expected a sequence"),
])
def test_wrong_layer_config_types_raise_type_error_naming_the_field(layers, message):
    with pytest.raises(TypeError, match=f"^{message}"):
        make_config(layer_configs=layers)
    with pytest.raises(TypeError, match="Config.num_attention_layers is a str; expected an int"):
        make_config(num_attention_layers="3")
    config = make_config()
    with pytest.raises(TypeError, match=f"^{message}"):
        config.layer_configs = layers
    assert len(config.layer_configs) == len(LAYERS)  # unchanged


# ---- quantized pages (docs/layout.md, "Quantized pages") ----

# The issue's example: 32 layers of 8 x 128, batch 64 x 8192 tokens in pages of 128: 4096 pages a half, so a layer
# holds 2 * 4096 * 128 * 8 = 2**23 (token, head, half) entries. Bytes an entry, by hand from the formats:
# fp8 per token-head D + 4 = 132 (4 of them scale), NVFP4 D/2 + D/16 = 72 (8 of them scale).
QUANTIZED = [
    (kvcache.KVQuantization.FP8_PER_TOKEN_HEAD, kvcache.DataType.FP8_E4M3, "fp8_per_token_head", 128, 128, 4),
    (kvcache.KVQuantization.NVFP4, kvcache.DataType.UINT8, "nvfp4", 64, 64, 8),
]


def issue_example(quantization, storage, **overrides):
    fields = dict(
        layer_configs=[(8, 128)] * 32,
        max_batch_size=64,
        max_sequence_length=8192,
        tokens_per_page=128,
        kv_cache_type=storage,
        quantization=quantization,
    )
    fields.update(overrides)
    return kvcache.Config(**fields)


def test_quantization_is_an_enum_field():
    assert make_config().quantization == kvcache.KVQuantization.NONE
    config = make_config(kv_cache_type=kvcache.DataType.FP8_E4M3, quantization=kvcache.KVQuantization.FP8_PER_TENSOR)
    assert config.quantization == kvcache.KVQuantization.FP8_PER_TENSOR
    config.quantization = kvcache.KVQuantization.FP8_PER_TOKEN_HEAD
    assert config.quantization == kvcache.KVQuantization.FP8_PER_TOKEN_HEAD
    assert "quantization=fp8_per_token_head" in repr(config)
    assert [q.value for q in kvcache.KVQuantization] == [0, 1, 2, 3]
    assert kvcache.NVFP4_BLOCK_VALUES == 16


@pytest.mark.parametrize("quantization, storage, name, stored_dim, entry_data, entry_scale", QUANTIZED)
def test_layout_counts_scale_bytes(quantization, storage, name, stored_dim, entry_data, entry_scale):
    layout = kvcache.compute_layout(issue_example(quantization, storage))
    entries = 2 * 4096 * 128 * 8
    assert layout.quantization == quantization
    assert len(layout.layers) == 32
    for layer in layout.layers:
        assert layer.stored_dim == stored_dim
        assert layer.scale_page_bytes == 128 * 8 * entry_scale
        assert layer.layer_bytes == entries * entry_data
        assert layer.scale_bytes == entries * entry_scale
    assert layout.cache_bytes == 32 * entries * (entry_data + entry_scale)  # 2**28 * 132 or 2**28 * 72


def test_scaled_format_needs_its_storage_type():
    with pytest.raises(kvcache.InvalidConfigError, match="KVCacheConfig.quantization"):
        kvcache.compute_layout(issue_example(kvcache.KVQuantization.NVFP4, kvcache.DataType.FLOAT16))


def gated_delta_net_layer():
    # Qwen3-Next-80B's gated delta net: conv [2 x 16 x 128 + 32 x 128, 3] bfloat16, recurrent [32, 128, 128] float32.
    return kvcache.StateLayerConfig(
        [
            kvcache.StateTensorConfig("conv", [8192, 3], kvcache.DataType.BFLOAT16),
            kvcache.StateTensorConfig("recurrent", [32, 128, 128]),
        ]
    )


def test_state_layers_are_counted_per_tensor_layer_and_slot():
    config = make_config(state_layer_configs=[gated_delta_net_layer()] * 2, num_checkpoint_slots=1)
    assert config.num_checkpoint_slots == 1
    assert [tensor.name for tensor in config.state_layer_configs[0].tensors] == ["conv", "recurrent"]
    assert config.state_layer_configs[0].tensors[1].data_type == kvcache.DataType.FLOAT32
    layout = kvcache.compute_layout(config)
    # 3 sequences + 1 checkpoint = 4 slots. conv: 8192 x 3 x 2 = 49,152 bytes a slot, 196,608 at 0 (a multiple of 256);
    # recurrent: 32 x 128 x 128 x 4 = 2,097,152 a slot, 8,388,608 at 196,608.
    assert layout.num_state_slots == 4
    assert layout.num_checkpoint_slots == 1
    conv, recurrent = layout.state_layers[0].tensors
    assert (conv.name, conv.shape, conv.data_type) == ("conv", [8192, 3], kvcache.DataType.BFLOAT16)
    assert (conv.slot_elems, conv.slot_bytes, conv.offset_bytes, conv.bytes) == (24576, 49152, 0, 196608)
    assert (recurrent.slot_bytes, recurrent.offset_bytes, recurrent.bytes) == (2097152, 196608, 8388608)
    assert layout.state_layers[0].slot_bytes == 2146304
    assert layout.state_layers[0].layer_bytes == 8585216
    assert layout.state_bytes_per_slot == 2 * 2146304
    assert layout.state_bytes == 2 * 8585216
    # The budget pays the state first: 0 sequences of pages below it, and its bytes in the split.
    split = kvcache.split_budget(config, layout.state_bytes - 1)
    assert (split.sequences, split.bytes, split.state_bytes) == (0, layout.state_bytes, layout.state_bytes)


def test_state_list_fields_hand_out_copies():
    # An element read from a list field is a copy: changing it leaves the config alone, and assigning a new list leaves
    # it valid (a reference into the old list would dangle).
    tensor = kvcache.StateTensorConfig("a", [4], split_dim=0, split_segments=[kvcache.StateSplitSegment(4)])
    layer = kvcache.StateLayerConfig([tensor])
    config = make_config(state_layer_configs=[layer])
    held_layer, held_tensor = config.state_layer_configs[0], layer.tensors[0]
    held_segment = tensor.split_segments[0]
    held_layer.tensors, held_tensor.name, held_segment.parts = [], "changed", 2
    assert config.state_layer_configs[0].tensors[0].name == "a"
    assert layer.tensors[0].name == "a"
    assert tensor.split_segments[0].parts == 4
    config.state_layer_configs, layer.tensors, tensor.split_segments = [], [], []
    assert (held_layer.tensors, held_tensor.name, held_segment.parts) == ([], "changed", 2)


def test_bad_state_layers_raise_invalid_config_error_naming_the_field():
    zero = kvcache.StateLayerConfig([kvcache.StateTensorConfig("conv", [8, 0])])
    with pytest.raises(kvcache.InvalidConfigError, match=r"stateLayerConfigs\[0\]\.tensors\[0\]\.shape\[1\].*is 0"):
        kvcache.compute_layout(make_config(state_layer_configs=[zero]))
    with pytest.raises(kvcache.InvalidConfigError, match=r"stateLayerConfigs\[0\]\.tensors is empty"):
        kvcache.compute_layout(make_config(state_layer_configs=[kvcache.StateLayerConfig([])]))
    with pytest.raises(kvcache.InvalidConfigError, match=r"numCheckpointSlots is 2.*without state layers"):
        kvcache.compute_layout(make_config(num_checkpoint_slots=2))
