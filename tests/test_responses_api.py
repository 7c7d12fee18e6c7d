"""OpenAI's Responses API (issue 31), driven by the real `openai` SDK against a real server.

Each response is a recorded turn with the engine's token ids; `previous_response_id` continues
the stored conversation in the same session; `store: false` is answered and never recorded; what
the server cannot honour is refused with a 400.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import httpx
import openai
import pytest

from clawrl.config import JudgeConfig
from clawrl.serve.runner import ServerThread
from clawrl.store import Store
from tests.helpers import WEATHER_QUESTION, WEATHER_RESULT, WEATHER_TOOL, start_server, wait_for_judgment
from tests.test_clients import run_against, snippet

API_KEY = "sk-responses"
WEATHER_FUNCTION = {"type": "function", **WEATHER_TOOL["function"]}  # the Responses API's flat tool shape


@pytest.fixture
def server(tool_model_dir: Path, run_dir: Path) -> Iterator[ServerThread]:
    with start_server(tool_model_dir, run_dir, judge=JudgeConfig(judge_poll_s=0.05), served_model_name="agent",
                      api_key=API_KEY) as running:  # fmt: skip
        yield running


@pytest.fixture
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)


def test_a_response_is_a_recorded_turn_with_the_engines_token_ids(client: openai.OpenAI, run_dir: Path) -> None:
    response = client.responses.create(model="agent", instructions="Answer briefly.", input="Name a tea.", max_output_tokens=12)
    assert response.id.startswith("resp_") and response.status in ("completed", "incomplete")
    turn = Store.for_run_dir(run_dir).turns.turn(response.id)
    assert turn is not None
    assert turn.messages == [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a tea."}]
    assert turn.prompt_token_ids and len(turn.response_token_ids) == response.usage.output_tokens
    assert response.usage.input_tokens == len(turn.prompt_token_ids)
    assert response.output_text == turn.response_text
    assert response.status == ("incomplete" if turn.finish_reason == "length" else "completed")


def test_a_streamed_response_sends_the_responses_events_and_is_recorded_first(client: openai.OpenAI, run_dir: Path) -> None:
    events = list(client.responses.create(model="agent", input="Name a tea.", max_output_tokens=12, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    final = events[-1].response
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == final.output_text
    assert {"response.output_item.added", "response.output_text.done", "response.output_item.done"} <= set(kinds)
    turn = Store.for_run_dir(run_dir).turns.turn(final.id)
    assert turn is not None and turn.response_text == deltas and len(turn.response_token_ids) == final.usage.output_tokens


def test_previous_response_id_continues_the_session_and_the_judge_reads_the_user(client: openai.OpenAI, run_dir: Path) -> None:
    """Three user messages, each sent with only the previous response's id, as the SDK's users chain them."""
    first = client.responses.create(model="agent", instructions="You write short poems.", input="Write two lines about tea.",
                                    max_output_tokens=12)  # fmt: skip
    second = client.responses.create(model="agent", previous_response_id=first.id, input="no, make it rhyme and keep it short",
                                     max_output_tokens=12)  # fmt: skip
    third = client.responses.create(model="agent", previous_response_id=second.id, input="thanks, that's perfect", max_output_tokens=12)
    store = Store.for_run_dir(run_dir)
    turns = [store.turns.turn(response.id) for response in (first, second, third)]
    assert len({turn.session_id for turn in turns}) == 1
    assert [context.turn.id for context in store.turns.session_turns(turns[0].session_id)] == [first.id, second.id, third.id]
    # the stored conversation, then the new input; the instructions carry over when a follow-up sends none
    assert turns[1].messages == [
        {"role": "system", "content": "You write short poems."},
        {"role": "user", "content": "Write two lines about tea."},
        {"role": "assistant", "content": turns[0].response_text},
        {"role": "user", "content": "no, make it rhyme and keep it short"},
    ]
    corrected, thanked = wait_for_judgment(store, first.id), wait_for_judgment(store, second.id)
    assert corrected.score == -1 and "rhyme" in (corrected.hint or "").lower()
    assert thanked.score == 1


def test_an_agent_that_echoes_its_history_stays_in_one_session(client: openai.OpenAI, run_dir: Path) -> None:
    """Codex-style: no `previous_response_id`; each request carries the whole input, the answer's function call included."""
    asked = [{"role": "user", "content": WEATHER_QUESTION}]
    first = client.responses.create(model="agent", input=asked, tools=[WEATHER_FUNCTION], temperature=0, max_output_tokens=40)
    calls = [item for item in first.output if item.type == "function_call"]
    assert [call.name for call in calls] == ["get_weather"]  # the fitted model calls the tool
    echoed = [*asked, *(item.model_dump(exclude_none=True) for item in first.output),
              {"type": "function_call_output", "call_id": calls[0].call_id, "output": WEATHER_RESULT}]  # fmt: skip
    second = client.responses.create(model="agent", input=echoed, tools=[WEATHER_FUNCTION], temperature=0, max_output_tokens=40)
    store = Store.for_run_dir(run_dir)
    first_turn, second_turn = store.turns.turn(first.id), store.turns.turn(second.id)
    assert first_turn.session_id == second_turn.session_id
    assert second_turn.messages[-1] == {"role": "tool", "tool_call_id": calls[0].call_id, "content": WEATHER_RESULT}
    assert second_turn.messages[-2]["tool_calls"][0]["function"]["name"] == "get_weather"
    context = store.judging.turn_context(first.id)
    assert context.next_messages == [{"role": "tool", "tool_call_id": calls[0].call_id, "content": WEATHER_RESULT}]


