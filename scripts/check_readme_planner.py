#!/usr/bin/env python3
"""Runs the README's first command's program, kvcache-plan on its default model, and compares its output with the
output the README shows.

    scripts/check_readme_planner.py <README.md> <kvcache-plan>

The README's first ```sh block must run build/planner/examples/plan/kvcache-plan with no arguments, and a ```text
block must show what it prints, line for line (trailing spaces aside). Prints the first difference and exits 1 when
they differ. The figures themselves are checked by hand in the kvcache-plan.default test.
"""
import re
import subprocess
import sys

COMMAND = "./build/planner/examples/plan/kvcache-plan"


def blocks(text, language):
    return re.findall(r"(?ms)^```" + language + r"\n(.*?)^```", text)


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    readme, program = argv[1], argv[2]
    text = open(readme, encoding="utf-8").read()
    commands = blocks(text, "sh")
    if not commands or not commands[0].rstrip().endswith(COMMAND):
        print(f"{readme}: the first sh block does not end with {COMMAND}")
        return 1
    shown = [block for block in blocks(text, "text") if block.startswith("kvcache plan:")]
    if not shown:
        print(f"{readme}: no text block shows kvcache-plan's output (a block starting 'kvcache plan:')")
        return 1
    printed = subprocess.run([program], check=True, capture_output=True, text=True).stdout
    expected = [line.rstrip() for line in shown[0].rstrip("\n").splitlines()]
    actual = [line.rstrip() for line in printed.rstrip("\n").splitlines()]
    for number, (want, got) in enumerate(zip(expected, actual), start=1):
        if want != got:
            print(f"line {number} differs:\n  README:       {want!r}\n  kvcache-plan: {got!r}")
            return 1
    if len(expected) != len(actual):
        print(f"the README shows {len(expected)} lines, kvcache-plan prints {len(actual)}")
        return 1
    print(f"the README's {len(expected)} lines match kvcache-plan's output")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
