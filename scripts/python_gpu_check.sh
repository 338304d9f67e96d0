#!/usr/bin/env bash
# The Python binding's check on a GPU host: finds the PyTorch virtual environment under /opt (torch, nanobind,
# scikit-build-core, pytest; no network needed), builds the kvcache package from this tree with it (pip, no build
# isolation) into build/python-gpu/site, then runs the pytest suite with KVCACHE_REQUIRE_GPU=1 (a GPU test that cannot
# run fails), the example and the overhead benchmark. Logs go to $OUT when it is set, else to build/python-gpu/logs.
# KVCACHE_PYTHON overrides the interpreter. KVCACHE_PYTHON_STEPS picks the steps after the build (default: pytest
# example serve bench nixl). The pytest step then runs the state layer tests (FLA's kernels when fla imports) under
# compute-sanitizer memcheck and racecheck. The serve step runs examples/python/serve_hybrid.py (a hybrid transformers model whose
# attention pages and recurrent states live in kvcache) when transformers imports, and
# examples/python/serve_transformers.py (a transformers model served over kvcache and FlashInfer in every format,
# then NVFP4 again under memcheck) when flashinfer imports too; each is skipped with the reason otherwise. The nixl step runs examples/python/nixl_disaggregated.py (two processes, pages pulled through
# NIXL: float16, FP8 per token-head and NVFP4, the decode process once under memcheck, and the benchmark) when nixl
# imports, and is skipped with the reason otherwise. A step run without the sanitizer also fails when nanobind reports
# objects of the binding still alive at exit. Prints a summary table last; exits non-zero on any failure.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
work_dir=build/python-gpu
site_dir=${work_dir}/site
log_dir=${OUT:-${work_dir}/logs}
mkdir -p "${log_dir}" "${work_dir}"
log_dir=$(cd "${log_dir}" && pwd)
export KVCACHE_REQUIRE_GPU=1

cuda_home=${CUDA_HOME:-/usr/local/cuda}
if ! command -v nvcc >/dev/null 2>&1 && [[ -x ${cuda_home}/bin/nvcc ]]; then
    export PATH="${cuda_home}/bin:${PATH}"
fi

steps=()
results=()
failed=0
record()
{
    steps+=("$1")
    results+=("$2")
    [[ $2 == pass || $2 == skipped* ]] || failed=1
}
# nanobind prints "nanobind: leaked ..." at exit for every binding object still alive then. A run without the
# sanitizer that prints it fails its step. Under compute-sanitizer the frames of Python functions stay alive after
# they return (in the state layer tests, with nothing in Python referring to them), so the objects they held are
# reported there too; those runs are not checked for it.
no_leak_report()
{
    if grep -q "nanobind: leaked" "$1"; then
        grep -A 4 "nanobind: leaked" "$1" | head -n 20
        return 1
    fi
}
# run_plain LOG COMMAND...: runs a step without the sanitizer, its output in LOG; fails on its leak report too.
run_plain()
{
    local log=$1
    shift
    "$@" >"${log}" 2>&1 && no_leak_report "${log}"
}
wanted=" ${KVCACHE_PYTHON_STEPS:-pytest example serve bench nixl} "
wants() { [[ ${wanted} == *" $1 "* ]]; }
summary()
{
    echo
    echo "logs: ${log_dir}"
    for i in "${!steps[@]}"; do
        printf '%-28s %s\n' "${steps[i]}" "${results[i]}"
    done
    exit "${failed}"
}

python=${KVCACHE_PYTHON:-}
if [[ -z ${python} ]]; then
    for candidate in /opt/*/bin/python /opt/*/.venv/bin/python; do
        if [[ -x ${candidate} ]] && "${candidate}" -c "import torch, nanobind, scikit_build_core, pytest" 2>/dev/null; then
            python=${candidate}
            break
        fi
    done
fi
if [[ -z ${python} ]]; then
    echo "no /opt/*/bin/python imports torch, nanobind, scikit_build_core and pytest; set KVCACHE_PYTHON" >&2
    record "find venv" fail
    summary
fi
echo "python: ${python}"
"${python}" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available())" | tee "${log_dir}/python_env.log"
record "find venv" pass

# sm_90 only, as the gpu preset: a quicker build for the H200.
rm -rf "${site_dir}"
echo "+ pip install --no-build-isolation --target ${site_dir} . > ${log_dir}/python_build.log"
if "${python}" -m pip install --no-build-isolation --no-deps --no-index -v --target "${site_dir}" \
    --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90 \
    --config-settings=build-dir="${work_dir}/cmake" . >"${log_dir}/python_build.log" 2>&1; then
    record "pip install" pass
else
    record "pip install" fail
    grep -E 'error|Error' "${log_dir}/python_build.log" | head -n 30
    summary
fi
export PYTHONPATH="${PWD}/${site_dir}${PYTHONPATH:+:${PYTHONPATH}}"

if wants pytest; then
echo "+ pytest python/tests > ${log_dir}/pytest.log"
if run_plain "${log_dir}/pytest.log" "${python}" -m pytest python/tests -v -rs -p no:cacheprovider \
    --junitxml="${log_dir}/pytest.xml"; then
    record "pytest (KVCACHE_REQUIRE_GPU=1)" "pass"
else
    record "pytest (KVCACHE_REQUIRE_GPU=1)" "fail"
    grep -E '^(FAILED|ERROR)|Error' "${log_dir}/pytest.log" | head -n 30
