"""What memory notes cost a conversation (issue 35, item 2): prompt tokens added per turn, the tokens
each turn must prefill past what the previous turn left cached, and time to first token.

A real server (`--memory on`, the tiny model's hf engine with its prefix cache) answers an
OpenClaw-shaped conversation: a long system prompt (the agent's instructions and workspace files)
resent whole on every turn, then user turns. Each arm is a fresh session of its own user holding
0, 4 or 16 notes (hint-sized sentences); in the `changed` arm a note arrives before turn 4, as a
correction's hint would. For every turn, from the recorded turns:

* `added`: prompt tokens over the same request rendered without notes (the notes' cost per turn);
* `prefill`: prompt tokens past the longest common prefix with the previous turn's prompt and
  answer, what a prefix cache cannot serve; beside it, the same count for the other placement
  considered, the notes as a message just before the last user message (rendered here, not served);
* `ttft_ms`: time to the first streamed token.

    python benchmarks/memory_notes.py --out docs/results/memory-notes.json

`--model DIR` serves another model instead, e.g. the Qwen3-0.6B architecture with random weights
(`clawrl model build-random --like qwen3-0.6b --out DIR`), for time to first token at a real size:
cost does not depend on the weights' values.

Token counts are the tiny model's tokenizer's (a small byte-level BPE: longer than Qwen's for the
same English); the ratios between arms and placements are what carries over.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from clawrl.config import EngineConfig, ServeConfig
from clawrl.engines import build_engine
from clawrl.model.chat import render_prompt
from clawrl.model.notes import notes_block, with_notes
from clawrl.serve.runner import ServerThread, free_port
from clawrl.sim.tiny import build_tiny_model
from clawrl.store import Store
from clawrl.types import MemoryNote, Message

ADMIN_KEY = "sk-bench-memory"
NOTES = [
    "Use fewer words and no lists.", "Answer in plain prose, without bold.", "End with a line that gives the answer.",
    "Keep a warm tone.", "Say which file you changed.", "Run the tests before you say it works.",
    "Prefer the standard library.", "Ask before deleting anything.", "Write dates as YYYY-MM-DD.",
    "Quote the error message exactly.", "Keep replies under five sentences.", "Name the command you ran.",
    "Use metric units.", "Do not apologise.", "Give one example, not a definition.", "Call me Sam.",
]
SYSTEM = ("You are a personal agent running inside OpenClaw. Tools: read, write, exec, browser, memory_search. "
          "Workspace files follow.\n## AGENTS.md\n" + "Be careful with the user's files; explain what you do. " * 12
          + "\n## TOOLS.md\n" + "exec runs a shell command in the workspace and returns its output. " * 8)
ASKS = ["What is in my workspace?", "Summarise README.md.", "No, shorter please.", "Rename notes.txt to todo.txt.",
        "Did it work?", "Now list the files again.", "Thanks. What is left to do?", "Add 'call the bank' to it."]


def common_prefix(a: list[int], b: list[int]) -> int:
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return min(len(a), len(b))


def before_last_user(messages: list[Message], notes: list[MemoryNote]) -> list[Message]:
    """The placement not chosen: the notes as a system message right before the last user message."""
    if not notes:
        return messages
    return [*messages[:-1], {"role": "system", "content": notes_block(notes)}, messages[-1]]


def run_arm(server: ServerThread, store: Store, tokenizer: Any, name: str, notes: int, changed_at: int | None,
            key: str) -> dict[str, Any]:  # fmt: skip
    """One session of user `name` through the server; per-turn figures from the recorded turns."""
    for text in NOTES[:notes]:
        store.memory.remember(name, text, "user", limit=len(NOTES))
    messages: list[Message] = [{"role": "system", "content": SYSTEM}]
    turns, previous, previous_alt = [], None, None
    for index, ask in enumerate(ASKS):
        if changed_at == index:
            store.memory.remember(name, "Say what you will do before you do it.", "hint", limit=len(NOTES))
        messages.append({"role": "user", "content": ask})
        started = time.perf_counter()
        first_token_s = None
        body = {"model": "tiny", "messages": messages, "max_tokens": 16, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body, timeout=120,
                          headers={"Authorization": f"Bearer {key}", "X-Session-Id": name}) as answer:  # fmt: skip
            assert answer.status_code == 200, answer.read().decode()
            turn_id = answer.headers["x-clawrl-turn"]
            for line in answer.iter_lines():
                if first_token_s is None and '"content":"' in line and '"content":""' not in line:
                    first_token_s = time.perf_counter() - started
        turn = store.turns.turn(turn_id)
        assert turn is not None
        injected = [note for note in store.memory.notes(name) if note.id in (turn.memory_note_ids or [])]
        plain = render_prompt(tokenizer, messages, None)
        alternative = render_prompt(tokenizer, before_last_user(messages, injected), None)
        assert turn.prompt_token_ids == render_prompt(tokenizer, with_notes(messages, injected), None)
        fed = turn.prompt_token_ids
        turns.append({
            "turn": index, "prompt_tokens": len(fed), "added": len(fed) - len(plain),
            "prefill": len(fed) - (common_prefix(fed, previous) if previous else 0),
            "prefill_before_last_user": len(alternative) - (common_prefix(alternative, previous_alt) if previous_alt else 0),
            "ttft_ms": 1000 * (first_token_s if first_token_s is not None else time.perf_counter() - started),
        })  # fmt: skip
        previous = fed + turn.response_token_ids
        previous_alt = alternative + turn.response_token_ids
        messages.append({"role": "assistant", "content": turn.response_text})
    later = turns[1:]  # the first turn prefills everything whatever the placement
    return {
        "arm": name, "notes": notes, "note_changed_before_turn": changed_at, "turns": turns,
        "added_per_turn": statistics.mean(turn["added"] for turn in turns),
        "prefill_per_later_turn": statistics.mean(turn["prefill"] for turn in later),
        "prefill_per_later_turn_before_last_user": statistics.mean(turn["prefill_before_last_user"] for turn in later),
        "ttft_ms_median_later_turns": statistics.median(turn["ttft_ms"] for turn in later),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    parser.add_argument("--repeats", type=int, default=3, help="sessions per arm (TTFT is the median over them)")
    parser.add_argument("--model", type=Path, default=None, help="a model directory to serve (default: the tiny model)")
    parser.add_argument("--cpu-threads", type=int, default=1, help="the engine's CPU threads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model or build_tiny_model(Path(scratch) / "model", seed=0)
        store = Store.for_run_dir(Path(scratch) / "run")
        engine = build_engine(EngineConfig(model=str(model_dir), device="cpu", cpu_threads=args.cpu_threads))
        config = ServeConfig(port=free_port(), api_key=ADMIN_KEY, served_model_name="tiny", memory="on",
                             memory_notes=len(NOTES))  # fmt: skip
        arms = [("none", 0, None), ("four", 4, None), ("sixteen", 16, None), ("changed", 4, 3)]
        results: list[dict[str, Any]] = []
        # every user is added before the server starts: it reads the keys it knows once a second
        keys = {(arm, repeat): store.users.add(f"{arm}-{repeat}")[1] for arm, _, _ in arms for repeat in range(args.repeats)}
        with ServerThread(engine, store, config) as server:
            for repeat in range(args.repeats):
                for arm, notes, changed_at in arms:
                    result = run_arm(server, store, engine.tokenizer, f"{arm}-{repeat}", notes, changed_at, keys[arm, repeat])
                    results.append(result | {"arm": arm})
    summary = {}
    for arm, notes, changed_at in arms:
        runs = [result for result in results if result["arm"] == arm]
        summary[arm] = {
            "notes": notes, "note_changed_before_turn": changed_at,
            "prompt_tokens_added_per_turn": runs[0]["added_per_turn"],
            "prefill_per_later_turn": runs[0]["prefill_per_later_turn"],
            "prefill_per_later_turn_before_last_user": runs[0]["prefill_per_later_turn_before_last_user"],
            "ttft_ms_median_later_turns": statistics.median(run["ttft_ms_median_later_turns"] for run in runs),
        }  # fmt: skip
    print("| arm | notes | tokens added/turn | prefill/later turn (system end) | (before last user) | TTFT ms |")
    print("|---|---|---|---|---|---|")
    for arm, row in summary.items():
        print(f"| {arm} | {row['notes']} | {row['prompt_tokens_added_per_turn']:.0f} | {row['prefill_per_later_turn']:.1f} "
              f"| {row['prefill_per_later_turn_before_last_user']:.1f} | {row['ttft_ms_median_later_turns']:.1f} |")
    if args.out is not None:
        args.out.write_text(json.dumps({"summary": summary, "runs": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
