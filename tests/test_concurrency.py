"""Many clients at once against a real server: every stream completes, and the server stays responsive.

The engine does all model work on its own worker thread, so the event loop that serves HTTP only
moves bytes: while 32 streams decode, a health check must still be answered at once, as a load
balancer or an orchestrator probing the server would expect.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from clawrl.serve.runner import ServerThread
from clawrl.store import Store
from tests.helpers import start_server

CLIENTS = 32
MAX_TOKENS = 32
HEALTH_DEADLINE_S = 0.1
# One poll may still take longer: the whole test (client, server, engine) is one Python process, and
# a garbage collection of its heap or two busy cores stalled a single poll for 495 ms in a full
# suite once. Decoding on the event loop would hold up every poll made while it decodes.
HEALTH_STALL_S = 1.0
# far above what the run takes (a few seconds); only there so a hang fails instead of blocking CI
RUN_TIMEOUT_S = 60.0


@dataclass
class StreamResult:
    turn_id: str
    content: str
    finish_reason: str | None
    saw_done: bool


@pytest.fixture
def busy_server(tiny_model_dir: Path, run_dir: Path) -> Iterator[ServerThread]:
    # max_batch_size defaults to 32: all clients decode together in one batch
    with start_server(tiny_model_dir, run_dir, served_model_name="tiny") as running:
        yield running


async def stream_chat(client: httpx.AsyncClient, prompt: str) -> StreamResult:
    """One streaming chat completion, read to the end as an OpenAI SDK would."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.8,
        "seed": 1,
    }
    turn_id, pieces, finish_reason, saw_done = "", [], None, False
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                saw_done = True
                continue
            chunk = json.loads(data)
            assert "error" not in chunk, chunk
            turn_id = chunk["id"]
            for choice in chunk["choices"]:
                pieces.append(choice["delta"].get("content") or "")
                finish_reason = choice.get("finish_reason") or finish_reason
    return StreamResult(turn_id, "".join(pieces), finish_reason, saw_done)


async def poll_health(client: httpx.AsyncClient, stop: asyncio.Event) -> list[float]:
    """GET /healthz back to back until `stop` is set; returns each poll's latency in seconds."""
    latencies = []
    while not stop.is_set():
        started = time.perf_counter()
        response = await client.get("/healthz")
        latencies.append(time.perf_counter() - started)
        assert response.status_code == 200 and response.json()["status"] == "ok"
        await asyncio.sleep(0.01)
    return latencies


async def run_load(root: str) -> tuple[list[StreamResult], list[float]]:
    limits = httpx.Limits(max_connections=CLIENTS + 8)
    async with (
        httpx.AsyncClient(base_url=root, timeout=RUN_TIMEOUT_S, limits=limits) as chats,
        # a separate client, so health checks never wait for a pooled connection behind the streams
        httpx.AsyncClient(base_url=root, timeout=RUN_TIMEOUT_S) as health,
    ):
        await health.get("/healthz")  # open the connection before measuring
        stop = asyncio.Event()
        poller = asyncio.create_task(poll_health(health, stop))
        try:
            streams = [stream_chat(chats, f"Client {i}: tell me about the {i}th city you visited.") for i in range(CLIENTS)]
            results = await asyncio.wait_for(asyncio.gather(*streams), RUN_TIMEOUT_S)
        finally:
            stop.set()
            latencies = await poller
    return results, latencies


def test_32_concurrent_streams_finish_while_health_stays_fast(busy_server: ServerThread, run_dir: Path) -> None:
    root = busy_server.base_url.removesuffix("/v1")
    results, latencies = asyncio.run(run_load(root))

    assert len(results) == CLIENTS
    for result in results:
        assert result.saw_done, "a stream ended without data: [DONE]"
        assert result.finish_reason in ("stop", "length")
        assert result.turn_id.startswith("chatcmpl-")
    assert len({result.turn_id for result in results}) == CLIENTS

    # The polls really overlapped the load, and none was held up by the decoding.
    assert len(latencies) >= 5, f"only {len(latencies)} health polls ran during the load"
    slow = [latency for latency in latencies if latency >= HEALTH_DEADLINE_S]
    assert len(slow) <= len(latencies) // 20, f"{len(slow)} of {len(latencies)} /healthz polls took {HEALTH_DEADLINE_S * 1000:.0f} ms or more"
    assert max(latencies) < HEALTH_STALL_S, f"slowest /healthz took {max(latencies) * 1000:.0f} ms"

    # Every answer a client saw in full is in the store, as it was streamed.
    store = Store.for_run_dir(run_dir)
    try:
        for result in results:
            turn = store.turns.turn(result.turn_id)
            assert turn is not None, f"turn {result.turn_id} was streamed but not recorded"
            assert turn.finish_reason == result.finish_reason
            assert turn.response_text == result.content
            assert 1 <= len(turn.response_token_ids) <= MAX_TOKENS
        sessions = store.turns.list_sessions(limit=1000)
        assert sum(session.num_turns for session in sessions) == CLIENTS
    finally:
        store.close()
