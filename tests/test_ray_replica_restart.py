"""A replica actor that dies is started again and brought back into rotation (`--replica-restarts`,
engines/replica_restarts.py): behind a real server on a local Ray cluster (one for the module: a
start costs seconds), and the race of a version published while a replica catches up, on the
router alone with engines that stand in for actors."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from openai import OpenAI

from clawrl.config import EngineConfig
from clawrl.engines import build_engine
from clawrl.engines.base import Engine, GenerationStream, SamplingParams
from clawrl.engines.ray_replica import RayReplica
from clawrl.engines.replicas import ReplicatedEngine
from clawrl.store import Store
from clawrl.types import SHARED_LINEAGE, ScoredResponse
from tests.helpers import ask as ask_once, healthz, publish_version, save_lora_adapter, start_server, wait_until

PROMPT = "Tell me everything about the harbour, the boats, the tides and the fishermen of the old town. " * 3


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def ray_engine(model_dir: Path, **settings: Any) -> ReplicatedEngine:
    engine = build_engine(EngineConfig(model=str(model_dir), device="cpu", cpu_threads=1, placement="ray", replicas=2,
                                       replica_cpus=0.5, **settings))  # fmt: skip
    assert isinstance(engine, ReplicatedEngine) and all(isinstance(replica, RayReplica) for replica in engine.replicas)
    return engine


def ask(client: OpenAI, model: str, index: int) -> tuple[int, str | None]:
    """Conversation `index`'s one request: (HTTP status, the policy version the server says answered it)."""
    return ask_once(client, model, f"{index}: {PROMPT}", "x-clawrl-policy-version", max_tokens=16)


def replica(engine: ReplicatedEngine, index: int) -> dict[str, Any]:
    return engine.replica_status()[index]


def until_taken_out(client: OpenAI, engine: ReplicatedEngine) -> None:
    """New conversations until one finds replica 0's actor dead and takes it out (the router answers
    it on the other: it failed before its first token)."""
    wait_until(lambda: ask(client, engine.model_name, 1000)[0] == 200 and not replica(engine, 0)["in_rotation"], 60,
               "replica 0 taken out")  # fmt: skip


def test_a_killed_replica_actor_comes_back_with_the_current_version(ray_cluster: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = ray_engine(tiny_model_dir)
    run_dir, adapters = tmp_path / "run", tmp_path / "adapters"
    with start_server(tiny_model_dir, run_dir, engine=engine, policy_poll_s=0.05) as server:
        client, base = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0), server.base_url.removesuffix("/v1")
        publish_version(run_dir, 1, "lora", save_lora_adapter(tiny_model_dir, adapters / "1", seed=1))
        wait_until(lambda: [replica.policy_version for replica in engine.replicas] == [1, 1], 120, "v1 on both actors")
        dead = engine.replicas[0].actor
        # killed under load; v2 published while it is out: the replica left serves it, the new actor catches up
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            under_load = [pool.submit(ask, client, engine.model_name, index) for index in range(6)]
            ray.kill(dead)
            [future.result() for future in under_load]  # those under way on it may fail
        until_taken_out(client, engine)
        publish_version(run_dir, 2, "lora", save_lora_adapter(tiny_model_dir, adapters / "2", seed=2))
        while_out = [ask(client, engine.model_name, 100 + index) for index in range(4)]
        assert [status for status, _ in while_out] == [200] * 4
        wait_until(lambda: replica(engine, 0)["in_rotation"], 180, "replica 0 back in rotation")
        assert engine.replicas[0].actor is not dead and replica(engine, 0)["restarts"] == 1
        # the version served (v2 reached replica 1 while replica 0 was out; the race itself: the last test)
        wait_until(lambda: [replica.policy_version for replica in engine.replicas] == [2, 2], 60, "v2 on both actors")
        # new conversations go to the replica given the fewest so far: the one that came back
        before = replica(engine, 0)["requests"]
        back = [ask(client, engine.model_name, 200 + index) for index in range(4)]
        assert back == [(200, "2")] * 4 and replica(engine, 0)["requests"] > before
        # a version published after it came back is served by both
        publish_version(run_dir, 3, "lora", save_lora_adapter(tiny_model_dir, adapters / "3", seed=3))
        wait_until(lambda: [replica.policy_version for replica in engine.replicas] == [3, 3], 120, "v3 on both actors")
        assert [ask(client, engine.model_name, 300 + index) for index in range(2)] == [(200, "3")] * 2
        metrics, health = httpx.get(base + "/metrics").text, healthz(base)
    assert 'clawrl_replica_in_rotation{replica="0"} 1.0' in metrics
    assert 'clawrl_replica_restarts_total{replica="0"} 1.0' in metrics and 'clawrl_replica_restarts_total{replica="1"} 0.0' in metrics
    assert health is not None and [(r["in_rotation"], r["restarts"], r["given_up"]) for r in health["replicas"]] == [(True, 1, False), (True, 0, False)]


