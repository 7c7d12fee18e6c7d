"""The judge loop's vocabulary: what a judge sees of a turn, what a backend answers, and the
two roles a judge is built from (a backend that scores, a selector that picks among hints)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class JudgeCase:
    """What a judge sees of one turn."""

    turn_id: str
    messages: list[dict[str, Any]]  # the request the answer was given to
    tools: list[dict[str, Any]] | None
    prompt_token_ids: list[int]  # exactly what the engine was fed: the student prompt of hint selection
    response_token_ids: list[int]
    response_text: str
    tool_calls: list[dict[str, Any]] | None
    next_state: list[dict[str, Any]]
    feedback: list[tuple[int, str | None]]  # explicit (score, text), oldest first


@dataclass
class BackendVerdict:
    score: int
    votes: list[int | None]
    rationale: str | None
    hint_candidates: list[str]
    source: str  # what kind of judge scored it: "prm" (a language model) or "rule"


class JudgeBackend(Protocol):
    name: str  # the judge model (or "rule"), stored with each judgment

    async def judge(self, case: JudgeCase) -> BackendVerdict: ...


class HintSelector(Protocol):
    async def overlaps(self, case: JudgeCase, candidates: list[str]) -> list[int]: ...
