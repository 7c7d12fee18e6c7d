"""`clawrl data rotate-key`: re-encrypt every encrypted (or still plain) value under a new key.

The store is opened with the ring new + old (`KeyRing.then`): values are read with whichever key
they are under and written back under the new one, table by table in batches of rows, each batch
its own write transaction, so the loops' writes go on between batches. A row is written back only
if it still holds what was read (compare and set): a value a loop changed meanwhile is left as the
loop wrote it and counted in `changed_meanwhile`. At the end `meta` names the keys still in use,
so a store opened with the old key alone is refused, and SQLite's files are rewritten (VACUUM and
an emptied write-ahead log: the old ciphertexts are what a leaked old key could open).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Column, Table, Text, and_, cast, select, update

from clawrl.store.database import Database, set_key_ids
from clawrl.store.encryption import EncryptedJSON, EncryptedText, KeyRing
from clawrl.store.schema import Base


@dataclass
class RotationReport:
    """What a rotation did, value by value (a value is one column of one row)."""

    key_id: str  # the key everything is under now
    rewritten: dict[str, int] = field(default_factory=dict)  # table -> values re-encrypted (from another key or plain)
    already: int = 0  # values that were under the new key already
    changed_meanwhile: int = 0  # values a loop rewrote between the read and the write: left as it wrote them
    left: dict[str, int] = field(default_factory=dict)  # key id -> values still under it after the pass
    # values still in clear after the pass: a loop started without a key wrote them meanwhile (it
    # opened the store while it was in clear, so it was never refused); not rotated, not done
    left_in_clear: int = 0
    log_emptied: bool = True


def rotate(database: Database, batch: int = 200) -> RotationReport:
    """Re-encrypt every value of every encrypted column under `database.keys`' first key."""
    ring = database.keys
    assert ring is not None, "a rotation needs the ring new + old"
    report = RotationReport(ring.current_id)
    left: Counter[str | None] = Counter()
    for table in Base.metadata.sorted_tables:
        columns = [column for column in table.columns if isinstance(column.type, EncryptedText | EncryptedJSON)]
        if columns:
            _rotate_table(database, ring, table, columns, batch, report)
            _count_left(database, ring, table, columns, left)
    report.left_in_clear = left.pop(None, 0)
    report.left = {under: count for under, count in left.items() if under is not None}
    with database.locked_meta() as connection:
        set_key_ids(connection, [ring.current_id, *report.left])
    report.log_emptied = database.scrub()
    return report


def _rotate_table(database: Database, ring: KeyRing, table: Table, columns: list[Column[Any]], batch: int,
                  report: RotationReport) -> None:
    (key,) = table.primary_key.columns
    raw = [cast(column, Text).label(column.name) for column in columns]  # as stored, past the column's type
    after: Any = None
    while True:
        with database.write() as db:
            query = select(key, *raw).order_by(key).limit(batch)
            rows = db.execute(query if after is None else query.where(key > after)).all()
            for row in rows:
                stale = [column for column in columns
                         if _needs_rewrite(column, getattr(row, column.name), ring, report)]  # fmt: skip
                if stale:
                    _rewrite(db, table, key, row, stale, report)
        if not rows:
            return
        after = rows[-1][0]


def _count_left(database: Database, ring: KeyRing, table: Table, columns: list[Column[Any]],
                left: Counter[str | None]) -> None:
    """Count the values still under another key than the new one (a loop wrote them meanwhile with
    the old key) and, under None, those still in clear (a loop with no key wrote them meanwhile):
    both are what a rotation that reported success would leave readable without the new key."""
    with database.read() as db:
        for column in columns:
            for (stored,) in db.execute(select(cast(column, Text)).where(column.isnot(None))):
                under = column.type.stored_key_id(stored)
                if under is None and _needs_rewrite(column, stored, ring, RotationReport(ring.current_id)):
                    left[None] += 1
                elif under is not None and under != ring.current_id:
                    left[under] += 1


def _needs_rewrite(column: Column[Any], stored: str | None, ring: KeyRing, report: RotationReport) -> bool:
    if stored is None:
        return False
    under = column.type.stored_key_id(stored)
    if under == ring.current_id:
        report.already += 1
        return False
    # a plain value is encrypted too; blank text stays as it is (see `EncryptedText`)
    if isinstance(column.type, EncryptedJSON):
        return stored != "null"  # JSON's null stays null
    return under is not None or bool(stored.strip())


def _rewrite(db: Any, table: Table, key: Column[Any], row: Any, stale: list[Column[Any]], report: RotationReport) -> None:
    """Write the row's stale values back through their columns' types (so under the new key), if
    the row still holds what was read. A row gone since the batch's read (a forget committed in
    between, on PostgreSQL where the batch holds no lock on it) has nothing left to rotate."""
    clear = db.execute(select(*stale).where(key == row[0])).first()  # decrypted by the columns' types
    if clear is None:
        return
    unchanged = and_(*[cast(column, Text) == getattr(row, column.name) for column in stale])
    done = db.execute(update(table).where(key == row[0], unchanged).values(dict(zip(stale, clear, strict=True))))
    if done.rowcount:
        report.rewritten[table.name] = report.rewritten.get(table.name, 0) + len(stale)
    else:
        report.changed_meanwhile += len(stale)
