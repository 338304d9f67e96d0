"""Page geometries and sequence files over host buffers (NumPy), where no GPU is needed: geometries against
tests/layout_model.py, round trips byte for byte, a file's header, and what a bad file or a bad argument raises
(leaving the pages and any earlier file as they were)."""

import os
import pathlib

import pytest

import kvcache
from layout_model import ELEMENT_BYTES, ModelLayer, model_groups

TOKENS = 16
SEQ = 128
STEP = 16
# Full attention (a KV and a latent layer) and a sliding window of 32 (two KV layers): two page groups.
LAYERS = [(2, 32), (1, 16, 32), (1, 48, 0, kvcache.KVLayerKind.LATENT), (4, 16, 32)]
MODEL_LAYERS = [ModelLayer(2, 32), ModelLayer(1, 16, 32), ModelLayer(1, 48, latent=True), ModelLayer(4, 16, 32)]
POISON = 0xAB


def make_config(dtype=kvcache.DataType.FLOAT16):
    return kvcache.Config(layer_configs=LAYERS, max_batch_size=2, max_sequence_length=SEQ, tokens_per_page=TOKENS,
                          max_tokens_per_step=STEP, kv_cache_type=dtype)


def model(dtype=kvcache.DataType.FLOAT16):
    return model_groups(MODEL_LAYERS, SEQ, TOKENS, STEP, ELEMENT_BYTES[dtype.name])


def distinct_pages(np, count, bytes_per_page, seed):
    """count pages of bytes in [1, 255] (never 0), each page and each position different."""
    rng = np.random.default_rng(seed)
    return rng.integers(1, 256, size=(count, bytes_per_page), dtype=np.uint8)


@pytest.mark.parametrize("dtype", [kvcache.DataType.FLOAT16, kvcache.DataType.FP8_E4M3, kvcache.DataType.FLOAT32])
def test_page_geometry_is_the_model_group(dtype):
    layout = kvcache.compute_layout(make_config(dtype))
    groups = model(dtype)
    assert len(layout.groups) == len(groups) == 2
    for index, group in enumerate(groups):
        geometry = kvcache.page_geometry(layout, index)
        assert geometry.data_type == dtype
        assert geometry.tokens_per_page == TOKENS
        assert geometry.sliding_window == group.window
        assert geometry.bytes_per_page == group.bytes_per_page
        kinds = [kvcache.KVLayerKind.LATENT if MODEL_LAYERS[i].latent else kvcache.KVLayerKind.KV for i in group.layers]
        assert [(layer.kind, layer.num_kv_heads, layer.head_dim) for layer in geometry.layers] == [
            (kind, MODEL_LAYERS[i].heads, MODEL_LAYERS[i].dim) for kind, i in zip(kinds, group.layers)]
    same = kvcache.page_geometry(kvcache.compute_layout(make_config(dtype)), 0)
    assert same == kvcache.page_geometry(layout, 0)
    assert kvcache.page_geometry(layout, 0) != kvcache.page_geometry(layout, 1)
    other = kvcache.DataType.BFLOAT16
    assert kvcache.page_geometry(kvcache.compute_layout(make_config(other)), 0) != kvcache.page_geometry(layout, 0)
    with pytest.raises(kvcache.OutOfRangeError, match=r"group is 2; groups are \[0, 2\)"):
        kvcache.page_geometry(layout, 2)
    with pytest.raises(TypeError):
        kvcache.page_geometry(make_config(dtype), 0)


def test_page_geometry_records_the_quantization(np, tmp_path):
    config = make_config(kvcache.DataType.FP8_E4M3)
    plain = kvcache.page_geometry(kvcache.compute_layout(config), 0)
    config.quantization = kvcache.KVQuantization.FP8_PER_TENSOR
    per_tensor = kvcache.page_geometry(kvcache.compute_layout(config), 0)
    assert plain.quantization == kvcache.KVQuantization.NONE
    assert per_tensor.quantization == kvcache.KVQuantization.FP8_PER_TENSOR
    # The same bytes a page, values that read differently: not the same geometry.
    assert per_tensor.bytes_per_page == plain.bytes_per_page
    assert per_tensor != plain
    assert "quantization=fp8_per_tensor" in repr(per_tensor)
    # Files of host-held scales need the scales, which the plain-buffer functions do not take (save_sequence does).
    pages = distinct_pages(np, 1, per_tensor.bytes_per_page, seed=3)
    with pytest.raises(kvcache.InvalidArgumentError, match="layerScales has 0 entries"):
        kvcache.write_sequence_file(tmp_path / "per_tensor.kvseq", per_tensor, 1, pages)


