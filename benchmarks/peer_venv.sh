#!/usr/bin/env bash
# The peers that python/bench/bench_kv_write.py sets kvcache beside, from PyPI, in a virtual environment of their own:
# torch and FlashInfer at the versions docs/benchmarks.md names, and kvcache built from this clone (pip install .).
# Usage, from the repository root of a clone, on a GPU host with the CUDA toolkit:
#   bash benchmarks/peer_venv.sh [VENV_DIR]            (default build/peer-venv)
#   build/peer-venv/bin/python python/bench/bench_kv_write.py
set -euo pipefail

venv=${1:-build/peer-venv}
torch_version=${TORCH_VERSION:-2.11.0}
flashinfer_version=${FLASHINFER_VERSION:-0.7.4}

python3 -m venv "${venv}"
"${venv}/bin/pip" install --upgrade pip
"${venv}/bin/pip" install "torch==${torch_version}" "flashinfer-python==${flashinfer_version}" numpy
"${venv}/bin/pip" install .
"${venv}/bin/python" -c "import torch, flashinfer, kvcache; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'flashinfer', flashinfer.__version__, 'kvcache', kvcache.__file__)"
