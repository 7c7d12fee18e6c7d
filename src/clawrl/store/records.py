"""Rows to records and back: the one place where the store's tables meet the RL vocabulary.

Every record in `clawrl.types` names its fields after its table's columns, so the mapping is
field by field, with the exceptions kept here: a judgment's hint candidates, a turn's sampling
settings and a version's step metrics are JSON objects in the table and records
(`HintCandidate`, `TurnSampling`, `StepMetrics`) in the record, and a row's database-only columns
(ids, leases) are not part of any record. A JSON object written by an older clawrl may lack a
field a newer record has (its default fills it) or hold one it dropped (ignored). Everything the store returns is a record, detached from the database
session that read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any, TypeVar

from clawrl.store.schema import (
    EpisodeRow,
    FeedbackRow,
    JudgmentRow,
    MemoryNoteRow,
    NextStateRow,
    PolicyVersionRow,
    SampleRow,
    SessionRow,
    TurnRow,
    UserRow,
)
from clawrl.types import (
    Episode,
    Feedback,
    HintCandidate,
    Judgment,
    MemoryNote,
    NextState,
    PolicyVersion,
    Sample,
    Session,
    StepMetrics,
    Turn,
    TurnSampling,
    User,
)

Record = TypeVar("Record")


def _columns(record: Any) -> dict[str, Any]:
    return {item.name: getattr(record, item.name) for item in fields(record)}


def _record(cls: type[Record], row: Any) -> Record:
    return cls(**{item.name: getattr(row, item.name) for item in fields(cls)})  # type: ignore[arg-type]


def _from_json(cls: type[Record], values: Mapping[str, Any] | None) -> Record:
    """A nested record from its JSON object, taking the fields the record knows."""
    known = {item.name for item in fields(cls)}  # type: ignore[arg-type]
    return cls(**{name: value for name, value in (values or {}).items() if name in known})


def session(row: SessionRow) -> Session:
    return _record(Session, row)


def user(row: UserRow) -> User:
    return _record(User, row)


def turn(row: TurnRow) -> Turn:
    record = _record(Turn, row)
    record.sampling = _from_json(TurnSampling, row.sampling)
    return record


def turn_row(record: Turn) -> TurnRow:
    return TurnRow(**(_columns(record) | {"sampling": asdict(record.sampling)}))


def next_state(row: NextStateRow) -> NextState:
    return _record(NextState, row)


def next_state_row(record: NextState) -> NextStateRow:
    return NextStateRow(**_columns(record))


def feedback(row: FeedbackRow) -> Feedback:
    return _record(Feedback, row)


def memory_note(row: MemoryNoteRow) -> MemoryNote:
    return _record(MemoryNote, row)


def judgment(row: JudgmentRow) -> Judgment:
    record = _record(Judgment, row)
    record.hint_candidates = [HintCandidate(item["hint"], item.get("overlap")) for item in row.hint_candidates]
    return record


def judgment_row(record: Judgment) -> JudgmentRow:
    columns = _columns(record) | {"hint_candidates": [_columns(item) for item in record.hint_candidates]}
    return JudgmentRow(**columns)


def sample(row: SampleRow) -> Sample:
    return _record(Sample, row)


def sample_row(record: Sample) -> SampleRow:
    return SampleRow(**_columns(record))


def policy_version(row: PolicyVersionRow) -> PolicyVersion:
    record = _record(PolicyVersion, row)
    record.metrics = _from_json(StepMetrics, row.metrics)
    return record


def policy_version_row(record: PolicyVersion) -> PolicyVersionRow:
    return PolicyVersionRow(**(_columns(record) | {"metrics": asdict(record.metrics)}))


def episode(row: EpisodeRow) -> Episode:
    return _record(Episode, row)


def episode_row(record: Episode) -> EpisodeRow:
    return EpisodeRow(**_columns(record))
