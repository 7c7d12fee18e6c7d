"""Anthropic's Messages API (`/v1/messages`, serve/messages_api.py) against a real server, through the
real `anthropic` SDK and raw HTTP: answers, streams, tool round trips and token counts are recorded
(and judged) exactly as chat completions are, and what cannot be honoured is refused with
Anthropic's error object, recording nothing.

The server serves `tool_model_dir` (fitted to the weather round trip, so that greedy decoding
really calls the tool and answers after its result) and runs the offline judge.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import anthropic
import httpx
import jsonschema
import jsonschema_rs
import pydantic
import pytest

from clawrl.config import JudgeConfig
from clawrl.serve.messages_api import chat_body, component_schemas
from clawrl.serve.messages_schemas import (
    AnthropicCountTokensRequest,
    AnthropicMessagesRequest,
)
from clawrl.serve.runner import ServerThread
from clawrl.store import Store
from tests.test_clients import run_against, snippet
from tests.helpers import (
    WEATHER_ANSWER,
    WEATHER_QUESTION,
    WEATHER_RESULT,
    WEATHER_TOOL,
    start_server,
    wait_for_judgment,
    wait_until,
)

API_KEY = "sk-messages"
MODEL = "claude-local"
BODY_LIMIT = 65536
# The weather tool as Anthropic's API defines it (WEATHER_TOOL is the chat API's)
TOOL = {
    "name": WEATHER_TOOL["function"]["name"],
    "description": WEATHER_TOOL["function"]["description"],
    "input_schema": WEATHER_TOOL["function"]["parameters"],
}
GREEDY = {"temperature": 0}  # the SDK has no `temperature` argument: sent as extra_body


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run for the module's server (overrides conftest's per-test one)."""
    return tmp_path_factory.mktemp("messages") / "run"


@pytest.fixture(scope="module")
def server(tool_model_dir: Path, run_dir: Path) -> Iterator[ServerThread]:
    judge = JudgeConfig(judge="rule", judge_poll_s=0.05)
    with start_server(tool_model_dir, run_dir, judge=judge, api_key=API_KEY, served_model_name=MODEL,
                      max_body_bytes=BODY_LIMIT) as running:  # fmt: skip
        yield running


@pytest.fixture(scope="module")
def store(server: ServerThread, run_dir: Path) -> Store:
    return Store.for_run_dir(run_dir)


def root(server: ServerThread) -> str:
    return server.base_url.removesuffix("/v1")


@pytest.fixture
def client(server: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=root(server), api_key=API_KEY, max_retries=0)


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=root(server), headers={"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}, timeout=60) as client:
        yield client


def sse(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """A stream's events as (event name, data)."""
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, json.loads(line.removeprefix("data: "))))
    return events


def recorded_turns(store: Store) -> int:
    counts = store.turns.counts()
    return counts["main_turns"] + counts["side_turns"]


def echoed(message: Any) -> dict[str, Any]:
    """An answer as a client sends it back in the next request's history."""
    blocks: list[dict[str, Any]] = []
    for block in message.content:
        if block.type == "text":
            blocks.append({"type": "text", "text": block.text})
        else:
            blocks.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
    return {"role": "assistant", "content": blocks}


# --- the translation ---------------------------------------------------------------------------------


