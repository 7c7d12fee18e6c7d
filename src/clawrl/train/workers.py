"""The trainer's data-parallel workers (`--train-workers M`, DESIGN §10): ranks 1..M-1.

The trainer process is rank 0: it alone reads the store, builds samples, publishes versions. It
spawns M-1 worker processes (with `--placement ray`, M-1 Ray actors: `train/ray_workers.py`), each
holding a `TrainedPolicy` identical to its own, joined to it by a torch.distributed group (gloo on
a CPU, NCCL on GPUs, one GPU per rank). Rank 0 drives them with two commands, broadcast as pickled
objects: `Load` (the weights of a version directory, or the starting ones, whenever rank 0 loads
them) and `Step` (the batch: every rank gets all of it and runs its share of the micro-batches,
`update.update_step` with the group). A worker never writes
anything, so a worker that dies costs only the step in progress: rank 0 throws that step away
(nothing is registered, its samples stay ready), starts the group afresh and reloads the serving
version on every rank. Exactly-once training is the store's (`store/training.py`), as for a single
trainer that dies.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from clawrl.config import EngineConfig, LossConfig, TrainConfig
from clawrl.model.device import resolve_device
from clawrl.train.policy import TrainedPolicy
from clawrl.types import StepMetrics, TrainingExample

log = logging.getLogger(__name__)

HOST = "127.0.0.1"  # the group's rendezvous: the workers run beside rank 0 (Ray actors: at rank 0's node address)
# How long a worker waits for rank 0's next command: a trainer idle longer loses its workers and
# starts them again at its next step, which costs a start but nothing else.
IDLE_TIMEOUT = datetime.timedelta(hours=24)
JOIN_TIMEOUT_S = 600.0  # to spawn a worker, import torch and join the group
STOP_TIMEOUT_S = 10.0
DEATH_NOTICE_S = 5.0  # after a collective failed, how long a worker's death may take to be seen
MAX_QUICK_RESTARTS = 3  # group failures in a row, with no step in between, before the trainer gives up


@dataclass(frozen=True)
class Load:
    """Make the weights those of the version directory `path`; None: the starting weights."""

    path: str | None


@dataclass(frozen=True)
class Step:
    """Take the update on `examples` (every rank its share) under the objective `loss`."""

    examples: list[TrainingExample]
    loss: LossConfig


class WorkersLost(RuntimeError):
    """A worker died or the group broke: whatever the ranks were doing is to be thrown away."""


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device, rank: int) -> torch.device:
    """The device of `rank`: a GPU each (round robin over those visible), or the CPU they share."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", rank % torch.cuda.device_count())


