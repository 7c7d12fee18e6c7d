"""`clawrl demo`: the serving and recording loops end to end on the CPU, in about a minute.

It builds (or reuses) the tiny model, starts the real server on a free local port, plays a few
scripted conversations the way an unmodified agent would (no session header, history re-sent
with every request, a tool round trip, a streamed answer, a side turn), and prints what the
store recorded. The learning benchmark will replace the scripted conversations with simulated
users and training.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import httpx

from clawrl.config import EngineConfig, ServeConfig
from clawrl.engines import build_engine
from clawrl.serve.runner import ServerThread, free_port
from clawrl.store import Store
from clawrl.store.inspect import session_detail

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

SCRIPTS: list[list[str]] = [
    ["What is 12 times 7?", "thanks! and 84 divided by 4?", "great, that's all"],
    ["Write a short greeting for my team.", "too AI-like, rewrite it without the bold"],
]


def _chat(client: httpx.Client, model: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    response = client.post("/chat/completions", json={"model": model, "messages": messages, "max_tokens": 24, **extra})
    response.raise_for_status()
    return response.json()["choices"][0]["message"]


def _play(client: httpx.Client, model: str, user_lines: list[str]) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    for line in user_lines:
        messages.append({"role": "user", "content": line})
        answer = _chat(client, model, messages)
        messages.append({"role": "assistant", "content": answer["content"] or ""})
        print(f"  user: {line}\n  assistant: {(answer['content'] or '')[:70]!r}")


def _play_tool_conversation(client: httpx.Client, model: str) -> None:
    """Offer a tool; send back a tool result if the model calls it, else a user reply.

    Either way the second request echoes the first answer exactly as received, as an agent does.
    """
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What's the weather in Lyon?"}]
    answer = _chat(client, model, messages, tools=[WEATHER_TOOL])
    messages.append({key: value for key, value in answer.items() if value is not None})
    if answer.get("tool_calls"):
        call = answer["tool_calls"][0]
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": '{"temp_c": 14, "sky": "cloudy"}'})
        print(f"  tool call: {call['function']['name']}({call['function']['arguments']}) -> tool result sent back")
    else:
        messages.append({"role": "user", "content": "Please use the weather tool."})
        print("  the model answered in text instead of calling the tool (untrained weights)")
    _chat(client, model, messages, tools=[WEATHER_TOOL])


def run_demo(engine_config: EngineConfig, run_dir: Path) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    print(f"[1/3] model: {engine_config.model} (the tiny model is built locally on first use)")
    engine = build_engine(engine_config)
    store = Store.for_run_dir(run_dir)
    print(f"[2/3] serving on a local port; recording into {run_dir / 'clawrl.db'}")
    with ServerThread(engine, store, ServeConfig(port=free_port())) as server:
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            model = client.get("/models").json()["data"][0]["id"]
            for script in SCRIPTS:
                _play(client, model, script)
            _play_tool_conversation(client, model)
            side = [{"role": "user", "content": "Summarise this chat in five words."}]
            client.post("/chat/completions", json={"model": model, "messages": side, "max_tokens": 8}, headers={"X-Turn-Type": "side"})
    print("[3/3] what the store recorded:")
    for session in sorted(store.list_sessions(), key=lambda row: row.created_at):
        detail = session_detail(store, session.id)
        assert detail is not None
        print(f"\n  session {session.id} ({session.id_source}, {session.num_turns} turns)")
        for turn in detail["turns"]:
            next_state = turn["next_state"]
            following = f"next state ({next_state['role']}): {next_state['content'][:40]!r}" if next_state else "no next state"
            print(
                f"    turn {turn['index']} {turn['kind']:<4} v{turn['policy_version']} "
                f"prompt {len(turn['prompt_token_ids']):>4} tok, response {len(turn['response_token_ids']):>3} tok; {following}"
            )
    print(f"\nInspect it yourself: clawrl sessions list --run-dir {run_dir}")
    return 0
