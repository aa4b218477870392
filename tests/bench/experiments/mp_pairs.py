#!/usr/bin/env python3
"""Pairs module_path.py's graph copies (EXP_MP_GRAPH=1, EXP_MP_DUP=n) with the seed's: for each case
and way, the mean over copies k of (way#k's lower mode - seed#k's), its standard error, the same for
the medians, and how many copies are ahead.  module_path.py prints each copy's lowest / lower-mode /
median line but, unlike graph_pace.py, not these pairs (round 17):

    python3 tests/bench/experiments/mp_pairs.py tests/bench/results/2026-12-03-h200-round17-call3-mp.log"""
import re, statistics as S, sys

LINE = re.compile(r"(gather bs=\d+)\s+(\S+)#(\d+)\s+[\d.]+ /\s+([\d.]+) /\s+([\d.]+)\s")
by = {}  # case: way: k: (lower mode, median)
for line in open(sys.argv[1]):
    m = LINE.match(line)
    if m:
        by.setdefault(m.group(1), {}).setdefault(m.group(2), {})[int(m.group(3))] = (float(m.group(4)),
                                                                                     float(m.group(5)))
print("case         way          lower-mode us  less the seed's (SE)   median less the seed's   copies ahead")
for case, ways in by.items():
    seed = ways["seed"]
    for way, ks in ways.items():
        low = [ks[k][0] - seed[k][0] for k in ks]
        med = [ks[k][1] - seed[k][1] for k in ks]
        se = S.stdev(low) / len(low) ** 0.5 if len(low) > 1 else 0.0
        print(f"{case:12s} {way:12s} {S.mean(v[0] for v in ks.values()):7.3f}        {S.mean(low):+.3f} ({se:.3f})"
              f"          {S.mean(med):+.3f}                  {sum(x < 0 for x in low)}/{len(low)}")
