#!/usr/bin/env bash
# Before and after on one GPU: builds the tree at commit BASE and this tree (Release, sm_90, benchmarks only) side by
# side, then runs the page-operation, KV write and quantized host tier benchmarks of both in turns (new, old, new,
# old), so that the machine's drift falls on both. Usage, from the repository root of a clone (git needed):
#   bash benchmarks/compare_builds.sh BASE [OUT_DIR]
# Results go to OUT_DIR (default build/compare): pageops_<side>_<round>.json, kvwrite_*.txt, hosttier_*.txt.
set -euo pipefail

base=${1:?usage: compare_builds.sh BASE [OUT_DIR]}
out=${2:-build/compare}
mkdir -p "${out}" build/baseline-src
git archive "${base}" | tar -x -C build/baseline-src
flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DKVCACHE_BUILD_TESTS=ON
    -DKVCACHE_PYTHON_TESTS=OFF -DKVCACHE_BUILD_EXAMPLES=OFF)
targets=(kvcache-bench-page-ops kvcache-bench-kv-write kvcache-bench-host-tier)
jobs=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
cmake -S . -B build/compare-new "${flags[@]}" >"${out}/cfg_new.log"
cmake -S build/baseline-src -B build/compare-old "${flags[@]}" >"${out}/cfg_old.log"
cmake --build build/compare-new -j"${jobs}" --target "${targets[@]}" >"${out}/build_new.log" &
cmake --build build/compare-old -j"${jobs}" --target "${targets[@]}" >"${out}/build_old.log" &
wait %1 && wait %2

# The page operations' headline cases: scattered and run copies, resets, one pair, back-to-back calls, host enqueue.
F='^copy/fp16_uniform/(ceiling|kvcache_host|kvcache_device)/(1|256)/|^reset/fp16_uniform/(ceiling|kvcache_host)/256/'
F+='|^copy/fp16_mixed/(ceiling|kvcache_host)/256/|^copy_runs/fp16_uniform/(ceiling|kvcache_host)/256/'
F+='|^back_to_back/|^enqueue/'
for round in 1 2; do
    for side in new old; do
        echo "round ${round}: ${side}"
        "build/compare-${side}/benchmarks/kvcache-bench-page-ops" --benchmark_filter="${F}" \
            --benchmark_out="${out}/pageops_${side}_${round}.json" --benchmark_out_format=json >/dev/null
        "build/compare-${side}/benchmarks/kvcache-bench-kv-write" --reps=30 >"${out}/kvwrite_${side}_${round}.txt"
        "build/compare-${side}/benchmarks/kvcache-bench-host-tier" --quantized-only --reps=10 \
            >"${out}/hosttier_${side}_${round}.txt"
    done
done
echo "results: ${out}"
