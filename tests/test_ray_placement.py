"""`--placement ray`: replicas in Ray actors on a local cluster (one for the module: a start costs
seconds), behind a real server; the router of engines/replicas.py over `RayReplica`s."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import httpx
import pytest
import ray
from openai import OpenAI

from clawrl.config import EngineConfig
from clawrl.engines import build_engine
from clawrl.engines.ray_replica import RayReplica
from clawrl.engines.replicas import ReplicatedEngine
from clawrl.store import Store
from tests.helpers import ask as ask_once, publish_adapter, save_lora_adapter, start_server, wait_until

PROMPT = "Tell me everything about the harbour, the boats, the tides and the fishermen of the old town. " * 3


@pytest.fixture(scope="module")
def ray_cluster() -> object:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def ask(client: OpenAI, model: str, index: int) -> tuple[int, str | None]:
    """Conversation `index`'s one request: (HTTP status, the turn id the server recorded it as)."""
    return ask_once(client, model, f"{index}: {PROMPT}")


def test_two_replica_actors_serve_swap_and_survive_one_killed(ray_cluster: object, tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = build_engine(EngineConfig(model=str(tiny_model_dir), device="cpu", cpu_threads=1, placement="ray", replicas=2))
    assert isinstance(engine, ReplicatedEngine) and all(isinstance(replica, RayReplica) for replica in engine.replicas)
    run_dir = tmp_path / "run"
    with start_server(tiny_model_dir, run_dir, engine=engine, policy_poll_s=0.05) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        assert [status for status, _ in (ask(client, engine.model_name, index) for index in range(4))] == [200] * 4
        assert [started for _, _, started in engine.replica_requests()] == [2, 2]  # new conversations spread
        # a published version is served by both actors
        publish_adapter(Store.for_run_dir(run_dir), run_dir, save_lora_adapter(tiny_model_dir, tmp_path / "adapter", seed=3))
        wait_until(lambda: [replica.policy_version for replica in engine.replicas] == [1, 1], 120, "version 1 on both actors")
        assert engine.policy_version == 1
        # one actor killed under load: requests under way on it may fail; none started after it was taken out does
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            under_load = [pool.submit(ask, client, engine.model_name, 100 + index) for index in range(6)]
            ray.kill(engine.replicas[0].actor)
            during = [future.result() for future in under_load]
        wait_until(lambda: any(not rotating for _, rotating, _ in engine.replica_requests()), 60, "the dead replica taken out")
        after = [ask(client, engine.model_name, 200 + index) for index in range(4)]
        metrics = httpx.get(server.base_url.removesuffix("/v1") + "/metrics").text
    assert [status for status, _ in after] == [200] * 4
    assert 'clawrl_replica_in_rotation{replica="0"} 0.0' in metrics
    # nothing answered is lost: every request that got its answer is a recorded turn
    store = Store.for_run_dir(run_dir)
    answered = [turn_id for status, turn_id in during + after if status == 200]
    assert answered and all(store.judging.turn_context(turn_id) is not None for turn_id in answered)
    assert {store.judging.turn_context(turn_id).turn.policy_version for turn_id in answered} == {1}
