"""A lineage per user (`--adapters per-user`, DESIGN §12): each user's turns train their own LoRA
lineage from the base, the trainer steps the users fairly, versions and rollbacks are per user,
and each user's requests are answered by their own current version.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from clawrl.config import EngineConfig, JudgeConfig, TrainConfig
from clawrl.config.commands import ServeSettings, TrainSettings
from clawrl.store import Store
from clawrl.store.users import UserError
from clawrl.train.policy import ADAPTER_WEIGHTS
from clawrl.train.trainer import Trainer
from clawrl.trainer_process import TrainerProcess
from clawrl.types import DEFAULT_USER, SHARED_LINEAGE
from clawrl.versions.files import MANIFEST
from tests.helpers import Conversation, start_server, teach, wait_until
from tests.test_train_e2e import trainer_configs


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _session(talk: Conversation, user: str, name: str, scores: tuple[int, int]) -> list[str]:
    """A session of three turns whose first two are judged (each has a next state): two samples."""
    ids = [f"{user}-{name}-{index}" for index in range(3)]
    talk.turn(ids[0], f"{user}-{name}", "Write a short note to my team about Friday.", "Team, Friday is off.", user_id=user)
    talk.turn(ids[1], f"{user}-{name}", "make it warmer please", "Dear team, enjoy Friday off!", after=ids[0], user_id=user)
    talk.turn(ids[2], f"{user}-{name}", "thanks", "You are welcome.", after=ids[1], done=True, user_id=user)
    talk.judge(ids[0], scores[0], "be warmer")
    talk.judge(ids[1], scores[1])
    return ids[:2]


def _trainer(model_dir: Path, run_dir: Path, adapters: str) -> Trainer:
    engine = EngineConfig(model=str(model_dir), device="cpu", cpu_threads=1)
    train = TrainConfig(method="combine", batch_size=2, lr=1e-2, adapters=adapters)
    trainer = Trainer(train, engine, Store.for_run_dir(run_dir), run_dir)
    trainer.start()
    return trainer


def _manifest_samples(path: str) -> list[str]:
    return json.loads((Path(path) / MANIFEST).read_text())["sample_ids"]


def test_each_user_trains_their_own_lineage_from_the_base_fairly_and_rolls_back_alone(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    store = Store.for_run_dir(run_dir)
    talk = Conversation(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    alice = _session(talk, "alice", "s1", (-1, 1)) + _session(talk, "alice", "s2", (1, -1))
    bob = _session(talk, "bob", "s1", (1, 1))
    trainer = _trainer(tiny_model_dir, run_dir, "per-user")
    assert trainer.run(max_steps=3) == 3
    first, second, third = store.training.versions()
    # alice's samples came first, but once she has stepped, bob (never stepped) goes before her second batch
    assert [version.lineage for version in (first, second, third)] == ["alice", "bob", "alice"]
    assert (first.parent, second.parent, third.parent) == (0, 0, first.version)
    assert set(_manifest_samples(first.path)) | set(_manifest_samples(third.path)) == set(alice)
    assert set(_manifest_samples(second.path)) == set(bob)
    assert store.training.serving_version("alice") == third.version and store.training.serving_version("bob") == second.version
    assert store.training.serving_version(SHARED_LINEAGE) == 0  # nobody trains the shared lineage

    # bob's first version is exactly what a trainer of bob's turns alone makes: alice's step left nothing behind
    alone_dir = tmp_path / "bob-alone"
    _session(Conversation(Store.for_run_dir(alone_dir), talk.tokenizer), "bob", "s1", (1, 1))
    alone = _trainer(tiny_model_dir, alone_dir, "shared")
    assert alone.run(max_steps=1) == 1
    (bob_alone,) = Store.for_run_dir(alone_dir).training.versions()
    theirs, ours = load_file(str(Path(bob_alone.path) / ADAPTER_WEIGHTS)), load_file(str(Path(second.path) / ADAPTER_WEIGHTS))
    assert theirs.keys() == ours.keys()
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-7)

    # a rollback of alice moves her lineage alone; her next step starts from where it points
    store.training.rollback(first.version, "alice")
    later = _session(talk, "alice", "s3", (-1, -1))
    assert trainer.run(max_steps=1) == 1
    fourth = store.training.versions()[-1]
    assert (fourth.lineage, fourth.parent, fourth.step) == ("alice", first.version, 2)
    assert set(_manifest_samples(fourth.path)) == set(later)
    assert store.training.serving_version("bob") == second.version


def test_per_user_refuses_what_cannot_be_per_user_and_shared_is_no_user_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--adapters per-user trains a LoRA adapter per user"):
        TrainSettings(train=TrainConfig(adapters="per-user", full=True))
    with pytest.raises(ValueError, match="--teacher policy"):
        ServeSettings(train=TrainConfig(method="combine", adapters="per-user", teacher="policy"))
    with pytest.raises(UserError, match="names the lineage trained on everyone's turns"):
        Store.for_run_dir(tmp_path).users.add(SHARED_LINEAGE)


def test_two_users_on_one_server_train_and_are_answered_by_their_own_lineages(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    store = Store.for_run_dir(run_dir)
    keys = {name: store.users.add(name)[1] for name in ("alice", "bob")}
    judge = JudgeConfig(judge_poll_s=0.05)
    engine, store_config, train = trainer_configs(tiny_model_dir, run_dir, adapters="per-user")
    with start_server(tiny_model_dir, run_dir, judge=judge, adapters="per-user", policy_poll_s=0.1, served_model_name="m",
                      api_key="admin-key") as server, TrainerProcess(engine, store_config, train):  # fmt: skip
        taught = {name: teach(server.base_url, sessions=1, api_key=key) for name, key in keys.items()}
        for name in keys:
            wait_until(lambda name=name: store.training.serving_version(name) > 0, 120, f"a version of {name}'s")
        for name, key in keys.items():
            (version,) = store.training.versions(name)
            assert set(_manifest_samples(version.path)) == set(taught[name])  # only their own turns
            # served once the follower has seen it: their request reports their lineage and version
            answer = wait_until(lambda key=key, version=version: _answered_by(server.base_url, key, version.version), 30,
                                f"{name} answered by v{version.version}")  # fmt: skip
            assert answer.headers["x-clawrl-policy-lineage"] == name
        admin = _ask(server.base_url, "admin-key")
        assert (admin.headers["x-clawrl-policy-lineage"], admin.headers["x-clawrl-policy-version"]) == (DEFAULT_USER, "0")
    assert store.training.versions(SHARED_LINEAGE) == []


def _ask(base_url: str, key: str) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "turn_type": "side"}
    response = httpx.post(f"{base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert response.status_code == 200, response.text
    return response


def _answered_by(base_url: str, key: str, version: int) -> httpx.Response | None:
    response = _ask(base_url, key)
    return response if response.headers["x-clawrl-policy-version"] == str(version) else None
