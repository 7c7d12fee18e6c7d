"""Train and swap end to end on the tiny model: a real server, the rule judge, and the trainer as a
separate OS process, as `clawrl serve --method ...` runs them.

Conversations with corrections and 👍 feedback become samples; the trainer publishes versions;
serving swaps them in while 16 clients keep sending requests (none may fail); the trainer is
SIGKILLed mid-step and started again by its supervisor without training any sample twice; a
rollback makes serving answer with the old version again, and the trainer continues from it. Full fine-tuning (with the
top-K OPD term and the KL to a frozen copy) and the policy-as-teacher option publish versions the
engine loads and serves exactly as trained.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.config import EngineConfig, JudgeConfig, StoreConfig, TrainConfig
from clawrl.engines.hf import HFEngine
from clawrl.model.scoring import score_response
from clawrl.serve.runner import free_port
from clawrl.store import Store
from clawrl.trainer_process import TrainerProcess
from clawrl.train.trainer import Trainer
from tests.helpers import HINT, Conversation, LoadClients, healthz, run_cli, start_server, teach, wait_until

FIXED_PROMPT = [{"role": "user", "content": "Write a short note to my team about Friday."}]


def trainer_configs(model_dir: Path, run_dir: Path, **train: Any) -> tuple[EngineConfig, StoreConfig, TrainConfig]:
    options = {"method": "combine", "batch_size": 3, "lr": 1e-2, "train_poll_s": 0.1} | train
    return EngineConfig(model=str(model_dir), device="cpu", cpu_threads=1), StoreConfig(run_dir=run_dir), TrainConfig(**options)


def fixed_answer(http: httpx.Client) -> tuple[int, list[float], str]:
    """Greedy answer to the fixed prompt (a side turn: never trained on): version, log-probs, turn id."""
    body = {"model": "m", "messages": FIXED_PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": True, "turn_type": "side"}
    response = http.post("/chat/completions", json=body)
    assert response.status_code == 200, response.text
    turn_id = response.headers["x-clawrl-turn"]
    logprobs = [entry["logprob"] for entry in response.json()["choices"][0]["logprobs"]["content"]]
    return int(response.headers["x-clawrl-policy-version"]), logprobs, turn_id


def adapter_logprobs(model_dir: Path, version_path: Path, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
    """What a version's adapter gives the response, computed here from its files alone."""
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(version_path)).eval()
    return score_response(model, prompt_ids, response_ids, 0).logprobs


def test_feedback_trains_new_versions_that_serving_swaps_in_under_load(tiny_model_dir: Path, run_dir: Path) -> None:
    judge = JudgeConfig(judge_poll_s=0.05)
    with start_server(tiny_model_dir, run_dir, judge=judge, policy_poll_s=0.1, served_model_name="m") as server, httpx.Client(
        base_url=server.base_url, timeout=60
    ) as http:
        store = Store.for_run_dir(run_dir)
        training = store.training
        version_0, logprobs_0, _ = fixed_answer(http)
        assert version_0 == 0
        with TrainerProcess(*trainer_configs(tiny_model_dir, run_dir)), LoadClients(server.base_url) as load:
            taught = teach(server.base_url, sessions=3)
            wait_until(lambda: training.newest_version() >= 3, 120, "three published versions")
            wait_until(lambda: http.get(server.base_url.removesuffix("/v1") + "/healthz").json()["policy_version"] == 3, 30, "v3 served")
            time.sleep(0.5)  # some load requests on the newest version too
        assert load.failures == [] and len(load.versions) > 50
        assert {0, 3} <= set(load.versions)  # the load went on across the swaps
        version_3, logprobs_3, turn_id = fixed_answer(http)
        metrics = http.get(server.base_url.removesuffix("/v1") + "/metrics").text

    assert version_3 == 3 and store.turns.turn(turn_id).policy_version == 3
    assert not torch.allclose(torch.tensor(logprobs_3[:3]), torch.tensor(logprobs_0[:3]), atol=1e-3)
    samples = [training.sample(turn_id) for turn_id in taught]
    assert [sample.status for sample in samples] == ["trained"] * 9
    assert sorted(sample.trained_version for sample in samples) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert {sample.kind for sample in samples} == {"combined", "rl"}
    versions = training.versions()
    assert [(row.version, row.parent, row.step) for row in versions] == [(1, 0, 1), (2, 1, 2), (3, 2, 3)]
    manifest = json.loads((run_dir / "policy" / "shared" / "v3" / "manifest.json").read_text())
    assert manifest["sample_ids"] == [turn_id for turn_id in taught if training.sample(turn_id).trained_version == 3]
    assert "clawrl_train_versions_total 3.0" in metrics and 'clawrl_train_samples{status="trained"} 9.0' in metrics
    assert "clawrl_policy_swaps_total" in metrics and "clawrl_train_logprob_drift" in metrics


