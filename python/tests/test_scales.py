"""Host-held layer scales as Python sees them, where no GPU is needed: the LayerScales value type (float32 fields, the
field named when a float does not fit) and a sequence file's recorded scales. The calls on a cache are in
test_scales_gpu.py."""

import math
import struct

import pytest

import kvcache

TOKENS = 16


def float32(value):
    """`value` rounded to float32 by the struct module: what a C++ float holds."""
    return struct.unpack("f", struct.pack("f", value))[0]


def test_layer_scales_default_to_one_and_hold_float32():
    assert "LayerScales" in kvcache.__all__
    scales = kvcache.LayerScales()
    assert (scales.k, scales.v) == (1.0, 1.0)
    scales = kvcache.LayerScales(0.1, v=2.5)
    assert scales.k == float32(0.1) and scales.k != 0.1
    assert scales.v == 2.5
    scales.k = 0.75
    scales.v = 3
    assert (scales.k, scales.v) == (0.75, 3.0)
    assert kvcache.LayerScales(k=0.75, v=3.0) == scales
    assert kvcache.LayerScales(0.75, 2.0) != scales
    assert repr(kvcache.LayerScales(0.5, 2.0)) == "LayerScales(k=0.5, v=2.0)"


def test_layer_scales_keep_what_the_cache_checks():
    # NaN, infinities and negative scales are values a LayerScales may hold; set_layer_scales refuses them.
    scales = kvcache.LayerScales(float("nan"), -1.0)
    assert math.isnan(scales.k) and scales.v == -1.0
    assert scales != kvcache.LayerScales(float("nan"), -1.0)  # compared as floats: NaN equals nothing
    scales.k = float("inf")
    assert scales.k == math.inf
    assert scales == kvcache.LayerScales(math.inf, -1.0)


@pytest.mark.parametrize("field", ["k", "v"])
def test_a_float_beyond_float32_names_its_field(field):
    too_large = 1e39
    with pytest.raises(kvcache.InvalidArgumentError, match=rf"LayerScales\.{field} is 1e\+39; it must fit in float32"):
        kvcache.LayerScales(**{field: too_large})
    scales = kvcache.LayerScales(0.5, 0.25)
    with pytest.raises(ValueError, match=rf"LayerScales\.{field} is -1e\+300"):
        setattr(scales, field, -1e300)
    assert (scales.k, scales.v) == (0.5, 0.25)  # a refused value changes nothing
    largest = float32(3.4028234663852886e38)
    setattr(scales, field, largest)
    assert getattr(scales, field) == largest
    with pytest.raises(TypeError):
        setattr(scales, field, "0.5")


def test_a_file_without_host_held_scales_records_none(tmp_path):
    config = kvcache.Config(layer_configs=[(2, 32), (1, 16, 0, kvcache.KVLayerKind.LATENT)], max_batch_size=1,
                            max_sequence_length=32, tokens_per_page=TOKENS)
    geometry = kvcache.page_geometry(kvcache.compute_layout(config), 0)
    path = tmp_path / "plain.kvseq"
    kvcache.write_sequence_file(path, geometry, 3, [bytes(geometry.bytes_per_page)])
    assert kvcache.read_sequence_file_info(path).layer_scales == []