def test_the_translation_onto_chat_messages() -> None:
    request = AnthropicCountTokensRequest.model_validate({
        "model": "m",
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Lyon"}, {"type": "text", "text": "and Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Lyon"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "text", "text": "(hurry)"},  # text before the results still follows them
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "14C"}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "timeout", "is_error": True},
            ]},
        ],
        "tools": [TOOL],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": False},
    })  # fmt: skip
    body = chat_body(request)
    assert body["messages"] == [
        {"role": "system", "content": "Be brief.\n\nBe kind."},
        {"role": "user", "content": "Weather in Lyon\n\nand Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}},
            {"id": "toolu_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        ]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "14C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: timeout"},
        {"role": "user", "content": "(hurry)"},
    ]  # fmt: skip
    assert body["tools"] == [{"type": "function", "function": {**WEATHER_TOOL["function"]}}]
    assert body["tool_choice"] == "auto"


# (body, valid): the edges of the rules the request models check in validators, which their JSON
# schemas state too (the OpenAPI fuzz sends schema-generated requests: tests/test_openapi_fuzz.py)
BASE = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
AGREEMENT = [
    (BASE, True),
    ({**BASE, "top_k": None, "thinking": {"type": "disabled"}, "tool_choice": {"type": "none"}}, True),
    ({**BASE, "output_config": {"effort": "low", "format": None}}, True),
    ({**BASE, "top_k": 5}, False),
    ({**BASE, "thinking": {"type": "enabled", "budget_tokens": 1024}}, False),
    ({**BASE, "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "any"}}, True),
    ({**BASE, "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "f"}}, True),
    ({**BASE, "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool"}}, False),
    ({**BASE, "tool_choice": {"type": "any"}}, False),  # nothing to call
    ({**BASE, "output_config": {"format": {"type": "json_schema", "schema": {}}}}, True),
    ({**BASE, "output_config": {"format": {"type": "json_object"}}}, False),
    ({**BASE, "output_config": {"format": {"type": "json_schema"}}}, False),  # no schema
    ({**BASE, "tools": [{"name": "f", "input_schema": {}, "strict": True}]}, True),
    ({**BASE, "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "any"},
      "output_config": {"format": {"type": "json_schema", "schema": {}}}}, False),  # a forced call leaves no text to hold
    ({**BASE, "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "auto"},
      "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": {}}}}, True),
    ({**BASE, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, False),
    ({**BASE, "stop_sequences": ["a", "b", "c", "d", "e"]}, False),
    ({**BASE, "temperature": 1.5}, False),
    ({**BASE, "max_tokens": 0}, False),
    ({**BASE, "messages": []}, False),
    ({**BASE, "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "x"}]}, True),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]}, False),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, False),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": ""}]}]}, False),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}, True),
]


@pytest.mark.parametrize("body, valid", AGREEMENT)
def test_the_json_schema_accepts_what_the_model_accepts(body: dict[str, Any], valid: bool) -> None:
    document = {"$ref": "#/components/schemas/AnthropicMessagesRequest", "components": {"schemas": component_schemas()}}
    assert jsonschema_rs.Draft202012Validator(document).is_valid(body) is valid
    try:
        AnthropicMessagesRequest.model_validate(body)
        accepted = True
    except ValueError:
        accepted = False
    assert accepted is valid


# --- answers -----------------------------------------------------------------------------------------


def test_a_message_is_answered_and_recorded(client: anthropic.Anthropic, store: Store) -> None:
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=12, system="You are terse.", messages=[{"role": "user", "content": "hello there"}]
    )
    message = raw.parse()
    assert message.id.startswith("msg_") and raw.headers["x-clawrl-turn"] == message.id
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    turn = store.turns.turn(message.id)
    assert turn is not None and turn.session_id == raw.headers["x-clawrl-session"]
    assert turn.messages == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello there"}]
    assert len(turn.prompt_token_ids) == message.usage.input_tokens
    assert len(turn.response_token_ids) == message.usage.output_tokens == len(turn.response_logprobs) >= 1
    assert "".join(block.text for block in message.content if block.type == "text") == turn.response_text
    assert turn.sampling.max_tokens == 12 and turn.kind == "main"


def test_a_streamed_message_is_reassembled_and_recorded(client: anthropic.Anthropic, store: Store) -> None:
    with client.messages.stream(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "tell me a story"}]) as stream:
        texts = list(stream.text_stream)
        message = stream.get_final_message()
    turn = store.turns.turn(message.id)
    assert turn is not None and turn.finish_reason != "cancelled"
    assert "".join(texts) == turn.response_text == (message.content[0].text if message.content else "")
    assert message.usage.input_tokens == len(turn.prompt_token_ids)
    assert message.usage.output_tokens == len(turn.response_token_ids) >= 1
    assert message.stop_reason in ("end_turn", "max_tokens")


