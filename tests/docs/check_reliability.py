#!/usr/bin/env python3
"""tests/RELIABILITY.md's table of the registered tests is ctest's.

The table between the "BEGIN registered tests" and "END registered tests"
markers has one row per test: its labels, whether the normal tree registers
it ("yes"; "CUDA": only in a build with CUDA; "no"), whether the sanitizer
tree does, and its resource lock; the counts under it are worked out from
the rows.  Run against a build folder, this compares the rows with what
`ctest --show-only=json-v1` lists there (the column of that kind of tree,
its labels and locks) and fails on any difference, so the document cannot
drift from the registration.  ctest runs it in each tree (reliability_doc).

    tests/docs/check_reliability.py --build build --sanitizer 0 --cuda 0           # check
    tests/docs/check_reliability.py --build build --sanitizer 0 --cuda 0 --write   # rewrite
(--sanitizer 1 for a -DKVD_SANITIZE=ON tree, --cuda 1 for a build with CUDA:
the ctest registration passes both.)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parents[2]
BEGIN = "<!-- BEGIN registered tests (tests/docs/check_reliability.py) -->"
END = "<!-- END registered tests -->"
HEAD = ["| test | labels | normal tree | sanitizer tree | resource lock |",
        "| --- | --- | --- | --- | --- |"]

Row = Dict[str, str]


def registered(build: Path) -> Dict[str, Row]:
    out = subprocess.run(["ctest", "--test-dir", str(build), "--show-only=json-v1"],
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    tests = {}
    for t in json.loads(out)["tests"]:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        tests[t["name"]] = {"labels": ", ".join(props.get("LABELS", [])),
                            "lock": ", ".join(props.get("RESOURCE_LOCK", []))}
    return tests


def parse(doc: str) -> Tuple[str, Dict[str, Row], str]:
    try:
        head, rest = doc.split(BEGIN + "\n", 1)
        body, tail = rest.split(END, 1)
    except ValueError:
        sys.exit(f"check_reliability: no {BEGIN} ... {END} block in tests/RELIABILITY.md")
    rows = {}
    for line in body.splitlines():
        m = re.match(r"^\| `([^`]+)` \| ([^|]*) \| ([^|]*) \| ([^|]*) \| ([^|]*) \|$", line)
        if m:
            name, labels, normal, san, lock = (x.strip() for x in m.groups())
            rows[name] = {"labels": labels, "normal": normal, "sanitizer": san, "lock": lock}
    return head, rows, tail


def render(rows: Dict[str, Row]) -> str:
    lines = list(HEAD)
    for name, r in rows.items():
        lines.append(f"| `{name}` | {r['labels']} | {r['normal']} | {r['sanitizer']} | "
                     f"{r['lock']} |")
    plain = [n for n, r in rows.items() if r["normal"] == "yes"]
    cuda = [n for n, r in rows.items() if r["normal"] in ("yes", "CUDA")]
    san = [n for n, r in rows.items() if r["sanitizer"] == "yes"]
    gpu = [n for n in plain if "gpu" in rows[n]["labels"].split(", ")]
    lines += ["",
              f"The normal tree registers **{len(plain)} tests** without CUDA (CI; "
              f"{len(gpu)} of them labelled gpu, which skip there) and {len(cuda)} with CUDA; "
              f"the sanitizer tree **{len(san)}**.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="a configured build folder")
    ap.add_argument("--sanitizer", type=int, choices=(0, 1), required=True,
                    help="1: the build is a sanitizer tree (-DKVD_SANITIZE=ON)")
    ap.add_argument("--cuda", type=int, choices=(0, 1), required=True,
                    help="1: the build has CUDA")
    ap.add_argument("--doc", default=str(REPO / "tests" / "RELIABILITY.md"))
    ap.add_argument("--write", action="store_true", help="rewrite the rows from this tree")
    args = ap.parse_args()
    build = Path(args.build).resolve()
    doc = Path(args.doc)
    head, rows, tail = parse(doc.read_text())
    reg = registered(build)
    sanitize, cuda = bool(args.sanitizer), bool(args.cuda)
    col = "sanitizer" if sanitize else "normal"
    here = ("yes", "CUDA") if col == "normal" and cuda else ("yes",)
    if args.write:
        for name, r in reg.items():
            row = rows.setdefault(name, {"labels": "", "normal": "no", "sanitizer": "no",
                                         "lock": ""})
            row["labels"], row["lock"] = r["labels"], r["lock"]
            if row[col] not in here:
                row[col] = "CUDA" if col == "normal" and cuda else "yes"
        for name, row in rows.items():
            if name not in reg and row[col] in here:
                row[col] = "no"
        rows = {n: r for n, r in sorted(rows.items(), key=lambda kv: kv[0])
                if r["normal"] != "no" or r["sanitizer"] != "no"}
        doc.write_text(head + BEGIN + "\n" + render(rows) + END + tail)
        print(f"check_reliability: {len(rows)} rows written from {build}")
        return 0
    errors: List[str] = []
    want = {n for n, r in rows.items() if r[col] in here}
    for n in sorted(set(reg) - want):
        errors.append(f"{n} is registered in {build} but tests/RELIABILITY.md does not list it "
                      f"for this tree ({col}{' with CUDA' if cuda else ''})")
    for n in sorted(want - set(reg)):
        errors.append(f"tests/RELIABILITY.md lists {n} for this tree ({col}), but {build} does "
                      "not register it")
    for n in sorted(set(reg) & want):
        for key in ("labels", "lock"):
            if rows[n][key] != reg[n][key]:
                errors.append(f"{n}: {key} {reg[n][key]!r} in ctest, {rows[n][key]!r} in "
                              "tests/RELIABILITY.md")
    if body_counts(doc.read_text()) != render(rows):
        errors.append("the counts under the table are not the rows' (run with --write)")
    for e in errors:
        print(f"check_reliability: {e}")
    if errors:
        print("check_reliability: update the table: tests/docs/check_reliability.py --build "
              f"{args.build} --sanitizer {args.sanitizer} --cuda {args.cuda} --write "
              "(in each kind of tree)")
        return 1
    print(f"check_reliability: {len(reg)} tests of {build} ({col} tree"
          f"{', CUDA' if cuda else ''}) match tests/RELIABILITY.md")
    return 0


def body_counts(doc: str) -> str:
    return doc.split(BEGIN + "\n", 1)[1].split(END, 1)[0]


if __name__ == "__main__":
    sys.exit(main())
