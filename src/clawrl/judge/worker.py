"""The judge worker: claims judgeable turns from the store, judges them, writes one verdict each.

It runs as a task inside `clawrl serve` (on the event loop, store calls on threads), alone as
`clawrl judge`, or in each Ray actor of `clawrl serve --placement ray --judge-actors K`
(`cli/ray_judges.py`). Serving never waits for it: it only reads what serving already committed.
Claims are expiring leases in the store, so several workers can share one store and a killed
worker's turns are picked up again once its leases run out (or once its supervisor gives them
back); each verdict names the worker that wrote it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from clawrl.config import EngineConfig, JudgeConfig
from clawrl.engines.base import Engine
from clawrl.judge.choice import choose_judge
from clawrl.judge.classifier import ReplyModel, default_model
from clawrl.judge.parsing import MIN_HINT_CHARS
from clawrl.judge.rule import judge_by_rules
from clawrl.judge.selection import OverlapSelector, choose_hint
from clawrl.judge.types import BackendVerdict, HintSelector, JudgeBackend
from clawrl.judge.hints import memory_note, praise_note
from clawrl.messages import user_typed
from clawrl.store import Store
from clawrl.types import HintCandidate, Judgment, MemoryFrom, MemoryNoteSource, Teacher, TurnContext

log = logging.getLogger(__name__)


class RuleJudge:
    """The offline judge (`judge/rule.py`): rules, a lexicon and a small classifier; what the tiny models use.

    `model` is the classifier; by default the one trained on the tuning part of the corpus.
    """

    name = "rule"

    def __init__(self, model: ReplyModel | None = None) -> None:
        self.model = model

    async def judge(self, case: TurnContext) -> BackendVerdict:
        # on a thread: serving shares this loop
        score, hints = await asyncio.to_thread(judge_by_rules, case.turn.messages, case.next_messages, self.model)
        return BackendVerdict(score=score, votes=[score], rationale=None, hint_candidates=hints, source="rule")


def build_backend(
    config: JudgeConfig, serving_engine: Engine | None = None, engine_config: EngineConfig | None = None
) -> JudgeBackend:
    """The backend `--judge` names (`auto`: see `judge/choice.py`); raises ValueError when it cannot judge as configured.

    `serving_engine` is the engine of `clawrl serve`, which `--judge engine` uses unless
    `--judge-model` names a second model (built from `engine_config` with that model).
    """
    served_model = engine_config.model if serving_engine is not None and engine_config is not None else None
    judge = choose_judge(config, served_model).judge
    # The offline judge's classifier is loaded (or trained, once per corpus and code) now, before
    # serving starts: trained at the first judgment it took seconds of the GIL from serving.
    cache_dir = (engine_config or EngineConfig()).cache_dir
    # the language-model backends are imported here, not at the top: they build on this module's types
    if judge == "rule":
        return RuleJudge(default_model(cache_dir))
    if judge == "openai":
        from clawrl.judge.openai_backend import OpenAIJudge

        return OpenAIJudge.from_config(config)
    if judge in ("engine", "engine+rule"):
        from clawrl.judge.engine_backend import EngineJudge

        engine_judge = EngineJudge.from_config(config, serving_engine, engine_config or EngineConfig())
        if judge == "engine":
            return engine_judge
        from clawrl.judge.combined import EngineAndRuleJudge

        return EngineAndRuleJudge(engine_judge, RuleJudge(default_model(cache_dir)))
    raise ValueError(f"judge backend {judge!r} cannot judge")


def hint_candidates(case: TurnContext, verdict: BackendVerdict) -> list[str]:
    """The judge's hints, then the texts of explicit feedback long enough to direct the teacher."""
    texts = [user_typed({"role": "user", "content": item.text}) for item in case.feedback if item.text]
    feedback_texts = [text for text in texts if len(text) >= MIN_HINT_CHARS]
    return list(dict.fromkeys([*verdict.hint_candidates, *feedback_texts]))


def final_judgment(
    case: TurnContext, verdict: BackendVerdict, judge_model: str, latency_s: float, overlaps: list[int | None] | None = None,
    worker_id: str | None = None,
) -> Judgment:
    """The judge's verdict, with explicit feedback outranking its score and the hint chosen by overlap."""
    candidates = hint_candidates(case, verdict)
    overlaps = overlaps if overlaps is not None else [None] * len(candidates)
    score, source = verdict.score, verdict.source
    if case.feedback:
        score, source = case.feedback[-1].score, "feedback"
    return Judgment(
        turn_id=case.turn.id,
        score=score,
        votes=verdict.votes,
        vote_agreement=sum(vote == verdict.score for vote in verdict.votes) / max(1, len(verdict.votes)),
        invalid_votes=sum(vote is None for vote in verdict.votes),
        rationale=verdict.rationale,
        hint=choose_hint(candidates, overlaps),
        hint_candidates=[HintCandidate(text, overlap) for text, overlap in zip(candidates, overlaps, strict=True)],
        source=source,
        judge_model=judge_model,
        latency_s=latency_s,
        worker_id=worker_id,
    )


