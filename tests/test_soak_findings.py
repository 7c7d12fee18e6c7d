"""What the soak (benchmarks/soak.py, issue 16) found wrong in the server, as regression tests:
each failed before its fix.

One more finding, a request crossing the server's close of an idle keep-alive connection, needs a
live server and timing: benchmarks/keepalive_race.py reproduces it, tests/test_ops.py tests the fix."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy import event

from clawrl.config import ServeConfig
from clawrl.serve.completions import ChatService
from clawrl.serve.metrics import ServeMetrics
from clawrl.serve.sessions import resolve_session
from clawrl.store import Store
from clawrl.versions.follower import PolicyFollower
from clawrl.store.records import judgment_row, turn_row
from clawrl.store.schema import SampleRow, SessionRow
from tests.helpers import judgment, record, running_hf_engine, turn, user


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
    `self.record(...)`, which is `asyncio.to_thread(store.turns.record_turn, ...)` on the event loop's
    default executor (min(32, CPUs + 4) threads: 6 on 2 cores, shared with every request's
    prompt rendering and session lookup). If the client hangs up then, Starlette cancels the
    response task; cancelling the awaited future also cancels the executor's work item when no
    thread has picked it up yet, so `record_turn` never runs, and since `generation.result` is
    already set, `record_cancelled` is not called either. Here the executor has one thread, held
    busy, so the write is still queued when the client goes."""

    async def scenario() -> tuple[str, Any]:
        async with running_hf_engine(tiny_model_dir, cpu_threads=1) as engine:
            store = Store.for_run_dir(tmp_path)
            metrics = ServeMetrics(store)
            policy = PolicyFollower(engine, store, metrics.registry, poll_s=1.0)
            service = ChatService(engine, store, ServeConfig(), metrics, {engine.model_name}, policy)
            loop = asyncio.get_running_loop()
            loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
            body = {"model": engine.model_name, "messages": [user("hi")], "max_tokens": 4, "stream": True}
            prepared = await service.prepare(body, {})
            generation = await service.start(prepared)
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
            return prepared.turn.id, store.turns.turn(prepared.turn.id)

    turn_id, turn = asyncio.run(scenario())
    assert turn is not None, f"turn {turn_id} was generated and its client had its first events, but it was never recorded"


def _store_with_history(path: Path, settled_turns: int) -> Store:
    """`settled_turns` main turns already judged and trained on (history neither the judge nor the
    trainer has anything left to do with), then four turns continued by a next state, waiting
    for the judge, and four judged turns waiting for the trainer."""
    store = Store.for_run_dir(path)
    with store.write() as db:
        for index in range(settled_turns):
            db.add(SessionRow(id=f"s{index}", id_source="new", created_at=index, updated_at=index, num_turns=1))
            db.add(turn_row(turn(f"t{index}", f"s{index}", [user(f"q{index}")], "a", index=0, created_at=float(index))))
        db.flush()
        for index in range(settled_turns):
            db.add(judgment_row(judgment(f"t{index}", 1)))
            db.add(SampleRow(turn_id=f"t{index}", status="trained", kind="rl", reward=1.0, behaviour_version=0, created_at=index))
    for index in range(4):
        record(store, f"j{index}", f"sj{index}", [user("q")], "A.")
        record(store, f"k{index}", f"sj{index}", [user("q"), assistant("A."), user("thanks")], "B.",
               continues_turn_id=f"j{index}", next_state=[user("thanks")])
    for index in range(4):
        record(store, f"m{index}", f"sm{index}", [user("q")], "A.")
        record(store, f"n{index}", f"sm{index}", [user("q"), assistant("A."), user("thanks")], "B.",
               continues_turn_id=f"m{index}", next_state=[user("thanks")])
        store.judging.record_judgment(judgment(f"m{index}", 1))
    return store


def _vm_steps(store: Store, work: Any) -> int:
    """SQLite virtual-machine steps (in thousands) that `work()` costs on `store`: a measure of the
    rows a query visits that does not depend on the machine's speed or load."""
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    def hook(connection: Any, *_args: Any) -> None:
        connection.connection.dbapi_connection.set_progress_handler(count, 1000)

    event.listen(store.engine, "before_cursor_execute", hook)
    try:
        work()
    finally:
        event.remove(store.engine, "before_cursor_execute", hook)
    return steps[0]


