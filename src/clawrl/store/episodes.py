"""Episodes in the store (DESIGN §9): registering them, ending them, and reading whole groups back.

An episode is registered (`running`) before its first step reaches the chat API, so the trainer
never takes its turns for a chat's; its steps are its session's main turns in order. Ending it
records the outcome and the per-step environment rewards, and the last step's observation as that
step's next state (no later request carries it), and closes the session. A group (the G episodes
of one task) is handed to the trainer once all of its episodes have ended.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from sqlalchemy import Select, case, false, func, select, true, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DBSession

import clawrl.store.records as records
from clawrl.store.database import Database
from clawrl.store.queues import queue_for_judging
from clawrl.store.schema import EpisodeRow, JudgmentRow, NextStateRow, SampleRow, SessionRow, TurnRow, unsampled_step
from clawrl.types import EPISODE_RESULT_SOURCE, Episode, EpisodeStatus, Message, NextState, Turn


class EpisodeExistsError(Exception):
    """An episode is already registered under this session id."""


class UnknownEpisodeError(KeyError):
    """No episode is registered under this session id."""


class EpisodeEndedError(Exception):
    """The episode has already ended; its result is recorded once."""


class StepCountError(ValueError):
    """A finished episode's step rewards do not match its recorded steps (main turns)."""


@dataclass
class EpisodeStep:
    """One step of an episode: its turn, whether its next state arrived, the judge's score if judged,
    and whether it already has a sample (a failed episode's late turn may arrive after the others')."""

    turn: Turn
    has_next_state: bool
    judge_score: int | None
    has_sample: bool


@dataclass
class PlayedEpisode:
    """An ended episode with its steps in order."""

    episode: Episode
    steps: list[EpisodeStep]


@dataclass
class EpisodeGroup:
    """The ended episodes of one group (one task), some of whose steps have no sample yet."""

    group_id: str
    episodes: list[PlayedEpisode]


