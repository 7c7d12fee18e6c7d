"""The trajectory store's settings (DESIGN §2, loop 2): the run directory, the database, and the
key that encrypts what people said (DESIGN §12, at rest)."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, SecretStr, model_validator

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
    # Every process of a run (serve, its trainer, judge, the CLI) must be given the same key: the
    # store refuses to open without the keys its encrypted rows are under.
    encrypt_key_file: Path | None = Field(
        None,
        description="A file holding the key that encrypts conversation text and token ids in the store (AES-256-GCM; "
        "`clawrl data new-key` writes one). Several keys, one a line: the first encrypts, all decrypt (for a "
        "rotation). Unset, and no CLAWRL_DATA_KEY: stored in clear.",
    )
    # a secret is never a flag (`ps` shows a command line): only the variable CLAWRL_DATA_KEY sets it
    data_key: SecretStr | None = Field(
        None, description="The data key itself, as a line of --encrypt-key-file holds it, for deployments that hand "
        "secrets over as variables (CLAWRL_DATA_KEY only, never a flag).",
    )

    @model_validator(mode="after")
    def _one_source_of_keys(self) -> Self:
        if self.encrypt_key_file is not None and self.data_key is not None:
            raise ValueError("give the data key with --encrypt-key-file or CLAWRL_DATA_KEY, not both")
        return self

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.run_dir / 'clawrl.db').resolve()}"
