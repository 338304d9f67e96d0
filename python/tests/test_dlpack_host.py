"""The DLPack export on host memory (a view made over a NumPy buffer), where no GPU is needed: capsule names and
fields, dtype codes from the DLPack specification, sharing, strides and the owner's lifetime."""

import gc
import sys
import weakref

import pytest

import kvcache
from kvcache import _kvcache

# From the DLPack specification (dlpack.h 1.1, DLDataTypeCode): kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4,
# kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12. CUDA's __nv_fp8_e4m3 has no infinities: the "fn" variant.
SPEC_DTYPES = {
    kvcache.DataType.FLOAT32: (2, 32, 1),
    kvcache.DataType.FLOAT16: (2, 16, 1),
    kvcache.DataType.BFLOAT16: (4, 16, 1),
    kvcache.DataType.FP8_E4M3: (10, 8, 1),
    kvcache.DataType.FP8_E5M2: (12, 8, 1),
    kvcache.DataType.INT8: (0, 8, 1),
    kvcache.DataType.UINT8: (1, 8, 1),
    kvcache.DataType.INT32: (0, 32, 1),
    kvcache.DataType.INT64: (0, 64, 1),
}
KDL_CPU = 1


class Owner:
    """Stands for a KVCacheManager: the object whose lifetime the memory follows."""

    def __init__(self, array):
        self.array = array


def view_of(array, dtype=kvcache.DataType.INT32, owner=None):
    strides = [s // array.itemsize for s in array.strides]
    return _kvcache._view_of_buffer(array.ctypes.data, list(array.shape), strides, dtype,
                                    owner if owner is not None else array)


@pytest.mark.parametrize("dtype", list(SPEC_DTYPES))
def test_dtype_codes_follow_the_dlpack_specification(dtype):
    assert _kvcache._dlpack_dtype(dtype) == SPEC_DTYPES[dtype]


def test_versioned_and_legacy_capsules_carry_the_tensor(np):
    array = np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4)
    view = view_of(array)
    assert view.__dlpack_device__() == (KDL_CPU, 0)
    assert view.shape == (2, 3, 4) and view.strides == (12, 4, 1) and view.nbytes == 96
    versioned = _kvcache._describe_capsule(view.__dlpack__(max_version=(1, 0)))
    assert versioned["name"] == "dltensor_versioned"
    assert versioned["version"][0] == 1
    assert versioned["flags"] == 0
    legacy = _kvcache._describe_capsule(view.__dlpack__())
    assert legacy["name"] == "dltensor"
    assert _kvcache._describe_capsule(view.__dlpack__(max_version=(0, 8)))["name"] == "dltensor"
    for fields in (versioned, legacy):
        assert fields["data"] == array.ctypes.data
        assert fields["device"] == (KDL_CPU, 0)
        assert fields["ndim"] == 3
        assert fields["dtype"] == (0, 32, 1)
        assert fields["shape"] == (2, 3, 4)
        assert fields["strides"] == (12, 4, 1)
        assert fields["byte_offset"] == 0
        assert fields["has_deleter"]


def test_numpy_shares_the_memory_both_ways(np):
    array = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    shared = np.from_dlpack(view_of(array, kvcache.DataType.FLOAT32))
    assert np.shares_memory(shared, array)
    assert shared.dtype == np.float32 and shared.shape == (3, 4, 5)
    shared[1, 2, 3] = -1.5
    assert array[1, 2, 3] == -1.5
    array[2, 0, 0] = 99.0
    assert shared[2, 0, 0] == 99.0


def test_strided_views_keep_their_strides(np):
    base = np.arange(6 * 8, dtype=np.int32).reshape(6, 8)
    transposed = base.T  # strides (1, 8) in elements
    shared = np.from_dlpack(view_of(transposed, owner=base))
    assert shared.strides == transposed.strides
    assert (shared == transposed).all()


def test_every_dtype_has_the_right_element_size(np):
    for dtype, numpy_dtype in [(kvcache.DataType.FLOAT16, np.float16), (kvcache.DataType.INT8, np.int8),
                               (kvcache.DataType.UINT8, np.uint8), (kvcache.DataType.INT64, np.int64)]:
        array = (np.arange(10) % 7).astype(numpy_dtype)
        shared = np.from_dlpack(view_of(array, dtype))
        assert shared.dtype == numpy_dtype
        assert (shared == array).all()


def test_the_owner_lives_until_the_last_consumer_goes(np):
    owner = Owner(np.arange(16, dtype=np.int32))
    alive = weakref.ref(owner)
    view = view_of(owner.array, owner=owner)
    consumer = np.from_dlpack(view)
    unused_capsule = view.__dlpack__(max_version=(1, 0))
    del owner, view
    gc.collect()
    assert alive() is not None  # the consumer and the capsule still hold it
    assert consumer.sum() == sum(range(16))
    del unused_capsule  # a capsule no one took releases its reference too
    gc.collect()
    assert alive() is not None
    del consumer
    gc.collect()
    assert alive() is None


def test_exported_capsules_do_not_leak_references(np):
    owner = Owner(np.zeros(4, dtype=np.int32))
    view = view_of(owner.array, owner=owner)
    before = sys.getrefcount(owner)
    for _ in range(100):
        np.from_dlpack(view)
        view.__dlpack__(max_version=(1, 0))
        view.__dlpack__()
    gc.collect()
    assert sys.getrefcount(owner) == before


def test_refused_requests_raise_buffer_error(np):
    view = view_of(np.zeros(4, dtype=np.int32))
    with pytest.raises(BufferError, match="zero-copy"):
        view.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="dl_device"):
        view.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="stream"):
        view.__dlpack__(stream=7)
    assert _kvcache._describe_capsule(view.__dlpack__(copy=False, dl_device=(KDL_CPU, 0)))["name"] == "dltensor"
