#!/usr/bin/env python3
"""Print an ncu --csv report one kernel launch per line, in launch order: ID, kernel name, grid,
block and each metric's value.  The experiments launch each variant a fixed number of times in a
fixed order (their docstrings say which), so the lines group by position.

    python3 tests/bench/experiments/ncu_csv.py report.csv [name-regex]"""
import csv, re, sys

rows = list(csv.reader(open(sys.argv[1])))
start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
hdr = rows[start]
col = {k: hdr.index(k) for k in ("ID", "Kernel Name", "Grid Size", "Block Size", "Metric Name", "Metric Value")}
want = re.compile(sys.argv[2]) if len(sys.argv) > 2 else None
launches = {}
for r in rows[start + 1:]:
    if len(r) < len(hdr):
        continue
    k = launches.setdefault(int(r[col["ID"]]), {"name": r[col["Kernel Name"]], "grid": r[col["Grid Size"]],
                                                "block": r[col["Block Size"]], "m": {}})
    k["m"][r[col["Metric Name"]]] = r[col["Metric Value"]].replace(",", "")
for i, k in sorted(launches.items()):
    if want and not want.search(k["name"]):
        continue
    print(i, k["name"].split("(")[0][:60], k["grid"], k["block"],
          " ".join(f"{m}={v}" for m, v in sorted(k["m"].items())))