def test_claiming_turns_to_judge_does_not_slow_down_as_the_store_grows(tmp_path: Path) -> None:
    """In the 30-minute soak the judge fell behind for good: judge lag 0.3 s in the first three
    minutes, 58 s in the next three, 17 minutes by the middle, and 26,841 of 47,280 judgeable turns
    never judged; so every sample the trainer built after minute 5 was stale and publishing stopped.
    `Store.claim_turns_to_judge` was a query over all turns (SQLite plan: SCAN turns, four
    correlated EXISTS per row, then a temp B-tree for ORDER BY created_at), run on each claim of
    `--judge-concurrency` (4) turns while holding the write lock that serving's turn writes wait
    on: 9 ms with 7,000 main turns, 133 ms with 112,000 (the soak's store, on an idle machine). It
    now reads the judge queue. Four turns are waiting in both stores here; one has 40 times the
    history."""
    small = _store_with_history(tmp_path / "small", 500)
    large = _store_with_history(tmp_path / "large", 20_000)
    claimed: list[list[str]] = []
    small_steps = _vm_steps(small, lambda: claimed.append(small.judging.claim_turns_to_judge("w", 4, 60.0)))
    large_steps = _vm_steps(large, lambda: claimed.append(large.judging.claim_turns_to_judge("w", 4, 60.0)))
    assert [sorted(ids) for ids in claimed] == [["j0", "j1", "j2", "j3"]] * 2
    assert large_steps <= 3 * max(small_steps, 1), (small_steps, large_steps)


def test_finding_judged_turns_to_sample_does_not_slow_down_as_the_store_grows(tmp_path: Path) -> None:
    """The trainer's poll for judged turns with no sample yet joined every judgment with the
    samples table (a scan of all judgments per poll), the same growth as the judge's claim; it
    now reads the sample queue."""
    small = _store_with_history(tmp_path / "small", 500)
    large = _store_with_history(tmp_path / "large", 20_000)
    found: list[list[str]] = []

    def poll(store: Store) -> int:
        training = store.training
        return _vm_steps(store, lambda: found.append([judged.turn.id for judged in training.judged_turns_without_sample(4)]))

    small_steps, large_steps = poll(small), poll(large)
    assert found == [["m0", "m1", "m2", "m3"]] * 2
    assert large_steps <= 3 * max(small_steps, 1), (small_steps, large_steps)


def test_finding_a_requests_session_does_not_slow_down_as_the_users_sessions_grow(tmp_path: Path) -> None:
    """Every request looks for its session before it is answered: by the fingerprint of an answer it
    echoes, by a recent empty answer it may retry, or (a side request) among the user's latest
    sessions. Once sessions had owners (schema v8), SQLite's planner served the first two from the
    index by user, walking every session of the user and its turns: 8 and 11 ms a request with
    20,000 sessions, all of the default user as in a run without users, and growing with them; the
    third sorted all of the user's sessions. Here one store has 40 times the other's history, and
    each lookup finds the same."""
    small = _store_with_history(tmp_path / "small", 500)
    large = _store_with_history(tmp_path / "large", 20_000)
    continuing = [user("q"), assistant("A."), user("thanks"), assistant("B."), user("and one more thing")]
    title = [user("Give this conversation a title of three words.")]  # quotes none of them: read among the latest

    def lookups(store: Store) -> tuple[int, list[tuple[str, str]]]:
        found: list[tuple[str, str]] = []

        def work() -> None:
            for messages, kind in ((continuing, "main"), ([user("a conversation of its own")], "main"), (title, "side")):
                identity = resolve_session(store, None, messages, kind)
                found.append((identity.id_source, identity.session_id if identity.id_source == "inferred" else ""))

        return _vm_steps(store, work), found

    (small_steps, small_found), (large_steps, large_found) = lookups(small), lookups(large)
    assert small_found == large_found
    assert [source for source, _ in large_found] == ["inferred", "new", "new"] and large_found[0][1].startswith(("sj", "sm"))
    assert large_steps <= 3 * max(small_steps, 1), (small_steps, large_steps)