def test_store_false_is_answered_and_never_recorded(client: openai.OpenAI, run_dir: Path) -> None:
    response = client.responses.create(model="agent", input="Name a tea.", max_output_tokens=8, store=False)
    assert response.id.startswith("resp_") and response.store is False
    store = Store.for_run_dir(run_dir)
    assert store.turns.turn(response.id) is None and store.turns.counts()["main_turns"] == 0
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.create(model="agent", input="And another?", previous_response_id=response.id, max_output_tokens=8)


def test_a_client_that_always_sends_store_false_can_opt_in_to_recording(client: openai.OpenAI, run_dir: Path) -> None:
    """Codex CLI sends `store: false` on every request; its provider config can add `X-Clawrl-Record: true`."""
    response = client.responses.create(model="agent", input="Name a tea.", max_output_tokens=8, store=False,
                                       extra_headers={"X-Clawrl-Record": "true"})  # fmt: skip
    turn = Store.for_run_dir(run_dir).turns.turn(response.id)
    assert turn is not None and turn.response_token_ids


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),  # no tool to call
        ({"tool_choice": {"type": "function", "name": "get_mail"}, "tools": [WEATHER_FUNCTION]}, "tool_choice"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
         "input.0.content.0.type"),
        ({"input": []}, "input"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input.0.type"),  # no answer of this server has one to echo
    ],
)
def test_what_cannot_be_honoured_is_refused_and_nothing_is_recorded(client: openai.OpenAI, run_dir: Path, options: dict,
                                                                    param: str) -> None:  # fmt: skip
    body = {"model": "agent", "input": "Name a tea.", "max_output_tokens": 8, **options}
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(**body)
    assert refused.value.status_code == 400 and refused.value.body["param"] == param
    assert Store.for_run_dir(run_dir).turns.counts()["main_turns"] == 0


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}], ids=["required", "named"])
def test_a_forced_tool_call_is_a_function_call_item(client: openai.OpenAI, choice: Any) -> None:
    response = client.responses.create(model="agent", input="Name a tea.", max_output_tokens=60, tools=[WEATHER_FUNCTION],
                                       tool_choice=choice)  # fmt: skip
    (item,) = response.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert isinstance(json.loads(item.arguments), dict)


def test_a_strict_function_tools_calls_hold_its_parameters(client: openai.OpenAI, run_dir: Path) -> None:
    """`strict: true` (the Responses API's own default for function tools, and what the Agents SDK
    sends) under `tool_choice` auto: every call the model chooses to make validates against the
    tool's parameters, which the fitted model's own call (Lyon, no days) would break."""
    # `days` bounded: an unbounded integer lets the random digits run until max_output_tokens cuts the call
    days = {"type": "integer", "minimum": 1, "maximum": 9}
    parameters = {"type": "object", "properties": {"city": {"enum": ["Paris", "Lima"]}, "days": days},
                  "required": ["city", "days"], "additionalProperties": False}  # fmt: skip
    strict = {**WEATHER_FUNCTION, "strict": True, "parameters": parameters}
    responses = [client.responses.create(model="agent", input=WEATHER_QUESTION, max_output_tokens=80, tools=[strict],
                                         temperature=1.0) for _ in range(6)]  # fmt: skip (17 in 20 call, measured)
    calls = [item for response in responses for item in response.output if item.type == "function_call"]
    assert calls, [response.output for response in responses]
    for item in calls:
        arguments = json.loads(item.arguments)
        assert arguments["city"] in ("Paris", "Lima") and arguments["days"] in range(1, 10) and set(arguments) == {"city", "days"}
    store = Store.for_run_dir(run_dir)
    assert all(store.turns.turn(response.id).sampling.grammar for response in responses)


def test_a_json_schema_format_gives_json_that_validates(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"tea": {"enum": ["green", "black", "oolong"]}}, "required": ["tea"],
              "additionalProperties": False}  # fmt: skip
    # a roomy budget: the grammar lets a line break and its indentation between tokens, which this model likes
    response = client.responses.create(model="agent", input="Name a tea.", max_output_tokens=300,
                                       text={"format": {"type": "json_schema", "name": "tea", "schema": schema}})  # fmt: skip
    assert response.status == "completed"
    assert json.loads(response.output_text)["tea"] in ("green", "black", "oolong")
    assert response.text.format.type == "json_schema"


def test_the_key_model_and_previous_id_are_checked(server: ServerThread, client: openai.OpenAI) -> None:
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url, api_key="wrong", max_retries=0).responses.create(model="agent", input="hi")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="hi")
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="agent", input="hi", previous_response_id="resp_nope")
    assert missing.value.body["code"] == "previous_response_not_found"
    raw = httpx.post(server.base_url + "/responses", content=b"{not json", headers={"Authorization": f"Bearer {API_KEY}"})
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "invalid_json"


def test_the_documented_script_runs_as_written(tiny_model_dir: Path, run_dir: Path) -> None:
    """docs/clients.md's Responses section, against the server the page starts."""
    with start_server(tiny_model_dir, run_dir, served_model_name="my-agent", api_key="sk-local") as server:
        output = run_against(server, [sys.executable, "-c"], snippet("The Responses API (openai SDK)", "python"))
    store = Store.for_run_dir(run_dir)
    first_id, *_ = output.split()
    first = store.turns.turn(first_id)
    recorded = [context.turn for context in store.turns.session_turns(first.session_id)]
    assert [turn.id for turn in recorded][0] == first_id and len(recorded) == 2  # the private one is not there
    assert f"recorded as {recorded[1].id}" in output
    assert store.judging.turn_context(first_id).next_messages == [{"role": "user", "content": "no, make it rhyme and keep it short"}]
