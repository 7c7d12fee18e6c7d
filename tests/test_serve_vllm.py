"""`clawrl serve --engine vllm` end to end (issue 14): vLLM's CPU build serves the tiny model, the
openai SDK talks to clawrl, the rule judge and the trainer (a separate process) turn feedback into
LoRA versions, and vLLM serves each of them exactly as trained while 16 clients keep asking; after
SIGTERM no vLLM process is left.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from clawrl.engines.vllm import SERVED_NAME, VLLMEngine
from clawrl.model.constraints import GrammarVocabulary, allowed_bits, masked_logits
from clawrl.judge.openai_backend import OpenAIJudge
from clawrl.model.scoring import score_response
from clawrl.serve.runner import free_port
from clawrl.store import Store
from clawrl.types import NextState, TurnContext
from tests.helpers import (
    WEATHER_QUESTION,
    WEATHER_TOOL,
    BorrowedEngine,
    LoadClients,
    healthz,
    require_vllm,
    start_server,
    teach,
    turn,
    user,
    wait_until,
)

FIXED_PROMPT = [{"role": "user", "content": "Write a short note to my team about Friday."}]


def vllm_servers_of(parent: int) -> list[int]:
    """The vLLM server processes that process `parent` started (its children whose command line
    runs vLLM's OpenAI server; other vLLM servers, e.g. the test session's shared one, are not)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == parent and b"vllm.entrypoints.openai.api_server" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_serve_with_vllm_chats_trains_and_swaps_lora_versions(tiny_model_dir: Path, run_dir: Path) -> None:
    require_vllm()
    port = free_port()
    command = [
        sys.executable, "-m", "clawrl.cli", "serve", "--engine", "vllm", "--model", str(tiny_model_dir), "--device", "cpu",
        "--max-context-tokens", "2048", "--run-dir", str(run_dir), "--port", str(port), "--served-model-name", "m",
        "--judge", "rule", "--judge-poll-s", "0.05", "--policy-poll-s", "0.1",
        "--method", "combine", "--batch-size", "3", "--lr", "0.01", "--train-poll-s", "0.1",
    ]  # fmt: skip
    serve = subprocess.Popen(command)
    base = f"http://127.0.0.1:{port}"
    servers: list[int] = []
    try:
        wait_until(lambda: healthz(base) or serve.poll() is not None, 400, "clawrl serve --engine vllm")
        assert serve.poll() is None, "clawrl serve exited"
        client = openai.OpenAI(base_url=base + "/v1", api_key="none")
        answer = client.chat.completions.create(model="m", messages=FIXED_PROMPT, max_tokens=8, logprobs=True, seed=1)
        assert answer.choices[0].finish_reason in ("stop", "length") and len(answer.choices[0].logprobs.content) >= 1
        streamed = client.chat.completions.create(model="m", messages=FIXED_PROMPT, max_tokens=8, seed=1, stream=True)
        pieces = [chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices]
        assert "".join(pieces) == answer.choices[0].message.content  # the same seed, streamed
        text = answer.choices[0].message.content
        if len(text) > 3:  # a stop string cuts the answer where it first appears
            stop = text[2:4]
            stopped = client.chat.completions.create(model="m", messages=FIXED_PROMPT, max_tokens=8, seed=1, stop=[stop])
            assert stopped.choices[0].message.content == text[: text.index(stop)]
            assert stopped.choices[0].finish_reason == "stop"

        with LoadClients(base + "/v1", timeout_s=120) as load:
            teach(base + "/v1", sessions=2)
            wait_until(lambda: healthz(base)["policy_version"] == 2, 300, "v2 served")
            wait_until(lambda: load.versions.count(2) >= 4, 60, "answers on v2")
        assert load.failures == [] and {0, 2} <= set(load.versions)

        with httpx.Client(base_url=base + "/v1", timeout=60) as http:
            body = {"model": "m", "messages": FIXED_PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": True, "turn_type": "side"}
            response = http.post("/chat/completions", json=body)
        assert response.status_code == 200 and response.headers["x-clawrl-policy-version"] == "2"
        turn = Store.for_run_dir(run_dir).turns.turn(response.headers["x-clawrl-turn"])
        served = [entry["logprob"] for entry in response.json()["choices"][0]["logprobs"]["content"]]
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(run_dir / "policy" / "shared" / "v2"))
        expected = score_response(model.eval(), turn.prompt_token_ids, turn.response_token_ids, 0).logprobs
        torch.testing.assert_close(torch.tensor(served), torch.tensor(expected), rtol=0, atol=2e-3)
        torch.testing.assert_close(torch.tensor(turn.response_logprobs), torch.tensor(expected), rtol=0, atol=2e-3)
        servers += vllm_servers_of(serve.pid)
        assert servers
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(90)
    wait_until(lambda: not any(running(pid) for pid in servers), 60, "vLLM's server stopped with clawrl")


