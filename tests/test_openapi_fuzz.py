"""The typed OpenAPI document (issue 16), and schemathesis' requests generated from it against a real
server.

`GET /openapi.json` describes every endpoint's request body, answers and error object (serve/
openapi.py, from the models of serve/schemas.py). The fuzz loads that document from a real server on
a real port and sends it requests generated from it, valid ones (positive) and invalid ones
(negative), for every POST endpoint (the GET endpoints take no input: a few calls each). It holds:

* no 5xx, ever;
* every 4xx is an OpenAI-style error object `{"error": {"message", "type", "param", "code"}}` (on the
  Messages routes, Anthropic's: `{"type": "error", "error": {"type", "message"}}`);
* every answer is what the document says (its status is documented, its content type, body and
  headers match: schemathesis' conformance checks, server-sent events included);
* a request valid by the document is never refused as malformed (400): the document states every
  rule the server checks about a request's shape. A valid request may still be refused for what it
  names (an unknown turn or episode: 404, one that exists already: 409);
* a good share of the chat requests are answered (200), not only refused.

The fuzz's copy of the document caps `max_tokens` (and the server's default) at a few tokens, so
that the run takes seconds. Generation is derandomized (nearly the same requests on every run);
`CLAWRL_FUZZ_SCALE=10` sends ten times as many (about 4,000 requests, five minutes).

Before the fuzz: the document's structure, and the JSON schemas against the models' validators on the
edges of their rules. After it: the bugs it found, one request each.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from pydantic import BaseModel, ValidationError
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from clawrl.serve.contract import REFUSED_FOR_WHAT_IT_NAMES
from clawrl.serve.openapi import component_schemas
from clawrl.serve.runner import ServerThread
from clawrl.serve.schemas import FORCED_CALL_RULES, ChatCompletionRequest, EpisodeResultRequest, EpisodeStartRequest, FeedbackRequest
from clawrl.wire import ChatMessage
from tests.helpers import start_server

CHAT = "/v1/chat/completions"
FEEDBACK = "/v1/feedback"
EPISODES = "/v1/episodes"
EPISODE_RESULT = "/v1/episodes/{session_id}/result"
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
# Anthropic's Messages API (serve/messages_api.py) refuses with Anthropic's error object, not OpenAI's
ANTHROPIC_PATHS = {MESSAGES, COUNT_TOKENS}
MAX_TOKENS = 8
POSITIVE, NEGATIVE = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE
# CLAWRL_FUZZ_SCALE=10: ten times as many requests (about 4,000, a few minutes)
SCALE = float(os.environ.get("CLAWRL_FUZZ_SCALE", "1"))
# (method, path, how many generated requests: valid, invalid), times SCALE
OPERATIONS = [
    ("POST", CHAT, 100, 60),
    ("POST", "/v1/responses", 60, 40),
    ("POST", MESSAGES, 60, 40),
    ("POST", COUNT_TOKENS, 30, 30),
    ("POST", FEEDBACK, 40, 40),
    ("POST", EPISODES, 40, 40),
    ("POST", EPISODE_RESULT, 40, 40),
    ("GET", "/v1/models", 3, 0),
    ("GET", "/healthz", 3, 0),
    ("GET", "/metrics", 3, 0),
]
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
ERROR_FIELDS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def fuzz_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with start_server(tiny_model_dir, tmp_path_factory.mktemp("fuzz") / "run", default_max_tokens=MAX_TOKENS) as server:
        yield server


def root(server: ServerThread) -> str:
    return server.base_url.removesuffix("/v1")


def document(server: ServerThread) -> dict[str, Any]:
    response = httpx.get(f"{root(server)}/openapi.json", timeout=30)
    assert response.status_code == 200
    return response.json()


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].removeprefix("#/components/schemas/")]
    return schema


def body_schema(doc: dict[str, Any], path: str) -> dict[str, Any]:
    body = doc["paths"][path]["post"]["requestBody"]
    assert body["required"] is True
    return resolve(doc, body["content"]["application/json"]["schema"])


def refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        if isinstance(value.get("$ref"), str):
            yield value["$ref"]
        for item in value.values():
            yield from refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from refs(item)


# --- the document ---------------------------------------------------------------------------------


def test_the_document_describes_the_chat_request_with_clawrls_session_fields(fuzz_server: ServerThread) -> None:
    doc = document(fuzz_server)
    chat = body_schema(doc, CHAT)
    assert set(chat["required"]) == {"model", "messages"}
    served = httpx.get(f"{fuzz_server.base_url}/models", timeout=30).json()["data"][0]["id"]
    assert chat["properties"]["model"]["enum"] == [served]  # any other is a 404
    for field in ("messages", "tools", "tool_choice", "stream", "stream_options", "logprobs", "top_logprobs",
                  "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed", "n", "user"):  # fmt: skip
        assert field in chat["properties"], field
    # clawrl's session fields, described
    assert chat["properties"]["turn_type"]["anyOf"][0]["enum"] == ["main", "side"]
    assert chat["properties"]["session_done"]["type"] == "boolean"
    assert chat["properties"]["session_id"]["anyOf"][0] == {"type": "string", "minLength": 1, "maxLength": 256}
    assert all("clawrl" in chat["properties"][field]["description"] for field in ("session_id", "turn_type", "session_done"))
    assert resolve(doc, chat["properties"]["stream_options"]["anyOf"][0])["properties"]["include_usage"]["type"] == "boolean"
    tool = resolve(doc, chat["properties"]["tools"]["anyOf"][0]["items"])
    assert tool["properties"]["type"]["const"] == "function"
    assert resolve(doc, tool["properties"]["function"])["properties"]["name"]["minLength"] == 1
    # the rule `top_logprobs` needs `logprobs`, stated
    assert {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]} in chat["allOf"][0]["anyOf"]
    assert chat["allOf"][1:] == FORCED_CALL_RULES  # a forced tool call needs tools, and is not also a JSON document
    # a message is one shape per role: what each needs, as the server checks it
    shapes = {shape["title"]: shape for shape in resolve(doc, chat["properties"]["messages"]["items"])["anyOf"]}
    assert set(shapes) == {"SystemMessage", "UserMessage", "AssistantMessage", "AssistantToolCallsMessage", "ToolMessage"}
    assert "content" in shapes["UserMessage"]["required"]
    assert {"content", "tool_call_id"} <= set(shapes["ToolMessage"]["required"])
    assert shapes["ToolMessage"]["properties"]["tool_call_id"]["minLength"] == 1
    calls = shapes["AssistantToolCallsMessage"]["properties"]["tool_calls"]
    assert calls["minItems"] == 1 and "tool_calls" in shapes["AssistantToolCallsMessage"]["required"]
    call = resolve(doc, calls["items"])
    assert resolve(doc, call["properties"]["function"])["required"] == ["name"]
    # the same fields as headers
    headers = {p["name"]: p for p in doc["paths"][CHAT]["post"]["parameters"] if p["in"] == "header"}
    assert set(headers) == {"X-Session-Id", "X-Turn-Type", "X-Session-Done", "X-Clawrl-Train", "X-Clawrl-Memory"}
    assert headers["X-Turn-Type"]["schema"]["enum"] == ["main", "side"]


def test_the_document_describes_feedback_episodes_answers_and_errors(fuzz_server: ServerThread) -> None:
    doc = document(fuzz_server)
    feedback = body_schema(doc, FEEDBACK)
    assert feedback["required"] == ["score"] and feedback["properties"]["score"]["enum"] == [1, -1]
    assert {"session_id", "turn", "text"} <= set(feedback["properties"])
    assert {branch["required"][0] for branch in feedback["anyOf"]} == {"turn", "session_id"}  # one of them, at least
    assert body_schema(doc, EPISODES)["properties"]["group_size"]["maximum"] == 4096
    assert "final_observation" in body_schema(doc, EPISODE_RESULT)["properties"]

    error = resolve(doc, {"$ref": "#/components/schemas/ErrorResponse"})
    detail = resolve(doc, error["properties"]["error"])
    assert set(detail["required"]) == ERROR_FIELDS
    answers = {CHAT: "ChatCompletion", FEEDBACK: "FeedbackResponse", EPISODES: "EpisodeStartResponse",
               EPISODE_RESULT: "EpisodeResultResponse", "/v1/models": "ModelList", "/healthz": "Health"}  # fmt: skip
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "422" not in responses, f"{method} {path}: this server answers 400, never 422"
            if path.startswith("/v1/"):
                assert "400" in responses or method == "get", f"{method} {path}"
                error_model = "AnthropicErrorResponse" if path in ANTHROPIC_PATHS else "ErrorResponse"
                for status, response in responses.items():
                    if status.startswith("4"):
                        assert response["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{error_model}"}
    for path, model in answers.items():
        operation = next(iter(doc["paths"][path].values()))
        assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model}"}
    # a stream's events, each a chunk as JSON (or `[DONE]`), and the answer's headers
    ok = doc["paths"][CHAT]["post"]["responses"]["200"]
    event = ok["content"]["text/event-stream"]["schema"]["properties"]["data"]["anyOf"]
    chunk = {"$ref": "#/components/schemas/ChatCompletionChunk"}
    assert {"type": "string", "contentMediaType": "application/json", "contentSchema": chunk} in event
    assert {"const": "[DONE]"} in event
    assert {"X-Clawrl-Turn", "X-Clawrl-Session", "X-Clawrl-Policy-Version", "X-Clawrl-Turn-Kind"} <= set(ok["headers"])
    assert "text/plain" in doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    # every reference resolves
    names = set(doc["components"]["schemas"])
    assert {ref.removeprefix("#/components/schemas/") for ref in refs(doc)} <= names


def test_with_an_api_key_the_document_says_how_to_send_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    with start_server(tiny_model_dir, tmp_path / "run", api_key="k") as server:
        doc = document(server)  # the document itself needs no key
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    # Anthropic's SDKs send the key as `x-api-key` (serve/messages_api.py)
    assert doc["components"]["securitySchemes"]["apiKey"] == {"type": "apiKey", "in": "header", "name": "x-api-key"}
    assert doc["paths"][MESSAGES]["post"]["security"] == [{"apiKey": []}, {"bearer": []}]
    assert doc["paths"][CHAT]["post"]["security"] == [{"bearer": []}]
    assert "security" not in doc["paths"]["/healthz"]["get"]


CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
CHAT_BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
# (model, body, valid): edges of the rules the models check in validators, which their JSON
# schemas state too; the fuzz finds disagreements where valid requests get a 400, these pin both ways
AGREEMENT = [
    (ChatMessage, {"role": "user", "content": "hi"}, True),
    (ChatMessage, {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "input_text", "text": "!"}]}, True),
    (ChatMessage, {"role": "developer", "content": []}, True),
    (ChatMessage, {"role": "user", "content": "hi", "tool_calls": []}, True),
    (ChatMessage, {"role": "user", "content": "hi", "tool_calls": None, "tool_call_id": "c1", "name": "n"}, True),
    (ChatMessage, {"role": "user"}, False),
    (ChatMessage, {"role": "system", "content": None}, False),
    (ChatMessage, {"role": "user", "content": "hi", "tool_calls": [CALL]}, False),
    (ChatMessage, {"role": "assistant", "content": ""}, True),
    (ChatMessage, {"role": "assistant", "tool_calls": [CALL]}, True),
    (ChatMessage, {"role": "assistant", "content": None, "tool_calls": [CALL]}, True),
    (ChatMessage, {"role": "assistant", "content": "x", "tool_calls": []}, True),
    (ChatMessage, {"role": "assistant", "content": [], "tool_calls": None}, True),
    (ChatMessage, {"role": "assistant"}, False),
    (ChatMessage, {"role": "assistant", "content": None, "tool_calls": []}, False),
    (ChatMessage, {"role": "assistant", "tool_calls": [{"function": {"name": ""}}]}, False),
    (ChatMessage, {"role": "tool", "content": "42", "tool_call_id": "c1"}, True),
    (ChatMessage, {"role": "tool", "content": "42"}, False),
    (ChatMessage, {"role": "tool", "content": "42", "tool_call_id": ""}, False),
    (ChatMessage, {"role": "tool", "content": "42", "tool_call_id": "c1", "tool_calls": [CALL]}, False),
    (ChatMessage, {"role": "wizard", "content": "hi"}, False),
    (ChatMessage, {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, False),
    (ChatCompletionRequest, {**CHAT_BASE, "top_logprobs": 3, "logprobs": True}, True),
    (ChatCompletionRequest, {**CHAT_BASE, "top_logprobs": 0}, True),
    (ChatCompletionRequest, {**CHAT_BASE, "top_logprobs": None, "logprobs": False}, True),
    (ChatCompletionRequest, {**CHAT_BASE, "top_logprobs": 3}, False),
    (ChatCompletionRequest, {**CHAT_BASE, "top_logprobs": 3, "logprobs": False}, False),
    (ChatCompletionRequest, {**CHAT_BASE, "session_id": ""}, False),
    (ChatCompletionRequest, {**CHAT_BASE, "stop": ["a", "b", "c", "d"], "seed": -(2**63)}, True),
    (FeedbackRequest, {"turn": "t", "score": 1}, True),
    (FeedbackRequest, {"session_id": "s", "score": -1.0}, True),
    (FeedbackRequest, {"session_id": "s", "turn": None, "score": -1}, True),
    (FeedbackRequest, {"score": 1}, False),
    (FeedbackRequest, {"session_id": None, "turn": None, "score": 1}, False),
    (FeedbackRequest, {"turn": "t", "score": 0}, False),
    (FeedbackRequest, {"turn": "t", "score": 0.5}, False),
    (FeedbackRequest, {"turn": "t", "score": True}, False),
    (EpisodeStartRequest, {"session_id": "s", "env": "e", "task": "t", "group_id": "g", "group_size": 4.0, "seed": 0}, True),
    (EpisodeStartRequest, {"session_id": "s", "env": "e", "task": "t", "group_id": "g", "group_size": "4", "seed": 0}, False),
    (EpisodeResultRequest, {"reward": 0.5}, True),
    (EpisodeResultRequest, {"failed": True}, True),
    (EpisodeResultRequest, {"failed": True, "reward": None}, True),
    (EpisodeResultRequest, {}, False),
    (EpisodeResultRequest, {"failed": False, "reward": None}, False),
    (EpisodeResultRequest, {"reward": 1, "final_observation": [{"role": "tool", "content": "x"}]}, False),
]


@pytest.mark.parametrize("model, body, valid", AGREEMENT)
def test_the_json_schema_accepts_what_the_model_accepts(model: type[BaseModel], body: dict[str, Any], valid: bool) -> None:
    document = {"$ref": f"#/components/schemas/{model.__name__}", "components": {"schemas": component_schemas()}}
    assert jsonschema_rs.Draft202012Validator(document).is_valid(body) is valid
    try:
        model.model_validate(body)
        accepted = True
    except ValidationError:
        accepted = False
    assert accepted is valid


# --- the fuzz -------------------------------------------------------------------------------------


@dataclass
class Call:
    operation: str
    mode: str
    status: int
    error: Any  # the 4xx body's "error" object, or what came instead
    failures: str | None  # what schemathesis' checks found wrong with the answer
    request: str  # to reproduce it


def fuzz_document(doc: dict[str, Any]) -> dict[str, Any]:
    """The document as the fuzz reads it: a few tokens per answer; and a Messages request ends with a
    user message (the one rule JSON Schema cannot state, said in the document's description), here
    up to three messages long."""
    doc = json.loads(json.dumps(doc))
    request = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    for field in ("max_tokens", "max_completion_tokens"):
        request[field]["anyOf"][0]["maximum"] = MAX_TOKENS
    messages_request = doc["components"]["schemas"]["AnthropicMessagesRequest"]["properties"]
    messages_request["max_tokens"]["maximum"] = MAX_TOKENS
    any_message, user = messages_request["messages"]["items"], {"$ref": "#/components/schemas/AnthropicUserMessageParam"}
    messages_request["messages"] = {"type": "array", "anyOf": [
        {"prefixItems": [any_message] * before + [user], "minItems": before + 1, "maxItems": before + 1} for before in range(3)
    ]}  # fmt: skip
    return doc


def fuzz(server: ServerThread) -> list[Call]:
    base = root(server)
    served = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
    schema = schemathesis.openapi.from_dict(fuzz_document(document(server)))
    calls: list[Call] = []

    def send(case: schemathesis.Case, mode: str) -> schemathesis.Response:
        response = case.call(base_url=base, timeout=120)
        try:
            case.validate_response(response, checks=CHECKS)
            failures = None
        except FailureGroup as group:  # reported by the test, with the request
            failures = str(group)
        error: Any = None
        if response.status_code >= 400:
            try:
                error = response.json()
            except ValueError:
                error = response.text[:200]
        calls.append(Call(f"{case.method} {case.path}", mode, response.status_code, error, failures, case.as_curl_command()))
        return response

    for method, path, *counts in OPERATIONS:
        operation = schema[path][method]
        for mode, examples in zip((POSITIVE, NEGATIVE), counts):
            if not examples:
                continue

            @settings(max_examples=round(examples * SCALE), derandomize=True, database=None, deadline=None,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
            @given(case=operation.as_strategy(generation_mode=mode))
            def generated(case: schemathesis.Case) -> None:
                send(case, mode.value)  # noqa: B023 - called in this iteration

            generated()

    # and the answers few generated requests get (feedback needs a recorded turn), checked the same way
    def explicit(method: str, path: str, body: dict[str, Any], **path_parameters: str) -> schemathesis.Response:
        case = schema[path][method].Case(body=body, media_type="application/json", path_parameters=path_parameters)
        return send(case, "explicit")

    messages = [{"role": "user", "content": "hello"}]
    answer = explicit("POST", CHAT, {"model": served, "messages": messages, "stream": True,
                                     "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2})  # fmt: skip
    turn = json.loads(answer.text.split("data: ", 2)[1])["id"]
    explicit("POST", FEEDBACK, {"turn": turn, "score": 1, "text": "good"})
    explicit("POST", CHAT, {"model": served, "messages": messages, "session_id": "fuzz-session"})
    explicit("POST", FEEDBACK, {"session_id": "fuzz-session", "score": -1})
    explicit("POST", EPISODES, {"session_id": "fuzz-episode", "env": "e", "task": "t", "group_id": "g", "group_size": 1, "seed": 0})
    explicit("POST", EPISODE_RESULT, {"failed": True, "error": "gave up"}, session_id="fuzz-episode")
    call = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}}
    history = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": [{"type": "text", "text": "hi"}, call]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}]}]  # fmt: skip
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    explicit("POST", MESSAGES, {"model": served, "max_tokens": 4, "messages": history, "tools": tools, "stream": True})
    explicit("POST", COUNT_TOKENS, {"model": served, "messages": history, "tools": tools, "system": "be brief"})
    return calls


def is_openai_error(body: Any) -> bool:
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return False
    error = body["error"]
    return (
        set(error) == ERROR_FIELDS
        and isinstance(error["message"], str)
        and bool(error["message"])
        and isinstance(error["type"], str)
        and all(error[key] is None or isinstance(error[key], str) for key in ("param", "code"))
    )


def is_anthropic_error(body: Any) -> bool:
    """Anthropic's error object: `{"type": "error", "error": {"type", "message"}}`."""
    if not isinstance(body, dict) or set(body) != {"type", "error"} or body["type"] != "error":
        return False
    error = body["error"]
    return isinstance(error, dict) and set(error) == {"type", "message"} and all(isinstance(error[key], str) and error[key] for key in error)


def is_anthropic_route(call: Call) -> bool:
    return call.operation.split(" ", 1)[1] in ANTHROPIC_PATHS


def is_error_object(call: Call) -> bool:
    """The error object of the route's API: Anthropic's on the Messages routes, OpenAI's elsewhere."""
    return is_anthropic_error(call.error) if is_anthropic_route(call) else is_openai_error(call.error)


def names_what_cannot_be(call: Call) -> bool:
    """A 400 for what the request names rather than for its shape (`serve.contract`): its own codes, and
    on the Messages routes the same messages."""
    if call.status != 400:
        return False
    if is_anthropic_route(call):
        return "cannot be honoured" in call.error["error"]["message"]
    return call.error["error"]["code"] in REFUSED_FOR_WHAT_IT_NAMES


def refusal(call: Call) -> str:
    """What refused a 400: the OpenAI error's code, or the field an Anthropic error's message names first."""
    if is_anthropic_route(call):
        return call.error["error"]["message"].split(":", 1)[0]
    return call.error["error"]["code"]


def test_schema_generated_requests_get_no_server_error_and_openai_errors(fuzz_server: ServerThread) -> None:
    started = time.perf_counter()
    calls = fuzz(fuzz_server)
    elapsed = time.perf_counter() - started
    statuses = Counter((call.operation, call.mode, call.status) for call in calls)
    print(f"\n{len(calls)} requests in {elapsed:.0f} s")
    for (operation, mode, status), count in sorted(statuses.items()):
        print(f"  {operation:42} {mode:8} {status}: {count}")

    def show(bad: list[Call]) -> str:
        return "\n\n".join(f"{call.status} {call.error or ''}\n{call.failures or ''}\n{call.request}" for call in bad[:3])

    assert {call.operation for call in calls} == {f"{method} {path}" for method, path, _, _ in OPERATIONS}
    server_errors = [call for call in calls if call.status >= 500]
    assert not server_errors, show(server_errors)
    not_openai = [call for call in calls if 400 <= call.status < 500 and not is_error_object(call)]
    assert not not_openai, show(not_openai)
    nonconforming = [call for call in calls if call.failures]
    assert not nonconforming, show(nonconforming)
    # valid by the document, so never malformed: the document states every rule about a request's shape;
    # refused only for what it names (a function not among its tools, a schema no grammar can hold)
    refused = [call for call in calls if call.mode != "negative" and call.status == 400 and not names_what_cannot_be(call)]
    assert not refused, show(refused)
    chat = [call for call in calls if call.operation == f"POST {CHAT}"]
    answered = sum(call.status == 200 for call in chat)
    assert answered >= 0.2 * len(chat), statuses
    assert all(call.status == 200 for call in chat if call.mode != "negative" and not names_what_cannot_be(call)), statuses
    messages = [call for call in calls if call.operation in (f"POST {MESSAGES}", f"POST {COUNT_TOKENS}")]
    assert all(call.status == 200 for call in messages if call.mode != "negative" and not names_what_cannot_be(call)), statuses
    assert all(call.status == 200 for call in calls if call.mode == "explicit"), statuses
    # the invalid requests were refused as such, with the error object (and not all of them by one rule)
    for method, path, _, invalid in OPERATIONS:
        if invalid:
            codes = {refusal(call) for call in calls if call.operation == f"{method} {path}" and call.status == 400}
            assert len(codes) >= 2, (path, codes)


# --- what the fuzz found ---------------------------------------------------------------------------


@pytest.fixture
def http(fuzz_server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_server.base_url, timeout=60) as client:
        yield client


def chat(http: httpx.Client, **fields: Any) -> httpx.Response:
    model = http.get("/models").json()["data"][0]["id"]
    return http.post("/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}], **fields})


@pytest.mark.parametrize("sampling", [{"top_p": 5e-324}, {"temperature": 1e-300}], ids=["top_p", "temperature"])
def test_a_vanishing_top_p_or_temperature_is_answered(http: httpx.Client, sampling: dict[str, float]) -> None:
    """Valid (top_p > 0, temperature >= 0) but below float32's range: the hf engine's draw had no token (a 500)."""
    response = chat(http, max_tokens=4, **sampling)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("fields", [{"session_id": "café ☕ 100%"}, {"user": "zoë\nline"}], ids=["session_id", "user"])
def test_a_session_id_a_header_cannot_carry_comes_back_percent_encoded(http: httpx.Client, fields: dict[str, str]) -> None:
    """The session id is echoed in `X-Clawrl-Session`; beyond latin-1 (or with a control character)
    Starlette could not encode the header (a 500)."""
    response = chat(http, max_tokens=2, **fields)
    assert response.status_code == 200, response.text
    session = response.headers["x-clawrl-session"]
    assert session.isascii() and " " not in session
    expected = fields.get("session_id") or f"user:{fields['user']}"
    assert urllib.parse.unquote(session) == expected


def test_integers_are_json_integers(http: httpx.Client) -> None:
    """`1.0` is an integer to JSON Schema (and JSON): the document's `"type": "integer"` fields took
    `1` but refused `1.0` (`score`, `group_size`, `seed`); booleans and strings stay refused."""
    turn = chat(http, max_tokens=2).headers["x-clawrl-turn"]
    assert http.post("/feedback", json={"turn": turn, "score": -1.0}).status_code == 200
    assert http.post("/feedback", json={"turn": turn, "score": True}).status_code == 400
    episode = {"session_id": "fuzz-integers", "env": "e", "task": "t", "group_id": "g", "group_size": 2.0, "seed": 7.0}
    assert http.post("/episodes", json=episode).status_code == 200
    assert http.post("/episodes", json={**episode, "session_id": "fuzz-strings", "seed": "7"}).status_code == 400


@pytest.mark.parametrize("depth", [500, 2000])
def test_tool_call_arguments_nested_deep_are_kept_as_a_string(http: httpx.Client, depth: int) -> None:
    """Found next to the fuzz (its strings are short): a tool call's `arguments` string is parsed to
    render the prompt; "[[[...]]]" 500 levels deep overflowed the template's recursion, 2,000 the
    JSON parser's (a 500 either way). Past 64 levels it now stays the string it was."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * depth + "]" * depth}}
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "r"}]  # fmt: skip
    response = chat(http, max_tokens=2, messages=messages)
    assert response.status_code == 200, response.text


def test_tool_call_arguments_with_a_5000_digit_integer_are_kept_as_a_string(http: httpx.Client) -> None:
    """Issue 26: the arguments string is parsed to render the prompt, and json.loads raises
    ValueError (not JSONDecodeError) on an integer over 4,300 digits (a 500). It stays the string."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"n": ' + "1" * 5000 + "}"}}
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "r"}]  # fmt: skip
    response = chat(http, max_tokens=2, messages=messages)
    assert response.status_code == 200, response.text
