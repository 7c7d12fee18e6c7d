"""The terminal family: generated Harbor-layout task folders, a persistent shell in the sandbox,
tests that appear only at verification, and the scripted policies' scores."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from clawrl.config import EnvConfig, RolloutConfig
from clawrl.envs.policies import make_policy
from clawrl.envs.protocol import Action
from clawrl.envs.rollout import plan_episodes, run_rollouts, summarize
from clawrl.envs.sandbox import sandbox_available
from clawrl.envs.terminal.env import TerminalEnv, load_tasks
from clawrl.envs.terminal.tasks import EVAL_WORDS, TRAIN_WORDS, generate_tasks, generated_tasks_dir

needs_sandbox = pytest.mark.skipif(sandbox_available() is not None, reason=f"no sandbox: {sandbox_available()}")
HAS_GIT = shutil.which("git") is not None


def shell(command: str, call_id: str = "s1") -> Action:
    arguments = json.dumps({"command": command})
    return Action.model_validate({"tool_calls": [{"id": call_id, "type": "function", "function": {"name": "shell", "arguments": arguments}}]})


def finish() -> Action:
    return Action.model_validate({"tool_calls": [{"id": "f1", "type": "function", "function": {"name": "finish", "arguments": "{}"}}]})


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_tasks_dir(tmp_path_factory.mktemp("cache"), seed=0)


def digest(directory: Path) -> str:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and ".git" not in p.parts)
    return hashlib.sha256(b"".join(p.relative_to(directory).as_posix().encode() + p.read_bytes() for p in files)).hexdigest()


def test_the_generator_writes_at_least_30_harbor_task_folders(tasks_dir: Path, tmp_path: Path) -> None:
    tasks = load_tasks(tasks_dir)
    assert len(tasks) >= 30
    categories = {name.split("-")[0] for name in tasks}
    assert categories == {"files", "text", "permissions", "archives"} | ({"git"} if HAS_GIT else set())
    for task in tasks.values():
        for part in ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh", "solution/solve.sh"):
            assert (task.path / part).is_file(), (task.id, part)
    splits = {task.split for task in tasks.values()}
    assert splits == {"train", "eval"}
    # the same seed writes the same files; another seed other ones
    again = generate_tasks(tmp_path / "again", 0, HAS_GIT)
    other = generate_tasks(tmp_path / "other", 1, HAS_GIT)
    assert digest(tmp_path / "again") == digest(tasks_dir) != digest(tmp_path / "other")
    assert len(again) == len(other) == len(tasks)
    # names are written bare (a tokenizer splits a word after a backtick unlike after a space);
    # a quote of several words keeps its backticks
    instructions = [task.instruction for task in tasks.values()]
    assert not any(re.search(r"`[^`\s]+`", text) for text in instructions)
    assert any("chmod 600" in (task.path / "solution" / "solve.sh").read_text() and " (mode 600)" in task.instruction
               for task in tasks.values())  # fmt: skip
    if HAS_GIT:
        assert any(re.search(r"message `[^`]+ [^`]+`", text) for text in instructions)


def task_text(task_dir: Path) -> str:
    """Everything a task shows or holds: instruction, solution, tests and every workspace file (and path)."""
    files = sorted(p for p in task_dir.rglob("*") if p.is_file() and ".git" not in p.parts)
    text = "\n".join(p.relative_to(task_dir).as_posix() + "\n" + p.read_bytes().decode("utf-8", "replace") for p in files)
    return text.replace("Harbor", "")  # the task format's name in the Dockerfile's and test.sh's comments, not a task's


def test_no_name_an_eval_task_uses_occurs_in_any_training_task(tasks_dir: Path) -> None:
    """A gain on eval must not be a name recalled from training: the splits draw from separate pools."""
    assert not set(EVAL_WORDS) & set(TRAIN_WORDS)
    tasks = load_tasks(tasks_dir).values()
    eval_text = "\n".join(task_text(task.path) for task in tasks if task.split == "eval")
    train_text = "\n".join(task_text(task.path) for task in tasks if task.split == "train")
    eval_names = {word for word in EVAL_WORDS if re.search(rf"\b{word}\b", eval_text, re.IGNORECASE)}
    assert len(eval_names) >= 15  # the eval tasks do use the pool
    assert not [word for word in EVAL_WORDS if re.search(rf"\b{word}\b", train_text, re.IGNORECASE)]
    assert {word for word in TRAIN_WORDS if re.search(rf"\b{word}\b", train_text)}


def test_no_two_eval_tasks_of_a_template_that_names_things_ask_the_same(tasks_dir: Path) -> None:
    """The benchmark's eval tasks (TERMINAL_MICRO) once held "Copy lumen.conf to backup/..." twice."""
    by_template: dict[str, list[str]] = {}
    for task in load_tasks(tasks_dir).values():
        if task.split == "eval":
            by_template.setdefault(task.id.rsplit("-", 1)[0], []).append(task.instruction)
    named = {template: texts for template, texts in by_template.items()
             if any(re.search(rf"\b{word}\b", text) for word in EVAL_WORDS for text in texts)}  # fmt: skip
    assert {"files-mkdir_write", "files-backup_copy", "archives-gzip_file"} <= set(named)
    for template, texts in named.items():
        assert len(set(texts)) == len(texts), template


