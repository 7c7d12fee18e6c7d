"""Versions to replica actors through Ray's object store (`engines/ray_weights.py`) on a local cluster
(one for the module: a start costs seconds): read and checked once by the server, copied and checked
again by each actor on its side, refused whole when a file is not as its manifest says; and the
shared path (`--weights-transfer shared-path`) as before."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import ray
from openai import OpenAI

from clawrl.config import EngineConfig
from clawrl.engines import build_engine
from clawrl.engines.ray_replica import RayReplica
from clawrl.engines.ray_weights import LocalCopies, VersionShipper
from clawrl.engines.replicas import ReplicatedEngine
from clawrl.store import Store
from clawrl.versions.files import ChecksumError
from tests.helpers import publish_version as publish, save_lora_adapter, save_perturbed_weights, start_server, wait_until

PROMPT = "Tell me about the harbour and the boats of the old town."
SMALL_BUCKET_MIB = 0.25  # the tiny model's weights (about 1 MiB) in several pieces


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def answer(client: OpenAI, model: str) -> tuple[str, str]:
    """A greedy answer to a new conversation, and the policy version the server says gave it."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=12, temperature=0.0
    )
    return raw.parse().choices[0].message.content or "", raw.headers["x-clawrl-policy-version"]


def ray_engine(model_dir: Path, **settings: object) -> ReplicatedEngine:
    engine = build_engine(EngineConfig(model=str(model_dir), device="cpu", cpu_threads=1, placement="ray", replicas=2,
                                       replica_cpus=0.5, **settings))  # fmt: skip
    assert isinstance(engine, ReplicatedEngine) and all(isinstance(replica, RayReplica) for replica in engine.replicas)
    return engine


def replicas_at(engine: ReplicatedEngine, number: int) -> bool:
    return [replica.policy_version for replica in engine.replicas] == [number, number]


