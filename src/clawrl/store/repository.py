"""The store's functions: every loop reads and writes shared state only through here.

SQLite runs in WAL mode with `synchronous=FULL`, so a committed turn survives a SIGKILL or a
power cut, and readers never block the writer. Write transactions start with `BEGIN IMMEDIATE`:
a deferred transaction that reads and then writes can fail with SQLITE_BUSY when another process
(the judge, the trainer) wrote in between, and the busy timeout cannot help it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Float, cast, create_engine, delete, event, func, or_, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session as DBSession
from sqlalchemy.orm import sessionmaker

import clawrl.store.records as records
from clawrl.store.migrations import migrate
from clawrl.store.queues import queue_for_judging, queue_for_sampling
from clawrl.store.schema import FeedbackRow, JudgeLeaseRow, JudgeQueueRow, JudgmentRow, NextStateRow, SessionRow, TurnRow
from clawrl.types import Feedback, Judgment, NextState, Session, SessionIdSource, Turn, TurnContext


RECORD_ATTEMPTS = 3  # transactions tried per turn when concurrent writers collide on a key (server databases)


@dataclass
class TurnWrite:
    """One finished turn to record: `Store.record_turn`'s arguments (`now` None: the time of the write)."""

    turn: Turn
    id_source: SessionIdSource
    continues: NextState | None = None
    session_done: bool = False
    now: float | None = None


@dataclass
class JudgmentStats:
    policy_version: int
    judged: int
    mean_score: float
    mean_vote_agreement: float
    invalid_votes: int
    latency_s_total: float


