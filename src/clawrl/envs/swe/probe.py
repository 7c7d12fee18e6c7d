"""Evaluate test assertions one by one and report what each call gave: the symptoms of a bug.

A standalone program (standard library only), run from a repository's root by the SWE generator
on a mutant: it reads a JSON list of assertions on stdin, each
`{"module": TEST_MODULE, "kind": KIND, "call": EXPR, "expected": EXPR, "places": N}`, evaluates
`call` and `expected` in the test module's namespace (so the names the tests import are there),
and prints a JSON list with, for each: `actual` (the repr of the call's value, or null), `raised`
(`"Type: message"` of what the call raised, or null) and `holds` (whether the assertion passes).

Kinds, after unittest's methods: `equal` (assertEqual), `almost_equal` (assertAlmostEqual with
`places`), `true`, `false` (assertTrue/assertFalse; no `expected`), `raises` (assertRaises: `expected`
names the exception class). An evaluation running past two seconds counts as raising.
"""

import importlib
import json
import os
import signal
import sys


class ProbeTimeout(BaseException):
    """The call ran too long (a mutant can loop for ever)."""


def _interrupt(_signum, _frame):
    raise ProbeTimeout("the call did not return within 2 s")


def evaluate(assertion):
    """What the assertion's call gave, and whether the assertion holds."""
    try:
        namespace = vars(importlib.import_module(assertion["module"]))
    except Exception as error:  # the mutant broke the import itself
        return {"actual": None, "raised": f"{type(error).__name__}: {error}", "holds": False}
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        actual = eval(assertion["call"], dict(namespace))
    except (Exception, ProbeTimeout) as error:
        expected = assertion["kind"] == "raises" and isinstance(error, eval(assertion["expected"], dict(namespace)))
        return {"actual": None, "raised": f"{type(error).__name__}: {error}", "holds": expected}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return {"actual": repr(actual), "raised": None, "holds": _holds(assertion, actual, namespace)}


def _holds(assertion, actual, namespace):
    kind = assertion["kind"]
    if kind == "true":
        return bool(actual)
    if kind == "false":
        return not actual
    if kind == "raises":
        return False
    expected = eval(assertion["expected"], dict(namespace))
    if kind == "almost_equal":
        try:
            return round(abs(actual - expected), assertion.get("places", 7)) == 0
        except TypeError:
            return False
    return actual == expected


def main():
    sys.path.insert(0, os.getcwd())
    signal.signal(signal.SIGALRM, _interrupt)
    print(json.dumps([evaluate(assertion) for assertion in json.load(sys.stdin)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
