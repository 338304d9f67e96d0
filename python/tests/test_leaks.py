"""Nothing the binding creates outlives the interpreter: nanobind prints "nanobind: leaked ..." at exit for every
instance, type or function still alive then. Each check runs a fresh interpreter and reads what it printed. No GPU."""

import os
import pathlib
import subprocess
import sys

import pytest

import kvcache

TESTS = pathlib.Path(__file__).resolve().parent
CHILD = "KVCACHE_LEAK_CHECK_CHILD"


def run_python(args):
    env = dict(os.environ)
    env[CHILD] = "1"
    # Host only: GPU tests skip in the child (they run, and are checked, in the parent suite).
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.pop("KVCACHE_REQUIRE_GPU", None)
    # The package the parent imported, not the source tree's kvcache/ beside the tests.
    package_root = str(pathlib.Path(kvcache.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_root, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=240,
                          cwd=TESTS)


def assert_no_leaks(result):
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "nanobind: leaked" not in output, output[-4000:]


def test_a_manager_in_a_cycle_with_its_callback_is_freed_by_exit():
    script = """
import kvcache
config = kvcache.Config(layer_configs=[(1, 8)], max_batch_size=2, max_sequence_length=16, tokens_per_page=4)
manager = kvcache.PageManager(config)
manager.set_eviction_callback(lambda group, page, page_hash: manager.counts(group))
other = kvcache.PageManager(config)
other.set_eviction_callback(other.check_invariants)
del manager, other
"""
    assert_no_leaks(run_python(["-c", script]))


@pytest.mark.parametrize("consumer", ["capsule", "numpy"])
def test_a_dlpack_export_alive_at_exit_releases_its_owner(consumer, np):
    # A capsule, or an array a consumer made of one, left in a module's globals is freed while the interpreter
    # finalizes, when Py_IsInitialized() is already false: it must still drop its reference to the owner.
    take = "view.__dlpack__()" if consumer == "capsule" else "numpy.from_dlpack(view)"
    script = f"""
import array
import numpy
import kvcache
from kvcache import _kvcache
config = kvcache.Config(layer_configs=[(1, 8)], max_batch_size=2, max_sequence_length=16, tokens_per_page=4)
owner = kvcache.PageManager(config)
values = array.array("f", [1.5] * 8)
view = _kvcache._view_of_buffer(values.buffer_info()[0], [8], [1], kvcache.DataType.FLOAT32, owner)
exported = {take}
del owner, view
"""
    assert_no_leaks(run_python(["-c", script]))


@pytest.mark.skipif(os.environ.get(CHILD) == "1", reason="the leak check's own child run")
def test_the_host_suite_leaks_nothing_at_exit():
    assert_no_leaks(run_python(["-m", "pytest", str(TESTS), "-q", "-p", "no:cacheprovider"]))
