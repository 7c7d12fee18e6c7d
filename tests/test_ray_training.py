"""`--placement ray`: the trainer and its data-parallel worker in Ray actors.

A trainer in this process with `--train-workers 2` on Ray (rank 1 a Ray actor, joined at this
node's address) publishes the version one trainer publishes, and outlives its rank actor killed in
the middle of a step: a new actor, the step redone, every sample trained once. A real `clawrl serve --placement ray --replicas 2 --train-workers 2 --method combine` on the tiny
model joins a local Ray cluster (one for the module: a start costs seconds) through RAY_ADDRESS;
sessions driven through it with the openai client are judged and trained on, the published
version is served by both replica actors, a replica actor killed under load fails no request
started after it was taken out and loses no answered turn, and a trainer actor that is killed is started again as a
new actor, with new ranks, and trains on from the published version.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
import torch
from openai import OpenAI
from safetensors.torch import load_file

from clawrl.config import EngineConfig, TrainConfig
from clawrl.serve.runner import free_port
from clawrl.store import Store
from clawrl.train.policy import ADAPTER_WEIGHTS, TrainedPolicy
from clawrl.train.ray_workers import RayWorkerGroup
from clawrl.train.trainer import Trainer
from clawrl.trainer_process import TrainerProcess
from tests.helpers import CORRECTION, healthz, wait_until
from tests.test_train_data_parallel import judged_sessions


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A local cluster of two CPUs: the server's two replicas, the trainer and its worker take 0.5 each."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def clawrl_actors() -> list[str]:
    """The names of the clawrl actors alive on the cluster (the trainer's and its ranks' are named)."""
    return sorted(actor["name"] for actor in ray.util.list_named_actors(all_namespaces=True)
                  if actor["name"].startswith("clawrl-"))  # fmt: skip


def test_ranks_as_ray_actors_take_one_trainers_step_and_outlive_a_killed_rank(
    ray_address: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone_dir, together_dir = tmp_path / "alone", tmp_path / "together"
    taught = judged_sessions(alone_dir, tiny_model_dir)  # six samples: two steps of three
    shutil.copytree(alone_dir, together_dir)
    options = {"method": "combine", "batch_size": 3, "lr": 1e-2, "train_poll_s": 0.1, "micro_batch_size": 1}
    local = EngineConfig(model=str(tiny_model_dir), device="cpu", cpu_threads=1)
    alone = Trainer(TrainConfig(**options), local, Store.for_run_dir(alone_dir), alone_dir)
    alone.start()
    assert alone.run(max_steps=1) == 1
    alone.close()
    store = Store.for_run_dir(together_dir)
    config = TrainConfig(**options, train_workers=2, trainer_cpus=0.5)
    together = Trainer(config, local.model_copy(update={"placement": "ray"}), store, together_dir)
    workers = together.workers
    assert isinstance(workers, RayWorkerGroup)
    together.start()
    try:
        first = workers.names
        assert len(first) == 1 and first[0] in clawrl_actors() and not workers.processes  # an actor, no process
        assert together.run(max_steps=1) == 1
        one, two = (load_file(run / "policy/shared/v1" / ADAPTER_WEIGHTS) for run in (alone_dir, together_dir))
        assert one.keys() == two.keys()
        for name in one:  # float32: the same step up to the order of the sums
            torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-6)
        real_update = TrainedPolicy.update

        def killing_update(policy: TrainedPolicy, *args: Any) -> Any:
            """Rank 0's next update, after its rank actor was killed mid-step (it had the batch already)."""
            monkeypatch.setattr(TrainedPolicy, "update", real_update)
            ray.kill(workers.actors[0])
            return real_update(policy, *args)

        monkeypatch.setattr(TrainedPolicy, "update", killing_update)
        assert together.run(max_steps=1) == 1  # the lost step thrown away, the group started again, the step redone
        assert workers.failures == 0 and workers.names != first and workers.names[0] in clawrl_actors()
        wait_until(lambda: first[0] not in clawrl_actors(), 30, "the killed rank gone")
    finally:
        together.close()
    wait_until(lambda: not [name for name in clawrl_actors() if name.startswith("clawrl-train-rank")], 30,
               "no rank actor left once the trainer closed")  # fmt: skip
    assert [(row.version, row.parent) for row in store.training.versions()] == [(1, 0), (2, 1)]
    trained = [sample for number in (1, 2) for sample in
               json.loads((together_dir / f"policy/shared/v{number}/manifest.json").read_text())["sample_ids"]]  # fmt: skip
    assert sorted(trained) == sorted(taught)  # every sample exactly once