def test_trainer_killed_mid_step_resumes_and_never_trains_a_sample_twice(tiny_model_dir: Path, run_dir: Path) -> None:
    with start_server(tiny_model_dir, run_dir, judge=JudgeConfig(judge_poll_s=0.05), policy_poll_s=0.1, served_model_name="m") as server:
        taught = teach(server.base_url, sessions=3)  # nine samples: three steps of three
        store = Store.for_run_dir(run_dir)
        training = store.training
        wait_until(lambda: all(store.judging.judgment(turn_id) for turn_id in taught), 30, "judgments")
        trainer = TrainerProcess(*trainer_configs(tiny_model_dir, run_dir, micro_batch_size=1)).start()
        try:
            wait_until(lambda: training.newest_version() >= 1, 120, "v1", every=0.005)
            killed = trainer.process
            os.kill(killed.pid, signal.SIGKILL)  # it went straight on to the next step
            assert killed.wait(10) == -signal.SIGKILL
            killed_at = training.newest_version()
            wait_until(lambda: trainer.restarts == 1 and trainer.running(), 30, "the trainer started again")
            wait_until(lambda: training.newest_version() >= 3, 120, "v3 after the restart")
            wait_until(lambda: server.app.state.service.engine.policy_version == 3, 30, "v3 served")
        finally:
            trainer.stop()
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            served, _, turn_id = fixed_answer(http)

    assert killed_at < 3 and served == 3 and store.turns.turn(turn_id).policy_version == 3
    assert [(row.version, row.parent) for row in training.versions()] == [(1, 0), (2, 1), (3, 2)]
    trained: list[str] = []
    for number in (1, 2, 3):
        trained += json.loads((run_dir / "policy" / "shared" / f"v{number}" / "manifest.json").read_text())["sample_ids"]
    assert sorted(trained) == sorted(taught)  # every sample exactly once
    assert all(training.sample(turn_id).status == "trained" for turn_id in taught)
    assert sorted(path.name for path in (run_dir / "policy" / "shared").iterdir()) == ["v1", "v2", "v3"]


def test_a_trainer_that_keeps_dying_at_start_is_given_up_on(tmp_path: Path) -> None:
    configs = trainer_configs(tmp_path / "no-such-model", tmp_path / "run")
    trainer = TrainerProcess(*configs, max_quick_failures=1).start()
    try:
        wait_until(lambda: trainer.given_up, 120, "the supervisor to give up", every=0.1)
        assert trainer.restarts == 1 and not trainer.running() and trainer.process.returncode != 0
    finally:
        trainer.stop()


