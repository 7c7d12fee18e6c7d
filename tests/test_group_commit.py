"""The lean request path (issue 29 item 9): turns that finish together share one commit (group
commit), every answer still waits for the commit that holds its turn, and the session lookup that
now runs beside generation still decides the session that is recorded."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from clawrl.serve.completions import TurnCommits
from clawrl.serve.runner import free_port
from clawrl.store import Store
from clawrl.store.turns import TurnWrite
from tests.helpers import start_server, turn, user
from tests.test_durability import serve_process

CLIENTS = 8
COMMIT_DELAY_S = 0.3  # a slow disk: the turns that finish meanwhile must wait for the next commit


def chat(messages: list[dict[str, Any]], stream: bool, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": messages, "max_tokens": 8, "stream": stream, **extra}


def test_turns_that_finish_together_share_a_commit_and_each_answer_waits_for_its_own(tiny_model_dir: Path, run_dir: Path) -> None:
    """Eight clients at once (one engine batch, so their turns finish on the same step) against a
    store whose commits take 300 ms: fewer commits than turns, and when a client has its answer
    (non-streaming) or its finish chunk (streaming), its turn is already committed."""
    with start_server(tiny_model_dir, run_dir, served_model_name="tiny") as server:
        commits: TurnCommits = server.app.state.service.commits
        store, record_turns = commits.store, commits.store.turns.record_turns
        committed: dict[str, float] = {}  # turn id -> when its commit returned

        def slow_record_turns(writes: list[TurnWrite]) -> list[int]:
            time.sleep(COMMIT_DELAY_S)
            indexes = record_turns(writes)
            done = time.perf_counter()
            committed.update((write.turn.id, done) for write in writes)
            return indexes

        store.turns.record_turns = slow_record_turns  # type: ignore[method-assign]
        received: dict[str, float] = {}  # turn id -> when its client saw the end of its answer
        found_on_arrival: dict[str, bool] = {}

        async def client(index: int, http: httpx.AsyncClient) -> None:
            body = chat([user(f"client {index}: tell me something")], stream=index % 2 == 1)
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                turn_id = response.headers["x-clawrl-turn"]
                async for line in response.aiter_lines():
                    if body["stream"] and '"finish_reason":"' in line or not body["stream"] and line:
                        break  # the finish chunk, or the (one-line) JSON answer
            received[turn_id] = time.perf_counter()
            found_on_arrival[turn_id] = store.turns.turn(turn_id) is not None

        async def clients() -> None:
            async with httpx.AsyncClient(base_url=server.base_url.removesuffix("/v1"), timeout=60) as http:
                await asyncio.gather(*(client(index, http) for index in range(CLIENTS)))

        asyncio.run(clients())

    assert len(received) == CLIENTS
    assert all(found_on_arrival.values()), found_on_arrival
    for turn_id, arrived in received.items():
        assert committed[turn_id] < arrived, f"{turn_id} answered before its commit returned"
    sizes = commits.batch_sizes
    assert sum(size * count for size, count in sizes.items()) == CLIENTS
    assert sum(sizes.values()) < CLIENTS, f"no turns shared a commit: {dict(sizes)}"
    check = Store.for_run_dir(run_dir)
    assert check.turns.counts()["main_turns"] == CLIENTS
    check.close()


def test_a_batch_that_fails_is_written_turn_by_turn(tmp_path: Path) -> None:
    """One turn that cannot be written (its id is taken) fails its own request only: the batch is
    rolled back and written again one turn at a time."""
    store = Store.for_run_dir(tmp_path)
    store.turns.record_turn(turn("t-taken", "s0", [user("q")], "A."), "new")
    commits = TurnCommits(store)
    writes = [TurnWrite(turn(turn_id, session, [user("q")], "A."), "new")
              for turn_id, session in [("t1", "s1"), ("t-taken", "s2"), ("t3", "s1")]]  # fmt: skip

    async def record_all() -> list[int | BaseException]:
        return await asyncio.gather(*(commits.record(write) for write in writes), return_exceptions=True)

    first, taken, third = asyncio.run(record_all())
    assert (first, third) == (0, 1)  # their session's indexes, in order
    assert isinstance(taken, Exception)
    assert commits.batch_sizes == {3: 1}  # all three went to one commit, which failed as a whole
    assert store.turns.turn("t1") is not None and store.turns.turn("t3") is not None
    assert store.turns.session("s2") is None  # the failed turn left nothing behind
    assert store.turns.session("s1").num_turns == 2
    store.close()


def test_a_failed_session_lookup_fails_the_request_and_records_nothing(tiny_model_dir: Path, run_dir: Path) -> None:
    """The session lookup runs beside generation now; when it fails, the request still fails
    (500) and nothing is recorded, and the next request is served."""
    with start_server(tiny_model_dir, run_dir, served_model_name="tiny") as server:
        store = server.app.state.service.store
        lookup = store.turns.recent_empty_answers
        failing = threading.Event()
        failing.set()

        def flaky(*args: Any, **kwargs: Any) -> Any:
            if failing.is_set():
                raise RuntimeError("the store is unreachable")
            return lookup(*args, **kwargs)

        store.turns.recent_empty_answers = flaky
        url = f"{server.base_url}/chat/completions"
        # a conversation this server never answered: the lookup reaches the retry check (a request of
        # one user message does not: it can be no retry)
        elsewhere = [user("hello"), {"role": "assistant", "content": "Hello! How can I help?"}, user("tell me a joke")]
        for stream in (False, True):
            response = httpx.post(url, json=chat(elsewhere, stream), timeout=60)
            assert response.status_code == 500
        failing.clear()
        response = httpx.post(url, json=chat([user("hello")], False), timeout=60)
        assert response.status_code == 200
        turn_id = response.headers["x-clawrl-turn"]
        assert store.turns.counts()["main_turns"] == 1 and store.turns.turn(turn_id) is not None


def test_sigkill_right_after_concurrent_answers_loses_none(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`clawrl serve` in its own process answers eight concurrent requests, half of them streamed
    (their turns grouped into shared commits), and is killed with SIGKILL the moment the last
    answer arrives: every answered turn is in the store."""
    run_dir, port = tmp_path / "run", free_port()
    with serve_process(tiny_model_dir, run_dir, port) as process:

        async def ask(index: int, http: httpx.AsyncClient) -> str:
            stream = index % 2 == 1
            response = await http.post("/v1/chat/completions", json=chat([user(f"question {index}")], stream))
            assert response.status_code == 200
            if stream:
                assert response.text.rstrip().endswith("data: [DONE]")
            return response.headers["x-clawrl-turn"]

        async def ask_all() -> list[str]:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                return await asyncio.gather(*(ask(index, http) for index in range(CLIENTS)))

        answered = asyncio.run(ask_all())
        process.send_signal(signal.SIGKILL)
        process.wait()
    store = Store.for_run_dir(run_dir)
    lost = [turn_id for turn_id in answered if store.turns.turn(turn_id) is None]
    store.close()
    assert not lost, f"answered turns lost: {lost}"
