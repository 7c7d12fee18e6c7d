"""A replica whose actor died is started again and brought back into rotation (`--replica-restarts`).

Under `--placement ray` a replica is an actor (`engines/ray_replica.py`), and an actor dies for
reasons that are not the replica's settings' fault: it was killed, its node ran out of memory or
was lost. The trainer's and the judges' actors are started again when they die; this does the same
for the replicas the router (`engines/replicas.py`) took out, so a server does not run on with one
replica fewer until it is restarted. What it asks of a replica (`Revivable`): whether its process
died (a replica taken out for any other reason, a failed load of a version that is not as its
manifest says, say, stays out), and a way to start a new one with the same settings.

For each death: the trainer's back-off (`clawrl.restarts`: 1 s, 2 s, ... at most a minute), a new
actor started, then the router's `readmit`, which loads on it every lineage's version the replicas
in rotation serve and only then puts it back; a start or a catch-up that fails, or a death within a
minute of coming back, is a quick failure, and after `--replica-restarts` of them in a row the
replica is given up on (an error in the log; it stays out, the others serve). In-process replicas
(`--placement local`) and servers at `--engine-url` are never restarted: an engine in the server's
process that failed shares its process's fate, and a server clawrl did not start is its operator's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from clawrl.restarts import RestartBackoff

logger = logging.getLogger(__name__)


@runtime_checkable
class Revivable(Protocol):
    """A replica that can be started again in a process of its own (`RayReplica`)."""

    @property
    def died(self) -> bool: ...

    async def restart(self) -> None: ...

    async def close(self) -> None: ...


class ReplicaRestarts:
    """The restarts of a router's replicas: one task per replica being brought back, and per replica
    its back-off, how many times it came back and whether it was given up on."""

    def __init__(self, readmit: Callable[[int], Awaitable[None]], max_quick_failures: int) -> None:
        """`readmit(index)`: catch the restarted replica up with the versions served and put it back
        into rotation (raises when it cannot). `max_quick_failures` 0: never restart."""
        self._readmit = readmit
        self.max_quick_failures = max_quick_failures
        self.restarts: dict[int, int] = {}  # per replica, the times it came back into rotation
        self.given_up: set[int] = set()
        self._backoffs: dict[int, RestartBackoff] = {}
        self._back_since: dict[int, float] = {}  # when each restarted replica came back (quick deaths count)
        self._tasks: dict[int, asyncio.Task[None]] = {}

    def taken_out(self, index: int, replica: object) -> None:
        """The router took replica `index` out: start bringing it back if its process died."""
        if not (self.max_quick_failures and isinstance(replica, Revivable) and replica.died):
            return
        if index in self._tasks or index in self.given_up:
            return
        task = asyncio.get_running_loop().create_task(self._bring_back(index, replica))
        self._tasks[index] = task
        task.add_done_callback(lambda _: self._tasks.pop(index, None))

    def status(self, index: int) -> dict[str, int | bool]:
        """How many times replica `index` came back, and whether it was given up on."""
        return {"restarts": self.restarts.get(index, 0), "given_up": index in self.given_up}

    def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()

    async def _bring_back(self, index: int, replica: Revivable) -> None:
        backoff = self._backoffs.setdefault(index, RestartBackoff(self.max_quick_failures))
        ran_s = time.monotonic() - self._back_since.get(index, float("-inf"))  # never restarted: it ran long
        why = "its actor died"
        while True:
            pause_s = backoff.pause_after_failure(ran_s)
            if pause_s is None:
                logger.error("replica %d failed %d times in a row within %.0f s of a start (last: %s); not starting it "
                             "again: the other replicas serve", index, backoff.quick_failures, backoff.healthy_after_s, why)  # fmt: skip
                self.given_up.add(index)
                await replica.close()  # what is left of its last actor frees its node's GPUs and CPUs
                return
            logger.warning("replica %d out of rotation (%s); starting a new actor for it in %.0f s", index, why, pause_s)
            await asyncio.sleep(pause_s)
            try:
                await replica.restart()
                await self._readmit(index)
            except Exception as error:  # noqa: BLE001 - it could not start or catch up: a quick failure, the back-off goes on
                why = f"could not bring it back: {type(error).__name__}: {str(error)[:300]}"
                ran_s = 0.0
                continue
            self._back_since[index] = time.monotonic()
            self.restarts[index] = self.restarts.get(index, 0) + 1
            return
