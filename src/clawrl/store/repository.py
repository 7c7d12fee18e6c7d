"""The store as one handle: a database and its facets, one per concern.

Every loop reads and writes shared state only through here: serving records turns
(`store.turns`), the judge leases turns and records verdicts (`store.judging`), the trainer turns
verdicts into samples and publishes versions (`store.training`), and environments' episodes are
registered and ended (`store.episodes`), users hold keys (`store.users`) and memory notes (`store.memory`). Each facet is built once with the store and shares its
connection pool and, on SQLite, its writers' queue.
"""

from __future__ import annotations

from pathlib import Path

from clawrl.store.database import Database
from clawrl.store.encryption import KeyRing
from clawrl.store.episodes import EpisodeStore
from clawrl.store.judging import JudgingStore
from clawrl.store.memory import MemoryStore
from clawrl.store.training import TrainingStore
from clawrl.store.turns import TurnStore
from clawrl.store.users import UserStore


class Store(Database):
    """A handle on one trajectory store (SQLite file or PostgreSQL URL) with its facets."""

    def __init__(self, url: str, keys: KeyRing | None = None) -> None:
        super().__init__(url, keys)
        self.turns = TurnStore(self)
        self.judging = JudgingStore(self)
        self.training = TrainingStore(self)
        self.episodes = EpisodeStore(self)
        self.users = UserStore(self)
        self.memory = MemoryStore(self)

    @classmethod
    def for_run_dir(cls, run_dir: Path, keys: KeyRing | None = None) -> Store:
        return cls(f"sqlite:///{(Path(run_dir) / 'clawrl.db').resolve()}", keys)
