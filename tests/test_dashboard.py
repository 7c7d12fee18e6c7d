"""The dashboard: pages over the store, inside `clawrl serve` and alone (`clawrl dashboard`)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx

from clawrl.config import JudgeConfig
from clawrl.serve.runner import ServerThread, free_port
from clawrl.store import Store
from tests.helpers import (
    CORRECTION,
    WEATHER_ANSWER,
    WEATHER_QUESTION,
    WEATHER_RESULT,
    WEATHER_TOOL,
    converse,
    start_server,
    store_with_samples,
    version,
    wait_for_judgment,
)

SCRIPT = '<script>alert("owned")</script>'


def root(server_base_url: str) -> str:
    return server_base_url.removesuffix("/v1")


def test_the_dashboard_shows_sessions_verdicts_hints_and_feedback(tool_model_dir: Path, run_dir: Path) -> None:
    with start_server(tool_model_dir, run_dir, judge=JudgeConfig(judge_poll_s=0.05)) as server:
        session_id, turn_ids = converse(server.base_url, [f"Summarise this page: {SCRIPT}", CORRECTION, "thanks"])
        store = Store.for_run_dir(run_dir)
        wait_for_judgment(store, turn_ids[0])
        wait_for_judgment(store, turn_ids[1])
        httpx.post(f"{server.base_url}/feedback", json={"turn": turn_ids[1], "score": 1, "text": "short and plain, good"})
        with httpx.Client(base_url=root(server.base_url), timeout=30) as http:
            page = http.get("/dashboard", params={"refresh": 0})
            data = http.get("/dashboard/api/overview").json()
            session = http.get(f"/dashboard/sessions/{quote(session_id, safe='')}")
            missing = http.get("/dashboard/sessions/no-such-session")
            bare = http.get("/", follow_redirects=False)
            metrics = http.get("/metrics").text

    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert f'href="/dashboard/sessions/{session_id}"' in page.text and "Serving policy v0" in page.text
    assert 'http-equiv="refresh"' not in page.text  # ?refresh=0 turns the reload off
    assert data["counts"]["main_turns"] == 3 and data["counts"]["judged"] == 2 and data["counts"]["feedback"] == 1
    assert data["live_score"] == [{"version": 0, "judged": 2, "mean_score": 0.0, "vote_agreement": 1.0}]
    assert [s["id"] for s in data["sessions"]] == [session_id]

    assert session.status_code == 200
    assert SCRIPT not in session.text and "&lt;script&gt;alert(&#34;owned&#34;)&lt;/script&gt;" in session.text
    assert "without the bold and the numbered list" in session.text  # the hint of the corrected turn
    assert 'class="neg">-1' in session.text and 'class="pos">+1' in session.text
    assert "short and plain, good" in session.text
    assert session.text.count('class="turn main"') == 3
    assert missing.status_code == 404 and "No session" in missing.text
    assert bare.status_code == 307 and bare.headers["location"] == "/dashboard"  # a browser opening the address
    assert 'clawrl_requests_total{endpoint="/dashboard",status="200"}' in metrics


def test_with_an_api_key_the_dashboard_asks_for_it(tool_model_dir: Path, run_dir: Path) -> None:
    with start_server(tool_model_dir, run_dir, api_key="s3cret") as server:
        with httpx.Client(base_url=root(server.base_url), timeout=30) as http:
            anonymous = http.get("/dashboard")
            wrong = http.get("/dashboard", auth=("me", "guess"))
            garbled = http.get("/dashboard/api/overview", headers={"Authorization": "Basic %%%"})
            basic = http.get("/dashboard", auth=("anyone", "s3cret"))
            bearer = http.get("/dashboard/api/overview", headers={"Authorization": "Bearer s3cret"})
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Basic")
    assert anonymous.json()["error"]["code"] == "invalid_api_key"
    assert wrong.status_code == 401 and garbled.status_code == 401
    assert basic.status_code == 200 and "Serving policy v0" in basic.text
    assert bearer.status_code == 200 and bearer.json()["counts"]["sessions"] == 0


def test_serve_without_the_dashboard(tool_model_dir: Path, run_dir: Path) -> None:
    with start_server(tool_model_dir, run_dir, dashboard=False) as server:
        response = httpx.get(f"{root(server.base_url)}/dashboard", timeout=30)
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_clawrl_dashboard_alone_shows_published_versions(tmp_path: Path) -> None:
    store, training = store_with_samples(tmp_path, 3)
    training.register_version(version(1, 0), ["t0", "t1"])
    training.register_version(version(2, 1), ["t2"])
    training.rollback(1)
    store.close()
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "clawrl.cli", "dashboard", "--run-dir", str(tmp_path), "--dashboard-port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        page = _get_when_up(f"http://127.0.0.1:{port}/dashboard", process)
        session = httpx.get(f"http://127.0.0.1:{port}/dashboard/sessions/s", timeout=30)
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert page.status_code == 200
    assert "Serving policy v1" in page.text and "newest published: v2" in page.text
    assert "v1 (serving)" in page.text and "<td>v2</td>" in page.text
    assert "3 trained" not in page.text and "<b>3</b>samples trained" in page.text
    assert session.status_code == 200 and "sample: rl, reward 1.0, trained into v1" in session.text


def _get_when_up(url: str, process: subprocess.Popen[bytes]) -> httpx.Response:
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
        try:
            return httpx.get(url, timeout=30)
        except httpx.TransportError:
            assert time.monotonic() < deadline, "clawrl dashboard did not start"
            time.sleep(0.2)


def test_a_tool_round_trip_shows_the_call_and_the_tool_result(server: ServerThread, store: Store) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        model = http.get("/models").json()["data"][0]["id"]
        messages: list[dict] = [{"role": "user", "content": WEATHER_QUESTION}]
        body = {"model": model, "tools": [WEATHER_TOOL], "temperature": 0, "max_tokens": 40}
        first = http.post("/chat/completions", json={**body, "messages": messages})
        call = first.json()["choices"][0]["message"]["tool_calls"][0]
        messages += [first.json()["choices"][0]["message"], {"role": "tool", "tool_call_id": call["id"], "content": WEATHER_RESULT}]
        http.post("/chat/completions", json={**body, "messages": messages})
        page = httpx.get(f"{root(server.base_url)}/dashboard/sessions/{first.headers['x-clawrl-session']}", timeout=30)
    assert page.status_code == 200
    assert "get_weather(" in page.text and "Lyon" in page.text  # the call, with its arguments
    assert "next state (tool):" in page.text and '<span class="role">tool</span>' in page.text
    assert WEATHER_ANSWER in page.text
