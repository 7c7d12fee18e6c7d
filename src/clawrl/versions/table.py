"""The versions an engine holds: which one each lineage's new requests get, which ones requests still use.

Every engine keeps the same small table (DESIGN §7: a swap never pauses serving). Version 0, the
base model, is installed when the engine starts and never retired. Installing a version makes it
its lineage's current one: requests of that lineage admitted from then on get it, while requests
already running keep the version they were admitted with. A version that is neither the current
one of a lineage nor in use is retired: `retire_unused` hands it back for the engine to free
(drop an adapter, unload a model, forget its cached prefixes).

Lineages (DESIGN §12): the shared one (`current`) is always held; with per-user adapters every
user has one too, and an engine holds only the most recently used of them: beyond `max_loaded`
held versions, the least recently used lineage's current version is retired as well once no
request uses it, and the lineage is no longer held until its version is loaded again.

"In use" is counted by pins (`pin` when a request takes a version, `unpin` when it ends) plus
whatever the caller names: an engine whose scheduler already knows which versions its queued and
running requests hold passes that set instead of counting twice.

The table is not thread-safe; each engine guards it the way it guards its own state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Generic, TypeVar

from clawrl.types import SHARED_LINEAGE

Held = TypeVar("Held")  # what an engine keeps per version: a model and adapter name, a served model id


class LineageNotLoadedError(ValueError):
    """The lineage's current version is not loaded (never loaded, or evicted): load it first."""


class VersionTable(Generic[Held]):
    def __init__(self) -> None:
        self._held: dict[int, Held] = {}
        self._pins: Counter[int] = Counter()
        # each lineage's current version, least recently used first (a dict keeps insertion order)
        self._current: dict[str, int] = {SHARED_LINEAGE: 0}

    @property
    def current(self) -> int:
        """The shared lineage's current version."""
        return self._current[SHARED_LINEAGE]

    def __contains__(self, version: object) -> bool:
        return version in self._held

    def items(self) -> list[tuple[int, Held]]:
        """Every version held now, with what holds it."""
        return list(self._held.items())

    def get(self, version: int) -> Held:
        """What serves `version`; ValueError when it is not held (never loaded, or retired)."""
        held = self._held.get(version)
        if held is None:
            raise ValueError(f"policy version {version} is not loaded")
        return held

    def current_of(self, lineage: str) -> int | None:
        """The lineage's current version, None when the lineage is not held."""
        return self._current.get(lineage)

    def use(self, lineage: str) -> int:
        """The lineage's current version for a new request, marking the lineage the most recently used."""
        version = self._current.pop(lineage, None)
        if version is None:
            raise LineageNotLoadedError(f"no version of lineage {lineage!r} is loaded")
        self._current[lineage] = version
        return version

    def install(self, version: int, held: Held, lineage: str = SHARED_LINEAGE) -> None:
        """Hold `held` for `version` (one already held for it wins) and make it the lineage's current one."""
        self._held.setdefault(version, held)
        self._current.pop(lineage, None)
        self._current[lineage] = version

    def make_current(self, version: int, lineage: str = SHARED_LINEAGE) -> None:
        """Make a version that is still held the lineage's current one (a rollback to it, or to the base)."""
        self.get(version)
        self._current.pop(lineage, None)
        self._current[lineage] = version

    def pin(self, version: int) -> Held:
        """A request takes `version`: it stays held until the matching `unpin`."""
        held = self.get(version)
        self._pins[version] += 1
        return held

    def unpin(self, version: int) -> None:
        self._pins[version] -= 1
        if self._pins[version] <= 0:
            del self._pins[version]

    def retire_unused(self, also_in_use: Collection[int] = (), max_loaded: int | None = None) -> list[tuple[int, Held]]:
        """Remove and return every version that is not the base, not pinned, not in `also_in_use` and
        not the current one of a lineage, oldest first; with `max_loaded`, then also the current
        versions of the least recently used lineages (never the shared one's, never one in use)
        while more than `max_loaded` versions besides the base would stay held."""
        in_use = {0, *self._pins, *also_in_use}
        wanted = set(self._current.values())
        retired = [version for version in self._held if version not in in_use and version not in wanted]
        if max_loaded is not None:
            kept = len(self._held) - len(retired) - (0 in self._held)
            for lineage, version in list(self._current.items()):  # least recently used first
                if kept <= max_loaded:
                    break
                if lineage == SHARED_LINEAGE or version in in_use:  # a lineage at the base costs nothing either
                    continue
                del self._current[lineage]
                if version not in self._current.values():  # no other lineage is at it (a rollback can share one)
                    retired.append(version)
                    kept -= 1
        return [(version, self._held.pop(version)) for version in retired]
