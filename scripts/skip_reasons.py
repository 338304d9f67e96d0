#!/usr/bin/env python3
"""Prints why each skipped test of the last ctest run skipped, grouped by reason.

ctest prints "***Skipped" without the reason. The test presets write a JUnit file (ctest-results.xml in the build
folder) that holds every test's output; this reads it and prints one line per distinct reason, with the number of
tests and the first test's name. A GoogleTest skip's reason is the message after its "Skipped" line; a program that
exits with its skip code gives its reason as the last line it prints.

    scripts/skip_reasons.py build/ci          # or the path of the JUnit file itself

Exits 1 when a skipped test gave no reason, 2 when there is no JUnit file (ctest has not run with a preset).
"""
import collections
import pathlib
import sys
import xml.etree.ElementTree as ElementTree

JUNIT_NAME = "ctest-results.xml"


def reason_of(output):
    """The reason a skipped test printed, or '' when it printed none."""
    lines = [line.strip() for line in output.splitlines()]
    for index, line in enumerate(lines):
        # GoogleTest: "<file>:<line>: Skipped", then the message, then "[  SKIPPED ] ...".
        if line.endswith(": Skipped") or line == "Skipped":
            message = []
            for following in lines[index + 1:]:
                if following.startswith("[  SKIPPED ]") or following.startswith("[       OK ]"):
                    break
                if following:
                    message.append(following)
            if message:
                return " ".join(message)
    # pytest -rs: "SKIPPED [1] file.py:12: reason".
    pytest_reasons = [line.split(": ", 1)[1] for line in lines if line.startswith("SKIPPED [") and ": " in line]
    if pytest_reasons:
        return "; ".join(pytest_reasons)
    printed = [line for line in lines if line and not line.startswith("[")]
    return printed[-1] if printed else ""


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path = pathlib.Path(argv[1])
    if path.is_dir():
        path = path / JUNIT_NAME
    if not path.is_file():
        print(f"skip_reasons: {path} not found; run ctest with a test preset first", file=sys.stderr)
        return 2
    by_reason = collections.defaultdict(list)
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        if case.find("skipped") is None:
            continue
        output = case.findtext("system-out") or ""
        by_reason[reason_of(output)].append(case.get("name"))
    skipped = sum(len(names) for names in by_reason.values())
    if skipped == 0:
        print("No test skipped.")
        return 0
    print(f"{skipped} tests skipped, by reason:")
    for reason, names in sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0])):
        example = names[0] + (f" and {len(names) - 1} more" if len(names) > 1 else "")
        print(f"  {len(names):5d}  {reason or '(no reason printed)'}  [{example}]")
    if "" in by_reason:
        print(f"skip_reasons: {len(by_reason[''])} skipped tests printed no reason", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