def test_a_file_round_trips_every_byte_and_its_header(np, tmp_path):
    layout = kvcache.compute_layout(make_config())
    for group in (0, 1):
        geometry = kvcache.page_geometry(layout, group)
        pages = distinct_pages(np, 3, geometry.bytes_per_page, seed=group)
        path = tmp_path / f"group{group}.kvseq"
        kvcache.write_sequence_file(path, geometry, 40, pages)  # the rows of a 2-D array, a pathlib path
        info = kvcache.read_sequence_file_info(str(path))
        assert (info.version, info.page_count, info.token_count) == (kvcache.SEQUENCE_FILE_VERSION, 3, 40)
        assert info.geometry == geometry
        out = [np.full(geometry.bytes_per_page, POISON, dtype=np.uint8) for _ in range(3)]
        assert kvcache.read_sequence_file(str(path), geometry, out) == 40
        for page, read in zip(pages, out):
            assert np.array_equal(page, read)
        # Pages as bytes-like objects, and wider element types of the same size.
        again = tmp_path / f"again{group}.kvseq"
        kvcache.write_sequence_file(again, geometry, 2, [pages[2].tobytes(), bytearray(pages[0].tobytes())])
        wide = np.zeros((2, geometry.bytes_per_page // 4), dtype=np.int32)
        assert kvcache.read_sequence_file(again, geometry, wide) == 2
        assert np.array_equal(wide.view(np.uint8), pages[[2, 0]])


def test_a_bad_file_raises_and_writes_no_page(np, tmp_path):
    layout = kvcache.compute_layout(make_config())
    geometry = kvcache.page_geometry(layout, 0)
    pages = distinct_pages(np, 2, geometry.bytes_per_page, seed=7)
    path = tmp_path / "good.kvseq"
    kvcache.write_sequence_file(path, geometry, 20, pages)
    data = path.read_bytes()

    def poisoned():
        return np.full((2, geometry.bytes_per_page), POISON, dtype=np.uint8)

    corrupt = tmp_path / "corrupt.kvseq"
    flipped = bytearray(data)
    flipped[-1] ^= 0x01  # the last byte of page 1
    corrupt.write_bytes(bytes(flipped))
    out = poisoned()
    with pytest.raises(kvcache.InvalidArgumentError, match="page 1"):
        kvcache.read_sequence_file(corrupt, geometry, out)
    assert (out == POISON).all()

    truncated = tmp_path / "truncated.kvseq"
    truncated.write_bytes(data[:-10])
    with pytest.raises(kvcache.InvalidArgumentError):
        kvcache.read_sequence_file(truncated, geometry, out)
    with pytest.raises(kvcache.InvalidArgumentError):
        kvcache.read_sequence_file_info(truncated)
    assert (out == POISON).all()

    not_one = tmp_path / "not_one.kvseq"
    not_one.write_bytes(b"not a sequence file at all, but long enough to hold a header of one" * 4)
    with pytest.raises(kvcache.InvalidArgumentError):
        kvcache.read_sequence_file_info(not_one)

    other = kvcache.page_geometry(kvcache.compute_layout(make_config(kvcache.DataType.BFLOAT16)), 0)
    with pytest.raises(kvcache.InvalidArgumentError, match="dataType"):
        kvcache.read_sequence_file(path, other, out)
    with pytest.raises(kvcache.InvalidArgumentError, match="holds 2 pages; the destination list has 1"):
        kvcache.read_sequence_file(path, geometry, out[:1])  # one page for a file of two
    assert (out == POISON).all()

    missing = tmp_path / "missing.kvseq"
    with pytest.raises(RuntimeError, match="missing.kvseq") as raised:
        kvcache.read_sequence_file_info(missing)
    assert not isinstance(raised.value, ValueError)
    assert kvcache.read_sequence_file(path, geometry, out) == 20 and np.array_equal(out, pages)


def test_bad_arguments_raise_named_errors_and_leave_the_old_file(np, tmp_path):
    layout = kvcache.compute_layout(make_config())
    geometry = kvcache.page_geometry(layout, 1)
    size = geometry.bytes_per_page
    pages = distinct_pages(np, 2, size, seed=3)
    path = tmp_path / "seq.kvseq"
    kvcache.write_sequence_file(path, geometry, 5, pages)
    with pytest.raises(TypeError, match="path is a int"):
        kvcache.write_sequence_file(5, geometry, 1, pages)
    with pytest.raises(TypeError, match="path is a bytes"):
        kvcache.read_sequence_file_info(os.fsencode(str(path)))
    with pytest.raises(TypeError, match="path is a NoneType"):
        kvcache.read_sequence_file_info(None)
    with pytest.raises(kvcache.InvalidArgumentError, match="NUL"):
        kvcache.read_sequence_file_info(str(path) + "\0x")
    with pytest.raises(TypeError, match="pages is a int"):
        kvcache.write_sequence_file(path, geometry, 1, 7)
    with pytest.raises(TypeError, match=r"pages\[1\] is a str"):
        kvcache.write_sequence_file(path, geometry, 1, [pages[0], "page"])
    with pytest.raises(TypeError):
        kvcache.write_sequence_file(path, layout, 1, pages)  # a layout is no geometry
    with pytest.raises(kvcache.InvalidArgumentError, match=rf"pages\[1\] has {size - 1} bytes.*{size}"):
        kvcache.write_sequence_file(path, geometry, 1, [pages[0], pages[1][1:]])
    # Windowed groups may hold a sequence longer than their pages; a negative count is refused.
    with pytest.raises(kvcache.InvalidArgumentError, match="tokenCount is -1"):
        kvcache.write_sequence_file(path, geometry, -1, pages)
    full = kvcache.page_geometry(layout, 0)
    with pytest.raises(kvcache.InvalidArgumentError, match=rf"tokenCount is {2 * TOKENS + 1}.*\[0, {2 * TOKENS}\]"):
        kvcache.write_sequence_file(tmp_path / "full.kvseq", full, 2 * TOKENS + 1,
                                    distinct_pages(np, 2, full.bytes_per_page, seed=4))
    assert not (tmp_path / "full.kvseq").exists()
    read_only = np.zeros((2, size), dtype=np.uint8)
    read_only.setflags(write=False)
    with pytest.raises(kvcache.InvalidArgumentError, match="read-only"):
        kvcache.read_sequence_file(path, geometry, read_only)
    strided = np.zeros((size, 2), dtype=np.uint8)[:, 0]
    with pytest.raises(kvcache.InvalidArgumentError, match=r"pages\[0\] is not a C-contiguous"):
        kvcache.read_sequence_file(path, geometry, [strided, strided])
    # Every refused write left the first file whole.
    out = np.full((2, size), POISON, dtype=np.uint8)
    assert kvcache.read_sequence_file(pathlib.Path(path), geometry, out) == 5
    assert np.array_equal(out, pages)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seq.kvseq"]
