"""The trainer of `clawrl serve --placement ray` in a Ray actor.

`TrainerActor` runs what `clawrl train` runs (`loops.run_trainer`, handed over as `run`, as
`engines/ray_replica.py` hands its actor the engine's factory) in its own Ray worker process,
on a node Ray picks with `--trainer-cpus` and `--trainer-gpus` free; with `--train-workers M` it
starts its ranks 1..M-1 as Ray actors of their own (`train/ray_workers.py`), which it owns. The
server's `TrainerProcess` supervises it through `RayTrainer`, a handle with the surface of the
`subprocess.Popen` it supervises otherwise: an actor that dies (killed, out of memory, its node
lost) or whose trainer fails is started again after the same back-off, as a new actor, and resumes
from the serving version with the samples still ready; nothing is trained twice, because a version
and its samples are registered in one store transaction. Ray ends the actor (and its ranks) when
the server's process ends: it owns them.

A stop is asked, not signalled: the trainer stops between two rounds (a step in progress is
finished and published), and an actor still running after the supervisor's stop timeout is killed
(that step is lost, its samples stay ready). Ray is imported by this module alone, only with
`--placement ray`.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from clawrl.config import TrainConfig, TrainSettings
from clawrl.engines.ray_replica import connect_ray
from clawrl.logs import LOG_FORMAT_VARIABLE, chosen_format, configure_logging

_starts = itertools.count()  # trainer actors started by this process: each name is new

# `run(settings, stop=event)`: the trainer until the event is set; returns the exit status
RunTrainer = Callable[..., int]


def unplaceable(config: TrainConfig) -> str | None:
    """Why no node of the cluster can ever hold one rank of the trainer (`--trainer-cpus` and
    `--trainer-gpus` on one node), or None: such an actor would wait for its node forever."""
    connect_ray()
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    wanted = {"CPU": config.trainer_cpus, "GPU": config.trainer_gpus}
    if any(all(node.get(kind, 0.0) >= amount for kind, amount in wanted.items()) for node in nodes):
        return None
    shapes = sorted({f"{node.get('CPU', 0.0):g} CPUs, {node.get('GPU', 0.0):g} GPUs" for node in nodes})
    return (f"--trainer-cpus {config.trainer_cpus:g} --trainer-gpus {config.trainer_gpus:g}: no node of the Ray cluster "
            f"has that much for the trainer's actor (its nodes: {'; '.join(shapes) or 'none'})")


class TrainerActor:
    """The actor's side: the trainer loop in this process until `stop()`."""

    def __init__(self, run: RunTrainer, settings: TrainSettings, log_format: str | None) -> None:
        configure_logging(chosen_format(log_format))  # the server's format, to this worker's log
        self._run, self.settings = run, settings
        self._stop = threading.Event()

    def run(self) -> int:
        return self._run(self.settings, stop=self._stop)

    def stop(self) -> None:
        self._stop.set()

    def where(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "node": ray.util.get_node_ip_address(),
                "actor": ray.get_runtime_context().get_actor_id()}


class RayTrainer:
    """A trainer actor, started at once, as `TrainerProcess` sees a trainer (`trainer_process.TrainerHandle`)."""

    def __init__(self, run: RunTrainer, settings: TrainSettings) -> None:
        connect_ray()
        config = settings.train
        # two calls at once: `run` for the whole life of the trainer, and `stop` or `where` beside it
        self.name = f"clawrl-trainer-{os.getpid()}-{next(_starts)}"  # `ray list actors` tells it by name
        actor_class = ray.remote(TrainerActor).options(name=self.name, num_cpus=config.trainer_cpus,
                                                       num_gpus=config.trainer_gpus, max_concurrency=2)  # fmt: skip
        self.actor = actor_class.remote(run, settings, os.environ.get(LOG_FORMAT_VARIABLE))
        self._run = self.actor.run.remote()
        self._where = self.actor.where.remote()
        self._found: dict[str, Any] | None = None
        self.returncode: int | str | None = None

    @property
    def description(self) -> str:
        return f"Ray actor {self.name}, pid {self.pid}" if self.pid else f"Ray actor {self.name}"

    def _located(self) -> dict[str, Any] | None:
        """The actor's pid and node, once it has started (without waiting for it)."""
        if self._found is None and ray.wait([self._where], timeout=0)[0]:
            try:
                self._found = ray.get(self._where)
            except RayError:
                self._found = {}  # it died before it said
        return self._found

    @property
    def pid(self) -> int | None:
        return (self._located() or {}).get("pid")

    @property
    def where(self) -> dict[str, Any]:
        """What `/healthz` adds for a trainer actor: its id and its node's address."""
        found = self._located() or {}
        return {"actor": found.get("actor"), "node": found.get("node")}

    def poll(self) -> int | str | None:
        if self.returncode is None and ray.wait([self._run], timeout=0)[0]:
            self._ended()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | str:
        if self.returncode is None:
            if not ray.wait([self._run], timeout=timeout)[0]:
                raise subprocess.TimeoutExpired(self.name, timeout or 0)
            self._ended()
        assert self.returncode is not None
        return self.returncode

    def _ended(self) -> None:
        try:
            self.returncode = ray.get(self._run)
        except RayActorError as error:
            self.returncode = f"the actor died: {str(error).splitlines()[0][:300]}"
        except RayError as error:  # the trainer raised: a bad setting, a store that cannot be opened, ...
            self.returncode = f"the trainer failed: {str(error)[-600:]}"
        ray.kill(self.actor, no_restart=True)  # its ranks go with it; its CPUs and GPUs are free for the next

    def terminate(self) -> None:
        try:
            self.actor.stop.remote()
        except RayError:
            pass  # gone already

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)
