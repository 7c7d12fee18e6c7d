"""The engine-backed judge and overlap-guided hint selection, on a tiny model fitted in the test.

The model is fitted (a few seconds of real training) so that
* the student prompt is followed by ANSWER;
* the student prompt with hint HELPFUL appended (the teacher prompt, `messages.py`) is also
  followed by ANSWER: that hint keeps the teacher on the tokens the student produced;
* the student prompt with hint UNRELATED appended is followed by something else entirely;
* the PRM and hint-judge prompts of one fixed case are answered with a boxed -1 and a hint.
Everything then runs through the real hf engine: generation for the judge, teacher-forced top-k
for the selection.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from clawrl.config import EngineConfig, JudgeConfig
from clawrl.engines import build_engine
from clawrl.engines.hf import HFEngine
from clawrl.judge.engine_backend import EngineJudge
from clawrl.judge.prompts import hint_messages, prm_messages
from clawrl.judge.selection import OverlapSelector, choose_hint, topk_overlap
from clawrl.judge.types import BackendVerdict
from clawrl.judge.worker import JudgeWorker, build_backend, build_worker
from clawrl.messages import teacher_messages
from clawrl.model.chat import render_prompt
from clawrl.store import Store
from clawrl.types import NextState, TurnContext
from tests.helpers import converse, fit, record, start_server, turn, user, wait_for_judgment

QUESTION = [user("Tell me about the meeting on Friday.")]
ANSWER = "The meeting is on Friday at ten."
HELPFUL = "Say the day and the hour of the meeting."
UNRELATED = "Write a long poem about autumn leaves falling in the park instead."  # longer: not the length fallback
POEM = "Leaves fall, gold and red, over the park."

JUDGED_RESPONSE = "**Friday**\n1. Meeting at 10"
JUDGED_NEXT_STATE = [user("too AI-like, rewrite it without the bold")]
PRM_OUTPUT = "The user asks for a rewrite, so the answer missed. \\boxed{-1}"
HINT_OUTPUT = "[HINT_START]Write it as plain prose without bold.[HINT_END] \\boxed{1}"


@pytest.fixture(scope="module")
def judge_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    conversations = [
        (QUESTION, ANSWER),
        (teacher_messages(QUESTION, HELPFUL), ANSWER),
        (teacher_messages(QUESTION, UNRELATED), POEM),
        (prm_messages(JUDGED_RESPONSE, None, JUDGED_NEXT_STATE), PRM_OUTPUT),
        (hint_messages(JUDGED_RESPONSE, None, JUDGED_NEXT_STATE), HINT_OUTPUT),
    ]
    return fit(tiny_model_dir, tmp_path_factory.mktemp("judge-model"), conversations, steps=80, tools=None)


def engine_for(model_dir: Path) -> HFEngine:
    engine = build_engine(EngineConfig(model=str(model_dir), device="cpu", cpu_threads=1))
    assert isinstance(engine, HFEngine)
    return engine


def case_for(engine: HFEngine, messages: list[dict[str, Any]], response: str, next_state: list[dict[str, Any]]) -> TurnContext:
    """What a judge reads of this answer, with the token ids serving would have recorded."""
    response_token_ids = engine.tokenizer.encode(response + "<|im_end|>", add_special_tokens=False)
    answered = turn(
        "t1", "s1", messages, response, prompt_token_ids=render_prompt(engine.tokenizer, messages, None),
        response_token_ids=response_token_ids, response_logprobs=[0.0] * len(response_token_ids),
    )  # fmt: skip
    return TurnContext(answered, NextState("t1", next_state, "t2"), feedback=[])


async def _with_engine(engine: HFEngine, work: Any) -> Any:
    await engine.start()
    try:
        return await work()
    finally:
        await engine.close()


def test_overlap_is_counted_per_position_and_ties_go_to_the_longer_hint() -> None:
    assert topk_overlap([[1, 2, 3, 4], [5, 6, 7, 8]], [[4, 3, 9, 10], [8, 11, 12, 13]]) == 3
    assert choose_hint(["short hint!", "a longer hint here"], [5, 7]) == "a longer hint here"
    assert choose_hint(["a longer hint here", "short hint!"], [5, 9]) == "short hint!"
    assert choose_hint(["short hint!", "a longer hint here"], [6, 6]) == "a longer hint here"
    assert choose_hint(["short hint!", "a longer hint here"], [None, None]) == "a longer hint here"
    assert choose_hint([], []) is None


def test_the_hint_that_keeps_the_teacher_on_the_response_is_chosen(judge_model_dir: Path) -> None:
    engine = engine_for(judge_model_dir)
    case = case_for(engine, QUESTION, ANSWER, [user("thanks")])

    async def select() -> list[int]:
        return await OverlapSelector(engine, top_k=4).overlaps(case, [UNRELATED, HELPFUL])

    unrelated_overlap, helpful_overlap = asyncio.run(_with_engine(engine, select))
    assert helpful_overlap > unrelated_overlap
    assert helpful_overlap <= 4 * len(case.turn.response_token_ids)
    assert choose_hint([UNRELATED, HELPFUL], [unrelated_overlap, helpful_overlap]) == HELPFUL


class ScriptedHints:
    """A backend offering both candidate hints, so the worker has a choice to make."""

    name = "scripted"

    async def judge(self, case: TurnContext) -> BackendVerdict:
        return BackendVerdict(score=-1, votes=[-1], rationale=None, hint_candidates=[UNRELATED, HELPFUL], source="prm")


def test_the_worker_stores_every_candidate_with_its_overlap(judge_model_dir: Path, tmp_path: Path) -> None:
    engine = engine_for(judge_model_dir)
    store = Store.for_run_dir(tmp_path)
    messages = QUESTION
    prompt_ids = render_prompt(engine.tokenizer, messages, None)
    response_ids = engine.tokenizer.encode(ANSWER + "<|im_end|>", add_special_tokens=False)
    record(store, "t1", "s1", messages, ANSWER, prompt_token_ids=prompt_ids, response_token_ids=response_ids)
    record(store, "t2", "s1", [user("no")], "ok", continues_turn_id="t1", next_state=[user("no")])
    worker = JudgeWorker(store, ScriptedHints(), JudgeConfig(), selector=OverlapSelector(engine, top_k=4))
    assert asyncio.run(_with_engine(engine, worker.judge_available)) == 1
    judgment = store.judging.judgment("t1")
    assert judgment.hint == HELPFUL
    overlaps = {candidate.hint: candidate.overlap for candidate in judgment.hint_candidates}
    assert overlaps[HELPFUL] > overlaps[UNRELATED] >= 0


def test_the_engine_judge_votes_and_hints_with_a_local_model(judge_model_dir: Path) -> None:
    engine = engine_for(judge_model_dir)
    judge = EngineJudge(engine, votes=3, temperature=0.6, max_tokens=48)
    case = case_for(engine, QUESTION, JUDGED_RESPONSE, JUDGED_NEXT_STATE)
    verdict = asyncio.run(_with_engine(engine, lambda: judge.judge(case)))
    # three sampled votes (temperature 0.6): the hf engine batches them as they arrive, and a batch's
    # numerics can turn one sample unreadable (None, seen on a busy machine); the majority decides
    assert len(verdict.votes) == 3 and verdict.votes.count(-1) >= 2 and set(verdict.votes) <= {-1, None}
    assert verdict.score == -1 and verdict.source == "prm"
    assert verdict.rationale == PRM_OUTPUT
    assert verdict.hint_candidates == ["Write it as plain prose without bold."]


def test_engine_judge_uses_the_serving_engine_or_loads_a_second_model(judge_model_dir: Path, tool_model_dir: Path) -> None:
    serving = engine_for(tool_model_dir)
    shared = build_backend(JudgeConfig(judge="engine", prm_m=3), serving)
    assert isinstance(shared, EngineJudge) and shared.engine is serving and not shared.owns_engine and shared.votes == 3
    second = build_backend(JudgeConfig(judge="engine", judge_model=str(judge_model_dir)), serving, EngineConfig(device="cpu"))
    assert isinstance(second, EngineJudge) and second.owns_engine and second.engine is not serving
    assert second.name == str(judge_model_dir)
    with pytest.raises(ValueError, match="--judge-model"):
        build_backend(JudgeConfig(judge="engine"))


def test_judging_with_the_serving_engine_records_no_extra_turns(judge_model_dir: Path, run_dir: Path) -> None:
    """The judge's own generations go straight to the engine: never recorded, never trained on."""
    judge = JudgeConfig(judge="engine", judge_poll_s=0.05, judge_max_tokens=24)
    with start_server(judge_model_dir, run_dir, judge=judge) as server:
        session_id, turn_ids = converse(server.base_url, ["Tell me about the meeting on Friday.", "no, rewrite it"])
        store = Store.for_run_dir(run_dir)
        judgment = wait_for_judgment(store, turn_ids[0])
        health = httpx.get(server.base_url.removesuffix("/v1") + "/healthz").json()
    assert judgment.source == "prm" and judgment.judge_model == str(judge_model_dir) and len(judgment.votes) == 3  # --prm-m 3 by default
    assert [turn["id"] for turn in _turns(store, session_id)] == turn_ids  # only the client's two turns
    assert health["status"] == "ok"


