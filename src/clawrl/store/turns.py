"""The conversation record: finished turns and their sessions, next states and feedback.

Serving writes here (one transaction per turn, or per group commit) and reads the turns that
session resolution needs; the CLI and the dashboard read sessions and turns back.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, bindparam, func, select, text, true, tuple_, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DBSession

import clawrl.store.records as records
from clawrl.store.database import Database
from clawrl.store.queues import queue_for_judging
from clawrl.store.schema import EMPTY_ANSWER, EpisodeRow, FeedbackRow, JudgmentRow, NextStateRow, SessionRow, TurnRow, turn_ids_of
from clawrl.types import DEFAULT_USER, Feedback, NextState, Session, SessionIdSource, Turn, TurnContext

RECORD_ATTEMPTS = 3  # transactions tried per turn when concurrent writers collide on a key (server databases)


@dataclass
class TurnWrite:
    """One finished turn to record: `TurnStore.record_turn`'s arguments (`now` None: the time of the write)."""

    turn: Turn
    id_source: SessionIdSource
    continues: NextState | None = None
    session_done: bool = False
    now: float | None = None
    user_id: str = DEFAULT_USER  # whose request it was: a new session becomes theirs


class TurnStore:
    """Sessions, turns, next states and feedback (`store.turns`)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def record_turn(
        self,
        turn: Turn,
        id_source: SessionIdSource,
        continues: NextState | None = None,
        session_done: bool = False,
        now: float | None = None,
        user_id: str = DEFAULT_USER,
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
        return self.record_turns([TurnWrite(turn, id_source, continues, session_done, now, user_id)])[0]

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
            except IntegrityError:  # another writer created a row first; the next try finds it
                writes = self._without_removed_continuations(writes)
        return self._record_turns_once(writes, nows)

    def _without_removed_continuations(self, writes: list[TurnWrite]) -> list[TurnWrite]:
        """`writes`, with no next state for a turn that is gone (removed by retention or a forget while
        the request was answered): the new turn is recorded all the same, its next state has no turn."""
        continued = {write.continues.turn_id for write in writes if write.continues is not None}
        with self.database.read() as db:
            present = set(db.scalars(select(TurnRow.id).where(TurnRow.id.in_(continued)))) if continued else set()
        return [dataclasses.replace(write, continues=None) if write.continues is not None and write.continues.turn_id
                not in present else write for write in writes]  # fmt: skip

    def _record_turns_once(self, writes: list[TurnWrite], nows: list[float]) -> list[int]:
        with self.database.write() as db:
            return [self._write_turn(db, write, now) for write, now in zip(writes, nows, strict=True)]

    def _write_turn(self, db: DBSession, write: TurnWrite, now: float) -> int:
        """One turn's rows: an upsert of the session that counts the turn and returns its index,
        the turn, and the next state it carries unless the earlier turn already has one (the first
        continuation wins: a regenerated or branched request never overwrites it) or the request
        opted out of training (the turn before is then judged by its feedback alone). A session is
        no-train for good when the request that starts it opts out (`Turn.opt_out` "request"): its
        later turns are recorded as opted out by the session, unless they say why themselves.

        This is on every request's critical path, so it runs Core statements built once
        (`_turn_statements`) on the transaction's connection: building an ORM unit of work, or even
        a new statement per call, cost several times what SQLite takes to run them.
        """
        count_turn, insert_turn, insert_next_state, clear_sampled = _turn_statements(self.database.is_sqlite)
        turn, continues, connection = write.turn, write.continues, db.connection()
        if turn.kind == "main":  # a step of an episode whose steps had all been sampled is not any more
            connection.execute(clear_sampled, {"episode": turn.session_id})
        for _attempt in range(SESSION_NAME_ATTEMPTS):
            counted = connection.execute(count_turn, {
                "id": turn.session_id, "id_source": write.id_source, "created_at": now, "updated_at": now,
                "done": write.session_done, "done_reason": "client" if write.session_done else None, "num_turns": 1,
                "user_id": write.user_id, "train": turn.opt_out != "request",
            }).first()  # fmt: skip
            if counted is not None:
                break
            # Another user's session took this id after the request's session was resolved (while it
            # was being answered): never join it (their records would hold this user's words, out of
            # reach of this user's export and forget); the next `~` variant, as `owned_session_id`
            # names it and so finds it again for this user's next request.
            turn = dataclasses.replace(turn, session_id=_next_variant(turn.session_id, write.user_id))
        else:
            raise IntegrityError("recording a turn", None, ValueError("every variant of the session id is another's"))
        counted, session_train = counted
        if turn.kind == "main" and turn.session_id != write.turn.session_id:
            connection.execute(clear_sampled, {"episode": turn.session_id})
        index, opt_out = counted - 1, turn.opt_out or (None if session_train else "session")
        row = records.turn_row(dataclasses.replace(turn, index=index, created_at=now, opt_out=opt_out))
        connection.execute(insert_turn, _row_values(row))
        # A request that opted out of training (itself, or its user) carries no next state: its words
        # would otherwise score the turn before it and, as the judge's hint, teach it (DESIGN §12)
        if continues is not None and turn.opt_out is None:
            row = records.next_state_row(dataclasses.replace(continues, created_at=now))
            if connection.execute(insert_next_state, _row_values(row)).first() is not None:
                queue_for_judging(db, continues.turn_id)
        return index

    def turns_with_answer(self, fingerprints: list[str], user_id: str = DEFAULT_USER) -> list[Turn]:
        """Main turns of `user_id`'s open sessions whose answer has one of these fingerprints, newest first."""
        if not fingerprints:
            return []
        with self.database.read() as db:
            query = (
                select(TurnRow)
                .join(SessionRow, SessionRow.id == TurnRow.session_id)
                .where(TurnRow.answer_fingerprint.in_(fingerprints), TurnRow.kind == "main", ~SessionRow.done,
                       _owner_is(user_id))  # fmt: skip
                .order_by(TurnRow.created_at.desc())
                .limit(64)
            )
            return [records.turn(row) for row in db.scalars(query)]

    def recent_empty_answers(self, since: float, user_id: str = DEFAULT_USER, limit: int = 16) -> list[Turn]:
        """Main turns of `user_id`'s open sessions answered with nothing (no text, no tool call) since
        `since`, newest first."""
        with self.database.read() as db:
            query = (
                select(TurnRow)
                .join(SessionRow, SessionRow.id == TurnRow.session_id)
                .where(text(EMPTY_ANSWER), ~SessionRow.done, TurnRow.created_at >= since, _owner_is(user_id))
                .order_by(TurnRow.created_at.desc())
                .limit(limit)
            )  # fmt: skip
            return [records.turn(row) for row in db.scalars(query)]

    def last_main_turn(self, session_id: str) -> Turn | None:
        with self.database.read() as db:
            query = (
                select(TurnRow)
                .where(TurnRow.session_id == session_id, TurnRow.kind == "main")
                .order_by(TurnRow.index.desc())
                .limit(1)
            )
            row = db.scalars(query).first()
            return records.turn(row) if row is not None else None

    def next_states(self, turn_ids: list[str]) -> dict[str, NextState]:
        """The next states these turns have, by turn id (a turn without one is absent)."""
        with self.database.read() as db:
            return _next_states(db, turn_ids)

    def close_idle_sessions(self, idle_s: float, now: float | None = None) -> int:
        """Mark sessions with no request for `idle_s` seconds as done; returns how many."""
        cutoff = (time.time() if now is None else now) - idle_s
        with self.database.write() as db:
            result = db.execute(
                update(SessionRow)
                .where(~SessionRow.done, SessionRow.updated_at < cutoff)
                .values(done=True, done_reason="idle")
            )
            return result.rowcount

    def add_feedback(self, turn_id: str, score: int, text: str | None) -> int:
        with self.database.write() as db:
            row = FeedbackRow(turn_id=turn_id, score=score, text=text, created_at=time.time())
            db.add(row)
            db.flush()
            queue_for_judging(db, turn_id)
            return row.id

    def counts(self, user_id: str | None = None) -> dict[str, int]:
        """How much the store holds: sessions (open ones too), turns by kind, next states, judgments,
        feedback; of `user_id`'s sessions only, or (None) of everyone's."""
        sessions = select(func.count()).select_from(SessionRow)
        turns = select(TurnRow.kind, func.count()).group_by(TurnRow.kind)
        per_turn = {"next_states": NextStateRow.turn_id, "judged": JudgmentRow.turn_id, "feedback": FeedbackRow.turn_id}
        counted = {name: select(func.count(column)) for name, column in per_turn.items()}
        if user_id is not None:
            sessions = sessions.where(SessionRow.user_id == user_id)
            turns = turns.where(TurnRow.id.in_(turn_ids_of(user_id)))
            counted = {name: query.where(per_turn[name].in_(turn_ids_of(user_id))) for name, query in counted.items()}
        with self.database.read() as db:
            by_kind = dict(db.execute(turns).all())
            return {
                "sessions": db.scalar(sessions) or 0,
                "open_sessions": db.scalar(sessions.where(SessionRow.done.is_(False))) or 0,
                "main_turns": by_kind.get("main", 0),
                "side_turns": by_kind.get("side", 0),
                **{name: db.scalar(query) or 0 for name, query in counted.items()},
            }

    def turn(self, turn_id: str) -> Turn | None:
        with self.database.read() as db:
            row = db.get(TurnRow, turn_id)
            return records.turn(row) if row is not None else None

    def session(self, session_id: str) -> Session | None:
        with self.database.read() as db:
            row = db.get(SessionRow, session_id)
            return records.session(row) if row is not None else None

    def list_sessions(self, limit: int = 100, user_id: str | None = None) -> list[Session]:
        """The most recently active sessions, of `user_id` only or (None) of everyone."""
        query = select(SessionRow).order_by(SessionRow.updated_at.desc()).limit(limit)
        if user_id is not None:
            query = query.where(SessionRow.user_id == user_id)
        with self.database.read() as db:
            return [records.session(row) for row in db.scalars(query)]

    def session_turns(self, session_id: str) -> list[TurnContext]:
        """A session's turns in order, each with its next state and feedback (see `judgments_for`)."""
        with self.database.read() as db:
            turns = list(db.scalars(select(TurnRow).where(TurnRow.session_id == session_id).order_by(TurnRow.index)))
            ids = [turn.id for turn in turns]
            next_states = _next_states(db, ids)
            feedback: dict[str, list[Feedback]] = {}
            for row in db.scalars(select(FeedbackRow).where(FeedbackRow.turn_id.in_(ids)).order_by(FeedbackRow.id)):
                feedback.setdefault(row.turn_id, []).append(records.feedback(row))
            return [TurnContext(records.turn(turn), next_states.get(turn.id), feedback.get(turn.id, [])) for turn in turns]

    def iter_main_turns(self, batch: int = 500, user_id: str | None = None) -> Iterator[tuple[Turn, NextState | None]]:
        """Every main turn in arrival order with its next state, read in batches: of `user_id`'s
        sessions only, or (None) of everyone's."""
        after: tuple[float, str] = (-1.0, "")
        query = select(TurnRow, NextStateRow).outerjoin(NextStateRow, NextStateRow.turn_id == TurnRow.id)
        if user_id is not None:
            query = query.join(SessionRow, SessionRow.id == TurnRow.session_id).where(SessionRow.user_id == user_id)
        while True:
            with self.database.read() as db:
                rows = db.execute(
                    query.where(TurnRow.kind == "main", tuple_(TurnRow.created_at, TurnRow.id) > after)
                    .order_by(TurnRow.created_at, TurnRow.id)
                    .limit(batch)
                ).all()
            if not rows:
                return
            for turn, next_state in rows:
                yield records.turn(turn), (records.next_state(next_state) if next_state is not None else None)
            after = (rows[-1][0].created_at, rows[-1][0].id)


