#!/usr/bin/env python3
"""Plot host-tier transfer speed against page ids per call from kvcache-bench-host-tier's text output.

Usage:
    kvcache-bench-host-tier > host_tier.txt
    python3 benchmarks/plot_host_tier.py host_tier.txt -o docs/host_tier.png

Left panel offload, right panel onboard: GB/s of each method and of the contiguous cudaMemcpyAsync of the same
bytes (dashed), measured in the same run; the 95% line of the contiguous copy is dotted.
"""

import argparse
import re
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LINE = re.compile(
    r"^(offload|onboard)/(kernel|copy_engine)/(\d+): ([\d.]+) GB/s, contiguous ([\d.]+) GB/s, ratio ([\d.]+)$"
)
METHODS = [
    ("copy_engine", "copy engine, staged (kCOPY_ENGINE)", "tab:blue", "o"),
    ("kernel", "kernel on 8 SMs (kKERNEL)", "tab:orange", "s"),
]


def parse(path):
    """Returns {direction: {method: [(pages, GB/s)]}} and {direction: [(pages, contiguous GB/s)]}."""
    rates = defaultdict(lambda: defaultdict(list))
    contiguous = defaultdict(dict)
    with open(path, encoding="utf-8") as text:
        for line in text:
            match = LINE.match(line.strip())
            if not match:
                continue
            direction, method, pages, rate, base, _ = match.groups()
            rates[direction][method].append((int(pages), float(rate)))
            contiguous[direction][int(pages)] = float(base)
    return rates, {d: sorted(c.items()) for d, c in contiguous.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="kvcache-bench-host-tier output")
    parser.add_argument("-o", "--output", default="host_tier.png")
    args = parser.parse_args()
    rates, contiguous = parse(args.log)
    if not rates:
        sys.exit(f"{args.log}: no transfer lines found")
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for axis, direction in zip(axes, ("offload", "onboard")):
        base = contiguous.get(direction, [])
        axis.plot([p for p, _ in base], [r for _, r in base], "k--", label="contiguous cudaMemcpyAsync")
        axis.plot([p for p, _ in base], [0.95 * r for _, r in base], "k:", linewidth=0.8, label="95% of contiguous")
        for method, label, color, marker in METHODS:
            points = sorted(rates[direction].get(method, []))
            axis.plot([p for p, _ in points], [r for _, r in points], marker=marker, color=color, label=label)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("scattered page ids per call (2 MiB each)")
        axis.set_title(f"{direction} ({'device to host' if direction == 'offload' else 'host to device'})")
        axis.grid(True, alpha=0.3)
    axes[0].set_ylabel("GB/s")
    axes[0].legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
