"""The training side of the store: samples, published policy versions and the serving pointer.

The trainer's exactly-once guarantee lives here. A version is registered, its samples are marked
trained and the serving pointer is moved in ONE transaction, and only if the pointer still names
the version the step started from and every sample is still `ready`. A trainer killed anywhere
before that commit leaves its samples ready (they are trained again, once) and at most a version
directory with no row, which the next trainer discards; killed after it, the step is complete.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, delete, func, select, update
from sqlalchemy.orm import Session

import clawrl.store.records as records
from clawrl.store.database import Database
from clawrl.store.episodes import mark_sampled
from clawrl.store.forgetting import Retrained, high_water
from clawrl.store.pruning import SERVING, VersionPrunedError, mark_pruned, serving_pointer, unkept
from clawrl.store.schema import (
    EpisodeRow,
    FeedbackRow,
    JudgmentRow,
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
from clawrl.types import SHARED_LINEAGE, DropReason, Judgment, PointerReason, PolicyVersion, Sample, SampleStatus, TrainingExample, Turn


@dataclass
class JudgedTurn:
    """A judged main turn with no sample row yet: what the sample table of DESIGN §6 looks at."""

    turn: Turn
    judgment: Judgment
    has_next_state: bool
    has_feedback: bool
    first_judged_in_session: bool  # no earlier main turn of its session has a judgment
    user_id: str  # whose session it is


@dataclass
class HeldSample:
    """A session's first judged turn with no signal, waiting for the at-least-one decision."""

    turn_id: str
    session_done: bool
    session_has_sample: bool  # another turn of the session became a sample (ready or trained)


class PointerMovedError(RuntimeError):
    """The serving pointer no longer names the version a step was trained from (a rollback)."""


class SamplesTakenError(RuntimeError):
    """Some of a step's samples are no longer ready; the step must not be registered."""


