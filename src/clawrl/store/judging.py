"""Judging in the store: leases on judgeable turns, verdicts, and what a judge reads.

The judge queue holds exactly the turns that can be judged; a worker leases some, judges them and
records each verdict, which moves the turn onto the trainer's queue in the same transaction.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from sqlalchemy import Float, cast, delete, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DBSession

import clawrl.store.records as records
from clawrl.store.database import Database
from clawrl.store.queues import queue_for_sampling
from clawrl.store.schema import FeedbackRow, JudgeLeaseRow, JudgeQueueRow, JudgmentRow, NextStateRow, TurnRow, turn_ids_of
from clawrl.types import Judgment, TurnContext


@dataclass
class JudgmentStats:
    policy_version: int
    judged: int
    mean_score: float
    mean_vote_agreement: float
    invalid_votes: int
    latency_s_total: float


class JudgingStore:
    """Judge leases and verdicts (`store.judging`)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def claim_turns_to_judge(
        self, worker_id: str, limit: int, lease_s: float, now: float | None = None, max_attempts: int | None = None
    ) -> list[str]:
        """Lease up to `limit` judgeable turns to `worker_id`, oldest first; returns their ids.

        Judgeable: a main turn the client received, with a next state or explicit feedback, not
        judged yet (the judge queue holds exactly these), not leased to a worker whose lease is
        still running, and (with `max_attempts`) not already claimed that many times. A lease left
        behind by a killed worker expires after `lease_s` and the turn is claimed again.
        """
        now = time.time() if now is None else now
        no_lease = JudgeLeaseRow.turn_id.is_(None)
        query = (
            select(JudgeQueueRow.turn_id)
            .outerjoin(JudgeLeaseRow, JudgeLeaseRow.turn_id == JudgeQueueRow.turn_id)
            .where(or_(no_lease, JudgeLeaseRow.expires_at < now))
            .order_by(JudgeQueueRow.turn_created_at, JudgeQueueRow.turn_id)
            .limit(limit)
            .with_for_update(skip_locked=True, of=JudgeQueueRow)
        )
        if max_attempts is not None:
            query = query.where(or_(no_lease, JudgeLeaseRow.attempts < max_attempts))
        with self.database.write() as db:
            candidates = list(db.scalars(query))
            return [turn_id for turn_id in candidates if self._take_lease(db, turn_id, worker_id, now, lease_s)]

    def _take_lease(self, db: DBSession, turn_id: str, worker_id: str, now: float, lease_s: float) -> bool:
        """Create the turn's lease, or renew it if it has expired; False if a live lease exists.

        One statement (an upsert whose update is conditional) so that the database arbitrates: on
        PostgreSQL the candidate query's snapshot can predate another worker's committed lease,
        and only the lease row itself, locked by the upsert, tells the truth.
        """
        insert = sqlite_insert if self.database.is_sqlite else postgresql_insert
        statement = (
            insert(JudgeLeaseRow)
            .values(turn_id=turn_id, worker_id=worker_id, expires_at=now + lease_s, attempts=1)
            .on_conflict_do_update(
                index_elements=[JudgeLeaseRow.turn_id],
                set_={"worker_id": worker_id, "expires_at": now + lease_s, "attempts": JudgeLeaseRow.attempts + 1},
                where=JudgeLeaseRow.expires_at < now,
            )
            .returning(JudgeLeaseRow.turn_id)
        )
        return db.execute(statement).first() is not None

    def record_judgment(self, judgment: Judgment) -> bool:
        """Write a verdict, take the turn off the judge queue (onto the trainer's) and drop its lease.

        False if the turn already had one (judged once)."""
        try:
            with self.database.write() as db:
                db.execute(delete(JudgeQueueRow).where(JudgeQueueRow.turn_id == judgment.turn_id))
                if db.get(JudgmentRow, judgment.turn_id) is not None:
                    return False  # committed all the same: a queue entry racing the first verdict goes
                db.add(records.judgment_row(dataclasses.replace(judgment, created_at=time.time())))
                db.flush()
                queue_for_sampling(db, judgment.turn_id)
                db.execute(delete(JudgeLeaseRow).where(JudgeLeaseRow.turn_id == judgment.turn_id))
                return True
        except IntegrityError:  # a concurrent writer on a server database inserted it first
            return False

    def release_lease(self, turn_id: str, worker_id: str, now: float | None = None) -> None:
        """Give a turn back early (the judge failed) so another attempt need not wait for expiry.

        The lease is expired rather than deleted: its attempt count is what lets claims stop
        retrying a turn that can never be judged (`max_attempts`)."""
        expired = (time.time() if now is None else now) - 1.0
        with self.database.write() as db:
            db.execute(
                update(JudgeLeaseRow)
                .where(JudgeLeaseRow.turn_id == turn_id, JudgeLeaseRow.worker_id == worker_id)
                .values(expires_at=expired)
            )

    def release_leases(self, worker_id: str, now: float | None = None) -> None:
        """Give back every turn `worker_id` holds (a judge actor that died: its turns need not wait for
        their leases to run out); expired as `release_lease` does, so attempts still count."""
        expired = (time.time() if now is None else now) - 1.0
        with self.database.write() as db:
            db.execute(update(JudgeLeaseRow).where(JudgeLeaseRow.worker_id == worker_id).values(expires_at=expired))

    def judge_backlog(self, now: float | None = None) -> tuple[int, float]:
        """How many turns wait for a verdict, and how long the oldest of them has been recorded (s)."""
        now = time.time() if now is None else now
        with self.database.read() as db:
            waiting, oldest = db.execute(select(func.count(), func.min(JudgeQueueRow.turn_created_at))).one()
            return waiting, (now - oldest if oldest is not None else 0.0)

    def judgment(self, turn_id: str) -> Judgment | None:
        with self.database.read() as db:
            row = db.get(JudgmentRow, turn_id)
            return records.judgment(row) if row is not None else None

    def judgment_stats(self, user_id: str | None = None) -> list[JudgmentStats]:
        """Aggregates of all verdicts per policy version (what `/metrics` exports), or of `user_id`'s turns'."""
        query = (
            select(
                TurnRow.policy_version,
                func.count(JudgmentRow.turn_id),
                func.avg(cast(JudgmentRow.score, Float)),  # PostgreSQL averages integers as numeric (Decimal)
                func.avg(JudgmentRow.vote_agreement),
                func.sum(JudgmentRow.invalid_votes),
                func.sum(JudgmentRow.latency_s),
            )
            .join(TurnRow, TurnRow.id == JudgmentRow.turn_id)
            .group_by(TurnRow.policy_version)
            .order_by(TurnRow.policy_version)
        )
        if user_id is not None:
            query = query.where(JudgmentRow.turn_id.in_(turn_ids_of(user_id)))
        with self.database.read() as db:
            return [JudgmentStats(*row) for row in db.execute(query)]

    def turn_context(self, turn_id: str) -> TurnContext:
        """A turn with its next state and explicit feedback (oldest first): what a judge needs."""
        with self.database.read() as db:
            turn = db.get(TurnRow, turn_id)
            if turn is None:
                raise KeyError(turn_id)
            feedback = db.scalars(select(FeedbackRow).where(FeedbackRow.turn_id == turn_id).order_by(FeedbackRow.id))
            next_state = db.get(NextStateRow, turn_id)
            return TurnContext(
                records.turn(turn),
                records.next_state(next_state) if next_state is not None else None,
                [records.feedback(row) for row in feedback],
            )

    def judgments_for(self, turn_ids: list[str]) -> dict[str, Judgment]:
        with self.database.read() as db:
            rows = db.scalars(select(JudgmentRow).where(JudgmentRow.turn_id.in_(turn_ids)))
            return {row.turn_id: records.judgment(row) for row in rows}
