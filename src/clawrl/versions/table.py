"""The versions an engine holds: which one new requests get, which ones requests still use.

Every engine keeps the same small table (DESIGN §7: a swap never pauses serving). Version 0, the
base model, is installed when the engine starts and never retired. Installing a version makes it current: requests admitted from then on
get it, while requests already running keep the version they were admitted with. A version that
is neither current nor in use is retired: `retire_unused` hands it back for the engine to free
(drop an adapter, unload a model, forget its cached prefixes).

"In use" is counted by pins (`pin` when a request takes a version, `unpin` when it ends) plus
whatever the caller names: an engine whose scheduler already knows which versions its queued and
running requests hold passes that set instead of counting twice.

The table is not thread-safe; each engine guards it the way it guards its own state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Generic, TypeVar

Held = TypeVar("Held")  # what an engine keeps per version: a model and adapter name, a served model id


class VersionTable(Generic[Held]):
    def __init__(self) -> None:
        self._held: dict[int, Held] = {}
        self._pins: Counter[int] = Counter()
        self.current = 0

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

    def install(self, version: int, held: Held) -> None:
        """Hold `held` for `version` (one already held for it wins) and make `version` current."""
        self._held.setdefault(version, held)
        self.current = version

    def make_current(self, version: int) -> None:
        """Make a version that is still held current again (a rollback to it, or to the base)."""
        self.get(version)
        self.current = version

    def pin(self, version: int) -> Held:
        """A request takes `version`: it stays held until the matching `unpin`."""
        held = self.get(version)
        self._pins[version] += 1
        return held

    def unpin(self, version: int) -> None:
        self._pins[version] -= 1
        if self._pins[version] <= 0:
            del self._pins[version]

    def retire_unused(self, also_in_use: Collection[int] = ()) -> list[tuple[int, Held]]:
        """Remove and return every version that is not the base, not current, not pinned and not
        in `also_in_use`, oldest first."""
        keep = {0, self.current, *self._pins, *also_in_use}
        retired = [(version, held) for version, held in self._held.items() if version not in keep]
        for version, _ in retired:
            del self._held[version]
        return retired
