"""What one trainer poll for episode groups costs (`EpisodeStore.groups_to_sample`) as trained groups pile up.

The trainer polls the store for groups whose episodes have all ended and some of whose steps have no
sample yet, every `--train-poll-s`. Each store here holds `--waiting` such groups (played through the
store as serving records them: registered, stepped, ended), `--running` groups with an episode still
running, and N groups trained before (every step with its sample, `--group-size` episodes of
`--steps` steps each, written in bulk). A poll is timed as the trainer makes it (the group ids, then
each group's episodes and steps), the median of `--polls` polls, and its first read alone (the group
ids: the part whose cost followed the history), with:

- after: `groups_to_sample` as it is (schema v13: only groups with an episode not `sampled` are looked at);
- before: the query it ran up to schema v12, inline below (`old_groups_to_sample`): a GROUP BY over every
  episode with a correlated EXISTS over turns and samples for each, on the same store.

Both must return the same groups; the script checks it on every store.

    python benchmarks/episode_polling.py
    python benchmarks/episode_polling.py --history 0,2000,20000 --polls 200 --out docs/results/episode-polling.json

Prints a markdown table and writes the figures as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Select, case, exists, func, select

from clawrl.messages import conversation_hashes
from clawrl.store import Store
from clawrl.store.episodes import EpisodeGroup, groups_to_sample_query
from clawrl.store.schema import EpisodeRow, SampleRow, SessionRow, TurnRow
from clawrl.types import Episode, NextState, Turn, TurnSampling
from machine import machine  # benchmarks/machine.py, beside this script

CHUNK = 5000  # rows per bulk insert


def old_query(limit: int) -> Select[tuple[str]]:
    """The group ids `EpisodeStore.groups_to_sample` read up to schema v12, word for word."""
    ended = func.sum(case((EpisodeRow.status != "running", 1), else_=0))
    unsampled = exists().where(
        TurnRow.session_id == EpisodeRow.session_id, TurnRow.kind == "main", ~exists().where(SampleRow.turn_id == TurnRow.id)
    )
    return (
        select(EpisodeRow.group_id)
        .group_by(EpisodeRow.group_id)
        .having(ended >= func.min(EpisodeRow.group_size))
        .having(func.max(case((unsampled, 1), else_=0)) == 1)
        .order_by(func.min(EpisodeRow.created_at))
        .limit(limit)
    )


def old_groups_to_sample(store: Store, limit: int) -> list[EpisodeGroup]:
    """`EpisodeStore.groups_to_sample` up to schema v12: the old query, then each group's episodes and steps."""
    with store.read() as db:
        return [store.episodes._group(db, group_id) for group_id in db.scalars(old_query(limit))]


def group_ids(store: Store, query: Select[tuple[str]]) -> list[str]:
    """The poll's first read alone: the part whose cost followed the history."""
    with store.read() as db:
        return list(db.scalars(query))


def step(session_id: str, index: int) -> Turn:
    """A small main turn: what a poll reads of it does not grow with its prompt."""
    messages = [{"role": "user", "content": f"step {index}"}]
    return Turn(
        id=f"{session_id}-t{index}", session_id=session_id, kind="main", model="bench", policy_version=0, messages=messages,
        tools=None, sampling=TurnSampling(), prompt_token_ids=[1, 2, 3], response_token_ids=[4, 5], response_logprobs=[-0.1, -0.2],
        response_text=f"answer {index}", tool_calls=None, finish_reason="tool_calls", answer_fingerprint=None,
        message_hashes=conversation_hashes(messages), latency_s=0.1,
    )  # fmt: skip


def write_history(store: Store, groups: int, args: argparse.Namespace) -> None:
    """`groups` finished groups whose every step has its sample, as the trainer leaves them (`sampled` set)."""
    now = time.time() - 86400
    sessions: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    episodes: list[dict[str, Any]] = []
    for group in range(groups):
        for seed in range(args.group_size):
            session_id = f"old-{group}-{seed}"
            created = now + group * 0.01 + seed * 0.001
            sessions.append({"id": session_id, "id_source": "header", "created_at": created, "updated_at": created, "done": True,
                             "done_reason": "client", "num_turns": args.steps})  # fmt: skip
            episodes.append({"session_id": session_id, "env": "toolcall", "task": f"task-{group}", "group_id": f"old-{group}",
                             "group_size": args.group_size, "seed": seed, "status": "finished", "reward": float(seed % 2),
                             "step_rewards": [0.0] * (args.steps - 1) + [float(seed % 2)], "error": None, "created_at": created,
                             "ended_at": created + 1, "sampled": True})  # fmt: skip
            for index in range(args.steps):
                turn = step(session_id, index)
                turns.append({**{name: getattr(turn, name) for name in TURN_FIELDS}, "index": index, "created_at": created,
                              "sampling": {}, "opt_out": None, "memory_note_ids": None})  # fmt: skip
                samples.append({"turn_id": turn.id, "status": "trained", "kind": "rl", "reward": 0.5, "behaviour_version": 0,
                                "trained_version": 1, "created_at": created + 2, "settled_at": created + 3})  # fmt: skip
    with store.write() as db:
        connection = db.connection()
        for table, rows in ((SessionRow, sessions), (TurnRow, turns), (SampleRow, samples), (EpisodeRow, episodes)):
            for start in range(0, len(rows), CHUNK):
                connection.execute(table.__table__.insert(), rows[start : start + CHUNK])


