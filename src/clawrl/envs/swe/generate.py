"""The built-in SWE instances: small Python libraries with one injected bug each, found by their tests.

The material is six libraries written for this (`data/swe_libraries/`: text utilities, unit conversion,
interval arithmetic, a stack calculator, date helpers, statistics), each a package with a unittest
suite that passes. For each library, seeded:

1. every candidate mutation of its modules (`mutations.py`) is listed and shuffled;
2. candidates are tried in that order: the mutant's whole suite runs (`runner.py`, the judge's
   harness, on the host: this is our own code). A mutant that no test notices is dropped; one that
   breaks tests is a bug. Its FAIL_TO_PASS are the tests it breaks, PASS_TO_PASS all the others;
3. the issue is written from the symptoms: the failing tests' assertions are evaluated on the
   mutant (`probe.py`), and the issue quotes one or two calls with what they return (or raise)
   and what they should. It never shows the code or the fix;
4. the instance's base commit holds the mutant and the test files that still pass (the files
   holding a failing test are the hidden `test_patch`, as new files); `patch` restores the module.
   Each base commit is a root commit of the library's repository (`repos/clawrl-swe__<library>`,
   a bare repository, one branch per instance): a history would show the bug being injected.

Until `INSTANCES_PER_LIBRARY` bugs are found per library; the first `EVAL_PER_LIBRARY` of each are the
eval split. The same seed gives the same instances, commits and texts; `generated_instances_dir`
writes them once under a cache directory (atomically, as the terminal tasks).
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawrl.envs.swe.instances import SWEInstance, git_env
from clawrl.envs.swe.mutations import MUTATION_KINDS, Mutation, mutations

GENERATOR_VERSION = 1  # bump when the instances change, so caches of the old set are not reused
INSTANCES_PER_LIBRARY = 9
EVAL_PER_LIBRARY = 2
OWNER = "clawrl-swe"
INSTANCES_FILE = "instances.jsonl"
RUNNER = Path(__file__).with_name("runner.py")
PROBE = Path(__file__).with_name("probe.py")
# the python3 the judge's sandbox finds on its PATH (it binds the host's /usr and /bin): generating
# with the same interpreter makes both agree on every result
SANDBOX_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
_TEST_TIMEOUT_S = 2.0
_GITIGNORE = "__pycache__/\n*.pyc\n"
_ASSERTION_KINDS = {"assertEqual": "equal", "assertAlmostEqual": "almost_equal", "assertTrue": "true", "assertFalse": "false"}
_TITLES = ("`{name}` gives a wrong result", "Wrong result from `{name}`", "Bug in `{name}`", "{library}: `{name}` misbehaves")
_OPENINGS = ("Using {library} at the current commit:", "I ran into this while using {library}:",
             "Reproduced from the repository's root in a Python shell:")  # fmt: skip
_CLOSINGS = ("", "This breaks code that relies on it.", "Could someone take a look?")


@dataclass(frozen=True)
class Library:
    """One library's files (path in the repository -> text)."""

    name: str
    files: dict[str, str]

    @property
    def modules(self) -> list[str]:
        """The package's modules, where bugs go (not its `__init__`, not the tests)."""
        return sorted(path for path in self.files if path.startswith(f"{self.name}/") and not path.endswith("__init__.py"))


@dataclass(frozen=True)
class Bug:
    """A mutant that breaks tests, and what an issue can say about it."""

    mutation: Mutation
    failing: list[str]
    passing: list[str]
    symptoms: list[str]
    name: str  # the function or class the first symptom calls


def libraries_dir() -> Path:
    """Where the built-in libraries are. They are data, not clawrl's code, so they live outside src/:
    `data/swe_libraries/` of the source checkout (what an editable install uses too); a wheel carries
    a copy as `libraries/` beside this file (setup.py's build step puts it there)."""
    here = Path(__file__).resolve().parent
    candidates = (here / "libraries", here.parents[3] / "data" / "swe_libraries")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"the built-in SWE libraries are missing: none at {' or '.join(map(str, candidates))}")


def read_libraries() -> list[Library]:
    libraries = []
    for folder in sorted(path for path in libraries_dir().iterdir() if path.is_dir()):
        files = {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*"))
                 if p.is_file() and "__pycache__" not in p.parts}  # fmt: skip
        libraries.append(Library(folder.name, files | {".gitignore": _GITIGNORE}))
    return libraries


