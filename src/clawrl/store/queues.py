"""The store's two work queues: turns waiting for a verdict, judged turns waiting for a sample.

A turn enters a queue in the same transaction as the row that gives it work (its next state or
feedback; its verdict) and leaves it in the same transaction as the row that settles that work
(its verdict; its sample). So the queues never disagree with the tables they summarise, and
finding work costs what the backlog holds, however long the history grows.
"""

from __future__ import annotations

from sqlalchemy import Connection, Insert, exists, insert, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session as DBSession

from clawrl.store.schema import EpisodeRow, FeedbackRow, JudgeQueueRow, JudgmentRow, NextStateRow, SampleQueueRow, SampleRow, TurnRow


def queue_for_judging(db: DBSession, turn_id: str) -> None:
    """Queue a turn that just got a next state or feedback, if it is judgeable and not judged yet.

    Judgeable: a main turn its client received in full (a hung-up stream's turn is `cancelled`) and
    nobody opted out of training (`opt_out`: never judged, so never made a sample either).
    Two requests may queue the same turn at once on a server database; the second does nothing.
    """
    # the columns it needs, not the turn (whose prompt and answer can be long JSON): this runs in
    # the write of every turn that continues another one
    turn = db.execute(
        select(TurnRow.kind, TurnRow.finish_reason, TurnRow.opt_out, TurnRow.created_at).where(TurnRow.id == turn_id)
    ).first()
    if turn is None or turn.kind != "main" or turn.finish_reason == "cancelled" or turn.opt_out is not None:
        return
    if db.execute(select(JudgmentRow.turn_id).where(JudgmentRow.turn_id == turn_id)).first() is not None:
        return  # feedback after the verdict: the turn was judged once and stays so
    db.execute(_insert_ignoring_duplicates(db, JudgeQueueRow).values(turn_id=turn_id, turn_created_at=turn.created_at))


def queue_for_sampling(db: DBSession, turn_id: str) -> None:
    """Queue a turn that was just judged for the trainer, unless it is an episode's step (or opted out:
    such a turn is never queued for judging, and a verdict written for it anyway makes no sample)."""
    turn = db.get(TurnRow, turn_id)
    if turn is None or turn.kind != "main" or turn.opt_out is not None or db.get(EpisodeRow, turn.session_id) is not None:
        return
    db.execute(_insert_ignoring_duplicates(db, SampleQueueRow).values(turn_id=turn_id, turn_created_at=turn.created_at))


def backfill(connection: Connection) -> None:
    """Queue the work a store written before the queues existed (schema v4 and older) still holds
    (and is not queued already)."""
    judgeable = (
        select(TurnRow.id, TurnRow.created_at)
        .where(TurnRow.kind == "main", TurnRow.finish_reason != "cancelled")
        .where(exists().where(NextStateRow.turn_id == TurnRow.id) | exists().where(FeedbackRow.turn_id == TurnRow.id))
        .where(~exists().where(JudgmentRow.turn_id == TurnRow.id), ~exists().where(JudgeQueueRow.turn_id == TurnRow.id))
    )
    connection.execute(insert(JudgeQueueRow).from_select(["turn_id", "turn_created_at"], judgeable))
    unsampled = (
        select(TurnRow.id, TurnRow.created_at)
        .join(JudgmentRow, JudgmentRow.turn_id == TurnRow.id)
        .where(TurnRow.kind == "main", ~exists().where(SampleRow.turn_id == TurnRow.id))
        .where(~exists().where(EpisodeRow.session_id == TurnRow.session_id), ~exists().where(SampleQueueRow.turn_id == TurnRow.id))
    )
    connection.execute(insert(SampleQueueRow).from_select(["turn_id", "turn_created_at"], unsampled))


def _insert_ignoring_duplicates(db: DBSession, table: type[JudgeQueueRow] | type[SampleQueueRow]) -> Insert:
    dialect = db.get_bind().dialect.name
    statement = sqlite_insert(table) if dialect == "sqlite" else postgresql_insert(table)
    return statement.on_conflict_do_nothing(index_elements=["turn_id"])
