"""Serving follows the store's serving pointers: a published or rolled-back version is swapped in.

A background task of the serving process polls the pointer (one small read). When it names a
version other than the one the engine serves, the version's files are checked against the digest
registered in the store and handed to `engine.load_version`, which swaps without pausing: requests
in flight finish on their version, new ones get the new version. A version that fails its check or
its load is not retried until the pointer moves again, and serving carries on with what it has.

With a lineage per user (`--adapters per-user`) the poll reads every lineage's pointer at once and
swaps the lineages the engine holds; a lineage the engine does not hold (a user's first request,
or one whose adapter was evicted) is loaded when a request needs it (`ready`), so a thousand users
cost one read a poll and only the adapters in use are in memory. A lineage whose pointer is gone
(its user was forgotten: `versions/forgetting.py`) is put back at the base model at the next poll,
or at once by `drop` in the process that forgot it: the engine retires its version when no request
uses it any more, and the user, if they still have a key, starts again from the base.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram

from clawrl.store import Store
from clawrl.types import SHARED_LINEAGE, PointerReason, PolicyVersion
from clawrl.versions.files import ChecksumError, verify_version

log = logging.getLogger(__name__)


class Swappable(Protocol):
    """What the follower needs of an engine (`clawrl.engines.base.Engine` is one)."""

    @property
    def policy_version(self) -> int: ...

    def lineage_version(self, lineage: str) -> int | None: ...

    async def load_version(self, version: int, path: Path, lineage: str = SHARED_LINEAGE) -> None: ...


Target = tuple[int, PointerReason, PolicyVersion | None]  # a pointer: its version, why it moved, its row


class PolicyFollower:
    """Keeps `engine` answering each lineage with the version its serving pointer names."""

    def __init__(self, engine: Swappable, store: Store, registry: CollectorRegistry, poll_s: float,
                 per_user: bool = False) -> None:
        self.engine, self.training, self.poll_s, self.per_user = engine, store.training, poll_s, per_user
        self._targets: dict[str, Target] = {}  # per-user: every lineage's pointer at the last poll
        self._failed: dict[str, int] = {}  # per lineage, the pointer value whose version could not be loaded
        self._loading: dict[str, asyncio.Lock] = {}  # one load per lineage at a time
        self._served: set[str] = set()  # per-user: the lineages this follower swapped to a version other than the base
        self.swaps = Counter("clawrl_policy_swaps", "Policy versions swapped into serving", ["reason"], registry=registry)
        self.failures = Counter("clawrl_policy_swap_failures", "Versions that failed their checksum or load", registry=registry)
        self.publish_to_served = Histogram(
            "clawrl_policy_publish_to_served_seconds",
            "From a version's registration in the store to serving answering with it",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )

    def lineage_for(self, user_id: str) -> str:
        """The lineage that answers `user_id`'s requests: their own, or the shared one."""
        return user_id if self.per_user else SHARED_LINEAGE

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.sync()
            except Exception:  # a busy store must not end the loop; the next poll tries again
                log.exception("following the serving pointer failed")

    async def sync(self) -> None:
        """Load the version each held lineage's pointer names, where serving does not answer with it already."""
        if not self.per_user:
            await self._follow(SHARED_LINEAGE, await asyncio.to_thread(self.training.serving_target, SHARED_LINEAGE))
            return
        self._targets = await asyncio.to_thread(self.training.serving_targets)
        for lineage in self._served - self._targets.keys():
            await self.drop(lineage)
        for lineage, target in list(self._targets.items()):
            if self.engine.lineage_version(lineage) is not None:
                await self._follow(lineage, target)

    async def drop(self, lineage: str) -> None:
        """Answer `lineage` with the base model from now on: its pointer is gone, and with it its versions."""
        self._targets.pop(lineage, None)
        self._failed.pop(lineage, None)
        self._served.discard(lineage)
        if self.engine.lineage_version(lineage) not in (None, 0):
            await self.engine.load_version(0, Path(), lineage)
            log.info("serving the base model to %s: its lineage was forgotten", lineage)

    async def ready(self, lineage: str) -> None:
        """Have the engine hold `lineage` at its pointer's version before a request of it is
        started: a no-op when it does (the shared lineage always does: the engine starts with it)."""
        if self._holds(lineage):
            return
        async with self._loading.setdefault(lineage, asyncio.Lock()):
            if self._holds(lineage):  # loaded by the request that held the lock before
                return
            target = self._targets.get(lineage)
            if target is None:  # a lineage new since the last poll, or none yet (the base model)
                target = await asyncio.to_thread(self.training.serving_target, lineage)
            await self._follow(lineage, target)
            if self.engine.lineage_version(lineage) is None and self._failed.get(lineage) == target[0]:
                await self.engine.load_version(0, Path(), lineage)  # its version failed: the base, until the pointer moves
            # else held, or loaded and evicted at once by other users' loads: the caller's request finds
            # it gone (LineageNotLoadedError) and asks again; never the base in its place

    def _holds(self, lineage: str) -> bool:
        held = self.engine.lineage_version(lineage)
        if held is None:
            return False
        target = self._targets.get(lineage)
        return target is None or target[0] in (held, self._failed.get(lineage))

    async def _follow(self, lineage: str, target: Target) -> None:
        version, reason, row = target
        if version == self.engine.lineage_version(lineage) or version == self._failed.get(lineage):
            return
        try:
            if row is None:  # the base model never leaves memory: going back to it is a pointer change
                await self.engine.load_version(0, Path(), lineage)
            else:
                await asyncio.to_thread(verify_version, Path(row.path), row.sha256)
                await self.engine.load_version(version, Path(row.path), lineage)
        except (ChecksumError, OSError, ValueError, RuntimeError) as error:
            self._failed[lineage] = version
            self.failures.inc()
            log.error("not serving policy v%d to %s: %s; still serving v%s", version, lineage, error,
                      self.engine.lineage_version(lineage))  # fmt: skip
            return
        self._failed.pop(lineage, None)
        if row is None:
            self._served.discard(lineage)
        else:
            self._served.add(lineage)
        self.swaps.labels(reason).inc()
        if row is not None and reason == "publish":
            self.publish_to_served.observe(max(0.0, time.time() - row.created_at))
        log.info("serving policy v%d to %s (%s)", version, lineage, reason)
