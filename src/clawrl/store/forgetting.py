"""Forgetting a user (DESIGN §12): every row of theirs, and their lineage's versions, in one transaction.

A user's records hang on their sessions (`sessions.user_id`): the sessions' turns, and on each turn
its next state, feedback, judgment, judge lease, queue rows and sample, plus the episodes played
in those sessions, and their memory notes (by `user_id`). Their lineage (`--adapters per-user`: named
as they are) is its version rows and serving pointer. All of it goes in one write, so a reader sees the user whole or not at all,
and a trainer step that used their samples fails to register (its samples are gone:
`SamplesTakenError`) instead of publishing a version nobody owns.

What stays: versions of other lineages (the shared one) whose steps trained on the user's samples.
Their weights carry the user's influence and their manifests list the user's sample ids (turn
ids: no text); the report names them. `--retrain` removes that influence from what is served:
`TrainingStore.retrain_from` points the lineage back at the last version before the user's first
sample and makes the other users' samples of the undone steps ready again, and the trainer
rebuilds the lineage from there without the user.

A forgotten lineage's version numbers are never given out again: the highest is kept in `meta`
(`next_version_number` reads it), because an engine may still hold the forgotten version under its
number while a request finishes, and a new version under that number would be served as it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import CompoundSelect, Select, delete, func, select
from sqlalchemy.orm import Session as DBSession

from clawrl.store.schema import (
    EpisodeRow,
    FeedbackRow,
    JudgeLeaseRow,
    JudgeQueueRow,
    JudgmentRow,
    MemoryNoteRow,
    Meta,
    NextStateRow,
    PolicyPointerRow,
    PolicyVersionRow,
    SampleQueueRow,
    SampleRow,
    SessionRow,
    TurnRow,
    UserRow,
    turn_ids_of,
)

VERSION_HIGH_WATER = "policy_version_high_water"  # the `meta` key: the highest version number ever given out
# what hangs on a turn, deleted before the turns (foreign keys)
_ON_TURNS = (NextStateRow, FeedbackRow, JudgmentRow, JudgeLeaseRow, JudgeQueueRow, SampleQueueRow, SampleRow)


@dataclass
class TrainedOn:
    """A version of another lineage whose step trained on some of the forgotten user's samples."""

    version: int
    lineage: str
    samples: int  # how many of the user's samples it trained on


@dataclass
class Retrained:
    """A lineage's steps undone to be trained again without a forgotten user (`--retrain`)."""

    lineage: str
    rolled_back_to: int  # the version serving (and the trainer) went back to: the last one before the user's samples
    undone_versions: list[int]  # the serving version's ancestors from the first that trained on the user, newest first
    samples_ready_again: int  # other users' samples those steps trained, to be trained anew


@dataclass
class ForgetReport:
    """What forgetting a user removed, and what of theirs stays in weights shared with others."""

    user: str
    account_removed: bool  # the user and their key too (`clawrl users forget`), or kept (`DELETE /v1/me/data`)
    rows: dict[str, int]  # table -> rows deleted
    lineage_versions: list[int]  # their own lineage's versions: rows, pointer and (once removed) directories
    version_paths: list[str]  # those versions' directories, for the caller to remove (the store writes no files)
    trained_shared: list[TrainedOn]  # versions of other lineages trained on their samples: kept, with their influence
    directories_removed: list[str] = field(default_factory=list)
    retrained: Retrained | None = None  # `--retrain`: the shared lineage rebuilt from before the user's samples
    retrain_refused: str | None = None  # `--retrain` could not go back (the version before the user was pruned)
    log_emptied: bool = True  # SQLite: the write-ahead log was emptied after the rows went (Database.scrub)

    def as_json(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "account_removed": self.account_removed,
            "rows": self.rows,
            "lineage_versions": self.lineage_versions,
            "directories_removed": self.directories_removed,
            "shared_versions_trained_on_user": [vars(item) for item in self.trained_shared],
            "retrained": vars(self.retrained) if self.retrained is not None else None,
            "retrain_refused": self.retrain_refused,
            "log_emptied": self.log_emptied,
        }


