"""Running episodes: tasks drawn from a split, G episodes per task, C at a time.

`plan_episodes` draws the tasks (seeded: the same flags give the same episodes) and gives episode
k the seed `seed + k`. `run_rollouts` plays them with C workers, each owning one environment (an
environment runs one episode at a time). An episode ends as *failed*, with the reason in
`error`, when its environment or policy raises, when it runs past `episode_timeout_s`, or when the
policy's message is not a well-formed assistant message; the worker then closes its environment
(the next reset starts clean) and goes on, so one bad episode never stops the others. Failed
episodes are kept out of training and out of `mean_reward`.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ValidationError

from clawrl.config import RolloutConfig
from clawrl.envs.protocol import Action, Environment
from clawrl.envs.policies import Policy
from clawrl.types import Message

PolicyFactory = Callable[[Environment, str, int], Awaitable[Policy]]  # (env, task, seed) -> the episode's policy


@dataclass(frozen=True)
class PlannedEpisode:
    task: str
    seed: int
    group: int  # episodes of one group share the task (GRPO's group of rollouts)


@dataclass
class EpisodeRecord:
    """One played episode, as the JSONL record holds it."""

    task: str
    seed: int
    group: int
    steps: int = 0
    reward: float = 0.0
    failed: bool = False
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def plan_episodes(tasks: list[str], config: RolloutConfig) -> list[PlannedEpisode]:
    """`config.episodes` episodes in groups of `config.group_size` per drawn task (the last group may be short)."""
    if not tasks:
        raise ValueError(f"the {config.split} split has no tasks")
    rng = random.Random(config.seed)
    groups = math.ceil(config.episodes / config.group_size)
    # distinct tasks while the split has enough of them, then repeats
    drawn = rng.sample(tasks, groups) if groups <= len(tasks) else rng.choices(tasks, k=groups)
    planned = [PlannedEpisode(task, 0, group) for group, task in enumerate(drawn) for _ in range(config.group_size)]
    return [PlannedEpisode(p.task, config.seed + index, p.group) for index, p in enumerate(planned[: config.episodes])]


async def run_episode(env: Environment, policy: Policy, planned: PlannedEpisode, timeout_s: float) -> EpisodeRecord:
    """Play one episode to its end; never raises for what goes wrong inside it (see the module doc)."""
    record = EpisodeRecord(planned.task, planned.seed, planned.group)
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            await _play(env, policy, record)
    except TimeoutError:
        record.failed, record.error = True, f"timeout: the episode ran past {timeout_s:g}s"
    except Exception as error:  # an environment or policy crash ends this episode only
        record.failed, record.error = True, f"{type(error).__name__}: {error}"
    record.elapsed_s = round(time.monotonic() - started, 3)
    return record


async def _play(env: Environment, policy: Policy, record: EpisodeRecord) -> None:
    observation = await env.reset(record.seed, record.task)
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
        result = await env.step(action)
        record.steps += 1
        record.messages.extend(message.to_openai() for message in result.observation.messages)
        if result.done:
            record.reward, record.info = result.reward, result.info
            return


async def run_rollouts(
    make_env: Callable[[], Environment],
    make_policy: PolicyFactory,
    planned: list[PlannedEpisode],
    config: RolloutConfig,
    on_episode: Callable[[EpisodeRecord], None] = lambda _record: None,
) -> list[EpisodeRecord]:
    """Play every planned episode, `config.concurrency` at a time; records in plan order."""
    queue: asyncio.Queue[tuple[int, PlannedEpisode]] = asyncio.Queue()
    for item in enumerate(planned):
        queue.put_nowait(item)
    records: list[EpisodeRecord | None] = [None] * len(planned)

    async def worker() -> None:
        env = make_env()
        try:
            while not queue.empty():
                index, episode = queue.get_nowait()
                record = await _policy_episode(env, make_policy, episode, config.episode_timeout_s)
                if record.failed:
                    await _close_quietly(env)
                records[index] = record
                on_episode(record)
        finally:
            await _close_quietly(env)

    await asyncio.gather(*(worker() for _ in range(min(config.concurrency, len(planned)))))
    return [record for record in records if record is not None]


async def _policy_episode(env: Environment, make_policy: PolicyFactory, episode: PlannedEpisode, timeout_s: float) -> EpisodeRecord:
    try:
        policy = await make_policy(env, episode.task, episode.seed)
    except Exception as error:
        return EpisodeRecord(episode.task, episode.seed, episode.group, failed=True, error=f"{type(error).__name__}: {error}")
    return await run_episode(env, policy, episode, timeout_s)


async def _close_quietly(env: Environment) -> None:
    try:
        await env.close()
    except Exception:  # a crashed environment may fail to close; the next reset rebuilds it
        pass


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
