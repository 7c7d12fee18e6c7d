"""Run unittest tests by id and write each one's status: the SWE family's test harness.

A standalone program (standard library only), run from a repository's root:

    python3 -B runner.py RESULTS [--timeout-s SECONDS] [--ids-file FILE]

It runs the tests named one per line in FILE (every test under the repository's root when no file
is given) and appends one JSON line per test to RESULTS as soon as the test ends:
`{"test": ID, "status": "passed" | "failed" | "error" | "skipped"}`. Ids are unittest names
(`tests.test_words.SlugifyTest.test_simple`); pytest-style ids of unittest tests
(`tests/test_words.py::SlugifyTest::test_simple`) are read as the same name. A test running longer
than the timeout is interrupted and counts as an error, so one hanging test does not hide the
others' results.

The generator runs it on the host to find which tests a mutant breaks, and the judge runs it inside
the sandbox on the patched copy: one harness decides both, so an instance's FAIL_TO_PASS means the
same thing at generation and at judgement. Results go to a file rather than stdout because the code
under test prints what it likes.
"""

import argparse
import json
import os
import signal
import sys
import unittest


class TestTimeout(BaseException):
    """Raised in a test that ran past its time; a BaseException so `except Exception` in it cannot swallow it."""


def unittest_name(test_id):
    """`path/to/test_x.py::Class::method` as unittest names it (`path.to.test_x.Class.method`); others unchanged."""
    if "::" not in test_id:
        return test_id
    path, *rest = test_id.split("::")
    module = path[: -len(".py")] if path.endswith(".py") else path
    return ".".join([module.replace("/", "."), *rest])


def discovered_ids(root):
    """Every test id under `root`, sorted."""
    suite = unittest.defaultTestLoader.discover(root, pattern="test*.py", top_level_dir=root)
    return sorted(_flatten(suite))


def _flatten(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _flatten(item)
        else:
            yield item.id()


def status_of(test_id, timeout_s):
    """Run one test and say how it went."""
    try:
        test = unittest.defaultTestLoader.loadTestsFromName(unittest_name(test_id))
    except Exception:  # a name that resolves to something that is not a test
        return "error"
    result = unittest.TestResult()

    def interrupt(_signum, _frame):
        raise TestTimeout(f"the test ran longer than {timeout_s} s")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        test.run(result)
    except TestTimeout:  # raised between tests' parts, outside unittest's own handling
        return "error"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if result.errors:
        return "error"
    if result.failures or result.unexpectedSuccesses:
        return "failed"
    if result.skipped or result.testsRun == 0:
        return "skipped"
    return "passed"


def main(argv):
    parser = argparse.ArgumentParser(description="Run unittest tests by id; one JSON status line per test.")
    parser.add_argument("results", help="file the status lines are appended to")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="longest a single test may run")
    parser.add_argument("--ids-file", help="file of test ids, one per line (default: every test found)")
    args = parser.parse_args(argv)
    root = os.getcwd()
    sys.path.insert(0, root)  # the repository's packages import as they do under `python -m unittest`
    if args.ids_file:
        with open(args.ids_file) as ids:
            test_ids = [line.strip() for line in ids if line.strip()]
    else:
        test_ids = discovered_ids(root)
    with open(args.results, "a") as results:
        for test_id in test_ids:
            results.write(json.dumps({"test": test_id, "status": status_of(test_id, args.timeout_s)}) + "\n")
            results.flush()  # what finished is kept if the whole run is killed
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
