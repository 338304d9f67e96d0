"""The stub python/kvcache/_kvcache.pyi is nanobind stubgen's output for the module as built, byte for byte, and the
package exports each of the module's names once. No GPU needed."""

import ast
import difflib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kvcache

PYTHON_DIR = Path(__file__).resolve().parents[1]
STUB = PYTHON_DIR / "kvcache" / "_kvcache.pyi"
GENERATE = PYTHON_DIR / "generate_stub.py"
# The nanobind release the stub was generated with, pinned in the build requirements: stubgen's output changes between
# releases, so another one cannot judge the stub.
PINNED_NANOBIND = re.search(r'"nanobind==([^"]+)"', (PYTHON_DIR.parent / "pyproject.toml").read_text()).group(1)
REGENERATE = "cmake --build <build> --target kvcache_stub  (or: PYTHONPATH=<build>/python python3 python/generate_stub.py)"


def test_the_committed_stub_is_what_stubgen_generates(tmp_path):
    # pip install . builds against nanobind in an isolated environment: the tests may then run without it.
    nanobind = pytest.importorskip("nanobind", reason="nanobind (its stubgen) is not importable")
    if nanobind.__version__ != PINNED_NANOBIND:
        pytest.skip(f"nanobind {nanobind.__version__} is not the pinned {PINNED_NANOBIND} the stub is generated with")
    generated = tmp_path / "_kvcache.pyi"
    # The module the generator imports is the one these tests import (the same PYTHONPATH).
    result = subprocess.run([sys.executable, str(GENERATE), "-o", str(generated)], capture_output=True, text=True)
    assert result.returncode == 0, f"{GENERATE.name} failed:\n{result.stdout}{result.stderr}"
    expected = generated.read_bytes()
    committed = STUB.read_bytes()
    if committed != expected:
        diff = "".join(difflib.unified_diff(committed.decode().splitlines(keepends=True),
                                            expected.decode().splitlines(keepends=True),
                                            fromfile=f"{STUB} (committed)", tofile="stubgen's output"))
        pytest.fail(f"{STUB.name} is not what nanobind {nanobind.__version__}'s stubgen generates from the module "
                    f"(the binding is the source: edit python/src or python/stub_patterns.txt, never the stub). "
                    f"Regenerate it with\n    {REGENERATE}\n{diff}", pytrace=False)


def test_the_package_exports_each_name_of_the_module_once():
    module = kvcache._kvcache
    public = [name for name in vars(module) if not name.startswith("_")]
    assert kvcache.__all__ == module.__all__
    assert len(set(kvcache.__all__)) == len(kvcache.__all__)
    assert set(kvcache.__all__) == set(public) | {"__version__"}
    for name in kvcache.__all__:
        assert getattr(kvcache, name) is getattr(module, name)
    star = {}
    exec("from kvcache import *", star)
    assert set(star) - {"__builtins__"} == set(kvcache.__all__)


def test_the_stub_declares_what_the_package_exports():
    tree = ast.parse(STUB.read_text())
    declared = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
        elif isinstance(node, ast.Assign):
            declared.update(target.id for target in node.targets if isinstance(target, ast.Name))
    assert set(kvcache.__all__) <= declared
    # The stub's __all__ bounds what `from kvcache._kvcache import *` gives a type checker: the type aliases the stub
    # declares stay out, as they do at run time.
    stub_all = next(node.value for node in tree.body
                    if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "__all__")
    assert ast.literal_eval(stub_all) == kvcache.__all__


def test_importing_kvcache_needs_neither_torch_nor_numpy():
    blocked = ("numpy", "torch")
    code = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(name + " is blocked")
sys.meta_path.insert(0, Block())
import kvcache
assert not any(name.split(".")[0] in {blocked!r} for name in sys.modules), sorted(sys.modules)
print(len(kvcache.__all__))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == len(kvcache.__all__)
