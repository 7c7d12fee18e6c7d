"""What a durable turn write costs: SQLite (the default) against PostgreSQL, one writer and many.

Every answer waits for its turn to be committed (DESIGN §2), so this latency is part of every
request. Each write is what serving records for a real turn: a prompt of `--prompt-tokens` ids, a
response of `--response-tokens` ids with their log-probs, a few messages of text, and (for every
turn after a session's first) the next state of the turn before it. Writers are threads sharing
one `Store`, as the server's worker threads do; each writer plays its own sessions of
`--turns-per-session` turns.

    python benchmarks/store_writes.py --turns 2000 --writers 1,8
    python benchmarks/store_writes.py --turns 2000 --writers 1,8 --encrypted
    python benchmarks/store_writes.py --turns 2000 --writers 1,8 --database-url postgresql+psycopg://USER@HOST:PORT/DB

Prints a markdown table and writes the figures as JSON (`--out`). The PostgreSQL database should
be empty: the benchmark writes into it and does not clean up.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from clawrl.messages import answer_fingerprint, conversation_hashes
from clawrl.store import Store
from clawrl.store.encryption import KeyRing, new_key
from clawrl.types import NextState, Turn, TurnSampling
from machine import machine  # benchmarks/machine.py, beside this script


def turn_for(session_id: str, index: int, args: argparse.Namespace, rng: random.Random) -> Turn:
    """A turn of realistic size (its request's last message is the next state of the one before)."""
    messages = [{"role": "system", "content": "You are a helpful assistant. " * 20}]
    for earlier in range(index + 1):
        messages.append({"role": "user", "content": f"question {earlier}: " + "words " * 60})
        if earlier < index:
            messages.append({"role": "assistant", "content": f"answer {earlier}: " + "words " * 80})
    answer = f"answer {index}: " + "words " * 80
    return Turn(
        id=f"chatcmpl-{uuid.uuid4().hex}", session_id=session_id, kind="main", model="bench",
        policy_version=0, messages=messages, tools=None, sampling=TurnSampling(temperature=1.0, max_tokens=256),
        prompt_token_ids=[rng.randrange(150_000) for _ in range(args.prompt_tokens)],
        response_token_ids=[rng.randrange(150_000) for _ in range(args.response_tokens)],
        response_logprobs=[-rng.random() * 3 for _ in range(args.response_tokens)],
        response_text=answer, tool_calls=None, finish_reason="stop", answer_fingerprint=answer_fingerprint(answer, None),
        message_hashes=conversation_hashes(messages), latency_s=0.5,
    )  # fmt: skip


def run_level(store: Store, writers: int, args: argparse.Namespace) -> dict[str, Any]:
    """`args.turns` turns written by `writers` threads; latency per write and turns per second."""
    per_writer = args.turns // writers
    latencies: list[float] = []
    lock = threading.Lock()

    def writer(number: int) -> None:
        rng = random.Random(number)
        previous: str | None = None
        mine: list[float] = []
        for count in range(per_writer):
            index = count % args.turns_per_session
            if index == 0:
                session_id, previous = f"bench-{uuid.uuid4().hex}", None
            turn = turn_for(session_id, index, args, rng)
            continues = NextState(previous, [turn.messages[-1]], turn.id) if previous is not None else None
            started = time.perf_counter()
            store.turns.record_turn(turn, "header", continues)
            mine.append(time.perf_counter() - started)
            previous = turn.id
        with lock:
            latencies.extend(mine)

    started = time.perf_counter()
    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(writer, range(writers)))
    wall = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "writers": writers,
        "turns": len(latencies),
        "wall_s": round(wall, 2),
        "turns_per_s": round(len(latencies) / wall, 1),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=2000, help="turns written at each writer count")
    parser.add_argument("--writers", default="1,8", help="comma-separated writer thread counts")
    parser.add_argument("--turns-per-session", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--response-tokens", type=int, default=256)
    parser.add_argument("--database-url", help="also measure this PostgreSQL database (SQLAlchemy URL)")
    parser.add_argument("--encrypted", action="store_true",
                        help="also SQLite with a data key (--encrypt-key-file): what encryption at rest adds to a write")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/store_writes.json"))
    args = parser.parse_args()
    levels = [int(value) for value in args.writers.split(",")]

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        backends = [("SQLite (WAL, synchronous=FULL)", Store.for_run_dir(Path(scratch)))]
        if args.encrypted:
            keys = KeyRing.from_text(new_key(), "a fresh key")
            backends.append(("SQLite, encrypted (AES-256-GCM)", Store.for_run_dir(Path(scratch) / "encrypted", keys)))
        if args.database_url:
            backends.append(("PostgreSQL", Store(args.database_url)))
        for name, store in backends:
            run_level(store, 1, argparse.Namespace(**{**vars(args), "turns": 50}))  # warm-up: connections, caches
            for writers in levels:
                rows.append({"backend": name, **run_level(store, writers, args)})
                print(f"{name}: {rows[-1]}", flush=True)
            store.close()

    print("\n| store | writers | turns | turns/s | mean write (ms) | median (ms) | p99 (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['backend']} | {row['writers']} | {row['turns']} | {row['turns_per_s']} | {row['mean_ms']} | "
              f"{row['median_ms']} | {row['p99_ms']} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine(), "settings": {k: str(v) for k, v in vars(args).items()
                                                                         if k not in ("database_url", "out")},
                                    "results": rows}, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
