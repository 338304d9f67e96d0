#!/usr/bin/env bash
# The host tier's check on a GPU host: builds its targets with the "gpu" preset (build/gpu), runs the host and GPU
# tests with KVCACHE_REQUIRE_GPU=1, the GPU tests (test_host_tier_contract over every cache variant,
# test_host_tier_states, test_host_tier, and test_sequence_file_scales for quantized caches) under compute-sanitizer
# memcheck (with leak checking) and racecheck, then kvcache-bench-host-tier. Logs go to $OUT when it is set, else to
# build/gpu/logs/host_tier. Prints a summary last; exits non-zero on any failure. KVCACHE_BENCH_TIER_GIB (default 64)
# sizes the benchmark's construction run.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
build_dir=build/gpu
log_dir=${OUT:-${build_dir}/logs/host_tier}
mkdir -p "${log_dir}"
log_dir=$(cd "${log_dir}" && pwd)
export KVCACHE_REQUIRE_GPU=1
cuda_home=${CUDA_HOME:-/usr/local/cuda}
if ! command -v nvcc >/dev/null 2>&1 && [[ -x ${cuda_home}/bin/nvcc ]]; then
    export PATH="${cuda_home}/bin:${PATH}"
fi
sanitizer=$(command -v compute-sanitizer || echo "${cuda_home}/bin/compute-sanitizer")

rows=()
failed=0
# record <step> <status>: a summary row; a non-zero status fails the check.
record()
{
    local result=pass
    if [[ $2 != 0 ]]; then
        result="fail (exit $2)"
        failed=1
    fi
    rows+=("$(printf '%-32s %s' "$1" "${result}")")
}
# logged <log> <command...>: runs the command with its output in the log; returns its status.
logged()
{
    local log=$1
    shift
    echo "+ $* > ${log}"
    "$@" </dev/null >"${log}" 2>&1
}

logged "${log_dir}/configure.log" cmake --preset gpu
record configure $?
host_tests=(test_sequence_file test_sequence_file_quantized test_sequence_file_states test_host_page_layout)
gpu_tests=(test_host_tier_contract test_host_tier_states test_host_tier test_sequence_file_scales)
logged "${log_dir}/build.log" cmake --build --preset gpu --target "${host_tests[@]}" "${gpu_tests[@]}" \
    kvcache-bench-host-tier
status=$?
record build ${status}
if ((status == 0)); then
    for test in "${host_tests[@]}" "${gpu_tests[@]}"; do
        logged "${log_dir}/${test}.log" "${build_dir}/tests/${test}"
        record "${test}" $?
    done
    # --error-exitcode makes any finding fail the step; the tests' own failures fail it through their exit status.
    for test in "${gpu_tests[@]}"; do
        logged "${log_dir}/memcheck_${test}.log" "${sanitizer}" --tool memcheck --leak-check full \
            --error-exitcode 1 "${build_dir}/tests/${test}"
        record "memcheck ${test}" $?
        logged "${log_dir}/racecheck_${test}.log" "${sanitizer}" --tool racecheck --error-exitcode 1 \
            "${build_dir}/tests/${test}"
        record "racecheck ${test}" $?
    done
    logged "${log_dir}/bench_host_tier.log" "${build_dir}/benchmarks/kvcache-bench-host-tier" \
        "--tier-gib=${KVCACHE_BENCH_TIER_GIB:-64}"
    record kvcache-bench-host-tier $?
fi

echo
echo "logs: ${log_dir}"
printf '%s\n' "${rows[@]}"
grep -hE '^(offload|onboard|crossover|device_list|bidirectional|compute_slowdown|construction)' "${log_dir}/bench_host_tier.log" \
    2>/dev/null
exit "${failed}"