class Store:
    """A handle on one trajectory store (SQLite file or PostgreSQL URL)."""

    def __init__(self, url: str) -> None:
        self.url = url
        parsed = make_url(url)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        if self.is_sqlite and parsed.database:
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        self.engine = create_engine(url, pool_pre_ping=not self.is_sqlite)
        if self.is_sqlite:
            _configure_sqlite(self.engine)
        else:
            event.listen(self.engine, "before_cursor_execute", _without_nul, retval=True)
        # a lock only SQLite needs (see `write`); a server database takes concurrent writers itself
        self._write_queue: AbstractContextManager[Any] = threading.Lock() if self.is_sqlite else nullcontext()
        migrate(self.engine)
        self._reader = sessionmaker(self.engine, expire_on_commit=False)
        self._writer = sessionmaker(self.engine.execution_options(clawrl_write=True), expire_on_commit=False)

    @classmethod
    def for_run_dir(cls, run_dir: Path) -> Store:
        return cls(f"sqlite:///{(Path(run_dir) / 'clawrl.db').resolve()}")

    def close(self) -> None:
        self.engine.dispose()

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

    # --- serving ------------------------------------------------------------------------------
    def record_turn(
        self,
        turn: Turn,
        id_source: SessionIdSource,
        continues: NextState | None = None,
        session_done: bool = False,
        now: float | None = None,
    ) -> int:
        """Write a turn, attach the next state it carries to the turn it continues, and commit.

        `id_source` is how the turn's session was recognised (kept when the session is new);
        `continues` is what this request added after an earlier turn's answer. Returns the turn's
        index within its session. On a server database two requests can race to create the same
        new session (or the same next state): the upserts of `_write_turn` let the database settle
        that (the loser's statement waits for the winner's row and updates it, or does nothing),
        and any other collision on a key fails the transaction, which is run again. SQLite never
        races here: its writers take turns (BEGIN IMMEDIATE).
        """
        return self.record_turns([TurnWrite(turn, id_source, continues, session_done, now)])[0]

    def record_turns(self, writes: list[TurnWrite]) -> list[int]:
        """Write several turns in ONE transaction, so that one commit (one fsync) makes them all
        durable: the server's group commit (serve/completions.py) hands over every turn that
        finished while the previous commit was under way. Returns each turn's index within its
        session, in order. All or nothing: when the transaction fails, none of them is written and
        the error is raised (after the retries of `record_turn`), so the caller can record them
        one by one and let each request meet its own error."""
        nows = [time.time() if write.now is None else write.now for write in writes]
        for _ in range(RECORD_ATTEMPTS - 1):
            try:
                return self._record_turns_once(writes, nows)
            except IntegrityError:
                continue  # another writer created a row first; the next try finds it
        return self._record_turns_once(writes, nows)

    def _record_turns_once(self, writes: list[TurnWrite], nows: list[float]) -> list[int]:
        with self.write() as db:
            return [self._write_turn(db, write, now) for write, now in zip(writes, nows, strict=True)]

    def _write_turn(self, db: DBSession, write: TurnWrite, now: float) -> int:
        """One turn's rows: an upsert of the session that counts the turn and returns its index,
        the turn, and the next state it carries unless the earlier turn already has one (the first
        continuation wins: a regenerated or branched request never overwrites it).

        This is on every request's critical path, so it runs Core statements built once
        (`_turn_statements`) on the transaction's connection: building an ORM unit of work, or even
        a new statement per call, cost several times what SQLite takes to run them.
        """
        count_turn, insert_turn, insert_next_state = _turn_statements(self.is_sqlite)
        turn, continues, connection = write.turn, write.continues, db.connection()
        index = connection.execute(count_turn, {
            "id": turn.session_id, "id_source": write.id_source, "created_at": now, "updated_at": now,
            "done": write.session_done, "done_reason": "client" if write.session_done else None, "num_turns": 1,
        }).scalar_one() - 1  # fmt: skip
        connection.execute(insert_turn, _row_values(records.turn_row(dataclasses.replace(turn, index=index, created_at=now))))
        if continues is not None:
            row = records.next_state_row(dataclasses.replace(continues, created_at=now))
            if connection.execute(insert_next_state, _row_values(row)).first() is not None:
                queue_for_judging(db, continues.turn_id)
        return index

    def turns_with_answer(self, fingerprints: list[str]) -> list[Turn]:
        """Main turns whose answer has one of these fingerprints, newest first, open sessions only."""
        if not fingerprints:
            return []
        with self.read() as db:
            query = (
                select(TurnRow)
                .join(SessionRow, SessionRow.id == TurnRow.session_id)
                .where(TurnRow.answer_fingerprint.in_(fingerprints), TurnRow.kind == "main", ~SessionRow.done)
                .order_by(TurnRow.created_at.desc())
                .limit(64)
            )
            return [records.turn(row) for row in db.scalars(query)]

    def recent_empty_answers(self, since: float, limit: int = 16) -> list[Turn]:
        """Main turns of open sessions answered with nothing (no text, no tool call) since `since`, newest first."""
        with self.read() as db:
            query = (
                select(TurnRow)
                .join(SessionRow, SessionRow.id == TurnRow.session_id)
                .where(TurnRow.kind == "main", ~SessionRow.done, TurnRow.created_at >= since,
                       func.length(func.trim(TurnRow.response_text)) == 0, TurnRow.finish_reason != "tool_calls")
                .order_by(TurnRow.created_at.desc())
                .limit(limit)
            )  # fmt: skip
            return [records.turn(row) for row in db.scalars(query)]

    def last_main_turn(self, session_id: str) -> Turn | None:
        with self.read() as db:
            query = (
                select(TurnRow)
                .where(TurnRow.session_id == session_id, TurnRow.kind == "main")
                .order_by(TurnRow.index.desc())
                .limit(1)
            )
            row = db.scalars(query).first()
            return records.turn(row) if row is not None else None

    def close_idle_sessions(self, idle_s: float, now: float | None = None) -> int:
        """Mark sessions with no request for `idle_s` seconds as done; returns how many."""
        cutoff = (time.time() if now is None else now) - idle_s
        with self.write() as db:
            result = db.execute(
                update(SessionRow)
                .where(~SessionRow.done, SessionRow.updated_at < cutoff)
                .values(done=True, done_reason="idle")
            )
            return result.rowcount

    def add_feedback(self, turn_id: str, score: int, text: str | None) -> int:
        with self.write() as db:
            row = FeedbackRow(turn_id=turn_id, score=score, text=text, created_at=time.time())
            db.add(row)
            db.flush()
            queue_for_judging(db, turn_id)
            return row.id

    # --- judging ------------------------------------------------------------------------------
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
        with self.write() as db:
            candidates = list(db.scalars(query))
            return [turn_id for turn_id in candidates if self._take_lease(db, turn_id, worker_id, now, lease_s)]

    def _take_lease(self, db: DBSession, turn_id: str, worker_id: str, now: float, lease_s: float) -> bool:
        """Create the turn's lease, or renew it if it has expired; False if a live lease exists.

        One statement (an upsert whose update is conditional) so that the database arbitrates: on
        PostgreSQL the candidate query's snapshot can predate another worker's committed lease,
        and only the lease row itself, locked by the upsert, tells the truth.
        """
        insert = sqlite_insert if self.is_sqlite else postgresql_insert
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
            with self.write() as db:
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
        with self.write() as db:
            db.execute(
                update(JudgeLeaseRow)
                .where(JudgeLeaseRow.turn_id == turn_id, JudgeLeaseRow.worker_id == worker_id)
                .values(expires_at=expired)
            )

    def judge_backlog(self, now: float | None = None) -> tuple[int, float]:
        """How many turns wait for a verdict, and how long the oldest of them has been recorded (s)."""
        now = time.time() if now is None else now
        with self.read() as db:
            waiting, oldest = db.execute(select(func.count(), func.min(JudgeQueueRow.turn_created_at))).one()
            return waiting, (now - oldest if oldest is not None else 0.0)

    def judgment(self, turn_id: str) -> Judgment | None:
        with self.read() as db:
            row = db.get(JudgmentRow, turn_id)
            return records.judgment(row) if row is not None else None

    def judgment_stats(self) -> list[JudgmentStats]:
        """Aggregates of all verdicts per policy version (what `/metrics` exports)."""
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
        with self.read() as db:
            return [JudgmentStats(*row) for row in db.execute(query)]

    def turn_context(self, turn_id: str) -> TurnContext:
        """A turn with its next state and explicit feedback (oldest first): what a judge needs."""
        with self.read() as db:
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
        with self.read() as db:
            rows = db.scalars(select(JudgmentRow).where(JudgmentRow.turn_id.in_(turn_ids)))
            return {row.turn_id: records.judgment(row) for row in rows}

    # --- inspection ---------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """How much the store holds: sessions (open ones too), turns by kind, next states, judgments, feedback."""
        with self.read() as db:
            turns = dict(db.execute(select(TurnRow.kind, func.count()).group_by(TurnRow.kind)).all())
            return {
                "sessions": db.scalar(select(func.count()).select_from(SessionRow)) or 0,
                "open_sessions": db.scalar(select(func.count()).where(SessionRow.done.is_(False))) or 0,
                "main_turns": turns.get("main", 0),
                "side_turns": turns.get("side", 0),
                "next_states": db.scalar(select(func.count()).select_from(NextStateRow)) or 0,
                "judged": db.scalar(select(func.count()).select_from(JudgmentRow)) or 0,
                "feedback": db.scalar(select(func.count()).select_from(FeedbackRow)) or 0,
            }

    def turn(self, turn_id: str) -> Turn | None:
        with self.read() as db:
            row = db.get(TurnRow, turn_id)
            return records.turn(row) if row is not None else None

    def session(self, session_id: str) -> Session | None:
        with self.read() as db:
            row = db.get(SessionRow, session_id)
            return records.session(row) if row is not None else None

    def list_sessions(self, limit: int = 100) -> list[Session]:
        with self.read() as db:
            rows = db.scalars(select(SessionRow).order_by(SessionRow.updated_at.desc()).limit(limit))
            return [records.session(row) for row in rows]

    def session_turns(self, session_id: str) -> list[TurnContext]:
        """A session's turns in order, each with its next state and feedback (see `judgments_for`)."""
        with self.read() as db:
            turns = list(db.scalars(select(TurnRow).where(TurnRow.session_id == session_id).order_by(TurnRow.index)))
            ids = [turn.id for turn in turns]
            next_states = {
                row.turn_id: records.next_state(row)
                for row in db.scalars(select(NextStateRow).where(NextStateRow.turn_id.in_(ids)))
            }
            feedback: dict[str, list[Feedback]] = {}
            for row in db.scalars(select(FeedbackRow).where(FeedbackRow.turn_id.in_(ids)).order_by(FeedbackRow.id)):
                feedback.setdefault(row.turn_id, []).append(records.feedback(row))
            return [TurnContext(records.turn(turn), next_states.get(turn.id), feedback.get(turn.id, [])) for turn in turns]

    def iter_main_turns(self, batch: int = 500) -> Iterator[tuple[Turn, NextState | None]]:
        """Every main turn in arrival order with its next state, read in batches."""
        after: tuple[float, str] = (-1.0, "")
        while True:
            with self.read() as db:
                rows = db.execute(
                    select(TurnRow, NextStateRow)
                    .outerjoin(NextStateRow, NextStateRow.turn_id == TurnRow.id)
                    .where(TurnRow.kind == "main", tuple_(TurnRow.created_at, TurnRow.id) > after)
                    .order_by(TurnRow.created_at, TurnRow.id)
                    .limit(batch)
                ).all()
            if not rows:
                return
            for turn, next_state in rows:
                yield records.turn(turn), (records.next_state(next_state) if next_state is not None else None)
            after = (rows[-1][0].created_at, rows[-1][0].id)


