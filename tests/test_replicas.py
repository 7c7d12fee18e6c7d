"""Several replicas behind one engine (`--replicas`, engines/replicas.py): real hf engines on the
tiny model, through the router directly and through a real server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from clawrl.config import EngineConfig
from clawrl.engines import build_engine
from clawrl.engines.base import EngineClosedError, GenerationStream, SamplingParams, TokenStep
from clawrl.engines.hf import HFEngine
from clawrl.engines.replicas import AFFINITY_BLOCK_TOKENS, ReplicatedEngine, prefix_block_hashes
from clawrl.store import Store
from tests.helpers import publish_adapter, save_lora_adapter, start_server, wait_until

# a user message long enough that every request fills several affinity blocks
TOPIC = "Tell me everything about the harbour, the boats, the tides and the fishermen of the old town. " * 3


def two_replicas(model_dir: Path) -> ReplicatedEngine:
    config = EngineConfig(device="cpu", cpu_threads=1, max_batch_size=4)
    return ReplicatedEngine([HFEngine(config, model_path=model_dir), HFEngine(config, model_path=model_dir)])


def prompt_ids(engine: ReplicatedEngine, *turns: str) -> list[int]:
    messages = [{"role": "user" if index % 2 == 0 else "assistant", "content": text} for index, text in enumerate(turns)]
    return engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)


async def collect(stream: GenerationStream) -> list[TokenStep]:
    return [step async for step in stream]


def requests_per_replica(engine: ReplicatedEngine) -> list[int]:
    return [started for _, _, started in engine.replica_requests()]


def test_block_hashes_are_equal_exactly_for_equal_prefixes() -> None:
    block = AFFINITY_BLOCK_TOKENS
    base = list(range(3 * block + 5))
    diverged = base[: 2 * block] + [9999] + base[2 * block + 1 :]
    assert len(prefix_block_hashes(base)) == 3  # whole blocks only
    assert prefix_block_hashes(base)[:2] == prefix_block_hashes(diverged)[:2]
    assert prefix_block_hashes(base)[2] != prefix_block_hashes(diverged)[2]
    assert prefix_block_hashes(base[: block - 1]) == []


def test_a_sessions_requests_stay_on_its_replica_and_new_sessions_spread(tiny_model_dir: Path) -> None:
    """Conversation A, then B, then three more turns of A: A's later turns repeat its prompt so far,
    so they go where its prefix is (round robin or least-requests would split them); B goes to the
    replica A did not use."""
    sampling = SamplingParams(temperature=0, max_tokens=4)

    async def main() -> list[int]:
        engine = two_replicas(tiny_model_dir)
        await engine.start()
        try:
            turns = [TOPIC]
            for index in range(4):
                answer = await collect(engine.generate(prompt_ids(engine, *turns), sampling))
                turns += [engine.tokenizer.decode([step.token_id for step in answer], skip_special_tokens=True) or "ok", f"and more, part {index}"]
                if index == 0:
                    await collect(engine.generate(prompt_ids(engine, "A different question: " + TOPIC[::-1]), sampling))
            return requests_per_replica(engine)
        finally:
            await engine.close()

    assert asyncio.run(main()) == [4, 1]


def test_a_replica_that_fails_is_taken_out_and_requests_go_to_the_other(tiny_model_dir: Path) -> None:
    """Replica 0 closes while requests run on it (as a crashed worker): those that had produced
    tokens end with its error, none started after fails, and replica 1 answers everything after."""
    sampling = SamplingParams(temperature=1.0, max_tokens=48, seed=1)

    async def main() -> tuple[list[BaseException | list[TokenStep]], list[list[TokenStep]], list[tuple[int, bool, int]]]:
        engine = two_replicas(tiny_model_dir)
        await engine.start()
        try:
            ids = prompt_ids(engine, TOPIC)
            running = [engine.generate(ids, sampling) for _ in range(3)]  # A's prefix: all on one replica
            replica = next(index for index, _, started in engine.replica_requests() if started == 3)
            while not any(stream.first_step_at for stream in running):  # under load: tokens already streamed
                await asyncio.sleep(0.001)
            await engine.replicas[replica].close()  # the replica dies under load
            during = await asyncio.gather(*(collect(stream) for stream in running), return_exceptions=True)
            after = [await collect(engine.generate(ids, sampling)) for _ in range(3)]
            return during, after, engine.replica_requests()
        finally:
            await engine.close()

    during, after, replicas = asyncio.run(main())
    for outcome in during:  # cut off mid-answer (tokens already streamed), or restarted elsewhere in full
        assert isinstance(outcome, EngineClosedError) or (isinstance(outcome, list) and outcome[-1].finish_reason)
    assert all(steps and steps[-1].finish_reason for steps in after)
    assert [rotating for _, rotating, _ in replicas].count(False) == 1
    assert sum(started for _, rotating, started in replicas if rotating) >= 3


def test_the_replicas_are_copies_of_one_model(tiny_model_dir: Path) -> None:
    """Greedy answers and log-probs to one prompt are the same on either replica."""
    sampling = SamplingParams(temperature=0, max_tokens=16)

    async def main() -> list[list[TokenStep]]:
        engine = two_replicas(tiny_model_dir)
        await engine.start()
        try:
            ids = prompt_ids(engine, TOPIC)
            return [await collect(replica.generate(ids, sampling)) for replica in engine.replicas]
        finally:
            await engine.close()

    first, second = asyncio.run(main())
    assert [(step.token_id, round(step.logprob, 5)) for step in first] == [(step.token_id, round(step.logprob, 5)) for step in second]


def test_a_request_refused_for_bad_input_takes_no_replica_out(tiny_model_dir: Path) -> None:
    async def main() -> list[tuple[int, bool, int]]:
        engine = two_replicas(tiny_model_dir)
        await engine.start()
        try:
            with pytest.raises(ValueError):
                engine.generate([10**9], SamplingParams(max_tokens=4))
            return engine.replica_requests()
        finally:
            await engine.close()

    assert all(rotating for _, rotating, _ in asyncio.run(main()))


def test_every_replica_serves_a_published_version_through_the_server(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A real server on two replicas: answers, a published LoRA version loaded on both (the router
    reports it only once both have it), /metrics per replica; `--replicas 2` builds the router."""
    assert isinstance(build_engine(EngineConfig(model=str(tiny_model_dir), device="cpu", replicas=2)), ReplicatedEngine)
    engine = two_replicas(tiny_model_dir)
    run_dir = tmp_path / "run"
    with start_server(tiny_model_dir, run_dir, engine=engine, policy_poll_s=0.05) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused")
        for index in range(4):
            answer = client.chat.completions.create(model=engine.model_name, messages=[{"role": "user", "content": f"{index}: {TOPIC[::-1]}"}], max_tokens=4)
            assert answer.choices[0].message is not None
        publish_adapter(Store.for_run_dir(run_dir), run_dir, save_lora_adapter(tiny_model_dir, tmp_path / "adapter", seed=3))
        wait_until(lambda: engine.policy_version == 1, 60, "version 1 served")
        assert [replica.policy_version for replica in engine.replicas] == [1, 1]
        after = client.chat.completions.with_raw_response.create(model=engine.model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        metrics = httpx.get(server.base_url.removesuffix("/v1") + "/metrics").text
    assert after.headers["x-clawrl-policy-version"] == "1"
    assert 'clawrl_replica_in_rotation{replica="0"} 1.0' in metrics and 'clawrl_replica_in_rotation{replica="1"} 1.0' in metrics
    assert 'clawrl_replica_requests_total{replica="0"} 3.0' in metrics or 'clawrl_replica_requests_total{replica="1"} 3.0' in metrics
    assert metrics.count("clawrl_replica_requests_total{") == 2


def test_replicas_with_a_remote_engine_need_one_server_each() -> None:
    with pytest.raises(ValueError, match="needs as many servers"):
        EngineConfig(engine="openai", engine_url="http://a/v1", replicas=2)
    assert EngineConfig(engine="openai", engine_url="http://a/v1, http://b/v1").engine_urls == ["http://a/v1", "http://b/v1"]
