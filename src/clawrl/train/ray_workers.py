"""The trainer's data-parallel workers as Ray actors (`--placement ray --train-workers M`).

The same group as `train/workers.py`, placed by Ray: ranks 1..M-1 are `RankActor`s, each reserving
`--trainer-cpus` and `--trainer-gpus` (one GPU each on a GPU cluster: Ray then makes that GPU the
only one the actor sees), each running the worker's command loop (`_worker_main`). They join rank
0's group at the address of rank 0's node (`ray.util.get_node_ip_address()`), not 127.0.0.1, so
they may run on any node that reaches it. Rank 0 is the trainer itself: under `clawrl serve
--placement ray`, a Ray actor too (`cli/ray_trainer.py`), which then owns the rank actors (Ray
ends them when it ends); under `clawrl train --placement ray`, the trainer process, which joins the
cluster at RAY_ADDRESS or starts one on this machine.

A rank actor that dies (killed, out of memory, its node lost) ends its `run` call with an error,
which is how rank 0 tells a dead worker from a bug, as it does for a process's exit code; the
group is then started again with new actors (`WorkerGroup.restart`). Version directories are read
by every rank from the path rank 0 loads, so the run directory must be on a filesystem every node
mounts. Ray is imported by this module alone, and only with `--placement ray`.
"""

from __future__ import annotations

import itertools
import logging
import os
from typing import Any

import ray

from clawrl.config import EngineConfig, TrainConfig
from clawrl.train.workers import STOP_TIMEOUT_S, WorkerGroup, _worker_main

log = logging.getLogger(__name__)

_groups = itertools.count()  # each start of a group in this process: its actors' names are new


def connect_ray() -> None:
    """Join the cluster at RAY_ADDRESS, or start one on this machine; nothing when connected (in an actor)."""
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, include_dashboard=False)


class RankActor:
    """One worker rank in its Ray actor; `run` returns when rank 0 says stop."""

    def run(self, rank: int, world: int, host: str, port: int, config: TrainConfig, engine_config: EngineConfig) -> None:
        _worker_main(rank, world, host, port, config, engine_config)


class RayWorkerGroup(WorkerGroup):
    """`WorkerGroup` with ranks 1..M-1 in Ray actors; see the module docstring."""

    def __init__(self, workers: int, config: TrainConfig, engine_config: EngineConfig, device: Any) -> None:
        super().__init__(workers, config, engine_config, device)
        self.actors: list[Any] = []  # the rank actors, their `run` calls and names, in rank order
        self.runs: list[Any] = []
        self.names: list[str] = []

    def _rendezvous_host(self) -> str:
        connect_ray()
        return str(ray.util.get_node_ip_address())

    def _launch(self, host: str, port: int) -> None:
        group = next(_groups)
        actor_class = ray.remote(RankActor)
        for rank in range(1, self.world):
            # named so that `ray list actors` (and a test) can tell them; unique per process and start
            name = f"clawrl-train-rank{rank}-{os.getpid()}-{group}"
            actor = actor_class.options(name=name, num_cpus=self.config.trainer_cpus,
                                        num_gpus=self.config.trainer_gpus).remote()  # fmt: skip
            self.actors.append(actor)
            self.names.append(name)
            self.runs.append(actor.run.remote(rank, self.world, host, port, self.config, self.engine_config))

    def _worker_names(self) -> list[object]:
        return list(self.names)

    def _dead(self) -> list[tuple[str, object]]:
        """The rank actors whose `run` ended: a worker ends it only when told to stop, or by dying."""
        if not self.runs:
            return []
        ended, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        return [(name, _ending(run)) for name, run in zip(self.names, self.runs, strict=True) if run in ended]

    def _stop_workers(self, graceful: bool) -> None:
        if graceful and self.runs:
            ray.wait(self.runs, num_returns=len(self.runs), timeout=STOP_TIMEOUT_S)
        for actor in self.actors:
            ray.kill(actor, no_restart=True)  # frees its resources; after a stop it has nothing left to do
        self.actors, self.runs, self.names = [], [], []


def _ending(run: Any) -> str:
    try:
        ray.get(run, timeout=0)
    except ray.exceptions.RayActorError as error:
        return f"the actor died ({type(error).__name__})"
    except ray.exceptions.RayError as error:
        return f"failed: {str(error)[:300]}"
    return "stopped"
