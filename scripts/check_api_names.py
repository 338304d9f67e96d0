#!/usr/bin/env python3
"""Checks that every C++ name the API reference lists is declared in a public header.

    scripts/check_api_names.py <repository root> [reference.md ...]   (default: docs/api.md)

A name is taken from the first column of each table of the reference: the code spans there, with what is inside
parentheses (parameters) left out, give names such as `KVCacheManager::validate`, `rt::copyPages` or
`PageOpTarget.group`; each identifier of such a name must occur as a whole word in include/kvcache/. Prints every
name not found and exits 1 if there is one, or if the reference lists no name at all.
"""
import pathlib
import re
import sys

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Namespaces and words of C++ itself, which need no declaration in kvcache's headers.
IGNORED = {"rt", "kvcache", "const", "int32_t", "int64_t", "size_t", "cudaStream_t", "T"}


def without_parentheses(text):
    depth = 0
    kept = []
    for char in text:
        if char in "(<{[":
            depth += 1
        elif char in ")>}]":
            depth = max(depth - 1, 0)
        elif depth == 0:
            kept.append(char)
    return "".join(kept)


def listed_names(reference):
    names = []
    for line in reference.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = line.split("|")[1]
        for span in re.findall(r"`([^`]+)`", first_cell):
            for identifier in IDENTIFIER.findall(without_parentheses(span)):
                if identifier not in IGNORED:
                    names.append((identifier, span))
    return names


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    root = pathlib.Path(argv[1])
    references = [pathlib.Path(path) for path in argv[2:]] or [root / "docs" / "api.md"]
    headers = "\n".join(path.read_text(encoding="utf-8") for path in sorted((root / "include").rglob("*.h")))
    declared = set(IDENTIFIER.findall(headers))
    missing = []
    checked = 0
    for reference in references:
        for identifier, span in listed_names(reference):
            checked += 1
            if identifier not in declared:
                missing.append(f"{reference}: `{span}`: {identifier} is not in any header under include/")
    for line in missing:
        print(line)
    if checked == 0:
        print("no names found in the first column of a table: is the reference's format still '| `name` | ... |'?")
        return 1
    print(f"{checked} names checked, {len(missing)} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
