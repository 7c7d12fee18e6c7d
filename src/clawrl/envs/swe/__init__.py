"""The SWE family (DESIGN §9): fix an issue in a local Python repository; resolved when the hidden
tests pass on a fresh copy.

env.py is the environment. instances.py reads instances in SWE-bench's schema and checks their
repositories out; judge.py judges an episode with runner.py, the test harness it runs inside the
sandbox. generate.py makes the built-in instances: bugs injected (mutations.py) into six small
libraries, issues written from the symptoms (probe.py). Those libraries are data, not clawrl's
code: `data/swe_libraries/` of the source checkout, copied into a built wheel as `libraries/`
here (setup.py); `generate.libraries_dir()` finds them.
"""
