"""The learning benchmark's comparisons on hand-computed inputs: paired differences between arms,
the judge against the user's hidden ground truth, the asynchronous-path figures, and seed sets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clawrl.config import BenchConfig, parse_seeds
from clawrl.sim.metrics import t_interval, wider
from clawrl.sim.report import write_report
from clawrl.sim.results import Evaluation, RunResult
from clawrl.sim.stats import (
    judge_agreement,
    paired_difference,
    paired_differences,
    paired_groups,
    training_over_seeds,
    training_summary,
)
from tests.helpers import run_cli

OUTCOMES = {0: [True, False, True, False], 1: [False, False, True, True], 2: [True, True, True, False]}


def test_identical_arms_differ_by_zero() -> None:
    difference = paired_difference(OUTCOMES, OUTCOMES)
    assert difference is not None
    assert difference["mean"] == 0 and difference["ci"] == [0.0, 0.0]
    assert difference["per_seed"] == {"0": 0.0, "1": 0.0, "2": 0.0} and difference["seeds"] == 3


def test_a_constant_shift_is_that_shift() -> None:
    all_right = {seed: [True] * 4 for seed in OUTCOMES}
    all_wrong = {seed: [False] * 4 for seed in OUTCOMES}
    assert paired_difference(all_right, all_wrong)["mean"] == 1.0
    assert paired_difference(all_right, all_wrong)["ci"] == [1.0, 1.0]
    assert paired_difference(all_wrong, all_right)["ci"] == [-1.0, -1.0]
    shifted = {seed: [value + 0.25 for value in values] for seed, values in {0: [0.0, 0.5], 1: [0.25, 0.75]}.items()}
    assert paired_difference(shifted, {0: [0.0, 0.5], 1: [0.25, 0.75]})["ci"] == [0.25, 0.25]


def test_pairing_is_per_prompt_and_per_seed() -> None:
    first = {0: [True, True, False, False], 1: [True, True, True, False], 5: [True] * 4}
    second = {0: [False, True, False, False], 1: [True, False, False, False]}
    assert paired_groups(first, second) == {0: [1.0, 0.0, 0.0, 0.0], 1: [0.0, 1.0, 1.0, 0.0]}  # seed 5: one arm only
    difference = paired_difference(first, second)
    assert difference["mean"] == pytest.approx((0.25 + 0.5) / 2) and difference["seeds"] == 2
    low, high = difference["bootstrap_ci"]
    assert 0 <= low <= difference["mean"] <= high <= 1
    # two seeds that disagree (0.25 and 0.5): the t-interval (t = 12.7 with one degree of freedom) is the wider
    assert difference["t_ci"] == pytest.approx([0.375 - 12.706 * 0.125, 0.375 + 12.706 * 0.125])
    assert difference["ci"] == difference["t_ci"]
    assert paired_difference(first, second) == difference  # deterministic
    assert paired_difference(first, second, seed=1)["mean"] == difference["mean"]
    with pytest.raises(ValueError):
        paired_groups({0: [True, False]}, {0: [True]})
    assert paired_difference({0: [True]}, {1: [True]}) is None


def test_paired_interval_is_narrower_than_the_unpaired_arms_when_they_move_together() -> None:
    # Prompts differ a lot in difficulty; the first arm gets exactly one more prompt right per seed.
    second = {seed: [True] * 6 + [False] * 6 for seed in range(5)}
    first = {seed: [True] * 7 + [False] * 5 for seed in range(5)}
    difference = paired_difference(first, second)
    assert difference["mean"] == pytest.approx(1 / 12)
    assert difference["ci"][0] >= 0  # every resample of prompts keeps the pairing: never below 0


def test_paired_differences_keys_only_the_pairs_that_ran() -> None:
    finals = {"combine": OUTCOMES, "rl": OUTCOMES, "none": {0: [False] * 4}}
    differences = paired_differences(finals)
    assert set(differences) == {"combine-rl", "combine-none", "rl-none"}
    assert differences["combine-none"]["mean"] == 0.5 and differences["combine-none"]["seeds"] == 1


def test_judge_agreement_counts_zero_as_not_agreeing() -> None:
    judged = [(1, True), (-1, False), (1, False), (-1, True), (0, True), (0, False), (1, True), (-1, False)]
    summary = judge_agreement(judged)
    assert summary["agreement"] == 4 / 8 and summary["abstained"] == 2 / 8 and summary["judged_turns"] == 8
    assert summary["counts"] == {"satisfied": {"+1": 2, "-1": 1, "0": 1}, "unsatisfied": {"+1": 1, "-1": 2, "0": 1}}
    assert judge_agreement([])["agreement"] is None


def test_training_summary_weights_steps_by_samples() -> None:
    steps = [
        {"num_samples": 4, "mean_staleness": 0.0, "mean_is_weight": 1.0, "logprob_drift": 0.0, "clip_fraction": 0.0},
        {"num_samples": 12, "mean_staleness": 2.0, "mean_is_weight": 0.8, "logprob_drift": 0.4, "clip_fraction": 0.1},
        {"num_samples": 0},  # not a step that trained anything
    ]
    summary = training_summary(steps, {"trained": 16, "ready": 2, "dropped": 5}, {"stale": 2, "no_signal": 3})
    assert summary["steps"] == 2 and summary["samples_trained"] == 16 and summary["samples_dropped_stale"] == 2
    assert summary["stale_share"] == pytest.approx(2 / 20)
    assert summary["mean_staleness"] == pytest.approx(1.5)
    assert summary["mean_is_weight"] == pytest.approx(0.85)
    assert (summary["min_step_is_weight"], summary["max_step_is_weight"]) == (0.8, 1.0)
    assert summary["max_step_staleness"] == 2.0 and summary["clip_fraction"] == pytest.approx(0.075)
    empty = training_summary([], {}, {})
    assert empty["stale_share"] is None and empty["mean_is_weight"] is None and empty["steps"] == 0
    over = training_over_seeds([summary, empty, None])
    assert over is not None and over["mean_staleness"] == pytest.approx(1.5) and over["samples_trained"] == 16
    assert training_over_seeds([None]) is None


def test_seed_lists_and_named_sets() -> None:
    assert parse_seeds("10-12,20") == [10, 11, 12, 20]
    assert parse_seeds(" 3 ") == [3]
    for bad in ("", "a", "5-3", "1,1", "-1"):
        with pytest.raises(ValueError):
            parse_seeds(bad)
    assert BenchConfig(seeds=2, first_seed=3).run_seeds() == [3, 4]
    assert BenchConfig(seed_list="report").run_seeds() == [10, 11, 12, 13, 14]
    assert BenchConfig(seed_list="tuning").run_seeds() == [100, 101, 102, 103, 104]
    assert BenchConfig(seed_list="tuning", tuning_seeds="100-101").run_seeds() == [100, 101]
    assert BenchConfig(seed_list="7,9").run_seeds() == [7, 9]
    assert not set(BenchConfig(seed_list="report").run_seeds()) & set(BenchConfig(seed_list="tuning").run_seeds())
    with pytest.raises(ValueError):
        BenchConfig(seed_list="report,x")


def test_runs_round_trip_through_json() -> None:
    run = RunResult("memory_combine", 3, [Evaluation(0, 0, [True, False], "a")], [True], 2, 1.5, [(1, True), (0, False)],
                    {"steps": 1})
    assert RunResult.from_json(run.to_json()) == run


def _bench_dir(root: Path, arm: str, flags: dict[str, Any] | None, outcomes: dict[int, list[bool]],
               wrong_rate: float = 0.1, model_seed: int = 0) -> Path:
    """What `clawrl bench learn --method ARM --out DIR` leaves behind: results.json and runs.json."""
    out = root / arm
    runs = [RunResult(arm, seed, [Evaluation(0, 0, [False] * len(final), "before"),
                                  Evaluation(4, 3, final, "after")], [False, True, True, True], 3, 1.0,
                      model_seed=model_seed)
            for seed, final in outcomes.items()]
    config = BenchConfig(method=arm, sessions=4, seed_list="10-11", out=out, user_wrong_rate=wrong_rate)
    out.mkdir(parents=True)
    (out / "runs.json").write_text(json.dumps([run.to_json() for run in runs]))
    write_report(config, {arm: flags} if flags else {}, runs, "clawrl bench learn")
    return out


def test_arms_run_apart_merge_into_one_report_with_their_own_settings(tmp_path: Path) -> None:
    combine = _bench_dir(tmp_path, "combine", {"lr": 5e-4}, {10: [True, True, True, False], 11: [True] * 4})
    rl = _bench_dir(tmp_path, "rl", {"lr": 1e-3}, {10: [False, True, False, False], 11: [True, False, False, False]})
    none = _bench_dir(tmp_path, "none", None, {10: [False] * 4, 11: [False] * 4})
    summary = tmp_path / "docs" / "learn.json"
    printed = run_cli("bench", "merge", str(combine), str(rl), str(none), "--out", str(tmp_path / "merged"),
                      "--summary", str(summary), parse=False)
    assert "combine (RL + OPD)" in printed and "rl (binary RL)" in printed
    merged = json.loads(summary.read_text())
    assert merged == json.loads((tmp_path / "merged" / "results.json").read_text())
    assert set(merged["arms"]) == {"combine", "rl", "none"} and merged["report_seeds"] == [10, 11]
    assert merged["arms"]["combine"]["train_flags"] == {"lr": 5e-4}
    assert merged["arms"]["rl"]["train_flags"] == {"lr": 1e-3} and merged["arms"]["none"]["train_flags"] is None
    assert merged["arms"]["combine"]["final"] == pytest.approx(0.875)
    assert merged["paired"]["combine-rl"]["mean"] == pytest.approx(0.875 - 0.25)
    assert merged["user_noise"]["wrong_rate"] == 0.1
    card = (tmp_path / "merged" / "report.md").read_text()
    assert "combine with `--lr 0.0005`" in card and "rl with `--lr 0.001`" in card
    assert (tmp_path / "merged" / "learning.png").stat().st_size > 0


def test_merging_runs_of_another_user_or_the_same_arm_twice_is_refused(tmp_path: Path) -> None:
    combine = _bench_dir(tmp_path / "a", "combine", {"lr": 5e-4}, {10: [True]})
    noisier = _bench_dir(tmp_path / "b", "rl", {"lr": 5e-4}, {10: [True]}, wrong_rate=0.3)
    again = _bench_dir(tmp_path / "c", "combine", {"lr": 1e-3}, {10: [False]})
    for dirs, message in [((combine, noisier), "differ in user_noise"),
                          ((combine, again), "arm combine seed 10 is in more than one"),
                          ((combine, tmp_path / "nowhere"), "no results.json and runs.json")]:
        result = subprocess.run([sys.executable, "-m", "clawrl.cli", "bench", "merge", *map(str, dirs),
                                 "--out", str(tmp_path / "merged")], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_runs_on_two_model_builds_are_units_of_their_own(tmp_path: Path) -> None:
    """The same seeds run on a second pre-training build are more units, paired within their build."""
    combine = _bench_dir(tmp_path / "b0", "combine", None, {10: [True] * 4, 11: [True, True, True, False]})
    none = _bench_dir(tmp_path / "b0", "none", None, {10: [False] * 4, 11: [False] * 4})
    combine_1 = _bench_dir(tmp_path / "b1", "combine", None, {10: [True, False, False, False], 11: [False] * 4},
                           model_seed=1)
    none_1 = _bench_dir(tmp_path / "b1", "none", None, {10: [False] * 4, 11: [False] * 4}, model_seed=1)
    run_cli("bench", "merge", *map(str, (combine, none, combine_1, none_1)), "--out", str(tmp_path / "merged"),
            parse=False)
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert merged["pretrain_seeds"] == [0, 1]
    paired = merged["paired"]["combine-none"]
    assert set(paired["per_seed"]) == {"10", "11", "10@build1", "11@build1"} and paired["seeds"] == 4
    assert paired["per_seed"]["10@build1"] == 0.25 and paired["mean"] == pytest.approx((1 + 0.75 + 0.25 + 0) / 4)
    assert paired["ci"][0] < 0.25  # the second build's weak runs widen it
    assert sorted(run["model_seed"] for run in merged["arms"]["combine"]["per_seed"]) == [0, 0, 1, 1]


def test_the_interval_over_seeds_is_the_t_interval_and_the_reported_one_the_wider() -> None:
    assert t_interval([0.1, 0.2, 0.3]) == pytest.approx((0.2 - 4.303 * 0.1 / 3**0.5, 0.2 + 4.303 * 0.1 / 3**0.5))
    assert t_interval([0.4]) is None  # one seed says nothing of how runs vary
    assert wider((0.0, 0.1), (0.0, 0.3)) == (0.0, 0.3) and wider((0.0, 0.3), (0.1, 0.2)) == (0.0, 0.3)
    assert wider((0.0, 0.1), None) == (0.0, 0.1)
    # seeds that agree exactly: the t-interval has width 0 and the bootstrap (prompts resampled) stands
    same = {seed: [True, False, True, True] for seed in range(3)}
    base = {seed: [False, False, True, True] for seed in range(3)}
    difference = paired_difference(same, base)
    assert difference["t_ci"] == pytest.approx([0.25, 0.25]) and difference["ci"] == difference["bootstrap_ci"]


def test_the_report_puts_the_answers_correctness_beside_the_style_score(tmp_path: Path) -> None:
    """On topic and right result, before and after, per arm and as a paired difference."""
    def run(arm: str, seed: int, on_topic: list[bool], correct: list[bool]) -> RunResult:
        before = Evaluation(0, 0, [False] * 4, "before", on_topic=[True] * 4, correct=[False, False, True, True])
        return RunResult(arm, seed, [before, Evaluation(4, 3, [True] * 4, "after", on_topic, correct)], [True], 3, 1.0)

    runs = [run("combine", seed, [True, False, False, False], [False] * 4) for seed in (10, 11)]
    runs += [run("none", seed, [True] * 4, [False, False, True, True]) for seed in (10, 11)]
    config = BenchConfig(method="all", sessions=4, seed_list="10-11", out=tmp_path)
    results = write_report(config, {}, runs, "clawrl bench learn")
    combine = results["arms"]["combine"]
    assert (combine["on_topic_baseline"], combine["on_topic_final"]) == (1.0, 0.25)
    assert (combine["correct_baseline"], combine["correct_final"]) == (0.5, 0.0)
    paired = results["paired"]["combine-none"]
    assert paired["on_topic_mean"] == -0.75 and paired["correct_mean"] == -0.5 and paired["correct_ci"][1] <= 0
    card = (tmp_path / "report.md").read_text()
    assert "| combine (RL + OPD) | 1.00 | **0.25** |" in card


def test_the_sweep_picks_the_best_style_among_settings_that_keep_the_question(tmp_path: Path) -> None:
    """benchmarks/learn_pick.py: a setting whose answers leave the question loses to one that stays on it."""
    def tuned(setting: str, flags: dict[str, Any], style: list[bool], on_topic: list[bool]) -> None:
        before = Evaluation(0, 0, [False] * 4, "before", on_topic=[True] * 4, correct=[False] * 4)
        runs = [RunResult("rl", 100, [before, Evaluation(6, 5, style, "after", on_topic, [False] * 4)], [True], 5, 1.0)]
        out = tmp_path / "tune" / "rl" / setting
        out.mkdir(parents=True)
        write_report(BenchConfig(method="rl", sessions=6, seed_list="100", out=out), {"rl": flags}, runs, "bench")

    tuned("fast", {"lr": 5e-4}, style=[True] * 4, on_topic=[True, False, False, False])
    tuned("slow", {"lr": 1e-4}, style=[True, True, False, False], on_topic=[True] * 4)
    tuned("slower", {"lr": 5e-5}, style=[True, False, False, False], on_topic=[True] * 4)
    printed = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "benchmarks" / "learn_pick.py"),
                              str(tmp_path / "tune"), "--out", str(tmp_path / "picked.json")],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    picked = json.loads((tmp_path / "picked.json").read_text())
    assert picked["chosen"] == {"rl": "--lr 0.0001"}
    assert "`slow` **(picked)**" in printed and "1.00 → 0.25" in printed
