"""The SWE family: generated instances in SWE-bench's schema, episodes with the shell and edit tools,
judging on a fresh copy with the hidden tests, external instances, and the rollout contract."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from clawrl.config import EnvConfig
from clawrl.envs.protocol import Action, StepResult
from clawrl.envs.sandbox import SandboxLimits, sandbox_available
from clawrl.envs.swe.env import SWEEnv
from clawrl.envs.swe.generate import INSTANCES_FILE, generate_instances, generated_instances_dir
from clawrl.envs.swe.instances import SWEInstance, checkout, load_instances
from clawrl.envs.swe.judge import judge

needs_sandbox = pytest.mark.skipif(sandbox_available() is not None, reason=f"no sandbox: {sandbox_available()}")


def call(name: str, **arguments: object) -> Action:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return Action.model_validate({"tool_calls": [{"id": f"call_{name}", "type": "function", "function": function}]})


def answer(result: StepResult) -> str:
    return result.observation.messages[0].content or ""


def git(directory: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=directory, check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def generated(cache_dir: Path) -> Path:
    return generated_instances_dir(cache_dir, seed=0)


@pytest.fixture(scope="module")
def instances(generated: Path) -> dict[str, SWEInstance]:
    return load_instances(generated / INSTANCES_FILE)


def changed_lines(patch: str, sign: str) -> list[str]:
    """The lines a patch adds (`+`) or removes (`-`), without the sign."""
    return [line[1:] for line in patch.splitlines() if line.startswith(sign) and not line.startswith(sign * 3)]


def test_the_generator_writes_at_least_50_reproducible_instances(generated: Path, instances: dict[str, SWEInstance], tmp_path: Path) -> None:
    assert len(instances) >= 50
    splits = [instance.split for instance in instances.values()]
    assert splits.count("eval") >= 10 and splits.count("train") >= 40
    assert len({instance.repo for instance in instances.values()}) >= 6  # several different libraries
    for instance in instances.values():
        assert instance.FAIL_TO_PASS and instance.PASS_TO_PASS and not set(instance.FAIL_TO_PASS) & set(instance.PASS_TO_PASS)
        assert instance.patch.startswith("diff --git ") and "new file mode" in instance.test_patch
        # the issue shows the symptom (a call and what it gives), never the fix
        assert "should" in instance.problem_statement and "`" in instance.problem_statement
        fix = [line.strip() for line in changed_lines(instance.patch, "+")]
        assert not any(line in instance.problem_statement for line in fix), instance.instance_id
        assert (generated / "repos" / instance.repo.replace("/", "__")).is_dir()
    # the same seed gives the same instances (commits and texts included), another seed others
    again = generate_instances(tmp_path / "again", seed=0, per_library=1)
    firsts = [i for i in instances.values() if i.instance_id.endswith("-1")]
    assert [i.model_dump() for i in again] == [i.model_dump() for i in firsts]
    other = generate_instances(tmp_path / "other", seed=1, per_library=1)
    assert [i.patch for i in other] != [i.patch for i in again]


def test_a_checkout_holds_base_commit_and_no_other_history(instances: dict[str, SWEInstance], generated: Path, cache_dir: Path) -> None:
    instance = next(iter(instances.values()))
    work = checkout(instance, generated / "repos", cache_dir)
    assert git(work, "rev-parse", "HEAD").strip() == instance.base_commit
    assert git(work, "rev-list", "--all").split() == [instance.base_commit]  # no sibling instance shows the fix
    assert git(work, "status", "--porcelain") == ""
    hidden = [line[len("+++ b/"):] for line in instance.test_patch.splitlines() if line.startswith("+++ b/")]
    assert hidden and not any((work / path).exists() for path in hidden)


@needs_sandbox
def test_every_gold_patch_resolves_and_every_unpatched_repository_fails(instances: dict[str, SWEInstance], generated: Path, cache_dir: Path) -> None:
    limits = SandboxLimits(cpu_seconds=60)

    async def judge_both(instance: SWEInstance, slots: asyncio.Semaphore) -> tuple[str, dict, dict]:
        async with slots:
            work = checkout(instance, generated / "repos", cache_dir)
            gold, unpatched = await judge(instance, work, instance.patch, limits), await judge(instance, work, "", limits)
            return instance.instance_id, gold.info(), unpatched.info()

    async def run() -> list[tuple[str, dict, dict]]:
        slots = asyncio.Semaphore(4)
        return await asyncio.gather(*(judge_both(instance, slots) for instance in instances.values()))

    for instance_id, gold, unpatched in asyncio.run(run()):
        assert gold["resolved"] and gold["tests_passed_share"] == 1.0, (instance_id, gold)
        assert not unpatched["resolved"] and unpatched["fail_to_pass_passed"] == 0, (instance_id, unpatched)
        assert unpatched["pass_to_pass_passed"] == unpatched["pass_to_pass_total"], (instance_id, unpatched)


@needs_sandbox
def test_edits_are_judged_on_a_fresh_copy_and_test_changes_do_not_count(
    instances: dict[str, SWEInstance], generated: Path, cache_dir: Path
) -> None:
    def patched_file(instance: SWEInstance) -> str:
        return instance.patch.split("\n", 1)[0].split(" b/", 1)[1]

    def one_line_fix(instance: SWEInstance) -> bool:  # a line changed, which occurs once in its file
        removed, added = changed_lines(instance.patch, "-"), changed_lines(instance.patch, "+")
        text = (checkout(instance, generated / "repos", cache_dir) / patched_file(instance)).read_text()
        return len(removed) == len(added) == 1 and text.count(removed[0] + "\n") == 1

    instance = next(i for i in instances.values() if one_line_fix(i))
    path = patched_file(instance)
    (buggy_line,), (fixed_line,) = changed_lines(instance.patch, "-"), changed_lines(instance.patch, "+")
    hidden = [line[len("+++ b/"):] for line in instance.test_patch.splitlines() if line.startswith("+++ b/")]
    passing_tests = "import unittest\n\nclass Test(unittest.TestCase):\n    def test_ok(self):\n        pass\n"

    async def play(*actions: Action) -> StepResult:
        env = SWEEnv(EnvConfig(cache_dir=cache_dir, max_steps=10))
        opening = await env.reset(seed=0, task=instance.instance_id)
        assert [tool["function"]["name"] for tool in opening.tools] == ["shell", "view_file", "edit_file", "submit"]
        assert opening.messages[1].content.startswith(instance.problem_statement.rstrip())
        for action in actions:
            result = await env.step(action)
        await env.close()
        return result

    fixed = asyncio.run(play(call("edit_file", path=path, old=f"{buggy_line}\n", new=f"{fixed_line}\n"), call("submit")))
    assert fixed.done and fixed.reward == 1.0 and fixed.info["tests_passed_share"] == 1.0
    # writing the hidden test files (with tests that pass) is left out of the diff: nothing changes
    cheat = " && ".join(f"mkdir -p $(dirname {name}) && printf %s {json.dumps(passing_tests)} > {name}" for name in hidden)
    cheated = asyncio.run(play(call("shell", command=cheat), call("submit")))
    assert cheated.reward == 0.0 and cheated.info["patch_lines"] == 0 and "judge_error" not in cheated.info
    assert cheated.info["fail_to_pass_passed"] == 0 and cheated.info["fail_to_pass_total"] == len(instance.FAIL_TO_PASS)
    # a wrong change to the code is applied and judged: not resolved, and it breaks what passed
    broken = asyncio.run(play(call("shell", command=f"echo 'raise ImportError' >> {path}"), call("submit")))
    assert broken.reward == 0.0 and broken.info["patch_applied"] and broken.info["patch_lines"] > 0
    assert broken.info["pass_to_pass_passed"] < broken.info["pass_to_pass_total"]
    work = checkout(instance, generated / "repos", cache_dir)  # the image the sandboxes wrote over is untouched
    assert "raise ImportError" not in (work / path).read_text() and not any((work / name).exists() for name in hidden)
    # a model that answers without a tool call is judged too
    gave_up = asyncio.run(play(Action(content="I cannot fix this.")))
    assert gave_up.done and gave_up.reward == 0.0 and gave_up.info["patch_lines"] == 0


@needs_sandbox
def test_the_file_tools_answer_with_clear_errors(instances: dict[str, SWEInstance], cache_dir: Path) -> None:
    instance = next(iter(instances.values()))

    async def play() -> list[str]:
        env = SWEEnv(EnvConfig(cache_dir=cache_dir, max_steps=20))
        await env.reset(seed=0, task=instance.instance_id)
        await env.step(call("shell", command="printf 'a = 1\\nb = 1\\nc = 2\\n' > twice.py"))
        answers = [answer(await env.step(action)) for action in (
            call("edit_file", path="twice.py", old="= 1", new="= 3"),
            call("edit_file", path="twice.py", old="d = 4", new="d = 5"),
            call("edit_file", path="twice.py", old="", new="x"),
            call("edit_file", path="missing.py", old="a", new="b"),
            call("edit_file", path=".git", old="a", new="b"),
            call("view_file", path="twice.py", start_line=3, end_line=1),
            call("edit_file", path="twice.py", old="c = 2", new="c = 3\nd = 4"),
            call("view_file", path="/workspace/twice.py"),
            call("edit_file", path="/usr/bin/env", old="a", new="b"),
        )]  # fmt: skip
        await env.close()
        return answers

    (twice, absent, empty, missing, directory, bad_range, edited, viewed, binary) = asyncio.run(play())
    assert twice.startswith("error: `old` occurs 2 times in twice.py") and "surrounding lines" in twice
    assert absent.startswith("error: `old` does not occur in twice.py")
    assert empty.startswith("error: `old` is empty")
    assert missing == "error: cannot read missing.py: no such file"
    assert directory == "error: cannot read .git: it is a directory"
    assert bad_range.startswith("error: lines 3 to 1 are not a range")
    assert edited == "edited twice.py; lines 3-4 now read:\n    3  c = 3\n    4  d = 4"
    assert viewed == "    1  a = 1\n    2  b = 1\n    3  c = 3\n    4  d = 4"
    assert binary.startswith("error:") and ("not UTF-8" in binary or "larger than" in binary)


@needs_sandbox
def test_an_external_instance_with_a_local_repository_loads_and_is_judged(tmp_path: Path) -> None:
    repo = tmp_path / "repos" / "acme__calc"
    (repo / "tests").mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "tests" / "__init__.py").write_text("")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "calc")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    git(repo, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qam", "the fix, later in the history")
    gold = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
    tests = "import unittest\nfrom calc import add\n\nclass AddTest(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n    def test_zero(self):\n        self.assertEqual(add(0, 0), 0)\n"
    test_patch = (
        "diff --git a/tests/test_calc.py b/tests/test_calc.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_calc.py\n"
        f"@@ -0,0 +1,{len(tests.splitlines())} @@\n" + "".join(f"+{line}\n" for line in tests.splitlines())
    )
    record = {"instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": base, "problem_statement": "add(2, 3) gives -1",
              "patch": gold, "test_patch": test_patch, "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::AddTest::test_add"]),
              "PASS_TO_PASS": '["tests.test_calc.AddTest.test_zero"]', "split": "eval", "hints_text": ""}  # fmt: skip
    (tmp_path / "instances.jsonl").write_text(json.dumps(record) + "\n")

    async def play(*actions: Action) -> list[StepResult]:
        env = SWEEnv(EnvConfig(swe_instances=tmp_path / "instances.jsonl", cache_dir=tmp_path / "cache"))
        assert await env.tasks("eval") == ["acme__calc-1"] and await env.tasks("train") == []
        await env.reset(seed=0, task="acme__calc-1")
        results = [await env.step(action) for action in actions]
        await env.close()
        return results

    history, unfixed = asyncio.run(play(call("shell", command="git log --all --format=%s"), call("submit")))
    assert answer(history) == "calc" and unfixed.reward == 0.0 and unfixed.info["fail_to_pass_total"] == 1
    (fixed,) = asyncio.run(play(call("edit_file", path="calc.py", old="a - b", new="a + b")))
    assert fixed.done is False  # editing does not end the episode; submitting does
    *_, submitted = asyncio.run(play(call("edit_file", path="calc.py", old="a - b", new="a + b"), call("submit")))
    assert submitted.reward == 1.0 and submitted.info["tests_passed_share"] == 1.0


def clawrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawrl.cli", *args], capture_output=True, text=True, timeout=300)


@needs_sandbox
def test_rollout_oracle_resolves_every_episode_and_random_resolves_none(generated: Path, cache_dir: Path) -> None:
    summaries = {}
    for policy in ("oracle", "random"):
        result = clawrl("rollout", "--env", "swe", "--policy", policy, "--episodes", "4", "--json", "--cache-dir", str(cache_dir))
        assert result.returncode == 0, result.stderr
        summaries[policy] = json.loads(result.stdout)
    assert summaries["oracle"]["episodes"] == 4 and summaries["oracle"]["failed"] == 0
    assert summaries["oracle"]["mean_reward"] == 1.0
    assert summaries["random"]["failed"] == 0 and summaries["random"]["mean_reward"] < summaries["oracle"]["mean_reward"]
    missing = clawrl("rollout", "--env", "swe", "--policy", "oracle", "--swe-instances", str(cache_dir / "none.jsonl"))
    assert missing.returncode != 0 and "--swe-instances" in missing.stderr and "no such file" in missing.stderr


@needs_sandbox
def test_a_micro_split_keeps_only_the_bug_kinds_and_libraries_asked_for(cache_dir: Path) -> None:
    micro = ("--swe-kinds", "condition", "--swe-libraries", "statkit,textkit", "--cache-dir", str(cache_dir))
    result = clawrl("rollout", "--env", "swe", "--policy", "oracle", "--episodes", "4", "--json", *micro)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["mean_reward"] == 1.0
    env = SWEEnv(EnvConfig(swe_kinds="condition", swe_libraries="statkit,textkit", cache_dir=cache_dir))
    tasks = asyncio.run(env.tasks("train")) + asyncio.run(env.tasks("eval"))
    assert len(tasks) >= 8 and {task.split("__")[1].split("-")[0] for task in tasks} == {"statkit", "textkit"}
    for task in tasks:  # each gold patch takes a negation off an `if` test: the one kind asked for
        patch = env._known(task).patch
        assert [line.strip() for line in changed_lines(patch, "-") if "not (" in line] and "not (" not in "".join(changed_lines(patch, "+"))
    for flag, value, known in (("--swe-kinds", "typo", "condition"), ("--swe-libraries", "numpy", "statkit")):
        wrong = clawrl("rollout", "--env", "swe", "--policy", "oracle", flag, value, "--cache-dir", str(cache_dir))
        assert wrong.returncode != 0 and value in wrong.stderr and known in wrong.stderr and "Traceback" not in wrong.stderr
