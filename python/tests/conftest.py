"""Fixtures shared by the kvcache Python tests.

Host tests need only the module. GPU tests take the `gpu` or `torch` fixture: they skip with the reason where no GPU
(or no torch) can be used, and fail instead when KVCACHE_REQUIRE_GPU=1.
"""

import os

import pytest

import kvcache

GPU_REQUIRED = os.environ.get("KVCACHE_REQUIRE_GPU") == "1"


def _unavailable(reason: str) -> None:
    if GPU_REQUIRED:
        pytest.fail(f"KVCACHE_REQUIRE_GPU=1 but the test cannot run: {reason}")
    pytest.skip(reason)


@pytest.fixture
def gpu() -> None:
    reason = kvcache.gpu_unavailable_reason()
    if reason:
        _unavailable(reason)


@pytest.fixture
def torch(gpu):
    try:
        import torch as torch_module
    except ImportError as error:
        _unavailable(f"torch is not importable: {error}")
    if not torch_module.cuda.is_available():
        _unavailable("torch.cuda.is_available() is False")
    return torch_module


@pytest.fixture
def np():
    return pytest.importorskip("numpy")
