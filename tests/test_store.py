"""The store's own guarantees: WAL mode, a schema version, refusing a newer schema, upgrading an older one."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from clawrl.store import Store
from clawrl.store.migrations import SCHEMA_VERSION, SchemaTooNewError
from tests.helpers import judgment, record, user


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


def test_a_version_13_store_indexes_each_users_sessions_by_recency(tmp_path: Path) -> None:
    """v14 replaces the index by user with one by user and recency; the sessions stay whose they were."""
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("q")], "a")
    record(store, "t2", "alice/work", [user("q")], "a", user_id="alice")
    store.close()
    with sqlite3.connect(tmp_path / "clawrl.db") as db:  # the v13 store's index
        db.execute("DROP INDEX ix_sessions_user_recent")
        db.execute("CREATE INDEX ix_sessions_user_id ON sessions (user_id)")
        db.execute("UPDATE meta SET value='13' WHERE key='schema_version'")
    store = Store.for_run_dir(tmp_path)
    assert [session.id for session in store.turns.list_sessions(user_id="alice")] == ["alice/work"]
    store.close()
    with sqlite3.connect(tmp_path / "clawrl.db") as db:
        indexes = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='sessions'")}
        plan = " ".join(row[3] for row in db.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM sessions WHERE user_id = 'alice' ORDER BY updated_at DESC LIMIT 8"))
    assert "ix_sessions_user_recent" in indexes and "ix_sessions_user_id" not in indexes
    assert "ix_sessions_user_recent" in plan and "TEMP B-TREE" not in plan  # read in order, not sorted


def test_a_version_4_store_keeps_its_waiting_work_when_the_queues_arrive(tmp_path: Path) -> None:
    """v5 finds turns to judge and to sample through queues; a v4 store's backlog is queued on upgrade."""
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("q1")], "a1")
    record(store, "t2", "s1", [user("q2")], "a2", continues_turn_id="t1", next_state=[user("q2")])
    record(store, "t3", "s1", [user("q3")], "a3", continues_turn_id="t2", next_state=[user("q3")])
    record(store, "t4", "s1", [user("q4")], "a4", continues_turn_id="t3", next_state=[user("q4")])
    store.judging.record_judgment(judgment("t1", 1))
    store.close()
    with sqlite3.connect(tmp_path / "clawrl.db") as db:  # what issue 13's store looked like
        db.execute("DROP TABLE judge_queue")
        db.execute("DROP TABLE sample_queue")
        db.execute("UPDATE meta SET value='4' WHERE key='schema_version'")
    upgraded = Store.for_run_dir(tmp_path)
    assert upgraded.judging.claim_turns_to_judge("w", limit=10, lease_s=60) == ["t2", "t3"]
    assert [judged.turn.id for judged in upgraded.training.judged_turns_without_sample(10)] == ["t1"]


def test_a_version_6_store_gets_the_empty_answers_index_and_the_lookup_uses_it(tmp_path: Path) -> None:
    """Each request that starts a session looks for a recent empty answer it may retry; the lookup
    reads the empty answers only, however many turns the last minutes brought."""
    store = Store.for_run_dir(tmp_path)
    for index in range(40):
        record(store, f"t{index}", f"s{index}", [user(f"q{index}")], f"a{index}")
    record(store, "empty", "s-empty", [user("q")], "  ")
    store.close()
    with sqlite3.connect(tmp_path / "clawrl.db") as db:  # what issue 32's store looked like
        db.execute("DROP INDEX ix_turns_empty_answers")
        db.execute("UPDATE meta SET value='6' WHERE key='schema_version'")
    upgraded = Store.for_run_dir(tmp_path)
    assert [turn.id for turn in upgraded.turns.recent_empty_answers(since=0)] == ["empty"]
    upgraded.close()
    with sqlite3.connect(tmp_path / "clawrl.db") as db:
        sql = db.execute("SELECT sql FROM sqlite_master WHERE name = 'ix_turns_empty_answers'").fetchone()[0]
        plan = db.execute(f"EXPLAIN QUERY PLAN SELECT id FROM turns WHERE {sql.split(' WHERE ', 1)[1]} AND created_at >= 0").fetchall()
    assert "ix_turns_empty_answers" in str(plan)


def test_a_new_run_directory_and_its_database_are_the_owners_alone(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "me"
    store = Store.for_run_dir(run_dir)
    record(store, "t1", "s1", [{"role": "user", "content": "a private question"}], "an answer")
    modes = {name: stat.S_IMODE(os.stat(path).st_mode)
             for name, path in (("run dir", run_dir), ("database", run_dir / "clawrl.db"), ("log", run_dir / "clawrl.db-wal"))}
    assert modes == {"run dir": 0o700, "database": 0o600, "log": 0o600}
    store.close()
    shared = tmp_path / "shared"  # a folder and a database that exist keep the modes their owner gave them
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    Store.for_run_dir(shared).close()
    os.chmod(shared / "clawrl.db", 0o640)
    Store.for_run_dir(shared).close()
    assert (stat.S_IMODE(os.stat(shared).st_mode), stat.S_IMODE(os.stat(shared / "clawrl.db").st_mode)) == (0o755, 0o640)