class TrainingStore:
    """Samples, policy versions and the serving pointer (`store.training`)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    # --- building samples -----------------------------------------------------------------------
    def judged_turns_without_sample(self, limit: int) -> list[JudgedTurn]:
        """Judged main turns of chats (not of episodes: their samples wait for their group) that have
        no sample row yet, in arrival order: the sample queue's head."""
        query = (
            select(TurnRow, JudgmentRow, SessionRow.user_id)
            .select_from(SampleQueueRow)
            .join(TurnRow, TurnRow.id == SampleQueueRow.turn_id)
            .join(JudgmentRow, JudgmentRow.turn_id == SampleQueueRow.turn_id)
            .join(SessionRow, SessionRow.id == TurnRow.session_id)
            .order_by(SampleQueueRow.turn_created_at, SampleQueueRow.turn_id)
            .limit(limit)
        )
        with self.database.read() as db:
            rows = db.execute(query).all()
            ids = [turn.id for turn, _, _ in rows]
            with_next = set(db.scalars(select(NextStateRow.turn_id).where(NextStateRow.turn_id.in_(ids))))
            with_feedback = set(db.scalars(select(FeedbackRow.turn_id).where(FeedbackRow.turn_id.in_(ids))))
            return [
                JudgedTurn(
                    records.turn(turn),
                    records.judgment(judgment),
                    turn.id in with_next,
                    turn.id in with_feedback,
                    _first_judged(db, turn),
                    user_id,
                )
                for turn, judgment, user_id in rows
            ]

    def recent_chat_scores(self, limit: int, user_id: str | None = None) -> list[float]:
        """The judge's scores of the latest `limit` chat samples that carry a reward (kind rl or
        combined; episode steps excluded), oldest first: the reward baseline's window, of everyone's
        samples or (`user_id`) of one user's."""
        query = _of_user(
            select(JudgmentRow.score)
            .select_from(SampleRow)
            .join(JudgmentRow, JudgmentRow.turn_id == SampleRow.turn_id)
            .join(TurnRow, TurnRow.id == SampleRow.turn_id)
            .where(SampleRow.kind.in_(("rl", "combined")), TurnRow.session_id.not_in(select(EpisodeRow.session_id)))
            .order_by(SampleRow.id.desc())
            .limit(limit),
            user_id,
        )
        with self.database.read() as db:
            return [float(score) for score in reversed(db.scalars(query).all())]

    def add_samples(self, samples: list[Sample]) -> None:
        """Record what the trainer made of judged turns; a turn forgotten since it was read (its user's
        `forget`) gets none, rather than failing the batch on its foreign key. An episode whose every
        step has a sample now is marked `sampled`, in the same transaction."""
        now = time.time()
        with self.database.write() as db:
            present = set(db.scalars(select(TurnRow.id).where(TurnRow.id.in_([sample.turn_id for sample in samples]))))
            for sample in (sample for sample in samples if sample.turn_id in present):
                row = records.sample_row(dataclasses.replace(sample, created_at=now))
                row.settled_at = now if sample.status == "dropped" else None
                db.add(row)
            db.execute(delete(SampleQueueRow).where(SampleQueueRow.turn_id.in_([sample.turn_id for sample in samples])))
            db.flush()
            mark_sampled(db, select(TurnRow.session_id).where(TurnRow.id.in_(list(present))))

    def held_samples(self) -> list[HeldSample]:
        held = select(SampleRow.turn_id, TurnRow.session_id, SessionRow.done).join(TurnRow, TurnRow.id == SampleRow.turn_id)
        held = held.join(SessionRow, SessionRow.id == TurnRow.session_id).where(SampleRow.status == "held")
        with self.database.read() as db:
            rows = db.execute(held.order_by(SampleRow.id)).all()
            sessions = {session_id for _, session_id, _ in rows}
            with_sample = set(
                db.scalars(
                    select(TurnRow.session_id)
                    .join(SampleRow, SampleRow.turn_id == TurnRow.id)
                    .where(TurnRow.session_id.in_(sessions), SampleRow.status.in_(("ready", "trained")))
                )
            )
        return [HeldSample(turn_id, bool(done), session_id in with_sample) for turn_id, session_id, done in rows]

    def release_held(self, turn_ids: list[str]) -> None:
        """Held samples become ready (their session ended without any other sample)."""
        with self.database.write() as db:
            db.execute(
                update(SampleRow)
                .where(SampleRow.turn_id.in_(turn_ids), SampleRow.status == "held")
                .values(status="ready", kind="at_least_one")
            )

    def drop_samples(self, turn_ids: list[str], reason: DropReason, from_status: SampleStatus = "ready") -> None:
        with self.database.write() as db:
            db.execute(
                update(SampleRow)
                .where(SampleRow.turn_id.in_(turn_ids), SampleRow.status == from_status)
                .values(status="dropped", drop_reason=reason, settled_at=time.time())
            )

    # --- training -------------------------------------------------------------------------------
    def ready_samples(self, limit: int, user_id: str | None = None) -> list[TrainingExample]:
        """The oldest `limit` ready samples with their turns, in arrival order: of everyone (None),
        or of the sessions of `user_id` (a per-user lineage trains on those alone)."""
        query = (
            select(SampleRow, TurnRow)
            .join(TurnRow, TurnRow.id == SampleRow.turn_id)
            .where(SampleRow.status == "ready")
            .order_by(SampleRow.id)
            .limit(limit)
        )
        if user_id is not None:
            query = query.join(SessionRow, SessionRow.id == TurnRow.session_id).where(SessionRow.user_id == user_id)
        with self.database.read() as db:
            return [TrainingExample(records.turn(turn), records.sample(sample)) for sample, turn in db.execute(query).all()]

    def ready_by_user(self) -> dict[str, tuple[int, int]]:
        """Per user with ready samples: how many, and the id of their oldest (its arrival order)."""
        query = (
            select(SessionRow.user_id, func.count(), func.min(SampleRow.id))
            .select_from(SampleRow)
            .join(TurnRow, TurnRow.id == SampleRow.turn_id)
            .join(SessionRow, SessionRow.id == TurnRow.session_id)
            .where(SampleRow.status == "ready")
            .group_by(SessionRow.user_id)
        )
        with self.database.read() as db:
            return {user_id: (count, oldest) for user_id, count, oldest in db.execute(query).all()}

    def sample(self, turn_id: str) -> Sample | None:
        with self.database.read() as db:
            row = db.scalars(select(SampleRow).where(SampleRow.turn_id == turn_id)).first()
            return records.sample(row) if row is not None else None

    def samples_for(self, turn_ids: list[str]) -> dict[str, Sample]:
        """The sample of each of `turn_ids` that has one."""
        with self.database.read() as db:
            rows = db.scalars(select(SampleRow).where(SampleRow.turn_id.in_(turn_ids)))
            return {row.turn_id: records.sample(row) for row in rows}

    def drop_reasons(self, user_id: str | None = None) -> dict[str, int]:
        """Dropped samples by reason: everyone's, or (`user_id`) one user's."""
        query = select(SampleRow.drop_reason, func.count()).where(SampleRow.status == "dropped").group_by(SampleRow.drop_reason)
        with self.database.read() as db:
            rows = db.execute(_of_user(query, user_id)).all()
        return {reason or "unknown": count for reason, count in rows}

    def sample_counts(self, user_id: str | None = None) -> dict[str, int]:
        """Samples by status: everyone's, or (`user_id`) one user's."""
        query = select(SampleRow.status, func.count()).group_by(SampleRow.status)
        with self.database.read() as db:
            rows = db.execute(_of_user(query, user_id)).all()
        return {status: count for status, count in rows}

    def register_version(self, version: PolicyVersion, sample_turn_ids: list[str]) -> None:
        """Register `version`, mark its samples trained and point serving at it, atomically.

        Raises PointerMovedError when the serving pointer no longer names `version.parent` (a
        rollback happened during the step) and SamplesTakenError when a sample is not ready any
        more; nothing is written then.
        """
        now = time.time()
        with self.database.write() as db:
            if serving_pointer(db, version.lineage, lock=True) != version.parent:
                raise PointerMovedError(f"serving moved off v{version.parent} during the step")
            marked = db.execute(
                update(SampleRow)
                .where(SampleRow.turn_id.in_(sample_turn_ids), SampleRow.status == "ready")
                .values(status="trained", trained_version=version.version, settled_at=now)
            ).rowcount
            if marked != len(set(sample_turn_ids)):
                raise SamplesTakenError(f"{len(sample_turn_ids) - marked} of the step's samples are not ready any more")
            db.add(records.policy_version_row(dataclasses.replace(version, num_samples=marked, created_at=now)))
            _set_pointer(db, version.lineage, version.version, "publish", now)

    # --- versions -------------------------------------------------------------------------------
    def serving_version(self, lineage: str = SHARED_LINEAGE) -> int:
        """The version of `lineage` serving should answer with (0, the base model, when nothing was published)."""
        with self.database.read() as db:
            return serving_pointer(db, lineage)

    def serving_target(self, lineage: str = SHARED_LINEAGE) -> tuple[int, PointerReason, PolicyVersion | None]:
        """The lineage's serving pointer, why it was last moved (publish | rollback) and its version
        row (None for the base model), in one read."""
        with self.database.read() as db:
            pointer = db.get(PolicyPointerRow, (lineage, SERVING))
            if pointer is None:
                return 0, "publish", None
            reason: PointerReason = "rollback" if pointer.reason == "rollback" else "publish"
            if pointer.version == 0:
                return 0, reason, None
            row = db.get(PolicyVersionRow, pointer.version)
            return pointer.version, reason, records.policy_version(row) if row is not None else None

    def serving_targets(self) -> dict[str, tuple[int, PointerReason, PolicyVersion | None]]:
        """`serving_target` of every lineage that has a pointer, in one read: what serving many
        lineages polls."""
        with self.database.read() as db:
            pointers = db.scalars(select(PolicyPointerRow).where(PolicyPointerRow.name == SERVING)).all()
            numbers = [pointer.version for pointer in pointers if pointer.version != 0]
            rows = {row.version: row for row in db.scalars(select(PolicyVersionRow).where(PolicyVersionRow.version.in_(numbers)))}
            targets: dict[str, tuple[int, PointerReason, PolicyVersion | None]] = {}
            for pointer in pointers:
                reason: PointerReason = "rollback" if pointer.reason == "rollback" else "publish"
                row = rows.get(pointer.version)
                targets[pointer.lineage] = (pointer.version, reason, records.policy_version(row) if row is not None else None)
            return targets

    def lineages(self) -> list[str]:
        """Every lineage with a registered version or a serving pointer, sorted."""
        with self.database.read() as db:
            named = set(db.scalars(select(PolicyVersionRow.lineage).distinct()))
            named |= set(db.scalars(select(PolicyPointerRow.lineage).distinct()))
        return sorted(named)

    def version_numbers(self, lineage: str, with_pruned: bool = True) -> list[int]:
        """The lineage's version numbers, ascending: how many steps a sample's behaviour version is behind;
        without `with_pruned`, only those that still have their weights."""
        query = select(PolicyVersionRow.version).where(PolicyVersionRow.lineage == lineage).order_by(PolicyVersionRow.version)
        if not with_pruned:
            query = query.where(~PolicyVersionRow.pruned)
        with self.database.read() as db:
            return list(db.scalars(query))

    def version(self, version: int) -> PolicyVersion | None:
        with self.database.read() as db:
            row = db.get(PolicyVersionRow, version)
            return records.policy_version(row) if row is not None else None

    def versions(self, lineage: str | None = None) -> list[PolicyVersion]:
        """The registered versions, oldest first: of `lineage`, or of every lineage (None)."""
        query = select(PolicyVersionRow).order_by(PolicyVersionRow.version)
        if lineage is not None:
            query = query.where(PolicyVersionRow.lineage == lineage)
        with self.database.read() as db:
            return [records.policy_version(row) for row in db.scalars(query)]

    def newest_version(self, lineage: str = SHARED_LINEAGE) -> int:
        """The lineage's highest version number (0 when none): the age reference for staleness."""
        with self.database.read() as db:
            newest = select(func.max(PolicyVersionRow.version)).where(PolicyVersionRow.lineage == lineage)
            return db.scalar(newest) or 0

    def next_version_number(self) -> int:
        """One past the highest number of any lineage, or of a forgotten one: numbers are never shared
        between lineages, nor given out again (`store/forgetting.py`)."""
        with self.database.read() as db:
            return max(db.scalar(select(func.max(PolicyVersionRow.version))) or 0, high_water(db)) + 1

    def rollback(self, version: int, lineage: str = SHARED_LINEAGE) -> None:
        """Point the lineage's serving (and its trainer) at an earlier version; 0 is the base model.
        KeyError for a version not in the lineage, VersionPrunedError for one whose weights are gone."""
        with self.database.write() as db:
            serving_pointer(db, lineage, lock=True)  # first: a prune deciding meanwhile waits for this
            if version != 0:
                _version_of(db, version, lineage, unpruned=True)
            elif not _lineage_exists(db, lineage):  # the base: a pointer only for a lineage there is
                raise KeyError(f"no lineage {lineage!r} (the shared one, or a user's: `clawrl users list`)")
            _set_pointer(db, lineage, version, "rollback", time.time())

    def retrain_from(self, first: int, lineage: str = SHARED_LINEAGE) -> Retrained | None:
        """Undo the lineage's steps from version `first` on and have them trained again without what
        was deleted since (a forgotten user's samples): serving (and its trainer) points at `first`'s
        parent, and the samples that the serving version's ancestors from `first` on trained are
        ready again, in one transaction, so the trainer steps on them anew from there (those its
        staleness rule still takes). None when `first` is no ancestor of the serving version (a
        rollback undid it already). VersionPrunedError when the parent's weights are gone."""
        with self.database.write() as db:
            serving = serving_pointer(db, lineage, lock=True)  # first: a publish meanwhile fails on the moved pointer
            undone = _ancestry(db, serving, first)
            if not undone:
                return None
            parent = _version_of(db, first, lineage, unpruned=False).parent
            if parent != 0:
                _version_of(db, parent, lineage, unpruned=True)
            samples = db.execute(
                update(SampleRow)
                .where(SampleRow.trained_version.in_(undone))
                .values(status="ready", trained_version=None, settled_at=None)
            ).rowcount
            _set_pointer(db, lineage, parent, "rollback", time.time())
            return Retrained(lineage, parent, undone, samples)

    def set_pinned(self, version: int, pinned: bool, lineage: str = SHARED_LINEAGE) -> PolicyVersion:
        """Pin a version (`--keep-versions` never removes it, nor its parents back K steps) or unpin it.
        KeyError for a version not in the lineage; VersionPrunedError to pin one whose weights are gone."""
        with self.database.write() as db:
            serving_pointer(db, lineage, lock=True)  # as a rollback: a prune decides before or after, never between
            row = _version_of(db, version, lineage, unpruned=pinned)
            row.pinned = pinned
            return records.policy_version(row)

    def unkept_versions(self, lineage: str, keep_steps: int) -> list[int]:
        """The lineage's versions with weights on disk that `--keep-versions keep_steps` need not keep."""
        with self.database.read() as db:
            return unkept(db, lineage, keep_steps)

    def mark_pruned(self, lineage: str, versions: list[int], keep_steps: int) -> list[int]:
        """Mark those of `versions` that are still not kept as pruned (`store/pruning.py`): the caller
        removes their directories once this has committed. Returns the versions marked."""
        with self.database.write() as db:
            return mark_pruned(db, lineage, versions, keep_steps)