def teach(client: OpenAI, base: str, index: int) -> None:
    """One session of three turns and a 👍 (three samples: one step at --batch-size 3)."""
    session = f"ray-teach-{index}"
    messages: list[dict[str, str]] = []
    for line in [f"Write a short note to my team about Friday ({index}).", CORRECTION, "thanks, perfect"]:
        messages.append({"role": "user", "content": line})
        answer = client.chat.completions.create(model="m", messages=messages, max_tokens=8,  # type: ignore[arg-type]
                                                extra_headers={"X-Session-Id": session})  # fmt: skip
        messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    feedback = httpx.post(f"{base}/v1/feedback", json={"session_id": session, "score": 1}, timeout=30)
    assert feedback.status_code == 200, feedback.text


def replica_requests(base: str) -> dict[str, float]:
    """Requests started on each replica, from /metrics."""
    text = httpx.get(base + "/metrics", timeout=30).text
    return {match[1]: float(match[2]) for match in re.finditer(r'clawrl_replica_requests_total\{replica="(\d+)"\} (\S+)', text)}


def trainer(base: str) -> dict[str, object]:
    return (healthz(base) or {}).get("trainer") or {}


def test_serve_on_ray_trains_in_actors_and_serves_each_version_on_both_replicas(
    ray_address: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    port, run_dir = free_port(), tmp_path / "run"
    command = [
        sys.executable, "-m", "clawrl.cli", "serve", "--model", str(tiny_model_dir), "--device", "cpu", "--cpu-threads", "1",
        "--run-dir", str(run_dir), "--port", str(port), "--served-model-name", "m", "--judge-poll-s", "0.05",
        "--policy-poll-s", "0.1", "--method", "combine", "--batch-size", "3", "--lr", "0.01", "--train-poll-s", "0.1",
        "--placement", "ray", "--replicas", "2", "--replica-cpus", "0.5", "--train-workers", "2", "--trainer-cpus", "0.5",
    ]  # fmt: skip
    serve = subprocess.Popen(command, env={**os.environ, "RAY_ADDRESS": ray_address})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthz(base), 120, "clawrl serve")
        # the trainer is a Ray actor (no child process of the server), and its rank 1 another
        first = wait_until(lambda: trainer(base).get("pid") and trainer(base), 60, "the trainer actor started")
        assert first["running"] and first["restarts"] == 0 and first["actor"] and first["node"]
        assert b"ray::TrainerActor" in Path(f"/proc/{first['pid']}/cmdline").read_bytes()
        assert not any(b"clawrl.cli\0train" in Path(f"/proc/{child}/cmdline").read_bytes() for child in _children(serve.pid))
        ranks = wait_until(lambda: [name for name in clawrl_actors() if name.startswith("clawrl-train-rank1-")], 60, "rank 1")
        assert len(ranks) == 1 and len([name for name in clawrl_actors() if name.startswith("clawrl-trainer-")]) == 1

        client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
        teach(client, base, 0)
        wait_until(lambda: healthz(base)["policy_version"] == 1, 120, "v1 published and served on every replica")
        # every answer after it is v1's, from both replicas (new conversations go to the one that
        # has started fewer: the taught session stayed on one, so the other takes the first ones)
        before = replica_requests(base)
        versions = [client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": f"{index}: tell me about the tides"}], max_tokens=4
        ).headers["x-clawrl-policy-version"] for index in range(6)]  # fmt: skip
        after = replica_requests(base)
        assert versions == ["1"] * 6
        started = {replica: after[replica] - before.get(replica, 0) for replica in after}
        assert sorted(started) == ["0", "1"] and all(count >= 1 for count in started.values()) and sum(started.values()) == 6

        # one replica actor killed under load: a request under way on it may fail; none started
        # after it was taken out does, and every answered request is a recorded turn
        replica_pids = wait_until(lambda: len(pids := _processes(b"ray::EngineActor")) == 2 and pids, 30, "two replica actors")
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            under_load = [pool.submit(ask, client, 100 + index) for index in range(6)]
            os.kill(replica_pids[0], signal.SIGKILL)
            during = [future.result() for future in under_load]
        # (a request that reaches the dead actor takes it out; these make sure one does)
        wait_until(lambda: during.append(ask(client, 150 + len(during))) or _replicas_in_rotation(base) == 1, 60,
                   "the dead replica taken out")  # fmt: skip
        after = [ask(client, 200 + index) for index in range(6)]
        assert [status for status, _ in after] == [200] * 6
        answered = [turn_id for status, turn_id in during + after if status == 200]
        recorded = Store.for_run_dir(run_dir)
        assert len(answered) >= 6 and all(recorded.judging.turn_context(turn_id) is not None for turn_id in answered)

        # the trainer actor killed: a new actor, with a new rank 1, trains on from v1
        os.kill(first["pid"], signal.SIGKILL)
        second = wait_until(lambda: trainer(base).get("restarts") == 1 and trainer(base).get("pid") and trainer(base),
                            60, "the trainer actor started again")  # fmt: skip
        assert second["running"] and second["actor"] != first["actor"] and second["pid"] != first["pid"]
        wait_until(lambda: ranks[0] not in clawrl_actors(), 30, "rank 1 gone with the trainer that owned it")
        wait_until(lambda: [name for name in clawrl_actors() if name.startswith("clawrl-train-rank1-")], 60, "a new rank 1")
        assert "clawrl_trainer_restarts_total 1.0" in httpx.get(base + "/metrics", timeout=30).text
        teach(client, base, 1)
        wait_until(lambda: healthz(base)["policy_version"] == 2, 120, "v2 served on every replica")
        store = Store.for_run_dir(run_dir)
        assert store.training.version(2).parent == 1
        assert [client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": f"{index}: and the boats?"}], max_tokens=4
        ).headers["x-clawrl-policy-version"] for index in range(2)] == ["2", "2"]  # fmt: skip
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
    assert serve.returncode == 0
    # the trainer and its rank end with the server (stopped, then killed: nothing of theirs is left on the cluster)
    wait_until(lambda: not clawrl_actors(), 30, "the clawrl actors gone")


