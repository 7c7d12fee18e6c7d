"""Bounded disk for policy versions (issue 33, item 3; DESIGN §12): `--keep-versions K` keeps the serving
version, the pinned ones, their parents back K steps and the newest, removes the rest's directories
and marks their rows pruned; `clawrl versions pin`/`unpin`; a rollback to a pruned version is refused
with a clear error; `versions list` says which is which; the v10 migration on SQLite and PostgreSQL.
A real trainer on the tiny model publishes many versions and its policy directory stays bounded."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy
import torch
from transformers import AutoTokenizer

from clawrl.config import EngineConfig, TrainConfig
from clawrl.store import Store
from clawrl.store.pruning import VersionPrunedError
from clawrl.train.trainer import Trainer
from clawrl.versions.files import Manifest, write_version
from clawrl.versions.retention import VersionPruner
from tests.helpers import HINT, Conversation, judgment, ready_sample, record, run_cli, user, version


def clawrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawrl", *args], capture_output=True, text=True, timeout=120)


def publish(store: Store, run_dir: Path, parents: list[int], lineage: str = "shared") -> None:
    """Publish versions 1, 2, ... with these parents (a rollback happens where a parent is not the
    version before), each with a directory on disk as the trainer writes it."""
    training = store.training
    for number, parent in enumerate(parents, start=1):
        turn_id = f"{lineage}-t{number}"
        record(store, turn_id, f"{lineage}-s", [user(f"q{number}")], f"a{number}")
        store.judging.record_judgment(judgment(turn_id))
        training.add_samples([ready_sample(turn_id)])
        if training.serving_version(lineage) != parent:
            training.rollback(parent, lineage)
        manifest = Manifest(number, parent, number, "lora", [turn_id], {}, lineage=lineage)
        path, sha256 = write_version(run_dir, manifest, lambda d: (d / "adapter_model.safetensors").write_bytes(b"w" * 1000),
                                     lambda p: p.write_bytes(b"optimizer"))  # fmt: skip
        training.register_version(dataclasses.replace(version(number, parent), path=str(path), sha256=sha256,
                                                       lineage=lineage), [turn_id])  # fmt: skip


def on_disk(run_dir: Path, lineage: str = "shared") -> list[int]:
    return sorted(int(path.name[1:]) for path in (run_dir / "policy" / lineage).iterdir())


def pruned(store: Store, lineage: str = "shared") -> list[int]:
    return [row.version for row in store.training.versions(lineage) if row.pruned]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return request.getfixturevalue("postgres_url") if request.param == "postgresql" else f"sqlite:///{tmp_path / 'clawrl.db'}"


def test_serving_pinned_their_parents_and_the_newest_keep_their_weights(store_url: str, tmp_path: Path) -> None:
    store = Store(store_url)
    publish(store, tmp_path, [0, 1, 2, 3, 4, 5, 6, 7])  # a straight line: v8 serves
    assert store.training.set_pinned(3, True).pinned
    pruner = VersionPruner(store.training, tmp_path, keep_steps=2, grace_s=0)
    assert pruner.prune("shared") == [4, 5]  # v8 and its parents v7, v6; v3 pinned and its parents v2, v1
    assert on_disk(tmp_path) == [1, 2, 3, 6, 7, 8] and pruned(store) == [4, 5]
    store.training.rollback(3)  # a rollback to a kept version: it serves, and v8 stays as the newest
    assert pruner.prune("shared") == [6, 7]
    assert on_disk(tmp_path) == [1, 2, 3, 8]
    with pytest.raises(VersionPrunedError, match="v5 was pruned by --keep-versions"):
        store.training.rollback(5)
    with pytest.raises(VersionPrunedError):
        store.training.set_pinned(5, True)
    assert store.training.serving_version() == 3  # refused: nothing moved
    store.training.set_pinned(3, False)
    assert pruner.prune("shared") == []  # unpinned, v3 still serves
    store.close()


def test_a_version_leaves_the_disk_only_after_the_grace_and_a_pin_meanwhile_keeps_it(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    publish(store, tmp_path, [0, 1, 2, 3])
    now = [100.0]
    pruner = VersionPruner(store.training, tmp_path, keep_steps=1, grace_s=60, clock=lambda: now[0])
    assert pruner.prune("shared") == []  # v1 and v2 left the kept set just now: serving may still load them
    now[0] += 30
    store.training.set_pinned(1, True)
    now[0] += 31
    assert pruner.prune("shared") == [2] and on_disk(tmp_path) == [1, 3, 4]
    store.training.set_pinned(1, False)
    assert pruner.prune("shared") == []  # unkept again from now: its wait starts anew
    now[0] += 60
    assert pruner.prune("shared") == [1] and on_disk(tmp_path) == [3, 4]


def test_the_cli_pins_lists_and_refuses_a_rollback_to_a_pruned_version(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    publish(store, tmp_path, [0, 1, 2, 3, 4])
    publish_lineage = ("--run-dir", str(tmp_path))
    assert "v1 is pinned" in run_cli("versions", "pin", "v1", *publish_lineage, parse=False)
    VersionPruner(store.training, tmp_path, keep_steps=1, grace_s=0).prune("shared")
    listed = {item["version"]: item for item in run_cli("versions", "list", "--json", *publish_lineage)}
    assert {number: (item["pinned"], item["pruned"]) for number, item in listed.items()} == {
        1: (True, False), 2: (False, True), 3: (False, True), 4: (False, False), 5: (False, False)}
    text = run_cli("versions", "list", *publish_lineage, parse=False)
    assert [line.split()[6] for line in text.splitlines()[1:]] == ["pinned", "pruned", "pruned", "kept", "kept"]
    refused = clawrl("versions", "rollback", "v3", *publish_lineage)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("error: v3 was pruned by --keep-versions: its weights are gone")
    assert clawrl("versions", "pin", "v3", *publish_lineage).returncode == 1
    assert clawrl("versions", "pin", "v9", *publish_lineage).stderr.strip() == "error: no policy version v9 in lineage 'shared'"
    assert clawrl("versions", "pin", "three", *publish_lineage).returncode == 2
    assert "no longer pinned" in run_cli("versions", "unpin", "1", *publish_lineage, parse=False)
    assert store.training.serving_version() == 5 and not store.training.version(1).pinned


def test_a_trainer_publishing_many_versions_keeps_its_policy_directory_bounded(tiny_model_dir: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    store = Store.for_run_dir(tmp_path)
    talk = Conversation(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    steps = 9
    for index in range(steps + 1):
        talk.turn(f"t{index}", "S", f"Write note {index}.", "**Note**: 1. Friday.", after=f"t{index - 1}" if index else None)
        if index < steps:
            talk.judge(f"t{index}", -1, HINT)
    engine = EngineConfig(model=str(tiny_model_dir), device="cpu", cpu_threads=1)
    config = TrainConfig(method="rl", batch_size=1, lr=1e-2, train_poll_s=0.05, keep_versions=2, keep_versions_grace_s=0)
    trainer = Trainer(config, engine, store, tmp_path)
    trainer.start()
    counts = []
    for _ in range(steps):
        assert trainer.run(max_steps=1) == 1
        counts.append(len(on_disk(tmp_path)))
    assert counts == [1, 2, 3, 3, 3, 3, 3, 3, 3]  # serving (the newest) and its two parents
    assert on_disk(tmp_path) == [7, 8, 9] and pruned(store) == [1, 2, 3, 4, 5, 6]
    # a trainer killed between marking and removing leaves a pruned directory: the next start removes it
    (tmp_path / "policy" / "shared" / "v3").mkdir()
    trainer.start()
    assert on_disk(tmp_path) == [7, 8, 9]
    store.training.rollback(8)  # a kept version: the trainer trains on from it
    assert trainer.run(max_steps=1, idle_exit_s=0.2) == 0  # no sample is left
    assert trainer.head == 8


def _as_version_9(url: str) -> None:
    """The store at `url` as clawrl wrote it before --keep-versions (schema v9)."""
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as db:
        for column in ("pruned", "pinned"):
            db.execute(sqlalchemy.text(f"ALTER TABLE policy_versions DROP COLUMN {column}"))
        db.execute(sqlalchemy.text("UPDATE meta SET value='9' WHERE key='schema_version'"))
    engine.dispose()


def test_a_version_9_store_has_pruned_and_pinned_nothing(store_url: str, tmp_path: Path) -> None:
    store = Store(store_url)
    publish(store, tmp_path, [0, 1])
    store.close()
    _as_version_9(store_url)
    store = Store(store_url)
    assert [(row.version, row.pruned, row.pinned) for row in store.training.versions()] == [(1, False, False), (2, False, False)]
    assert store.training.set_pinned(1, True).pinned  # the new columns take writes
    assert VersionPruner(store.training, tmp_path, keep_steps=0, grace_s=0).prune("shared") == []
    store.close()
