"""Retention (`clawrl serve --retain-days N`, DESIGN §12): turns older than N days go, trained on or not.

With a turn go its next state, feedback, verdict (and its hint), judge lease, queue rows and
sample, and then the sessions and the episodes left with no turn (deleted as forgetting a user
deletes them: `forgetting.delete_records`). A trainer step that took one of their ready samples
fails to register (`SamplesTakenError`) and is redone without it; a request whose history
continues a removed turn is recorded without its next state (`TurnStore.record_turns`).

It runs in the server's background in transactions of `CHUNK` turns, so serving's writes wait at
most one chunk's delete behind it. Then, where rows went, SQLite's write-ahead log is emptied
(`Database.scrub(vacuum=False)`): `secure_delete` has zeroed them in the database's pages, and the
log's copies of those pages go with the TRUNCATE checkpoint. A whole VACUUM, as forgetting does,
would hold the write lock for as long as it rewrites the file, every pass.
"""

from __future__ import annotations

import time
from collections import Counter

from sqlalchemy import CompoundSelect, exists, select

from clawrl.store.database import Database
from clawrl.store.forgetting import delete_records
from clawrl.store.schema import EpisodeRow, SessionRow, TurnRow

CHUNK = 500  # turns removed per transaction
DAY_S = 86400.0


def remove_older_than(database: Database, days: float, now: float | None = None) -> dict[str, int]:
    """Remove every turn recorded more than `days` days ago, what hangs on it, and the sessions and
    episodes it leaves empty; the rows removed per table (empty when there was nothing to remove)."""
    cutoff = (time.time() if now is None else now) - days * DAY_S
    removed: Counter[str] = Counter()
    while True:
        with database.write() as db:
            turns = list(db.scalars(select(TurnRow.id).where(TurnRow.created_at < cutoff).order_by(TurnRow.created_at)
                                    .limit(CHUNK)))  # fmt: skip
            removed.update(delete_records(db, turns, _left_empty(cutoff)))
        if len(turns) < CHUNK:
            break
    if any(removed.values()):
        database.scrub(vacuum=False)
    return {table: count for table, count in removed.items() if count}


def _left_empty(cutoff: float) -> CompoundSelect:
    """The sessions last used before `cutoff` with no turn left, and those of episodes begun before it
    with none (registered, never played)."""
    no_turn = ~exists().where(TurnRow.session_id == SessionRow.id)
    sessions = select(SessionRow.id).where(SessionRow.updated_at < cutoff, no_turn)
    unplayed = select(EpisodeRow.session_id).where(EpisodeRow.created_at < cutoff,
                                                    ~exists().where(TurnRow.session_id == EpisodeRow.session_id))  # fmt: skip
    return sessions.union(unplayed)
