#!/usr/bin/env python3
"""deploy/'s scripts install what each step needs: deploy/build.sh (the
README's first command) the build's packages only; deploy/test.sh (and
.ci/run, which runs it) those and every package the tests use."""

import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SETUP = os.path.join(ROOT, "deploy", "setup.sh")

# Packages that only the tests use: none may come with the build.
TEST_ONLY = ["valgrind", "clang", "libclang-rt-dev", "mypy", "python3-torch", "python3-numpy",
             "python3-pip", "python3-venv", "ucx-utils", "fio"]
# What building needs (CMake refuses to configure without them).
BUILD = ["build-essential", "cmake", "pkg-config", "libuv1-dev", "libprotobuf-c-dev",
         "protobuf-c-compiler", "libucx-dev", "libnuma-dev", "liburing-dev", "check",
         "libsubunit-dev"]


def packages(*args: str) -> list:
    out = subprocess.run(["bash", SETUP, "--list", *args], check=True, capture_output=True,
                         text=True).stdout
    return out.split()


def script(name: str) -> str:
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def main() -> int:
    errors = []
    build, tests = packages(), packages("--tests")
    for p in TEST_ONLY:
        if p in build:
            errors.append(f"setup.sh installs {p} for the build; only the tests use it")
        if p not in tests:
            errors.append(f"setup.sh --tests does not install {p}")
    for p in BUILD:
        if p not in build:
            errors.append(f"setup.sh does not install {p}, which the build needs")
    calls = lambda text: re.findall(r"^\s*\./deploy/setup\.sh(.*)$", text, re.M)
    if [c.strip() for c in calls(script("deploy/build.sh"))] != [""]:
        errors.append("deploy/build.sh must run ./deploy/setup.sh without --tests")
    if "--tests" not in [c.strip() for c in calls(script("deploy/test.sh"))]:
        errors.append("deploy/test.sh must run ./deploy/setup.sh --tests")
    if "deploy/test.sh" not in script(".ci/run"):
        errors.append(".ci/run must run deploy/test.sh")
    r = subprocess.run(["bash", SETUP, "--bogus"], capture_output=True, text=True)
    if r.returncode != 2 or "unknown argument" not in r.stderr:
        errors.append("setup.sh --bogus must be a usage error (exit 2)")
    for e in errors:
        print("check_deploy:", e)
    print(f"check_deploy: {len(build)} build packages, {len(tests)} with the tests"
          if not errors else f"check_deploy: {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