def generated_instances_dir(cache_dir: Path, seed: int, kinds: Sequence[str] = (), libraries: Sequence[str] = ()) -> Path:
    """The built-in instances for `seed` (INSTANCES_FILE and repos/), generated under `cache_dir` on first use.

    `kinds` keeps only bugs of those mutation kinds, `libraries` only those libraries (empty: all):
    a micro split, written to a folder of its own.
    """
    selection = "".join(f"-{'+'.join(sorted(names))}" for names in (kinds, libraries) if names)
    target = cache_dir / "swe-instances" / f"v{GENERATOR_VERSION}-seed{seed}{selection}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    generate_instances(staging, seed, kinds=kinds, libraries=libraries)
    try:
        staging.rename(target)
    except OSError:  # another process finished first: its set is the same
        shutil.rmtree(staging, ignore_errors=True)
    return target


def generate_instances(out_dir: Path, seed: int, per_library: int = INSTANCES_PER_LIBRARY, kinds: Sequence[str] = (),
                       libraries: Sequence[str] = ()) -> list[SWEInstance]:  # fmt: skip
    """Write `out_dir/INSTANCES_FILE` and `out_dir/repos/`; return the instances (of `kinds` in `libraries`, or all)."""
    chosen = select_libraries(libraries)
    unknown_kinds = sorted(set(kinds) - set(MUTATION_KINDS))
    if unknown_kinds:
        raise ValueError(f"no mutation kind {', '.join(unknown_kinds)}; the kinds are {', '.join(MUTATION_KINDS)}")
    # Python 3.11's parser is not thread-safe (cpython gh-106905: "AST constructor recursion depth
    # mismatch"), so all parsing happens here, before the threads that run the tests start.
    plans = [(library, _candidates(library, kinds), _library_assertions(library)) for library in chosen]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # the work is in subprocesses
        found = list(pool.map(lambda plan: _library_instances(*plan, seed, per_library, out_dir / "repos"), plans))
    instances = [instance for library_instances in found for instance in library_instances]
    (out_dir / INSTANCES_FILE).write_text("".join(instance.model_dump_json() + "\n" for instance in instances))
    return instances


def select_libraries(names: Sequence[str] = ()) -> list[Library]:
    """The built-in libraries named (all when `names` is empty); ValueError, listing them, for an unknown name."""
    libraries = read_libraries()
    unknown = sorted(set(names) - {library.name for library in libraries})
    if unknown:
        known = ", ".join(library.name for library in libraries)
        raise ValueError(f"no SWE library {', '.join(unknown)}; the libraries are {known}")
    return [library for library in libraries if not names or library.name in names]


def _candidates(library: Library, kinds: Sequence[str]) -> list[Mutation]:
    """Every mutation of the library's modules (of `kinds`, or all) that changes what the code does."""
    return [mutation for path in library.modules for mutation in mutations(path, library.files[path])
            if not kinds or mutation.kind in kinds]  # fmt: skip


def _library_instances(library: Library, candidates: list[Mutation], assertions: dict[str, list[dict[str, Any]]],
                       seed: int, count: int, repos_dir: Path) -> list[SWEInstance]:  # fmt: skip
    rng = random.Random(f"swe:{seed}:{library.name}")
    repo = repos_dir / f"{OWNER}__{library.name}"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True, capture_output=True, env=git_env())
    with tempfile.TemporaryDirectory(prefix="clawrl-swe-") as scratch:
        work = Path(scratch) / "work"
        _write_tree(work, library.files)
        if any(status != "passed" for status in _run_tests(work).values()):
            raise RuntimeError(f"the {library.name} library's own tests do not all pass")
        candidates = list(candidates)
        rng.shuffle(candidates)
        instances: list[SWEInstance] = []
        for mutation in candidates:
            if len(instances) == count:
                break
            bug = _bug(library, mutation, assertions, work, rng)
            if bug is not None:
                split = "eval" if len(instances) < EVAL_PER_LIBRARY else "train"
                instances.append(_instance(library, len(instances) + 1, bug, repo, Path(scratch), split))
    return instances


