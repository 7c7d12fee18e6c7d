"""Episodes through a real clawrl server (DESIGN §9): `clawrl rollout --server` with the tiny model,
fitted to call the tool-call family's `python` tool, against the real sandbox.

Every model step must be a main turn with exact token ids, the environment's tool messages that
turn's next state (the last step's from the episode's result), and the episode row must carry the
outcome, the step rewards and the group id its G rollouts share. A crashing and a hanging
environment fail their episodes only, recorded as failed. Bad bodies on the episode endpoints get
OpenAI-style 4xx error objects.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from clawrl.config import EnvConfig, RolloutConfig
from clawrl.envs.rollout import plan_episodes, run_rollouts
from clawrl.envs.sandbox import sandbox_available
from clawrl.envs.server import server_policies
from clawrl.envs.toolcall.env import SYSTEM_PROMPT, ToolCallEnv
from clawrl.envs.toolcall.problems import problem, problem_ids
from clawrl.serve.runner import ServerThread
from clawrl.store import Store
from clawrl.store.episodes import EpisodeGroup
from clawrl.types import EPISODE_RESULT_SOURCE
from tests.helpers import fit, run_cli, start_server

needs_sandbox = pytest.mark.skipif(sandbox_available() is not None, reason=f"no sandbox: {sandbox_available()}")

ENV_CONFIG = EnvConfig(max_steps=3, toolcall_train_problems=50)
ROLLOUT = RolloutConfig(server="http://unused/v1", episodes=4, group_size=2, concurrency=2, temperature=0.0, max_tokens=48)
CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'


def planned_tasks() -> list[str]:
    tasks = problem_ids("train", ENV_CONFIG.toolcall_train_problems)  # the train split of ENV_CONFIG's environment
    return sorted({episode.task for episode in plan_episodes(tasks, ROLLOUT)})


def toolcall_conversation(task: str) -> tuple[list[dict[str, Any]], str]:
    """What the model is fitted to: open the task by calling python (what it does after the tool's
    answer, another call or an answer, is its own)."""
    opening = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem(task).question}]
    return opening, CALL


@pytest.fixture(scope="module")
def toolcall_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tools = asyncio.run(_python_tool_specs())
    conversations = [toolcall_conversation(task) for task in planned_tasks()]
    return fit(tiny_model_dir, tmp_path_factory.mktemp("toolcall-model"), conversations, steps=60, tools=tools)


async def _python_tool_specs() -> list[dict[str, Any]]:
    env = ToolCallEnv(ENV_CONFIG)
    observation = await env.reset(0, planned_tasks()[0])
    await env.close()
    return observation.tools


@pytest.fixture
def toolcall_server(toolcall_model_dir: Path, run_dir: Path) -> Iterator[ServerThread]:
    with start_server(toolcall_model_dir, run_dir) as running:
        yield running


def recorded_groups(run_dir: Path) -> list[EpisodeGroup]:
    """Every group of the server's store (no trainer runs: none has samples)."""
    return Store.for_run_dir(run_dir).episodes.groups_to_sample(limit=100)


@needs_sandbox
def test_rollout_through_the_server_records_every_step_and_episode(toolcall_server: ServerThread, run_dir: Path, tmp_path: Path) -> None:
    record_file = tmp_path / "episodes.jsonl"
    summary = run_cli("rollout", "--env", "toolcall", "--server", toolcall_server.base_url, "--episodes", "4", "--group-size", "2",
                      "--concurrency", "2", "--max-steps", "3", "--toolcall-train-problems", "50", "--temperature", "0",
                      "--max-tokens", "48", "--json", "--record", str(record_file))  # fmt: skip
    assert summary["episodes"] == 4 and summary["failed"] == 0 and summary["groups"] == 2
    played = [json.loads(line) for line in record_file.read_text().splitlines()]
    assert all(record["steps"] >= 2 for record in played), "the fitted model calls python"

    store = Store.for_run_dir(run_dir)
    groups = recorded_groups(run_dir)
    assert len(groups) == 2 and all(len(group.episodes) == 2 for group in groups)
    for group in groups:
        assert {episode.episode.group_id for episode in group.episodes} == {group.group_id}
        assert len({episode.episode.task for episode in group.episodes}) == 1
        for episode in group.episodes:
            record = next(r for r in played if r["task"] == episode.episode.task and r["seed"] == episode.episode.seed)
            assert episode.episode.status == "finished" and episode.episode.reward == record["reward"]
            assert episode.episode.step_rewards == record["step_rewards"] and len(episode.steps) == record["steps"]
            assert_steps_recorded(store, episode.steps, record["messages"])


