#!/usr/bin/env python3
"""The README's "Without systemd" block works as written.

README.md's ```sh block after "**Without systemd**" is run as a user of a
plain shell would run it: its kvdockd command in the background, then its
readiness loop, which must end within 10 s.  What changes is only where
things are (its socket and cache dir move under a fresh folder of
/var/tmp, the machine's disk, and clients get $KVDOCK_SOCKET, as the README
says to "elsewhere"), the budgets (--host-memory-budget 256M,
--disk-budget 64M: small, for a shared machine) and that kvdockd and
kvdock are this build's.  Then what the README says of it: a cache with
a disk level is made; SIGTERM drains and the daemon exits 0; the same
command again serves the cache (`kvdock cache ls`); SIGINT (Ctrl-C) ends
it with 0 too.

    tests/docs/check_readme_foreground.py --build build
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def block(readme: str) -> list[str]:
    """The commands of the block after "**Without systemd**": continuation
    lines joined, comments dropped."""
    at = readme.find("**Without systemd**")
    m = re.search(r"^```sh\n(.*?)^```$", readme[at:], re.S | re.M) if at >= 0 else None
    if m is None:
        raise SystemExit("check_readme_foreground: README.md has no ```sh block after "
                         "**Without systemd**")
    text = m.group(1).replace("\\\n", " ")
    cmds = []
    for line in text.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line:
            cmds.append(" ".join(line.split()))
    return cmds


def moved(cmd: str, tmp: str) -> list[str]:
    """The kvdockd command with its paths under tmp and small budgets;
    every option the README names must be there."""
    argv = shlex.split(cmd)
    if argv[0] != "kvdockd":
        raise SystemExit(f"check_readme_foreground: the block starts with {argv[0]!r}, not kvdockd")
    want = {"--socket": os.path.join(tmp, "run", "kvdockd.sock"),
            "--host-memory-budget": "256M",
            "--cache-dir": os.path.join(tmp, "cache"),
            "--disk-budget": "64M"}
    seen = set()
    for i, a in enumerate(argv):
        if a in want and i + 1 < len(argv):
            argv[i + 1] = want[a]
            seen.add(a)
    missing = sorted(set(want) - seen)
    if missing:
        raise SystemExit(f"check_readme_foreground: the README's kvdockd command lacks {missing}")
    return argv[1:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(REPO / "build"), help="the build folder")
    ap.add_argument("--readme", default=str(REPO / "README.md"))
    args = ap.parse_args()
    build = Path(args.build).resolve()
    kvdockd, kvdock = build / "daemon" / "kvdockd", build / "client" / "kvdock"
    if not kvdockd.exists() or not kvdock.exists():
        print(f"SKIP: no kvdockd or kvdock in {build}")
        return 77
    cmds = block(Path(args.readme).read_text())
    if len(cmds) != 2 or not cmds[1].startswith("until kvdock ping"):
        raise SystemExit(f"check_readme_foreground: expected kvdockd and a readiness loop, "
                         f"got {cmds}")
    tmp = tempfile.mkdtemp(prefix="kvd-readme-fg-", dir="/var/tmp")
    env = dict(os.environ, KVDOCK_SOCKET=os.path.join(tmp, "run", "kvdockd.sock"),
               PATH=f"{build / 'client'}:{os.environ.get('PATH', '')}")
    daemon_argv = [str(kvdockd)] + moved(cmds[0], tmp)
    log = open(os.path.join(tmp, "kvdockd.log"), "ab")
    failures: list[str] = []

    def start() -> subprocess.Popen[bytes]:
        d = subprocess.Popen(daemon_argv, stdout=log, stderr=log, env=env)
        try:
            r = subprocess.run(["bash", "-c", cmds[1]], env=env, timeout=10)
            if r.returncode != 0:
                failures.append(f"the readiness loop exited {r.returncode}")
        except subprocess.TimeoutExpired:
            failures.append("the readiness loop did not end within 10 s")
        return d

    def cli(*a: str) -> str:
        r = subprocess.run([str(kvdock), *a], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=20)
        if r.returncode != 0:
            failures.append(f"kvdock {' '.join(a)}: exit {r.returncode}: {r.stdout.decode()}")
        return r.stdout.decode()

    def stop(d: subprocess.Popen[bytes], sig: int, name: str) -> None:
        d.send_signal(sig)
        try:
            rc = d.wait(30)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait()
            rc = None
        if rc != 0:
            failures.append(f"{name}: kvdockd exited {rc}, not 0")

    d = None
    try:
        d = start()
        cli("cache", "create", "fg", "--layers", "2", "--tokens-per-block", "4",
            "--token-bytes", "64", "--budget", "1M", "--disk-budget", "8M")
        stop(d, signal.SIGTERM, "SIGTERM")
        d = start()
        out = cli("cache", "ls")
        if not re.search(r"^\d+\s+fg\s", out, re.M):
            failures.append(f"the cache is not back after the restart:\n{out}")
        stop(d, signal.SIGINT, "SIGINT")
        d = None
        text = Path(log.name).read_text()
        for want in ("event=shutdown_begin reason=\"SIGTERM\"",
                     "event=shutdown_begin reason=\"SIGINT\"", "event=cache_reopened"):
            if want not in text:
                failures.append(f"the log has no {want}")
    finally:
        if d is not None and d.poll() is None:
            d.kill()
            d.wait()
        log.close()
        if failures:
            print(Path(log.name).read_text(), file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print(f"check_readme_foreground: {f}")
    print(f"check_readme_foreground: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
