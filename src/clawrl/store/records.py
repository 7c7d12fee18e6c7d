"""Rows to records and back: the one place where the store's tables meet the RL vocabulary.

Every record in `clawrl.types` names its fields after its table's columns, so the mapping is
field by field, with two exceptions kept here: a judgment's hint candidates are JSON objects in
the table and `HintCandidate`s in the record, and a row's database-only columns (ids, leases) are
not part of any record. Everything the store returns is a record, detached from the database
session that read it.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from clawrl.store.schema import (
    EpisodeRow,
    FeedbackRow,
    JudgmentRow,
    NextStateRow,
    PolicyVersionRow,
    SampleRow,
    SessionRow,
    TurnRow,
)
from clawrl.types import (
    Episode,
    Feedback,
    HintCandidate,
    Judgment,
    NextState,
    PolicyVersion,
    Sample,
    Session,
    Turn,
)

Record = TypeVar("Record")


def _columns(record: Any) -> dict[str, Any]:
    return {item.name: getattr(record, item.name) for item in fields(record)}


def _record(cls: type[Record], row: Any) -> Record:
    return cls(**{item.name: getattr(row, item.name) for item in fields(cls)})  # type: ignore[arg-type]


def session(row: SessionRow) -> Session:
    return _record(Session, row)


def turn(row: TurnRow) -> Turn:
    return _record(Turn, row)


def turn_row(record: Turn) -> TurnRow:
    return TurnRow(**_columns(record))


def next_state(row: NextStateRow) -> NextState:
    return _record(NextState, row)


def next_state_row(record: NextState) -> NextStateRow:
    return NextStateRow(**_columns(record))


def feedback(row: FeedbackRow) -> Feedback:
    return _record(Feedback, row)


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
    return _record(PolicyVersion, row)


def policy_version_row(record: PolicyVersion) -> PolicyVersionRow:
    return PolicyVersionRow(**_columns(record))


def episode(row: EpisodeRow) -> Episode:
    return _record(Episode, row)


def episode_row(record: Episode) -> EpisodeRow:
    return EpisodeRow(**_columns(record))
