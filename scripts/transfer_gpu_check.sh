#!/usr/bin/env bash
# The page-transfer check for a host with two GPUs: configures with -DKVCACHE_BUILD_TRANSFER=ON against NCCL ($NCCL_ROOT
# when set, else a system install (nccl.h under /usr/include or the CUDA toolkit), else the unpacked nvidia-nccl-cu13
# wheel in .gl/nccl when present), builds the transfer tests and benchmark, runs the tests (KVCACHE_REQUIRE_GPU=1), the
# tests under compute-sanitizer memcheck, the benchmark, and the tests and benchmark again over NCCL's socket transport
# (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1). Every run has a time limit (timeout), so a hang fails its step instead of
# stalling the check. GTEST_FILTER in the environment narrows the tests (GoogleTest reads it).
# Logs go to $OUT when it is set, else to build/transfer/logs. Exits non-zero on any failure.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
build_dir=build/transfer
log_dir=${OUT:-${build_dir}/logs}
mkdir -p "${log_dir}"
log_dir=$(cd "${log_dir}" && pwd)
export KVCACHE_REQUIRE_GPU=1
cuda_home=${CUDA_HOME:-/usr/local/cuda}
export PATH="${cuda_home}/bin:${PATH}"

# A system NCCL matches the host's driver and CUDA; the wheel is only the fallback for hosts without one.
nccl_root=${NCCL_ROOT:-}
if [[ -z ${nccl_root} && ! -f /usr/include/nccl.h && ! -f ${cuda_home}/include/nccl.h \
    && -f .gl/nccl/nvidia/nccl/include/nccl.h ]]; then
    nccl_root=$(pwd)/.gl/nccl
fi
echo "NCCL_ROOT: ${nccl_root:-(none: the system install)}"
# Seconds one run of the tests (or of the benchmark) may take; memcheck gets twice as long. SIGKILL 10 s after that.
run_limit=300
failed=0
summary=()
# step <name> <log> <command...>: runs the command with its output in the log and records pass or fail.
step()
{
    local name=$1 log=$2
    shift 2
    echo "+ $* > ${log}"
    if "$@" </dev/null >"${log_dir}/${log}" 2>&1; then
        summary+=("pass  ${name}")
    else
        summary+=("FAIL  ${name} (exit $?, see ${log})")
        failed=1
        tail -n 20 "${log_dir}/${log}"
    fi
}

nvidia-smi topo -m >"${log_dir}/topology.txt" 2>&1
step configure configure.log cmake -S . -B "${build_dir}" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DKVCACHE_WARNINGS_AS_ERRORS=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DKVCACHE_BUILD_TRANSFER=ON \
    ${nccl_root:+-DNCCL_ROOT="${nccl_root}"}
step build build.log cmake --build "${build_dir}" --target test_page_transfer kvcache-bench-transfer
tests=${build_dir}/tests/test_page_transfer
bench=${build_dir}/benchmarks/kvcache-bench-transfer
step tests tests.log timeout -k 10 "${run_limit}" "${tests}"
step "tests under memcheck" memcheck.log timeout -k 10 $((2 * run_limit)) "${cuda_home}/bin/compute-sanitizer" \
    --tool memcheck --error-exitcode 1 "${tests}"
step benchmark bench.log timeout -k 10 "${run_limit}" "${bench}" --benchmark_repetitions=1 \
    --benchmark_out="${log_dir}/bench.json" --benchmark_out_format=json
step "tests over sockets" tests_socket.log timeout -k 10 "${run_limit}" env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
    "${tests}"
step "benchmark over sockets" bench_socket.log timeout -k 10 "${run_limit}" env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
    "${bench}" --benchmark_out="${log_dir}/bench_socket.json" --benchmark_out_format=json

echo
echo "logs: ${log_dir}"
printf '%s\n' "${summary[@]}"
exit "${failed}"
