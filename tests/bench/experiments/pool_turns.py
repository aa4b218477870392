#!/usr/bin/env python3
"""Pool the turns of several bench_kernels.py runs (their kvdock_vs_seed.json) per case:
median and lowest turn of the seed and of kvdock over every turn of every run.  One
do_bench call's median of a small case lands in one of two modes about 0.6 us apart, so
a gap is read from the pooled median and from the lowest turns, not from one run.

    python3 tests/bench/experiments/pool_turns.py RUN.json [RUN.json ...]

(Round 7's small-case table: the four -round7-small-*.json files in tests/bench/results.)"""
import json, statistics, sys

pooled = {}
for path in sys.argv[1:]:
    for r in json.load(open(path))["rows"]:
        if r.get("seed_us_all") and r.get("kvdock_us_all"):
            p = pooled.setdefault((r["op"], r["case"]), ([], []))
            p[0].extend(r["seed_us_all"])
            p[1].extend(r["kvdock_us_all"])

print("| op | case | turns | seed median | kvdock median | seed min | kvdock min | kvdock - seed (medians) |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for (op, case), (s, k) in pooled.items():
    ms, mk = statistics.median(s), statistics.median(k)
    print(f"| {op} | {case} | {len(s)} | {ms:.2f} | {mk:.2f} | {min(s):.2f} | {min(k):.2f} | {mk - ms:+.2f} |")
