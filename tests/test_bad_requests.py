"""Bad requests against a real server: each gets the right 4xx and an OpenAI-style error object.

DESIGN §3: "Bad input gets an OpenAI-style error object with a 4xx code, never a 500." Every row
of the table below is one thing a buggy or hostile client can send; each must come back as
`{"error": {"message", "type", "code", "param"}}` with a message a person can act on (no
traceback, no pydantic dump), and none of them may leave a turn in the store.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from clawrl.serve.runner import ServerThread
from clawrl.store import Store
from tests.helpers import WEATHER_TOOL, start_server

API_KEY = "secret-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
BODY_LIMIT = 65536
CONTEXT_WINDOW = 32768  # the tiny model's max_position_embeddings
CHAT = "/v1/chat/completions"
FEEDBACK = "/v1/feedback"
# `type` of the error object by status, as OpenAI's API (and its SDKs) expect them
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
}
# signs that an internal error or a validation library leaked into what the client reads
LEAKS = ("Traceback", "pydantic", "instance of", 'File "')
ANY = object()  # `param` is not checked


def chat(**overrides: Any) -> dict[str, Any]:
    """A valid chat request, changed by `overrides` (a value of `None` removes the key)."""
    body: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    body.update(overrides)
    return {key: value for key, value in body.items() if value is not None}


# An integer of 5,000 digits: Python refuses to convert one over 4,300 (a ValueError, not a
# JSONDecodeError) and json.dumps cannot write one, so these bodies are spelled as raw bytes.
HUGE_INTEGER = "1" * 5000


def with_huge_integer(body: Any) -> bytes:
    """`body` as JSON, each string "HUGE" in it replaced by the 5,000-digit integer."""
    return json.dumps(body).replace('"HUGE"', HUGE_INTEGER).encode()


def chunked(total: int, piece: int = 4096) -> Callable[[], Iterator[bytes]]:
    """A body sent with `Transfer-Encoding: chunked`: no Content-Length to refuse it up front."""

    def pieces() -> Iterator[bytes]:
        sent = 0
        while sent < total:
            yield b" " * piece
            sent += piece

    return pieces


@dataclass(frozen=True)
class BadRequest:
    name: str
    status: int
    code: str
    body: Any = None  # sent as JSON unless `content` is given
    content: bytes | Callable[[], Iterator[bytes]] | None = None  # raw bytes, or a chunked stream
    method: str = "POST"
    path: str = CHAT
    headers: dict[str, str | None] = field(default_factory=dict)  # merged over AUTH; None removes
    param: Any = ANY
    says: str | None = None  # a phrase the message must contain (the part a person acts on)
    never_says: tuple[str, ...] = ()  # e.g. the API key a client sent


BAD_REQUESTS = [
    # --- the body is not a JSON object ---------------------------------------------------------
    BadRequest("malformed-json", 400, "invalid_json", content=b'{"model": "tiny", "messages": [', says="not valid JSON"),
    BadRequest("empty-body", 400, "invalid_json", content=b"", says="empty"),
    BadRequest("json-list", 400, "invalid_value", body=[chat()], says="JSON object"),
    BadRequest("json-number", 400, "invalid_value", content=b"42", says="JSON object"),
    BadRequest("invalid-utf8", 400, "invalid_json", content=b'{"model": "\xff\xfe"}'),
    # a lone surrogate parses in Python but cannot be encoded: the tokenizer used to raise (a 500)
    BadRequest(
        "lone-surrogate",
        400,
        "invalid_json",
        content=b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}',
        says="surrogate",
    ),
    # fits the size limit, but used to overflow json.loads' recursion (a 500)
    BadRequest("nested-too-deep", 400, "invalid_json", content=b"[" * 30_000 + b"]" * 30_000, says="nested"),
    # parses, but used to overflow the chat template's recursion when rendering the tools (a 500)
    BadRequest(
        "tool-schema-too-deep",
        400,
        "invalid_json",
        body=chat(
            tools=[{**WEATHER_TOOL, "function": {"name": "f", "parameters": json.loads('{"a": ' * 500 + "1" + "}" * 500)}}]
        ),
        says="nested",
    ),
    # json.loads raises ValueError on integers over 4,300 digits: these used to be a 500
    BadRequest("integer-5000-digits", 400, "invalid_json", content=with_huge_integer(chat(max_tokens="HUGE")), says="digits"),
    BadRequest(
        "integer-5000-digits-nested",
        400,
        "invalid_json",
        content=with_huge_integer(chat(tools=[{**WEATHER_TOOL, "function": {"name": "f", "parameters": {"default": ["HUGE"]}}}])),
        says="digits",
    ),
    BadRequest("integer-5000-digits-unknown-field", 400, "invalid_json", content=with_huge_integer(chat(extra="HUGE")), says="digits"),
    # JSON has no NaN or Infinity, and 1e400 overflows to inf: none can be written back as JSON (a
    # tool schema holding one is stored as is, and PostgreSQL's json column refused it: a 500)
    BadRequest(
        "number-beyond-float-range-in-tool-schema",
        400,
        "invalid_json",
        content=json.dumps(chat(tools=[{**WEATHER_TOOL, "function": {"name": "f", "parameters": {"default": "BIG"}}}]))
        .replace('"BIG"', "1e400")
        .encode(),
        says="not finite",
    ),
    BadRequest("nan-in-unknown-field", 400, "invalid_json", content=json.dumps(chat(extra=float("nan"))).encode(), says="not finite"),
    # --- messages ------------------------------------------------------------------------------
    BadRequest("missing-messages", 400, "invalid_value", body=chat(messages=None), param="messages", says="Field required"),
    BadRequest("empty-messages", 400, "invalid_value", body=chat(messages=[]), param="messages", says="at least 1"),
    BadRequest("messages-not-a-list", 400, "invalid_value", body=chat(messages="hello"), param="messages", says="valid list"),
    BadRequest("message-not-an-object", 400, "invalid_value", body=chat(messages=[None]), param="messages.0", says="JSON object"),
    BadRequest(
        "unknown-role",
        400,
        "invalid_value",
        body=chat(messages=[{"role": "wizard", "content": "hi"}]),
        param="messages.0.role",
        says="'user'",
    ),
    BadRequest(
        "user-without-content",
        400,
        "invalid_value",
        body=chat(messages=[{"role": "user"}]),
        param="messages.0",
        says="needs content",
    ),
    BadRequest(
        "tool-without-tool-call-id",
        400,
        "invalid_value",
        body=chat(messages=[{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}]),
        param="messages.1",
        says="tool_call_id",
    ),
    BadRequest(
        "assistant-without-content-or-calls",
        400,
        "invalid_value",
        body=chat(messages=[{"role": "user", "content": "hi"}, {"role": "assistant"}, {"role": "user", "content": "?"}]),
        param="messages.1",
        says="content or tool_calls",
    ),
    # the error must point at the part's type, not say "should be a valid string" about a list
    BadRequest(
        "image-content-part",
        400,
        "invalid_value",
        body=chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]}]),
        param="messages.0.content.0.type",
        says="'text'",
    ),
    # --- sampling parameters -------------------------------------------------------------------
    BadRequest("temperature-negative", 400, "invalid_value", body=chat(temperature=-1), param="temperature"),
    BadRequest("temperature-3", 400, "invalid_value", body=chat(temperature=3), param="temperature"),
    BadRequest("top-p-0", 400, "invalid_value", body=chat(top_p=0), param="top_p"),
    BadRequest("top-p-1.5", 400, "invalid_value", body=chat(top_p=1.5), param="top_p"),
    BadRequest("max-tokens-0", 400, "invalid_value", body=chat(max_tokens=0), param="max_tokens"),
    BadRequest(
        "max-completion-tokens-negative", 400, "invalid_value", body=chat(max_completion_tokens=-5), param="max_completion_tokens"
    ),
    BadRequest("n-2", 400, "invalid_value", body=chat(n=2), param="n"),
    BadRequest("top-logprobs-30", 400, "invalid_value", body=chat(logprobs=True, top_logprobs=30), param="top_logprobs"),
    BadRequest("top-logprobs-without-logprobs", 400, "invalid_value", body=chat(top_logprobs=3), says="logprobs"),
    # the error must name the real problem, not "should be a valid string" (the str branch of the union)
    BadRequest(
        "five-stop-strings", 400, "invalid_value", body=chat(stop=["a", "b", "c", "d", "e"]), param="stop", says="at most 4"
    ),
    BadRequest("stream-not-a-boolean", 400, "invalid_value", body=chat(stream="sometimes"), param="stream"),
    # torch's generator takes at most 64 bits: a bigger seed used to fail inside the engine (a 500)
    BadRequest("seed-beyond-int64", 400, "invalid_value", body=chat(seed=2**70, temperature=1.0), param="seed"),
    BadRequest(
        "tool-of-unknown-type",
        400,
        "invalid_value",
        body=chat(tools=[{"type": "retrieval", "function": {"name": "search"}}]),
        param="tools.0.type",
        says="'function'",
    ),
    # --- auth, model, size, context ----------------------------------------------------------
    BadRequest("no-authorization", 401, "invalid_api_key", body=chat(), headers={"Authorization": None}),
    BadRequest(
        "wrong-api-key",
        401,
        "invalid_api_key",
        body=chat(),
        headers={"Authorization": "Bearer not-the-key-7f3a9"},
        never_says=("not-the-key-7f3a9", API_KEY),
    ),
    BadRequest(
        "key-without-bearer", 401, "invalid_api_key", body=chat(), headers={"Authorization": API_KEY}, never_says=(API_KEY,)
    ),
    BadRequest(
        "models-without-authorization", 401, "invalid_api_key", method="GET", path="/v1/models", headers={"Authorization": None}
    ),
    BadRequest("unknown-model", 404, "model_not_found", body=chat(model="gpt-9"), param="model", says="gpt-9"),
    BadRequest(
        "body-over-limit",
        413,
        "request_too_large",
        content=json.dumps(chat(messages=[{"role": "user", "content": "a" * (BODY_LIMIT + 10)}])).encode(),
    ),
    BadRequest("chunked-body-over-limit", 413, "request_too_large", content=chunked(BODY_LIMIT + 8192)),
    BadRequest(
        "prompt-plus-max-tokens-over-context",
        400,
        "context_length_exceeded",
        body=chat(max_tokens=CONTEXT_WINDOW + 1000),
        param="messages",
        says=str(CONTEXT_WINDOW),
    ),
    # --- routes and headers ------------------------------------------------------------------
    BadRequest("unknown-route", 404, "not_found", path="/v1/completions-typo", body=chat()),
    BadRequest("get-chat-completions", 405, "method_not_allowed", method="GET"),
    BadRequest(
        "bad-turn-type-header", 400, "invalid_turn_type", body=chat(), headers={"X-Turn-Type": "sidekick"}, says="X-Turn-Type"
    ),
    BadRequest("session-id-header-too-long", 400, "invalid_session_id", body=chat(), headers={"X-Session-Id": "s" * 300}),
    # --- feedback ------------------------------------------------------------------------------
    BadRequest("feedback-bad-score", 400, "invalid_value", path=FEEDBACK, body={"turn": "chatcmpl-x", "score": 5}, param="score"),
    BadRequest("feedback-score-true", 400, "invalid_value", path=FEEDBACK, body={"turn": "chatcmpl-x", "score": True}, param="score"),
    # 1.0 is the integer 1 to JSON (and to the OpenAPI document's `"type": "integer"`), 0.5 is not
    BadRequest("feedback-score-float", 400, "invalid_value", path=FEEDBACK, body={"turn": "chatcmpl-x", "score": 0.5}, param="score"),
    BadRequest(
        "feedback-score-5000-digits",
        400,
        "invalid_json",
        path=FEEDBACK,
        content=with_huge_integer({"turn": "chatcmpl-x", "score": "HUGE"}),
        says="digits",
    ),
    BadRequest("feedback-without-target", 400, "invalid_value", path=FEEDBACK, body={"score": 1}, says="session_id"),
    BadRequest(
        "feedback-unknown-turn", 404, "turn_not_found", path=FEEDBACK, body={"turn": "chatcmpl-nope", "score": 1}, param="turn"
    ),
    BadRequest(
        "feedback-unknown-session",
        404,
        "session_not_found",
        path=FEEDBACK,
        body={"session_id": "nobody", "score": -1},
        param="session_id",
    ),
]


@pytest.fixture(scope="module")
def bad_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # module-scoped (the conftest `run_dir` is per test): one server answers the whole table
    return tmp_path_factory.mktemp("bad-requests") / "run"


@pytest.fixture(scope="module")
def guarded_server(tool_model_dir: Path, bad_run_dir: Path) -> Iterator[ServerThread]:
    with start_server(
        tool_model_dir, bad_run_dir, served_model_name="tiny", api_key=API_KEY, max_body_bytes=BODY_LIMIT
    ) as running:
        yield running


@pytest.fixture(scope="module")
def http(guarded_server: ServerThread) -> Iterator[httpx.Client]:
    root = guarded_server.base_url.removesuffix("/v1")
    with httpx.Client(base_url=root, timeout=60) as client:
        yield client


def send(http: httpx.Client, case: BadRequest) -> httpx.Response:
    headers: dict[str, str] = {**AUTH, "Content-Type": "application/json"}
    for name, value in case.headers.items():
        headers.pop(name, None)
        if value is not None:
            headers[name] = value
    if case.content is not None:
        content = case.content() if callable(case.content) else case.content
    elif case.body is not None:
        content = json.dumps(case.body).encode()
    else:
        content = None
    return http.request(case.method, case.path, content=content, headers=headers)


@pytest.mark.parametrize("case", [pytest.param(case, id=case.name) for case in BAD_REQUESTS])
def test_bad_request_gets_an_openai_error(http: httpx.Client, case: BadRequest) -> None:
    response = send(http, case)

    assert response.status_code == case.status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert error["code"] == case.code
    assert error["type"] == ERROR_TYPES[case.status]
    message = error["message"]
    assert isinstance(message, str) and message.strip()
    for leak in LEAKS:
        assert leak not in message, f"{leak!r} leaked into {message!r}"
    assert error["param"] is None or isinstance(error["param"], str)
    if case.param is not ANY:
        assert error["param"] == case.param
    if case.says is not None:
        assert case.says in message
    for secret in case.never_says:
        assert secret not in message
        assert secret not in response.text


def test_method_not_allowed_says_which_methods_are(http: httpx.Client) -> None:
    response = http.get(CHAT, headers=AUTH)
    assert response.status_code == 405
    assert "POST" in response.headers.get("allow", "")


def test_server_still_serves_and_recorded_no_bad_request(http: httpx.Client, bad_run_dir: Path) -> None:
    # Send the whole table again (it is cheap), so this test stands on its own whatever ran before.
    for case in BAD_REQUESTS:
        assert send(http, case).status_code == case.status, case.name

    response = http.post(CHAT, json=chat(max_tokens=6, temperature=0), headers=AUTH)
    assert response.status_code == 200, response.text
    completion = response.json()
    assert completion["choices"][0]["finish_reason"] in ("stop", "length")

    store = Store.for_run_dir(bad_run_dir)
    try:
        sessions = store.turns.list_sessions(limit=1000)
        turns = [entry.turn for session in sessions for entry in store.turns.session_turns(session.id)]
        assert [turn.id for turn in turns] == [completion["id"]], "a refused request was recorded as a turn"
    finally:
        store.close()