def test_versions_reach_both_actors_through_the_object_store_never_from_the_source_and_a_tampered_one_is_refused(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the source directory is moved away as soon as the server has put it: an actor that read the
    # path the store records would find nothing there
    moved: dict[int, Path] = {}
    tamper: set[int] = set()  # versions whose weights file is changed after the follower's check, before the read
    ship = VersionShipper.ship

    def ship_then_move(self: VersionShipper, number: int, path: Path) -> object:
        if number in tamper:
            weights = next(path.glob("*.safetensors"))
            weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
        shipment = ship(self, number, path)
        moved[number] = path.rename(tmp_path / f"moved-v{number}")
        return shipment

    monkeypatch.setattr(VersionShipper, "ship", ship_then_move)
    engine = ray_engine(tiny_model_dir, weights_bucket_mib=SMALL_BUCKET_MIB)
    run_dir = tmp_path / "run"
    with start_server(tiny_model_dir, run_dir, engine=engine, policy_poll_s=0.05) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        base = answer(client, engine.model_name)
        # a LoRA adapter
        source = publish(run_dir, 1, "lora", save_lora_adapter(tiny_model_dir, tmp_path / "adapter", seed=3))
        wait_until(lambda: replicas_at(engine, 1), 120, "v1 on both actors")
        assert not source.exists() and moved[1].is_dir()
        copies = [replica.local_copies[1] for replica in engine.replicas]
        assert len(set(copies)) == 2 and all("clawrl-replica-" in copy and str(tmp_path) not in copy for copy in copies)
        served = [answer(client, engine.model_name) for _ in range(2)]  # a new conversation each: one per replica
        assert served[0] == served[1] and served[0][1] == "1" and served[0][0] != base[0]
        assert sorted(engine.replica_requests()[index][2] for index in (0, 1)) == [1, 2]
        # full weights, in several pieces, reassembled byte for byte on each actor's side
        source = publish(run_dir, 2, "full", save_perturbed_weights(tiny_model_dir, tmp_path / "full"))
        wait_until(lambda: replicas_at(engine, 2), 120, "v2 on both actors")
        assert not source.exists()
        for replica in engine.replicas:
            copy = Path(replica.local_copies[2])
            weights = json.loads((moved[2] / "manifest.json").read_text())["weights"]
            assert sorted(path.name for path in copy.iterdir()) == sorted([*weights, "manifest.json"])  # not the trainer's state
            assert all((copy / path.name).read_bytes() == path.read_bytes() for path in copy.iterdir())
        wait_until(lambda: answer(client, engine.model_name)[1] == "2", 30, "answers of v2")
        # a version whose weights change between the follower's check and the server's read is
        # refused before any actor is asked to load it; both keep serving v2
        tamper.add(3)
        publish(run_dir, 3, "full", save_perturbed_weights(tiny_model_dir, tmp_path / "full-3"))
        metrics_url = server.base_url.removesuffix("/v1") + "/metrics"
        wait_until(lambda: "clawrl_policy_swap_failures_total 1.0" in httpx.get(metrics_url).text, 60, "v3 refused")
        assert replicas_at(engine, 2) and 3 not in moved
        assert all(3 not in replica.held_versions() and 3 not in replica.local_copies for replica in engine.replicas)
        assert answer(client, engine.model_name)[1] == "2"
        # the next version loads; the copies kept are those of the versions the engines still hold
        publish(run_dir, 4, "lora", save_lora_adapter(tiny_model_dir, tmp_path / "adapter-4", seed=4))
        wait_until(lambda: replicas_at(engine, 4), 120, "v4 on both actors")
        for replica in engine.replicas:
            assert 4 in replica.local_copies and 1 not in replica.local_copies
            assert set(replica.local_copies) <= set(replica.held_versions())
            assert sorted(path.name for path in Path(replica.local_copies[4]).parent.iterdir()) == [
                f"v{number}" for number in sorted(replica.local_copies)]  # fmt: skip
    assert all(not Path(copy).exists() for copy in copies)  # the actors' copies went with them


def test_full_weights_go_in_pieces_of_at_most_the_bucket_and_come_back_byte_identical(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    path = publish(run_dir, 1, "full", save_perturbed_weights(tiny_model_dir, tmp_path / "full"))
    shipment = VersionShipper(SMALL_BUCKET_MIB).ship(1, path)
    pieces = dict(shipment.files)
    weights = next(name for name in pieces if name.endswith(".safetensors"))
    assert len(pieces[weights]) > 2
    sizes = [len(ray.get(ref)) for ref in pieces[weights]]
    assert max(sizes) <= SMALL_BUCKET_MIB * (1 << 20) and sum(sizes) == (path / weights).stat().st_size
    copies = LocalCopies()
    try:
        copy = asyncio.run(copies.materialize(shipment))
        assert all((copy / name).read_bytes() == (path / name).read_bytes() for name in pieces)
        copies.keep_only([0])
        assert not copy.exists() and copies.dirs == {}
    finally:
        copies.remove_all()


def test_a_version_not_as_its_manifest_says_is_refused_whole(ray_cluster: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    path = publish(run_dir, 1, "lora", save_lora_adapter(tiny_model_dir, tmp_path / "adapter", seed=3))
    shipper = VersionShipper(SMALL_BUCKET_MIB)
    with pytest.raises(ChecksumError, match="not version 2's"):
        shipper.ship(2, path)
    weights = path / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"half")
    with pytest.raises(ChecksumError, match="does not match its manifest"):
        shipper.ship(1, path)
    weights.unlink()
    with pytest.raises(ChecksumError, match="is missing"):
        shipper.ship(1, path)
    (path / "manifest.json").unlink()
    with pytest.raises(ChecksumError, match="no readable manifest.json"):
        shipper.ship(1, path)


def test_a_piece_changed_on_the_way_is_refused_on_the_actors_side(ray_cluster: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    path = publish(run_dir, 1, "lora", save_lora_adapter(tiny_model_dir, tmp_path / "adapter", seed=3))
    shipment = VersionShipper(SMALL_BUCKET_MIB).ship(1, path)
    name, refs = shipment.files[0]
    changed = bytearray(ray.get(refs[0]).tobytes())
    changed[0] ^= 1
    broken = dataclasses.replace(shipment, files=[(name, [ray.put(bytes(changed)), *refs[1:]]), *shipment.files[1:]])
    copies = LocalCopies()
    try:
        with pytest.raises(ChecksumError):
            asyncio.run(copies.materialize(broken))
        assert copies.dirs == {} and list(copies.root.iterdir()) == []  # the partial copy removed
    finally:
        copies.remove_all()


def test_shared_path_loads_the_path_the_store_records(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(self: VersionShipper, number: int, path: Path) -> None:
        raise AssertionError("shared-path puts nothing into the object store")

    monkeypatch.setattr(VersionShipper, "ship", never)
    engine = ray_engine(tiny_model_dir, weights_transfer="shared-path")
    run_dir = tmp_path / "run"
    with start_server(tiny_model_dir, run_dir, engine=engine, policy_poll_s=0.05) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        base = answer(client, engine.model_name)
        publish(run_dir, 1, "lora", save_lora_adapter(tiny_model_dir, tmp_path / "adapter", seed=3))
        wait_until(lambda: replicas_at(engine, 1), 120, "v1 on both actors")
        served = answer(client, engine.model_name)
        assert served[1] == "1" and served[0] != base[0]
        assert all(replica.local_copies == {} for replica in engine.replicas)
