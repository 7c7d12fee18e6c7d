"""What the learning benchmark measured: held-out evaluations and one arm's run under one seed.

Plain records, written by the benchmark (`bench.py`) and read by the report (`report.py`) and the
statistics (`metrics.py` works on the lists they hold).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Evaluation:
    """The held-out score of the policy served after `session` sessions."""

    session: int
    version: int
    outcomes: list[bool]  # one per held-out prompt: did the answer satisfy the preference?
    example: str  # the answer to the first held-out prompt

    @property
    def score(self) -> float:
        return sum(self.outcomes) / len(self.outcomes)


@dataclass
class RunResult:
    """One arm under one seed."""

    arm: str
    seed: int
    evaluations: list[Evaluation] = field(default_factory=list)
    session_satisfied: list[bool] = field(default_factory=list)
    versions: int = 0
    seconds: float = 0.0

    @property
    def baseline(self) -> Evaluation:
        return self.evaluations[0]

    @property
    def final(self) -> Evaluation:
        return self.evaluations[-1]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for evaluation, item in zip(self.evaluations, data["evaluations"], strict=True):
            item["score"] = evaluation.score
        return data
