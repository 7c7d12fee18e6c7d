"""Operating `clawrl serve`: JSON log lines, readiness, and a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from clawrl.config import EngineConfig
from clawrl.engines import build_engine
from clawrl.serve.runner import ServerThread, free_port
from clawrl.store import Store
from tests.helpers import PostgresServer, healthz, start_server, wait_until


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


SIGNAL_INSIDE_DEL = """
import os, signal
from clawrl import cli
from clawrl.logs import configure_logging

configure_logging("json")
signal.signal(signal.SIGTERM, cli._exit_on_signal)

class Collected:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(10_000))  # the handler runs here, inside __del__, where its SystemExit is only printed

Collected()
print("stop asked for:", cli._stop_signalled.is_set())
"""


def test_a_stop_signal_lost_inside_a_destructor_is_still_seen_and_logged_as_json() -> None:
    """CI once caught SIGTERM landing in the regex module's `Group.__del__`: Python printed
    "Exception ignored in ..." (not JSON) and the trainer went on. The stop must survive that."""
    done = subprocess.run([sys.executable, "-c", SIGNAL_INSIDE_DEL], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "stop asked for: True"
    records = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert [record["level"] for record in records] == ["warning"]
    assert records[0]["message"].startswith("Exception ignored in") and "SystemExit: 143" in records[0]["exception"]


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


def test_readyz_is_ready_only_while_the_model_and_the_store_answer(tiny_model_dir: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="clawrl-postgres-"))  # the server runs as `postgres`: not under pytest's tmp
    try:
        database = PostgresServer(root)
        engine = build_engine(EngineConfig(model=str(tiny_model_dir), device="cpu", cpu_threads=1))
        with ServerThread(engine, Store(database.new_database())) as server:
            base = server.base_url.removesuffix("/v1")
            ready = httpx.get(f"{base}/readyz", timeout=30)
            assert ready.status_code == 200
            assert ready.json() == {"status": "ready", "model": engine.model_name, "policy_version": 0,
                                    "published_version": 0, "problems": {}}  # fmt: skip
            database.stop()  # the store goes away under a running server
            gone = httpx.get(f"{base}/readyz", timeout=30)
            assert gone.status_code == 503 and gone.json()["status"] == "not_ready"
            assert set(gone.json()["problems"]) == {"store"} and gone.json()["published_version"] is None
            assert httpx.get(f"{base}/healthz", timeout=30).status_code == 200  # alive, only not ready
            asyncio.run(engine.close())  # and the model stops answering too
            both = httpx.get(f"{base}/readyz", timeout=30).json()["problems"]
            assert both["model"] == "the engine is not running" and "store" in both
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_ctrl_c_stops_serve_and_its_trainer_once_without_a_restart(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Ctrl-C at a terminal signals the foreground process group. The trainer used to be in it: it
    died at once, and serve's supervisor started it again while serve was still shutting down."""
    port = free_port()
    log_path = tmp_path / "serve.log"
    command = [sys.executable, "-m", "clawrl.cli", "serve", "--model", str(tiny_model_dir), "--device", "cpu",
               "--cpu-threads", "1", "--run-dir", str(tmp_path / "run"), "--port", str(port), "--method", "combine"]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with log_path.open("w") as log_file:
        serve = subprocess.Popen(command, stderr=log_file, start_new_session=True)  # a terminal's foreground group
        try:
            wait_until(lambda: healthz(base) and healthz(base).get("trainer", {}).get("running"), 120, "serve and its trainer")
            trainer_pid = healthz(base)["trainer"]["pid"]
            os.killpg(serve.pid, signal.SIGINT)
            assert serve.wait(60) == 0  # a stop asked for
        finally:
            if serve.poll() is None:
                os.killpg(serve.pid, signal.SIGKILL)
    log = log_path.read_text()
    assert "starting it again" not in log and "started the trainer" in log
    assert not Path(f"/proc/{trainer_pid}").exists() or Path(f"/proc/{trainer_pid}/stat").read_text().split()[2] == "Z"


def test_sigterm_lets_requests_in_flight_finish_then_stops_the_trainer_and_exits_0(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "clawrl.cli", "serve", "--model", str(tiny_model_dir), "--device", "cpu",
               "--cpu-threads", "1", "--run-dir", str(tmp_path), "--port", str(port), "--served-model-name", "m",
               "--method", "combine"]  # fmt: skip
    serve = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthz(base) and healthz(base).get("trainer", {}).get("running"), 120, "serve and its trainer")
        trainer_pid = healthz(base)["trainer"]["pid"]
        body = {"model": "m", "messages": [{"role": "user", "content": "tell me a long story"}], "max_tokens": 1200,
                "seed": 4, "stream": True}  # fmt: skip
        with httpx.Client(timeout=120) as http, http.stream("POST", f"{base}/v1/chat/completions", json=body) as stream:
            lines = stream.iter_lines()
            received = [next(line for line in lines if line.startswith("data: "))]
            serve.send_signal(signal.SIGTERM)  # mid-stream
            received += [line for line in lines if line.startswith("data: ")]
            turn_id = stream.headers["x-clawrl-turn"]
        assert received[-1] == "data: [DONE]" and len(received) > 100  # the whole answer, after the signal
        assert serve.wait(60) == 0
        assert not Path(f"/proc/{trainer_pid}").exists() or Path(f"/proc/{trainer_pid}/stat").read_text().split()[2] == "Z"
        finished = Store.for_run_dir(tmp_path).turns.turn(turn_id)
        assert finished is not None and len(finished.response_token_ids) == 1200  # recorded whole
        assert '"finish_reason":"length"' in received[-2]
    finally:
        serve.kill()
        serve.wait(10)
