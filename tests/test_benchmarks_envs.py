"""benchmarks/envs.py runs and writes every section it prints (a smoke run: its figures are in docs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clawrl.envs.sandbox import sandbox_available

ROOT = Path(__file__).resolve().parent.parent
UNAVAILABLE = sandbox_available()


@pytest.mark.skipif(UNAVAILABLE is not None, reason=f"sandboxes cannot start here: {UNAVAILABLE}")
def test_the_environment_benchmark_measures_the_sandbox_and_both_families(tmp_path: Path) -> None:
    out = tmp_path / "envs.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "envs.py"), "--quick", "--out", str(out)],
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
