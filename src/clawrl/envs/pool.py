"""A pool of environments: leased one episode at a time, kept warm between episodes, reaped when idle or lost.

Starting an environment can cost far more than resetting one (a browser, a sandbox with a task
image), so an environment that ended its episode cleanly goes back to the pool *warm* and the
next lease resets it instead of starting another. An environment whose episode failed (a crash,
a timeout, a malformed action) is closed instead: whatever state it is in, the next episode
must not inherit it.

What the pool guarantees:

- **Capacity**: at most `capacity` environments exist at once, leased or warm (the environments
  of one family are interchangeable: a reset picks the task). A lease with all of them leased
  waits up to `wait_s` for one to come back, then fails with `PoolFullError`, whose message says
  how many are leased and what to change.
- **Leases with heartbeats**: a lease is alive while its holder beats (`Lease.heartbeat`; every
  step beats). One not heard from for `lease_timeout_s` is taken back and its environment
  closed, so a holder that died (a client gone, a worker cancelled) does not keep capacity.
- **Idle reaping**: a warm environment unused for `idle_s` is closed. Expiry and idleness are
  checked (`reap`) whenever a lease is asked for.
- **Step timeouts**: `Lease.step` gives up after `step_timeout_s`; the episode is then failed
  and its environment closed on release.

The pool runs on one event loop and needs no lock: every change happens between awaits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from clawrl.envs.protocol import Action, Environment, Observation, StepResult

log = logging.getLogger(__name__)


class PoolFullError(RuntimeError):
    """Every environment the pool may hold is leased, and none came back in time."""


class LeaseExpiredError(RuntimeError):
    """The lease was taken back (no heartbeat in time, or the pool closed): its environment is gone."""


@dataclass
class PoolStats:
    """What the pool has done since it opened."""

    started: int = 0  # environments created
    reused: int = 0  # leases served by a warm environment
    closed: int = 0  # environments closed (failed episodes, reaping, expiry, shutdown)
    expired: int = 0  # leases taken back for want of a heartbeat
    reaped: int = 0  # warm environments closed for being idle


@dataclass(eq=False)
class Lease:
    """One environment lent for one episode; give it back with `EnvPool.release`."""

    pool: EnvPool
    env: Environment
    beat_at: float = field(default_factory=time.monotonic)
    expired: bool = False

    def heartbeat(self) -> None:
        """The holder is alive: keep the lease another `lease_timeout_s`."""
        if self.expired:
            raise LeaseExpiredError("the lease expired before this heartbeat: its environment was closed")
        self.beat_at = time.monotonic()

    async def reset(self, seed: int, task: str | None = None) -> Observation:
        self.heartbeat()
        return await self.env.reset(seed, task)

    async def step(self, action: Action) -> StepResult:
        """One step, within the pool's step timeout (`TimeoutError` past it)."""
        self.heartbeat()
        async with asyncio.timeout(self.pool.step_timeout_s):
            result = await self.env.step(action)
        self.heartbeat()
        return result


class EnvPool:
    """Environments from `make_env`, at most `capacity` at once (see the module docstring)."""

    def __init__(
        self,
        make_env: Callable[[], Environment],
        capacity: int,
        *,
        idle_s: float = 300.0,
        lease_timeout_s: float = 600.0,
        step_timeout_s: float = 120.0,
        wait_s: float = 0.0,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.make_env, self.capacity = make_env, capacity
        self.idle_s, self.lease_timeout_s, self.step_timeout_s, self.wait_s = idle_s, lease_timeout_s, step_timeout_s, wait_s
        self.leased: set[Lease] = set()
        self.warm: list[tuple[Environment, float]] = []  # (environment, when it came back), oldest first
        self.stats = PoolStats()
        self._returned = asyncio.Condition()
        self._closed = False

    @property
    def size(self) -> int:
        """Environments that exist now, leased or warm."""
        return len(self.leased) + len(self.warm)

    async def lease(self) -> Lease:
        """A warm environment if there is one, else a new one; waits up to `wait_s` at capacity."""
        if self._closed:
            raise PoolFullError("the pool is closed")
        await self.reap()
        if self.size >= self.capacity and not self.warm:
            await self._wait_for_room()
        if self.warm:
            env, _returned_at = self.warm.pop()  # the most recently used: the likeliest to be in cache
            self.stats.reused += 1
        else:
            env = self.make_env()
            self.stats.started += 1
        lease = Lease(self, env)
        self.leased.add(lease)
        return lease

    async def _wait_for_room(self) -> None:
        async def room() -> None:
            async with self._returned:
                await self._returned.wait_for(lambda: self.size < self.capacity or bool(self.warm))

        if self.wait_s > 0:
            try:
                await asyncio.wait_for(room(), timeout=self.wait_s)
            except TimeoutError:
                pass
        if self.size >= self.capacity and not self.warm:
            raise PoolFullError(
                f"all {self.capacity} environments are leased (waited {self.wait_s:g}s): lower the concurrency, "
                "raise the pool's capacity, or wait for episodes to end"
            )

    async def release(self, lease: Lease, healthy: bool) -> None:
        """Give `lease` back: warm for the next episode when `healthy`, else closed."""
        if lease not in self.leased:
            return  # expired (already closed) or released twice
        self.leased.discard(lease)
        lease.expired = True  # a lease is used once
        if healthy and not self._closed:
            self.warm.append((lease.env, time.monotonic()))
        else:
            await self._close(lease.env)
        async with self._returned:
            self._returned.notify_all()

    async def reap(self) -> None:
        """Close warm environments idle past `idle_s` and take back leases silent past `lease_timeout_s`."""
        now = time.monotonic()
        idle = [env for env, returned_at in self.warm if now - returned_at > self.idle_s]
        self.warm = [(env, returned_at) for env, returned_at in self.warm if now - returned_at <= self.idle_s]
        lost = [lease for lease in self.leased if now - lease.beat_at > self.lease_timeout_s]
        for lease in lost:
            self.leased.discard(lease)
            lease.expired = True
            log.warning("took back an environment lease silent for %.0fs", now - lease.beat_at)
        self.stats.reaped += len(idle)
        self.stats.expired += len(lost)
        for env in idle + [lease.env for lease in lost]:
            await self._close(env)
        if idle or lost:
            async with self._returned:
                self._returned.notify_all()

    async def close(self) -> None:
        """Close every environment, leased or warm; later leases fail."""
        self._closed = True
        envs = [env for env, _returned_at in self.warm] + [lease.env for lease in self.leased]
        for lease in self.leased:
            lease.expired = True
        self.warm, self.leased = [], set()
        for env in envs:
            await self._close(env)

    async def _close(self, env: Environment) -> None:
        self.stats.closed += 1
        try:
            await env.close()
        except Exception:  # a crashed environment may fail to close; its sandbox cleans up after itself
            log.exception("closing an environment failed")
