"""The judge workers of `clawrl serve --placement ray --judge-actors K`, in Ray actors.

Each `JudgeActor` runs what `clawrl judge` runs (`JudgeWorker.run_forever`, `judge/worker.py`) in
its own Ray worker process, on a node Ray picks with `--judge-cpus` and `--judge-gpus` free: its
own store connection, opened from the store settings (the run directory's SQLite file on one
machine, PostgreSQL by `--database-url` across nodes; a node where the SQLite file is not there
fails the actor rather than judging a new empty store), its own backend, and the store's leases, so
that no turn is judged twice. Its worker id is its actor's name (`clawrl-judge-<server pid>-<index>-
<start>`), which its leases and every verdict it writes carry.

`JudgeActors` is the server's side: one supervisor per actor (`TrainerProcess`, as for the
trainer's actor, over a `RayLoop`), so an actor that dies (killed, out of memory, its node lost) or
whose loop fails is started again as a new actor after the same back-off (1 s, 2 s, ... at most a
minute; given up on after five quick failures in a row). The turns a dead actor had leased are
given back at once (`JudgingStore.release_leases`), not after `--judge-lease-s`; a verdict it wrote
before it died stays, and the store's one verdict per turn keeps a late duplicate out.

What an actor has not: the served model. `--judge engine` (or `engine+rule`) without
`--judge-model` judges with it, so it is refused at start (`--judge auto` picks it for a real
model); and hints are not picked by overlap (the teacher's top-k under the served policy): an actor
keeps the longest valid hint, as `clawrl judge` alone does. For either, keep `--judge-actors 0`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
from typing import Any

from clawrl.background import step_back
from clawrl.cli.common import _open_store
from clawrl.cli.ray_loops import RayLoop, actor_location, unplaceable as no_node_for
from clawrl.config import EngineConfig, JudgeConfig, JudgeSettings, ServeSettings
from clawrl.judge.worker import build_worker
from clawrl.logs import LOG_FORMAT_VARIABLE, chosen_format, configure_logging
from clawrl.preflight import StartupError
from clawrl.store import Store
from clawrl.trainer_process import TrainerProcess
from clawrl.types import MemoryFrom

log = logging.getLogger(__name__)

_starts = itertools.count()  # judge actors started by this process: each name, and so each worker id, is new


def unplaceable(config: JudgeConfig) -> str | None:
    """Why no node of the cluster can ever hold one judge actor, or None."""
    flags = f"--judge-cpus {config.judge_cpus:g} --judge-gpus {config.judge_gpus:g}"
    return no_node_for(flags, "a judge actor", config.judge_cpus, config.judge_gpus)


def needs_the_served_model(config: JudgeConfig) -> bool:
    """Whether the backend (as chosen: no `auto`) judges with the served model, which no actor holds."""
    return config.judge in ("engine", "engine+rule") and config.judge_model is None


class JudgeActor:
    """The actor's side: a judge worker over its own store connection, judging until `stop()`."""

    def __init__(self, settings: JudgeSettings, engine_config: EngineConfig, memory_notes: int | None,
                 memory_from: MemoryFrom, worker_id: str, log_format: str | None) -> None:  # fmt: skip
        try:  # the server's store: on a node that does not see the run directory, never a new empty one
            store = _open_store(settings.store, must_exist=True)
        except StartupError as error:  # a SystemExit would end the actor's process without saying why
            raise RuntimeError(f"judge actor {worker_id}: {error.message}") from None
        configure_logging(chosen_format(log_format))  # the server's format, to this worker's log
        step_back(settings.background)  # as `clawrl judge` does: behind serving where they share a node
        self.worker = build_worker(store, settings.judge, None, engine_config, memory_notes=memory_notes,
                                   memory_from=memory_from, worker_id=worker_id)  # fmt: skip
        self._stop = asyncio.Event()

    async def run(self) -> int:
        """Judge until `stop()`; a loop that ends by itself ends the call (its error with it)."""
        assert self.worker is not None  # the server refuses --judge off with --judge-actors
        judging = asyncio.create_task(self.worker.run_forever())
        stopping = asyncio.create_task(self._stop.wait())
        await asyncio.wait([judging, stopping], return_when=asyncio.FIRST_COMPLETED)
        for task in (judging, stopping):
            task.cancel()
        if judging.done() and not judging.cancelled():
            judging.result()
        return 0

    async def stop(self) -> None:
        self._stop.set()

    async def where(self) -> dict[str, Any]:
        return actor_location()


class RayJudge(RayLoop):
    """One judge actor as its supervisor sees it; once it has ended, its leases are given back."""

    def __init__(self, name: str, store: Store, options: dict[str, Any], *args: Any) -> None:
        super().__init__(name, JudgeActor, options, *args)
        self.store = store
        self._released = False

    @property
    def where(self) -> dict[str, Any]:
        return {**super().where, "worker_id": self.name}

    def wait(self, timeout: float | None = None) -> int | str:
        # here, not in `_ended`: `poll` (from /healthz, on the event loop) must not write to the store
        returncode = super().wait(timeout)
        if not self._released:
            self._released = True
            try:
                self.store.judging.release_leases(self.name)
            except Exception:  # noqa: BLE001 - then its leases run out as a killed `clawrl judge`'s do
                log.exception("could not give back the turns of judge actor %s", self.name)
        return returncode


class JudgeActors:
    """K judge actors kept running (`--judge-actors K`); `status()` for /healthz and /metrics."""

    def __init__(self, settings: ServeSettings, judge: JudgeConfig, store: Store) -> None:
        self.store = store
        # the actor judges as `clawrl judge` does, with the backend the server chose (no `auto` left),
        # and builds any judge model of its own in its process (never replicas of the served one)
        self.settings = JudgeSettings(store=settings.store, judge=judge, background=settings.background)
        self.engine_config = settings.engine.model_copy(update={"placement": "local", "replicas": 1})
        self.memory = (settings.serve.memory_limit, settings.serve.memory_from)
        self.options = {"num_cpus": judge.judge_cpus, "num_gpus": judge.judge_gpus}
        self.supervisors = [TrainerProcess(start_trainer=functools.partial(self._start, index), role=f"judge actor {index}")
                            for index in range(judge.judge_actors)]  # fmt: skip

    def _start(self, index: int) -> RayJudge:
        name = f"clawrl-judge-{os.getpid()}-{index}-{next(_starts)}"
        return RayJudge(name, self.store, self.options, self.settings, self.engine_config, *self.memory, name,
                        os.environ.get(LOG_FORMAT_VARIABLE))  # fmt: skip

    def start(self) -> JudgeActors:
        for supervisor in self.supervisors:
            supervisor.start()
        return self

    def status(self) -> dict[str, Any]:
        """How many actors are asked for and alive, how often they were started again, and each one."""
        workers = [supervisor.status() for supervisor in self.supervisors]
        return {"actors": len(workers), "alive": sum(worker["running"] for worker in workers),
                "restarts": sum(worker["restarts"] for worker in workers), "workers": workers}  # fmt: skip

    def stop(self) -> None:
        """Ask every actor to stop (each gets the supervisor's timeout, then is killed); their leases go back."""
        for supervisor in self.supervisors:
            supervisor.stop()