def _owner_is(user_id: str) -> ColumnElement[bool]:
    """The session is `user_id`'s, as a condition no index answers, for the lookups that run on every
    request (an echoed answer's fingerprint, a recent empty answer): their turns are few and indexed,
    a user's sessions many. Given `sessions.user_id = ?`, SQLite's planner, which has no statistics,
    walked every session of the user and each one's turns (8-11 ms a request at 20,000 sessions, and
    growing with them); with `user_id || ''` it reads the few turns first and their sessions by key.
    PostgreSQL plans either by its statistics."""
    return SessionRow.user_id.concat("") == user_id


def _next_states(db: DBSession, turn_ids: list[str]) -> dict[str, NextState]:
    rows = db.scalars(select(NextStateRow).where(NextStateRow.turn_id.in_(turn_ids)))
    return {row.turn_id: records.next_state(row) for row in rows}


_TURN_STATEMENTS: dict[bool, tuple[Any, Any, Any, Any]] = {}


def _turn_statements(is_sqlite: bool) -> tuple[Any, Any, Any, Any]:
    """The statements that record a turn (see `TurnStore._write_turn`), built once per dialect; the
    values come as parameters. The session's upsert creates it (its `id_source`, `created_at` and
    `train` are kept from then on) or counts one more turn, and returns the count and `train`; on a
    server database it also settles two requests racing to create the same session (the second
    waits and counts)."""
    if is_sqlite not in _TURN_STATEMENTS:
        insert = sqlite_insert if is_sqlite else postgresql_insert
        sessions, next_states = SessionRow.__table__, NextStateRow.__table__
        upsert = insert(sessions)
        count_turn = upsert.on_conflict_do_update(
            index_elements=[sessions.c.id],
            set_={"done": upsert.excluded.done, "done_reason": upsert.excluded.done_reason,
                  "updated_at": upsert.excluded.updated_at, "num_turns": sessions.c.num_turns + 1},
            where=sessions.c.user_id == upsert.excluded.user_id,  # another's session: no row (see `_write_turn`)
        ).returning(sessions.c.num_turns, sessions.c.train)  # fmt: skip
        insert_next_state = (
            insert(next_states).on_conflict_do_nothing(index_elements=[next_states.c.turn_id]).returning(next_states.c.turn_id)
        )
        # An episode's main turn clears its `sampled` (EpisodeStore.groups_to_sample), first thing: the
        # episode's row lock then comes before its session's, as in EpisodeStore.end. A server database
        # takes the lock even where the flag is clear already, for `episodes.mark_sampled` to wait on.
        episodes = EpisodeRow.__table__
        clear_sampled = update(episodes).where(episodes.c.session_id == bindparam("episode")).values(sampled=False)
        if is_sqlite:  # writers take turns: no lock is needed, and a row left as it is is not rewritten
            clear_sampled = clear_sampled.where(episodes.c.sampled == true())
        _TURN_STATEMENTS[is_sqlite] = (count_turn, TurnRow.__table__.insert(), insert_next_state, clear_sampled)
    return _TURN_STATEMENTS[is_sqlite]


SESSION_NAME_ATTEMPTS = 8  # as serve/auth.py's OWNED_NAME_ATTEMPTS


def _next_variant(session_id: str, user_id: str) -> str:
    """The `~`-marked variant of a session id that serve/auth.py's `owned_session_id` tries next
    ("alice/~inbox" for alice, "~alice/inbox" for the default user)."""
    head = "" if user_id == DEFAULT_USER else f"{user_id}/"
    return head + "~" + session_id.removeprefix(head)


def _row_values(row: Any) -> dict[str, Any]:
    """The column values set on a new ORM row (built by `records`), for a Core insert."""
    return {key: value for key, value in vars(row).items() if not key.startswith("_sa_")}
