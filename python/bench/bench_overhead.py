#!/usr/bin/env python3
"""Host overhead of the Python binding: enqueueing copy_pages with a 256-pair host list from Python against the same
C++ call timed in C++ (kvcache._kvcache._time_copy_pages_cpp), and the cost of making a DLPack view.

Only host time is measured (the calls are asynchronous): each batch of calls is timed, then the stream is drained
outside the timing, so that enqueueing never waits on the GPU. Needs a GPU; exits 77 with a message without one.

    python python/bench/bench_overhead.py [--iterations N] [--json]
"""

import argparse
import json
import sys
import time

import kvcache
from kvcache import _kvcache

PAIRS = kvcache.MAX_INLINE_PAGE_OPS  # 256: one launch


def time_batches(call, iterations, batch, drain):
    """Seconds spent in `iterations` calls, timed batch by batch with `drain` between batches."""
    total = 0.0
    done = 0
    while done < iterations:
        calls = min(batch, iterations - done)
        start = time.perf_counter()
        for _ in range(calls):
            call()
        total += time.perf_counter() - start
        drain()
        done += calls
    return total


def best_of(repeats, measure):
    return min(measure() for _ in range(repeats))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()

    reason = kvcache.gpu_unavailable_reason()
    if reason:
        print(f"bench_overhead.py needs a GPU: {reason}", file=sys.stderr)
        return 77

    # Small pages, so that the GPU keeps up with the launches and only the host side is measured.
    config = kvcache.Config(layer_configs=[(1, 64)], max_batch_size=32, max_sequence_length=256, tokens_per_page=16)
    cache = kvcache.KVCacheManager(config)
    assert cache.num_pages() >= 2 * PAIRS
    pair_list = [(page, PAIRS + page) for page in range(PAIRS)]
    results = {"pairs": PAIRS, "iterations": args.iterations}
    n = args.iterations

    results["cpp_copy_pages_us"] = 1e6 / n * best_of(
        args.repeats, lambda: _kvcache._time_copy_pages_cpp(cache, pair_list, n, 64))
    try:
        import numpy as np

        pair_array = np.array(pair_list, dtype=np.int32)
        results["python_copy_pages_numpy_us"] = 1e6 / n * best_of(
            args.repeats, lambda: time_batches(lambda: cache.copy_pages(pair_array), n, 64, cache.synchronize))
    except ImportError:
        pass
    results["python_copy_pages_list_us"] = 1e6 / n * best_of(
        args.repeats, lambda: time_batches(lambda: cache.copy_pages(pair_list), n, 64, cache.synchronize))

    view = cache.pool_view(0)
    results["pool_view_us"] = 1e6 / n * best_of(
        args.repeats, lambda: time_batches(lambda: cache.pool_view(0), n, n, lambda: None))
    results["dlpack_capsule_us"] = 1e6 / n * best_of(
        args.repeats, lambda: time_batches(lambda: view.__dlpack__(stream=-1, max_version=(1, 0)), n, n,
                                           lambda: None))
    try:
        import torch

        results["torch_from_dlpack_us"] = 1e6 / n * best_of(
            args.repeats, lambda: time_batches(lambda: torch.from_dlpack(cache.pool_view(0)), n, n, lambda: None))
    except ImportError:
        pass

    cpp = results["cpp_copy_pages_us"]
    for key in ("python_copy_pages_numpy_us", "python_copy_pages_list_us"):
        if key in results:
            results[key.replace("_us", "_ratio")] = results[key] / cpp
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"copy_pages, {PAIRS} pairs, host enqueue time per call (best of {args.repeats} x {n} calls):")
    print(f"  C++ rt::copyPages              {cpp:8.2f} us")
    for key, label in (("python_copy_pages_numpy_us", "Python, int32 NumPy [256, 2]"),
                       ("python_copy_pages_list_us", "Python, list of tuples")):
        if key in results:
            print(f"  {label:30} {results[key]:8.2f} us  ({results[key] / cpp:.2f}x C++)")
    print("views:")
    print(f"  cache.pool_view(0)             {results['pool_view_us']:8.2f} us")
    print(f"  view.__dlpack__()              {results['dlpack_capsule_us']:8.2f} us")
    if "torch_from_dlpack_us" in results:
        print(f"  torch.from_dlpack(pool_view)   {results['torch_from_dlpack_us']:8.2f} us (includes the stream event)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