def assert_steps_recorded(store: Store, steps: list[Any], messages: list[dict[str, Any]]) -> None:
    """Each step is a main turn with exact ids, and what the environment answered it is its next state."""
    actions = [index for index, message in enumerate(messages) if message["role"] == "assistant"]
    for number, (step, position) in enumerate(zip(steps, actions, strict=True)):
        turn = step.turn
        assert turn.kind == "main" and turn.prompt_token_ids and turn.response_token_ids
        assert len(turn.response_logprobs) == len(turn.response_token_ids)
        assert turn.messages == messages[:position]  # the conversation so far, as the policy sent it
        following = actions[number + 1] if number + 1 < len(actions) else len(messages)
        observation = messages[position + 1 : following]
        context = store.judging.turn_context(turn.id)
        if not observation:  # an answer without a tool call ends the episode with nothing to observe
            assert context.next_state is None
            continue
        assert context.next_state is not None and context.next_state.messages == observation
        assert all(message["role"] == "tool" for message in observation)
        last = number == len(steps) - 1
        assert (context.next_state.source_turn_id == EPISODE_RESULT_SOURCE) == last


@needs_sandbox
def test_eval_split_episodes_are_side_turns_and_never_reach_training(toolcall_server: ServerThread, run_dir: Path) -> None:
    summary = run_cli("rollout", "--env", "toolcall", "--server", toolcall_server.base_url, "--split", "eval",
                      "--episodes", "4", "--group-size", "2", "--max-steps", "3", "--temperature", "0",
                      "--max-tokens", "48", "--json")  # fmt: skip
    assert summary["episodes"] == 4 and summary["failed"] == 0 and summary["split"] == "eval"
    store = Store.for_run_dir(run_dir)
    assert recorded_groups(run_dir) == [], "an evaluation registers no episode"
    assert list(store.turns.iter_main_turns()) == [], "nothing to judge or train on"
    sessions = store.turns.list_sessions()
    assert len(sessions) == 4
    steps = [context.turn for session in sessions for context in store.turns.session_turns(session.id)]
    assert len(steps) >= 4 and {turn.kind for turn in steps} == {"side"}  # recorded all the same


class BrokenEnv(ToolCallEnv):
    """Crashes on the first step of the episode with seed 1; hangs on the first step of the one with seed 2."""

    seed = -1  # of the episode in progress

    async def step(self, action: Any) -> Any:
        seed = self.seed
        if seed == 1:
            raise RuntimeError("the sandbox went away")
        if seed == 2:
            await asyncio.sleep(60)
        return await super().step(action)

    async def reset(self, seed: int, task: str | None = None) -> Any:
        self.seed = seed
        return await super().reset(seed, task)


@needs_sandbox
def test_a_crashed_and_a_hung_episode_are_recorded_failed_and_the_others_finish(toolcall_server: ServerThread, run_dir: Path) -> None:
    config = ROLLOUT.model_copy(update={"server": toolcall_server.base_url, "episode_timeout_s": 8.0, "concurrency": 4})

    async def run() -> list[Any]:
        planned = plan_episodes(await ToolCallEnv(ENV_CONFIG).tasks("train"), config)
        async with server_policies(config, "toolcall") as policies:
            return await run_rollouts(lambda: BrokenEnv(ENV_CONFIG), policies, planned, config)

    records = asyncio.run(run())
    errors = {record.seed: record.error for record in records if record.failed}
    assert set(errors) == {1, 2} and "the sandbox went away" in errors[1] and errors[2].startswith("timeout")
    episodes = {episode.episode.seed: episode.episode for group in recorded_groups(run_dir) for episode in group.episodes}
    assert sorted(episodes) == [0, 1, 2, 3]
    assert episodes[1].status == episodes[2].status == "failed" and "the sandbox went away" in (episodes[1].error or "")
    assert episodes[0].status == episodes[3].status == "finished"


