"""The learning benchmark's comparisons on hand-computed inputs: paired differences between arms,
the judge against the user's hidden ground truth, the asynchronous-path figures, and seed sets."""

from __future__ import annotations

import pytest

from clawrl.config import BenchConfig, parse_seeds
from clawrl.sim.results import Evaluation, RunResult
from clawrl.sim.stats import (
    judge_agreement,
    paired_difference,
    paired_differences,
    paired_groups,
    training_over_seeds,
    training_summary,
)

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
    low, high = difference["ci"]
    assert 0 <= low <= difference["mean"] <= high <= 1
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
    assert set(differences) == {"combine-rl", "combine-none"}
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
