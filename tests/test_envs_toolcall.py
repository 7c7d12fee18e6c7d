"""The tool-call family: generated problems, exact answers, in-band tool errors, the sandboxed
python tool, and the scripted policies' scores."""

from __future__ import annotations

import asyncio
import json
from fractions import Fraction

import pytest

from clawrl.config import EnvConfig, RolloutConfig
from clawrl.envs.policies import make_policy
from clawrl.envs.protocol import Action, EpisodeOverError
from clawrl.envs.rollout import plan_episodes, run_rollouts, summarize
from clawrl.envs.sandbox import sandbox_available
from clawrl.envs.toolcall.env import ToolCallEnv
from clawrl.envs.toolcall.problems import final_answer, parse_number, problem, problem_ids

needs_sandbox = pytest.mark.skipif(sandbox_available() is not None, reason=f"no sandbox: {sandbox_available()}")
CONFIG = EnvConfig(max_steps=3, toolcall_train_problems=300, toolcall_eval_problems=60)


def call(name: str, arguments: str, call_id: str = "c1") -> Action:
    return Action.model_validate(
        {"role": "assistant", "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}
    )


def test_splits_are_disjoint_reproducible_and_cover_every_kind_and_level() -> None:
    train, evaluation = problem_ids("train", 300), problem_ids("eval", 60)
    assert problem_ids("train", 300) == train
    assert not set(train) & set(evaluation)
    assert not {problem(p).question for p in train} & {problem(p).question for p in evaluation}
    assert {p.rsplit("-", 2)[0] for p in evaluation} == {"arithmetic", "number_theory", "units", "word"}
    assert {p.rsplit("-", 2)[1] for p in evaluation} == {"1", "2", "3"}
    assert problem(train[7]) == problem(train[7])


def test_a_micro_split_draws_only_its_kinds_and_levels_and_skip_continues_the_same_order() -> None:
    micro = EnvConfig(toolcall_kinds="arithmetic, units", toolcall_levels="1,2", toolcall_eval_problems=40)
    evaluation = asyncio.run(ToolCallEnv(micro).tasks("eval"))
    assert len(evaluation) == 40
    assert {p.rsplit("-", 2)[0] for p in evaluation} == {"arithmetic", "units"}
    assert {p.rsplit("-", 2)[1] for p in evaluation} == {"1", "2"}
    assert all(problem(p).split == "eval" for p in evaluation)
    more = problem_ids("eval", 50, ["arithmetic", "units"], [1, 2])
    assert more[:40] == evaluation and problem_ids("eval", 10, ["arithmetic", "units"], [1, 2], skip=40) == more[40:]
    with pytest.raises(ValueError, match="kinds are arithmetic"):
        problem_ids("eval", 5, ["algebra"])
    with pytest.raises(ValueError, match="levels 1, 2, 3"):
        problem_ids("eval", 5, levels=[4])
    with pytest.raises(ValueError, match="comma-separated"):
        EnvConfig(toolcall_kinds="arithmetic;units")


def test_answers_are_compared_exactly_after_normalisation() -> None:
    assert parse_number("1/2") == parse_number("0.5") == parse_number("2/4") == Fraction(1, 2)
    assert parse_number("2,500 m") == parse_number("$2500") == parse_number("2500.") == 2500
    assert parse_number("-3") == -3
    for wrong in ("about 3", "3 or 4", "1/0", "", "x"):
        assert parse_number(wrong) is None
    assert final_answer("first \\boxed{1}, finally \\boxed{7/12}") == "7/12"
    assert final_answer(" 42 ") == "42"


def test_an_answer_ends_the_episode_with_an_outcome_reward() -> None:
    async def play() -> None:
        env = ToolCallEnv(CONFIG)
        task = (await env.tasks("train"))[0]
        opening = await env.reset(seed=0, task=task)
        assert [m.role for m in opening.messages] == ["system", "user"]
        right = await env.step(Action(content=f"so \\boxed{{{problem(task).answer}}}"))
        assert right.done and right.reward == 1.0 and right.info["correct"]
        with pytest.raises(EpisodeOverError):
            await env.step(Action(content="again"))
        await env.reset(seed=0, task=task)
        wrong = await env.step(Action(content=f"\\boxed{{{problem(task).answer + 1}}}"))
        assert wrong.done and wrong.reward == 0.0
        await env.close()

    asyncio.run(play())


def test_bad_tool_calls_are_answered_in_band_and_the_step_limit_ends_the_episode() -> None:
    async def play() -> None:
        env = ToolCallEnv(CONFIG)
        await env.reset(seed=1)
        replies = []
        for action in (call("search", "{}"), call("python", "{not json"), call("python", '{"source": "print(1)"}')):
            result = await env.step(action)
            replies.append(result.observation.messages[0].content)
        assert replies[0].startswith("error: there is no tool 'search'")
        assert replies[1].startswith("error: the arguments are not valid JSON")
        assert replies[2] == "error: missing argument 'code'"
        assert result.done and result.reward == 0.0 and result.info["truncated"]  # 3 steps: the limit
        assert (await env.state()).step_count == 3

    asyncio.run(play())


@needs_sandbox
def test_the_python_tool_runs_code_in_the_sandbox_and_cuts_long_output() -> None:
    async def play() -> None:
        env = ToolCallEnv(EnvConfig(max_steps=5, tool_output_chars=200, command_timeout_s=2))
        await env.reset(seed=0)
        printed = await env.step(call("python", json.dumps({"code": "import os\nprint(6 * 7, os.getcwd())"})))
        assert printed.observation.messages[0].content == "42 /workspace"
        failed = await env.step(call("python", json.dumps({"code": "print('x' * 5000)\n1 / 0"})))
        text = failed.observation.messages[0].content
        assert "characters cut" in text and "ZeroDivisionError" in text and "[exit code 1]" in text and len(text) < 400
        slow = await env.step(call("python", json.dumps({"code": "while True: pass"})))
        assert "timed out" in slow.observation.messages[0].content
        await env.close()

    asyncio.run(play())


@needs_sandbox
@pytest.mark.parametrize(("policy", "expected"), [("oracle", 1.0), ("random", 0.0)])
def test_scripted_policies_score_as_expected(policy: str, expected: float) -> None:
    config = RolloutConfig(policy=policy, episodes=8, group_size=2, concurrency=2, split="eval")

    async def run() -> dict:
        env = ToolCallEnv(CONFIG)
        planned = plan_episodes(await env.tasks("eval"), config)
        assert len({p.task for p in planned}) == 4 and [p.seed for p in planned] == list(range(8))
        records = await run_rollouts(lambda: ToolCallEnv(CONFIG), lambda e, p: make_policy(policy, e, p.task, p.seed), planned, config)
        return summarize(records)

    summary = asyncio.run(run())
    assert summary["failed"] == 0 and summary["episodes"] == 8
    assert summary["mean_reward"] == pytest.approx(expected, abs=0.25)
