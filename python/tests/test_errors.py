"""The C++ errors arrive as Python exceptions of the documented built-in bases, carrying the C++ message. No GPU."""

import pytest

import kvcache


def test_exception_types_derive_from_the_builtin_ones():
    assert issubclass(kvcache.InvalidConfigError, kvcache.InvalidArgumentError)
    assert issubclass(kvcache.InvalidArgumentError, ValueError)
    assert issubclass(kvcache.OutOfRangeError, IndexError)
    assert issubclass(kvcache.OutOfMemoryError, MemoryError)
    assert issubclass(kvcache.CudaError, RuntimeError)
    assert not issubclass(kvcache.CudaError, ValueError)


def test_each_error_kind_is_raised_with_its_message():
    with pytest.raises(kvcache.InvalidConfigError, match=r"KVCacheConfig\.tokensPerPage is 3"):
        kvcache.compute_layout(kvcache.Config(layer_configs=[(1, 8)], max_batch_size=1, max_sequence_length=8,
                                              tokens_per_page=3))
    allocator = kvcache.PageAllocator(2)
    with pytest.raises(kvcache.OutOfRangeError, match="5"):
        allocator.ref_count(5)
    allocator.allocate(2)
    with pytest.raises(kvcache.OutOfMemoryError, match="1 needed, 0 free"):
        allocator.allocate()
    with pytest.raises(kvcache.InvalidArgumentError, match="double free"):
        kvcache.PageAllocator(2).release(0)


def test_a_bad_config_is_reported_before_any_cuda_call():
    # Holds with and without a GPU: validation comes first.
    config = kvcache.Config(layer_configs=[(8, 128)], max_batch_size=0, max_sequence_length=16)
    with pytest.raises(kvcache.InvalidConfigError, match="maxBatchSize is 0"):
        kvcache.KVCacheManager(config)


def test_without_a_gpu_allocation_is_a_cuda_error():
    reason = kvcache.gpu_unavailable_reason()
    if not reason:
        pytest.skip("a GPU is present")
    config = kvcache.Config(layer_configs=[(8, 128)], max_batch_size=1, max_sequence_length=16)
    with pytest.raises(RuntimeError) as error:
        kvcache.KVCacheManager(config)
    assert isinstance(error.value, kvcache.CudaError)
    assert "cuda" in str(error.value).lower()


def test_a_stream_of_the_wrong_type_is_a_type_error():
    config = kvcache.Config(layer_configs=[(8, 128)], max_batch_size=1, max_sequence_length=16)
    with pytest.raises(TypeError, match="stream is a str"):
        kvcache.KVCacheManager(config, "default")