def _bug(library: Library, mutation: Mutation, assertions: dict[str, list[dict[str, Any]]], work: Path,
         rng: random.Random) -> Bug | None:  # fmt: skip
    """The mutant as a bug, or None when no test notices it or no symptom can be shown."""
    clean = library.files[mutation.path]
    (work / mutation.path).write_text(mutation.apply(clean))
    try:
        statuses = _run_tests(work)
        failing = sorted(test for test, status in statuses.items() if status != "passed")
        if not failing:
            return None
        symptoms = _symptoms([assertion for test in failing for assertion in assertions[test]], work, rng)
    finally:
        (work / mutation.path).write_text(clean)
    if not symptoms:
        return None
    passing = sorted(test for test in statuses if test not in failing)
    return Bug(mutation, failing, passing, [text for text, _name in symptoms], symptoms[0][1])


def _run_tests(work: Path) -> dict[str, str]:
    """The status of every test of the repository at `work`, by the judge's harness."""
    with tempfile.TemporaryDirectory(prefix="clawrl-swe-run-") as scratch:
        results = Path(scratch) / "results.jsonl"
        command = [SANDBOX_PYTHON, "-B", str(RUNNER), str(results), "--timeout-s", str(_TEST_TIMEOUT_S)]
        subprocess.run(command, cwd=work, capture_output=True, timeout=120, check=True)
        lines = [json.loads(line) for line in results.read_text().splitlines()]
    return {line["test"]: line["status"] for line in lines}