TURN_FIELDS = ("id", "session_id", "kind", "model", "policy_version", "messages", "tools", "prompt_token_ids", "response_token_ids",
               "response_logprobs", "response_text", "tool_calls", "finish_reason", "answer_fingerprint", "message_hashes",
               "latency_s")  # fmt: skip


def play(store: Store, session_id: str, group_id: str, seed: int, args: argparse.Namespace, end: bool) -> None:
    """One episode through the store as serving records it; left running unless `end`."""
    store.episodes.start(Episode(session_id, "toolcall", "task", group_id, args.group_size, seed))
    for index in range(args.steps):
        continues = NextState(f"{session_id}-t{index - 1}", [{"role": "tool", "content": "ok"}], f"{session_id}-t{index}") if index else None
        store.turns.record_turn(step(session_id, index), "header", continues)
    if end:
        store.episodes.end(session_id, "finished", float(seed % 2), [0.0] * (args.steps - 1) + [float(seed % 2)], None,
                           [{"role": "tool", "content": "done"}])  # fmt: skip


def median_ms(poll: Callable[[], Any], polls: int) -> float:
    times = []
    for _ in range(polls):
        started = time.perf_counter()
        poll()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def measure(history: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        store = Store.for_run_dir(Path(directory))
        built = time.perf_counter()
        write_history(store, history, args)
        for group in range(args.waiting):
            for seed in range(args.group_size):
                play(store, f"wait-{group}-{seed}", f"wait-{group}", seed, args, end=True)
        for group in range(args.running):
            for seed in range(args.group_size):
                play(store, f"run-{group}-{seed}", f"run-{group}", seed, args, end=seed > 0)
        built = time.perf_counter() - built
        new = [group.group_id for group in store.episodes.groups_to_sample(args.limit)]
        old = [group.group_id for group in old_groups_to_sample(store, args.limit)]
        assert new == old == [f"wait-{group}" for group in range(args.waiting)][: args.limit], (new, old)
        old_polls = max(args.polls // 4, 5) if history else args.polls
        after = median_ms(lambda: store.episodes.groups_to_sample(args.limit), args.polls)
        before = median_ms(lambda: old_groups_to_sample(store, args.limit), old_polls)
        after_ids = median_ms(lambda: group_ids(store, groups_to_sample_query(args.limit)), args.polls)
        before_ids = median_ms(lambda: group_ids(store, old_query(args.limit)), old_polls)
        with store.read() as db:
            counts = {name: db.scalar(select(func.count()).select_from(table)) for name, table in
                      (("episodes", EpisodeRow), ("turns", TurnRow), ("samples", SampleRow))}  # fmt: skip
        store.close()
    return {"trained_groups": history, "waiting_groups": args.waiting, "running_groups": args.running, **counts,
            "before_ms": round(before, 3), "after_ms": round(after, 3), "before_ids_ms": round(before_ids, 3),
            "after_ids_ms": round(after_ids, 3), "build_s": round(built, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--history", default="0,2000,20000", help="Trained groups in the store, comma-separated: one store each.")
    parser.add_argument("--waiting", type=int, default=4, help="Ended groups with steps still to sample.")
    parser.add_argument("--running", type=int, default=2, help="Groups with an episode still running.")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2, help="Steps (main turns) per episode.")
    parser.add_argument("--limit", type=int, default=16, help="Groups per poll (EpisodeSampleBuilder.build's default).")
    parser.add_argument("--polls", type=int, default=200, help="Polls timed per store (a quarter of them for 'before').")
    parser.add_argument("--out", type=Path, default=Path("docs/results/episode-polling.json"))
    args = parser.parse_args()
    rows = [measure(int(history), args) for history in args.history.split(",")]
    print("| trained groups | episodes | turns | poll before (v12), ms | poll after (v13), ms | group ids before, ms | group ids after, ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['trained_groups']:,} | {row['episodes']:,} | {row['turns']:,} | {row['before_ms']:.2f} | {row['after_ms']:.2f} "
              f"| {row['before_ids_ms']:.2f} | {row['after_ids_ms']:.2f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {key: getattr(args, key) for key in ("waiting", "running", "group_size", "steps", "limit", "polls")}
    args.out.write_text(json.dumps({"machine": machine(backend="sqlite"), "settings": settings, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
