"""Operating `clawrl serve`: JSON log lines, readiness, and a clean stop on SIGTERM."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from clawrl.serve.runner import free_port
from tests.helpers import healthz, start_server, wait_until


def test_json_logs_are_one_object_per_line_from_the_server_and_its_trainer(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "serve.log"
    command = [sys.executable, "-m", "clawrl.cli", "serve", "--model", str(tiny_model_dir), "--device", "cpu",
               "--cpu-threads", "1", "--run-dir", str(tmp_path / "run"), "--port", str(port), "--method", "combine",
               "--served-model-name", "m", "--log-format", "json"]  # fmt: skip
    with log_path.open("w") as log_file:
        serve = subprocess.Popen(command, stderr=log_file, env={**os.environ, "PYTHONWARNINGS": "always"})
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: healthz(base), 120, "clawrl serve")
            wait_until(lambda: "running behind serving" in log_path.read_text(), 60, "the trainer's first log line")
            answer = httpx.post(f"{base}/v1/chat/completions", timeout=60,
                                json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            assert answer.status_code == 200
        finally:
            serve.send_signal(signal.SIGTERM)
            assert serve.wait(60) == 0
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line, not just most of them
    assert all({"time", "level", "logger", "message", "pid"} <= set(record) for record in records)
    serving = next(record for record in records if record["message"].startswith("serving "))
    trainer = next(record for record in records if record["message"].startswith("running behind serving"))
    assert serving["pid"] == serve.pid and trainer["pid"] != serve.pid and trainer["level"] == "info"


def test_an_idle_keep_alive_connection_outlives_the_clients_own_expiry(tiny_model_dir: Path, tmp_path: Path) -> None:
    """httpx (and so the openai SDK) reuses an idle connection for up to 5 s: had the server closed it
    at 5 s too, a request written at that moment would be lost unread (found by the soak)."""
    with start_server(tiny_model_dir, tmp_path) as server:
        connection = http.client.HTTPConnection(server.config.host, server.config.port, timeout=10)
        connection.request("GET", "/healthz")
        assert connection.getresponse().read() and connection.sock is not None
        opened = connection.sock
        time.sleep(6.0)  # past the 5 s both sides used to keep an idle connection
        connection.request("GET", "/healthz")  # on the same socket: http.client reopens only a closed one
        response = connection.getresponse()  # RemoteDisconnected had the server closed it
        assert response.status == 200 and connection.sock is opened
        connection.close()