class EpisodeStore:
    """Environment episodes and their groups (`store.episodes`)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def start(self, episode: Episode) -> None:
        """Register a running episode; EpisodeExistsError when its session id is taken."""
        row = records.episode_row(dataclasses.replace(episode, status="running", created_at=time.time(), ended_at=None))
        try:
            with self.database.write() as db:
                db.add(row)
        except IntegrityError:  # the primary key: registered before, or by a concurrent request
            raise EpisodeExistsError(episode.session_id) from None

    def end(
        self,
        session_id: str,
        status: EpisodeStatus,
        reward: float | None,
        step_rewards: list[float],
        error: str | None,
        final_observation: list[Message],
    ) -> Episode:
        """Record how the episode ended and close its session.

        A finished episode's `final_observation` (what the environment answered to the last step)
        becomes the last step's next state, so that the step is judged like the others. Raises
        UnknownEpisodeError, EpisodeEndedError, or StepCountError when a finished episode's
        `step_rewards` do not match its main turns.
        """
        now = time.time()
        with self.database.write() as db:
            row = db.get(EpisodeRow, session_id, with_for_update=True)
            if row is None:
                raise UnknownEpisodeError(session_id)
            if row.status != "running":
                raise EpisodeEndedError(session_id)
            if status == "finished":
                steps = list(db.scalars(
                    select(TurnRow.id).where(TurnRow.session_id == session_id, TurnRow.kind == "main").order_by(TurnRow.index)
                ))  # fmt: skip
                if len(steps) != len(step_rewards):
                    raise StepCountError(f"the episode has {len(steps)} recorded steps but {len(step_rewards)} step rewards")
                # the first continuation wins, as in record_turn: a next state is never overwritten
                if final_observation and steps and db.get(NextStateRow, steps[-1]) is None:
                    db.add(records.next_state_row(NextState(steps[-1], final_observation, EPISODE_RESULT_SOURCE, now)))
                    queue_for_judging(db, steps[-1])
            row.status, row.reward, row.step_rewards, row.error, row.ended_at = status, reward, list(step_rewards), error, now
            session = db.get(SessionRow, session_id)
            if session is not None:
                session.done, session.done_reason, session.updated_at = True, "client", now
            db.flush()
            mark_sampled(db, [session_id])  # one that never stepped has nothing to wait for
            return records.episode(row)

    def fail_abandoned(self, idle_s: float, now: float | None = None) -> int:
        """End as failed every running episode with no request or result for `idle_s` seconds.

        A rollout client that dies mid-episode never posts the result; without this its group
        would wait for it forever and the group's finished episodes would never train. Idle
        means: its session's last request (or, before any, its registration) is older than
        `idle_s`. Returns how many episodes were ended.
        """
        now = time.time() if now is None else now
        cutoff = now - idle_s
        last_activity = func.coalesce(select(SessionRow.updated_at).where(SessionRow.id == EpisodeRow.session_id)
                                      .scalar_subquery(), EpisodeRow.created_at)  # fmt: skip
        error = f"abandoned: no request and no result for {idle_s:g}s"
        with self.database.write() as db:
            rows = list(db.scalars(select(EpisodeRow).where(EpisodeRow.status == "running", last_activity < cutoff)
                                   .with_for_update()))  # fmt: skip
            for row in rows:
                row.status, row.error, row.ended_at = "failed", error, now
            return len(rows)

    def episode(self, session_id: str) -> Episode | None:
        with self.database.read() as db:
            row = db.get(EpisodeRow, session_id)
            return records.episode(row) if row is not None else None

    def groups_to_sample(self, limit: int) -> list[EpisodeGroup]:
        """Up to `limit` groups, oldest first, whose episodes have all ended and some of whose steps have no sample.

        Only the groups with an episode not yet `sampled` are looked at (found by `ix_episodes_waiting`),
        so a poll costs what the groups still waiting hold, however many groups trained before.
        """
        with self.database.read() as db:
            group_ids = list(db.scalars(groups_to_sample_query(limit)))
            return [self._group(db, group_id) for group_id in group_ids]

    def _group(self, db: DBSession, group_id: str) -> EpisodeGroup:
        episodes = list(db.scalars(select(EpisodeRow).where(EpisodeRow.group_id == group_id).order_by(EpisodeRow.seed, EpisodeRow.session_id)))
        sessions = [row.session_id for row in episodes]
        turns = list(db.scalars(select(TurnRow).where(TurnRow.session_id.in_(sessions), TurnRow.kind == "main").order_by(TurnRow.index)))
        ids = [turn.id for turn in turns]
        with_next = set(db.scalars(select(NextStateRow.turn_id).where(NextStateRow.turn_id.in_(ids))))
        scores = dict(db.execute(select(JudgmentRow.turn_id, JudgmentRow.score).where(JudgmentRow.turn_id.in_(ids))).all())
        with_sample = set(db.scalars(select(SampleRow.turn_id).where(SampleRow.turn_id.in_(ids))))
        steps: dict[str, list[EpisodeStep]] = {session: [] for session in sessions}
        for turn in turns:
            step = EpisodeStep(records.turn(turn), turn.id in with_next, scores.get(turn.id), turn.id in with_sample)
            steps[turn.session_id].append(step)
        return EpisodeGroup(group_id, [PlayedEpisode(records.episode(row), steps[row.session_id]) for row in episodes])


def groups_to_sample_query(limit: int) -> Select[tuple[str]]:
    """The ids of `EpisodeStore.groups_to_sample`'s groups: among the groups with an episode not `sampled`,
    those whose episodes have all ended and one of which has a step with no sample, oldest first."""
    ended = func.sum(case((EpisodeRow.status != "running", 1), else_=0))
    waiting = select(EpisodeRow.group_id).where(EpisodeRow.sampled == false())
    return (
        select(EpisodeRow.group_id)
        .where(EpisodeRow.group_id.in_(waiting))
        .group_by(EpisodeRow.group_id)
        .having(ended >= func.min(EpisodeRow.group_size))
        .having(func.max(case((unsampled_step(), 1), else_=0)) == 1)
        .order_by(func.min(EpisodeRow.created_at), EpisodeRow.group_id)
        .limit(limit)
    )


def mark_sampled(db: DBSession, session_ids: list[str] | Select[tuple[str]]) -> None:
    """Inside the caller's write transaction: set `sampled` on the episodes of the groups of `session_ids`
    (chat sessions have none) that have ended and whose every main turn has a sample now.

    The rows are locked first and only then is that looked at, in a statement of its own: on
    PostgreSQL, a turn recorded meanwhile (`TurnStore.record_turns` clears the flag under the same
    row lock) is then either seen, or clears the flag after this commits.
    """
    groups = select(EpisodeRow.group_id).where(EpisodeRow.session_id.in_(session_ids))
    candidates = (
        select(EpisodeRow.session_id)
        .where(EpisodeRow.group_id.in_(groups), EpisodeRow.status != "running", EpisodeRow.sampled == false())
        .order_by(EpisodeRow.session_id)  # one lock order for every writer of several
        .with_for_update()
    )
    locked = list(db.scalars(candidates))
    if locked:
        statement = update(EpisodeRow).where(EpisodeRow.session_id.in_(locked), ~unsampled_step()).values(sampled=true())
        db.execute(statement.execution_options(synchronize_session=False))
