"""The environment pool (`clawrl.envs.pool`) on the real tool-call environment: warm reuse, capacity
with a clear error, leases taken back without heartbeats, idle reaping, step timeouts, and the
rollouts that run on it keeping their environments warm and closing the ones a failure touched."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from clawrl.config import EnvConfig, RolloutConfig
from clawrl.envs.policies import make_policy
from clawrl.envs.pool import EnvPool, LeaseExpiredError, PoolFullError
from clawrl.envs.protocol import Action
from clawrl.envs.rollout import plan_episodes, run_rollouts, summarize
from clawrl.envs.toolcall.env import ToolCallEnv
from clawrl.envs.toolcall.problems import problem

ENV_CONFIG = EnvConfig(toolcall_train_problems=20)


class CountedEnv(ToolCallEnv):
    """The tool-call environment, counting how many were made and how often the pool closed one
    (not the environment itself, which closes its sandbox when an episode starts and ends), with an
    optional slow step."""

    made: list[CountedEnv] = []
    step_delay_s = 0.0

    def __init__(self) -> None:
        super().__init__(ENV_CONFIG)
        self.closes, self._inside = 0, False
        CountedEnv.made.append(self)

    async def reset(self, seed: int, task: str | None = None) -> Any:
        self._inside = True
        try:
            return await super().reset(seed, task)
        finally:
            self._inside = False

    async def step(self, action: Any) -> Any:
        await asyncio.sleep(self.step_delay_s)
        self._inside = True
        try:
            return await super().step(action)
        finally:
            self._inside = False

    async def close(self) -> None:
        self.closes += not self._inside
        await super().close()


@pytest.fixture(autouse=True)
def fresh_counts() -> None:
    CountedEnv.made, CountedEnv.step_delay_s = [], 0.0


def answer(task: str) -> Action:
    return Action.model_validate({"role": "assistant", "content": f"\\boxed{{{problem(task).answer}}}"})


def test_an_environment_that_ended_cleanly_is_reused_and_a_failed_one_is_closed() -> None:
    async def run() -> None:
        pool = EnvPool(CountedEnv, capacity=2)
        task = (await CountedEnv().tasks("train"))[0]
        CountedEnv.made.clear()
        first = await pool.lease()
        await first.reset(0, task)
        assert (await first.step(answer(task))).reward == 1.0
        await pool.release(first, healthy=True)
        second = await pool.lease()
        assert second.env is first.env and pool.stats.reused == 1 and pool.stats.started == 1
        await second.reset(1, task)  # a warm environment starts the next episode afresh
        assert (await second.step(answer(task))).reward == 1.0
        await pool.release(second, healthy=False)
        assert first.env.closes == 1 and pool.size == 0
        third = await pool.lease()
        assert third.env is not first.env and pool.stats.started == 2
        await pool.close()
        assert third.env.closes == 1 and len(CountedEnv.made) == 2
        with pytest.raises(PoolFullError, match="closed"):
            await pool.lease()

    asyncio.run(run())


def test_at_capacity_a_lease_waits_then_fails_with_a_clear_error() -> None:
    async def run() -> None:
        pool = EnvPool(CountedEnv, capacity=1, wait_s=0.2)
        held = await pool.lease()
        with pytest.raises(PoolFullError, match="all 1 environments are leased .*concurrency"):
            await pool.lease()

        async def give_back_soon() -> None:
            await asyncio.sleep(0.05)
            await pool.release(held, healthy=True)

        giving = asyncio.create_task(give_back_soon())
        waited = await pool.lease()  # the environment came back within wait_s
        await giving
        assert waited.env is held.env and pool.size == 1
        await pool.close()

    asyncio.run(run())


def test_a_silent_lease_is_taken_back_and_an_idle_environment_is_reaped() -> None:
    async def run() -> None:
        pool = EnvPool(CountedEnv, capacity=1, lease_timeout_s=0.1, idle_s=0.1)
        lost = await pool.lease()
        await asyncio.sleep(0.15)
        replacement = await pool.lease()  # leasing reaps first: the silent holder's environment is closed
        assert lost.env.closes == 1 and pool.stats.expired == 1 and replacement.env is not lost.env
        with pytest.raises(LeaseExpiredError):
            lost.heartbeat()
        await pool.release(lost, healthy=True)  # a late release of a taken-back lease changes nothing
        assert pool.size == 1
        await pool.release(replacement, healthy=True)
        await asyncio.sleep(0.15)
        await pool.reap()
        assert pool.size == 0 and pool.stats.reaped == 1 and replacement.env.closes == 1

    asyncio.run(run())


def test_rollouts_reuse_warm_environments_and_a_slow_step_fails_only_its_episode() -> None:
    async def run(delay_s: float, step_timeout_s: float) -> list:
        config = RolloutConfig(policy="oracle", episodes=6, concurrency=2, step_timeout_s=step_timeout_s)
        CountedEnv.step_delay_s = delay_s
        planned = plan_episodes(await ToolCallEnv(ENV_CONFIG).tasks("train"), config)
        CountedEnv.made.clear()
        policies = lambda env, episode: make_policy("oracle", env, episode.task, episode.seed)  # noqa: E731
        return await run_rollouts(CountedEnv, policies, planned, config)

    records = asyncio.run(run(0.0, step_timeout_s=120))
    assert summarize(records)["failed"] == 0 and summarize(records)["mean_reward"] == 1.0
    assert len(CountedEnv.made) == 2  # six episodes on two warm environments
    assert all(env.closes == 1 for env in CountedEnv.made)  # closed once, when the rollout ended

    records = asyncio.run(run(5.0, step_timeout_s=0.5))
    assert all(record.failed and "a step ran past 0.5s" in record.error for record in records)
    assert len(CountedEnv.made) == 6  # a failed episode's environment is never reused
