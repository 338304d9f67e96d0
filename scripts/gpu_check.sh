#!/usr/bin/env bash
# The check to run on a GPU host: builds the "gpu" preset, runs every test with KVCACHE_REQUIRE_GPU=1 (a test that
# does not run fails the check), then runs each test executable labelled gpu under compute-sanitizer memcheck (with
# leak checking) and each labelled kernel under racecheck, death tests excluded (they fork).
# Logs go to $OUT when it is set, else to build/gpu/logs. Prints a summary table last; exits non-zero on any failure.
# KVCACHE_SANITIZER_TIMEOUT (seconds, default 150) bounds each sanitizer run; KVCACHE_SANITIZER_JOBS (default 4)
# sanitizer runs go at once (each is bound by the host-side instrumentation more than by the GPU).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
build_dir=build/gpu
log_dir=${OUT:-${build_dir}/logs}
mkdir -p "${log_dir}"
log_dir=$(cd "${log_dir}" && pwd)
sanitizer_timeout=${KVCACHE_SANITIZER_TIMEOUT:-150}
sanitizer_jobs=${KVCACHE_SANITIZER_JOBS:-4}
export KVCACHE_REQUIRE_GPU=1

cuda_home=${CUDA_HOME:-/usr/local/cuda}
if ! command -v nvcc >/dev/null 2>&1 && [[ -x ${cuda_home}/bin/nvcc ]]; then
    export PATH="${cuda_home}/bin:${PATH}"
fi

steps=()
results=()
details=()
failed=0

# record <step> <result> <details>: adds a row to the summary; any result but "pass" fails the check.
record()
{
    steps+=("$1")
    results+=("$2")
    details+=("$3")
    if [[ $2 != pass ]]; then
        failed=1
        echo "--- $1: $2 ($3)"
    fi
}

summary()
{
    echo
    echo "logs: ${log_dir}"
    printf '%-36s %-8s %s\n' step result errors
    for i in "${!steps[@]}"; do
        printf '%-36s %-8s %s\n' "${steps[i]}" "${results[i]}" "${details[i]}"
    done
    exit "${failed}"
}

# logged <log> <command...>: runs the command with its output in the log; returns its status.
logged()
{
    local log=$1
    shift
    echo "+ $* > ${log}"
    "$@" </dev/null >"${log}" 2>&1
}

# count <pattern> <file>: lines of the file matching the extended regular expression.
count()
{
    grep -cE "$1" "$2" || true
}

if logged "${log_dir}/configure.log" cmake --preset gpu; then
    record configure pass -
else
    record configure fail "see configure.log"
    tail -n 30 "${log_dir}/configure.log"
    summary
fi

if logged "${log_dir}/build.log" cmake --build --preset gpu -- -k 0; then
    record build pass -
else
    record build fail "$(count '^FAILED: ' "${log_dir}/build.log") failed build steps"
    grep -E '^FAILED: |error' "${log_dir}/build.log" | head -n 30
    # A compiler of this host may warn where others do not: build again without -Werror, so that one run also
    # reports the tests (the check has failed either way).
    if ! logged "${log_dir}/build_no_werror.log" cmake --preset gpu -DKVCACHE_WARNINGS_AS_ERRORS=OFF \
        || ! logged "${log_dir}/build_no_werror.log" cmake --build --preset gpu; then
        record "build without -Werror" fail "see build_no_werror.log"
        summary
    fi
fi

logged "${log_dir}/ctest.log" ctest --preset gpu
ctest_status=$?
# CTest's closing line reads "N% tests passed, F tests failed out of T", or "100% tests passed out of T" in CMake 4.
ctest_failed=$(sed -nE 's/.* ([0-9]+) tests? failed out of [0-9]+.*/\1/p' "${log_dir}/ctest.log" | tail -n 1)
ctest_total=$(sed -nE 's/.*tests? (passed|failed) out of ([0-9]+).*/\2/p' "${log_dir}/ctest.log" | tail -n 1)
if [[ -n ${ctest_total} && -z ${ctest_failed} ]]; then
    ctest_failed=0
fi
not_run=$(count '^[[:space:]]*[0-9]+ - .*\((Skipped|Disabled|Not Run|Required Files Missing)\)' "${log_dir}/ctest.log")
ctest_details="${ctest_failed:-?} failed, ${not_run} not run, of ${ctest_total:-?}"
if ((ctest_status == 0 && not_run == 0)) && [[ -n ${ctest_total} ]]; then
    record "ctest --preset gpu" pass "${ctest_details}"
else
    record "ctest --preset gpu" fail "${ctest_details}"
    grep -E '\((Failed|Skipped|Disabled|Not Run|Timeout|SEGFAULT|Subprocess aborted|Exception)' \
        "${log_dir}/ctest.log" | head -n 30
fi

