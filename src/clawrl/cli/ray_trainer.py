"""The trainer of `clawrl serve --placement ray` in a Ray actor.

`TrainerActor` runs what `clawrl train` runs (`loops.run_trainer`, handed over as `run`, as
`engines/ray_replica.py` hands its actor the engine's factory) in its own Ray worker process,
on a node Ray picks with `--trainer-cpus` and `--trainer-gpus` free; with `--train-workers M` it
starts its ranks 1..M-1 as Ray actors of their own (`train/ray_workers.py`), which it owns. The
server's `TrainerProcess` supervises it through `RayTrainer`, a `RayLoop` (`cli/ray_loops.py`: a
handle with the surface of the `subprocess.Popen` it supervises otherwise): an actor that dies
(killed, out of memory, its node lost) or whose trainer fails is started again after the same
back-off, as a new actor, and resumes from the serving version with the samples still ready; nothing is trained twice, because a version
and its samples are registered in one store transaction. Ray ends the actor (and its ranks) when
the server's process ends: it owns them.

A stop is asked, not signalled: the trainer stops between two rounds (a step in progress is
finished and published), and an actor still running after the supervisor's stop timeout is killed
(that step is lost, its samples stay ready). Ray is imported only with `--placement ray`.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from typing import Any

from clawrl.cli.ray_loops import RayLoop, actor_location, unplaceable as no_node_for
from clawrl.config import TrainConfig, TrainSettings
from clawrl.logs import LOG_FORMAT_VARIABLE, chosen_format, configure_logging

_starts = itertools.count()  # trainer actors started by this process: each name is new

# `run(settings, stop=event)`: the trainer until the event is set; returns the exit status
RunTrainer = Callable[..., int]


def unplaceable(config: TrainConfig) -> str | None:
    """Why no node of the cluster can ever hold one rank of the trainer (`--trainer-cpus` and
    `--trainer-gpus` on one node), or None: such an actor would wait for its node forever."""
    flags = f"--trainer-cpus {config.trainer_cpus:g} --trainer-gpus {config.trainer_gpus:g}"
    return no_node_for(flags, "the trainer's actor", config.trainer_cpus, config.trainer_gpus)


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
        return actor_location()


class RayTrainer(RayLoop):
    """A trainer actor, started at once, as `TrainerProcess` sees a trainer (`trainer_process.TrainerHandle`)."""

    def __init__(self, run: RunTrainer, settings: TrainSettings) -> None:
        config = settings.train
        # two calls at once: `run` for the whole life of the trainer, and `stop` or `where` beside it
        options = {"num_cpus": config.trainer_cpus, "num_gpus": config.trainer_gpus, "max_concurrency": 2}
        super().__init__(f"clawrl-trainer-{os.getpid()}-{next(_starts)}", TrainerActor, options,
                         run, settings, os.environ.get(LOG_FORMAT_VARIABLE))  # fmt: skip