_TURN_STATEMENTS: dict[bool, tuple[Any, Any, Any]] = {}


def _turn_statements(is_sqlite: bool) -> tuple[Any, Any, Any]:
    """The statements that record a turn (see `Store._write_turn`), built once per dialect; the
    values come as parameters. The session's upsert creates it (its `id_source` and `created_at`
    are kept from then on) or counts one more turn, and returns the count; on a server database it
    also settles two requests racing to create the same session (the second waits and counts)."""
    if is_sqlite not in _TURN_STATEMENTS:
        insert = sqlite_insert if is_sqlite else postgresql_insert
        sessions, next_states = SessionRow.__table__, NextStateRow.__table__
        upsert = insert(sessions)
        count_turn = upsert.on_conflict_do_update(
            index_elements=[sessions.c.id],
            set_={"done": upsert.excluded.done, "done_reason": upsert.excluded.done_reason,
                  "updated_at": upsert.excluded.updated_at, "num_turns": sessions.c.num_turns + 1},
        ).returning(sessions.c.num_turns)  # fmt: skip
        insert_next_state = (
            insert(next_states).on_conflict_do_nothing(index_elements=[next_states.c.turn_id]).returning(next_states.c.turn_id)
        )
        _TURN_STATEMENTS[is_sqlite] = (count_turn, TurnRow.__table__.insert(), insert_next_state)
    return _TURN_STATEMENTS[is_sqlite]


def _row_values(row: Any) -> dict[str, Any]:
    """The column values set on a new ORM row (built by `records`), for a Core insert."""
    return {key: value for key, value in vars(row).items() if not key.startswith("_sa_")}


def _configure_sqlite(engine: Any) -> None:
    """WAL, full fsync on commit, a generous busy timeout, and BEGIN IMMEDIATE for writers."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves (below)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
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