def test_a_replica_whose_new_actor_cannot_start_is_given_up_on_and_the_other_serves(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tries: list[int] = []

    async def cannot_start(self: RayReplica) -> None:
        tries.append(1)
        raise RuntimeError("no node can hold it")

    monkeypatch.setattr(RayReplica, "restart", cannot_start)
    engine = ray_engine(tiny_model_dir, replica_restarts=2)
    caplog.set_level(logging.WARNING, logger="clawrl.engines.replica_restarts")
    with start_server(tiny_model_dir, tmp_path / "run", engine=engine, policy_poll_s=0.05) as server:
        client, base = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0), server.base_url.removesuffix("/v1")
        assert [ask(client, engine.model_name, index)[0] for index in range(2)] == [200] * 2
        ray.kill(engine.replicas[0].actor)
        until_taken_out(client, engine)
        wait_until(lambda: replica(engine, 0)["given_up"], 60, "replica 0 given up on")  # after 1 s, a try, 2 s, a try
        after = [ask(client, engine.model_name, 100 + index) for index in range(3)]
        health = healthz(base)
    assert len(tries) == 2 and [status for status, _ in after] == [200] * 3
    assert health is not None and [(r["in_rotation"], r["restarts"], r["given_up"]) for r in health["replicas"]] == [(False, 0, True), (True, 0, False)]
    assert any("not starting it again" in record.getMessage() for record in caplog.records)


class StandIn(Engine):
    """An engine that stands in for a replica actor: versions by lineage, a death and a restart; no model."""

    model_name, tokenizer, max_context_tokens, constrained_decoding = "stand-in", None, 100, False

    def __init__(self, on_load: Any = None) -> None:
        self.current: dict[str, int] = {SHARED_LINEAGE: 0}
        self.loads: list[int] = []
        self.died = False
        self.on_load = on_load  # awaited with the version before each load ends

    @property
    def policy_version(self) -> int:
        return self.current[SHARED_LINEAGE]

    def lineage_version(self, lineage: str) -> int | None:
        return self.current.get(lineage)

    def held_versions(self) -> list[int]:
        return sorted(set(self.current.values()))

    def generate(self, prompt_token_ids: list[int], sampling: SamplingParams, lineage: str = SHARED_LINEAGE) -> GenerationStream:
        raise NotImplementedError

    async def score(self, prompt_token_ids: list[int], response_token_ids: list[int], top_k: int = 0,
                    version: int | None = None) -> ScoredResponse:  # fmt: skip
        raise NotImplementedError

    async def load_version(self, version: int, path: Path, lineage: str = SHARED_LINEAGE) -> None:
        self.loads.append(version)
        if self.on_load is not None:
            await self.on_load(version)
        self.current[lineage] = version

    async def restart(self) -> None:
        self.current, self.died = {SHARED_LINEAGE: 0}, False


def test_a_version_loaded_while_a_replica_catches_up_is_loaded_on_it_before_it_is_admitted() -> None:
    """Replica 0 dies at v1, is restarted and catches up with v1; v2's load (on replica 1 alone, the
    one in rotation) starts during that catch-up and is still under way when it ends. Admitted then,
    replica 0 would answer with v1 beside a replica at v2."""

    async def main() -> tuple[list[int], list[int], bool, int | None]:
        v2_under_way, v2_may_end = asyncio.Event(), asyncio.Event()

        async def publish_v2_during_the_catch_up(version: int) -> None:
            if version == 1 and first.loads == [1, 1]:  # the catch-up's load of v1: the follower loads v2 meanwhile
                asyncio.get_running_loop().create_task(engine.load_version(2, Path("v2")))
                await v2_under_way.wait()

        async def slow_v2(version: int) -> None:
            if version == 2:
                v2_under_way.set()
                await v2_may_end.wait()

        first, second = StandIn(publish_v2_during_the_catch_up), StandIn(slow_v2)
        engine = ReplicatedEngine([first, second], restarts=2)
        await engine.load_version(1, Path("v1"))
        first.died = True
        engine.take_out(0, "its actor died")
        await asyncio.wait_for(v2_under_way.wait(), 10)
        await asyncio.sleep(0.2)  # the catch-up's v1 is loaded: replica 0 waits for v2's load to end
        out_while_v2_loads = not replica(engine, 0)["in_rotation"]
        v2_may_end.set()
        for _ in range(100):
            if replica(engine, 0)["in_rotation"]:
                break
            await asyncio.sleep(0.05)
        return first.loads, second.loads, out_while_v2_loads, engine.policy_version if replica(engine, 0)["in_rotation"] else None

    first_loads, second_loads, out_while_v2_loads, served = asyncio.run(main())
    assert out_while_v2_loads
    assert first_loads == [1, 1, 2] and second_loads == [1, 2] and served == 2
