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


def test_calibrated_scales_put_the_amax_on_the_largest_code():
    q = kvcache.KVQuantization
    # amax / 448 (FP8 per tensor) and amax / (448 * 6) = amax / 2688 (NVFP4), worked by hand.
    assert kvcache.calibrated_scales(q.FP8_PER_TENSOR, 448.0, 3.5) == kvcache.LayerScales(1.0, 0.0078125)
    assert kvcache.calibrated_scales(q.NVFP4, 5376.0, 21.0) == kvcache.LayerScales(2.0, 0.0078125)
    # A latent layer (has_v=False): v stays 1 and its amax is not looked at.
    assert kvcache.calibrated_scales(q.NVFP4, 2688.0, float("nan"), has_v=False) == kvcache.LayerScales(1.0, 1.0)


def test_calibrated_scales_refuse_what_gives_no_scale():
    q = kvcache.KVQuantization
    for quantization in (q.NONE, q.FP8_PER_TOKEN_HEAD):
        with pytest.raises(kvcache.InvalidArgumentError, match=quantization.name.lower()):
            kvcache.calibrated_scales(quantization, 1.0, 1.0)
    with pytest.raises(kvcache.InvalidArgumentError, match="kAmax is 0.*no value was observed"):
        kvcache.calibrated_scales(q.FP8_PER_TENSOR, 0.0, 1.0)
    with pytest.raises(kvcache.InvalidArgumentError, match="vAmax is inf"):
        kvcache.calibrated_scales(q.NVFP4, 1.0, float("inf"))


def test_layer_write_counters_hold_what_a_read_returns():
    observed = kvcache.LayerWriteCounters(1.5, 2.0, 3, 2**40)
    assert (observed.k_amax, observed.v_amax, observed.k_saturated, observed.v_saturated) == (1.5, 2.0, 3, 2**40)
    empty = kvcache.LayerWriteCounters()
    assert (empty.k_amax, empty.v_amax, empty.k_saturated, empty.v_saturated) == (0.0, 0.0, 0, 0)