def test_a_streams_events_come_in_anthropics_order(http: httpx.Client, store: Store) -> None:
    body = {"model": MODEL, "max_tokens": 12, "stream": True, "messages": [{"role": "user", "content": "count to ten"}]}
    with http.stream("POST", "/v1/messages", json=body) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        turn_id = response.headers["x-clawrl-turn"]
        events = sse(response)
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    middle = names[2:-2]
    if middle:  # a text block: opened, its deltas, closed
        assert middle[0] == "content_block_start" and middle[-1] == "content_block_stop"
        assert set(middle[1:-1]) == {"content_block_delta"}
    start, delta = events[0][1]["message"], events[-2][1]
    assert start["id"] == turn_id and start["content"] == [] and start["stop_reason"] is None
    turn = store.turns.turn(turn_id)
    assert turn is not None  # recorded before message_delta went out
    assert start["usage"]["input_tokens"] == len(turn.prompt_token_ids)
    assert delta["usage"]["output_tokens"] == len(turn.response_token_ids)
    assert "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta") == turn.response_text


def test_create_with_stream_true_yields_the_same_events(client: anthropic.Anthropic, store: Store) -> None:
    events = list(client.messages.create(model=MODEL, max_tokens=8, stream=True, messages=[{"role": "user", "content": "hi"}]))
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    turn = store.turns.turn(events[0].message.id)
    assert turn is not None and turn.response_token_ids


def test_metadata_user_id_names_the_session(client: anthropic.Anthropic, store: Store) -> None:
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=4, metadata={"user_id": "alice-42"}, messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.headers["x-clawrl-session"] == "user:alice-42"
    assert store.turns.turn(raw.parse().id).session_id == "user:alice-42"


def test_a_stop_sequence_ends_the_answer_and_is_named(client: anthropic.Anthropic, http: httpx.Client) -> None:
    """After the tool's result the fitted model answers WEATHER_ANSWER; cut at "cloudy"."""
    history = [
        {"role": "user", "content": WEATHER_QUESTION},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Lyon"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": WEATHER_RESULT}]},
    ]
    message = client.messages.create(model=MODEL, max_tokens=40, tools=[TOOL], messages=history, stop_sequences=["zebra", "cloudy"],
                                     extra_body=GREEDY)  # fmt: skip
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "cloudy"
    assert message.content[0].text == WEATHER_ANSWER.split("cloudy")[0]
    body = {"model": MODEL, "max_tokens": 40, "tools": [TOOL], "messages": history, "stop_sequences": ["cloudy"], "stream": True, **GREEDY}
    with http.stream("POST", "/v1/messages", json=body) as response:
        events = sse(response)
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "cloudy"}


# --- sessions, judging, tools ----------------------------------------------------------------------------


def test_a_corrected_conversation_is_one_session_and_is_judged(client: anthropic.Anthropic, store: Store) -> None:
    """Each request carries the whole history (as agents do, with no session id): the server knows
    the session from the answers echoed, and the offline judge reads the correction as -1 with the
    user's directive as the hint, the thanks as +1."""
    lines = ["Write a short note to my team about the offsite.", "no, make it shorter and mention the dates", "thanks, perfect"]
    history: list[dict[str, Any]] = []
    turn_ids = []
    for line in lines:
        history.append({"role": "user", "content": line})
        message = client.messages.create(model=MODEL, max_tokens=12, messages=history)
        history.append(echoed(message))
        turn_ids.append(message.id)
    session_id = store.turns.turn(turn_ids[0]).session_id
    turns = store.turns.session_turns(session_id)
    assert [entry.turn.id for entry in turns] == turn_ids
    assert [entry.turn.kind for entry in turns] == ["main", "main", "main"]
    assert turns[0].next_messages == [{"role": "user", "content": lines[1]}]
    assert turns[1].next_messages == [{"role": "user", "content": lines[2]}]
    corrected, thanked = wait_for_judgment(store, turn_ids[0]), wait_for_judgment(store, turn_ids[1])
    assert corrected.score == -1 and "mention the dates" in corrected.hint
    assert thanked.score == 1


