"""What finding a request's session costs (`serve.sessions.resolve_session`) as a user's sessions pile up.

Every request is matched to its session before its turn is written: by the fingerprint of an answer
it echoes (a conversation going on), by a recent empty answer it may retry (a new conversation), or,
for a side request (a title, a summary), among the user's latest sessions. Each store here holds N
settled sessions of the default user (one answered turn each, written in bulk, as a run without
users accumulates them) and four live conversations recorded as serving records them. Each lookup is
timed as serving makes it, the median of `--lookups`, with:

- after: the lookups as they are (schema v14);
- before: as up to schema v13, on a copy of the same store: its index by user alone, and the
  lookups' owner condition as a plain `sessions.user_id = ?`, which SQLite's planner answered by
  walking every session of the user and each one's turns.

Both must find the same sessions; the script checks it on every store.

    python benchmarks/session_lookup.py
    python benchmarks/session_lookup.py --history 0,2000,20000,50000 --out docs/results/session-lookup.json

Prints a markdown table and writes the figures as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from machine import machine  # benchmarks/machine.py, beside this script

import clawrl.store.turns as turn_store
from clawrl.messages import conversation_hashes, recorded_fingerprint
from clawrl.serve.sessions import SessionIdentity, resolve_session
from clawrl.store import Store
from clawrl.store.schema import SessionRow
from clawrl.types import Message, Turn, TurnSampling

LIVE = 4  # conversations going on in every store


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant(text: str) -> Message:
    return {"role": "assistant", "content": text}


def answered(turn_id: str, session_id: str, messages: list[Message], answer: str) -> Turn:
    """A main turn as serving records it: found again by its answer's fingerprint."""
    hashes = conversation_hashes(messages)
    return Turn(id=turn_id, session_id=session_id, kind="main", model="bench", policy_version=0, messages=messages,
                tools=None, sampling=TurnSampling(), prompt_token_ids=[1, 2, 3], response_token_ids=[4, 5],
                response_logprobs=[-0.1, -0.2], response_text=answer, tool_calls=None, finish_reason="stop",
                answer_fingerprint=recorded_fingerprint(answer, None, hashes), message_hashes=hashes)  # fmt: skip


def build(path: Path, history: int) -> None:
    """A store with `history` settled sessions (copies of one recorded turn, each with its own answer)
    and LIVE conversations three answers long (their latest turn recorded)."""
    store = Store.for_run_dir(path)
    store.turns.record_turn(answered("template", "s-template", [user("q")], "a settled answer"), "new", None, False)
    for index in range(LIVE):
        *prompt, answer, _next = conversation(index)
        store.turns.record_turn(answered(f"live{index}", f"live{index}", prompt, answer["content"]), "new", None, False)
    store.close()
    with sqlite3.connect(path / "clawrl.db") as db:
        db.row_factory = sqlite3.Row
        template = dict(db.execute("SELECT * FROM turns WHERE id = 'template'").fetchone())
        session = dict(db.execute("SELECT * FROM sessions WHERE id = 's-template'").fetchone())
        old = time.time() - 86_400  # settled a day ago: outside the ten minutes an empty answer is retried in
        sessions = [{**session, "id": f"h{index}", "created_at": old + index / 1000, "updated_at": old + index / 1000}
                    for index in range(history)]  # fmt: skip
        turns = [{**template, "id": f"h{index}", "session_id": f"h{index}", "created_at": old + index / 1000,
                  "answer_fingerprint": f"settled-{index}"} for index in range(history)]  # fmt: skip
        for table, rows in (("sessions", sessions), ("turns", turns)):
            if rows:
                columns = ", ".join(f'"{name}"' for name in rows[0])
                db.executemany(f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' * len(rows[0]))})",
                               [tuple(row.values()) for row in rows])  # fmt: skip


def conversation(index: int) -> list[Message]:
    """Live conversation `index` so far, with the user's next message last; the answers are the same in
    every one (as a model's often are), what the users typed is not."""
    return [user(f"Plan a picnic for {index + 3} friends by the river."), assistant("Bring bread, fruit and blankets."),
            user(f"and if it rains on day {index + 1}?"), assistant("Take a tarp and find a spot under the trees."),
            user(f"what games could {index + 3} of us play?"), assistant("Frisbee, cards and a quiz about the river."),
            user("make the quiz questions")]  # fmt: skip


def requests() -> dict[str, tuple[list[Message], str]]:
    return {"conversation going on": (conversation(0), "main"), "new conversation": ([user("What is a good name for a cat?")], "main"),
            "side request": ([user("Give this conversation a title of three words.")], "side")}  # fmt: skip


@contextmanager
def as_before(path: Path) -> Iterator[Path]:
    """A copy of the store at `path` with the v13 index, looked up with the v13 owner condition."""
    copy = path.with_name(path.name + "-before")
    shutil.copytree(path, copy)
    with sqlite3.connect(copy / "clawrl.db") as db:
        db.execute("DROP INDEX ix_sessions_user_recent")
        db.execute("CREATE INDEX ix_sessions_user_id ON sessions (user_id)")
    owner_is = turn_store._owner_is
    turn_store._owner_is = lambda user_id: SessionRow.user_id == user_id
    try:
        yield copy
    finally:
        turn_store._owner_is = owner_is


def timed(store: Store, messages: list[Message], kind: str, lookups: int) -> tuple[float, SessionIdentity]:
    found = resolve_session(store, None, messages, kind)  # type: ignore[arg-type]
    times = []
    for _ in range(lookups):
        started = time.perf_counter()
        resolve_session(store, None, messages, kind)  # type: ignore[arg-type]
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000, found


@contextmanager
def as_after(path: Path) -> Iterator[Path]:
    yield path


def measure(path: Path, lookups: int) -> dict[str, Any]:
    figures: dict[str, dict[str, Any]] = {name: {} for name in requests()}
    for side, opened in (("after", as_after), ("before", as_before)):
        with opened(path) as store_path:
            store = Store.for_run_dir(store_path)
            try:
                for name, (messages, kind) in requests().items():
                    ms, identity = timed(store, messages, kind, lookups)
                    found = identity.session_id if identity.id_source == "inferred" else identity.id_source
                    if figures[name].setdefault("found", found) != found:
                        raise AssertionError(f"{name}: before and after found different sessions")
                    figures[name][f"{side}_ms"] = round(ms, 3)
            finally:
                store.close()
    return figures


def table(results: dict[int, dict[str, Any]]) -> str:
    lines = ["| settled sessions | lookup | found | before (ms) | after (ms) |", "|---:|---|---|---:|---:|"]
    for history, figures in results.items():
        for name, row in figures.items():
            lines.append(f"| {history:,} | {name} | {row['found']} | {row['before_ms']:.3f} | {row['after_ms']:.3f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", default="0,2000,20000", help="comma-separated numbers of settled sessions")
    parser.add_argument("--lookups", type=int, default=50, help="timed lookups per request kind (the median is kept)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for history in (int(value) for value in args.history.split(",")):
            path = Path(scratch) / f"history-{history}"
            build(path, history)
            results[history] = measure(path, args.lookups)
    print(table(results))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        command = "python benchmarks/session_lookup.py --history " + args.history + f" --lookups {args.lookups}"
        args.out.write_text(json.dumps({"benchmark": "session_lookup", "command": command, "machine": machine(),
                                        "results": {str(key): value for key, value in results.items()}}, indent=1) + "\n")  # fmt: skip
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