def ask(client: OpenAI, index: int) -> tuple[int, str | None]:
    """One request of a new conversation: (HTTP status, the turn id the server recorded it as)."""
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": f"{index}: tell me about the harbour and its boats"}],
            max_tokens=16, temperature=1.0,
        )
    except Exception as error:  # noqa: BLE001 - a failed request is a result here
        return getattr(error, "status_code", 599), None
    return raw.http_response.status_code, raw.headers["x-clawrl-turn"]


def _replicas_in_rotation(base: str) -> int:
    text = httpx.get(base + "/metrics", timeout=30).text
    return len(re.findall(r'clawrl_replica_in_rotation\{replica="\d+"\} 1\.0', text))


def _processes(title: bytes) -> list[int]:
    """Pids of this machine's processes whose command line starts with `title` (a Ray actor's process title)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(title):
                found.append(int(entry.name))
        except OSError:
            continue  # ended while looked at
    return sorted(found)


def _children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir() for child in (task / "children").read_text().split()]


def test_a_trainer_no_node_can_hold_is_refused_before_anything_loads(ray_address: str, tiny_model_dir: Path,
                                                                     tmp_path: Path) -> None:
    command = [sys.executable, "-m", "clawrl.cli", "serve", "--model", str(tiny_model_dir), "--device", "cpu",
               "--run-dir", str(tmp_path / "run"), "--port", str(free_port()), "--method", "combine",
               "--placement", "ray", "--trainer-gpus", "1"]  # fmt: skip
    result = subprocess.run(command, env={**os.environ, "RAY_ADDRESS": ray_address}, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 1
    assert "error: --trainer-cpus 1 --trainer-gpus 1: no node of the Ray cluster has that much" in result.stderr
    assert "(its nodes: 2 CPUs, 0 GPUs); ask for less" in result.stderr


def test_a_trainer_that_cannot_be_started_again_counts_as_a_quick_failure() -> None:
    """A restart that fails to start anything (a Ray actor when the cluster is gone) is backed off
    and given up on like a trainer that dies at once; the supervisor does not stop watching."""
    starts: list[int] = []

    def start_trainer() -> subprocess.Popen[bytes]:
        starts.append(len(starts))
        if len(starts) > 1:
            raise ConnectionError("the Ray cluster is gone")
        return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])

    trainer = TrainerProcess(max_quick_failures=2, start_trainer=start_trainer).start()
    try:
        wait_until(lambda: trainer.given_up, 30, "the supervisor to give up", every=0.1)
        # one start and two tries (max_quick_failures=2), none of which started anything
        assert len(starts) == 3 and trainer.restarts == 0 and not trainer.running() and trainer.process.returncode == 3
    finally:
        trainer.stop()