def test_a_restarted_trainer_continues_exactly_where_it_stopped(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two steps with a restart in between give the very weights and optimizer state of two steps in one run."""
    interrupted, straight = tmp_path / "interrupted", tmp_path / "straight"
    with start_server(tiny_model_dir, interrupted, judge=JudgeConfig(judge_poll_s=0.05), served_model_name="m") as server:
        taught = teach(server.base_url, sessions=2)
        store = Store.for_run_dir(interrupted)
        wait_until(lambda: all(store.judging.judgment(turn_id) for turn_id in taught), 30, "judgments")
    store.close()
    shutil.copytree(interrupted, straight)
    torch.set_num_threads(1)

    def trainer(run_dir: Path) -> Trainer:
        engine, _, train = trainer_configs(tiny_model_dir, run_dir)
        made = Trainer(train, engine, Store.for_run_dir(run_dir), run_dir)
        made.start()
        return made

    assert trainer(interrupted).run(max_steps=1) == 1
    assert trainer(interrupted).run(max_steps=1) == 1  # a new process's worth of state, from v1
    assert trainer(straight).run(max_steps=2) == 2
    for name in ("adapter_model.safetensors",):
        left, right = load_file(interrupted / "policy/shared/v2" / name), load_file(straight / "policy/shared/v2" / name)
        assert left.keys() == right.keys() and all(torch.equal(left[key], right[key]) for key in left)
    left_state = torch.load(interrupted / "policy/shared/v2/trainer_state.pt", weights_only=True)["optimizer"]["state"]
    right_state = torch.load(straight / "policy/shared/v2/trainer_state.pt", weights_only=True)["optimizer"]["state"]
    assert all(torch.equal(left_state[i]["exp_avg_sq"], right_state[i]["exp_avg_sq"]) for i in left_state)


def test_clawrl_serve_with_a_method_trains_in_a_child_process_and_rolls_back(tiny_model_dir: Path, run_dir: Path) -> None:
    port = free_port()
    command = [
        sys.executable, "-m", "clawrl.cli", "serve", "--model", str(tiny_model_dir), "--device", "cpu", "--cpu-threads", "1",
        "--run-dir", str(run_dir), "--port", str(port), "--served-model-name", "m", "--judge-poll-s", "0.05", "--policy-poll-s", "0.1",
        "--method", "combine", "--batch-size", "3", "--lr", "0.01", "--train-poll-s", "0.1", "--report-to", "tensorboard,trackio,wandb,mlflow",
    ]  # fmt: skip
    # every tracker writes into this test's folders: trackio's store, W&B offline (no key here)
    trackers_env = {**os.environ, "TRACKIO_DIR": str(run_dir / "trackio"), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    serve = subprocess.Popen(command, env=trackers_env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthz(base), 120, "clawrl serve")
        trainer_pids = _children(serve.pid)
        assert len(trainer_pids) == 1  # the trainer is its own process, not a thread of the server
        assert healthz(base)["trainer"] == {"running": True, "pid": trainer_pids[0], "restarts": 0, "given_up": False}
        os.kill(trainer_pids[0], signal.SIGKILL)  # serve starts it again
        wait_until(lambda: (healthz(base)["trainer"]["restarts"], healthz(base)["trainer"]["running"]) == (1, True),
                   30, "the trainer started again")
        trainer_pids = _children(serve.pid)
        assert len(trainer_pids) == 1 and healthz(base)["trainer"]["pid"] == trainer_pids[0]
        scraped = httpx.get(base + "/metrics").text
        assert "clawrl_trainer_running 1.0" in scraped and "clawrl_trainer_restarts_total 1.0" in scraped
        taught = teach(base + "/v1", sessions=2)
        wait_until(lambda: healthz(base) and healthz(base)["policy_version"] == 2, 120, "v2 served")
        listed = run_cli("versions", "list", "--run-dir", str(run_dir), "--json")
        assert [(item["version"], item["parent"]) for item in listed] == [(1, 0), (2, 1)]
        assert set(listed[0]) >= {"version", "created_at", "parent", "metrics"} and listed[1]["metrics"]["num_samples"] == 3
        with httpx.Client(base_url=base + "/v1", timeout=60) as http:
            version_2, logprobs_2, turn_id = fixed_answer(http)
            store = Store.for_run_dir(run_dir)
            prompt, response = store.turns.turn(turn_id).prompt_token_ids, store.turns.turn(turn_id).response_token_ids
            run_cli("versions", "rollback", "v1", "--run-dir", str(run_dir), parse=False)
            wait_until(lambda: healthz(base)["policy_version"] == 1, 30, "v1 served again")
            version_1, logprobs_1, turn_id_1 = fixed_answer(http)
        assert (version_2, version_1) == (2, 1) and store.turns.turn(turn_id_1).policy_version == 1
        expected = adapter_logprobs(tiny_model_dir, run_dir / "policy" / "shared" / "v1", prompt, store.turns.turn(turn_id_1).response_token_ids)
        torch.testing.assert_close(torch.tensor(logprobs_1), torch.tensor(expected), rtol=0, atol=1e-4)
        assert response  # the v2 answer was recorded with its token ids
        # The trainer continues from v1: the next version's parent is v1.
        teach(base + "/v1", sessions=1)
        wait_until(lambda: healthz(base)["policy_version"] == 3, 120, "v3 served")
        assert store.training.version(3).parent == 1
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
    assert all(not Path(f"/proc/{pid}").exists() or _zombie(pid) for pid in trainer_pids)  # stopped with the server
    # the trainer closed its trackers when it stopped: each library reads back every published version
    for tracker, logged in logged_versions(run_dir).items():
        assert logged == {1: 1, 2: 2, 3: 3}, tracker  # the version at its own number (v3's parent is v1: rollback)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    live = [metric for run in client.search_runs([client.get_experiment_by_name("clawrl").experiment_id])
            for metric in client.get_metric_history(run.info.run_id, "judge/live_score")]  # fmt: skip
    # the judge's live score of each step's starting version: v0's turns were all judged (taught sessions)
    assert live and all(-1 <= metric.value <= 1 for metric in live)


def logged_versions(run_dir: Path) -> dict[str, dict[int, float]]:
    """`train/version` as each tracker's own reader finds it: {step: value}."""
    os.environ["TRACKIO_DIR"] = str(run_dir / "trackio")  # read when trackio is imported: the trainer's store
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from trackio import SQLiteStorage
    from wandb.proto.wandb_internal_pb2 import Record

    found: dict[str, dict[int, float]] = {}
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    found["tensorboard"] = {event.step: event.value for event in events.Scalars("train/version")}
    found["trackio"] = {row["step"]: row["train/version"] for row in SQLiteStorage.get_logs("clawrl", run_dir.name)
                        if "train/version" in row}  # fmt: skip
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("clawrl").experiment_id])
    found["mlflow"] = {metric.step: metric.value for run in runs for metric in client.get_metric_history(run.info.run_id, "train/version")}
    found["wandb"] = {}
    for path in run_dir.glob("wandb/offline-run-*/run-*.wandb"):
        for data in wandb_records(path.read_bytes()):
            record = Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") == "history":
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                if "train/version" in row:
                    found["wandb"][row["_step"]] = row["train/version"]
    return found


