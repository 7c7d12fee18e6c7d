"""Serving follows the store's serving pointer: a published or rolled-back version is swapped in.

A background task of the serving process polls the pointer (one small read). When it names a
version other than the one the engine serves, the version's files are checked against the digest
registered in the store and handed to `engine.load_version`, which swaps without pausing: requests
in flight finish on their version, new ones get the new version. A version that fails its check or
its load is not retried until the pointer moves again, and serving carries on with what it has.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram

from clawrl.store import Store
from clawrl.types import SHARED_LINEAGE
from clawrl.versions.files import ChecksumError, verify_version

log = logging.getLogger(__name__)


class Swappable(Protocol):
    """What the follower needs of an engine (`clawrl.engines.base.Engine` is one)."""

    @property
    def policy_version(self) -> int: ...

    async def load_version(self, version: int, path: Path) -> None: ...


class PolicyFollower:
    """Keeps `engine` answering with the version the lineage's serving pointer names."""

    def __init__(self, engine: Swappable, store: Store, registry: CollectorRegistry, poll_s: float,
                 lineage: str = SHARED_LINEAGE) -> None:
        self.engine, self.training, self.poll_s, self.lineage = engine, store.training, poll_s, lineage
        self._failed: int | None = None  # the pointer value whose version could not be loaded
        self.swaps = Counter("clawrl_policy_swaps", "Policy versions swapped into serving", ["reason"], registry=registry)
        self.failures = Counter("clawrl_policy_swap_failures", "Versions that failed their checksum or load", registry=registry)
        self.publish_to_served = Histogram(
            "clawrl_policy_publish_to_served_seconds",
            "From a version's registration in the store to serving answering with it",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.sync()
            except Exception:  # a busy store must not end the loop; the next poll tries again
                log.exception("following the serving pointer failed")

    async def sync(self) -> None:
        """Load the version the pointer names, if serving does not answer with it already."""
        version, reason, row = await asyncio.to_thread(self.training.serving_target, self.lineage)
        if version == self.engine.policy_version or version == self._failed:
            return
        try:
            if row is None:  # the base model never leaves memory: going back to it is a pointer change
                await self.engine.load_version(0, Path())
            else:
                await asyncio.to_thread(verify_version, Path(row.path), row.sha256)
                await self.engine.load_version(version, Path(row.path))
        except (ChecksumError, OSError, ValueError, RuntimeError) as error:
            self._failed = version
            self.failures.inc()
            log.error("not serving policy v%d: %s; still serving v%d", version, error, self.engine.policy_version)
            return
        self._failed = None
        self.swaps.labels(reason).inc()
        if row is not None and reason == "publish":
            self.publish_to_served.observe(max(0.0, time.time() - row.created_at))
        log.info("serving policy v%d (%s)", version, reason)
