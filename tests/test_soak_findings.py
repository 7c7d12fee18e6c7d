"""What the soak (benchmarks/soak.py, issue 16) found wrong in the server, as regression tests:
each failed before its fix.

The other finding, a request crossing the server's close of an idle keep-alive connection, needs a
live server and timing: benchmarks/keepalive_race.py reproduces it, tests/test_ops.py tests the fix."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from clawrl.config import ServeConfig
from clawrl.serve.completions import ChatService
from clawrl.serve.metrics import ServeMetrics
from clawrl.serve.sessions import resolve_session
from clawrl.store import Store
from tests.helpers import record, running_hf_engine, user


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def test_a_conversation_whose_first_answer_was_empty_is_still_continued(tmp_path: Path) -> None:
    """The untrained tiny model answered the first turn of an unmodified client's session with
    nothing (EOS first) about once in a two-minute soak; the client echoed the empty answer and
    sent its correction, and the server opened a new session: the first turn lost its next state
    (the correction, so its -1 and hint) and the conversation was split in two. An empty answer
    has no fingerprint, and `_past_empty_answers` only looks past empty answers that follow a
    recognised one; here none does."""
    store = Store.for_run_dir(tmp_path)
    record(store, "t-other", "s-other", [user("something else entirely")], "An answer.")
    record(store, "t1", "s1", [user("write a short note to my team about Friday")], "")
    request = [user("write a short note to my team about Friday"), assistant(""), user("no, shorter please")]
    identity = resolve_session(store, None, request, "main")
    assert identity.session_id == "s1"
    assert identity.continues_turn_id == "t1"
    assert identity.next_state == [user("no, shorter please")]


def test_a_stream_hung_up_while_its_turn_waits_to_be_written_is_still_recorded(tiny_model_dir: Path, tmp_path: Path) -> None:
    """One of about 700 hung-up streams in a two-minute soak was never recorded, neither finished
    nor cancelled. When a stream's generation has ended, `ChatService.stream` awaits
    `self.record(...)`, which is `asyncio.to_thread(store.record_turn, ...)` on the event loop's
    default executor (min(32, CPUs + 4) threads: 6 on 2 cores, shared with every request's
    prompt rendering and session lookup). If the client hangs up then, Starlette cancels the
    response task; cancelling the awaited future also cancels the executor's work item when no
    thread has picked it up yet, so `record_turn` never runs, and since `generation.result` is
    already set, `_record_cancelled` is not called either. Here the executor has one thread, held
    busy, so the write is still queued when the client goes."""

    async def scenario() -> tuple[str, Any]:
        async with running_hf_engine(tiny_model_dir, cpu_threads=1) as engine:
            store = Store.for_run_dir(tmp_path)
            service = ChatService(engine, store, ServeConfig(), ServeMetrics(store), {engine.model_name})
            loop = asyncio.get_running_loop()
            loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
            body = {"model": engine.model_name, "messages": [user("hi")], "max_tokens": 4, "stream": True}
            prepared = await service.prepare(body, {})
            generation = service.start(prepared)
            events = service.stream(generation)
            release = threading.Event()
            busy = loop.run_in_executor(None, release.wait)  # every worker thread is busy

            async def client() -> None:
                async for _event in events:
                    pass

            reading = asyncio.create_task(client())
            while generation.result is None:  # generation has ended; the stream goes on to record the turn
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            reading.cancel()  # the client hangs up, as Starlette cancels the response on http.disconnect
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            assert reading.cancelled()  # it hung up before the stream's end (before the finish chunk)
            await events.aclose()  # what serve/app.py's _timed does on the way out
            release.set()
            await busy
            await service.drain()
            await asyncio.sleep(0.5)
            return prepared.turn.id, store.turn(prepared.turn.id)

    turn_id, turn = asyncio.run(scenario())
    assert turn is not None, f"turn {turn_id} was generated and its client had its first events, but it was never recorded"
