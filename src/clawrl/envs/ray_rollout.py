"""`clawrl rollout --placement ray`: the episodes spread over Ray actors (DESIGN §10; issue 34, item 4).

The plan is the one `clawrl rollout` makes here (`rollout.plan_episodes`: the same tasks, seeds and
groups); `--rollout-actors N` actors, placed by Ray (`--actor-cpus` each), each hold their own pool
of `--concurrency` environments and their own policies: a scripted `--policy`, or their own client
of `--server`, so that a step goes from the actor's node to the server and never through this
process. This process hands the next planned episode to whichever actor has a free slot and gets
its record back; the progress line, the JSONL record and the summary are `rollout.play`'s, the
summary with `actors`, the episodes each actor ran, in actor order, and each record with its
`actor`.

Groups span actors: every actor registers its episodes under the run's one id (`group_id =
run_id-group`, as a local run), and the store hands a group to the trainer once all of its
episodes have ended, wherever they ran. This process knows each episode's session
(`server.episode_session_id`), which is what makes an actor's death safe:

- an episode under way on an actor that dies ends as **failed** (`the rollout actor ... died`):
  this process ends it on the server at once, so its group does not wait for it, and it is never
  played again, since its turns may already be recorded; a run again would be a second episode
  of one planned episode in its group. Should the actor have ended it itself just before it died
  (its result posted, its record not yet back here: episodes that share a batch on the server end
  together, so this is common), the server's result stands (the episode trains as it ended) and
  the record here is failed all the same, its error saying so: this process lost the record, not
  the store the episode;
- an episode the dead actor never registered (the server does not know its session) is played
  again by another actor, under the same session id: should the dead actor's registration still
  land, the second registration is refused and that episode fails, so it is recorded once;
- the episodes not yet handed out go to the actors left; with none left they end as failed
  (`no rollout actor is left`).

With a scripted policy nothing is registered: the episodes under way on a dead actor fail.

Ray is an optional extra (`pip install 'clawrl[ray]'`); only this module imports it. Without
`RAY_ADDRESS` a Ray cluster starts on this machine; with it, the run joins that cluster.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections import deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from clawrl.config import EnvConfig, RolloutConfig
from clawrl.envs.policies import make_policy
from clawrl.envs.pool import EnvPool
from clawrl.envs.records import EpisodeRecord, PlannedEpisode
from clawrl.envs.registry import make_environment
from clawrl.envs.rollout import PolicyFactory, play, play_planned
from clawrl.envs.server import ServerPolicies, end_as_failed, episode_session_id, server_policies

log = logging.getLogger(__name__)

ACTOR_PREFIX = "clawrl-rollout"  # actors are named `clawrl-rollout-<run id>-<index>` (`ray list actors`)
ENDED_FIRST = "its result stands in the store; this record lost it"


class RolloutActorError(RuntimeError):
    """The rollout's actors could not start (the server unreachable from a node, an environment that cannot be made)."""


def connect_ray() -> None:
    """Join the cluster at RAY_ADDRESS, or start one on this machine; once per process."""
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, include_dashboard=False)


class RolloutActor:
    """One actor's side: its own pool of environments and its own policies, one episode per `play` call."""

    def __init__(self, env_config: EnvConfig, config: RolloutConfig, run_id: str) -> None:
        self.env_config, self.config, self.run_id = env_config, config, run_id
        self.pool: EnvPool | None = None
        self.policies: AbstractAsyncContextManager[ServerPolicies] | None = None
        self.policy_for: PolicyFactory | None = None

    async def start(self) -> dict[str, Any]:
        """Open the pool and reach the server; where it runs (node id, process id)."""
        config = self.config
        self.pool = EnvPool(lambda: make_environment(self.env_config), config.concurrency, step_timeout_s=config.step_timeout_s,
                            lease_timeout_s=config.episode_timeout_s + 60)  # fmt: skip
        if config.server is None:
            assert config.policy is not None
            name = config.policy
            self.policy_for = lambda env, planned: make_policy(name, env, planned.task, planned.seed)
        else:
            self.policies = server_policies(config, self.env_config.env, self.run_id)
            self.policy_for = await self.policies.__aenter__()
        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    async def play(self, planned: PlannedEpisode) -> EpisodeRecord:
        """Play one planned episode; never raises for what goes wrong inside it (rollout.run_episode)."""
        assert self.pool is not None and self.policy_for is not None, "start() first"
        lease = await self.pool.lease()
        record = await play_planned(lease, self.policy_for, planned, self.config.episode_timeout_s)
        await self.pool.release(lease, healthy=not record.failed)
        return record

    async def close(self) -> None:
        if self.policies is not None:
            await self.policies.__aexit__(None, None, None)
        if self.pool is not None:
            await self.pool.close()


