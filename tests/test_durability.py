"""`clawrl serve` in its own process, killed with SIGKILL right after answering: nothing acknowledged is lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from clawrl.serve.runner import free_port
from clawrl.store import Store
from clawrl.store.inspect import session_detail


@contextmanager
def serve_process(model_dir: Path, run_dir: Path, port: int) -> Iterator[subprocess.Popen]:
    command = [sys.executable, "-m", "clawrl.cli", "serve", "--model", str(model_dir), "--run-dir", str(run_dir),
               "--port", str(port), "--served-model-name", "tiny", "--device", "cpu"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stderr.read().decode()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.1)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def ask(port: int, messages: list[dict[str, Any]], stream: bool) -> tuple[str, str, str]:
    """One request as an agent sends it; returns (answer, turn id, session id)."""
    body = {"model": "tiny", "messages": messages, "max_tokens": 10, "stream": stream}
    response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    if stream:
        assert response.text.rstrip().endswith("data: [DONE]")
        answer = "".join(
            choice["delta"].get("content") or ""
            for line in response.text.splitlines() if line.startswith("data: {")
            for choice in json.loads(line[6:])["choices"]
        )
    else:
        answer = response.json()["choices"][0]["message"]["content"]
    return answer, response.headers["x-clawrl-turn"], response.headers["x-clawrl-session"]


def test_sigkill_loses_no_acknowledged_turn_and_restart_continues_sessions(tool_model_dir: Path, tmp_path: Path) -> None:
    run_dir, port = tmp_path / "run", free_port()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    acknowledged: list[str] = []
    with serve_process(tool_model_dir, run_dir, port) as process:
        for i, stream in enumerate([False, True, True]):
            messages.append({"role": "user", "content": f"question number {i}"})
            answer, turn_id, session_id = ask(port, messages, stream)
            messages.append({"role": "assistant", "content": answer})
            acknowledged.append(turn_id)
        process.send_signal(signal.SIGKILL)  # right after the last answer
        process.wait()

    store = Store.for_run_dir(run_dir)
    for turn_id in acknowledged:
        assert store.turns.turn(turn_id) is not None, f"acknowledged turn {turn_id} was lost"
    store.close()

    with serve_process(tool_model_dir, run_dir, port):
        messages.append({"role": "user", "content": "and after the restart?"})
        _answer, turn_id, restarted_session = ask(port, messages, stream=False)
    assert restarted_session == session_id
    detail = session_detail(Store.for_run_dir(run_dir), session_id)
    assert detail is not None and [t["id"] for t in detail["turns"]] == acknowledged + [turn_id]
    assert detail["turns"][2]["next_state"]["content"] == "and after the restart?"
