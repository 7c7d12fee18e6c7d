"""The judge worker: claims judgeable turns from the store, judges them, writes one verdict each.

It runs as a task inside `clawrl serve` (on the event loop, store calls on threads) or alone as
`clawrl judge`. Serving never waits for it: it only reads what serving already committed.
Claims are expiring leases in the store, so several workers can share one store and a killed
worker's turns are picked up again once its leases run out.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from clawrl.config import JudgeConfig
from clawrl.engines.chat import content_text
from clawrl.judge.rule import rule_hint, rule_score
from clawrl.store import NewJudgment, Store

log = logging.getLogger(__name__)


@dataclass
class JudgeCase:
    """What a judge sees of one turn."""

    turn_id: str
    messages: list[dict[str, Any]]  # the request the answer was given to
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


class JudgeBackend(Protocol):
    name: str

    async def judge(self, case: JudgeCase) -> BackendVerdict: ...


class RuleJudge:
    """Deterministic rules over the next state (`judge/rule.py`); what the CPU demo uses."""

    name = "rule"

    async def judge(self, case: JudgeCase) -> BackendVerdict:
        previous_user = next((content_text(m.get("content")) for m in reversed(case.messages) if m["role"] == "user"), None)
        score = rule_score(case.next_state, previous_user_text=previous_user)
        # a directive inside praise ("thanks! please also add tests") is not a correction of this turn
        hint = rule_hint(case.next_state) if score <= 0 else None
        return BackendVerdict(score=score, votes=[score], rationale=None, hint_candidates=[hint] if hint else [])


def build_backend(config: JudgeConfig) -> JudgeBackend:
    """The backend `--judge` names; raises ValueError when it cannot judge as configured."""
    if config.judge == "rule":
        return RuleJudge()
    if config.judge == "openai":
        # imported here, not at the top: the backend builds on this module's types
        from clawrl.judge.openai_backend import OpenAIJudge

        return OpenAIJudge.from_config(config)
    raise ValueError(f"judge backend {config.judge!r} cannot judge")


def final_judgment(case: JudgeCase, verdict: BackendVerdict, judge_model: str, latency_s: float) -> NewJudgment:
    """The judge's verdict, with explicit feedback outranking its score and its text joining the hints."""
    candidates = list(verdict.hint_candidates)
    score, source = verdict.score, judge_model
    if case.feedback:
        score, source = case.feedback[-1][0], "feedback"
        candidates += [text for _, text in case.feedback if text and len(text.strip()) >= 10]
    hint = max(candidates, key=len) if candidates else None  # overlap-guided selection comes with the engine backend
    return NewJudgment(
        turn_id=case.turn_id,
        score=score,
        votes=verdict.votes,
        vote_agreement=sum(vote == verdict.score for vote in verdict.votes) / max(1, len(verdict.votes)),
        invalid_votes=sum(vote is None for vote in verdict.votes),
        rationale=verdict.rationale,
        hint=hint,
        hint_candidates=[{"hint": text, "overlap": None} for text in candidates],
        source=source,
        judge_model=judge_model,
        latency_s=latency_s,
    )


class JudgeWorker:
    def __init__(self, store: Store, backend: JudgeBackend, config: JudgeConfig, worker_id: str | None = None) -> None:
        self.store, self.backend, self.config = store, backend, config
        self.worker_id = worker_id or f"judge-{uuid.uuid4().hex[:12]}"
        self.judged = 0

    async def run_forever(self) -> None:
        while True:
            try:
                done = await self.judge_available()
            except Exception:  # a locked or unreachable store must not end the loop
                log.exception("judging round failed")
                done = 0
            if done == 0:
                await asyncio.sleep(self.config.judge_poll_s)

    async def judge_available(self) -> int:
        """Claim what is judgeable now and judge it; returns how many verdicts were written."""
        turn_ids = await asyncio.to_thread(
            self.store.claim_turns_to_judge, self.worker_id, self.config.judge_concurrency, self.config.judge_lease_s
        )
        results = await asyncio.gather(*(self._judge_turn(turn_id) for turn_id in turn_ids))
        return sum(results)

    async def _judge_turn(self, turn_id: str) -> bool:
        started = time.perf_counter()
        case = await asyncio.to_thread(_load_case, self.store, turn_id)
        try:
            verdict = await asyncio.wait_for(self.backend.judge(case), self.config.judge_timeout_s)
        except Exception:  # timed out or failed: give the turn back for another attempt
            log.exception("judging turn %s failed", turn_id)
            await asyncio.to_thread(self.store.release_lease, turn_id, self.worker_id)
            return False
        judgment = final_judgment(case, verdict, self.backend.name, time.perf_counter() - started)
        written = await asyncio.to_thread(self.store.record_judgment, judgment)
        self.judged += written
        return written


def _load_case(store: Store, turn_id: str) -> JudgeCase:
    turn, next_state, feedback = store.turn_context(turn_id)
    return JudgeCase(
        turn_id=turn.id,
        messages=turn.messages,
        response_text=turn.response_text,
        tool_calls=turn.tool_calls,
        next_state=next_state.messages if next_state is not None else [],
        feedback=[(row.score, row.text) for row in feedback],
    )
