"""The soak (issue 16) for one minute: a real `clawrl serve` with its trainer under 64 concurrent
clients of every kind (chats, streams, tool round trips, sessions with feedback, side turns,
clients that hang up). No request may fail, every acknowledged turn and piece of feedback must be
in the store, every hung-up stream recorded, versions published and served, and the server's file
descriptors, threads and memory must stay flat. About 3,300 answered turns, 300 hung-up streams and
170 published versions a run here (it ran two minutes until the suite had to fit in 20 minutes:
rarer races, like the one hang-up in 700 of tests/test_soak_findings.py, are the 30-minute run's
to find: `benchmarks/soak.py`, docs/benchmarks.md ("Soak"))."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_minute_of_mixed_load_with_the_trainer_publishing(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--clients", "64", "--minutes", "1",
               "--model", str(tiny_model_dir), "--run-dir", str(tmp_path / "run"), "--out", str(out)]  # fmt: skip
    # a minute of load, plus the server's start and stop; far more on a slow, shared machine
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    soak = json.loads(out.read_text())
    summary = result.stdout[-4000:]

    assert soak["failures"] == 0, (soak["failure_list"], soak["healthz_failures"], summary)
    assert soak["actions"].keys() == {"chat", "stream", "tool", "session", "side", "hangup"}, soak["actions"]
    assert all(count > 0 for count in soak["requests"]["by_kind"].values()) and "feedback" in soak["requests"]["by_kind"]
    acknowledged = soak["acknowledged_turns"]
    assert acknowledged["expected"] > 1000 and acknowledged["found"] == acknowledged["expected"], acknowledged
    assert acknowledged["wrong_kind"] == acknowledged["wrong_version"] == acknowledged["unexpectedly_cancelled"] == 0, acknowledged
    assert soak["acknowledged_feedback"]["missing"] == 0 and soak["acknowledged_feedback"]["expected"] > 0
    hung_up = soak["hung_up"]
    # every hung-up stream is recorded: cancelled, or finished where generation won the race (one in
    # about 700 was lost before the fix: tests/test_soak_findings.py)
    assert hung_up["streams"] > 0 and hung_up["missing_after_stop"] == 0, hung_up
    assert hung_up["finish_reasons"].get("cancelled", 0) > 0, hung_up  # most hang-ups are cut short, and kept as such

    versions = soak["versions"]
    assert versions["published"] >= 1, versions
    assert max(versions["served_by_healthz"]) >= 1 and max(int(v) for v in versions["seen_in_answers"]) >= 1, versions
    assert versions["trainer"]["running"] and not versions["trainer"]["given_up"], versions

    growth = soak["growth"]
    # the server holds one socket per client connection, a few files and its threads' handles: a
    # leak of one fd per request (thousands here) or per hang-up (hundreds) would show at once
    assert growth["server_fds"]["max"] <= growth["server_fds"]["first"] + 16, growth["server_fds"]
    assert growth["server_threads"]["last"] <= growth["server_threads"]["first"] + 4, growth["server_threads"]
    assert growth["server_rss_mib"]["growth"] < 200, growth["server_rss_mib"]  # loosely: loaded LoRA versions come and go
    assert growth["trainer_fds"]["max"] <= 64, growth["trainer_fds"]
    assert soak["server_stop"]["exit_code"] in (0, 143) and not soak["server_stop"]["killed"], soak["server_stop"]
    assert soak["server_log"]["errors"] == 0, soak["server_log"]
    assert len(soak["machine"]["load_average_start"]) == 3
