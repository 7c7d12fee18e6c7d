"""The store on a real PostgreSQL server (`--database-url postgresql+psycopg://...`): serving,
judging, the dashboard and training records, under the concurrency a shared server store sees."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from clawrl.config import EngineConfig, JudgeConfig, ServeConfig
from clawrl.engines import build_engine
from clawrl.judge.worker import build_worker
from clawrl.serve.runner import ServerThread, free_port
from clawrl.store import Store
from clawrl.store.training import PointerMovedError, SamplesTakenError
from tests.helpers import (
    CORRECTION,
    PostgresServer,
    converse,
    healthz,
    judgment,
    ready_sample,
    record,
    run_cli,
    teach,
    user,
    version,
    wait_for_judgment,
    wait_until,
)


def pg_server(model_dir: Path, url: str, judge: JudgeConfig | None = None) -> ServerThread:
    engine_config = EngineConfig(model=str(model_dir), device="cpu", cpu_threads=1)
    engine = build_engine(engine_config)
    store = Store(url)
    worker = build_worker(store, judge, engine, engine_config) if judge is not None else None
    return ServerThread(engine, store, ServeConfig(port=free_port()), worker)


def test_serving_judging_and_the_dashboard_on_postgres(tool_model_dir: Path, postgres_url: str) -> None:
    with pg_server(tool_model_dir, postgres_url, JudgeConfig(judge_poll_s=0.05)) as server:
        session_id, turn_ids = converse(server.base_url, ["Write a note about Friday.", CORRECTION, "thanks, perfect"])
        store = Store(postgres_url)
        first, second = wait_for_judgment(store, turn_ids[0]), wait_for_judgment(store, turn_ids[1])
        root = server.base_url.removesuffix("/v1")
        overview = httpx.get(f"{root}/dashboard/api/overview", timeout=30)
        page = httpx.get(f"{root}/dashboard/sessions/{session_id}", timeout=30)
        metrics = httpx.get(f"{root}/metrics", timeout=30)
    assert first.score == -1 and "without the bold" in first.hint and second.score == 1
    turns = store.turns.session_turns(session_id)
    assert [entry.turn.index for entry in turns] == [0, 1, 2]
    recorded = turns[0].turn
    assert recorded.prompt_token_ids and len(recorded.response_token_ids) == len(recorded.response_logprobs)
    assert turns[0].next_messages and turns[0].next_messages[-1]["content"] == CORRECTION
    assert overview.status_code == 200, overview.text
    assert overview.json()["live_score"] == [{"version": 0, "judged": 2, "mean_score": 0.0, "vote_agreement": 1.0}]
    assert page.status_code == 200 and "without the bold" in page.text
    assert metrics.status_code == 200 and "clawrl_judged_turns_total" in metrics.text


def test_a_number_json_cannot_hold_is_refused_before_postgres_sees_it(tool_model_dir: Path, postgres_url: str) -> None:
    """Python reads `1e400` as inf (and `NaN`, `Infinity` as such); a tool schema holding one was
    stored as is, and PostgreSQL's json column refused the `Infinity` json.dumps writes (a 500)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "default": "NUMBER"}}}
    with pg_server(tool_model_dir, postgres_url) as server:
        model = httpx.get(f"{server.base_url}/models", timeout=30).json()["data"][0]["id"]
        body = json.dumps({"model": model, "messages": [user("hi")], "max_tokens": 2, "tools": [tool]})
        for number in ("1e400", "-1e400", "NaN", "Infinity"):
            response = httpx.post(f"{server.base_url}/chat/completions", content=body.replace('"NUMBER"', number),
                                  headers={"content-type": "application/json"}, timeout=60)  # fmt: skip
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == "invalid_json" and error["type"] == "invalid_request_error" and "not finite" in error["message"]
        session_id, _turns = converse(server.base_url, ["hello"])
    store = Store(postgres_url)
    assert [session.id for session in store.turns.list_sessions(limit=100)] == [session_id], "a refused request was recorded"


def test_concurrent_requests_of_one_new_session_are_all_recorded(tool_model_dir: Path, postgres_url: str) -> None:
    """16 requests at once naming the same, not yet recorded session: every answer is a recorded turn."""
    with pg_server(tool_model_dir, postgres_url) as server:
        model = httpx.get(f"{server.base_url}/models").json()["data"][0]["id"]

        def ask(number: int) -> httpx.Response:
            return httpx.post(f"{server.base_url}/chat/completions", timeout=60, headers={"X-Session-Id": "shared"},
                              json={"model": model, "messages": [user(f"question {number}")], "max_tokens": 4})

        with ThreadPoolExecutor(16) as pool:
            responses = list(pool.map(ask, range(16)))
    assert [response.status_code for response in responses] == [200] * 16, [r.text for r in responses if r.status_code != 200]
    turns = Store(postgres_url).turns.session_turns("shared")
    assert sorted(entry.turn.index for entry in turns) == list(range(16))
    assert {entry.turn.id for entry in turns} == {response.headers["x-clawrl-turn"] for response in responses}


def test_judge_workers_on_separate_handles_never_claim_the_same_turn(postgres_url: str) -> None:
    setup = Store(postgres_url)
    for index in range(40):
        record(setup, f"t{index}", f"s{index}", [user("q")], "a")
        setup.turns.add_feedback(f"t{index}", 1, None)  # judgeable
    stores = [Store(postgres_url) for _ in range(4)]
    barrier = threading.Barrier(len(stores))

    def claim(worker: int) -> list[str]:
        barrier.wait()
        claimed: list[str] = []
        while batch := stores[worker].judging.claim_turns_to_judge(f"w{worker}", limit=3, lease_s=60):
            claimed += batch
        return claimed

    with ThreadPoolExecutor(len(stores)) as pool:
        claims = list(pool.map(claim, range(len(stores))))
    everything = [turn_id for claimed in claims for turn_id in claimed]
    assert sorted(everything) == sorted(f"t{index}" for index in range(40))  # each turn exactly once