fi
tail -n 1 "${log_dir}/pytest.log"
# The state layer tests again under the sanitizers: FLA's kernels and the torch references read and write kvcache's
# state slots. torch and Triton make CUDA calls that are expected to fail, so only memory errors count; racecheck
# looks at kvcache's kernels only (FLA's and torch's shared memory is not this project's to check).
for tool in memcheck racecheck; do
    filter=()
    [[ ${tool} == racecheck ]] && filter=(--kernel-name kns=kvcache)
    echo "+ python/tests/test_state_layers_gpu.py under compute-sanitizer ${tool} > ${log_dir}/states_${tool}.log"
    if compute-sanitizer --tool "${tool}" --report-api-errors no --error-exitcode 1 ${filter[@]+"${filter[@]}"} \
        "${python}" -m pytest python/tests/test_state_layers_gpu.py -v -rs -p no:cacheprovider \
        >"${log_dir}/states_${tool}.log" 2>&1; then
        record "state layer tests ${tool}" pass
    else
        record "state layer tests ${tool}" fail
    fi
    grep -E '(passed|failed|skipped)( |,|$)|ERROR SUMMARY|RACECHECK SUMMARY' "${log_dir}/states_${tool}.log" | tail -n 3
done
fi

if wants example; then
echo "+ examples/python/paged_attention.py > ${log_dir}/example.log"
if run_plain "${log_dir}/example.log" "${python}" examples/python/paged_attention.py; then
    record "example paged_attention" pass
else
    record "example paged_attention" fail
fi
cat "${log_dir}/example.log"
fi

if wants serve; then
    if reason=$("${python}" -c "import transformers" 2>&1); then
        echo "+ examples/python/serve_hybrid.py > ${log_dir}/serve_hybrid.log"
        if run_plain "${log_dir}/serve_hybrid.log" "${python}" examples/python/serve_hybrid.py; then
            record "example serve_hybrid" pass
        else
            record "example serve_hybrid" fail
        fi
        tail -n 3 "${log_dir}/serve_hybrid.log"
    else
        echo "serve_hybrid: skipped: ${reason##*$'\n'}"
        record "example serve_hybrid" "skipped (transformers does not import)"
    fi
    if reason=$("${python}" -c "import transformers, flashinfer" 2>&1); then
        echo "+ examples/python/serve_transformers.py > ${log_dir}/serve.log"
        if run_plain "${log_dir}/serve.log" "${python}" examples/python/serve_transformers.py; then
            record "example serve_transformers" pass
        else
            record "example serve_transformers" fail
        fi
        grep -E '^[A-Z0-9_]+ +[0-9]+ positions|FAILED' "${log_dir}/serve.log"
        echo "+ the same, NVFP4, under compute-sanitizer memcheck > ${log_dir}/serve_memcheck.log"
        # torch and FlashInfer's JIT make CUDA calls that are expected to fail; only memory errors count here.
        if compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "${python}" \
            examples/python/serve_transformers.py --quantization nvfp4 >"${log_dir}/serve_memcheck.log" 2>&1; then
            record "serve_transformers memcheck" pass
        else
            record "serve_transformers memcheck" fail
        fi
        grep -E 'positions|ERROR SUMMARY' "${log_dir}/serve_memcheck.log"
    else
        echo "serve: skipped: ${reason##*$'\n'}"
        record "example serve_transformers" "skipped (transformers or flashinfer does not import)"
    fi
fi

if wants bench; then
echo "+ python/bench/bench_overhead.py > ${log_dir}/bench_overhead.log"
if run_plain "${log_dir}/bench_overhead.log" "${python}" python/bench/bench_overhead.py \
    && "${python}" python/bench/bench_overhead.py --json >"${log_dir}/bench_overhead.json" 2>>"${log_dir}/bench_overhead.log" \
    && no_leak_report "${log_dir}/bench_overhead.log"; then
    record "bench_overhead" pass
else
    record "bench_overhead" fail
fi
cat "${log_dir}/bench_overhead.log"
fi

if wants nixl; then
    if reason=$("${python}" -c "import nixl._api" 2>&1); then
        for quantization in none fp8_per_token_head nvfp4; do
            echo "+ examples/python/nixl_disaggregated.py --quantization ${quantization} > ${log_dir}/nixl_${quantization}.log"
            if run_plain "${log_dir}/nixl_${quantization}.log" timeout 300 "${python}" \
                examples/python/nixl_disaggregated.py --quantization "${quantization}"; then
                record "nixl ${quantization}" pass
            else
                record "nixl ${quantization}" fail
            fi
            grep -E '^(decode|prefill)' "${log_dir}/nixl_${quantization}.log"
        done
        echo "+ the decode process under compute-sanitizer memcheck > ${log_dir}/nixl_memcheck.log"
        # UCX asks the driver about every buffer it meets (cuPointerGetAttribute, cuMemRetainAllocationHandle,
        # cuMemCreate) and expects some calls to fail; kvcache checks its own calls, so only memory errors count here.
        if timeout 600 "${python}" examples/python/nixl_disaggregated.py --quantization nvfp4 \
            --decode-prefix "compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1" >"${log_dir}/nixl_memcheck.log" 2>&1; then
            record "nixl decode memcheck" pass
        else
            record "nixl decode memcheck" fail
        fi
        grep -E '^(decode|prefill)|ERROR SUMMARY' "${log_dir}/nixl_memcheck.log"
        echo "+ examples/python/nixl_disaggregated.py --bench > ${log_dir}/nixl_bench.log"
        if run_plain "${log_dir}/nixl_bench.log" timeout 300 "${python}" examples/python/nixl_disaggregated.py --bench; then
            record "nixl bench" pass
        else
            record "nixl bench" fail
        fi
        grep -E '^(decode|prefill|bench)' "${log_dir}/nixl_bench.log"
    else
        echo "nixl: skipped, it does not import: ${reason##*$'\n'}"
        record "nixl" "skipped (nixl does not import)"
    fi
fi

summary
