"""Running episodes: tasks drawn from a split, G episodes per task, C at a time.

`plan_episodes` draws the tasks (seeded: the same flags give the same episodes) and gives episode
k the seed `seed + k`. `run_rollouts` plays them with C workers on a pool of C environments
(`pool.EnvPool`: an environment runs one episode at a time, leased for it, and goes back warm
for the next episode's reset). An episode ends as *failed*, with the reason in `error`, when its
environment or policy raises, when a step runs past `step_timeout_s` or the episode past
`episode_timeout_s`, or when the policy's message is not a well-formed assistant message; its
environment is then closed rather than reused (the next lease starts a fresh one) and the worker
goes on, so one bad episode never stops the others. Failed
episodes are kept out of training and out of `mean_reward`. A policy that is `Finishing` (the
server-backed one) is told how each of its episodes ended, the failed ones too.

`rollout` is `clawrl rollout`: a scripted policy (`--policy`) or the model of a clawrl server
(`--server`, `server.py`), a progress line and a JSONL record of the episodes; with `--placement
ray`, `ray_rollout.py` plays the same plan on Ray actors, through the same `play`.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from pydantic import ValidationError

from clawrl.config import EnvConfig, RolloutConfig
from clawrl.envs.policies import Finishing, Policy, make_policy
from clawrl.envs.pool import EnvPool, Lease
from clawrl.envs.protocol import Action, Environment
from clawrl.envs.records import EpisodeRecord, PlannedEpisode
from clawrl.envs.registry import make_environment
from clawrl.envs.server import server_policies

PolicyFactory = Callable[[Environment, PlannedEpisode], Awaitable[Policy]]  # the policy of one planned episode


def plan_episodes(tasks: list[str], config: RolloutConfig) -> list[PlannedEpisode]:
    """`config.episodes` episodes in groups of `config.group_size` per drawn task (the last group may be short)."""
    if not tasks:
        raise ValueError(f"the {config.split} split has no tasks")
    rng = random.Random(config.seed)
    groups = math.ceil(config.episodes / config.group_size)
    # distinct tasks while the split has enough of them, then repeats
    drawn = rng.sample(tasks, groups) if groups <= len(tasks) else rng.choices(tasks, k=groups)
    planned = [(task, group) for group, task in enumerate(drawn) for _ in range(config.group_size)][: config.episodes]
    sizes = Counter(group for _task, group in planned)
    return [PlannedEpisode(task, config.seed + index, group, sizes[group]) for index, (task, group) in enumerate(planned)]


async def run_episode(lease: Lease, policy: Policy, planned: PlannedEpisode, timeout_s: float) -> EpisodeRecord:
    """Play one episode to its end on `lease`; never raises for what goes wrong inside it (see the module doc)."""
    record = EpisodeRecord(planned.task, planned.seed, planned.group)
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            await _play(lease, policy, record)
    except TimeoutError:
        record.failed, record.error = True, f"timeout: the episode ran past {timeout_s:g}s"
    except Exception as error:  # an environment or policy crash ends this episode only
        record.failed, record.error = True, f"{type(error).__name__}: {error}"
    record.elapsed_s = round(time.monotonic() - started, 3)
    return record


async def _play(lease: Lease, policy: Policy, record: EpisodeRecord) -> None:
    observation = await lease.reset(record.seed, record.task)
    record.messages = [message.to_openai() for message in observation.messages]
    tools = observation.tools
    while True:
        reply = await policy(list(record.messages), tools)
        try:
            action = Action.model_validate(reply)
        except ValidationError as error:
            record.messages.append(reply)
            record.failed, record.error = True, f"malformed action: {error.errors()[0]['msg']} at {error.errors()[0]['loc']}"
            return
        record.messages.append(action.to_message().to_openai())
        try:
            result = await lease.step(action)
        except TimeoutError:
            record.failed, record.error = True, f"timeout: a step ran past {lease.pool.step_timeout_s:g}s"
            return
        record.steps += 1
        record.step_rewards.append(result.reward)
        record.messages.extend(message.to_openai() for message in result.observation.messages)
        if result.done:
            record.reward, record.info = result.reward, result.info
            return


async def run_rollouts(
    make_env: Callable[[], Environment],
    policy_for: PolicyFactory,
    planned: list[PlannedEpisode],
    config: RolloutConfig,
    on_episode: Callable[[EpisodeRecord], None] = lambda _record: None,
) -> list[EpisodeRecord]:
    """Play every planned episode, `config.concurrency` at a time; records in plan order."""
    queue: asyncio.Queue[tuple[int, PlannedEpisode]] = asyncio.Queue()
    for item in enumerate(planned):
        queue.put_nowait(item)
    records: list[EpisodeRecord | None] = [None] * len(planned)

    workers = min(config.concurrency, len(planned))
    # the episode timeout bounds a lease's silence too: a holder is never quiet longer than its episode
    pool = EnvPool(make_env, workers, step_timeout_s=config.step_timeout_s, lease_timeout_s=config.episode_timeout_s + 60)

    async def worker() -> None:
        while not queue.empty():
            index, episode = queue.get_nowait()
            lease = await pool.lease()
            record = await play_planned(lease, policy_for, episode, config.episode_timeout_s)
            await pool.release(lease, healthy=not record.failed)
            records[index] = record
            on_episode(record)

    try:
        await asyncio.gather(*(worker() for _ in range(workers)))
    finally:
        await pool.close()
    return [record for record in records if record is not None]


async def play_planned(lease: Lease, policy_for: PolicyFactory, episode: PlannedEpisode, timeout_s: float) -> EpisodeRecord:
    """One planned episode on `lease` with the policy `policy_for` gives it, told how it ended when it is `Finishing`."""
    try:
        policy = await policy_for(lease.env, episode)
    except Exception as error:
        return EpisodeRecord(episode.task, episode.seed, episode.group, failed=True, error=f"{type(error).__name__}: {error}")
    record = await run_episode(lease, policy, episode, timeout_s)
    if isinstance(policy, Finishing):
        try:
            await policy.finish(record)
        except Exception as error:  # the episode's result never reached its recipient: not a usable episode
            record.failed, record.error = True, f"recording the episode failed: {type(error).__name__}: {error}"
    return record


def summarize(records: list[EpisodeRecord]) -> dict[str, Any]:
    """Counts and the mean reward of the episodes that did not fail (None when all failed)."""
    finished = [record for record in records if not record.failed]
    return {
        "episodes": len(records),
        "failed": len(records) - len(finished),
        "mean_reward": round(sum(r.reward for r in finished) / len(finished), 4) if finished else None,
        "groups": len({record.group for record in records}),
        "mean_steps": round(sum(r.steps for r in finished) / len(finished), 2) if finished else None,
    }


async def rollout(env_config: EnvConfig, config: RolloutConfig) -> dict[str, Any]:
    """`clawrl rollout`: the episodes played in this process by the scripted `--policy` or by the model
    at `--server` (`--placement ray` is `ray_rollout.rollout_on_ray`)."""
    if config.placement != "local":
        raise ValueError(f"rollout() plays in this process; --placement {config.placement} is ray_rollout.rollout_on_ray")
    if config.server is None:
        assert config.policy is not None
        name = config.policy
        summary = await play_here(env_config, config, lambda env, planned: make_policy(name, env, planned.task, planned.seed))
        return {**summary, "policy": name}
    async with server_policies(config, env_config.env) as policies:
        return {**await play_here(env_config, config, policies), "server": config.server}


async def play_here(env_config: EnvConfig, config: RolloutConfig, policy_for: PolicyFactory) -> dict[str, Any]:
    """`play` with the episodes run in this process."""
    return await play(env_config, config, lambda planned, done: run_rollouts(lambda: make_environment(env_config), policy_for,
                                                                             planned, config, done))  # fmt: skip


Runner = Callable[[list[PlannedEpisode], Callable[[EpisodeRecord], None]], Awaitable[list[EpisodeRecord]]]


async def play(env_config: EnvConfig, config: RolloutConfig, run: Runner) -> dict[str, Any]:
    """Plan `clawrl rollout`'s episodes and have `run` play them, with a progress line and the JSONL record;
    returns the summary."""
    started = time.monotonic()
    planned = plan_episodes(await make_environment(env_config).tasks(config.split), config)
    progress = RolloutProgress(len(planned), config.record.open("a") if config.record else None)
    try:
        records = await run(planned, progress.episode_done)
    finally:
        progress.finish()
    elapsed = time.monotonic() - started
    return {**summarize(records), "env": env_config.env, "split": config.split, "elapsed_s": round(elapsed, 2),
            "episodes_per_min": round(60 * len(records) / elapsed, 1)}  # fmt: skip


class RolloutProgress:
    """A progress line on stderr, and the JSONL record of each episode as it finishes."""

    def __init__(self, total: int, record_file: TextIO | None) -> None:
        self.total, self.record_file = total, record_file
        self.done = self.failed = 0
        self.reward = 0.0

    def episode_done(self, record: EpisodeRecord) -> None:
        self.done += 1
        self.failed += record.failed
        self.reward += 0.0 if record.failed else record.reward
        if self.record_file is not None:
            self.record_file.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
            self.record_file.flush()  # a record per finished episode survives an interrupted run
        finished = self.done - self.failed
        mean = f"{self.reward / finished:.3f}" if finished else "-"
        sys.stderr.write(f"\rrollout: {self.done}/{self.total} episodes, {self.failed} failed, mean reward {mean}")
        sys.stderr.flush()

    def finish(self) -> None:
        sys.stderr.write("\n")
        if self.record_file is not None:
            self.record_file.close()
