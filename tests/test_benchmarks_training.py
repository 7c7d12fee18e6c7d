"""benchmarks/agent_shaped_training.py keeps its contract (issue 17): one JSON object whose two ways
of training the same agent-shaped batch agree on the gradient (a smoke run: its figures are in docs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_agent_shaped_benchmark_prints_one_json_object_and_both_sides_train_alike(tmp_path: Path) -> None:
    out = tmp_path / "agent_shaped.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "agent_shaped_training.py"), "--quick", "--json", "--cpu-threads", "1",
               "--out", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed == json.loads(out.read_text())
    assert {"speedup", "peak_memory_ratio", "max_grad_rel_diff"} <= set(printed)
    assert printed["samples"] == 2 * 3 and printed["prompt_tokens"] > 2 * 3 * 2000
    assert printed["max_grad_rel_diff"] < 1e-4  # the same gradient, up to float32 rounding
    assert printed["speedup"] > 0 and printed["peak_memory_ratio"] >= 0
