"""`--placement ray --judge-actors K`: the judge workers in Ray actors (issue 34, item 1).

A real `clawrl serve --placement ray --judge-actors 2` on the tiny model joins a local Ray cluster
(one for the module: a start costs seconds) through RAY_ADDRESS; the turns of sessions driven
through it with the openai client are judged by the actors (each verdict names the actor that wrote
it, never the server), each once. A turn leased to an actor that is then killed is judged by
another long before its lease would have run out, and the killed actor is started again as a new
one. A judge no node can hold, or one that needs the served model, is refused before anything
loads; an actor that finds no store where the server's should be fails instead of judging a new
empty one; and the embedded default `clawrl serve` goes through its whole start without importing
Ray.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from openai import OpenAI

from clawrl.cli.ray_judges import JudgeActor
from clawrl.config import EngineConfig, JudgeConfig, JudgeSettings, StoreConfig
from clawrl.serve.runner import free_port
from clawrl.store import Store
from tests.helpers import CORRECTION, healthz, wait_until


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A local cluster of two CPUs: the server's replica and its two judge actors take 0.5 each."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def judge_actors() -> dict[str, Any]:
    """The judge actors alive on the cluster, by name (their worker ids), as handles."""
    return {actor["name"]: ray.get_actor(actor["name"], namespace=actor["namespace"])
            for actor in ray.util.list_named_actors(all_namespaces=True) if actor["name"].startswith("clawrl-judge-")}  # fmt: skip


def judges(base: str) -> dict[str, Any]:
    return (healthz(base) or {}).get("judges") or {}


def judgments(run_dir: Path) -> list[tuple[str, str | None]]:
    """Every verdict in the run's store, as (turn id, worker id)."""
    with sqlite3.connect(run_dir / "clawrl.db") as db:
        return db.execute("SELECT turn_id, worker_id FROM judgments ORDER BY turn_id").fetchall()


def converse(client: OpenAI, session: str, lines: list[str]) -> None:
    """One session: each line after the first is the next state of the turn before it."""
    messages: list[dict[str, str]] = []
    for line in lines:
        messages.append({"role": "user", "content": line})
        answer = client.chat.completions.create(model="m", messages=messages, max_tokens=4,  # type: ignore[arg-type]
                                                extra_headers={"X-Session-Id": session})  # fmt: skip
        messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})


def serve_command(tiny_model_dir: Path, run_dir: Path, port: int, *flags: str) -> list[str]:
    return [sys.executable, "-m", "clawrl.cli", "serve", "--model", str(tiny_model_dir), "--device", "cpu",
            "--cpu-threads", "1", "--run-dir", str(run_dir), "--port", str(port), "--served-model-name", "m", *flags]  # fmt: skip


