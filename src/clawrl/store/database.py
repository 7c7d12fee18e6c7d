"""The store's connection: one database (SQLite file or PostgreSQL URL) and its transactions.

SQLite runs in WAL mode with `synchronous=FULL`, so a committed turn survives a SIGKILL or a
power cut, and readers never block the writer. Write transactions start with `BEGIN IMMEDIATE`:
a deferred transaction that reads and then writes can fail with SQLITE_BUSY when another process
(the judge, the trainer) wrote in between, and the busy timeout cannot help it.

What a user's records say must not outlive them (DESIGN §12, forget): SQLite overwrites what a
delete frees with zeros (`secure_delete`), `scrub` rewrites the file and empties the write-ahead
log after a forget, and no error message carries a statement's parameters (`hide_parameters`: an
IntegrityError logged with its traceback would otherwise print a turn's text or a hint).

With a key ring (`encryption.py`), what people said is encrypted in the columns that hold it. The
ids of the keys rows are written under are kept in `meta` (`data_key_ids`), so a store opened with
no key, or without one of those keys, is refused when it opens, with a line that says so.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, create_engine, event, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session as DBSession
from sqlalchemy.orm import sessionmaker

from clawrl.store.encryption import DataKeyError, KeyRing, attach
from clawrl.store.migrations import MIGRATION_LOCK_KEY, migrate
from clawrl.store.schema import Meta

DATA_KEY_IDS = "data_key_ids"  # meta: the keys the store's encrypted rows are under, comma-separated


class Database:
    """A migrated database and its read and write transactions: what every facet of the store uses."""

    def __init__(self, url: str, keys: KeyRing | None = None) -> None:
        self.url = url
        self.keys = keys
        parsed = make_url(url)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        if self.is_sqlite and parsed.database and parsed.database != ":memory:":
            _create_private(Path(parsed.database))
        self.engine = create_engine(url, pool_pre_ping=not self.is_sqlite, hide_parameters=True)
        if self.is_sqlite:
            _configure_sqlite(self.engine)
        else:
            event.listen(self.engine, "before_cursor_execute", _without_nul, retval=True)
        # a lock only SQLite needs (see `write`); a server database takes concurrent writers itself
        self._write_queue: AbstractContextManager[Any] = threading.Lock() if self.is_sqlite else nullcontext()
        attach(self.engine, keys)
        migrate(self.engine)
        self._check_keys()
        self._reader = sessionmaker(self.engine, expire_on_commit=False)
        self._writer = sessionmaker(self.engine.execution_options(clawrl_write=True), expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()

    def _check_keys(self) -> None:
        """Refuse a key ring that cannot read the store's encrypted rows, and record the key this one writes with."""
        with self.locked_meta() as connection:
            found = _key_ids(connection)
            if self.keys is None:
                if found:
                    raise DataKeyError(f"the store is encrypted (key id {', '.join(found)}) and no "
                                       "key was given: give it with --encrypt-key-file or CLAWRL_DATA_KEY")
                return
            missing = [key for key in found if key not in self.keys.ids]
            if missing:
                raise DataKeyError(f"the store is encrypted with key id {', '.join(missing)}, which the "
                                   f"key given ({', '.join(self.keys.ids)}) is not: give the key they were written with "
                                   "(a key file may list several, the one that writes first)")
            if self.keys.current_id not in found:
                set_key_ids(connection, [*found, self.keys.current_id])

    @contextmanager
    def locked_meta(self) -> Iterator[Connection]:
        """A write transaction on `meta` that processes opening the same store at once take in turn."""
        with self.engine.execution_options(clawrl_write=True).begin() as connection:
            if not self.is_sqlite:
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            yield connection

    @contextmanager
    def write(self) -> Iterator[DBSession]:
        """A write transaction: committed on exit, rolled back on error.

        On SQLite, this process's writers queue on a lock before BEGIN IMMEDIATE: SQLite admits one
        writer at a time, and a writer turned away sleeps in its busy handler for up to 100 ms at a
        time, so under concurrent requests a turn's write could wait far longer than the writes
        ahead of it took (8 writers: p99 638 ms without the lock, 114 ms with it, at the same mean;
        benchmarks/store_writes.py).
        Writers in other processes (the trainer, a standalone judge) still meet the busy handler.
        """
        with self._write_queue, self._writer.begin() as session:
            yield session

    @contextmanager
    def read(self) -> Iterator[DBSession]:
        with self._reader() as session:
            yield session

    def scrub(self, vacuum: bool = True) -> bool:
        """After rows were deleted for good (a forgotten user), leave no copy of them in SQLite's files:
        VACUUM rebuilds the database from the rows that remain, then a TRUNCATE checkpoint copies
        that into the file and empties the write-ahead log, where every page ever written stays
        until it is overwritten. Without `vacuum` (retention's passes) only the checkpoint runs:
        `secure_delete` zeroed the rows in the pages already, and a VACUUM would hold the write lock
        for as long as it rewrites the whole file. Returns whether the log was emptied (False: a reader in another
        process held it past the busy timeout; the next checkpoint overwrites it). On PostgreSQL a
        deleted row is gone from every query and dump at once; its dead tuple is reclaimed by
        autovacuum, which this does not wait for."""
        if not self.is_sqlite:
            return True
        with self._write_queue:
            connection = self.engine.raw_connection()  # not a Session: VACUUM runs outside a transaction
            try:
                cursor = connection.cursor()
                if vacuum:
                    cursor.execute("VACUUM")
                busy = cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
                cursor.close()
            finally:
                connection.close()
        return busy == 0


def _key_ids(connection: Connection) -> list[str]:
    found = connection.execute(select(Meta.value).where(Meta.key == DATA_KEY_IDS)).scalar()
    return [key for key in (found or "").split(",") if key]


def set_key_ids(connection: Connection, ids: list[str]) -> None:
    """Record which keys the store's encrypted rows are under (after a rotation: fewer)."""
    connection.execute(Meta.__table__.delete().where(Meta.key == DATA_KEY_IDS))
    if ids:
        connection.execute(Meta.__table__.insert().values(key=DATA_KEY_IDS, value=",".join(dict.fromkeys(ids))))


def _configure_sqlite(engine: Any) -> None:
    """WAL, full fsync on commit, a generous busy timeout, deletes that zero what they free, and BEGIN
    IMMEDIATE for writers."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves (below)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA secure_delete=ON")  # rows deleted are gone from the file, not just unlinked
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        write = connection.get_execution_options().get("clawrl_write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


# PostgreSQL refuses NUL in text (and the \u0000 escape in JSON) that SQLite stores: a sampled token
# or a client's message can hold one. Text is what the ids decode to, never what trains (the ids
# are kept as they are), so NUL becomes U+FFFD rather than a failed write and a lost turn.
def _nul_free(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd").replace("\\u0000", "\\ufffd")
    if isinstance(value, dict):
        return {key: _nul_free(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_nul_free(item) for item in value)
    return value


def _without_nul(_connection: Any, _cursor: Any, statement: str, parameters: Any, _context: Any,
                 _executemany: bool) -> tuple[str, Any]:
    return statement, _nul_free(parameters)


def _create_private(path: Path) -> None:
    """Create a new database file 0600 in a new folder 0700: they will hold every conversation, so
    they are the owner's alone (SQLite gives its -wal and -shm files the database file's mode). An
    existing folder or file keeps the mode its owner gave it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))  # an empty file is an empty database
    except FileExistsError:
        pass
