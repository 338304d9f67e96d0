#!/usr/bin/env python3
"""Plot page-copy bandwidth against pages per call from kvcache-bench-page-ops JSON output.

Usage:
    kvcache-bench-page-ops --benchmark_out=page_ops.json --benchmark_out_format=json
    python3 benchmarks/plot_bandwidth.py page_ops.json -o docs/bandwidth.png

Top panel: achieved bandwidth (bytes read + bytes written per second) of each method, with the contiguous
cudaMemcpyAsync ceiling as a dashed line. Bottom panel: the same as a percentage of that ceiling.
"""

import argparse
import json
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Benchmark method names (third part of the benchmark name) and how to draw them; {call} is the CUDA call a copy
# or a reset uses.
METHODS = [
    ("kvcache_host", "kvcache, host list", "tab:blue", "o"),
    ("kvcache_device", "kvcache, device list", "tab:orange", "s"),
    ("per_page", "{call} per page", "tab:red", "v"),
    ("batch_memcpy", "cudaMemcpyBatchAsync", "tab:green", "^"),
]
CEILING = "ceiling"
CUDA_CALL = {"copy": "cudaMemcpyAsync", "reset": "cudaMemsetAsync"}


def parse_name(entry):
    """Return (operation, model, method, pages) from 'copy/fp16_uniform/kvcache_host/64/manual_time'."""
    parts = entry.get("run_name", entry["name"]).split("/")
    if len(parts) < 4 or not parts[3].isdigit():
        return None
    return parts[0], parts[1], parts[2], int(parts[3])


def load_points(path, operation, model):
    """Return {method: {pages: (GB/s, % of ceiling)}} for one operation and model.

    Repeated runs (--benchmark_repetitions) are reduced to their median; the JSON's own aggregates are ignored.
    """
    with open(path, encoding="utf-8") as stream:
        report = json.load(stream)
    samples = defaultdict(list)
    for entry in report.get("benchmarks", []):
        if entry.get("run_type", "iteration") != "iteration" or entry.get("error_occurred"):
            continue
        parsed = parse_name(entry)
        if parsed is None or parsed[0] != operation or parsed[1] != model:
            continue
        if "GBps_read_plus_write" not in entry or "pct_of_ceiling" not in entry:
            continue
        samples[(parsed[2], parsed[3])].append((entry["GBps_read_plus_write"], entry["pct_of_ceiling"]))
    points = defaultdict(dict)
    for (method, pages), values in samples.items():
        points[method][pages] = (
            statistics.median(v[0] for v in values),
            statistics.median(v[1] for v in values),
        )
    return points


def plot(points, title, call, out_path):
    """Draw both panels and write the PNG to out_path; call names the CUDA call of the ceiling and per-page lines."""
    figure, (bandwidth_axes, percent_axes) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    if CEILING in points:
        pages = sorted(points[CEILING])
        bandwidth_axes.plot(pages, [points[CEILING][p][0] for p in pages], "k--", label=f"ceiling: one {call}")
    percent_axes.axhline(100.0, color="k", linestyle="--", linewidth=1)
    for method, label, color, marker in METHODS:
        if method not in points:
            continue
        label = label.format(call=call)
        pages = sorted(points[method])
        bandwidth_axes.plot(pages, [points[method][p][0] for p in pages], color=color, marker=marker, label=label)
        percent_axes.plot(pages, [points[method][p][1] for p in pages], color=color, marker=marker, label=label)
    bandwidth_axes.set_ylabel("GB/s (read + written)")
    bandwidth_axes.set_title(title)
    bandwidth_axes.grid(True, which="both", alpha=0.3)
    bandwidth_axes.legend(loc="best", fontsize="small")
    percent_axes.set_ylabel("% of ceiling")
    percent_axes.set_xlabel("pages per call")
    percent_axes.set_xscale("log", base=2)
    all_pages = sorted({p for method_points in points.values() for p in method_points})
    percent_axes.set_xticks(all_pages)
    percent_axes.set_xticklabels([str(p) for p in all_pages])
    percent_axes.set_ylim(bottom=0)
    bandwidth_axes.set_ylim(bottom=0)
    percent_axes.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(out_path, dpi=120)
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", help="output of --benchmark_out=<file> --benchmark_out_format=json")
    parser.add_argument("-o", "--output", default="bandwidth.png", help="PNG to write (default: bandwidth.png)")
    parser.add_argument("--operation", default="copy", help="benchmark operation to plot (default: copy)")
    parser.add_argument("--model", default="fp16_uniform", help="model to plot (default: fp16_uniform)")
    args = parser.parse_args(argv)

    points = load_points(args.json, args.operation, args.model)
    if not any(method in points for method, _, _, _ in METHODS):
        print(f"no '{args.operation}/{args.model}/...' results with bandwidth counters in {args.json}", file=sys.stderr)
        return 1
    title = f"kvcache page {args.operation}, {args.model}: bandwidth against pages per call"
    plot(points, title, CUDA_CALL.get(args.operation, "transfer"), args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
