"""`clawrl rollout --placement ray`: episodes of the tool-call family spread over two Ray actors on a
local cluster (one for the module: a start costs seconds), each with its own pool of environments
and its own client of a real server (the tiny model). The episodes must be recorded once each, in
the groups a local run forms, rewarded once; an actor killed mid-run fails the episodes it had
under way (ended in the store at once, unless it had ended them first), one given to an actor
already dead is played by the other, and the actor left plays the rest."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from pydantic import ValidationError
from sqlalchemy import select

from clawrl.config import EnvConfig, RolloutConfig
from clawrl.envs.ray_rollout import ACTOR_PREFIX, ENDED_FIRST, rollout_on_ray, run_on_ray
from clawrl.envs.records import EpisodeRecord
from clawrl.envs.rollout import plan_episodes, rollout, summarize
from clawrl.envs.toolcall.env import ToolCallEnv
from clawrl.serve.runner import ServerThread
from clawrl.store import Store
from clawrl.store.schema import EpisodeRow
from clawrl.train.episodes import EpisodeSampleBuilder
from tests.helpers import start_server, wait_until

ENV = EnvConfig(max_steps=2, toolcall_train_problems=50)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def server(tiny_model_dir: Path, run_dir: Path) -> Iterator[ServerThread]:
    with start_server(tiny_model_dir, run_dir) as running:
        yield running


def rollout_config(server: ServerThread, **changes: Any) -> RolloutConfig:
    settings = {"server": server.base_url, "episodes": 8, "group_size": 2, "concurrency": 2, "temperature": 0.0,
                "max_tokens": 16, "placement": "ray", "rollout_actors": 2, "actor_cpus": 1.0} | changes  # fmt: skip
    return RolloutConfig(**settings)


def episode_rows(store: Store) -> list[Any]:
    with store.read() as db:
        return list(db.scalars(select(EpisodeRow)))


def test_episodes_spread_over_two_actors_are_recorded_once_grouped_and_rewarded_as_locally(
    ray_cluster: None, server: ServerThread, run_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = rollout_config(server)
    summary = asyncio.run(rollout_on_ray(ENV, config))
    assert summary["episodes"] == 8 and summary["failed"] == 0 and summary["groups"] == 4
    assert summary["placement"] == "ray" and sum(summary["actors"]) == 8 and min(summary["actors"]) >= 1, summary["actors"]
    # the summary has the local run's shape, with where it ran
    local_summary = asyncio.run(rollout(ENV, config.model_copy(update={"placement": "local"})))
    assert set(summary) == set(local_summary) | {"placement", "actors"}

    store = Store.for_run_dir(run_dir)
    groups = store.episodes.groups_to_sample(100)  # every group: none has a sample yet
    # two runs of one plan: each of its episodes recorded once per run, in the plan's groups
    plan = plan_episodes(asyncio.run(ToolCallEnv(ENV).tasks("train")), config)
    planned_groups = sorted(sorted((p.task, p.seed) for p in plan if p.group == group) for group in range(4))
    recorded_groups = sorted(sorted((p.episode.task, p.episode.seed) for p in group.episodes) for group in groups)
    assert recorded_groups == sorted(planned_groups * 2), "the ray run's groups are the local run's"
    rows = episode_rows(store)
    assert len(rows) == 16 and len({row.session_id for row in rows}) == 16 and {row.status for row in rows} == {"finished"}
    placed = [row for row in rows if row.session_id == f"episode-{row.group_id.rsplit('-', 1)[0]}-{row.seed}"]
    assert len(placed) == 8 and len({row.group_id for row in placed}) == 4, "the ray run's episodes, by their run id"

    # rewarded once: every step of every episode gets its one sample, and a second pass writes nothing
    builder = EpisodeSampleBuilder(store.episodes, store.training, "rl", gamma=0.5, judge_coef=0.0)
    steps = [step.turn.id for group in groups for episode in group.episodes for step in episode.steps]
    assert steps and builder.build(limit=100) == len(steps) and builder.build(limit=100) == 0
    assert set(store.training.samples_for(steps)) == set(steps)
    assert store.episodes.groups_to_sample(100) == []


def test_an_actor_killed_mid_run_fails_the_episodes_it_had_under_way_and_the_other_plays_the_rest(
    ray_cluster: None, server: ServerThread, run_dir: Path
) -> None:
    config = rollout_config(server, episodes=12, max_tokens=48)
    plan = plan_episodes(asyncio.run(ToolCallEnv(ENV).tasks("train")), config)
    killed: list[str] = []

    def kill_actor_zero_under_way() -> None:
        """Once two episodes have ended and four run (each actor's two slots busy, registered), kill actor 0."""
        store = Store.for_run_dir(run_dir)

        def busy() -> bool:
            statuses = [row.status for row in episode_rows(store)]
            return len(statuses) - statuses.count("running") >= 2 and statuses.count("running") == 4

        wait_until(busy, 60, "both actors busy", every=0.005)
        (name,) = [name for name in ray.util.list_named_actors() if name.startswith(ACTOR_PREFIX) and name.endswith("-0")]
        ray.kill(ray.get_actor(name))
        killed.append(name)

    counts: list[int] = []
    killer = threading.Thread(target=kill_actor_zero_under_way)
    killer.start()
    records = asyncio.run(run_on_ray(ENV, config, plan, actor_counts=counts))
    killer.join()
    assert killed
    assert sorted(record.seed for record in records) == [p.seed for p in plan], "every planned episode once, none twice"
    failed = [record for record in records if record.failed]
    assert 1 <= len(failed) <= config.concurrency, [record.error for record in records]
    assert all(record.error.startswith("the rollout actor 0 died") for record in failed)
    assert counts[1] > counts[0] and sum(counts) + len(failed) == 12
    assert summarize(records)["failed"] == len(failed)
    assert len([record for record in failed if ENDED_FIRST not in record.error]) >= 1, "an episode under way failed"

    # in the store: each episode once
    store = Store.for_run_dir(run_dir)
    rows = episode_rows(store)
    episodes = {row.seed: row for row in rows}
    assert len(rows) == 12 and sorted(episodes) == [p.seed for p in plan]
    # the ones under way are failed by the run (not left running); one the actor had ended first stands as it ended
    ended_first = {record.seed for record in failed if ENDED_FIRST in record.error}
    assert {seed for seed, row in episodes.items() if row.status == "failed"} == {record.seed for record in failed} - ended_first
    assert all(episodes[record.seed].error == record.error for record in failed if record.seed not in ended_first)
    assert {row.status for seed, row in episodes.items() if seed not in {r.seed for r in failed} - ended_first} == {"finished"}
    # the groups with a failed episode still train, once: its steps are dropped, the others sampled
    builder = EpisodeSampleBuilder(store.episodes, store.training, "rl", gamma=0.5, judge_coef=0.0)
    assert builder.build(limit=100) > 0 and builder.build(limit=100) == 0
    assert store.episodes.groups_to_sample(100) == []


def test_an_episode_given_to_an_actor_already_dead_is_played_by_the_other_once(
    ray_cluster: None, server: ServerThread, run_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="clawrl.envs.ray_rollout")
    config = rollout_config(server, episodes=16)
    plan = plan_episodes(asyncio.run(ToolCallEnv(ENV).tasks("train")), config)
    killed: list[str] = []
    seen: list[EpisodeRecord] = []

    def kill_actor_zero_at_its_first_record(record: EpisodeRecord) -> None:
        """Kill actor 0 when it hands back an episode and wait until Ray knows it dead: the slot that
        handed it back gives its next episode (if one is left) to a dead actor, which never registers it."""
        seen.append(record)
        if killed or record.actor != 0:
            return
        assert len(seen) + 3 < len(plan), "actor 0 came back only after the last episode was handed out"
        (name,) = [name for name in ray.util.list_named_actors() if name.startswith(ACTOR_PREFIX) and name.endswith("-0")]
        actor = ray.get_actor(name)
        ray.kill(actor)
        with pytest.raises(ray.exceptions.RayActorError):
            for _ in range(100):
                ray.get(actor.__ray_ready__.remote(), timeout=30)
                time.sleep(0.05)
        killed.append(name)

    counts: list[int] = []
    records = asyncio.run(run_on_ray(ENV, config, plan, kill_actor_zero_at_its_first_record, counts))
    assert killed
    replayed = [message for message in caplog.messages if "played again elsewhere" in message]
    assert replayed, caplog.messages
    assert sorted(record.seed for record in records) == [p.seed for p in plan]
    assert sum(counts) + sum(record.failed for record in records) == 16 and counts[0] >= 1
    rows = episode_rows(Store.for_run_dir(run_dir))
    assert sorted(row.seed for row in rows) == [p.seed for p in plan], "the one played again is registered once"
    played_again = {record.seed for record in records if record.actor == 1 and not record.failed}
    assert all(row.status == "finished" for row in rows if row.seed in played_again)


def test_bad_placement_settings_are_refused_with_what_to_change() -> None:
    with pytest.raises(ValidationError, match="placement"):
        RolloutConfig(policy="oracle", placement="cluster")
    with pytest.raises(ValidationError, match="rollout_actors"):
        RolloutConfig(policy="oracle", placement="ray", rollout_actors=0)
    with pytest.raises(ValueError, match="rollout_on_ray"):
        asyncio.run(rollout(ENV, RolloutConfig(policy="oracle", placement="ray")))


def test_the_command_joins_the_cluster_at_ray_address_and_a_local_run_imports_no_ray(ray_cluster: None) -> None:
    environment = os.environ | {"RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    flags = ["rollout", "--env", "toolcall", "--policy", "oracle", "--episodes", "4", "--group-size", "2", "--max-steps", "3",
             "--toolcall-train-problems", "50", "--json"]  # fmt: skip
    placed = subprocess.run([sys.executable, "-m", "clawrl.cli", *flags, "--placement", "ray", "--rollout-actors", "2"],
                            capture_output=True, text=True, timeout=60, env=environment)  # fmt: skip
    assert placed.returncode == 0, placed.stderr
    summary = json.loads(placed.stdout)
    assert summary["episodes"] == 4 and summary["failed"] == 0 and summary["mean_reward"] == 1.0  # the oracle solves each
    assert summary["placement"] == "ray" and sum(summary["actors"]) == 4
    # the embedded default: the same command in this process's way, and Ray never imported
    local = ("import runpy, sys; sys.argv = ['clawrl', *sys.argv[1:]]\ntry: runpy.run_module('clawrl.cli', run_name='__main__')\n"
             "except SystemExit as end: assert end.code == 0, end\nassert 'ray' not in sys.modules, 'ray was imported'")  # fmt: skip
    here = subprocess.run([sys.executable, "-c", local, *flags], capture_output=True, text=True, timeout=60)
    assert here.returncode == 0, here.stderr
    assert {key: value for key, value in json.loads(here.stdout).items() if key in ("episodes", "failed", "mean_reward")} == {
        key: summary[key] for key in ("episodes", "failed", "mean_reward")}  # fmt: skip
    bad = subprocess.run([sys.executable, "-m", "clawrl.cli", *flags, "--placement", "ray", "--rollout-actors", "0"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode != 0 and "rollout-actors" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
