"""Run one unittest module for ctest: exit 0 when it passed, 1 when it
failed, 77 (ctest's SKIP_RETURN_CODE) when every test was skipped, printing
the skip reasons.  Usage: python3 run_suite.py MODULE"""

import sys
import unittest


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    name = sys.argv[1]
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