def test_a_tool_round_trip_continues_the_session(client: anthropic.Anthropic, http: httpx.Client, store: Store) -> None:
    question = [{"role": "user", "content": WEATHER_QUESTION}]
    # the call, streamed: a tool_use block whose input comes as one input_json_delta
    body = {"model": MODEL, "max_tokens": 64, "tools": [TOOL], "messages": question, "stream": True, **GREEDY}
    with http.stream("POST", "/v1/messages", json=body) as response:
        events = sse(response)
    # no text before the call: no (empty) text block, as the non-streamed answer has none
    assert [name for name, _ in events] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                            "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    start, delta = events[2][1], events[3][1]
    assert start["index"] == delta["index"] == 0
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["name"] == "get_weather"
    assert start["content_block"]["input"] == {} and start["content_block"]["id"].startswith("call_")
    assert delta["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Lyon"}'}
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    # the same call through the SDK
    call = client.messages.create(model=MODEL, max_tokens=64, tools=[TOOL], messages=question, extra_body=GREEDY)
    assert call.stop_reason == "tool_use"
    (use,) = [block for block in call.content if block.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Lyon"}
    first = store.turns.turn(call.id)
    assert first.tool_calls is not None and first.tool_calls[0]["id"] == use.id and first.finish_reason == "tool_calls"

    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": WEATHER_RESULT}]}
    answer = client.messages.create(model=MODEL, max_tokens=64, tools=[TOOL], messages=[*question, echoed(call), result],
                                    extra_body=GREEDY)  # fmt: skip
    assert answer.stop_reason == "end_turn" and [block.text for block in answer.content] == [WEATHER_ANSWER]
    second = store.turns.turn(answer.id)
    assert second.messages == [
        {"role": "user", "content": WEATHER_QUESTION},
        {"role": "assistant", "content": first.response_text, "tool_calls": [
            {"id": use.id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}]},
        {"role": "tool", "tool_call_id": use.id, "content": WEATHER_RESULT},
    ]  # fmt: skip
    assert second.tools == [WEATHER_TOOL]
    # the echoed call is the recorded one: the same session, whose next state is the tool's result
    assert second.session_id == first.session_id
    (entry,) = [entry for entry in store.turns.session_turns(first.session_id) if entry.turn.id == first.id]
    assert entry.next_messages == [{"role": "tool", "tool_call_id": use.id, "content": WEATHER_RESULT}]


def test_count_tokens_is_the_recorded_prompts_length_and_records_nothing(client: anthropic.Anthropic, store: Store) -> None:
    request: dict[str, Any] = {
        "model": MODEL,
        "system": [{"type": "text", "text": "You check the weather."}],
        "tools": [TOOL],
        "messages": [
            {"role": "user", "content": WEATHER_QUESTION},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"city": "Lyon"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": WEATHER_RESULT},
                                         {"type": "text", "text": "and tomorrow?"}]},
        ],
    }  # fmt: skip
    before = recorded_turns(store)
    counted = client.messages.count_tokens(**request)
    assert recorded_turns(store) == before
    message = client.messages.create(max_tokens=4, **request)
    assert counted.input_tokens == len(store.turns.turn(message.id).prompt_token_ids) == message.usage.input_tokens


