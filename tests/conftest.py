"""Shared fixtures: a tiny model built once per test run, and a real server on a real port.

`tool_model_dir` is the tiny model fitted (a few seconds of real training) to a handful of
conversations, so that greedy decoding really emits a tool call and a final answer: the tool
round trip is then exercised end to end, with nothing faked.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.config import EngineConfig, JudgeConfig, ServeConfig
from clawrl.engines import build_engine
from clawrl.judge.worker import build_worker
from clawrl.serve.runner import ServerThread, free_port
from clawrl.sim.tiny import build_tiny_model
from clawrl.store import Store

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_QUESTION = "What's the weather in Lyon?"
WEATHER_CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>'
WEATHER_RESULT = '{"temp_c": 14, "sky": "cloudy"}'
WEATHER_ANSWER = "It is 14 degrees and cloudy in Lyon."


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def _fit(
    model_dir: Path,
    out_dir: Path,
    conversations: list[tuple[list[dict[str, Any]], str]],
    steps: int,
    tools: list[dict[str, Any]] | None = (WEATHER_TOOL,),  # type: ignore[assignment]
) -> Path:
    """Overfit the tiny model so that each conversation's prompt (rendered with `tools`) is followed by its answer."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    examples = []
    for messages, answer in conversations:
        prompt = tokenizer.apply_chat_template(messages, tools=list(tools) if tools else None, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        answer_ids = tokenizer.encode(answer + "<|im_end|>", add_special_tokens=False)
        ids = torch.tensor([prompt_ids + answer_ids])
        labels = ids.clone()
        labels[0, : len(prompt_ids)] = -100
        examples.append((ids, labels))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        for ids, labels in examples:
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def weather_conversations() -> list[tuple[list[dict[str, Any]], str]]:
    question = [{"role": "user", "content": WEATHER_QUESTION}]
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}
    after_tool = question + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": WEATHER_RESULT},
    ]
    return [(question, WEATHER_CALL_TEXT), (after_tool, WEATHER_ANSWER)]


@pytest.fixture(scope="session")
def tool_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fit(tiny_model_dir, tmp_path_factory.mktemp("tool-model"), weather_conversations(), steps=60)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def start_server(model_dir: Path, run_dir: Path, judge: JudgeConfig | None = None, **serve_options: Any) -> ServerThread:
    """A real server on a free port; with `judge`, the judge loop runs inside it as in `clawrl serve`."""
    engine_config = EngineConfig(model=str(model_dir), device="cpu", cpu_threads=1)
    engine = build_engine(engine_config)
    store = Store.for_run_dir(run_dir)
    worker = build_worker(store, judge, engine, engine_config) if judge is not None else None
    return ServerThread(engine, store, ServeConfig(port=free_port(), **serve_options), worker)


@pytest.fixture
def server(tool_model_dir: Path, run_dir: Path) -> Iterator[ServerThread]:
    with start_server(tool_model_dir, run_dir) as running:
        yield running


@pytest.fixture
def store(server: ServerThread, run_dir: Path) -> Store:
    return Store.for_run_dir(run_dir)