def owns_anything(db: DBSession, user_id: str) -> bool:
    """Whether any session or lineage of `user_id`'s is stored (a removed user's records stay theirs)."""
    session = db.scalar(select(SessionRow.id).where(SessionRow.user_id == user_id).limit(1))
    lineage = db.scalar(select(PolicyPointerRow.lineage).where(PolicyPointerRow.lineage == user_id).limit(1))
    note = db.scalar(select(MemoryNoteRow.id).where(MemoryNoteRow.user_id == user_id).limit(1))
    return session is not None or lineage is not None or note is not None or _lineage_rows(db, user_id) != []


def forget_rows(db: DBSession, user_id: str, remove_account: bool) -> ForgetReport:
    """Delete every row of `user_id`'s inside the caller's write transaction `db`; the report of it."""
    trained_shared = _trained_shared(db, user_id)
    versions = _lineage_rows(db, user_id)
    _raise_high_water(db, max((row.version for row in versions), default=0))
    rows = delete_records(db, turn_ids_of(user_id), select(SessionRow.id).where(SessionRow.user_id == user_id))
    rows[PolicyVersionRow.__tablename__] = _deleted(db, delete(PolicyVersionRow).where(PolicyVersionRow.lineage == user_id))
    rows[PolicyPointerRow.__tablename__] = _deleted(db, delete(PolicyPointerRow).where(PolicyPointerRow.lineage == user_id))
    rows[MemoryNoteRow.__tablename__] = _deleted(db, delete(MemoryNoteRow).where(MemoryNoteRow.user_id == user_id))
    rows[UserRow.__tablename__] = _deleted(db, delete(UserRow).where(UserRow.id == user_id)) if remove_account else 0
    return ForgetReport(user_id, remove_account, rows, [row.version for row in versions], [row.path for row in versions],
                        trained_shared)  # fmt: skip


def delete_records(db: DBSession, turns: Select[Any] | list[str], sessions: Select[Any] | CompoundSelect) -> dict[str, int]:
    """Delete `turns` with everything that hangs on them, then the episodes and rows of `sessions`,
    inside the caller's write transaction; the rows deleted per table. What forgetting a user and
    retention (`store/retention.py`) both remove: a query for `sessions` is run after the turns
    are gone, so it may ask for sessions left with none."""
    rows = {table.__tablename__: _deleted(db, delete(table).where(table.turn_id.in_(turns))) for table in _ON_TURNS}
    rows[TurnRow.__tablename__] = _deleted(db, delete(TurnRow).where(TurnRow.id.in_(turns)))
    rows[EpisodeRow.__tablename__] = _deleted(db, delete(EpisodeRow).where(EpisodeRow.session_id.in_(sessions)))
    rows[SessionRow.__tablename__] = _deleted(db, delete(SessionRow).where(SessionRow.id.in_(sessions)))
    return rows


def high_water(db: DBSession) -> int:
    """The highest version number a forgotten lineage had (0: none was forgotten)."""
    value = db.scalar(select(Meta.value).where(Meta.key == VERSION_HIGH_WATER))
    return int(value) if value is not None else 0


def _lineage_rows(db: DBSession, user_id: str) -> list[PolicyVersionRow]:
    return list(db.scalars(select(PolicyVersionRow).where(PolicyVersionRow.lineage == user_id).order_by(PolicyVersionRow.version)))


def _trained_shared(db: DBSession, user_id: str) -> list[TrainedOn]:
    """The versions of lineages other than the user's own that stepped on their samples, oldest first."""
    query = (
        select(PolicyVersionRow.version, PolicyVersionRow.lineage, func.count())
        .join(SampleRow, SampleRow.trained_version == PolicyVersionRow.version)
        .where(SampleRow.turn_id.in_(turn_ids_of(user_id)), PolicyVersionRow.lineage != user_id)
        .group_by(PolicyVersionRow.version, PolicyVersionRow.lineage)
        .order_by(PolicyVersionRow.version)
    )
    return [TrainedOn(version, lineage, count) for version, lineage, count in db.execute(query)]


def _raise_high_water(db: DBSession, version: int) -> None:
    if version > high_water(db):
        db.merge(Meta(key=VERSION_HIGH_WATER, value=str(version)))


def _deleted(db: DBSession, statement: Any) -> int:
    """The rows `statement` deleted (no ORM objects of them are loaded, so none needs syncing)."""
    return int(db.execute(statement.execution_options(synchronize_session=False)).rowcount)
