"""The judge loop's own vocabulary: what a backend answers, and the two roles a judge is built
from (a backend that scores, a selector that picks among hints). What a judge reads is a
`clawrl.types.TurnContext`: the recorded turn, its next state and its explicit feedback."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from clawrl.types import JudgmentSource, TurnContext


@dataclass
class BackendVerdict:
    score: int
    votes: list[int | None]
    rationale: str | None
    hint_candidates: list[str]
    source: JudgmentSource  # what kind of judge scored it: "prm" (a language model) or "rule"


class JudgeBackend(Protocol):
    name: str  # the judge model (or "rule"), stored with each judgment

    async def judge(self, case: TurnContext) -> BackendVerdict: ...


class HintSelector(Protocol):
    async def overlaps(self, case: TurnContext, candidates: list[str]) -> list[int]: ...