def judgment_note(case: TurnContext, judgment: Judgment, memory_from: MemoryFrom) -> tuple[str, MemoryNoteSource] | None:
    """The memory note a verdict makes for the turn's user (`--memory on`), and its source: what of the
    chosen hint would hold for later requests (`hints.memory_note`); for a reply read as praise,
    which has no hint, what of the reply itself would hold for them (`hints.praise_note`)."""
    if judgment.hint is not None:
        note = memory_note(case.turn, judgment.hint, memory_from)
        return (note, "hint") if note is not None else None
    if judgment.score != 1:
        return None
    note = praise_note(case.turn, typed_reply(case), memory_from)
    return (note, "reply") if note is not None else None


def typed_reply(case: TurnContext) -> str:
    """What the user typed in the turn's next state, less the lines their agent repeats from the request."""
    asked = [message for message in case.turn.messages if message["role"] == "user" and user_typed(message)]
    request = asked[-1] if asked else None
    return "\n".join(user_typed(message, request) for message in case.next_messages if message["role"] == "user").strip()


class JudgeWorker:
    """Claims judgeable turns, judges them with `backend`, picks hints with `selector`, writes verdicts.

    Without a selector (a standalone worker with no local model) the longest hint candidate wins.
    With `memory_notes` (`clawrl serve --memory on`: the notes kept per user) the chosen hint of each
    verdict written becomes a note of the turn's user, which their next prompts carry: its durable
    directives (`memory_from="directives"`, `hints.durable_directives`) or the hint as it is.
    """

    def __init__(
        self,
        store: Store,
        backend: JudgeBackend,
        config: JudgeConfig,
        worker_id: str | None = None,
        selector: HintSelector | None = None,
        memory_notes: int | None = None,
        memory_from: MemoryFrom = "directives",
    ) -> None:
        self.store, self.backend, self.config, self.selector = store, backend, config, selector
        self.memory_notes, self.memory_from = memory_notes, memory_from
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
            self.store.judging.claim_turns_to_judge,
            self.worker_id,
            self.config.judge_concurrency,
            self.config.judge_lease_s,
            max_attempts=self.config.judge_max_attempts,
        )
        results = await asyncio.gather(*(self._judge_turn(turn_id) for turn_id in turn_ids))
        return sum(results)

    async def _judge_turn(self, turn_id: str) -> bool:
        started = time.perf_counter()
        case = await asyncio.to_thread(self.store.judging.turn_context, turn_id)
        try:
            async with asyncio.timeout(self.config.judge_timeout_s):
                verdict = await self.backend.judge(case)
                overlaps = await self._overlaps(case, verdict)
        except Exception:  # timed out or failed: give the turn back for another attempt
            log.exception("judging turn %s failed", turn_id)
            await asyncio.to_thread(self.store.judging.release_lease, turn_id, self.worker_id)
            return False
        judgment = final_judgment(case, verdict, self.backend.name, time.perf_counter() - started, overlaps, self.worker_id)
        written = await asyncio.to_thread(self.store.judging.record_judgment, judgment)
        self.judged += written
        noted = judgment_note(case, judgment, self.memory_from) if written and self.memory_notes is not None else None
        if noted is not None:
            await asyncio.to_thread(self.store.memory.remember_for_turn, judgment.turn_id, *noted, self.memory_notes)
        return written

    async def _overlaps(self, case: TurnContext, verdict: BackendVerdict) -> list[int | None] | None:
        """Overlap of each hint candidate, when there is a choice to make and an engine to make it."""
        candidates = hint_candidates(case, verdict)
        if self.selector is None or len(candidates) < 2:
            return None
        return list(await self.selector.overlaps(case, candidates))


def build_worker(
    store: Store,
    config: JudgeConfig,
    serving_engine: Engine | None = None,
    engine_config: EngineConfig | None = None,
    teacher: Teacher = "base",
    memory_notes: int | None = None,
    memory_from: MemoryFrom = "directives",
    worker_id: str | None = None,
) -> JudgeWorker | None:
    """The judge loop as configured (None with `--judge off`); ValueError when it cannot judge.
    `memory_notes`, `memory_from`: the serving side's `ServeConfig.memory_limit` and `memory_from`
    (its hints become notes). `worker_id`: the name its leases and verdicts carry (a fresh one unset).

    Overlap-guided hint selection scores the recorded prompt ids, which only the policy's own
    engine can read: inside `clawrl serve` it uses the serving engine, under the weights of the
    trainer's `teacher`; a standalone judge keeps the longest hint.
    """
    if config.judge == "off":
        return None
    backend = build_backend(config, serving_engine, engine_config)
    selector = None
    if serving_engine is not None:
        selector = OverlapSelector(serving_engine, config.hint_top_k, teacher_version=0 if teacher == "base" else None)
    return JudgeWorker(store, backend, config, worker_id, selector, memory_notes, memory_from)