async def rollout_on_ray(env_config: EnvConfig, config: RolloutConfig) -> dict[str, Any]:
    """`clawrl rollout --placement ray`: `rollout.rollout`'s summary, with `placement` and `actors`."""
    actors: list[int] = []
    summary = await play(env_config, config, lambda planned, done: run_on_ray(env_config, config, planned, done, actors))
    player = {"policy": config.policy} if config.server is None else {"server": config.server}
    return {**summary, **player, "placement": "ray", "actors": actors}


async def run_on_ray(
    env_config: EnvConfig,
    config: RolloutConfig,
    planned: list[PlannedEpisode],
    on_episode: Callable[[EpisodeRecord], None] = lambda _record: None,
    actor_counts: list[int] | None = None,
) -> list[EpisodeRecord]:
    """Play every planned episode on `config.rollout_actors` actors, `config.concurrency` at a time on each;
    records in plan order (see the module doc for an actor that dies). `actor_counts` is filled with the
    episodes each actor ran."""
    connect_ray()
    run_id = uuid.uuid4().hex[:12]
    actor_class = ray.remote(RolloutActor)
    count = min(config.rollout_actors, len(planned))
    actors = [actor_class.options(num_cpus=config.actor_cpus, name=f"{ACTOR_PREFIX}-{run_id}-{index}")
              .remote(env_config, config, run_id) for index in range(count)]  # fmt: skip
    try:
        await asyncio.gather(*(actor.start.remote() for actor in actors))
    except RayError as error:
        for actor in actors:
            ray.kill(actor)
        raise RolloutActorError(f"a rollout actor failed to start: {_cause(error)}") from None
    queue: deque[tuple[int, PlannedEpisode]] = deque(enumerate(planned))
    records: list[EpisodeRecord | None] = [None] * len(planned)
    alive, played = [True] * count, [0] * count

    def done(index: int, record: EpisodeRecord) -> None:
        records[index] = record
        on_episode(record)

    async def slot(number: int) -> None:
        actor = actors[number]
        while queue and alive[number]:
            index, episode = queue.popleft()
            try:
                record = await actor.play.remote(episode)
            except RayActorError as error:
                alive[number] = False
                reason = f"the rollout actor {number} died: {type(error).__name__}"
                outcome = await _lost(config, run_id, episode, reason)
                if outcome == "unregistered" and any(alive):
                    log.info("episode %d (seed %d) never reached the server from dead actor %d: played again elsewhere",
                             index, episode.seed, number)  # fmt: skip
                    queue.appendleft((index, episode))  # it never reached the server: another actor plays it
                    continue
                if outcome == "ended":
                    reason += f"; it had ended the episode first ({ENDED_FIRST})"
                record = EpisodeRecord(episode.task, episode.seed, episode.group, failed=True, error=reason)
            except RayError as error:  # the call failed, not the actor (an episode's own failures are in its record)
                record = EpisodeRecord(episode.task, episode.seed, episode.group, failed=True, error=_cause(error))
            else:
                played[number] += 1
            record.actor = number
            done(index, record)

    try:
        while queue and any(alive):  # again when an actor's death put an episode back after the others' slots ended
            await asyncio.gather(*(slot(number) for number in range(count) if alive[number] for _ in range(config.concurrency)))
        while queue:  # every actor died before these were handed out
            index, episode = queue.popleft()
            done(index, EpisodeRecord(episode.task, episode.seed, episode.group, failed=True, error="no rollout actor is left"))
    finally:
        await _close(actors, alive)
    if actor_counts is not None:
        actor_counts[:] = played
    return [record for record in records if record is not None]


async def _lost(config: RolloutConfig, run_id: str, episode: PlannedEpisode, reason: str) -> str:
    """End on the server an episode whose actor died: `failed`, `ended` (the actor ended it first) or
    `unregistered` (it never reached the server); `unknown` with a scripted policy or the eval split."""
    if config.server is None or config.split == "eval":
        return "unknown"
    session_id = episode_session_id(run_id, episode)
    try:
        return (await end_as_failed(config, [session_id], reason))[session_id]
    except Exception as error:  # noqa: BLE001 - the server is unreachable: the episode waits for its abandonment
        log.warning("could not end episode %s of a dead rollout actor on the server: %s", session_id, error)
        return "unknown"


async def _close(actors: list[Any], alive: list[bool]) -> None:
    """Close the actors' pools and clients (15 s at most), then end the actors."""
    closing = [actor.close.remote() for actor, living in zip(actors, alive, strict=True) if living]
    try:
        await asyncio.wait_for(asyncio.gather(*closing, return_exceptions=True), 15)
    except TimeoutError:
        pass
    for actor in actors:
        ray.kill(actor)


def _cause(error: BaseException) -> str:
    """The error an actor raised, as its type and message (Ray wraps it with a traceback)."""
    cause = getattr(error, "cause", None)
    return f"{type(cause).__name__}: {cause}" if cause is not None else f"{type(error).__name__}: {str(error)[:300]}"