def wandb_records(data: bytes) -> list[bytes]:
    """The records of a W&B offline run file: a 7-byte header (":W&B", magic, version), then LevelDB's
    log format (32 KiB blocks of records, each a 7-byte header: CRC, length, type; a record may be
    split across blocks as FIRST, MIDDLE..., LAST)."""
    records, pending, position, block = [], b"", 7, 32768
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        length, kind = int.from_bytes(data[position + 4 : position + 6], "little"), data[position + 6]
        piece = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind == 0 and length == 0:
            continue  # zero padding
        pending += piece
        if kind in (1, 4):  # FULL or LAST: a whole record
            records.append(pending)
            pending = b""
    return records


def _children(pid: int) -> list[int]:
    """Child processes of `pid`, whichever of its threads started them."""
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir() for child in (task / "children").read_text().split()]


def _zombie(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize(
    "options",
    [
        {"full": True, "teacher": "base", "kl_beta": 0.1, "opd_topk": 2},  # the frozen copy is teacher and reference
        {"teacher": "policy", "method": "opd"},
    ],
    ids=["full-topk-kl", "lora-policy-teacher"],
)
def test_other_parameterisations_publish_versions_the_engine_serves(tiny_model_dir: Path, tmp_path: Path, options: dict[str, Any]) -> None:
    store = Store.for_run_dir(tmp_path)
    talk = Conversation(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    for index in range(3):
        talk.turn(f"t{index}", "S", f"Write note {index}.", "**Note**: 1. Friday.", after=f"t{index - 1}" if index else None)
        talk.judge(f"t{index}", -1, HINT)
    talk.turn("t3", "S", "thanks", "Welcome.", after="t2")
    engine_config, _, train = trainer_configs(tiny_model_dir, tmp_path, **options)
    trainer = Trainer(train, engine_config, store, tmp_path)
    trainer.start()
    stopped = threading.Event()
    stopped.set()
    assert trainer.run(max_steps=1, stop=stopped) == 0  # a stop asked for ends the loop before a step
    assert trainer.run(max_steps=1) == 1
    sample = store.training.sample("t0")
    assert sample.teacher == ("base" if options["teacher"] == "base" else "policy v0")
    assert (sample.teacher_topk_ids is not None) == bool(options.get("opd_topk"))
    row = store.training.version(1)
    assert row.kind == ("full" if options.get("full") else "lora") and row.metrics.opd_fraction == 1.0
    if options.get("opd_topk"):
        assert row.metrics.topk_reverse_kl > 0.0
    turn = store.turns.turn("t0")

    async def served() -> tuple[list[float], list[float]]:
        engine = HFEngine(engine_config)
        await engine.start()
        try:
            await engine.load_version(1, Path(row.path))
            new = await engine.score(turn.prompt_token_ids, turn.response_token_ids)
            old = await engine.score(turn.prompt_token_ids, turn.response_token_ids, version=0)
            return new.logprobs, old.logprobs
        finally:
            await engine.close()

    new, old = asyncio.run(served())
    trained = score_response(trainer.model, turn.prompt_token_ids, turn.response_token_ids, 0).logprobs
    torch.testing.assert_close(torch.tensor(new), torch.tensor(trained), rtol=0, atol=1e-4)
    assert not torch.allclose(torch.tensor(new), torch.tensor(old), atol=1e-3)
