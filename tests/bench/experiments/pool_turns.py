#!/usr/bin/env python3
"""Pool the turns of several runs per case.  One do_bench call's median of a small case
lands in one of two modes about 0.6 us apart, so a gap is read from the pooled median and
from the lowest turns, not from one run.

bench_kernels.py runs (their kvdock_vs_seed.json): median and lowest turn of the seed and of
kvdock over every turn of every run.

    python3 tests/bench/experiments/pool_turns.py RUN.json [RUN.json ...]

launch_path.py runs (its EXP_JSON: every turn of every variant), each with its variants
renamed to the build they were (variants not named keep their names), e.g.

    python3 tests/bench/experiments/pool_turns.py --lp A.json:lib=7428cdf,lib2=interim \\
        B.json:lib=interim,lib2=final

(Round 7's small-case table: the four -round7-small-*.json files in tests/bench/results;
round 8's: its three -round8-lp*.json files, as its results file gives.)"""
import json, statistics, sys


def bench(paths):
    pooled = {}
    for path in paths:
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


def launch_path(args):
    pooled = {}
    for arg in args:
        path, _, names = arg.partition(":")
        rename = dict(kv.split("=") for kv in names.split(",") if kv)
        for case, variants in json.load(open(path)).items():
            for name, turns in variants.items():
                pooled.setdefault(case, {}).setdefault(rename.get(name, name), []).extend(turns)
    print("| case | variant | turns | median | min | turns within 0.1 us of the min |")
    print("|---|---|---:|---:|---:|---:|")
    for case, variants in pooled.items():
        for name, xs in variants.items():
            lo = min(xs)
            print(f"| {case} | {name} | {len(xs)} | {statistics.median(xs):.2f} | {lo:.2f} | "
                  f"{sum(x <= lo + 0.1 for x in xs)} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--lp"]:
        launch_path(sys.argv[2:])
    else:
        bench(sys.argv[1:])
