"""The trajectory store's settings (DESIGN §2, loop 2): the run directory and the database."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from clawrl.config.base import ComponentSettings


class StoreConfig(ComponentSettings):
    """The durable trajectory store (DESIGN §2, loop 2)."""

    run_dir: Path = Field(
        Path("runs/default"),
        description="Directory of this run: the database, policy versions and checkpoints live here.",
    )
    database_url: str | None = Field(
        None, description="SQLAlchemy URL of the store; defaults to SQLite at RUN_DIR/clawrl.db."
    )

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.run_dir / 'clawrl.db').resolve()}"