def _version_of(db: Session, version: int, lineage: str, unpruned: bool) -> PolicyVersionRow:
    """The row of `version` of `lineage` (KeyError: none); with `unpruned`, VersionPrunedError when its weights are gone."""
    row = db.get(PolicyVersionRow, version)
    if row is None or row.lineage != lineage:
        raise KeyError(f"no policy version v{version} in lineage {lineage!r}")
    if unpruned and row.pruned:
        raise VersionPrunedError(f"v{version} was pruned by --keep-versions: its weights are gone (its record stays); "
                                 "`clawrl versions list` shows the versions kept, `clawrl versions pin` keeps one")
    return row


def _ancestry(db: Session, version: int, first: int) -> list[int]:
    """`version` and its parents back to `first`, newest first; [] when `first` is not among them."""
    path = []
    while version != 0:
        path.append(version)
        if version == first:
            return path
        row = db.get(PolicyVersionRow, version)
        version = row.parent if row is not None else 0
    return []


def _lineage_exists(db: Session, lineage: str) -> bool:
    """The shared lineage, a user's, or one with versions or a pointer (a removed user's records stay)."""
    return (lineage == SHARED_LINEAGE or db.get(UserRow, lineage) is not None
            or db.scalar(select(PolicyPointerRow.lineage).where(PolicyPointerRow.lineage == lineage).limit(1)) is not None
            or db.scalar(select(PolicyVersionRow.version).where(PolicyVersionRow.lineage == lineage).limit(1)) is not None)


def _set_pointer(db: Session, lineage: str, version: int, reason: PointerReason, now: float) -> None:
    row = db.get(PolicyPointerRow, (lineage, SERVING))
    if row is None:
        db.add(PolicyPointerRow(lineage=lineage, name=SERVING, version=version, reason=reason, updated_at=now))
    else:
        row.version, row.reason, row.updated_at = version, reason, now


def _first_judged(db: Session, turn: TurnRow) -> bool:
    """Whether no main turn of `turn`'s session that arrived before it has a judgment."""
    earlier = (
        select(func.count())
        .select_from(TurnRow)
        .join(JudgmentRow, JudgmentRow.turn_id == TurnRow.id)
        .where(TurnRow.session_id == turn.session_id, TurnRow.kind == "main", TurnRow.index < turn.index)
    )
    return db.scalar(earlier) == 0


def _of_user(query: Select[Any], user_id: str | None) -> Select[Any]:
    """`query` over samples, narrowed to `user_id`'s turns (None: everyone's)."""
    return query if user_id is None else query.where(SampleRow.turn_id.in_(turn_ids_of(user_id)))