@needs_sandbox
def test_task_prefixes_make_a_micro_split(tasks_dir: Path, tmp_path: Path) -> None:
    micro = EnvConfig(terminal_task_prefixes="files-mkdir_write,permissions")
    env = TerminalEnv(micro, tasks_dir=tasks_dir)
    evaluation, train = asyncio.run(env.tasks("eval")), asyncio.run(env.tasks("train"))
    templates = ["files-mkdir_write", "permissions-make_executable", "permissions-private_file",
                 "permissions-read_only_dir", "permissions-script_modes"]  # fmt: skip
    assert evaluation == [f"{template}-{variant}" for template in templates for variant in range(3)]
    assert train == [f"{template}-{variant}" for template in templates for variant in range(3, 6)]
    written = generate_tasks(tmp_path / "some", seed=0, with_git=HAS_GIT, prefixes=("files-mkdir_write",))
    assert [path.name for path in written] == [f"files-mkdir_write-{variant}" for variant in range(6)]
    assert digest(written[0]) == digest(tasks_dir / "files-mkdir_write-0")  # the same task as in the whole set


def test_a_persistent_shell_and_tests_that_appear_only_at_verification(tasks_dir: Path) -> None:
    async def play() -> None:
        env = TerminalEnv(EnvConfig(max_steps=6), tasks_dir=tasks_dir)
        task = (await env.tasks("eval"))[0]
        opening = await env.reset(seed=0, task=task)
        assert [tool["function"]["name"] for tool in opening.tools] == ["shell", "finish"]
        assert opening.messages[1].content == (tasks_dir / task / "instruction.md").read_text()
        await env.step(shell("mkdir -p deep/er && cd deep/er && export MARK=kept"))
        here = await env.step(shell("pwd; echo $MARK; ls /tests /solution 2>&1 | head -2"))
        text = here.observation.messages[0].content
        assert text.startswith("/workspace/deep/er\nkept\n") and "No such file" in text
        done = await env.step(finish())
        assert done.done and done.reward == 0.0 and done.observation.messages[0].tool_call_id == "f1"
        await env.close()

    asyncio.run(play())


@needs_sandbox
def test_any_directory_of_harbor_tasks_loads_and_its_verifier_decides(tmp_path: Path) -> None:
    task = tmp_path / "tasks" / "half-credit"
    (task / "tests").mkdir(parents=True)
    (task / "environment" / "workspace").mkdir(parents=True)
    (task / "environment" / "workspace" / "seed.txt").write_text("3\n")
    (task / "environment" / "Dockerfile").write_text("FROM scratch\n")  # ignored
    (task / "task.toml").write_text('version = "1.0"\n[metadata]\nsplit = "eval"\n[verifier]\ntimeout_sec = 10\n')
    (task / "instruction.md").write_text("Double the number in seed.txt into out.txt.\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "if [ \"$(cat /workspace/out.txt)\" = 6 ]; then echo 1; else echo 0.5; fi > /logs/verifier/reward.txt\n"
    )

    async def play() -> list[float]:
        env = TerminalEnv(EnvConfig(max_steps=3), tasks_dir=tmp_path / "tasks")
        assert await env.tasks("eval") == ["half-credit"] and await env.tasks("train") == []
        rewards = []
        for command in ("echo $(( $(cat seed.txt) * 2 )) > out.txt", "echo 5 > out.txt"):
            await env.reset(seed=0, task="half-credit")
            await env.step(shell(command))
            rewards.append((await env.step(Action(content="done"))).reward)  # no tool call also ends it
        await env.close()
        return rewards

    assert asyncio.run(play()) == [1.0, 0.5]


@needs_sandbox
@pytest.mark.parametrize(("policy", "expected"), [("oracle", 1.0), ("random", 0.0)])
def test_scripted_policies_score_as_expected_on_every_eval_task(tasks_dir: Path, policy: str, expected: float) -> None:
    config = RolloutConfig(policy=policy, episodes=21, concurrency=2, split="eval")

    async def run() -> dict:
        env = TerminalEnv(EnvConfig(), tasks_dir=tasks_dir)
        planned = plan_episodes(await env.tasks("eval"), config)
        make_env = lambda: TerminalEnv(EnvConfig(max_steps=4), tasks_dir=tasks_dir)  # noqa: E731
        records = await run_rollouts(make_env, lambda e, p: make_policy(policy, e, p.task, p.seed), planned, config)
        assert [(r.task, r.error) for r in records if r.failed] == []
        if policy == "oracle":
            assert [r.task for r in records if r.reward != 1.0] == []
        return summarize(records)

    summary = asyncio.run(run())
    assert summary["mean_reward"] == pytest.approx(expected, abs=0.15)
