"""The store's own guarantees: WAL mode, a schema version, refusing a newer schema."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from clawrl.store import Store
from clawrl.store.migrations import SCHEMA_VERSION, SchemaTooNewError


def test_new_store_is_wal_and_records_its_schema_version(tmp_path: Path) -> None:
    Store.for_run_dir(tmp_path).close()
    with sqlite3.connect(tmp_path / "clawrl.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)


def test_reopening_keeps_data_and_a_newer_schema_is_refused(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    store.close()
    with sqlite3.connect(tmp_path / "clawrl.db") as db:
        db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(SchemaTooNewError):
        Store.for_run_dir(tmp_path)


def test_a_version_1_store_is_upgraded_in_place(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    store.close()
    with sqlite3.connect(tmp_path / "clawrl.db") as db:  # what issue 2's store looked like
        db.execute("DROP TABLE judgments")
        db.execute("DROP TABLE judge_leases")
        db.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    Store.for_run_dir(tmp_path).close()
    with sqlite3.connect(tmp_path / "clawrl.db") as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"judgments", "judge_leases", "turns"} <= tables
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
