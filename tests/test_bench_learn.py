"""`clawrl bench learn`, short: the real server (subprocess, judge and trainer), HTTP sessions, held-out scores.

The model is a smaller pre-training of the tiny model (`CI_PRETRAIN`, about a minute) so that the
module stays within a couple of minutes; the full-size one is what the committed benchmark uses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.config import BenchConfig
from clawrl.judge.hints import memory_note
from clawrl.sim.bench import run_bench
from clawrl.model.notes import NOTES_HEADING
from clawrl.sim.multi_user import MULTI_USER_TRAIN_DEFAULTS, UserRun, run_multi_user_arm, summarize
from clawrl.sim.pretrain import PretrainConfig, pretrained_model_path
from clawrl.sim.results import Evaluation
from clawrl.store import Store

CI_PRETRAIN = PretrainConfig(steps=300)
# Settings that move the style within 14 sessions, so that a short run can show training at work:
# the earlier defaults. Over 36 sessions they also lose the question (issue 28); the defaults,
# which keep it, move the style too little in 14 sessions for a test to tell from noise.
FAST_TRAIN = {"lr": 5e-4, "reward_baseline_samples": 0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pretrained_model_path(tmp_path_factory.mktemp("cache"), seed=0, config=CI_PRETRAIN)


def bench(out: Path, model_dir: Path, method: str, sessions: int, eval_every: int = 1) -> dict:
    config = BenchConfig(method=method, sessions=sessions, seeds=1, out=out, model=str(model_dir), heldout_prompts=16,
                         eval_every=eval_every)  # fmt: skip
    return run_bench(config, FAST_TRAIN, progress=lambda _: None)


def mean_logprob(model: torch.nn.Module, prompt_token_ids: list[int], response_token_ids: list[int]) -> float:
    """The mean per-token log-prob of a recorded response under `model`, teacher-forced in float64."""
    ids = torch.tensor([prompt_token_ids + response_token_ids])
    with torch.no_grad():
        logprobs = model(ids).logits[0, len(prompt_token_ids) - 1 : -1].double().log_softmax(-1)
    return logprobs.gather(1, torch.tensor(response_token_ids)[:, None]).mean().item()


def test_the_combined_arm_trains_away_from_what_the_user_complained_about(model_dir: Path, tmp_path: Path) -> None:
    """A short run trains, serves its versions and moves the policy the judge's way.

    Whether 14 sessions of one seed beat their own start on 16 held-out prompts is close to a coin
    toss at this size (5 of 8 runs did on 2026-12-07, over two pre-trainings and four seeds; the
    outcome also depends on when the background trainer's steps land), so that claim is the
    benchmark's, with intervals over seeds (docs/benchmarks.md). What every run shows is that the
    answers the user complained about (reward -1) are less likely under the last version than under
    the start: a sign error in the update, or versions never served, makes them likelier.
    """
    results = bench(tmp_path, model_dir, "combine", sessions=14, eval_every=7)  # the start, halfway, the end
    combine = results["arms"]["combine"]
    assert 0 <= combine["baseline"] <= 1 and 0 <= combine["final"] <= 1
    assert combine["per_seed"][0]["versions"] >= 3
    assert "sessions_to_align" in combine and combine["ci"][0] <= combine["final"] <= combine["ci"][1]
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["arms"]["combine"]["final"] == combine["final"]
    assert (tmp_path / "learning.png").stat().st_size > 1000 and "combine (RL + OPD)" in (tmp_path / "report.md").read_text()

    store = Store.for_run_dir(tmp_path / "runs" / "combine-seed0")
    assert len(store.turns.list_sessions()) >= 14  # sessions were told apart with no session header
    turns = [entry.turn for session in store.turns.list_sessions(limit=1000) for entry in store.turns.session_turns(session.id)]
    side = {turn.id for turn in turns if turn.kind == "side"}
    samples = store.training.samples_for([turn.id for turn in turns])
    sampled = set(samples)
    assert len(side) >= 2 * 16  # held-out prompts, at the start and after versions
    assert sampled and not side & sampled  # never trained on

    judged = results["judged_turns"]  # every played answer that got a next state, judged against the truth
    assert judged >= 14 and 0 <= results["judge_agreement"] <= 1 and 0 <= results["judge_abstained"] <= 1
    training = combine["training"]
    assert training["samples_trained"] >= 3 * 4 and training["mean_staleness"] is not None
    assert training["mean_is_weight"] is not None and 0 < training["mean_is_weight"] <= 10
    assert 0 <= training["stale_share"] <= 1
    assert results["report_seeds"] == [0] and results["paired"] == {}  # one arm: nothing to pair
    assert results["pretrain_seeds"] == [0] and len(results["pretrain_builds"]["0"]["weights_sha256"]) == 64

    by_id = {turn.id: turn for turn in turns}
    penalised = [by_id[turn_id] for turn_id, sample in samples.items() if sample.status == "trained" and sample.reward < 0]
    assert len(penalised) >= 8, "the simulated student complained about fewer than eight trained answers"
    last_version = max((tmp_path / "runs" / "combine-seed0" / "policy" / "shared").iterdir(), key=lambda path: int(path.name[1:]))
    start, trained = (AutoModelForCausalLM.from_pretrained(path).eval() for path in (model_dir, last_version))
    moved = [mean_logprob(trained, turn.prompt_token_ids, turn.response_token_ids)
             - mean_logprob(start, turn.prompt_token_ids, turn.response_token_ids) for turn in penalised]  # fmt: skip
    assert sum(moved) / len(moved) < -0.05, moved  # 8 runs: -0.18 to -0.38 nats per token


def fed_prompts(store: Store, model_dir: Path) -> list[str]:
    """The decoded prompt ids of the run's main turns, in the order they were played."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sessions = sorted(store.turns.list_sessions(limit=1000), key=lambda session: session.created_at)
    turns = [entry.turn for session in sessions for entry in store.turns.session_turns(session.id)]
    return [tokenizer.decode(turn.prompt_token_ids) for turn in turns if turn.kind == "main"]


def test_memory_arm_has_the_server_carry_hints_into_later_prompts(model_dir: Path, tmp_path: Path) -> None:
    results = bench(tmp_path, model_dir, "memory", sessions=4, eval_every=4)
    assert set(results["arms"]) == {"memory"}
    store = Store.for_run_dir(tmp_path / "runs" / "memory-seed0")
    prompts = fed_prompts(store, model_dir)
    assert NOTES_HEADING not in prompts[0]
    turns = {turn.id: turn for turn, _ in store.turns.iter_main_turns()}
    notes = [note for turn_id, judgment in store.judging.judgments_for(list(turns)).items()
             if judgment.hint and (note := memory_note(turns[turn_id], judgment.hint, "directives"))]  # fmt: skip
    assert notes, "the simulated student said how an answer should be in none of four sessions"
    assert NOTES_HEADING in prompts[-1] and any(note in prompts[-1] for note in notes)
    for turn, _ in store.turns.iter_main_turns():  # the requests carried no notes: the server added them
        assert NOTES_HEADING not in turn.messages[0]["content"]
    memory = results["arms"]["memory"]["memory"]
    assert memory["final_with_notes"] == results["arms"]["memory"]["final"]
    assert 0 <= memory["final_weights_only"] <= 1 and len(memory["notes_active_curve"]) == 4
    assert memory["notes_active_final"] == len(store.memory.injected("default", 5)) >= 1
    assert memory["prompt_tokens_added_per_turn"] > 0


def test_memory_trained_into_the_weights_trains_its_students_without_the_notes(model_dir: Path, tmp_path: Path) -> None:
    results = bench(tmp_path, model_dir, "memory_then_weights", sessions=5, eval_every=5)
    arm = results["arms"]["memory_then_weights"]
    assert arm["per_seed"][0]["versions"] >= 1 and arm["training"]["samples_trained"] >= 4
    store = Store.for_run_dir(tmp_path / "runs" / "memory_then_weights-seed0")
    noted = [turn for turn, _ in store.turns.iter_main_turns() if turn.memory_note_ids]
    assert noted, "no turn was served with a note"
    kept = [sample for sample in store.training.samples_for([turn.id for turn in noted]).values() if sample.status != "dropped"]
    assert kept and all(sample.student_prompt_token_ids is not None for sample in kept)
    assert set(arm["memory"]) >= {"final_with_notes", "final_weights_only", "notes_active_final", "prompt_tokens_added_per_turn"}


def test_memory_plus_training_arm_trains_the_turns_as_served(model_dir: Path, tmp_path: Path) -> None:
    results = bench(tmp_path, model_dir, "memory_combine", sessions=5, eval_every=5)
    arm = results["arms"]["memory_combine"]
    assert arm["per_seed"][0]["versions"] >= 1 and arm["training"]["samples_trained"] >= 4  # combine trained
    store = Store.for_run_dir(tmp_path / "runs" / "memory_combine-seed0")
    assert any(NOTES_HEADING in prompt for prompt in fed_prompts(store, model_dir))
    noted = [turn.id for turn, _ in store.turns.iter_main_turns() if turn.memory_note_ids]
    assert all(sample.student_prompt_token_ids is None for sample in store.training.samples_for(noted).values())


def test_the_cli_runs_the_control_arm(model_dir: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "clawrl.cli", "bench", "learn", "--method", "none", "--sessions", "2", "--seeds", "1",
         "--out", str(tmp_path), "--model", str(model_dir), "--heldout-prompts", "8", "--seed-list", "101",
         "--summary", str(tmp_path / "summary" / "learn.json")],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| none (control) |" in done.stdout and "session 2/2" in done.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert json.loads((tmp_path / "summary" / "learn.json").read_text()) == results
    assert results["seed_list"] == [101] and results["report_seeds"] == [] and 101 in results["tuning_seeds"]
    assert results["judged_turns"] >= 2 and results["arms"]["none"]["training"] is None
    none = results["arms"]["none"]
    assert none["per_seed"][0]["versions"] == 0
    assert len(none["curve"]) == 3
    evaluations = json.loads((tmp_path / "runs.json").read_text())[0]["evaluations"]
    assert [evaluation["session"] for evaluation in evaluations] == [0, 2]  # nothing changes in between


def test_the_demo_shows_before_and_after_the_table_and_the_plot(model_dir: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "clawrl.cli", "demo", "--model", str(model_dir), "--sessions", "3", "--run-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    shown = done.stdout
    assert "the student asks: " in shown and "before (v0):" in shown and "after 3 sessions (v" in shown
    assert "| none (control) |" in shown and "| combine (RL + OPD) |" in shown
    assert "3/3 sessions" in shown  # the progress bars ran to the end
    assert (tmp_path / "learning.png").stat().st_size > 1000
    assert set(json.loads((tmp_path / "results.json").read_text())["arms"]) == {"none", "combine"}


def test_users_on_one_server_are_each_answered_and_trained_by_their_own_lineage(model_dir: Path, tmp_path: Path) -> None:
    config = BenchConfig(users="student,terse", sessions=3, seeds=1, out=tmp_path, model=str(model_dir),
                         heldout_prompts=4)  # fmt: skip
    runs = run_multi_user_arm("per_user", 0, config.users, config, {**MULTI_USER_TRAIN_DEFAULTS, "batch_size": 2},
                              progress=lambda _: None)
    store = Store.for_run_dir(tmp_path / "runs" / "per_user-seed0")
    try:
        for run in runs:
            assert run.baseline is not None and run.final is not None and len(run.session_satisfied) == 3
            assert run.baseline.version == 0  # nobody's lineage had a version before their first session
            assert run.final.version in store.training.version_numbers(run.user)  # answered by their own lineage
            assert store.training.serving_version(run.user) == run.final.version
        assert not store.training.version_numbers("shared")
    finally:
        store.close()


def test_the_cli_refuses_users_it_has_no_persona_for(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "clawrl.cli", "bench", "learn", "--users", "student,nobody",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--users takes two or more different personas" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_multi_user_summary_pairs_each_users_prompts_across_arms() -> None:
    def run(user: str, baseline: list[bool], final: list[bool]) -> UserRun:
        return UserRun(user, Evaluation(0, 0, baseline, ""), Evaluation(2, 3, final, ""), [True, False])

    runs = {
        "shared": {0: [run("a", [False, False], [True, False]), run("b", [True, False], [False, False])],
                   1: [run("a", [False, True], [True, True]), run("b", [False, False], [False, False])]},
        "per_user": {0: [run("a", [False, False], [True, True]), run("b", [True, False], [True, True])],
                     1: [run("a", [False, True], [True, True]), run("b", [False, False], [True, False])]},
    }
    summary = summarize(runs, ["a", "b"])
    shared_a = summary["arms"]["shared"]["a"]
    assert shared_a["baseline"] == 0.25 and shared_a["final"] == 0.75
    assert shared_a["paired"]["mean"] == 0.5 and shared_a["sessions_satisfied"] == 0.5
    assert summary["arms"]["per_user"]["b"]["final"] == 0.75
    # b: per-user finals 1.0 and 0.5 against shared 0.0 and 0.0
    assert summary["paired"]["b"]["per_user-shared"]["mean"] == 0.75
    assert summary["paired"]["a"]["per_user-shared"]["per_seed"] == {"0": 0.5, "1": 0.0}
    low, high = summary["paired"]["b"]["per_user-shared"]["ci"]
    assert low <= 0.75 <= high
