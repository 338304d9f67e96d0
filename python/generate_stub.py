#!/usr/bin/env python3
"""Regenerates python/kvcache/_kvcache.pyi from the built module with nanobind's stubgen.

From the repository root, after building the module (build/py is the build folder):

    cmake --build build/py --target kvcache_stub

which builds the module and runs this script, the same as

    PYTHONPATH=build/py/python python3 python/generate_stub.py

The stub is generated, never edited: signatures and docstrings come from the binding (python/src: nb::arg, nb::sig,
the typed arguments of typed_arguments.h, docstrings), the type aliases from python/stub_patterns.txt.
python/tests/test_stub.py fails when the committed stub differs from what this writes.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parent
STUB = PYTHON_DIR / "kvcache" / "_kvcache.pyi"
PATTERNS = PYTHON_DIR / "stub_patterns.txt"


def stubgen_command(output):
    """The stubgen call that writes the stub of kvcache._kvcache to `output`."""
    return [sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "kvcache._kvcache", "-p", str(PATTERNS), "-o",
            str(output)]


def main():
    parser = argparse.ArgumentParser(description="Regenerates the stub of kvcache._kvcache with nanobind's stubgen "
                                     "(the module is imported from PYTHONPATH: the build tree's python folder).")
    parser.add_argument("-o", "--output", type=Path, default=STUB, help=f"where to write it (default: {STUB})")
    output = parser.parse_args().output.resolve()
    # Run from the repository root: run from python/, the source package (no module in it) would be imported instead
    # of the built one. PYTHONPATH's folders are made absolute so that they still name them from there.
    env = dict(os.environ)
    paths = env.get("PYTHONPATH", "").split(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join(str(Path(path).resolve()) for path in paths if path)
    result = subprocess.run(stubgen_command(output), cwd=PYTHON_DIR.parent, env=env, check=False)
    if result.returncode != 0:
        sys.exit(f"stubgen failed (exit status {result.returncode}); is the built module on PYTHONPATH, e.g. "
                 "PYTHONPATH=build/py/python?")


if __name__ == "__main__":
    main()