def test_judge_actors_judge_every_turn_once_and_a_killed_one_is_replaced(
    ray_address: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    port, run_dir = free_port(), tmp_path / "run"
    # idle actors look for turns once a second, so that this test can lease a fresh turn itself (as
    # the actor it will kill) before they do; the lease (300 s) outlasts the test unless given back
    flags = ["--placement", "ray", "--replica-cpus", "0.5", "--judge-actors", "2", "--judge-cpus", "0.5",
             "--judge-poll-s", "1", "--judge-lease-s", "300"]  # fmt: skip
    serve = subprocess.Popen(serve_command(tiny_model_dir, run_dir, port, *flags), env={**os.environ, "RAY_ADDRESS": ray_address})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthz(base), 120, "clawrl serve")
        first = wait_until(lambda: judges(base).get("alive") == 2 and judges(base), 120, "two judge actors alive")
        names = {worker["worker_id"] for worker in first["workers"]}
        assert first["actors"] == 2 and first["restarts"] == 0 and len(names) == 2
        assert all(worker["actor"] and worker["node"] and worker["pid"] != serve.pid for worker in first["workers"])
        assert set(judge_actors()) == names
        metrics = httpx.get(base + "/metrics", timeout=30).text
        assert "clawrl_judge_actors_alive 2.0" in metrics and "clawrl_judge_actor_restarts_total 0.0" in metrics

        client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
        for index in range(3):  # two judgeable turns each (the last one has no next state yet)
            converse(client, f"before-{index}", [f"Write a note about Friday ({index}).", CORRECTION, "thanks, perfect"])
        wait_until(lambda: len(judgments(run_dir)) == 6, 120, "six turns judged")
        assert {worker for _, worker in judgments(run_dir)} <= names  # the actors judged them, not the server

        # a turn leased to the actor about to be killed, as if it were judging it when it died
        victim = sorted(names)[0]
        store = Store.for_run_dir(run_dir)
        leased: list[str] = []
        for attempt in range(10):
            converse(client, f"leased-{attempt}", ["Tell me about the tides.", "and the boats?"])
            if leased := store.judging.claim_turns_to_judge(victim, 1, 300.0):
                break
        assert leased, "an actor took every fresh turn before the test could lease one"
        ray.kill(judge_actors()[victim], no_restart=True)
        second = wait_until(lambda: judges(base).get("restarts") == 1 and judges(base).get("alive") == 2 and judges(base),
                            60, "the killed judge actor started again")  # fmt: skip
        now = {worker["worker_id"] for worker in second["workers"]}
        assert victim not in now and len(now - names) == 1 and set(judge_actors()) == now
        assert "clawrl_judge_actor_restarts_total 1.0" in httpx.get(base + "/metrics", timeout=30).text
        for index in range(2):  # judged by the survivor and the new actor
            converse(client, f"after-{index}", [f"Summarise the meeting ({index}).", "too long, shorter please", "ok"])
        expected = 6 + (attempt + 1) + 2 * 2  # each leased-* session has one judgeable turn
        wait_until(lambda: len(judgments(run_dir)) == expected, 120, "the turns after the kill judged")
        judged = dict(judgments(run_dir))
        # the turn leased to the dead actor was given back, not left for its lease to run out
        assert judged[leased[0]] in (names | now) - {victim}
        assert all(worker in names | now for worker in judged.values())
        assert store.judging.judge_backlog()[0] == 0
        rows = judgments(run_dir)
        assert len(rows) == len({turn for turn, _ in rows})  # no turn judged twice
        store.close()
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
    assert serve.returncode == 0
    wait_until(lambda: not judge_actors(), 30, "the judge actors gone with the server")


def test_a_judge_no_node_can_hold_or_that_needs_the_served_model_is_refused_before_anything_loads(
    ray_address: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    environment = {**os.environ, "RAY_ADDRESS": ray_address}
    cases = [
        (["--placement", "ray", "--judge-actors", "1", "--judge-cpus", "3"],
         "error: --judge-cpus 3 --judge-gpus 0: no node of the Ray cluster has that much for a judge actor "
         "(its nodes: 2 CPUs, 0 GPUs); ask for less"),
        (["--placement", "ray", "--judge-actors", "1", "--judge", "engine"],
         "error: --judge engine judges with the served model, which no judge actor holds; give the actors a model"),
        (["--judge-actors", "1"], "--judge-actors 1 places judges on a Ray cluster: add --placement ray"),
    ]  # fmt: skip
    for flags, message in cases:
        command = serve_command(tiny_model_dir, tmp_path / "run", free_port(), *flags)
        result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)
        assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_the_embedded_default_serves_with_its_judge_in_process_and_imports_no_ray(tiny_model_dir: Path,
                                                                                   tmp_path: Path) -> None:
    """`clawrl serve` goes through its whole start (engine, judge, app) up to the HTTP server, which
    is replaced by a no-op here: Ray is never imported."""
    script = ("import runpy, sys, uvicorn\nuvicorn.run = lambda *args, **kwargs: None\n"
              "sys.argv = ['clawrl', *sys.argv[1:]]\ntry: runpy.run_module('clawrl.cli', run_name='__main__')\n"
              "except SystemExit as end: assert end.code in (0, None), end\nassert 'ray' not in sys.modules, 'ray was imported'")  # fmt: skip
    command = [sys.executable, "-c", script, *serve_command(tiny_model_dir, tmp_path / "run", free_port())[3:]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "judge: rule" in result.stderr and "serving " in result.stderr, result.stderr  # started in full


def test_an_actor_on_a_node_without_the_servers_store_fails_saying_so_rather_than_judge_an_empty_one(
    tmp_path: Path,
) -> None:
    """What a judge actor does first on a node that does not see the run directory (run here as a
    plain object: no Ray needed): it opens no new store there, and its error names what is missing."""
    settings = JudgeSettings(store=StoreConfig(run_dir=tmp_path / "elsewhere"), judge=JudgeConfig(judge="rule"))
    with pytest.raises(RuntimeError, match="judge actor clawrl-judge-1-0-0: .*--run-dir"):
        JudgeActor(settings, EngineConfig(), None, "directives", "clawrl-judge-1-0-0", None)
    assert not (tmp_path / "elsewhere" / "clawrl.db").exists()
