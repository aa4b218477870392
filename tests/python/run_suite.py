"""Run one unittest module for ctest: exit 0 when it passed, 1 when it
failed, 77 (ctest's SKIP_RETURN_CODE) when every test was skipped, printing
the skip reasons.

Usage: python3 run_suite.py [--block MOD[,MOD...]] MODULE

--block makes `import MOD` fail (ImportError) before anything is imported,
as on a machine where MOD is not installed: test_no_numpy.py runs suites
with --block numpy, the GPU machine's PyTorch without numpy.

$KVDOCK_TEST_PYTHON names another interpreter to run the suite with (the
build chose one at configure time; a GPU machine's PyTorch may live in
another): run_suite re-runs itself there."""

import os
import shutil
import sys
import unittest


def _reexec_if_asked() -> None:
    want = os.environ.get("KVDOCK_TEST_PYTHON", "")
    if not want or os.environ.get("_KVDOCK_TEST_REEXEC"):
        return
    want = shutil.which(want) or want  # a bare name is looked up in PATH
    # abspath, not realpath: a venv's python is a link to the base
    # interpreter, and only started by the venv's path is it the venv's
    if os.path.abspath(want) == os.path.abspath(sys.executable):
        return
    os.environ["_KVDOCK_TEST_REEXEC"] = "1"
    print(f"run_suite: running under {want} ($KVDOCK_TEST_PYTHON)", flush=True)
    os.execv(want, [want] + sys.argv)


def main() -> int:
    _reexec_if_asked()
    args = sys.argv[1:]
    blocked = []
    if len(args) == 3 and args[0] == "--block":
        blocked = [m for m in args[1].split(",") if m]
        args = args[2:]
    if len(args) != 1:
        print(__doc__)
        return 2
    for mod in blocked:
        # None in sys.modules: `import mod` (and of its submodules) raises
        # ModuleNotFoundError, for Python code and C extensions alike.
        sys.modules[mod] = None  # type: ignore[assignment]
    if blocked:
        print(f"run_suite: blocked imports: {', '.join(blocked)}")
    name = args[0]
    suite = unittest.defaultTestLoader.loadTestsFromName(name)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    skipped = len(result.skipped)
    failed = len(result.failures) + len(result.errors)
    # A module-level skip counts as a skip without a test run.
    passed = max(0, result.testsRun - failed - skipped - len(result.expectedFailures))
    for test, reason in result.skipped:
        print(f"SKIP: {test}: {reason}")
    print(f"{name}: {passed} passed, {failed} failed, {skipped} skipped")
    if failed or not result.wasSuccessful():
        return 1
    if passed == 0:
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
