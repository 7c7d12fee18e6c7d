"""The request contract honoured (issue 31): JSON outputs and forced tool calls, decoded under a grammar.

Against a real server on the tiny model, which on its own writes neither JSON nor tool calls on
these prompts: every answer parses, validates, or is a call, because every token was sampled from
the model's distribution masked to the grammar; the turn records the grammar and the log-probs of
that masked distribution.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import torch

from clawrl.model.constraints import GrammarVocabulary, allowed_bits, json_output_grammar, masked_logits
from clawrl.serve.runner import ServerThread
from tests.helpers import start_server

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "Lagos", "Lima"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
WEATHER_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}},
]  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with start_server(tiny_model_dir, tmp_path_factory.mktemp("constrained"), served_model_name="tiny") as running:
        yield running


def chat(server: ServerThread, **fields: Any) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me about someone."}], "max_tokens": 120,
            "logprobs": True, **fields}  # fmt: skip
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)


@pytest.mark.parametrize("seed", range(4))
def test_a_json_schema_answer_validates(server: ServerThread, seed: int) -> None:
    format_ = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    answer = chat(server, response_format=format_, seed=seed, temperature=1.0)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)


def test_a_json_object_answer_parses_and_without_the_grammar_it_would_not(server: ServerThread) -> None:
    # any object: its strings are free, so an answer may also run out of tokens (finish_reason "length")
    choices = [chat(server, response_format={"type": "json_object"}, seed=seed, max_tokens=300).json()["choices"][0]
               for seed in range(4)]  # fmt: skip
    finished = [choice for choice in choices if choice["finish_reason"] == "stop"]
    assert finished, [choice["message"]["content"][-80:] for choice in choices]
    assert all(isinstance(json.loads(choice["message"]["content"]), dict) for choice in finished)
    free = chat(server, seed=1).json()["choices"][0]["message"]["content"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(free)


@pytest.mark.parametrize("seed", range(3))
def test_tool_choice_required_always_returns_a_tool_call(server: ServerThread, seed: int) -> None:
    answer = chat(server, tools=WEATHER_TOOLS, tool_choice="required", seed=seed)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    tool = next(tool for tool in WEATHER_TOOLS if tool["function"]["name"] == call["function"]["name"])
    jsonschema.validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])


def test_a_named_function_is_the_one_called(server: ServerThread) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    message = chat(server, tools=WEATHER_TOOLS, tool_choice=choice, seed=3).json()["choices"][0]["message"]
    assert [call["function"]["name"] for call in message["tool_calls"]] == ["get_time"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"])["zone"] in ("UTC", "CET")


@pytest.mark.parametrize(
    ("fields", "code"),
    [({"tool_choice": "required"}, "tool_choice"),
     ({"tools": WEATHER_TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_mail"}}}, "unknown_tool"),
     ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}},
      "unsupported_schema"),
     ({"response_format": {"type": "json_schema"}}, "response_format"),
     ({"tools": WEATHER_TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format")],
)  # fmt: skip
def test_what_cannot_be_honoured_is_refused(server: ServerThread, fields: dict[str, Any], code: str) -> None:
    """Refused for its shape (the OpenAPI document states these: the error names the field), or for
    what it names (its own codes)."""
    answer = chat(server, **fields)
    error = answer.json()["error"]
    assert answer.status_code == 400 and code in (error["code"], error["param"]), answer.text


def test_the_turn_records_its_grammar_and_the_log_probs_it_was_sampled_from(server: ServerThread) -> None:
    format_ = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    answer = chat(server, response_format=format_, seed=7)
    turn_id = answer.headers["X-Clawrl-Turn"]
    turn = server.app.state.service.store.turns.turn(turn_id)
    assert turn.sampling.grammar == json_output_grammar(PERSON)
    # the log-probs reported are those of the masked distribution: recompute it from the model
    engine = server.app.state.service.engine
    model = engine.base_model
    vocabulary = GrammarVocabulary.of(engine.tokenizer, model.config.vocab_size)
    masks = allowed_bits(turn.sampling.grammar, vocabulary, turn.response_token_ids)
    ids = torch.tensor([turn.prompt_token_ids + turn.response_token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(turn.prompt_token_ids) - 1 : -1].double()
    masked = torch.log_softmax(masked_logits(logits, masks), dim=-1)
    raw = torch.log_softmax(logits, dim=-1)
    chosen = torch.tensor(turn.response_token_ids)
    expected, unmasked = masked.gather(1, chosen[:, None])[:, 0], raw.gather(1, chosen[:, None])[:, 0]
    assert torch.allclose(torch.tensor(turn.response_logprobs, dtype=torch.float64), expected, atol=1e-4)
    assert not torch.allclose(expected, unmasked, atol=1e-2)  # the mask mattered
    assert all(math.isfinite(value) for value in turn.response_logprobs)


def test_an_engine_without_constrained_decoding_refuses_the_contract(tiny_model_dir: Path) -> None:
    """`--engine openai` (a server clawrl did not start, whose grammar backend it cannot know) refuses
    with a 400 naming the way out, rather than answer free text."""
    from transformers import AutoTokenizer

    from clawrl.engines.remote import RemoteEngine
    from clawrl.errors import APIError
    from clawrl.serve.contract import request_grammar
    from clawrl.serve.schemas import ChatCompletionRequest

    assert RemoteEngine.constrained_decoding is False
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                   "response_format": {"type": "json_object"}})  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(APIError) as refused:
        request_grammar(request, None, tokenizer, engine_can=False)
    assert refused.value.status == 400 and refused.value.code == "unsupported_constraint"
    assert "--engine hf" in refused.value.message
    assert request_grammar(request, None, tokenizer, engine_can=True) == json_output_grammar(None)