def test_a_verdict_is_written_once_when_two_workers_race(postgres_url: str) -> None:
    store = Store(postgres_url)
    record(store, "t0", "s", [user("q")], "a")
    verdicts = [judgment("t0", score) for score in (1, -1)]
    stores = [Store(postgres_url), Store(postgres_url)]
    with ThreadPoolExecutor(2) as pool:
        written = list(pool.map(lambda pair: pair[0].judging.record_judgment(pair[1]), zip(stores, verdicts, strict=True)))
    assert sorted(written) == [False, True]
    assert store.judging.judgment("t0").score == verdicts[written.index(True)].score


def test_training_records_are_exactly_once_on_postgres(postgres_url: str) -> None:
    store = Store(postgres_url)
    for index in range(4):
        record(store, f"t{index}", "s", [user(f"q{index}")], f"a{index}")
        store.judging.record_judgment(judgment(f"t{index}"))
    training = store.training
    training.add_samples([ready_sample(f"t{index}") for index in range(4)])
    training.register_version(version(1, 0), ["t0", "t1"])
    with pytest.raises(SamplesTakenError):
        training.register_version(version(2, 1), ["t1", "t2"])  # t1 is trained already
    training.rollback(0)
    with pytest.raises(PointerMovedError):
        training.register_version(version(2, 1), ["t2"])  # the step started from v1, serving moved to v0
    assert training.serving_version() == 0 and training.newest_version() == 1
    assert training.sample_counts() == {"trained": 2, "ready": 2}


def test_two_processes_opening_a_new_postgres_store_at_once(postgres_url: str) -> None:
    """Serving and the trainer start together on an empty database: both create the schema safely."""
    barrier = threading.Barrier(4)

    def open_store(_: int) -> int:
        barrier.wait()
        return len(Store(postgres_url).turns.list_sessions())

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(open_store, range(4))) == [0, 0, 0, 0]


def test_the_store_survives_a_dropped_connection(postgres_url: str, postgres_server: PostgresServer) -> None:
    import psycopg

    store = Store(postgres_url)
    record(store, "t0", "s", [user("q")], "a")
    database = postgres_url.rsplit("/", 1)[1]
    with psycopg.connect(f"host=127.0.0.1 port={postgres_server.port} user=clawrl dbname=postgres", autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                      (database,))
    assert store.turns.turn("t0") is not None  # pool_pre_ping replaces the dead connection


def test_clawrl_serve_and_its_trainer_share_a_postgres_store(tiny_model_dir: Path, tmp_path: Path, postgres_url: str) -> None:
    port, base = free_port(), ""
    command = [
        sys.executable, "-m", "clawrl.cli", "serve", "--model", str(tiny_model_dir), "--device", "cpu", "--cpu-threads", "1",
        "--run-dir", str(tmp_path / "run"), "--database-url", postgres_url, "--port", str(port), "--served-model-name", "m",
        "--judge-poll-s", "0.05", "--policy-poll-s", "0.1", "--method", "combine", "--batch-size", "3", "--lr", "0.01",
        "--train-poll-s", "0.1",
    ]  # fmt: skip
    serve = subprocess.Popen(command)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthz(base), 120, "clawrl serve")
        teach(base + "/v1", sessions=2)
        wait_until(lambda: healthz(base)["policy_version"] == 2, 120, "v2 served")
        listed = run_cli("versions", "list", "--database-url", postgres_url, "--json")
        run_cli("versions", "rollback", "v1", "--database-url", postgres_url, parse=False)
        wait_until(lambda: healthz(base)["policy_version"] == 1, 30, "v1 served again")
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
    assert [(item["version"], item["parent"], item["metrics"]["num_samples"]) for item in listed] == [(1, 0, 3), (2, 1, 3)]
    assert not (tmp_path / "run" / "clawrl.db").exists()  # everything went to PostgreSQL
    assert Store(postgres_url).training.sample_counts() == {"trained": 6}


def test_a_nul_in_sampled_text_or_a_message_is_recorded_not_refused(postgres_url: str) -> None:
    # PostgreSQL refuses NUL in text; an untrained model samples one now and then (SQLite keeps it)
    store = Store(postgres_url)
    record(store, "nul", "s-nul", [user("a\x00b")], "answer\x00text")
    recorded = store.turns.turn("nul")
    assert recorded is not None and recorded.response_text == "answer\ufffdtext"
    assert recorded.response_token_ids == [3]  # the ids, what trains, are kept as they were


def test_users_and_their_sessions_on_postgres(postgres_url: str) -> None:
    """Users' keys and whose sessions are whose, on a server store: a duplicate name refused by the
    table's key, a rotated key found and the old one not, sessions listed per user."""
    from clawrl.store.users import UserError, key_sha256

    store = Store(postgres_url)
    _user, key = store.users.add("pg-alice")
    with pytest.raises(UserError):
        store.users.add("pg-alice")
    new_key = store.users.rotate_key("pg-alice")
    owners = store.users.key_owners()
    assert owners[key_sha256(new_key)].id == "pg-alice" and key_sha256(key) not in owners
    record(store, "pg-t1", "pg-alice/work", [user("q")], "a", user_id="pg-alice")
    assert [session.id for session in store.turns.list_sessions(user_id="pg-alice")] == ["pg-alice/work"]
    assert store.turns.turns_with_answer([store.turns.turn("pg-t1").answer_fingerprint], "someone-else") == []
    store.users.remove("pg-alice")
    assert key_sha256(new_key) not in store.users.key_owners()
