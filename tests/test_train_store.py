"""The store's training records and version directories: exactly-once registration, rollback,
checksums, orphans, and the upgrade of a version 2 store."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest

from clawrl.store import Store
from clawrl.store.migrations import SCHEMA_VERSION
from clawrl.store.training import PointerMovedError, SamplesTakenError
from clawrl.versions.files import ChecksumError, Manifest, discard_unregistered, verify_version, write_version
from tests.helpers import judgment, ready_sample, record, store_with_samples, user, version


def test_registering_a_version_marks_its_samples_and_moves_the_pointer_at_once(tmp_path: Path) -> None:
    _store, training = store_with_samples(tmp_path, 4)
    assert training.serving_version() == 0
    training.register_version(version(1, 0), ["t0", "t1"])
    assert training.serving_version() == 1 and training.newest_version() == 1
    assert [training.sample(t).trained_version for t in ("t0", "t1", "t2")] == [1, 1, None]
    assert [example.sample.turn_id for example in training.ready_samples(10)] == ["t2", "t3"]
    # A sample is never trained twice: a second registration with a trained sample writes nothing.
    with pytest.raises(SamplesTakenError):
        training.register_version(version(2, 1), ["t1", "t2"])
    assert training.newest_version() == 1 and training.sample("t2").status == "ready"
    assert training.sample_counts() == {"trained": 2, "ready": 2}


def test_a_rollback_during_a_step_keeps_the_step_from_publishing(tmp_path: Path) -> None:
    _store, training = store_with_samples(tmp_path, 4)
    training.register_version(version(1, 0), ["t0"])
    training.register_version(version(2, 1), ["t1"])
    training.rollback(1)
    assert training.serving_target()[:2] == (1, "rollback")
    with pytest.raises(PointerMovedError):  # a step that started from v2
        training.register_version(version(3, 2), ["t2"])
    assert training.sample("t2").status == "ready" and training.version(3) is None
    training.register_version(version(3, 1), ["t2"])  # the step redone from v1
    assert training.serving_version() == 3 and training.version(3).parent == 1
    training.rollback(0)
    assert training.serving_target() == (0, "rollback", None)
    with pytest.raises(KeyError):
        training.rollback(9)


def write(tmp_path: Path, number: int) -> tuple[Path, str]:
    def weights(directory: Path) -> None:
        (directory / "adapter_model.safetensors").write_bytes(b"weights %d" % number)
        (directory / "adapter_config.json").write_text("{}")

    manifest = Manifest(number, number - 1, number, "lora", [f"t{number}"], {"loss": 0.25})
    return write_version(tmp_path, manifest, weights, lambda path: path.write_bytes(b"optimizer"))


def test_version_directories_are_checksummed(tmp_path: Path) -> None:
    path, sha256 = write(tmp_path, 1)
    assert path == tmp_path / "policy" / "shared" / "v1"
    manifest = verify_version(path, sha256, trainer_state=True)
    assert (manifest.parent, manifest.step, manifest.sample_ids, manifest.metrics) == (0, 1, ["t1"], {"loss": 0.25})
    assert set(json.loads((path / "manifest.json").read_text())["weights"]) == {"adapter_model.safetensors", "adapter_config.json"}
    with pytest.raises(ChecksumError):
        verify_version(path, "f" * 64)
    (path / "trainer_state.pt").write_bytes(b"corrupt")
    verify_version(path, sha256)  # serving reads the weights only
    with pytest.raises(ChecksumError):
        verify_version(path, sha256, trainer_state=True)
    (path / "adapter_model.safetensors").write_bytes(b"flipped bits")
    with pytest.raises(ChecksumError):
        verify_version(path, sha256)


def test_unregistered_directories_are_discarded(tmp_path: Path) -> None:
    write(tmp_path, 1)
    write(tmp_path, 2)  # as if killed before registering it
    (tmp_path / "policy" / "shared" / ".tmp-v3-deadbeef").mkdir()  # as if killed while writing
    removed = discard_unregistered(tmp_path, "shared", registered={1})
    assert sorted(path.name for path in removed) == [".tmp-v3-deadbeef", "v2"]
    assert [path.name for path in (tmp_path / "policy" / "shared").iterdir()] == ["v1"]
    path, sha256 = write(tmp_path, 2)  # redone
    verify_version(path, sha256, trainer_state=True)


def test_a_version_2_store_is_upgraded_in_place(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("q")], "a")
    store.judging.record_judgment(judgment("t1"))
    store.close()
    with sqlite3.connect(tmp_path / "clawrl.db") as db:  # what issue 3's store looked like
        for table in ("samples", "policy_versions", "policy_pointers", "episodes"):
            db.execute(f"DROP TABLE {table}")
        db.execute("UPDATE meta SET value='2' WHERE key='schema_version'")
    store = Store.for_run_dir(tmp_path)
    assert store.judging.judgment("t1").score == 1 and store.turns.turn("t1").response_text == "a"
    training = store.training
    assert training.serving_version() == 0 and training.sample_counts() == {}
    training.add_samples([ready_sample("t1")])
    training.register_version(version(1, 0), ["t1"])
    with sqlite3.connect(tmp_path / "clawrl.db") as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION) == "15"


def test_each_lineage_has_its_own_pointer_numbers_never_repeat_and_rollback_stays_inside(tmp_path: Path) -> None:
    _store, training = store_with_samples(tmp_path, 3)
    training.register_version(version(1, 0), ["t0"])
    training.register_version(dataclasses.replace(version(2, 0), lineage="alice"), ["t1"])  # a second lineage, from the base
    assert training.next_version_number() == 3  # numbers are unique across lineages
    assert (training.serving_version(), training.serving_version("alice")) == (1, 2)
    assert (training.newest_version(), training.newest_version("alice")) == (1, 2)
    assert [row.version for row in training.versions("alice")] == [2] and len(training.versions()) == 2
    with pytest.raises(KeyError):
        training.rollback(1, "alice")  # shared's v1 is not alice's to roll back to
    training.rollback(0, "alice")
    assert training.serving_target("alice") == (0, "rollback", None) and training.serving_version() == 1
    with pytest.raises(PointerMovedError):  # alice's pointer moved; shared's did not
        training.register_version(dataclasses.replace(version(3, 2), lineage="alice"), ["t2"])


def test_version_directories_of_one_lineage_leave_the_others_alone(tmp_path: Path) -> None:
    def weights(directory: Path) -> None:
        (directory / "adapter_model.safetensors").write_bytes(b"alice's weights")

    alice = Manifest(2, 0, 1, "lora", ["t1"], {}, lineage="alice")
    path, sha256 = write_version(tmp_path, alice, weights, lambda state: state.write_bytes(b"optimizer"))
    assert path == tmp_path / "policy" / "alice" / "v2" and verify_version(path, sha256).lineage == "alice"
    write(tmp_path, 1)
    assert discard_unregistered(tmp_path, "shared", registered={1}) == []
    assert [removed.name for removed in discard_unregistered(tmp_path, "alice", registered=set())] == ["v2"]
    assert (tmp_path / "policy" / "shared" / "v1").is_dir()


def test_a_version_5_store_keeps_its_versions_and_pointer_in_the_shared_lineage(tmp_path: Path) -> None:
    _store, training = store_with_samples(tmp_path, 2)
    training.register_version(version(1, 0), ["t0"])
    training.register_version(version(2, 1), ["t1"])
    training.rollback(1)
    _store.close()
    with sqlite3.connect(tmp_path / "clawrl.db") as db:  # what issue 28's store looked like
        db.execute("DROP INDEX ix_policy_versions_lineage")
        db.execute("ALTER TABLE policy_versions DROP COLUMN lineage")
        db.execute("CREATE TABLE old_pointers (name VARCHAR(32) PRIMARY KEY, version INTEGER, reason VARCHAR(16), updated_at FLOAT)")
        db.execute("INSERT INTO old_pointers SELECT name, version, reason, updated_at FROM policy_pointers")
        db.execute("DROP TABLE policy_pointers")
        db.execute("ALTER TABLE old_pointers RENAME TO policy_pointers")
        db.execute("UPDATE meta SET value='5' WHERE key='schema_version'")
    upgraded = Store.for_run_dir(tmp_path).training
    assert upgraded.serving_target()[:2] == (1, "rollback")
    assert [(row.version, row.lineage) for row in upgraded.versions()] == [(1, "shared"), (2, "shared")]
    upgraded.register_version(version(3, 1), [])  # publishing goes on where it was
    assert upgraded.serving_version() == 3
