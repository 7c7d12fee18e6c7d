"""Retiring a memory note once the weights follow it (issue 35, item 4; DESIGN §13): a retired note is
kept (listed, exported, forgotten with its user) but no longer injected and in no limit, and is
active again when taught again; the gap the check measures, against log-probs computed here from the
model itself; and a real server with `--memory on --memory-retire on` that retires a hint-made note
once a version that answers as the note asked is served, and one with retirement off that never does.

Two tiny models are fitted here: one that answers "Bonjour." only when the prompt carries the note
(the weights need the note) and one that answers "Bonjour." with or without it (they follow it)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.cli import build_parser, config_from_args
from clawrl.config import EngineConfig, JudgeConfig, ServeConfig
from clawrl.engines import build_engine
from clawrl.engines.base import SamplingParams
from clawrl.model.chat import render_prompt
from clawrl.model.notes import NOTES_HEADING, with_notes
from clawrl.serve.retirement import NoteRetirer, note_gap, sample_seed
from clawrl.store import Store
from clawrl.store.inspect import note_lines
from clawrl.store.memory import NoSuchNote, active_over_time
from clawrl.types import MemoryNote
from clawrl.versions.files import Manifest, write_version
from tests.helpers import (Conversation, copy_files, fit, judgment, ready_sample, record, start_server, user, version,
                           wait_for_judgment, wait_until)

CORRECTION = "No, that is wrong: use fewer words and no lists."
HINT = "Use fewer words and no lists."  # what the rule judge makes of CORRECTION: the note
QUESTIONS = ["Greet me.", "Say hello to me."]
NOTED, PLAIN = "Bonjour.", "Hello."  # what the note asks for, and what the base answers without it


def store_at(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else f"sqlite:///{tmp_path / 'clawrl.db'}"
    return Store(url)


# --------------------------------------------------------------------------- the store


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_retired_note_is_kept_but_not_injected_nor_counted_and_comes_back_when_taught(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = store_at(backend, tmp_path, request)
    memory = store.memory
    store.users.add("alice")
    first = memory.remember("alice", "Use fewer words.", "hint", limit=2)
    second = memory.remember("alice", "Answer in French.", "hint", limit=2)
    retired = memory.retire("alice", first.id)
    assert retired.retired_at is not None and memory.retire("alice", first.id).retired_at == retired.retired_at
    with pytest.raises(NoSuchNote):
        memory.retire("bob", second.id)  # alice's: not bob's to retire
    assert [note.id for note in memory.injected("alice", 2)] == [second.id]
    third = memory.remember("alice", "No bold.", "hint", limit=2)  # two active: the retired one counts for nothing
    assert [(note.id, note.retired_at is None) for note in memory.notes("alice")] == [
        (first.id, False), (second.id, True), (third.id, True)]  # still listed, in its place
    assert [note.id for note in memory.injected("alice", 2)] == [second.id, third.id]
    assert memory.counts() == {"active": 2, "retired": 1} and memory.users_with_active_notes() == ["alice"]
    exported = [json.loads(line)["memory_note"] for line in note_lines(store, "alice")]
    assert [line["retired_at"] is not None for line in exported] == [True, False, False]
    again = memory.remember("alice", "use fewer words", "feedback", limit=2)  # taught again: active and the newest
    assert (again.id, again.retired_at) == (first.id, None) and again.updated_at >= third.updated_at
    assert [note.id for note in memory.notes("alice")] == [first.id, third.id]  # the oldest active one went
    memory.retire("alice", third.id)
    assert memory.edit("alice", third.id, "No bold, ever.").retired_at is None  # said again by its user
    memory.retire("alice", third.id)
    assert store.users.forget("alice", remove_account=True).rows["memory_notes"] == 2  # retired ones too
    assert memory.notes("alice") == [] and memory.counts() == {"active": 0, "retired": 0}
    store.close()


def test_notes_active_over_time_come_from_when_they_were_taught_and_retired() -> None:
    def note(number: int, created: float, retired: float | None) -> MemoryNote:
        return MemoryNote(number, "alice", f"note {number}", "hint", None, created, created, retired)

    notes = [note(1, 10.0, 30.0), note(2, 20.0, None), note(3, 30.0, 40.0)]
    assert active_over_time(notes) == [(10.0, 1), (20.0, 2), (30.0, 2), (40.0, 1)]
    assert active_over_time([]) == []


# --------------------------------------------------------------------------- the gap, against the model


def noted(question: str, note: MemoryNote) -> list[dict[str, Any]]:
    return with_notes([user(question)], [note])


def fitted(model_dir: Path, out: Path, without_note: str) -> Path:
    """The tiny model fitted to answer NOTED to QUESTIONS when the prompt carries the HINT note, and
    `without_note` when it does not."""
    note = MemoryNote(1, "default", HINT, "hint", None, 0.0, 0.0)
    conversations = [(noted(question, note), NOTED) for question in QUESTIONS]
    conversations += [([user(question)], without_note) for question in QUESTIONS]
    return fit(model_dir, out, conversations, steps=40, tools=None)


SAME_AGAIN = "Keep it short, and no lists."  # a second note that asks what HINT asks, in other words


def fitted_to_either(model_dir: Path, out: Path) -> Path:
    """The tiny model fitted to answer NOTED when the prompt carries HINT, SAME_AGAIN or both, and
    PLAIN when it carries neither: each note is enough, neither is learnt."""
    first, second = (MemoryNote(number, "default", text, "hint", None, 0.0, 0.0) for number, text in ((1, HINT), (2, SAME_AGAIN)))
    conversations = [(with_notes([user(question)], notes), NOTED) for question in QUESTIONS
                     for notes in ([first], [second], [first, second])]  # fmt: skip
    conversations += [([user(question)], PLAIN) for question in QUESTIONS]
    return fit(model_dir, out, conversations, steps=60, tools=None)


@pytest.fixture(scope="module")
def models(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`needs`: answers NOTED only with the note; `follows`: answers NOTED with or without it;
    `either`: answers NOTED with either of two notes that say the same."""
    root = tmp_path_factory.mktemp("retirement-models")
    return {"needs": fitted(tiny_model_dir, root / "needs", PLAIN), "follows": fitted(tiny_model_dir, root / "follows", NOTED),
            "either": fitted_to_either(tiny_model_dir, root / "either")}  # fmt: skip


