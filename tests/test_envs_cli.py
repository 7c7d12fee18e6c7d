"""`clawrl envs list`, `clawrl envs serve` and `clawrl rollout`, run as a user runs them, and
rollouts that keep going when an episode crashes, hangs or gets a malformed action."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from clawrl.config import EnvConfig, RolloutConfig
from clawrl.envs.http import HTTPEnvironment
from clawrl.envs.protocol import Action
from clawrl.envs.records import PlannedEpisode
from clawrl.envs.rollout import plan_episodes, run_rollouts, summarize
from clawrl.envs.sandbox import sandbox_available
from clawrl.envs.toolcall.env import ToolCallEnv
from clawrl.envs.toolcall.problems import problem
from tests.helpers import wait_until

needs_sandbox = pytest.mark.skipif(sandbox_available() is not None, reason=f"no sandbox: {sandbox_available()}")


def clawrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawrl.cli", *args], capture_output=True, text=True, timeout=120)


def test_envs_list(tmp_path: Path) -> None:
    result = clawrl("envs", "list", "--json", "--cache-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)
    assert [item["name"] for item in listed] == ["toolcall", "terminal", "swe", "web"]
    assert all(item["train_tasks"] > 0 and item["eval_tasks"] > 0 for item in listed)


@needs_sandbox
@pytest.mark.parametrize("env", ["toolcall", "terminal"])
def test_rollout_oracle_scores_one_and_random_scores_lower(env: str, tmp_path: Path) -> None:
    summaries = {}
    for policy in ("oracle", "random"):
        record = tmp_path / f"{policy}.jsonl"
        result = clawrl("rollout", "--env", env, "--policy", policy, "--episodes", "8", "--group-size", "2",
                        "--concurrency", "2", "--json", "--record", str(record), "--cache-dir", str(tmp_path))
        assert result.returncode == 0, result.stderr
        assert "rollout: 8/8 episodes" in result.stderr
        summaries[policy] = json.loads(result.stdout)
        lines = [json.loads(line) for line in record.read_text().splitlines()]
        assert len(lines) == 8
        assert set(lines[0]) >= {"task", "seed", "steps", "reward", "failed", "error", "messages"}
        assert lines[0]["messages"][0]["role"] == "system"
    assert summaries["oracle"]["episodes"] == 8 and summaries["oracle"]["failed"] == 0
    assert summaries["oracle"]["mean_reward"] == 1.0 and summaries["oracle"]["groups"] == 4
    assert summaries["random"]["mean_reward"] <= 0.25


def test_rollout_without_a_policy_says_what_to_give() -> None:
    result = clawrl("rollout", "--env", "toolcall")
    assert result.returncode != 0 and "--policy oracle|random" in result.stderr
    unknown = clawrl("rollout", "--env", "chess", "--policy", "oracle")
    assert unknown.returncode != 0 and "no environment 'chess'" in unknown.stderr


def _healthy(url: str, server: subprocess.Popen[bytes]) -> bool:
    assert server.poll() is None, "the environment server exited"
    try:
        return bool(httpx.get(f"{url}/health").json() == {"status": "healthy"})
    except httpx.TransportError:
        return False


def test_envs_serve_answers_in_openenv_shape() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "clawrl.cli", "envs", "serve", "--env", "toolcall", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(url, server), 60, "the environment server to start", every=0.2)

        async def play() -> float:
            env = HTTPEnvironment(url)
            task = (await env.tasks("train"))[0]
            await env.reset(seed=0, task=task)
            result = await env.step(Action(content=f"\\boxed{{{problem(task).answer}}}"))
            await env.close()
            return result.reward

        assert asyncio.run(play()) == 1.0
    finally:
        server.terminate()
        server.wait(timeout=30)


# --- one bad episode never stops the others ---------------------------------------------------


class CrashingEnv(ToolCallEnv):
    """Crashes on the first step of an episode of `crash_task`."""

    crash_task = ""

    async def step(self, action: Any) -> Any:
        if (await self.state()).task == self.crash_task:
            raise RuntimeError("the sandbox went away")
        return await super().step(action)


def test_a_crash_a_timeout_and_a_malformed_action_fail_only_their_episodes() -> None:
    config = RolloutConfig(policy="oracle", episodes=8, concurrency=3, episode_timeout_s=0.5)
    env_config = EnvConfig(toolcall_train_problems=50)

    async def run() -> list:
        tasks = await ToolCallEnv(env_config).tasks("train")
        planned = plan_episodes(tasks, config)
        crash, hang, malformed = planned[0].task, planned[1].task, planned[2].task
        CrashingEnv.crash_task = crash

        async def make_policy(_env: Any, planned: PlannedEpisode) -> Any:
            task = planned.task

            async def policy(messages: list[dict[str, Any]], _tools: list[dict[str, Any]]) -> dict[str, Any]:
                if task == hang:
                    await asyncio.sleep(30)
                if task == malformed:
                    return {"role": "assistant", "tool_calls": [{"id": "x", "function": {"arguments": 3}}]}
                return {"role": "assistant", "content": f"\\boxed{{{problem(task).answer}}}"}

            return policy

        records = await run_rollouts(lambda: CrashingEnv(env_config), make_policy, planned, config)
        errors = {record.task: record.error for record in records if record.failed}
        assert set(errors) == {crash, hang, malformed}
        assert "RuntimeError: the sandbox went away" in errors[crash]
        assert errors[hang].startswith("timeout") and errors[malformed].startswith("malformed action")
        return records

    records = asyncio.run(run())
    summary = summarize(records)
    assert summary["episodes"] == 8 and summary["failed"] == 3 and summary["mean_reward"] == 1.0