def _turns(store: Store, session_id: str) -> list[dict[str, Any]]:
    return [{"id": entry.turn.id} for entry in store.turns.session_turns(session_id)]


# --------------------------------------------------------------------------- selection under the trainer's teacher

SAY_WHEN = "Please say the day and the hour."
WRITE_POEM = "Please write a long poem about autumn leaves instead."
TWO_DIRECTIVES = [user(f"no. {SAY_WHEN} {WRITE_POEM}")]  # the rule judge: -1, the reply, then each directive


@pytest.fixture(scope="module")
def base_and_drifted(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two models that agree on the plain prompt and disagree on which hint keeps the answer:
    the base follows SAY_WHEN with ANSWER, the drifted version follows WRITE_POEM with it."""
    base = fit(tiny_model_dir, tmp_path_factory.mktemp("base"), [
        (QUESTION, ANSWER), (teacher_messages(QUESTION, SAY_WHEN), ANSWER), (teacher_messages(QUESTION, WRITE_POEM), POEM),
    ], steps=80, tools=None)  # fmt: skip
    drifted = fit(base, tmp_path_factory.mktemp("drifted"), [
        (QUESTION, ANSWER), (teacher_messages(QUESTION, SAY_WHEN), POEM), (teacher_messages(QUESTION, WRITE_POEM), ANSWER),
    ], steps=80, tools=None)  # fmt: skip
    return base, drifted


@pytest.mark.parametrize(("teacher", "chosen"), [("base", SAY_WHEN), ("policy", WRITE_POEM)])
def test_rule_hints_are_chosen_under_the_teacher_the_trainer_uses(
    base_and_drifted: tuple[Path, Path], tmp_path: Path, teacher: str, chosen: str
) -> None:
    """Version 1 serves; with `--teacher base` the hinted prompt is scored under the base weights."""
    base, drifted = base_and_drifted
    engine = engine_for(base)
    store = Store.for_run_dir(tmp_path)
    prompt_ids = render_prompt(engine.tokenizer, QUESTION, None)
    response_ids = engine.tokenizer.encode(ANSWER + "<|im_end|>", add_special_tokens=False)
    record(store, "t1", "s1", QUESTION, ANSWER, prompt_token_ids=prompt_ids, response_token_ids=response_ids)
    record(store, "t2", "s1", TWO_DIRECTIVES, "ok", continues_turn_id="t1", next_state=TWO_DIRECTIVES)
    worker = build_worker(store, JudgeConfig(judge="rule"), engine, teacher=teacher)
    assert worker is not None

    async def judge_under_version_1() -> int:
        await engine.load_version(1, drifted)
        return await worker.judge_available()

    assert asyncio.run(_with_engine(engine, judge_under_version_1)) == 1
    judgment = store.judging.judgment("t1")
    assert judgment.score == -1
    overlaps = {candidate.hint: candidate.overlap for candidate in judgment.hint_candidates}
    # one candidate per directive, after the whole reply as one hint (`judge/hints.py`)
    assert list(overlaps)[1:] == [SAY_WHEN, WRITE_POEM]
    other = WRITE_POEM if chosen == SAY_WHEN else SAY_WHEN
    assert overlaps[chosen] > overlaps[other]
    assert judgment.hint == choose_hint(list(overlaps), list(overlaps.values()))
