#!/usr/bin/env python3
"""The README's shown output is what one gets.

Every ```console block of README.md is a session: lines starting with "$ "
are commands, the lines after each its output.  This runs each block's
commands, in order, in a shell beside a fresh kvdockd (cpu backend,
--host-memory-budget 2G, $KVDOCK_SOCKET pointing at it), with ./build/
standing for the build folder, and compares what they print (stdout and
stderr together) with what the README shows.  Numbers that differ from run
to run (times, pids, the socket's path, the machine's memory, byte counts
of replies that carry the path) are compared by shape only; everything
else (words, columns, flags, ids, counts, sizes) must match.

    tests/docs/check_readme.py --build build            # check (CI)
    tests/docs/check_readme.py --build build --write    # rewrite the blocks from a run

A block is skipped when its first line is a comment saying so
("# not run by tests/docs/check_readme.py").

A ```python block whose first line is a file name ("# worker.py") is that
file: the commands run in a folder holding every such file, with the
Python package of this tree on PYTHONPATH and this build's libkvdock, and
a command's leading "python3" is a Python that imports numpy (/usr/bin/python3
first, as tests/python picks it).  Without one, blocks that run python3 are
not checked, and the summary says so.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP_MARK = "# not run by tests/docs/check_readme.py"
README_SOCKET = "/tmp/kvdock-0/kvdockd.sock"  # what the README shows for the default

# Volatile values, in order: each (pattern, replacement) applies to both
# the README's text and the run's before they are compared.
VOLATILE = [
    (re.compile(r"\(pid \d+\)"), "(pid N)"),
    (re.compile(r"\bpid \d+\b"), "pid N"),
    (re.compile(r"time=[\d.]+ us"), "time=T us"),
    (re.compile(r"= [\d.]+(/[\d.]+)+ us"), "= T us"),
    (re.compile(r"\buptime\s+\S+ \S+"), "uptime T"),
    (re.compile(r"the machine: [^)]*"), "the machine: M"),
    (re.compile(r"socket in \S+ \S+\s+out \S+ \S+"), "socket in X out X"),
    (re.compile(r"(kvdock-cli)\s+\d+"), r"\1 PID"),
    (re.compile(r"<=\d+"), "<=N"),
]


def normalize(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        for pat, rep in VOLATILE:
            line = pat.sub(rep, line)
        out.append(" ".join(line.split()))
    while out and not out[-1]:
        out.pop()
    return out


def blocks(readme: str):
    """(start, end, lines) of every console block: the lines inside."""
    lines = readme.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```console":
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            yield i + 1, j, lines[i + 1:j]
            i = j
        i += 1


def named_files(readme: str) -> dict[str, str]:
    """{name: text} of every ```python block whose first line is "# NAME.py"."""
    out = {}
    for m in re.finditer(r"^```python\n# ([\w.-]+\.py)\n(.*?)^```$", readme, re.S | re.M):
        out[m.group(1)] = f"# {m.group(1)}\n{m.group(2)}"
    return out


def numpy_python() -> str | None:
    """A Python 3 that imports numpy, or None."""
    for cand in ("/usr/bin/python3", sys.executable, shutil.which("python3")):
        if cand and os.path.exists(cand) and subprocess.run(
                [cand, "-c", "import numpy"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL).returncode == 0:
            return cand
    return None


def sessions(block_lines):
    """[(command, [expected lines])] of a block."""
    out = []
    for line in block_lines:
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
    return out


class Daemon:
    def __init__(self, build: Path) -> None:
        self.dir = tempfile.mkdtemp(prefix="kvdock-readme-")
        self.socket = os.path.join(self.dir, "kvdockd.sock")
        self.log = open(os.path.join(self.dir, "kvdockd.log"), "wb")
        self.proc = subprocess.Popen(
            [str(build / "daemon" / "kvdockd"), "--backend", "cpu", "--socket", self.socket,
             "--host-memory-budget", "2G"], stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(500):
            if os.path.exists(self.socket):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        raise SystemExit(f"check_readme: kvdockd did not start (see {self.log.name})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_block(build: Path, cmds, files: dict[str, str], python: str | None):
    """Each command's output, run in order beside a fresh daemon, in a
    folder holding the README's named files."""
    d = Daemon(build)
    work = tempfile.mkdtemp(prefix="kvdock-readme-work-")
    for name, text in files.items():
        Path(work, name).write_text(text)
    env = dict(os.environ, KVDOCK_SOCKET=d.socket,
               KVDOCK_LIB=str(build / "client" / "libkvdock.so"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "client" / "python"),
                                                        os.environ.get("PYTHONPATH")])))
    outs = []
    try:
        for cmd, _ in cmds:
            shell = cmd.replace("./build/", f"{build}/")
            if python and shell.startswith("python3 "):
                shell = python + shell[len("python3"):]
            p = subprocess.run(["bash", "-c", shell], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, env=env, timeout=60, cwd=work)
            outs.append(p.stdout.decode("utf-8", "replace").replace(d.socket, README_SOCKET))
    finally:
        d.stop()
        shutil.rmtree(work, ignore_errors=True)
    return outs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(REPO / "build"), help="the build folder")
    ap.add_argument("--readme", default=str(REPO / "README.md"))
    ap.add_argument("--write", action="store_true", help="rewrite the blocks from a run")
    args = ap.parse_args()
    build = Path(args.build).resolve()
    if not (build / "daemon" / "kvdockd").exists():
        print(f"SKIP: no kvdockd in {build}")
        return 77
    if os.geteuid() != 0 and not args.write:
        # the README shows a root session (uid 0 in owners and paths)
        print("SKIP: the README's session is root's (uid 0); run as root to check it")
        return 77
    path = Path(args.readme)
    text = path.read_text()
    lines = text.split("\n")
    failures, checked, unchecked = [], 0, 0
    files, python = named_files(text), numpy_python()
    # from the last block up, so that rewriting keeps earlier line numbers
    for start, end, body in reversed(list(blocks(text))):
        if body and body[0].strip() == SKIP_MARK:
            continue
        cmds = sessions(body)
        if python is None and any(c.startswith("python3 ") for c, _ in cmds):
            unchecked += len(cmds)
            continue
        outs = run_block(build, cmds, files, python)
        if args.write:
            new = []
            for (cmd, _), out in zip(cmds, outs):
                new.append("$ " + cmd)
                new.extend(out.rstrip("\n").split("\n") if out.strip() else [])
            lines[start:end] = new
            continue
        if len(outs) != len(cmds):
            failures.append(f"README.md line {start + 1}: {len(cmds)} commands, "
                            f"{len(outs)} outputs: the block did not run through")
        for (cmd, want), got in zip(cmds, outs):
            checked += 1
            w, g = normalize("\n".join(want)), normalize(got)
            if w != g:
                failures.append(f"README.md line {start + 1}: `{cmd}`\n--- the README shows\n"
                                + "\n".join(want) + "\n--- a run prints\n" + got.rstrip("\n"))
    if args.write:
        path.write_text("\n".join(lines))
        print(f"check_readme: rewrote the console blocks of {path}")
        return 0
    for f in failures:
        print(f, end="\n\n")
    if unchecked:
        print(f"check_readme: no python3 imports numpy: {unchecked} commands of blocks "
              "that run python3 not checked")
    print(f"check_readme: {checked} commands, {len(failures)} differ")
    if checked == 0:
        print("check_readme: no command was checked (no console block run): nothing shown "
              "was compared")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
