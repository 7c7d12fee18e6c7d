"""The learning benchmark's statistics and report on fixed inputs: sessions to align, score curves,
bootstrap intervals, and the results.json schema the report card and the plot are made from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clawrl.config import BenchConfig
from clawrl.sim.results import Evaluation, RunResult
from clawrl.sim.metrics import bootstrap_ci, sessions_to_align, step_curve
from clawrl.sim.report import median_sessions, write_report


@pytest.mark.parametrize(("satisfied", "expected"), [
    ([True, True, True], 0),
    ([False, True, False, True, True, True], 3),
    ([False, False, True, True, False, True, True, True, False], 5),
    ([True, True, False, True, True], None),
    ([], None),
])
def test_sessions_to_align(satisfied: list[bool], expected: int | None) -> None:
    assert sessions_to_align(satisfied) == expected


def test_sessions_to_align_with_another_window() -> None:
    assert sessions_to_align([False, True, False, True, True], window=2) == 3
    assert sessions_to_align([False, True], window=1) == 1


def test_step_curve_holds_each_score_until_the_next_evaluation() -> None:
    points = [(0, 0.2), (3, 0.5), (3, 0.6), (5, 0.9)]
    assert step_curve(points, 6) == [0.2, 0.2, 0.2, 0.6, 0.6, 0.9, 0.9]
    assert step_curve([(2, 0.4)], 3) == [0.4, 0.4, 0.4, 0.4]  # before the first evaluation: its score
    with pytest.raises(ValueError):
        step_curve([], 3)


def test_bootstrap_interval_contains_the_mean_and_narrows_with_more_data() -> None:
    few = [[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]]
    low, high = bootstrap_ci(few)
    assert low <= 0.75 <= high and high - low > 0.2
    many = [group * 25 for group in few]
    low_many, high_many = bootstrap_ci(many)
    assert low_many <= 0.75 <= high_many and high_many - low_many < (high - low) / 2
    assert bootstrap_ci(few, seed=1) == bootstrap_ci(few, seed=1)


def test_bootstrap_of_constant_groups_is_a_point_and_empty_groups_are_refused() -> None:
    assert bootstrap_ci([[1.0, 1.0], [1.0]]) == (1.0, 1.0)
    with pytest.raises(ValueError):
        bootstrap_ci([[1.0], []])


def test_median_sessions_counts_never_as_latest() -> None:
    assert median_sessions([4, None, 10]) == 10
    assert median_sessions([None, None, 3]) is None
    assert median_sessions([2, 6]) == 4
    assert median_sessions([2, None]) is None


def run(arm: str, seed: int, scores: list[tuple[int, int, int]], satisfied: list[bool]) -> RunResult:
    """A run whose evaluations have `hits` of 4 held-out prompts satisfied: (session, version, hits)."""
    evaluations = [Evaluation(session, version, [i < hits for i in range(4)], f"answer {session}")
                   for session, version, hits in scores]
    training = None if arm == "none" else {
        "steps": 2, "samples_trained": 8, "samples_dropped_stale": 0, "stale_share": 0.0, "mean_staleness": 0.0,
        "max_step_staleness": 0.0, "mean_is_weight": 1.0, "min_step_is_weight": 1.0, "max_step_is_weight": 1.0,
        "logprob_drift": 0.0, "clip_fraction": 0.0}
    return RunResult(arm, seed, evaluations, satisfied, versions=scores[-1][1], seconds=60.0,
                     judged=[(1, True), (-1, False), (0, True), (1, False)], training=training)


def test_results_json_schema_report_card_and_plot(tmp_path: Path) -> None:
    config = BenchConfig(method="all", sessions=4, seeds=2, out=tmp_path, heldout_prompts=4)
    runs = [
        run("none", 0, [(0, 0, 1), (4, 0, 1)], [False, False, True, False]),
        run("none", 1, [(0, 0, 0), (4, 0, 1)], [False, True, False, False]),
        run("combine", 0, [(0, 0, 1), (2, 1, 3), (4, 2, 4)], [False, True, True, True]),
        run("combine", 1, [(0, 0, 0), (3, 1, 4), (4, 1, 4)], [False, False, True, True]),
    ]
    results = write_report(config, {"combine": {"batch_size": 8, "full": True}}, runs, "clawrl bench learn --sessions 4")
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk == json.loads(json.dumps(results))
    assert set(on_disk["arms"]) == {"none", "combine"}
    for arm in on_disk["arms"].values():
        assert {"baseline", "final", "sessions_to_align", "ci"} <= set(arm)
        low, high = arm["ci"]
        assert 0 <= low <= arm["final"] <= high <= 1
        assert len(arm["curve"]) == config.sessions + 1
    combine = on_disk["arms"]["combine"]
    assert (combine["baseline"], combine["final"]) == (0.125, 1.0)
    assert [seed["sessions_to_align"] for seed in combine["per_seed"]] == [1, None]
    assert combine["sessions_to_align"] is None  # median of 1 and never
    assert combine["curve"] == [0.125, 0.125, 0.375, 0.875, 1.0]
    assert on_disk["arms"]["none"]["sessions_to_align"] is None
    card = (tmp_path / "report.md").read_text()
    assert "| combine (RL + OPD) | 0.12 | **1.00** |" in card and "learning.png" in card
    assert "`clawrl bench learn --sessions 4`" in card and "trained arms with `--batch-size 8 --full`" in card
    assert combine["train_flags"] == {"batch_size": 8, "full": True} and on_disk["arms"]["none"]["train_flags"] is None
    assert (tmp_path / "learning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_json_has_issue_12s_fields(tmp_path: Path) -> None:
    summary = tmp_path / "docs" / "learn.json"
    config = BenchConfig(method="all", sessions=4, seed_list="3,100", out=tmp_path, heldout_prompts=4, summary=summary,
                         catch_up=False)
    runs = [
        run(arm, seed, [(0, 0, 1), (4, 2, hits)], [False, True, True, True])
        for arm, hits in (("none", 1), ("memory", 2), ("rl", 2), ("opd", 1), ("combine", 4), ("memory_combine", 3))
        for seed in (3, 100)
    ]
    trained = {arm: {"batch_size": 4} for arm in ("rl", "opd", "combine", "memory_combine")}
    results = write_report(config, trained, runs, "clawrl bench learn --seed-list 3,100 --no-catch-up")
    on_disk = json.loads(summary.read_text())
    assert on_disk == json.loads((tmp_path / "results.json").read_text()) == json.loads(json.dumps(results))
    assert on_disk["report_seeds"] == [3] and on_disk["tuning_seeds"] == [100, 101, 102, 103, 104]
    assert on_disk["seed_list"] == [3, 100] and on_disk["catch_up"] is False
    assert on_disk["hint_strings_shared_with_pretraining"] == 0
    assert on_disk["judge_agreement"] == 0.5 and on_disk["judge_abstained"] == 0.25 and on_disk["judged_turns"] == 48
    assert set(on_disk["arms"]) == {"none", "memory", "rl", "opd", "combine", "memory_combine"}
    for arm in on_disk["arms"].values():
        assert {"baseline", "final", "ci", "sessions_to_align"} <= set(arm)
    assert on_disk["arms"]["combine"]["upstream_sessions_to_align"] == 10.3
    assert on_disk["arms"]["memory"]["upstream_sessions_to_align"] == 14.5
    assert on_disk["arms"]["none"]["training"] is None and on_disk["arms"]["rl"]["training"]["mean_is_weight"] == 1.0
    assert {"combine-rl", "combine-opd", "combine-memory", "combine-none"} <= set(on_disk["paired"])
    combine_none = on_disk["paired"]["combine-none"]  # per seed, per prompt: [0, 1, 1, 1]
    assert combine_none["mean"] == 0.75 and 0 < combine_none["ci"][0] <= 0.75 <= combine_none["ci"][1] == 1.0
    assert on_disk["paired"]["memory_combine-memory"]["mean"] == 0.25
    assert on_disk["paired"]["combine-rl"]["mean"] == 0.5
    card = (tmp_path / "report.md").read_text()
    assert "| combine-none | +0.75 | [+0.38, +1.00] | +0.75, +0.75 | combine beats none |" in card
    assert "10.3 (Hybrid)" in card and "another model" in card and "0.50 of 48 judged turns agree" in card
    assert "report seeds: 3; tuning seeds: 100, 101, 102, 103, 104" in card and "off (--no-catch-up)" in card
    assert "| memory + combine |" in card and "mean staleness" in card
