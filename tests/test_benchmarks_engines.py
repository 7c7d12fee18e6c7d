"""benchmarks/engines.py runs and writes every section it prints (a smoke run of the hf engine only:
the vllm figures, and the script run with vLLM, are in docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_engine_benchmark_measures_throughput_and_agent_turns(tmp_path: Path) -> None:
    out = tmp_path / "engines.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "engines.py"), "--quick", "--engines", "hf", "--requests", "8",
               "--turns", "2", "--sessions", "1", "--out", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    written = json.loads(out.read_text())
    assert {(row["engine"], row["clients"]) for row in written["throughput"]["levels"]} == {("hf", 1), ("hf", 8), ("hf", 32)}
    assert all(row["requests"] == 8 and row["tokens"] > 0 for row in written["throughput"]["levels"])
    rows = {row["engine"]: row for row in written["agent_turns"]["rows"]}
    assert set(rows) == {"hf", "hf, no prefix caching"}
    for agent in rows.values():
        # the recorded OpenClaw request with its system prompt back at about 40 KB: some 20K tokens
        assert 15_000 < agent["first_turn_prompt_tokens"] < agent["last_turn_prompt_tokens"] < 32_768
        assert [turn["turn"] for turn in agent["turns"][0]] == [1, 2]
    assert len(written["machine"]["load_average_start"]) == 3
    assert "| hf | 32 |" in result.stdout