def _symptoms(assertions: list[dict[str, Any]], work: Path, rng: random.Random) -> list[tuple[str, str]]:
    """Up to two sentences `call returns X, but it should return Y`, with the name each one calls."""
    if not assertions:
        return []
    probe = subprocess.run([SANDBOX_PYTHON, "-B", str(PROBE)], cwd=work, input=json.dumps(assertions),
                           capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    broken = [(assertion, outcome) for assertion, outcome in zip(assertions, json.loads(probe.stdout)) if not outcome["holds"]]
    chosen = rng.sample(broken, min(2, len(broken)))
    return [(_symptom(assertion, outcome), assertion["calls"]) for assertion, outcome in chosen]


def _library_assertions(library: Library) -> dict[str, list[dict[str, Any]]]:
    """Each test method's assertions as probe requests, by unittest id (`tests.test_x.Class.method`)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for path, source in library.files.items():
        if not (path.startswith("tests/") and path.endswith(".py")):
            continue
        module = path.removesuffix(".py").replace("/", ".")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        requests = [a for statement in item.body if (a := _assertion(statement, source, module))]
                        found.setdefault(f"{module}.{node.name}.{item.name}", []).extend(requests)
    return found


def _assertion(statement: ast.stmt, source: str, module: str) -> dict[str, Any] | None:
    """`self.assertEqual(call, expected)` and the like, or `with self.assertRaises(E): call`, as a probe request
    (with `calls`, the name the call calls, which the probe ignores)."""
    text = lambda node: ast.get_source_segment(source, node)  # noqa: E731
    if isinstance(statement, ast.With) and len(statement.items) == 1 and len(statement.body) == 1:
        manager, body = statement.items[0].context_expr, statement.body[0]
        if isinstance(manager, ast.Call) and isinstance(manager.func, ast.Attribute) and manager.func.attr == "assertRaises":
            if isinstance(body, ast.Expr) and manager.args:
                call = text(body.value)
                return {"module": module, "kind": "raises", "call": call, "expected": text(manager.args[0]), "calls": _called_name(call)}
        return None
    if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)):
        return None
    call = statement.value
    if not isinstance(call.func, ast.Attribute) or call.func.attr not in _ASSERTION_KINDS or not call.args:
        return None
    places = next((k.value.value for k in call.keywords if k.arg == "places" and isinstance(k.value, ast.Constant)), 7)
    expected = text(call.args[1]) if len(call.args) > 1 else None
    called = text(call.args[0])
    return {"module": module, "kind": _ASSERTION_KINDS[call.func.attr], "call": called, "expected": expected, "places": places,
            "calls": _called_name(called)}  # fmt: skip


def _symptom(assertion: dict[str, Any], outcome: dict[str, Any]) -> str:
    call, expected, raised = f"`{assertion['call']}`", assertion["expected"], outcome["raised"]
    if raised and raised.startswith("ProbeTimeout"):
        got = "never returns"
    else:
        got = f"raises `{raised}`" if raised else f"returns `{outcome['actual']}`"
    if assertion["kind"] == "raises":
        return f"{call} {got}; it should raise `{expected}`."
    if assertion["kind"] in ("true", "false"):
        return f"{call} {got}, but it should be {assertion['kind']}."
    rounding = " (up to rounding)" if assertion["kind"] == "almost_equal" else ""
    return f"{call} {got}, but it should return `{expected}`{rounding}."


def _called_name(call: str) -> str:
    """The function or method an expression calls (`overlaps` of `Interval(1, 3).overlaps(...)`), else its first name."""
    expression = ast.parse(call, mode="eval").body
    if isinstance(expression, ast.Call):
        function = expression.func
        if isinstance(function, ast.Attribute):
            return function.attr
        if isinstance(function, ast.Name):
            return function.id
    return next((node.id for node in ast.walk(expression) if isinstance(node, ast.Name)), call)


def _issue_text(library: str, bug: Bug, rng: random.Random) -> str:
    title = rng.choice(_TITLES).format(name=bug.name, library=library)
    lines = [title, "", rng.choice(_OPENINGS).format(library=library), "", bug.symptoms[0]]
    if len(bug.symptoms) > 1:
        lines += ["", f"Another case: {bug.symptoms[1]}"]
    closing = rng.choice(_CLOSINGS)
    return "\n".join(lines + (["", closing] if closing else [])) + "\n"


def _test_file(test_id: str) -> str:
    """The file of a unittest id `tests.test_x.Class.method`: `tests/test_x.py`."""
    return test_id.rsplit(".", 2)[0].replace(".", "/") + ".py"


def _instance(library: Library, number: int, bug: Bug, repo: Path, scratch: Path, split: str) -> SWEInstance:
    instance_id = f"{OWNER}__{library.name}-{number}"
    path = bug.mutation.path
    buggy = bug.mutation.apply(library.files[path])
    hidden = sorted({_test_file(test) for test in bug.failing})
    base_files = {name: text for name, text in library.files.items() if name not in hidden} | {path: buggy}
    base_commit = _commit(repo, base_files, f"{library.name}: the library and its tests", instance_id, scratch)
    rng = random.Random(instance_id)
    return SWEInstance(
        instance_id=instance_id, repo=f"{OWNER}/{library.name}", base_commit=base_commit,
        problem_statement=_issue_text(library.name, bug, rng), patch=_file_diff(path, buggy, library.files[path]),
        test_patch="".join(_file_diff(name, None, library.files[name]) for name in hidden),
        FAIL_TO_PASS=bug.failing, PASS_TO_PASS=bug.passing, version=f"generator-{GENERATOR_VERSION}", split=split,
    )  # fmt: skip


def _file_diff(path: str, old: str | None, new: str) -> str:
    """A git-style diff of one text file from `old` to `new` (a new file when `old` is None)."""
    header = f"diff --git a/{path} b/{path}\n" + ("new file mode 100644\n" if old is None else "")
    before = "/dev/null" if old is None else f"a/{path}"
    return header + "".join(difflib.unified_diff((old or "").splitlines(True), new.splitlines(True), before, f"b/{path}"))


def _write_tree(root: Path, files: dict[str, str]) -> None:
    shutil.rmtree(root, ignore_errors=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _commit(repo: Path, files: dict[str, str], message: str, branch: str, scratch: Path) -> str:
    """A root commit of exactly `files` on `branch` of the bare `repo`; its hash."""
    tree, index = scratch / "commit-tree", scratch / "commit-index"
    _write_tree(tree, files)
    index.unlink(missing_ok=True)
    env = {**git_env(), "GIT_DIR": str(repo), "GIT_WORK_TREE": str(tree), "GIT_INDEX_FILE": str(index)}

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], env=env, check=True, capture_output=True, text=True).stdout.strip()

    git("add", "-A")
    commit = git("commit-tree", git("write-tree"), "-m", message)
    git("update-ref", f"refs/heads/{branch}", commit)
    return commit
