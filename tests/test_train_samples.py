"""From judged turns to samples: the table of DESIGN §6, the at-least-one rule, teacher log-probs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.config import EngineConfig
from clawrl.engines.hf import HFEngine
from clawrl.messages import teacher_messages
from clawrl.model.chat import render_prompt
from clawrl.model.notes import with_notes
from clawrl.model.scoring import score_response
from clawrl.store import Store
from clawrl.train.samples import SampleBuilder, centred, decide
from tests.helpers import HINT, Conversation


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[Any, Any]:
    torch.set_num_threads(1)
    return AutoTokenizer.from_pretrained(tiny_model_dir), AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def builder(store: Store, tokenizer: Any, model: Any, method: str = "combine", topk: int = 0) -> SampleBuilder:
    return SampleBuilder(
        store.training, tokenizer, method, lambda p, r, k, _grammar: score_response(model, p, r, k), lambda: "base", topk=topk
    )


@pytest.mark.parametrize(
    ("score", "hint", "method", "expected"),
    [
        (-1, HINT, "combine", ("combined", -1.0, True)),
        (1, HINT, "combine", ("combined", 1.0, True)),
        (0, HINT, "combine", ("opd", 0.0, True)),
        (1, None, "combine", ("rl", 1.0, False)),
        (0, None, "combine", ("none", 0.0, False)),
        (-1, HINT, "rl", ("rl", -1.0, False)),
        (0, HINT, "rl", ("none", 0.0, False)),
        (-1, HINT, "opd", ("opd", 0.0, True)),
        (1, None, "opd", ("none", 0.0, False)),
    ],
)
def test_the_sample_table(score: int, hint: str | None, method: str, expected: tuple[str, float, bool]) -> None:
    decision = decide(score, hint, method)
    assert (decision.kind, decision.reward, decision.needs_teacher) == expected


def test_judged_turns_become_samples_in_arrival_order(tmp_path: Path, tiny: tuple[Any, Any]) -> None:
    tokenizer, model = tiny
    store = Store.for_run_dir(tmp_path)
    talk = Conversation(store, tokenizer)
    talk.turn("a1", "A", "Write a note.", "**Note**: 1. Friday.")
    talk.turn("a2", "A", "too AI-like, rewrite it", "Friday it is.", after="a1")
    talk.turn("a3", "A", "ok what about Monday?", "Monday works.", after="a2")
    talk.turn("a4", "A", "hm", "Sure.", after="a3")
    talk.turn("a5", "A", "bye", "Bye.", after="a4")
    talk.judge("a1", -1, HINT)  # combined
    talk.judge("a2", 1)  # RL only
    talk.judge("a3", 0, HINT)  # OPD only
    talk.judge("a4", 0)  # nothing, and not the session's first judged turn
    store.turns.add_feedback("a5", -1, None)  # the last turn: no next state, but explicit feedback
    talk.judge("a5", -1)
    assert builder(store, tokenizer, model).build() == 5
    training = store.training
    ready = training.ready_samples(10)
    assert [example.sample.turn_id for example in ready] == ["a1", "a2", "a3", "a5"]
    kinds = {row.turn_id: (row.kind, row.reward, row.teacher_logprobs is not None) for row in (e.sample for e in ready)}
    assert kinds == {"a1": ("combined", -1.0, True), "a2": ("rl", 1.0, False), "a3": ("opd", 0.0, True), "a5": ("rl", -1.0, False)}
    dropped = training.sample("a4")
    assert dropped.status == "dropped" and dropped.drop_reason == "no_signal"
    assert ready[0].turn == store.turns.turn("a1")  # the update trains on the recorded ids and log-probs, as recorded
    assert len(ready[0].sample.teacher_logprobs) == len(ready[0].turn.response_token_ids)
    assert builder(store, tokenizer, model).build() == 0  # each turn gets one sample row, once


def test_centred_rewards_subtract_the_mean_of_earlier_scores() -> None:
    assert centred(-1.0, [-1.0, -1.0, 1.0, -1.0]) == -0.5
    assert centred(1.0, [-1.0, -1.0, 1.0, -1.0]) == 1.5
    assert centred(1.0, []) == 1.0  # nothing earlier: no baseline yet
    assert centred(0.0, [1.0, 1.0]) == 0.0  # no RL signal stays none


def test_the_reward_baseline_centres_each_reward_on_the_judges_earlier_scores(tmp_path: Path, tiny: tuple[Any, Any]) -> None:
    tokenizer, model = tiny
    store = Store.for_run_dir(tmp_path)
    talk = Conversation(store, tokenizer)
    scores = {"b1": -1, "b2": -1, "b3": 0, "b4": 1, "b5": -1, "b6": 1}
    previous = None
    for turn_id in [*scores, "b7"]:
        talk.turn(turn_id, "B", f"question {turn_id}", f"answer {turn_id}", after=previous)
        previous = turn_id

    def centring_builder() -> SampleBuilder:  # a new one each time: as a restarted trainer
        return SampleBuilder(store.training, tokenizer, "rl", lambda p, r, k, _grammar: score_response(model, p, r, k),
                             lambda: "base", reward_baseline_samples=3)  # fmt: skip

    for turn_id in ["b1", "b2", "b3", "b4"]:
        talk.judge(turn_id, scores[turn_id])
    centring_builder().build()
    talk.judge("b5", scores["b5"])
    talk.judge("b6", scores["b6"])
    centring_builder().build()
    rewards = {example.sample.turn_id: example.sample.reward for example in store.training.ready_samples(10)}
    # b1: nothing earlier; b2: after -1; b3 scored 0: no sample and no part of the baseline;
    # b4: after -1, -1; b5 (another build, read back from the store): the last 3 are -1, -1, +1;
    # b6: the last 3 are -1, +1, -1.
    assert rewards == pytest.approx({"b1": -1.0, "b2": 0.0, "b4": 2.0, "b5": -1 + 1 / 3, "b6": 1 + 1 / 3})


def test_a_judged_turn_without_next_state_or_feedback_is_not_trained_on(tmp_path: Path, tiny: tuple[Any, Any]) -> None:
    tokenizer, model = tiny
    store = Store.for_run_dir(tmp_path)
    talk = Conversation(store, tokenizer)
    talk.turn("t1", "S", "Write a poem.", "A poem.")
    talk.judge("t1", 1)  # e.g. a judge that ran on it anyway
    builder(store, tokenizer, model).build()
    sample = store.training.sample("t1")
    assert sample.status == "dropped" and sample.drop_reason == "no_next_state"


def test_a_turn_longer_than_the_trainers_context_is_dropped_never_truncated(tmp_path: Path, tiny: tuple[Any, Any]) -> None:
    tokenizer, model = tiny
    store = Store.for_run_dir(tmp_path)
    talk = Conversation(store, tokenizer)
    talk.turn("t1", "S", "Write a long poem about the sea and the sky.", "A poem.")
    talk.turn("t2", "S", "Thanks, that is perfect.", "Glad you like it.", after="t1")
    talk.judge("t1", 1)
    turn = store.turns.turn("t1")
    length = len(turn.prompt_token_ids) + len(turn.response_token_ids)
    short = SampleBuilder(store.training, tokenizer, "rl", lambda p, r, k, _grammar: score_response(model, p, r, k), lambda: "base",
                          max_context_tokens=length - 1)  # fmt: skip
    short.build()
    sample = store.training.sample("t1")
    assert sample.status == "dropped" and sample.drop_reason == "too_long"


def test_at_least_one_sample_per_judged_session(tmp_path: Path, tiny: tuple[Any, Any]) -> None:
    tokenizer, model = tiny
    store = Store.for_run_dir(tmp_path)
    talk = Conversation(store, tokenizer)
    build = builder(store, tokenizer, model)
    training = store.training
    # Session Q: nothing but neutral verdicts. Its first judged turn waits for the session's end.
    talk.turn("q1", "Q", "hello", "Hi.")
    talk.turn("q2", "Q", "hmm", "Yes?", after="q1")
    talk.turn("q3", "Q", "hmm", "Yes?", after="q2")
    talk.judge("q1", 0)
    talk.judge("q2", 0)
    # Session R: neutral first, then a real signal, which makes the first one unnecessary.
    talk.turn("r1", "R", "hello", "Hi.")
    talk.turn("r2", "R", "no, wrong", "Sorry.", after="r1")
    talk.turn("r3", "R", "thanks", "Welcome.", after="r2")
    talk.judge("r1", 0)
    build.build()
    assert training.sample("q1").status == "held" and training.sample("r1").status == "held"
    assert training.sample("q2").drop_reason == "no_signal"
    talk.judge("r2", -1)
    build.build()
    assert training.sample("r1").status == "dropped" and training.sample("r1").drop_reason == "no_signal"
    assert training.sample("q1").status == "held"  # Q is still open: a later turn may carry a signal
    talk.turn("q4", "Q", "bye", "Bye.", after="q3", done=True)
    build.build()
    kept = training.sample("q1")
    assert (kept.status, kept.kind, kept.reward) == ("ready", "at_least_one", 0.0)
    assert [example.sample.turn_id for example in training.ready_samples(10)] == ["q1", "r2"]


def test_teacher_logprobs_follow_the_engine_score_contract_under_the_hinted_prompt(tmp_path: Path, tiny: tuple[Any, Any], tiny_model_dir: Path) -> None:
    tokenizer, model = tiny
    store = Store.for_run_dir(tmp_path)
    talk = Conversation(store, tokenizer)
    talk.turn("t1", "S", "Write a note about Friday.", "**Friday**: 1. lunch 2. demo")
    talk.turn("t2", "S", "too AI-like, rewrite it without the bold", "Friday: lunch, then the demo.", after="t1")
    talk.judge("t1", -1, HINT)
    builder(store, tokenizer, model, topk=3).build()
    row = store.training.sample("t1")
    turn = store.turns.turn("t1")
    hinted_prompt = render_prompt(tokenizer, teacher_messages(turn.messages, HINT), None)
    assert hinted_prompt != turn.prompt_token_ids and HINT in tokenizer.decode(hinted_prompt)

    async def engine_scores() -> Any:
        engine = HFEngine(EngineConfig(model=str(tiny_model_dir), device="cpu", cpu_threads=1))
        await engine.start()
        try:
            return await engine.score(hinted_prompt, turn.response_token_ids, top_k=3)
        finally:
            await engine.close()

    expected = asyncio.run(engine_scores())
    torch.testing.assert_close(torch.tensor(row.teacher_logprobs), torch.tensor(expected.logprobs), rtol=0, atol=1e-4)
    assert row.teacher_topk_ids == expected.top_token_ids
    torch.testing.assert_close(torch.tensor(row.teacher_topk_logprobs), torch.tensor(expected.top_logprobs), rtol=0, atol=1e-4)
    # the hint really changes the teacher: it is not the student's own distribution
    student = score_response(model, turn.prompt_token_ids, turn.response_token_ids, 0).logprobs
    assert not torch.allclose(torch.tensor(student), torch.tensor(row.teacher_logprobs), atol=1e-3)


NOTE = "Answer in one short line."


def noted_builder(store: Store, tokenizer: Any, model: Any, method: str = "combine") -> SampleBuilder:
    """A builder that trains memory notes in (`--memory-train without-notes`), as the trainer builds it."""
    return SampleBuilder(store.training, tokenizer, method, lambda p, r, k, _grammar: score_response(model, p, r, k),
                         lambda: "base", user_notes=store.memory.notes)  # fmt: skip


def test_a_turn_served_with_notes_trains_its_student_without_them(tmp_path: Path, tiny: tuple[Any, Any]) -> None:
    """The notes are the teacher's context and not the student's; with no hint, the teacher's prompt
    is exactly the ids the turn was fed, and a +1 without a hint still distils the notes."""
    tokenizer, model = tiny
    store = Store.for_run_dir(tmp_path)
    note = store.memory.remember("default", NOTE, "user", limit=4)
    talk = Conversation(store, tokenizer)
    talk.turn("n1", "S", "Write a note about Friday.", "Friday: lunch.", notes=[note])
    talk.turn("n2", "S", "thanks", "You are welcome.", after="n1", notes=[note])
    talk.judge("n1", 1)
    noted_builder(store, tokenizer, model).build()
    row, turn = store.training.sample("n1"), store.turns.turn("n1")
    bare = render_prompt(tokenizer, turn.messages, None)
    assert NOTE in tokenizer.decode(turn.prompt_token_ids) and NOTE not in tokenizer.decode(bare)
    assert row.kind == "combined" and row.reward == 1.0 and row.student_prompt_token_ids == bare
    fed = score_response(model, turn.prompt_token_ids, turn.response_token_ids, 0).logprobs
    torch.testing.assert_close(torch.tensor(row.teacher_logprobs), torch.tensor(fed), rtol=0, atol=1e-5)
    example = store.training.ready_samples(10)[0]
    assert example.prompt_token_ids == bare and example.turn.prompt_token_ids == turn.prompt_token_ids


def test_a_noted_turns_hint_joins_its_notes_in_the_teachers_prompt(tmp_path: Path, tiny: tuple[Any, Any]) -> None:
    tokenizer, model = tiny
    store = Store.for_run_dir(tmp_path)
    kept = store.memory.remember("default", NOTE, "user", limit=4)
    removed = store.memory.remember("default", "Say it in French.", "user", limit=4)
    talk = Conversation(store, tokenizer)
    talk.turn("n1", "S", "Write a note about Friday.", "**Friday**: lunch.", notes=[kept, removed])
    talk.turn("n2", "S", "too AI-like, rewrite it without the bold", "Friday: lunch.", after="n1", notes=[kept, removed])
    talk.judge("n1", -1, HINT)
    store.memory.remove("default", removed.id)  # the user took it back: it is not trained in
    noted_builder(store, tokenizer, model).build()
    row, turn = store.training.sample("n1"), store.turns.turn("n1")
    teacher_prompt = render_prompt(tokenizer, with_notes(teacher_messages(turn.messages, HINT), [kept]), None)
    expected = score_response(model, teacher_prompt, turn.response_token_ids, 0).logprobs
    torch.testing.assert_close(torch.tensor(row.teacher_logprobs), torch.tensor(expected), rtol=0, atol=1e-5)
    assert "French" not in tokenizer.decode(teacher_prompt) and HINT in tokenizer.decode(teacher_prompt)
    assert row.student_prompt_token_ids == render_prompt(tokenizer, turn.messages, None)


def test_notes_the_user_removed_leave_no_teacher_and_as_served_trains_the_prompt_fed(tmp_path: Path, tiny: tuple[Any, Any]) -> None:
    tokenizer, model = tiny
    store = Store.for_run_dir(tmp_path)
    note = store.memory.remember("default", NOTE, "user", limit=4)
    talk = Conversation(store, tokenizer)
    for index in range(2):
        talk.turn(f"a{index}", f"S{index}", "Write a note about Friday.", "Friday: lunch.", notes=[note])
        talk.turn(f"b{index}", f"S{index}", "thanks", "Welcome.", after=f"a{index}", notes=[note])
        talk.judge(f"a{index}", 1)
    builder(store, tokenizer, model).build(limit=1)  # as served: the turn's own prompt, no teacher (no hint)
    as_served = store.training.sample("a0")
    assert as_served.kind == "rl" and as_served.student_prompt_token_ids is None and as_served.teacher_logprobs is None
    store.memory.remove("default", note.id)
    noted_builder(store, tokenizer, model).build()
    gone = store.training.sample("a1")
    assert gone.kind == "rl" and gone.teacher_logprobs is None
    assert gone.student_prompt_token_ids == render_prompt(tokenizer, store.turns.turn("a1").messages, None)