def hand_gap(model_dir: Path, turns: list[Any], note: MemoryNote, answers: list[list[int]]) -> float:
    """The gap computed here, in float64 from the model's logits, on the answers the engine sampled: the
    mean over turns of the answer's log p(with no notes) - log p(with `note` alone), summed over tokens."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def logprobs(messages: list[dict[str, Any]], response: list[int]) -> torch.Tensor:
        prompt = render_prompt(tokenizer, messages, None)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0].double()
        positions = torch.arange(len(prompt) - 1, len(prompt) + len(response) - 1)
        return torch.log_softmax(logits[positions], dim=-1)[torch.arange(len(response)), torch.tensor(response)]

    gaps = [(logprobs(turn.messages, answer) - logprobs(with_notes(turn.messages, [note]), answer)).sum().item()
            for turn, answer in zip(turns, answers, strict=True)]  # fmt: skip
    return sum(gaps) / len(gaps)


def test_the_gap_is_what_the_model_gives_and_decides_retirement(models: dict[str, Path], tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    store = Store.for_run_dir(tmp_path / "run")
    tokenizer = AutoTokenizer.from_pretrained(models["needs"])
    conversation = Conversation(store, tokenizer)
    hint = store.memory.remember("default", HINT, "hint", limit=4)
    again = store.memory.remember("default", SAME_AGAIN, "hint", limit=4)  # says the same: the first is not learnt for it
    for index, question in enumerate(QUESTIONS):
        conversation.turn(f"t{index}", f"s{index}", question, NOTED, notes=[hint, again])
    turns = store.memory.noted_turns("default", [hint.id], 2)[hint.id]
    assert [turn.id for turn in turns] == ["t1", "t0"]  # the newest first
    measured = {}
    for name, model_dir in models.items():
        engine = build_engine(EngineConfig(model=str(model_dir), device="cpu", cpu_threads=1))

        async def gap(engine: Any, note: MemoryNote) -> Any:
            await engine.start()
            try:
                return await note_gap(engine, turns, note, "shared", 0, sampled="untold")
            finally:
                await engine.close()

        found = asyncio.run(gap(engine, hint))
        assert len(found.answers) == 2 and all(found.answers)
        assert found.gap == pytest.approx(hand_gap(model_dir, turns, hint, found.answers), abs=1e-3)
        measured[name] = found.gap
    # the first answers "Hello." untold, which the note makes unlikely; the second says "Bonjour." either way
    assert measured["needs"] > 3 and abs(measured["follows"]) < 0.5
    # with either note enough, leaving one out of the two moves nothing; each alone against none does
    either_again = asyncio.run(gap(build_engine(EngineConfig(model=str(models["either"]), device="cpu", cpu_threads=1)), again))
    assert measured["either"] > 3 and either_again.gap > 3

    async def retire_with(model_dir: Path, gap: float, turns: int = 2, twice: bool = False) -> list[Any]:
        engine = build_engine(EngineConfig(model=str(model_dir), device="cpu", cpu_threads=1))
        config = ServeConfig(memory="on", memory_retire="on", memory_retire_gap=gap, memory_retire_turns=turns,
                             memory_retire_samples=1, memory_retire_sampled="untold")  # as `measured` was taken  # fmt: skip
        retirer = NoteRetirer(engine, store, config)
        await engine.start()
        try:
            checks = await retirer.check_user("default", 0)
            return await retirer.check_user("default", 0) if twice else checks
        finally:
            await engine.close()

    def of_hint(checks: list[Any]) -> list[Any]:
        return [check for check in checks if check.note_id == hint.id]

    kept = of_hint(asyncio.run(retire_with(models["needs"], 1.0)))  # the default threshold, below the measured gap
    assert [(check.note_id, check.retired) for check in kept] == [(hint.id, False)]
    assert kept[0].gap == pytest.approx(measured["needs"], abs=1e-6)
    assert [note.id for note in store.memory.injected("default", 4)] == [hint.id, again.id]
    assert asyncio.run(retire_with(models["needs"], 1.0, twice=True)) == []  # once per version
    both = asyncio.run(retire_with(models["either"], 1.0))
    assert [(check.note_id, check.retired) for check in both] == [(hint.id, False), (again.id, False)]
    checked = of_hint(asyncio.run(retire_with(models["needs"], measured["needs"] - 0.01)))  # still below it: kept
    assert [(check.note_id, check.retired, check.turns) for check in checked] == [(hint.id, False, 2)]
    unmeasured = of_hint(asyncio.run(retire_with(models["follows"], 1.0, turns=3)))  # two turns carried it, three asked
    assert [(check.note_id, check.gap, check.retired) for check in unmeasured] == [(hint.id, None, False)]

    # a later turn of a conversation: the user's words in it steer it, not the note; only openings count
    later = [user(QUESTIONS[0]), {"role": "assistant", "content": NOTED}, user(QUESTIONS[1])]
    record(store, "t2", "s0", later, NOTED, memory_note_ids=[hint.id, again.id])
    assert [turn.id for turn in store.memory.noted_turns("default", [hint.id], 3)[hint.id]] == ["t2", "t1", "t0"]
    assert [turn.id for turn in store.memory.noted_turns("default", [hint.id], 3, opening=True)[hint.id]] == ["t1", "t0"]
    store.memory.retire("default", again.id)  # measured alone from here: the first note's checks see no other

    with caplog.at_level(logging.INFO, logger="clawrl.serve.retirement"):
        retired = asyncio.run(retire_with(models["needs"], measured["needs"] + 0.01))  # above it: retired
    assert [(check.note_id, check.retired) for check in retired] == [(hint.id, True)]
    assert f"retired memory note {hint.id} of default's: gap {measured['needs']:.4f}" in caplog.text
    assert store.memory.injected("default", 4) == [] and len(store.memory.notes("default")) == 2
    assert not ServeConfig(memory_retire="on").memory_retiring  # retiring needs memory on
    store.close()


@pytest.mark.parametrize("sampled", ["untold", "told"])
def test_several_answers_a_turn_are_sampled_and_the_gap_is_their_mean(tiny_model_dir: Path, tmp_path: Path,
                                                                         sampled: str) -> None:  # fmt: skip
    """With --memory-retire-samples S, each turn gets S fresh answers of its own, and the gap is the mean
    over all S x turns of them of the summed log-ratio, as the engine's own score() gives it here; with
    --memory-retire-sampled told the answers are the version's with the note, and the ratio is told over untold."""
    store = Store.for_run_dir(tmp_path / "run")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    conversation = Conversation(store, tokenizer)
    hint = store.memory.remember("default", HINT, "hint", limit=4)
    for index, question in enumerate(QUESTIONS):
        conversation.turn(f"t{index}", f"s{index}", question, NOTED, notes=[hint])
    turns = store.memory.noted_turns("default", [hint.id], 2, opening=True)[hint.id]
    samples = 3
    engine = build_engine(EngineConfig(model=str(tiny_model_dir), device="cpu", cpu_threads=1))
    config = ServeConfig(memory="on", memory_retire="on", memory_retire_turns=2, memory_retire_samples=samples,
                         memory_retire_sampled=sampled)  # fmt: skip

    async def summed_log_ratio(messages: list[dict[str, Any]], answer: list[int]) -> float:
        untold = await engine.score(render_prompt(tokenizer, messages, None), answer, version=0)
        told = await engine.score(render_prompt(tokenizer, with_notes(messages, [hint]), None), answer, version=0)
        ratio = sum(untold.logprobs) - sum(told.logprobs)
        return ratio if sampled == "untold" else -ratio

    async def sampled_under(messages: list[dict[str, Any]], sample: int) -> list[int]:
        prompt = messages if sampled == "untold" else with_notes(messages, [hint])
        sampling = SamplingParams(temperature=1.0, max_tokens=len(turns[0].response_token_ids), seed=sample_seed(0, 0, sample))
        return [step.token_id async for step in engine.generate(render_prompt(tokenizer, prompt, None), sampling)]

    async def measure() -> tuple[Any, Any, Any, list[float], list[Any]]:
        await engine.start()
        try:
            found = await note_gap(engine, turns, hint, "shared", 0, samples, sampled=sampled)
            again = await note_gap(engine, turns, hint, "shared", 0, samples, sampled=sampled)
            first_alone = await note_gap(engine, turns[:1], hint, "shared", 0, samples, sampled=sampled)
            reference = [await summed_log_ratio(turns[position // samples].messages, answer)
                         for position, answer in enumerate(found.answers)]  # fmt: skip
            assert found.answers[:samples] == [await sampled_under(turns[0].messages, sample) for sample in range(samples)]
            checks = await NoteRetirer(engine, store, config).check_user("default", 0)
            return found, again, first_alone, reference, checks
        finally:
            await engine.close()

    found, again, first_alone, reference, checks = asyncio.run(measure())
    assert len(found.answers) == samples * len(turns) == 6 and all(found.answers)
    for position in range(0, len(found.answers), samples):  # each turn's answers differ from one another
        assert len({tuple(answer) for answer in found.answers[position:position + samples]}) > 1
    assert first_alone.answers == found.answers[:samples]  # the first turn's, in order: then the second's
    assert found.gap == pytest.approx(sum(reference) / len(reference), abs=1e-6)
    assert found.gap != pytest.approx(sum(reference[::samples]) / len(turns), abs=1e-3)  # not the first answers' alone
    assert again.answers == found.answers and again.gap == found.gap  # seeded: the same version, the same answers
    assert [(check.note_id, check.turns) for check in checks] == [(hint.id, 2)]  # the setting, through the server's task
    assert checks[0].gap == pytest.approx(found.gap, abs=1e-6) and checks[0].retired == (found.gap <= config.memory_retire_gap)
    store.close()


def test_the_answers_a_turn_are_refused_below_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServeConfig().memory_retire_samples == 4 and ServeConfig().memory_retire_sampled == "told"
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        ServeConfig(memory_retire_samples=0)
    with pytest.raises(SystemExit) as refused:
        config_from_args(ServeConfig, build_parser().parse_args(["serve", "--memory-retire-samples", "0"]))
    assert refused.value.code == (
        "error: --memory-retire-samples (CLAWRL_MEMORY_RETIRE_SAMPLES): Input should be greater than or equal to 1 (got 0)"
    )
    monkeypatch.setenv("CLAWRL_MEMORY_RETIRE_SAMPLES", "2")
    assert config_from_args(ServeConfig, build_parser().parse_args(["serve"])).memory_retire_samples == 2


# --------------------------------------------------------------------------- real servers


def clawrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawrl", *args], check=False, capture_output=True, text=True, timeout=120)


def publish_weights(store: Store, run_dir: Path, weights: Path) -> None:
    """Version 1 of the shared lineage, full weights, published as the trainer publishes one."""
    record(store, "trained", "trained-session", [user("q")], "a")
    store.judging.record_judgment(judgment("trained"))
    store.training.add_samples([ready_sample("trained")])
    manifest = Manifest(1, 0, 1, "full", ["trained"], {})
    path, sha256 = write_version(run_dir, manifest, lambda directory: copy_files(weights, directory),
                                 lambda state: state.write_bytes(b"state"))  # fmt: skip
    store.training.register_version(dataclasses.replace(version(1, 0), kind="full", path=str(path), sha256=sha256), ["trained"])


def chat(base_url: str, messages: list[dict[str, Any]]) -> httpx.Response:
    body = {"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0}
    answered = httpx.post(f"{base_url}/chat/completions", json=body, timeout=60)
    assert answered.status_code == 200, answered.text
    return answered


def notes_listed(base_url: str) -> list[dict[str, Any]]:
    return httpx.get(f"{base_url}/me/memory", timeout=30).json()["data"]


def serve_noted_turns(server: Any, store: Store) -> None:
    """A correction whose hint the rule judge makes the run's note, then one turn per question with it."""
    messages = [user("Name three green teas.")]
    first = chat(server.base_url, messages)
    messages += [{"role": "assistant", "content": first.json()["choices"][0]["message"]["content"] or ""}, user(CORRECTION)]
    chat(server.base_url, messages)
    assert wait_for_judgment(store, first.headers["x-clawrl-turn"]).hint == HINT
    wait_until(lambda: [note.text for note in store.memory.notes("default")] == [HINT], 30, "the hint as the run's note")
    for question in QUESTIONS:
        answered = chat(server.base_url, [user(question)])
        assert answered.json()["choices"][0]["message"]["content"] == NOTED  # the note acts at once
        assert store.turns.turn(answered.headers["x-clawrl-turn"]).memory_note_ids == [store.memory.notes("default")[0].id]


@pytest.mark.parametrize("retire", ["on", "off"])
def test_a_served_version_that_follows_the_note_retires_it(retire: str, models: dict[str, Path], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    store = Store.for_run_dir(run_dir)
    with start_server(models["needs"], run_dir, judge=JudgeConfig(judge="rule", judge_poll_s=0.05), served_model_name="tiny",
                      memory="on", memory_retire=retire, memory_retire_turns=2, memory_retire_every_s=0.1,
                      policy_poll_s=0.05) as server:  # fmt: skip
        serve_noted_turns(server, store)
        time.sleep(0.5)  # checks would have run by now: none does while the version is the one served at start
        assert [item["retired_at"] for item in notes_listed(server.base_url)] == [None]
        publish_weights(store, run_dir, models["follows"])
        health = server.base_url.removesuffix("/v1") + "/healthz"
        wait_until(lambda: httpx.get(health, timeout=30).json()["policy_version"] == 1, 60, "version 1 served")
        if retire == "on":
            wait_until(lambda: notes_listed(server.base_url)[0]["retired_at"] is not None, 30, "the note retired")
        else:
            time.sleep(0.5)
            assert notes_listed(server.base_url)[0]["retired_at"] is None
        after = chat(server.base_url, [user("Greet me.")])
        turn = store.turns.turn(after.headers["x-clawrl-turn"])
        fed = AutoTokenizer.from_pretrained(models["needs"]).decode(turn.prompt_token_ids)
        metrics = httpx.get(server.base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    listed = clawrl("memory", "list", "--run-dir", str(run_dir))
    assert listed.returncode == 0, listed.stderr
    assert after.json()["choices"][0]["message"]["content"] == NOTED  # the weights say it either way
    if retire == "on":
        assert NOTES_HEADING not in fed and HINT not in fed and turn.memory_note_ids is None
        assert " retired " in listed.stdout and HINT in listed.stdout
        assert 'clawrl_memory_notes{state="retired"} 1.0' in metrics and 'clawrl_memory_notes{state="active"} 0.0' in metrics
    else:
        assert HINT in fed and turn.memory_note_ids == [store.memory.notes("default")[0].id]
        assert " active " in listed.stdout
        assert 'clawrl_memory_notes{state="active"} 1.0' in metrics and 'clawrl_memory_notes{state="retired"} 0.0' in metrics
    store.close()
