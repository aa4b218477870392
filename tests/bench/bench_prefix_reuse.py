#!/usr/bin/env python3
"""A prefix-reuse workload through kvdockd: host memory only against host
memory plus the disk level (issue 42).

    tests/bench/bench_prefix_reuse.py --build BUILD --dir DIR [--json]
        [--prefixes N] [--prefix-blocks N] [--suffix-blocks N] [--zipf S]
        [--requests N] [--host-budget SIZE] [--conditions host,disk]

Each request is a prompt of a shared prefix, picked among --prefixes
(1,280) with Zipf's law of exponent --zipf (0.9), of --prefix-blocks
blocks (16), then --suffix-blocks (2) blocks of its own.  A request looks
its chain up with a lease, loads the leading blocks found into a worker's
pages, and saves the whole chain afterwards (what it would compute): the
blocks already cached are skipped.  The prefixes add up to 10 times the
host budget (--host-budget, 64 MiB of 32 KiB blocks by default: 20,480
prefix blocks).  The same requests (one seed) run against two daemons
started here, one after the other: `host`, the cache in host memory only,
and `disk`, the same host budget with a disk level (--cache-dir in DIR,
a disk budget twice the working set).  Figures per condition:
  hit_rate    blocks found of blocks asked for, after a warm-up of as many
              requests as the run
  ttfl_us     time to first load: from the lookup until the load of the
              blocks found has landed (p50, p99, mean): the cache's part of
              the time to first token, against recomputing what it missed
  disk_hits   of the blocks found, those that were on disk only
A condition that the daemon refuses (a build whose cache tier has no disk
level: ENOTSUP) is reported as not run, and the script exits 3.  DIR must
be on the drive measured (not tmpfs); what the run writes there is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]


def parse_size(s: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    s = s.strip().lower().rstrip("b").rstrip("i")
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(s)


def start_daemon(build: str, tmp: str, extra: List[str]) -> subprocess.Popen:
    sock = os.path.join(tmp, "kvdockd.sock")
    log = open(os.path.join(tmp, "kvdockd.log"), "w")
    p = subprocess.Popen([str(Path(build) / "daemon" / "kvdockd"), "--backend", "cpu",
                          "--socket", sock, "--log-level", "warn",
                          "--host-memory-budget", "1G"] + extra,
                         stdout=log, stderr=subprocess.STDOUT)
    for _ in range(400):
        if os.path.exists(sock):
            return p
        if p.poll() is not None:
            raise SystemExit(f"kvdockd exited: {p.returncode}: {open(log.name).read()}")
        time.sleep(0.025)
    p.kill()
    raise SystemExit("kvdockd did not start")


def zipf_picker(n: int, s: float, rng: random.Random):
    weights = [1.0 / (k + 1) ** s for k in range(n)]
    order = list(range(n))
    rng.shuffle(order)  # popularity unrelated to the prefix's number
    cum, acc = [], 0.0
    for w in weights:
        acc += w
        cum.append(acc)

    def pick() -> int:
        import bisect
        return order[bisect.bisect_left(cum, rng.random() * acc)]
    return pick


def pct(v: List[float], q: float) -> float:
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else 0.0


def run_condition(kvdock: Any, sock: str, a: argparse.Namespace, disk_budget: int
                  ) -> Dict[str, Any]:
    L, T, ROW = a.layers, a.tokens_per_block, a.token_bytes
    block = 2 * L * T * ROW
    per_req = a.prefix_blocks + a.suffix_blocks
    rng = random.Random(a.seed)
    pick = zipf_picker(a.prefixes, a.zipf, rng)
    with kvdock.Client(sock, name="bench-prefix-reuse", timeout=120) as cli:
        pool = cli.create_pool("prefix-reuse", num_layers=L, num_slots=per_req * T,
                               slot_bytes=ROW, page_size=T)
        cache = cli.create_cache("prefix-reuse", num_layers=L, tokens_per_block=T,
                                 token_bytes=ROW, budget_bytes=a.host_budget,
                                 disk_budget=disk_budget)
        pages = list(range(per_req))
        asked = hit = disk_hits = 0
        ttfl: List[float] = []
        for i in range(2 * a.requests):  # the first half warms the cache
            p = pick()
            toks = [p * 1_000_003 + t for t in range(a.prefix_blocks * T)]
            toks += [(i + 1) * 7_000_001 + t for t in range(a.suffix_blocks * T)]
            keys = kvdock.block_hashes(toks, T, b"bench")
            t0 = time.perf_counter()
            got = cache.lookup(keys, lease=True)
            if got.lease:
                cache.load(pool, lease=got.lease, blocks=pages[:got.local_hits])
            t1 = time.perf_counter()
            cache.save(pool, keys, blocks=pages)
            if i >= a.requests:
                asked += len(keys)
                hit += got.hits
                disk_hits += got.disk_hits
                ttfl.append((t1 - t0) * 1e6)
        st = cache.stats()
        cache.drop()
        pool.drop()
    return {"block_bytes": block, "requests": a.requests, "blocks_asked": asked,
            "blocks_hit": hit, "hit_rate": hit / asked if asked else 0.0,
            "disk_hits": disk_hits, "ttfl_us_p50": pct(ttfl, 0.5),
            "ttfl_us_p99": pct(ttfl, 0.99), "ttfl_us_mean": sum(ttfl) / len(ttfl),
            "host_blocks": st.blocks, "evictions": st.evictions,
            "disk_blocks": st.disk.blocks if st.disk else None,
            "disk_spills": st.disk.spills if st.disk else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--dir", required=True, help="a directory on the drive measured")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--prefixes", type=int, default=1280)
    ap.add_argument("--prefix-blocks", type=int, default=16)
    ap.add_argument("--suffix-blocks", type=int, default=2)
    ap.add_argument("--zipf", type=float, default=0.9)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--host-budget", type=parse_size, default=64 << 20)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens-per-block", type=int, default=16)
    ap.add_argument("--token-bytes", type=int, default=256)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--conditions", default="host,disk")
    a = ap.parse_args()
    os.environ["KVDOCK_LIB"] = str(Path(a.build) / "client" / "libkvdock.so")
    sys.path.insert(0, str(REPO / "client" / "python"))
    import kvdock

    block = 2 * a.layers * a.tokens_per_block * a.token_bytes
    working = a.prefixes * a.prefix_blocks * block
    out: Dict[str, Any] = {"working_set_bytes": working, "host_budget_bytes": a.host_budget,
                           "working_set_over_host": working / a.host_budget,
                           "zipf": a.zipf, "prefixes": a.prefixes}
    rc = 0
    for cond in a.conditions.split(","):
        tmp = tempfile.mkdtemp(prefix="kvd-prefix-reuse-", dir=a.dir)
        os.chmod(tmp, 0o700)
        extra: List[str] = []
        disk_budget = 0
        if cond == "disk":
            disk_budget = 2 * working
            extra = ["--cache-dir", os.path.join(tmp, "cache"),
                     "--disk-budget", str(disk_budget + (64 << 20))]
        elif cond != "host":
            raise SystemExit(f"bench_prefix_reuse: unknown condition {cond!r} (host, disk)")
        d = start_daemon(a.build, tmp, extra)
        try:
            out[cond] = run_condition(kvdock, os.path.join(tmp, "kvdockd.sock"), a, disk_budget)
        except kvdock.Error as e:
            out[cond] = {"not_run": f"{e.name}: {e.message}"}
            rc = 3
        finally:
            d.terminate()
            d.wait(30)
            shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        print(json.dumps(out))
        return rc
    print(f"prefix reuse: {a.prefixes} prefixes of {a.prefix_blocks} blocks of {block} B, "
          f"Zipf {a.zipf}, {a.suffix_blocks} blocks of each request's own; working set "
          f"{working / 2**20:.0f} MiB = {working / a.host_budget:.1f} x the host budget")
    for cond in a.conditions.split(","):
        r = out[cond]
        if "not_run" in r:
            print(f"  {cond:5} not run: {r['not_run']}")
            continue
        print(f"  {cond:5} hit rate {100 * r['hit_rate']:5.1f}%  time to first load p50 "
              f"{r['ttfl_us_p50']:7.0f} us  p99 {r['ttfl_us_p99']:7.0f} us  mean "
              f"{r['ttfl_us_mean']:7.0f} us  ({r['disk_hits']} of {r['blocks_hit']} hit "
              f"blocks on disk only)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
