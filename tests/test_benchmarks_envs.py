"""benchmarks/envs.py runs and writes every section it prints (a smoke run: its figures are in docs)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clawrl.envs.sandbox import sandbox_available
from clawrl.sim.metrics import wider

ROOT = Path(__file__).resolve().parent.parent
UNAVAILABLE = sandbox_available()


@pytest.mark.skipif(UNAVAILABLE is not None, reason=f"sandboxes cannot start here: {UNAVAILABLE}")
def test_the_environment_benchmark_measures_the_sandbox_and_both_families(tmp_path: Path) -> None:
    out = tmp_path / "envs.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "envs.py"), "--quick", "--families", "toolcall,terminal",
                             "--out", str(out)],
                            capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    written = json.loads(out.read_text())
    assert set(written["lifecycle"]) == {"start", "reset", "close"}
    assert all(figures["median_ms"] > 0 for figures in written["lifecycle"].values())
    assert {row["command"] for row in written["commands"]} == {"true", "/usr/bin/python3 -c 'print(1)'"}
    assert {(row["family"], row["concurrency"]) for row in written["rollouts"]} == {
        ("toolcall", 1), ("toolcall", 2), ("terminal", 1), ("terminal", 2)}
    assert all(row["failed"] == 0 and row["mean_reward"] == 1.0 for row in written["rollouts"])
    assert "| toolcall | 2 |" in result.stdout
    assert [row["family"] for row in written["footprint"]] == ["toolcall", "terminal"]
    assert all(row["held"] == 2 for row in written["footprint"])


def load_envs_learn() -> Any:
    spec = importlib.util.spec_from_file_location("envs_learn", ROOT / "benchmarks" / "envs_learn.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_learning_benchmark_summarises_curves_gains_and_the_paired_arms() -> None:
    envs_learn = load_envs_learn()

    def run(arm: str, seed: int, first: list[float], last: list[float]) -> dict[str, Any]:
        return {"arm": arm, "seed": seed, "curve": [{"round": 0, "outcomes": first}, {"round": 1, "outcomes": last}]}

    runs = [run("integrated", 1, [0, 0, 1, 0], [1, 1, 1, 0]), run("outcome", 1, [0, 0, 1, 0], [0, 1, 1, 0]),
            run("integrated", 2, [0, 1, 0, 0], [1, 1, 0, 1]), run("outcome", 2, [0, 1, 0, 0], [0, 1, 0, 1])]  # fmt: skip
    summary = envs_learn.summarize(runs)
    curve = summary["arms"]["integrated"]["curve"]
    assert [point["eval_reward"] for point in curve] == [0.25, 0.75]
    assert all(low <= point["eval_reward"] <= high for point in curve for low, high in [point["ci"]])
    gain = summary["arms"]["integrated"]["gain"]
    assert gain["mean"] == 0.5 and gain["seeds"] == 2 and gain["ci"][0] > 0
    assert summary["arms"]["integrated"]["gain_ci"] == gain["ci"] == list(wider(tuple(gain["bootstrap_ci"]), tuple(gain["t_ci"])))
    assert len({envs_learn.eval_seed(seed) for seed in (10, 11, 12)}) == 3  # each seed its own eval episodes
    assert summary["paired"]["integrated-outcome"]["mean"] == 0.25
    assert "integrated-outcome: +0.250" in envs_learn.table(summary)


def test_an_earlier_results_file_gets_todays_intervals_beside_the_ones_it_was_reported_with(tmp_path: Path) -> None:
    envs_learn = load_envs_learn()
    runs = [{"arm": "integrated", "seed": seed, "curve": [{"round": 0, "outcomes": [0, 0, 1, 0]},
                                                          {"round": 1, "outcomes": [1, 1, 1, seed % 2]}]}
            for seed in (10, 11, 12)]  # fmt: skip
    reported = {"arms": {"integrated": {"gain": {"mean": 0.6, "ci": [0.5, 0.7]}}}, "paired": {}}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"command": "benchmarks/envs_learn.py ...", "summary": reported, "runs": runs}))

    envs_learn.resummarize(path)

    results = json.loads(path.read_text())
    assert results["summary"] == reported  # what the docs quoted stays
    assert results["eval_episodes_shared"] is True and {run["eval_seed"] for run in results["runs"]} == {777}
    gain = results["summary_now"]["arms"]["integrated"]["gain"]
    assert results["summary_now"]["arms"]["integrated"]["gain_ci"] == list(wider(tuple(gain["bootstrap_ci"]), tuple(gain["t_ci"])))
