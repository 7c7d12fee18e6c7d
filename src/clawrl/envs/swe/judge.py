"""Judging an SWE episode as SWE-bench does: the model's diff on a fresh copy, then the hidden tests.

1. `working_copy_patch`: in the episode's sandbox, the diff of the working copy (new files
   included) against `base_commit`, leaving out the test files (those the instance's `test_patch`
   touches, and any file a test layout names: `tests/`, `test/`, `test_*.py`, `*_test.py`,
   `conftest.py`) and Python's caches. What the model changed in tests does not count, as in
   SWE-bench, where the hidden tests replace them.
2. `judge`: a fresh sandbox over the untouched checkout; the model's diff is applied with
   `git apply`, then the `test_patch`; FAIL_TO_PASS and PASS_TO_PASS run with the runner
   (`runner.py`), each test interrupted after `TEST_TIMEOUT_S`, the whole run after
   `JUDGE_TIMEOUT_S`. Resolved when every one of them passes; a diff that does not apply resolves
   nothing.

Everything the model's code does at judgement runs inside the sandbox, like its commands during
the episode. Like SWE-bench's harness, this one trusts what the tests report: code that rewrites
the test runner's results could fake a pass.
"""

from __future__ import annotations

import base64
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawrl.envs.episode import command_output
from clawrl.envs.sandbox import WORKDIR, Sandbox, SandboxLimits
from clawrl.envs.swe.instances import SWEInstance
from clawrl.envs.terminal.tasks import tar_gz

RUNNER = Path(__file__).with_name("runner.py")
TEST_TIMEOUT_S = 10.0
JUDGE_TIMEOUT_S = 120.0
_JUDGE_DIR = "/tmp/clawrl-judge"
_TEST_FILE_GLOBS = ("**/tests/**", "**/test/**", "**/test_*.py", "**/*_test.py", "**/conftest.py")
_CACHE_GLOBS = ("**/__pycache__/**", "**/*.pyc")
_GIT = "git -c safe.directory='*' -c core.quotepath=off"
_PATCH_FAILED, _TEST_PATCH_FAILED = 81, 82  # exit codes of the judge's script (the runner exits 0)
# one command: unpack the judge's files (from stdin), apply both patches, run the tests
_JUDGE_SCRIPT = f"""
mkdir -p {_JUDGE_DIR} && base64 -d | tar -xz -C {_JUDGE_DIR} || exit 1
cd {WORKDIR} || exit 1
if [ -s {_JUDGE_DIR}/model.diff ]; then
  {_GIT} apply --binary --whitespace=nowarn {_JUDGE_DIR}/model.diff || exit {_PATCH_FAILED}
fi
{_GIT} apply --whitespace=nowarn {_JUDGE_DIR}/test.diff || exit {_TEST_PATCH_FAILED}
exec python3 -B {_JUDGE_DIR}/runner.py {_JUDGE_DIR}/results.jsonl --timeout-s {TEST_TIMEOUT_S:g} --ids-file {_JUDGE_DIR}/ids
"""


@dataclass
class Verdict:
    """What the hidden tests said about a patch."""

    patch_applied: bool
    fail_to_pass: dict[str, str] = field(default_factory=dict)  # test id -> status
    pass_to_pass: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def resolved(self) -> bool:
        statuses = [*self.fail_to_pass.values(), *self.pass_to_pass.values()]
        return self.patch_applied and bool(statuses) and all(status == "passed" for status in statuses)

    def info(self) -> dict[str, Any]:
        """The episode's `info`: resolved, the share of tests passed, counts per list, the error if any."""
        statuses = [*self.fail_to_pass.values(), *self.pass_to_pass.values()]
        passed = sum(status == "passed" for status in statuses)
        info: dict[str, Any] = {
            "resolved": self.resolved,
            "patch_applied": self.patch_applied,
            "tests_passed_share": round(passed / len(statuses), 4) if statuses else 0.0,
            "fail_to_pass_passed": sum(status == "passed" for status in self.fail_to_pass.values()),
            "fail_to_pass_total": len(self.fail_to_pass),
            "pass_to_pass_passed": sum(status == "passed" for status in self.pass_to_pass.values()),
            "pass_to_pass_total": len(self.pass_to_pass),
        }
        return info | ({"judge_error": self.error} if self.error else {})


def test_patch_files(instance: SWEInstance) -> list[str]:
    """The paths the instance's test_patch writes (from its `+++ b/PATH` lines)."""
    return sorted({line[len("+++ b/") :].strip() for line in instance.test_patch.splitlines() if line.startswith("+++ b/")})


async def working_copy_patch(sandbox: Sandbox, instance: SWEInstance) -> tuple[str, str | None]:
    """The model's diff against base_commit (test files left out), and why there is none when git failed."""
    excluded = [f":(exclude){path}" for path in test_patch_files(instance)]
    excluded += [f":(exclude,glob){pattern}" for pattern in _TEST_FILE_GLOBS + _CACHE_GLOBS]
    pathspec = " ".join(shlex.quote(spec) for spec in [".", *excluded])
    command = (f"{_GIT} add -A . && {_GIT} diff --cached --binary --no-color --no-ext-diff --no-textconv "
               f"{instance.base_commit} -- {pathspec}")  # fmt: skip
    result = await sandbox.run(command, timeout_s=JUDGE_TIMEOUT_S)
    if result.exit_code != 0:
        return "", "cannot take the diff of the working copy: " + command_output("", result.stderr, result.exit_code, result.timed_out, 500)
    return result.stdout, None


async def judge(instance: SWEInstance, checkout: Path, patch: str, limits: SandboxLimits) -> Verdict:
    """Apply `patch` and the hidden tests to a fresh copy of `checkout` and run FAIL_TO_PASS and PASS_TO_PASS."""
    tests = [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS]
    files = {"model.diff": patch, "test.diff": instance.test_patch, "runner.py": RUNNER.read_text(),
             "ids": "".join(f"{test}\n" for test in tests)}  # fmt: skip
    async with Sandbox(checkout, limits) as sandbox:
        run = await sandbox.run(_JUDGE_SCRIPT, stdin=base64.b64encode(tar_gz(files)).decode(), timeout_s=JUDGE_TIMEOUT_S)
        statuses = _statuses((await sandbox.run(f"cat {_JUDGE_DIR}/results.jsonl 2>/dev/null", cwd="/")).stdout)
    problem = command_output("", run.stderr, run.exit_code, run.timed_out, 500)
    if run.exit_code == _PATCH_FAILED:
        return Verdict(False, error=f"the patch does not apply: {problem}")
    if run.exit_code == _TEST_PATCH_FAILED:
        return Verdict(True, error=f"the test patch does not apply: {problem}")
    return Verdict(
        True,
        {test: statuses.get(test, "missing") for test in instance.FAIL_TO_PASS},
        {test: statuses.get(test, "missing") for test in instance.PASS_TO_PASS},
        None if run.exit_code == 0 else f"the test run failed: {problem}",
    )


def _statuses(results: str) -> dict[str, str]:
    """Test id -> status from the runner's lines (a line cut short by a kill is skipped)."""
    statuses = {}
    for line in results.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("test"), str):
            statuses[record["test"]] = str(record.get("status"))
    return statuses