def test_the_openai_judge_runs_against_a_real_vllm_server(vllm_tool_engine: VLLMEngine) -> None:
    """`--judge openai` pointed at vLLM (the test session's shared server): its requests are accepted
    and its answers parsed. Its model (the tiny model fitted to a few weather chats) writes no boxed
    score, so every vote is invalid and the score neutral."""
    answered = turn("t1", "s1", [user("Write a short note to my team about Friday.")], "**Friday**\n1. Meeting at 10")
    case = TurnContext(answered, NextState("t1", [user("too AI-like, rewrite it without the bold")], "t2"), feedback=[])
    judge = OpenAIJudge(vllm_tool_engine.servers[0].base_url, SERVED_NAME, votes=3, max_tokens=48, call_timeout_s=120, attempts=1)
    verdict = asyncio.run(judge.judge(case))
    assert verdict.source == "prm" and verdict.votes == [None, None, None] and verdict.score == 0


def test_vllm_holds_json_outputs_and_forced_calls_with_the_masked_log_probs(vllm_tool_engine: VLLMEngine, run_dir: Path,
                                                                          tool_model_dir: Path) -> None:  # fmt: skip
    """The request contract on vLLM (its guidance backend, given clawrl's grammar text): a json_schema
    answer validates, a forced call is a call, and the recorded log-probs are those of the masked
    distribution, the same the trainer replays (checked against the fp32 model in transformers)."""
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Lima"]}, "days": {"type": "integer",
              "minimum": 1, "maximum": 9}}, "required": ["city", "days"], "additionalProperties": False}  # fmt: skip
    with start_server(Path("unused"), run_dir, engine=BorrowedEngine(vllm_tool_engine)) as server:
        model = httpx.get(f"{server.base_url}/models").json()["data"][0]["id"]
        # a roomy budget: this model likes a line break and the most indentation the grammar allows
        body = {"model": model, "messages": [user("Plan a trip.")], "max_tokens": 400, "seed": 4,
                "response_format": {"type": "json_schema", "json_schema": {"name": "trip", "schema": schema}}}  # fmt: skip
        answer = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)
        assert answer.status_code == 200 and answer.json()["choices"][0]["finish_reason"] == "stop", answer.text
        trip = json.loads(answer.json()["choices"][0]["message"]["content"])
        assert trip["city"] in ("Paris", "Lima") and 1 <= trip["days"] <= 9
        forced = {"model": model, "messages": [user("Say hello.")], "max_tokens": 80, "seed": 1, "tools": [WEATHER_TOOL],
                  "tool_choice": "required"}  # fmt: skip
        call = httpx.post(f"{server.base_url}/chat/completions", json=forced, timeout=120).json()["choices"][0]
        assert call["finish_reason"] == "tool_calls" and call["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
        turn = server.app.state.service.store.turns.turn(answer.headers["X-Clawrl-Turn"])
    recorded, masked, raw = _recorded_masked_and_raw(turn, tool_model_dir, vllm_tool_engine)
    assert torch.allclose(recorded, masked, atol=2e-3), (recorded - masked).abs().max()
    assert not torch.allclose(recorded, raw, atol=2e-2)  # the mask mattered


def test_vllm_holds_a_strict_tools_calls_under_the_lazy_grammar(vllm_tool_engine: VLLMEngine, run_dir: Path,
                                                                 tool_model_dir: Path) -> None:  # fmt: skip
    """A strict tool under `tool_choice` auto on vLLM: the lazy grammar (free text, or text then calls),
    sent as text to its guidance backend (llguidance 1.7 there, 1.9 in clawrl's venv), holds the call
    the tool model chooses to make, and the recorded log-probs are those of the distribution masked
    as the trainer's replay masks it."""
    parameters = {"type": "object", "required": ["city", "days"], "properties": {
        "city": {"enum": ["Paris", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}}}  # fmt: skip
    tool = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": parameters}}
    with start_server(Path("unused"), run_dir, engine=BorrowedEngine(vllm_tool_engine)) as server:
        model = httpx.get(f"{server.base_url}/models").json()["data"][0]["id"]
        for seed in range(6):
            body = {"model": model, "messages": [user(WEATHER_QUESTION)], "max_tokens": 80, "seed": seed,
                    "temperature": 1.0, "tools": [tool]}  # fmt: skip
            answer = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
            calls = answer.json()["choices"][0]["message"].get("tool_calls") or []
            if calls:
                break
        else:
            pytest.fail("the tool model made no call in 6 seeds on vLLM")
        arguments = json.loads(calls[0]["function"]["arguments"])
        assert arguments["city"] in ("Paris", "Lima") and 1 <= arguments["days"] <= 9 and set(arguments) == {"city", "days"}
        turn = server.app.state.service.store.turns.turn(answer.headers["X-Clawrl-Turn"])
    assert turn.sampling.grammar is not None
    recorded, masked, raw = _recorded_masked_and_raw(turn, tool_model_dir, vllm_tool_engine)
    assert torch.allclose(recorded, masked, atol=2e-3), (recorded - masked).abs().max()
    assert not torch.allclose(recorded, raw, atol=2e-2)  # the mask mattered


def _recorded_masked_and_raw(turn: Any, model_dir: Path, engine: VLLMEngine) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A turn's recorded log-probs; the fp32 model's in transformers under the masks the trainer
    replays from the turn's grammar; and the model's without them."""
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocabulary = GrammarVocabulary.of(engine.tokenizer, reference.config.vocab_size)
    masks = allowed_bits(turn.sampling.grammar, vocabulary, turn.response_token_ids)
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([turn.prompt_token_ids + turn.response_token_ids])).logits[0]
    logits = logits[len(turn.prompt_token_ids) - 1 : -1]
    chosen = torch.tensor(turn.response_token_ids)[:, None]
    masked = torch.log_softmax(masked_logits(logits, masks), -1).gather(1, chosen)[:, 0]
    raw = torch.log_softmax(logits, -1).gather(1, chosen)[:, 0]
    return torch.tensor(turn.response_logprobs), masked, raw


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--engine", "openai", "--engine-url", "http://127.0.0.1:9/v1", "--method", "rl", "--full"], "cannot swap in full-weight"),
        (["--engine", "vllm", "--method", "rl", "--lora-rank", "128"], "above --max-lora-rank 64"),
        (["--engine", "vllm", "--vllm-python", "/no/such/python"], "not an executable file"),
        (["--engine", "openai", "--engine-url", "http://127.0.0.1:9/v1"], "cannot reach the engine server"),
    ],
)
def test_engine_mistakes_end_in_one_clear_line(tiny_model_dir: Path, tmp_path: Path, flags: list[str], message: str) -> None:
    command = [sys.executable, "-m", "clawrl.cli", "serve", "--model", str(tiny_model_dir), "--run-dir", str(tmp_path),
               "--port", str(free_port()), *flags]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