# list_executables <label> <output>: the GoogleTest executables of the tests carrying exactly that label.
list_executables()
{
    ctest --preset gpu -N -L "^$1\$" --show-only=json-v1 >"${log_dir}/tests_$1.json" 2>"${log_dir}/tests_$1.log" \
        && cmake -DLISTING="${log_dir}/tests_$1.json" -DOUTPUT="$2" -P cmake/list_test_executables.cmake
}

# Left out under the sanitizers: death tests fork; the out-of-memory test makes an allocation fail on purpose, which
# the sanitizer reports as an API error; the queueing test needs launches that do not wait, which the sanitizers
# serialise. All of them ran in the ctest step above.
sanitizer_exclusions='*DeathTest*:*OutOfMemory*:*WithoutWaitingForIt*'
sanitizer=$(command -v compute-sanitizer || echo "${cuda_home}/bin/compute-sanitizer")

# last_number <sed expression> <file>: the number the expression extracts from the file's last matching line.
last_number()
{
    sed -nE "$1" "$2" | tail -n 1
}

# sanitize <tool> <executable> [sanitizer options...]: runs the executable's tests, death tests aside, under the tool,
# and writes its summary row to result_<tool>_<name>.txt (it runs in the background: record() is the parent's).
# Passes when the tool and the tests exit 0, the tool's summary reports nothing and at least one test passed.
sanitize()
{
    local tool=$1 executable=$2
    shift 2
    local name log status findings detail
    name=$(basename "${executable}")
    log="${log_dir}/${tool}_${name}.log"
    # From the executable's folder, where ctest runs it too.
    (
        cd "$(dirname "${executable}")" \
            && logged "${log}" timeout --kill-after=10 "${sanitizer_timeout}" "${sanitizer}" --tool "${tool}" \
                --error-exitcode 1 "$@" "${executable}" "--gtest_filter=-${sanitizer_exclusions}"
    )
    status=$?
    if [[ ${tool} == racecheck ]]; then
        findings=$(last_number 's/.*RACECHECK SUMMARY: ([0-9]+) hazards?.*/\1/p' "${log}")
        detail="${findings:-no summary} hazards"
    else
        findings=$(last_number 's/.*ERROR SUMMARY: ([0-9]+) errors?.*/\1/p' "${log}")
        local leaked
        leaked=$(last_number 's/.*LEAK SUMMARY: ([0-9]+) bytes leaked.*/\1/p' "${log}")
        detail="${findings:-no summary} errors, ${leaked:-?} bytes leaked"
    fi
    local passed failures skipped
    passed=$(last_number 's/^\[  PASSED  \] ([0-9]+) tests?\.$/\1/p' "${log}")
    failures=$(last_number 's/^\[  FAILED  \] ([0-9]+) tests?, listed below:$/\1/p' "${log}")
    skipped=$(last_number 's/^\[  SKIPPED \] ([0-9]+) tests?, listed below:$/\1/p' "${log}")
    failures=${failures:-0}
    skipped=${skipped:-0}
    detail="${detail}; tests: ${passed:-0} passed, ${failures} failed, ${skipped} skipped"
    local result=pass
    if ((status == 124 || status == 137)); then
        result=timeout
        detail="over ${sanitizer_timeout} s; ${detail}"
    elif ! ((status == 0 && failures == 0 && skipped == 0 && ${passed:-0} > 0)) || [[ ${findings} != 0 ]]; then
        result=fail
        detail="exit ${status}; ${detail}"
    fi
    printf '%s\t%s\t%s\n' "${tool} ${name}" "${result}" "${detail}" >"${log_dir}/result_${tool}_${name}.txt"
}

if [[ ! -x ${sanitizer} ]]; then
    record compute-sanitizer fail "not found on PATH or in ${cuda_home}/bin"
    summary
fi

rm -f "${log_dir}"/result_*.txt
for label_tool in gpu:memcheck kernel:racecheck; do
    label=${label_tool%%:*}
    tool=${label_tool#*:}
    list="${log_dir}/executables_${label}.txt"
    if ! list_executables "${label}" "${list}" || [[ ! -s ${list} ]]; then
        record "${tool} (tests labelled ${label})" fail "no executables found; see tests_${label}.log"
        continue
    fi
    while IFS= read -r executable; do
        while (($(jobs -rp | wc -l) >= sanitizer_jobs)); do
            wait -n
        done
        if [[ ${tool} == memcheck ]]; then
            sanitize memcheck "${executable}" --leak-check full &
        else
            sanitize racecheck "${executable}" &
        fi
    done <"${list}"
done
wait
for row in "${log_dir}"/result_*.txt; do
    [[ -e ${row} ]] || continue
    IFS=$'\t' read -r step result detail <"${row}"
    record "${step}" "${result}" "${detail}"
    if [[ ${result} != pass ]]; then
        log="${log_dir}/${step// /_}.log"
        grep -E '^=========|^\[  (FAILED|SKIPPED) \]' "${log}" | head -n 40
    fi
done

summary