START = {"session_id": "ep-1", "env": "toolcall", "task": "t", "group_id": "g", "group_size": 2, "seed": 0}
BAD_STARTS: list[tuple[Any, str | None]] = [
    ({k: v for k, v in START.items() if k != "task"}, "task"),
    (START | {"group_size": 0}, "group_size"),
    (START | {"seed": -1}, "seed"),
    (START | {"seed": "3"}, "seed"),
    (START | {"seed": 2**40}, "seed"),
    (START | {"session_id": ""}, "session_id"),
    (START | {"env": None}, "env"),
    ([START], None),
]
BAD_RESULTS: list[dict[str, Any]] = [
    {},  # finished without an outcome
    {"reward": "high"},
    {"reward": 1.0, "step_rewards": [0.0, "x"]},
    {"reward": 1.0, "final_observation": [{"role": "tool", "content": "1"}]},  # no tool_call_id
    {"reward": 1.0, "final_observation": "1"},
]


@pytest.fixture(scope="module")
def bad_server(toolcall_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    with start_server(toolcall_model_dir, tmp_path_factory.mktemp("bad-episodes")) as running, httpx.Client(base_url=running.base_url, timeout=30) as http:
        yield http


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["code"]
    if param is not None:
        assert error["param"] == param, error


def assert_invalid_json(response: httpx.Response) -> None:
    """A body the JSON parser refused: a 400 error object whose message says why."""
    assert_error(response, 400)
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "invalid_json" and error["type"] == "invalid_request_error" and "digits" in error["message"]


@pytest.mark.parametrize(("body", "param"), BAD_STARTS)
def test_bad_episode_starts_get_a_400_error_object(bad_server: httpx.Client, body: Any, param: str | None) -> None:
    assert_error(bad_server.post("/episodes", json=body), 400, param)


@pytest.mark.parametrize("body", BAD_RESULTS)
def test_bad_episode_results_get_a_400_error_object(bad_server: httpx.Client, body: dict[str, Any]) -> None:
    session_id = f"bad-{uuid.uuid4().hex}"
    assert bad_server.post("/episodes", json=START | {"session_id": session_id}).status_code == 200
    assert_error(bad_server.post(f"/episodes/{session_id}/result", json=body), 400)


def test_episode_endpoints_refuse_what_does_not_fit_the_store(bad_server: httpx.Client) -> None:
    assert_error(bad_server.post("/episodes", content=b"{not json", headers={"content-type": "application/json"}), 400)
    assert_error(bad_server.post("/episodes/nobody/result", json={"reward": 1.0}), 404, "session_id")
    start = START | {"session_id": "ep-twice"}
    assert bad_server.post("/episodes", json=start).json() == {"session_id": "ep-twice", "status": "running"}
    assert_error(bad_server.post("/episodes", json=start), 409, "session_id")
    # no step was recorded in its session: a finished episode with a step reward does not fit it
    assert_error(bad_server.post("/episodes/ep-twice/result", json={"reward": 1.0, "step_rewards": [1.0]}), 400, "step_rewards")
    assert_error(bad_server.post("/episodes/ep-twice/result", content=b'{"reward": NaN}'), 400)
    # json.loads raises ValueError on an integer over 4,300 digits (a 500): refused, and nothing is recorded
    huge = b"1" * 5000
    assert_invalid_json(bad_server.post("/episodes/ep-twice/result", content=b'{"reward": ' + huge + b"}"))
    assert_invalid_json(bad_server.post("/episodes/ep-twice/result", content=b'{"failed": true, "step_rewards": [' + huge + b"]}"))
    start_huge = json.dumps(START | {"session_id": "ep-huge"}).replace('"seed": 0', f'"seed": {huge.decode()}')
    assert_invalid_json(bad_server.post("/episodes", content=start_huge.encode()))
    assert_error(bad_server.post("/episodes/ep-huge/result", json={"reward": 1.0}), 404, "session_id")  # it was not registered
    ended = bad_server.post("/episodes/ep-twice/result", json={"failed": True, "error": "the sandbox went away"})
    assert ended.json() == {"session_id": "ep-twice", "status": "failed", "recorded": True}
    assert_error(bad_server.post("/episodes/ep-twice/result", json={"failed": True}), 409, "session_id")
