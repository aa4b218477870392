#!/usr/bin/env python3
"""The closing account of deploy/test.sh over its ctest runs.

Usage: ctest_summary.py [--totals FILE] [--prefix TEXT] TREE=JUNIT_XML...

Each JUNIT_XML is what `ctest --output-junit` wrote for the tree TREE (run
with --test-output-size-passed large enough to keep whole outputs).  Prints
per tree the tests passed, failed and skipped; every skipped test with its
reason (its "SKIP: reason" line, tests/CMakeLists.txt); every case that a
passing test skipped ("SKIP: case: reason" lines); and the failed tests.
A skipped test that printed no "SKIP:" line counts as failed: a skip must
say why.  A missing or unreadable file counts as one failure.  --totals
writes "passed failed skipped" over all trees to FILE."""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from typing import List, Tuple

SKIP_LINE = re.compile(r"^SKIP: (.*)$", re.M)


def tree_account(tree: str, path: str) -> Tuple[int, int, int, List[str]]:
    lines: List[str] = []
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        return 0, 1, 0, [f"{tree}: no ctest results ({path}: {e})"]
    passed = failed = skipped = 0
    skips, cases, fails = [], [], []
    for tc in root.iter("testcase"):
        name = tc.get("name", "?")
        out = tc.findtext("system-out") or ""
        reasons = SKIP_LINE.findall(out)
        status = tc.get("status")
        if status == "run":
            passed += 1
            cases += [f"{name}: {r}" for r in reasons]
        elif status == "notrun" and tc.find("skipped") is not None:
            if reasons:
                skipped += 1
                skips.append(f"{name}: {reasons[0]}")
            else:
                failed += 1
                fails.append(f"{name} (skipped without a \"SKIP: reason\" line)")
        else:
            failed += 1
            fails.append(name)
    lines.append(f"{tree}: {passed} passed, {failed} failed, {skipped} skipped")
    lines += [f"{tree}: skipped: {s}" for s in skips]
    lines += [f"{tree}: case skipped in a passing test: {c}" for c in cases]
    lines += [f"{tree}: failed: {f}" for f in fails]
    return passed, failed, skipped, lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--totals", help="write 'passed failed skipped' here")
    ap.add_argument("--prefix", default="test.sh: ", help="the start of each line printed")
    ap.add_argument("trees", nargs="+", metavar="TREE=JUNIT_XML")
    args = ap.parse_args()
    tp = tf = ts = 0
    for spec in args.trees:
        tree, sep, path = spec.partition("=")
        if not sep:
            ap.error(f"{spec!r} is not TREE=JUNIT_XML")
        p, f, s, lines = tree_account(tree, path)
        tp, tf, ts = tp + p, tf + f, ts + s
        for line in lines:
            print(f"test.sh: {line}")
    if args.totals:
        with open(args.totals, "w") as out:
            out.write(f"{tp} {tf} {ts}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
