"""State tensors' tensor-parallel split rules from Python: the fields, their validation, and a rank's transfer
description, which tensor_parallel_shard's state shapes must match. No GPU; shapes worked out by hand."""

import pytest

import kvcache


def gated_delta_net_layer(key_heads=16, value_heads=32):
    # Qwen3-Next-80B's gated delta net: conv [2 x 16 x 128 + 32 x 128, 3] = [8192, 3] bfloat16 as q, k and v channels,
    # split by heads; recurrent [32, 128, 128] float32 split by value heads.
    keys = kvcache.StateSplitSegment(key_heads, 128, name="key heads")
    values = kvcache.StateSplitSegment(value_heads, 128, name="value heads")
    return kvcache.StateLayerConfig(
        [
            kvcache.StateTensorConfig(
                "conv",
                [2 * key_heads * 128 + value_heads * 128, 3],
                kvcache.DataType.BFLOAT16,
                split_dim=0,
                split_segments=[keys, keys, values],
            ),
            kvcache.StateTensorConfig(
                "recurrent", [value_heads, 128, 128], split_dim=0, split_segments=[kvcache.StateSplitSegment(value_heads)]
            ),
        ]
    )


def config_with(state_layer, heads=2):
    return kvcache.Config(
        layer_configs=[(heads, 64)], max_batch_size=2, max_sequence_length=256, state_layer_configs=[state_layer]
    )


def test_split_fields_round_trip():
    tensor = gated_delta_net_layer().tensors[0]
    assert tensor.split_dim == 0
    assert tensor.split_segments[0] == kvcache.StateSplitSegment(16, 128, False, "key heads")
    assert tensor.split_segments[2].parts == 32
    assert tensor.split_segments[2].part_size == 128
    assert not tensor.split_segments[2].replicated
    plain = kvcache.StateTensorConfig("ssm", [4, 8])
    assert (plain.split_dim, plain.split_segments) == (-1, [])
    plain.split_dim = 1
    plain.split_segments = [kvcache.StateSplitSegment(1, 3, replicated=True), kvcache.StateSplitSegment(5)]
    assert plain.split_segments[0].replicated
    assert repr(plain.split_segments[1]) == "StateSplitSegment(parts=5, part_size=1, replicated=False, name='')"
    # A rule changes no size: conv 8192 x 3 x 2 = 49,152 bytes, recurrent 32 x 128 x 128 x 4 = 2,097,152 a slot.
    assert kvcache.compute_layout(config_with(gated_delta_net_layer())).state_bytes_per_slot == 2146304
    with pytest.raises(kvcache.InvalidArgumentError, match=r"StateTensorConfig\.split_dim"):
        plain.split_dim = 2**31


def test_bad_rules_raise_invalid_config_error_at_one_rank():
    layer = gated_delta_net_layer()
    conv = layer.tensors[0]
    conv.split_segments = [kvcache.StateSplitSegment(16, 128), kvcache.StateSplitSegment(32, 128)]
    layer.tensors = [conv, layer.tensors[1]]
    # 16 x 128 + 32 x 128 = 6,144 entries, not 8,192.
    with pytest.raises(kvcache.InvalidConfigError, match=r"tensors\[0\]\.splitSegments .*span 6144.*shape\[0\] = 8192"):
        kvcache.compute_layout(config_with(layer))
    conv.split_dim = 2
    layer.tensors = [conv]
    with pytest.raises(kvcache.InvalidConfigError, match=r"tensors\[0\]\.splitDim .*is 2.*\[0, 2\)"):
        kvcache.compute_layout(config_with(layer))


def test_rank_description_holds_its_share_of_each_state_tensor():
    model = config_with(gated_delta_net_layer(), heads=2)
    # Rank 1 of 2, by hand: 1 KV head; conv [2 x 8 x 128 + 16 x 128, 3] = [4096, 3], recurrent [16, 128, 128].
    rank = config_with(gated_delta_net_layer(8, 16), heads=1)
    layout = kvcache.compute_layout(rank)
    bases = [0x1000, 0x100000]  # the page part of the one layer, then the state layer
    description = kvcache.layout_transfer_description(layout, bases, model_config=model, tp=2, rank=1)
    assert kvcache.transfer_state_mismatch(description, description) == ""
    # The whole model's state shapes are not rank 1's.
    whole_states = config_with(gated_delta_net_layer(), heads=1)
    with pytest.raises(kvcache.InvalidArgumentError, match=r"state layer 0 tensor 0 is \[4096, 3\].*\[8192, 3\]"):
        kvcache.layout_transfer_description(
            kvcache.compute_layout(whole_states), bases, model_config=model, tp=2, rank=1
        )
    # 16 key heads over 32 ranks.
    with pytest.raises(kvcache.InvalidArgumentError, match=r"splitSegments\[0\]\.parts.*key heads = 16.*tp = 32"):
        kvcache.layout_transfer_description(layout, bases, model_config=model, tp=32, rank=0)