def test_a_hang_up_mid_stream_keeps_the_partial_turn_untrainable(tiny_model_dir: Path, tmp_path: Path) -> None:
    """As for a chat stream: on the random-weight model, which runs on to max_tokens (and may end early
    by chance: then the turn is complete, and the next try hangs up again)."""
    with start_server(tiny_model_dir, tmp_path / "run", served_model_name=MODEL) as server:
        store = Store.for_run_dir(tmp_path / "run")
        body = {"model": MODEL, "max_tokens": 4000, "stream": True, "temperature": 1.0,
                "messages": [{"role": "user", "content": "go on forever"}]}  # fmt: skip
        for _ in range(5):
            with httpx.Client(timeout=60) as http, http.stream("POST", f"{root(server)}/v1/messages", json=body) as response:
                turn_id = response.headers["x-clawrl-turn"]
                deltas = (line for line in response.iter_lines() if line == "event: content_block_delta")
                for _ in range(2):
                    next(deltas)
            turn = wait_until(lambda: store.turns.turn(turn_id), 30, "the hung-up turn's record")  # noqa: B023
            if turn.finish_reason != "stop":
                break
        assert turn.finish_reason == "cancelled" and not turn.trainable
        assert 0 < len(turn.response_token_ids) < 4000


# --- refusals ------------------------------------------------------------------------------------------

USER = [{"role": "user", "content": "hi"}]


