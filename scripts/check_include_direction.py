#!/usr/bin/env python3
"""Checks that the library's #include lines point only downward.

Folders of src/ are ordered from the bottom up (ORDER). A file may include internal headers of its own folder and of
folders below it, and public headers (kvcache/<layer>/...) of its own layer and the layers below. Public headers may
include only public headers of their own layer and the layers below. Internal headers are included by folder from src/,
never by a relative path. Prints every include that points upward or is relative and exits 1 if there is one.
"""
import pathlib
import re
import sys

# From the bottom up. A subfolder listed here is a folder of its own, placed where its includes point downward (below
# its parent when the parent's files use it, above when it uses them); one not listed belongs to its folder
# (memory/kv_write/quant is part of memory/kv_write).
ORDER = [
    "core",
    "core/layout",
    "device",
    "memory/cache",
    "memory/page_ops",
    "memory/kv_write",
    "paging/parts",
    "paging/parts/boundaries",
    "paging/parts/prefix",
    "paging/page_manager",
    "paging/page_table",
    "tiers/host_tier/host_pages",
    "tiers/host_tier",
    "tiers/sequence_file",
    "tiers/tiered",
    "dist",
    "events",
]
# The public headers' layers, from the bottom up, and the first folder of src/ that may use each.
PUBLIC_LAYERS = ["core", "memory", "paging", "tiers", "dist", "events"]
PUBLIC_FLOOR = {"core": "core", "memory": "memory/cache", "paging": "paging/parts",
                "tiers": "tiers/host_tier/host_pages", "dist": "dist", "events": "events"}
INCLUDE = re.compile(r'^\s*#\s*include\s+[<"]([^>"]+)[>"]', re.MULTILINE)


def folder_of(path):
    """Returns the ORDER entry that holds `path` (relative to src/), or None."""
    best = None
    for folder in ORDER:
        if path == folder or path.startswith(folder + "/"):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    problems = []
    sources = [p for p in (root / "src").rglob("*") if p.suffix in (".h", ".cpp", ".cu", ".cuh")]
    if not sources:
        problems.append(f"{root / 'src'}: no sources found")
    for path in sorted(sources):
        relative = path.relative_to(root / "src").as_posix()
        mine = folder_of(relative)
        if mine is None:
            problems.append(f"src/{relative}: its folder is not in the order of scripts/check_include_direction.py")
            continue
        for included in INCLUDE.findall(path.read_text()):
            parts = included.split("/")
            if parts[0] in (".", ".."):
                # A relative path would pass unchecked: internal headers are included by folder from src/.
                problems.append(f"src/{relative}: includes {included} by a relative path, not by folder from src/")
                continue
            if parts[0] == "kvcache" and len(parts) == 3:
                target = PUBLIC_FLOOR.get(parts[1])
            elif parts[0] == "kvcache":
                target = "core" if included == "kvcache/version.h" else None
            elif len(parts) > 1 and (root / "src" / included).exists():
                target = folder_of(included)
            else:
                continue  # a library or standard header
            if target is None:
                problems.append(f"src/{relative}: includes {included}, which is in no known layer")
            elif ORDER.index(target) > ORDER.index(mine):
                problems.append(f"src/{relative} ({mine}): includes {included} ({target}), which is above it")
    for path in sorted((root / "include" / "kvcache").rglob("*.h")):
        relative = path.relative_to(root / "include").as_posix()
        parts = relative.split("/")
        if len(parts) != 3:
            continue  # the umbrella header includes every layer
        if parts[1] not in PUBLIC_LAYERS:
            problems.append(f"include/{relative}: its layer is not one of {PUBLIC_LAYERS}")
            continue
        for included in INCLUDE.findall(path.read_text()):
            target = included.split("/")
            if target[0] != "kvcache" or len(target) != 3:
                continue
            if target[1] not in PUBLIC_LAYERS or PUBLIC_LAYERS.index(target[1]) > PUBLIC_LAYERS.index(parts[1]):
                problems.append(f"include/{relative}: includes {included}, which is above its layer")
    for problem in problems:
        print(problem)
    print(f"{len(sources)} sources checked; {len(problems)} includes point upward or out of the order")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