class WorkerGroup:
    """Ranks 1..`workers` of the data-parallel trainer, seen from rank 0 (this process).

    The workers are local processes; a subclass places them elsewhere by overriding `_rendezvous_host`,
    `_launch`, `_dead` and `_stop_workers` (`train/ray_workers.py`: Ray actors)."""

    def __init__(self, workers: int, config: TrainConfig, engine_config: EngineConfig, device: torch.device) -> None:
        self.workers, self.config, self.engine_config, self.device = workers, config, engine_config, device
        self.processes: list[BaseProcess] = []
        self.launched = False  # workers were started and not yet stopped
        self.failures = 0  # group failures since the last step the group took
        self.idle = True  # every rank waits for a command (none was cut short): a stop can be sent

    @property
    def world(self) -> int:
        return self.workers + 1

    def start(self) -> None:
        """Spawn the workers and join them in a process group as rank 0 (blocks until they all joined)."""
        host = self._rendezvous_host()
        store = dist.TCPStore(host, 0, self.world, is_master=True, wait_for_workers=False)
        self.launched = True
        self._launch(host, store.port)
        self._wait_until_ready(store)
        dist.init_process_group(_backend(self.device), store=store, rank=0, world_size=self.world, timeout=IDLE_TIMEOUT)
        log.info("data-parallel trainer: %d ranks (%s), workers %s, rendezvous %s:%d", self.world,
                 _backend(self.device), self._worker_names(), host, store.port)  # fmt: skip

    # --- where the workers run: local processes (a subclass overrides these four) ----------------
    def _rendezvous_host(self) -> str:
        """The address the workers reach rank 0's rendezvous at."""
        return HOST

    def _launch(self, host: str, port: int) -> None:
        """Start ranks 1..M-1, each to run `_worker_main(rank, world, host, port, ...)`."""
        context = mp.get_context("spawn")
        self.processes = [
            context.Process(target=_worker_main, args=(rank, self.world, host, port, self.config, self.engine_config),
                            name=f"clawrl-train-rank{rank}", daemon=True)
            for rank in range(1, self.world)
        ]  # fmt: skip
        for process in self.processes:
            process.start()

    def _worker_names(self) -> list[object]:
        return [process.pid for process in self.processes]

    def _dead(self) -> list[tuple[str, object]]:
        """The workers that are gone, each with how it ended (its exit code)."""
        return [(process.name, process.exitcode) for process in self.processes if not process.is_alive()]

    def _stop_workers(self, graceful: bool) -> None:
        """Wait for the workers to end (`graceful`: a while, they were told to stop), killing those that do not."""
        for process in self.processes:
            process.join(STOP_TIMEOUT_S if graceful else 0)
            if process.is_alive():
                process.kill()
                process.join()
        self.processes = []

    def _wait_until_ready(self, store: dist.TCPStore) -> None:
        """Wait for every worker to reach the group's rendezvous, failing at once if one dies on the way
        (joining the group itself would wait for the dead one until its timeout)."""
        keys = [f"ready{rank}" for rank in range(1, self.world)]
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while not store.check(keys):
            self._check_alive()
            if time.monotonic() > deadline:
                raise WorkersLost(f"the data-parallel workers did not start within {JOIN_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def _check_alive(self) -> None:
        dead = self._dead()
        if dead:
            raise WorkersLost(f"data-parallel worker(s) gone: {dead}")

    @contextmanager
    def _collective(self, what: str) -> Iterator[None]:
        """A collective's failure as `WorkersLost` when a worker is gone: gloo and NCCL raise a plain
        RuntimeError for a peer that died. Any other error, with every worker alive, stays itself."""
        try:
            yield
        except RuntimeError as error:
            deadline = time.monotonic() + DEATH_NOTICE_S
            while not self._dead() and time.monotonic() < deadline:
                time.sleep(0.05)
            if not self._dead():
                raise
            raise WorkersLost(f"data-parallel worker(s) {self._dead()} died {what}: {error}") from error

    def _send(self, command: Load | Step | None) -> None:
        self._check_alive()
        self.idle = False
        with self._collective("before a command"):
            dist.broadcast_object_list([command], src=0)
        self.idle = not isinstance(command, Step)  # a step keeps the ranks busy until its collectives end

    def load(self, path: Path | None) -> None:
        """Have every worker load what rank 0 just loaded: the version directory `path`, or the starting weights."""
        self._send(Load(str(path) if path is not None else None))

    def update(self, policy: TrainedPolicy, examples: list[TrainingExample], loss: LossConfig) -> StepMetrics:
        """The update on `examples` taken by all ranks together, rank 0 with `policy`; its figures are the batch's."""
        self._send(Step(examples, loss))
        with self._collective("during a step"):
            metrics = policy.update(examples, loss, dist.group.WORLD)
        self.failures, self.idle = 0, True
        return metrics

    def restart(self, reason: WorkersLost) -> None:
        """Tear the group down and start it afresh; give up (raise) after `MAX_QUICK_RESTARTS` in a row."""
        self.failures += 1
        self.close(graceful=False)
        if self.failures > MAX_QUICK_RESTARTS:
            raise RuntimeError(f"the data-parallel group failed {self.failures} times in a row") from reason
        log.warning("%s; starting the data-parallel workers again (the step in progress is thrown away)", reason)
        self.start()

    def close(self, graceful: bool = True) -> None:
        """Stop the workers (`graceful`: ask them first, if they are waiting for a command: a stop sent
        into a step cut short, by a signal say, would meet a collective it does not match) and leave
        the group."""
        if graceful and self.idle and self.launched and not self._dead():
            try:
                self._send(None)
            except WorkersLost:
                pass  # they are stopped below either way
        if self.launched:
            self._stop_workers(graceful)
        self.launched, self.idle = False, True
        if dist.is_initialized():
            dist.destroy_process_group()


def _receive() -> Load | Step | None:
    box: list[Load | Step | None] = [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _worker_main(rank: int, world: int, host: str, port: int, config: TrainConfig, engine_config: EngineConfig) -> None:
    """A worker process: join the group at rank 0's rendezvous (`host`:`port`), build the policy, then do
    what rank 0 broadcasts until it says stop."""
    if engine_config.cpu_threads:
        torch.set_num_threads(engine_config.cpu_threads)
    device = rank_device(resolve_device(engine_config.device), rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = dist.TCPStore(host, port, world, is_master=False)
    store.set(f"ready{rank}", "1")
    dist.init_process_group(_backend(device), store=store, rank=rank, world_size=world, timeout=IDLE_TIMEOUT)
    policy = TrainedPolicy(config, engine_config, device)
    while (command := _receive()) is not None:
        if isinstance(command, Load) and command.path is None:
            policy.load_initial()
        elif isinstance(command, Load):
            policy.load(Path(command.path))
        else:
            policy.update(command.examples, command.loss, dist.group.WORLD)
    dist.destroy_process_group()
