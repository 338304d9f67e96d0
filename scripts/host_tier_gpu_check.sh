#!/usr/bin/env bash
# The host tier's check on a GPU host: builds its targets with the "gpu" preset (build/gpu), runs the host and GPU
# tests with KVCACHE_REQUIRE_GPU=1, test_host_tier under compute-sanitizer memcheck (with leak checking) and racecheck,
# then kvcache-bench-host-tier. Logs go to $OUT when it is set, else to build/gpu/logs/host_tier. Prints a summary
# last; exits non-zero on any failure. KVCACHE_BENCH_TIER_GIB (default 64) sizes the benchmark's construction run.
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
logged "${log_dir}/build.log" cmake --build --preset gpu --target test_host_tier test_sequence_file \
    kvcache-bench-host-tier
status=$?
record build ${status}
if ((status == 0)); then
    logged "${log_dir}/test_sequence_file.log" "${build_dir}/tests/test_sequence_file"
    record test_sequence_file $?
    logged "${log_dir}/test_host_tier.log" "${build_dir}/tests/test_host_tier"
    record test_host_tier $?
    # --error-exitcode makes any finding fail the step; the tests' own failures fail it through their exit status.
    logged "${log_dir}/memcheck_test_host_tier.log" "${sanitizer}" --tool memcheck --leak-check full \
        --error-exitcode 1 "${build_dir}/tests/test_host_tier"
    record "memcheck test_host_tier" $?
    logged "${log_dir}/racecheck_test_host_tier.log" "${sanitizer}" --tool racecheck --error-exitcode 1 \
        "${build_dir}/tests/test_host_tier"
    record "racecheck test_host_tier" $?
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
