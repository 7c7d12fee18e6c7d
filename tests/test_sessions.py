"""Session identity, next states and turn kinds, as unmodified agents exercise them (DESIGN §3), on the
hf engine and on vLLM (`--engine vllm`, issue 14)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from clawrl.engines import Engine
from clawrl.serve.runner import ServerThread
from clawrl.store import Store
from clawrl.store.inspect import session_detail
from tests.helpers import start_server

SYSTEM = {"role": "system", "content": "You are a helpful assistant. " * 50}


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


class Agent:
    """Plays an agent gateway: re-sends history with every request, no session header, no `user`.

    With `ephemeral_context`, every request ends with a fresh context message that the next
    request drops, as real gateways do with their per-request context.
    """

    def __init__(self, http: httpx.Client, ephemeral_context: bool = False, stream: bool = False) -> None:
        self.http, self.ephemeral_context, self.stream = http, ephemeral_context, stream
        self.history: list[dict[str, Any]] = [SYSTEM]
        self.turn_ids: list[str] = []
        self.session_ids: list[str] = []
        self.requests = 0

    def say(self, text: str, **headers: str) -> str:
        self.history.append({"role": "user", "content": [{"type": "text", "text": text}]})
        messages = list(self.history)
        if self.ephemeral_context:
            self.requests += 1
            messages.append({"role": "user", "content": f"[context] request {self.requests}, time 12:0{self.requests}"})
        body = {"model": "tiny", "messages": messages, "max_completion_tokens": 12, "temperature": 1.0}
        if self.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        response = self.http.post("/chat/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        content = _streamed_content(response.text) if self.stream else response.json()["choices"][0]["message"]["content"]
        self.history.append({"role": "assistant", "content": content})
        self.turn_ids.append(response.headers["x-clawrl-turn"])
        self.session_ids.append(response.headers["x-clawrl-session"])
        return content


def _streamed_content(body: str) -> str:
    parts = []
    for line in body.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                parts.append(choice["delta"].get("content") or "")
    return "".join(parts)


@pytest.fixture
def server(tool_model_dir: Path, run_dir: Path, serving_engine: Engine | None) -> Iterator[ServerThread]:
    """Overrides conftest's server: requests here name the model 'tiny'; each test runs on the hf
    engine and on vLLM (`serving_engine`)."""
    with start_server(tool_model_dir, run_dir, served_model_name="tiny", engine=serving_engine) as running:
        yield running


def next_states(store: Store, session_id: str) -> list[dict | None]:
    detail = session_detail(store, session_id)
    assert detail is not None
    return [turn["next_state"] for turn in detail["turns"]]


@pytest.mark.parametrize("ephemeral_context", [False, True], ids=["plain", "ephemeral-context"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_three_turns_without_session_header_are_one_session(http: httpx.Client, store: Store, ephemeral_context: bool, stream: bool) -> None:
    agent = Agent(http, ephemeral_context=ephemeral_context, stream=stream)
    for line in ["first question", "no, I meant the other file", "thanks, that works"]:
        agent.say(line)
    assert len(set(agent.session_ids)) == 1
    states = next_states(store, agent.session_ids[0])
    assert len(states) == 3
    assert states[0]["role"] == "user" and states[0]["content"].startswith("no, I meant the other file")
    assert states[1]["role"] == "user" and states[1]["content"].startswith("thanks, that works")
    assert states[2] is None  # the last turn has no next state yet


def test_interleaved_conversations_stay_apart(http: httpx.Client, store: Store) -> None:
    alice, bob = Agent(http, ephemeral_context=True), Agent(http, ephemeral_context=True)
    for a_line, b_line in [("alice one", "bob one"), ("alice two", "bob two"), ("alice three", "bob three")]:
        alice.say(a_line)
        bob.say(b_line)
    assert len(set(alice.session_ids)) == 1 and len(set(bob.session_ids)) == 1
    assert alice.session_ids[0] != bob.session_ids[0]
    assert next_states(store, alice.session_ids[0])[0]["content"].startswith("alice two")
    assert next_states(store, bob.session_ids[0])[1]["content"].startswith("bob three")


def test_explicit_session_header_body_and_user(http: httpx.Client, store: Store) -> None:
    by_header = Agent(http)
    by_header.say("one", **{"X-Session-Id": "my-session"})
    by_header.say("two", **{"X-Session-Id": "my-session"})
    assert by_header.session_ids == ["my-session", "my-session"]
    assert next_states(store, "my-session")[0]["content"].startswith("two")

    response = http.post("/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "session_id": "body-session"})
    assert response.headers["x-clawrl-session"] == "body-session"
    response = http.post("/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "user": "alice"})
    assert response.headers["x-clawrl-session"] == "user:alice"
    # the header outranks the body, which outranks `user`
    response = http.post(
        "/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "session_id": "b", "user": "u"},
        headers={"X-Session-Id": "h"},
    )
    assert response.headers["x-clawrl-session"] == "h"


def test_side_turns_are_served_but_never_trainable(http: httpx.Client, store: Store) -> None:
    agent = Agent(http)
    agent.say("a main question")
    title = http.post(
        "/chat/completions",
        json={"model": "tiny", "messages": agent.history + [{"role": "user", "content": "Write a title for this chat."}], "max_tokens": 6},
        headers={"X-Turn-Type": "side"},
    )
    assert title.status_code == 200 and title.headers["x-clawrl-turn-kind"] == "side"
    side = store.turns.turn(title.headers["x-clawrl-turn"])
    assert side is not None and side.kind == "side" and not side.trainable
    # a side turn that quotes the conversation does not become the main turn's next state
    assert next_states(store, agent.session_ids[0])[0] is None
    agent.say("the real follow-up")
    assert next_states(store, agent.session_ids[0])[0]["content"].startswith("the real follow-up")
    main = store.turns.turn(agent.turn_ids[0])
    assert main is not None and main.kind == "main" and main.trainable

    body_side = http.post("/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "t"}], "max_tokens": 4, "turn_type": "side"})
    assert body_side.headers["x-clawrl-turn-kind"] == "side"


def test_side_turn_rule_on_system_prompt(tool_model_dir: Path, run_dir: Path, serving_engine: Engine | None) -> None:
    with start_server(tool_model_dir, run_dir, served_model_name="tiny", engine=serving_engine, side_turn_system_regex=r"(?i)generate a title") as running:
        with httpx.Client(base_url=running.base_url, timeout=60) as http:
            messages = [{"role": "system", "content": "Generate a title for the conversation."}, {"role": "user", "content": "hi"}]
            response = http.post("/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 4})
            assert response.headers["x-clawrl-turn-kind"] == "side"
            response = http.post("/chat/completions", json={"model": "tiny", "messages": messages[1:], "max_tokens": 4})
            assert response.headers["x-clawrl-turn-kind"] == "main"


def test_session_done_starts_a_new_session(http: httpx.Client, store: Store) -> None:
    agent = Agent(http)
    agent.say("first")
    agent.say("bye", **{"X-Session-Done": "true"})
    session = store.turns.session(agent.session_ids[0])
    assert session is not None and session.done and session.done_reason == "client"
    agent.say("back again")
    assert agent.session_ids[2] != agent.session_ids[0]
    assert next_states(store, agent.session_ids[0])[1] is None


def test_idle_sessions_are_closed(tool_model_dir: Path, run_dir: Path, serving_engine: Engine | None) -> None:
    with start_server(tool_model_dir, run_dir, served_model_name="tiny", engine=serving_engine, session_idle_timeout_s=0.5) as running:
        with httpx.Client(base_url=running.base_url, timeout=60) as http:
            response = http.post("/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            session_id = response.headers["x-clawrl-session"]
            store = Store.for_run_dir(run_dir)
            deadline = time.monotonic() + 10
            while not store.turns.session(session_id).done:
                assert time.monotonic() < deadline, "idle session was not closed"
                time.sleep(0.1)
            assert store.turns.session(session_id).done_reason == "idle"


def test_feedback_is_recorded_for_a_turn(http: httpx.Client, store: Store) -> None:
    agent = Agent(http)
    agent.say("write me a haiku")
    response = http.post("/feedback", json={"turn": agent.turn_ids[0], "score": -1, "text": "too long"})
    assert response.status_code == 200, response.text
    response = http.post("/feedback", json={"session_id": agent.session_ids[0], "score": 1})
    assert response.status_code == 200 and response.json()["turn"] == agent.turn_ids[0]
    feedback = session_detail(store, agent.session_ids[0])["turns"][0]["feedback"]
    assert [(f["score"], f["text"]) for f in feedback] == [(-1, "too long"), (1, None)]
    assert http.post("/feedback", json={"turn": "chatcmpl-nope", "score": 1}).status_code == 404
    assert http.post("/feedback", json={"turn": agent.turn_ids[0], "score": 5}).status_code == 400