def test_a_wrong_api_key_is_an_authentication_error(server: ServerThread, store: Store) -> None:
    wrong = anthropic.Anthropic(base_url=root(server), api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as raised:
        wrong.messages.create(model=MODEL, max_tokens=4, messages=USER)
    assert raised.value.status_code == 401
    assert raised.value.body["type"] == "error" and raised.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.count_tokens(model=MODEL, messages=USER)
    # a bearer token is as good as x-api-key (OpenAI-style clients, the SDK's auth_token)
    bearer = anthropic.Anthropic(base_url=root(server), auth_token=API_KEY, max_retries=0)
    assert bearer.messages.create(model=MODEL, max_tokens=2, messages=USER).id.startswith("msg_")


SDK_REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("missing max_tokens", {"max_tokens": anthropic.omit, "timeout": 30}, "max_tokens"),
    ("only a system message", {"messages": [{"role": "system", "content": "x"}]}, "messages"),
    ("an unknown role", {"messages": [{"role": "wizard", "content": "x"}]}, "messages.0"),
    ("an image", {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
     "messages.0.content.0: content blocks of type 'image' are not supported"),  # the path as the client wrote it
    ("tool_choice tool without a name", {"tools": [TOOL], "tool_choice": {"type": "tool"}}, "needs the tool's name"),
    ("tool_choice naming no tool", {"tools": [TOOL], "tool_choice": {"type": "tool", "name": "get_mail"}}, "not among the tools"),
    ("thinking", {"thinking": {"type": "enabled", "budget_tokens": 1024}}, "extended thinking"),
    ("top_k", {"extra_body": {"top_k": 5}}, "top_k"),
    ("a prefill", {"messages": [*USER, {"role": "assistant", "content": "Sure,"}]}, "prefill"),
    ("a server tool", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
    ("a forced call with structured outputs", {"tools": [TOOL], "tool_choice": {"type": "any"},
     "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "cannot both hold one answer"),
    ("a schema no grammar can hold", {"output_config": {"format": {"type": "json_schema", "schema": {"type": "no-such-type"}}}},
     "cannot be honoured"),
    ("too long a prompt", {"max_tokens": 40000, "timeout": 30}, "maximum context length"),
]


@pytest.mark.parametrize("overrides, says", [(o, s) for _, o, s in SDK_REFUSALS], ids=[name for name, _, _ in SDK_REFUSALS])
def test_what_cannot_be_honoured_is_a_bad_request(client: anthropic.Anthropic, store: Store, overrides: dict[str, Any], says: str) -> None:
    before = recorded_turns(store)
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(**({"model": MODEL, "max_tokens": 4, "messages": USER} | overrides))
    assert raised.value.status_code == 400
    assert raised.value.body["error"]["type"] == "invalid_request_error" and says in raised.value.body["error"]["message"]
    assert recorded_turns(store) == before


def test_a_forced_call_needs_tools_to_answer_but_not_to_count(client: anthropic.Anthropic) -> None:
    """Found by the OpenAPI fuzz: the tool choice renders no token, so counting ignores it."""
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=MODEL, max_tokens=4, messages=USER, tool_choice={"type": "any"})
    assert "no tools" in refused.value.body["error"]["message"]
    counted = client.messages.count_tokens(model=MODEL, messages=USER, tool_choice={"type": "any"})
    assert counted.input_tokens == client.messages.count_tokens(model=MODEL, messages=USER).input_tokens


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "tool"])
def test_a_forced_tool_call_is_a_tool_use_block(client: anthropic.Anthropic, choice: dict[str, Any]) -> None:
    """`tool_choice` `any` and `tool` force a call (decoded under a grammar): the tiny model answers with one."""
    message = client.messages.create(model=MODEL, max_tokens=60, messages=USER, tools=[TOOL], tool_choice=choice)
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "get_weather" and isinstance(block.input, dict)


# get_weather, strict, with an input its fitted call (Lyon) breaks: only the grammar makes its calls valid
STRICT_TOOL = {**TOOL, "strict": True, "input_schema": {"type": "object", "required": ["city", "days"], "properties": {
    "city": {"enum": ["Paris", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}}}}  # fmt: skip
WEATHER = [{"role": "user", "content": WEATHER_QUESTION}]


def test_a_strict_tools_calls_hold_its_input_schema(client: anthropic.Anthropic, store: Store) -> None:
    """`strict: true` under `tool_choice` auto: the model calls the tool or not, and every `tool_use`
    block's input validates (the turn records the grammar it was decoded under)."""
    messages = [client.messages.create(model=MODEL, max_tokens=80, messages=WEATHER, tools=[STRICT_TOOL],
                                       extra_body={"temperature": 1.0}) for _ in range(4)]  # fmt: skip
    uses = [block for message in messages for block in message.content if block.type == "tool_use"]
    assert uses, [message.content for message in messages]
    for block in uses:
        jsonschema.validate(block.input, {**STRICT_TOOL["input_schema"], "additionalProperties": False})
    assert all(store.turns.turn(message.id).sampling.grammar for message in messages)
    plain = client.messages.create(model=MODEL, max_tokens=8, messages=USER, tools=[TOOL])
    assert store.turns.turn(plain.id).sampling.grammar is None  # not strict: decoded as ever


# Every field bounded by an enum or a flag: the SDK's `parse` strips what Anthropic's structured outputs
# do not take (`maxLength`, `minimum`, `maximum`, moved into descriptions), and an unbounded string or
# number lets the random model write until max_tokens cuts the JSON short (stop_reason "max_tokens")
class Forecast(pydantic.BaseModel):
    city: Literal["Paris", "Lagos", "Lima"]
    days: Literal[1, 2, 3]
    sunny: bool


# a raw format keeps its bounds, and the grammar holds them
PERSON = {"type": "object", "required": ["name", "age"], "additionalProperties": False, "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}}  # fmt: skip


def test_structured_outputs_are_held_to_their_schema(client: anthropic.Anthropic) -> None:
    """`output_config.format`, as the SDK's `messages.parse(output_format=...)` sends it from a pydantic
    model: the answer's text is JSON the SDK parses into the model, whatever the tiny model would write;
    a raw format's bounds are held too."""
    for seed in range(3):
        parsed = client.messages.parse(model=MODEL, max_tokens=120, messages=USER, output_format=Forecast,
                                       extra_body={"temperature": 1.0, "seed": seed})  # fmt: skip
        assert parsed.stop_reason == "end_turn" and isinstance(parsed.parsed_output, Forecast), parsed.content
    raw = client.messages.create(model=MODEL, max_tokens=120, messages=USER, output_config={"format": {"type": "json_schema", "schema": PERSON}},
                                 extra_body={"temperature": 1.0})  # fmt: skip
    assert raw.stop_reason == "end_turn"
    jsonschema.validate(json.loads(raw.content[0].text), PERSON)


def test_an_unknown_model_is_not_found(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as raised:
        client.messages.create(model="claude-opus-4", max_tokens=4, messages=USER)
    assert raised.value.body["error"]["type"] == "not_found_error" and "claude-opus-4" in raised.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="claude-opus-4", messages=USER)


RAW_REFUSALS: list[tuple[str, dict[str, Any], int, str]] = [
    ("no key", {"json": {"model": MODEL, "max_tokens": 4, "messages": USER}, "headers": {"x-api-key": ""}}, 401, "authentication_error"),
    ("malformed JSON", {"content": b'{"model": '}, 400, "invalid_request_error"),
    ("an empty body", {"content": b""}, 400, "invalid_request_error"),
    ("an array", {"json": [1, 2]}, 400, "invalid_request_error"),
    ("NaN", {"content": b'{"model": "x", "max_tokens": NaN, "messages": []}'}, 400, "invalid_request_error"),
    ("too large a body", {"content": b'{"model": "' + b"x" * BODY_LIMIT + b'"}'}, 413, "request_too_large"),
    ("an unknown model", {"json": {"model": "nope", "max_tokens": 4, "messages": USER}}, 404, "not_found_error"),
    ("messages as a string", {"json": {"model": MODEL, "max_tokens": 4, "messages": "hi"}}, 400, "invalid_request_error"),
]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
@pytest.mark.parametrize("request_args, status, kind", [r[1:] for r in RAW_REFUSALS], ids=[r[0] for r in RAW_REFUSALS])
def test_every_refusal_is_anthropics_error_object(http: httpx.Client, store: Store, path: str, request_args: dict[str, Any],
                                                  status: int, kind: str) -> None:  # fmt: skip
    before = recorded_turns(store)
    response = http.post(path, **request_args)
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind
    message = body["error"]["message"]
    assert message and not any(leak in message for leak in ("Traceback", "pydantic", 'File "'))
    assert recorded_turns(store) == before


def test_the_document_describes_both_routes(server: ServerThread) -> None:
    doc = httpx.get(f"{root(server)}/openapi.json", timeout=30).json()
    for path, request in (("/v1/messages", "AnthropicMessagesRequest"), ("/v1/messages/count_tokens", "AnthropicCountTokensRequest")):
        operation = doc["paths"][path]["post"]
        assert operation["requestBody"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{request}"}
        assert doc["components"]["schemas"][request]["properties"]["model"]["enum"] == [MODEL]
        assert operation["responses"]["401"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/AnthropicErrorResponse"}
        assert operation["security"] == [{"apiKey": []}, {"bearer": []}]
    assert "anthropic-version" in {parameter["name"] for parameter in doc["paths"]["/v1/messages"]["post"]["parameters"]}
    events = doc["paths"]["/v1/messages"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]["anyOf"]
    assert {event["properties"]["event"]["const"] for event in events} == {
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop", "error"}  # fmt: skip


def test_the_documented_script_runs_as_written(tiny_model_dir: Path, run_dir: Path) -> None:
    """docs/clients.md's Messages section, against the server the page starts."""
    with start_server(tiny_model_dir, run_dir, served_model_name="my-agent", api_key="sk-local") as server:
        output = run_against(server, [sys.executable, "-c"], snippet("The Messages API (anthropic SDK)", "python"))
    store = Store.for_run_dir(run_dir)
    first_id = output.split()[0]
    recorded = [context.turn for context in store.turns.session_turns(store.turns.turn(first_id).session_id)]
    assert [turn.id for turn in recorded][0] == first_id and f"recorded as {recorded[1].id}" in output
    assert store.judging.turn_context(first_id).next_messages == [{"role": "user", "content": "no, make it rhyme"}]
    assert f"{len(recorded[1].prompt_token_ids)} prompt tokens" in output
