"""Attacks on the several-users boundary (issue 32, item 1; DESIGN §12), each kept as a test.

One real `clawrl serve` (a process of its own, started as a person starts it, logging JSON to a file
the last test reads) on a real port over a real SQLite store, with an admin key and two users, alice
and bob, added with `clawrl users add` before it starts. bob is the attacker: he holds a valid key
of his own and wants alice's sessions, turns and feedback; someone else holds no key at all.

The promise under attack: a user's key reaches only that user's sessions, turns and feedback;
another user's ids answer 404 (the same as ids that do not exist); echoing another user's answer
never joins their session; a session a user names cannot be another user's; a server with users
refuses requests without a valid key; the dashboard shows a user their own records only; /metrics (and
the other open routes) carry no conversation text; keys are never stored in plaintext nor logged.

Three attacks succeeded when these were written, and were fixed: a user's name under their prefix
("alice/inbox") could be a session the admin had named, which the user then wrote into; a new user
given a removed user's name reached the removed user's records; a non-ASCII HTTP Basic header made
the dashboard answer 500.
"""

from __future__ import annotations

import base64
import itertools
import json
import secrets
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from clawrl.serve.runner import free_port
from clawrl.store import Store
from clawrl.store.users import UserError
from tests.helpers import healthz, user, wait_until

ADMIN_KEY = "sk-admin-attacks-" + secrets.token_hex(16)  # random, so that a grep of the log finds only this
MODEL = "tiny"
SUMMARIZER = "You are a context summarization assistant. Summarize the conversation below for the agent's memory."
_seeds = itertools.count(1)


@dataclass
class Served:
    root: str  # http://host:port
    keys: dict[str, str]  # alice's, bob's and the admin's
    store: Store  # the server's store, opened beside it (as `clawrl users` does)
    run_dir: Path
    log: Path  # the server's stdout and stderr
    every_key: list[str] = field(default_factory=list)  # every key ever made here, for the last test

    @property
    def base(self) -> str:
        return self.root + "/v1"


def clawrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawrl", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("attacks")
    run_dir = home / "run"
    keys = {}
    for name in ("alice", "bob"):
        added = clawrl("users", "add", name, "--run-dir", str(run_dir))
        assert added.returncode == 0, added.stderr
        keys[name] = added.stdout.strip()
    keys["admin"] = ADMIN_KEY
    port, log = free_port(), home / "server.log"
    command = [sys.executable, "-m", "clawrl", "--log-format", "json", "serve", "--model", str(tiny_model_dir),
               "--run-dir", str(run_dir), "--api-key", ADMIN_KEY, "--port", str(port), "--judge", "off",
               "--device", "cpu", "--cpu-threads", "1", "--served-model-name", MODEL]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    root = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            assert process.poll() is None, log.read_text()
            return healthz(root) is not None

        wait_until(up, 120, "the server to start", every=0.1)
        store = Store.for_run_dir(run_dir)
        yield Served(root, keys, store, run_dir, log, every_key=list(keys.values()))
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


# --------------------------------------------------------------------------- helpers


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def chat(s: Served, key: str | None, messages: list[dict[str, Any]], headers: dict[str, Any] | None = None,
         **body: Any) -> httpx.Response:  # fmt: skip
    """A chat completion; sampled (temperature 1, a fresh seed) so that every answer is text of its own."""
    sent = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 1.0, "seed": next(_seeds)} | body
    return httpx.post(f"{s.base}/chat/completions", json=sent, headers=bearer(key) | (headers or {}), timeout=60)


def answer(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return {"role": "assistant", "content": response.json()["choices"][0]["message"].get("content") or ""}


def session_of(response: httpx.Response) -> str:
    """The stored id of the response's session (the header is percent-encoded where it must be)."""
    assert response.status_code == 200, response.text
    return urllib.parse.unquote(response.headers["x-clawrl-session"])


def owner(s: Served, session_id: str) -> str | None:
    session = s.store.turns.session(session_id)
    return None if session is None else session.user_id


def next_state_of(s: Served, turn_id: str) -> Any:
    return s.store.turns.next_states([turn_id]).get(turn_id)


def feedback(s: Served, key: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{s.base}/feedback", json={"score": -1, **body}, headers=bearer(key), timeout=30)


def same_answer(refused: httpx.Response, given: str, missing: httpx.Response, missing_given: str) -> bool:
    """Whether two error answers are the same but for the id each names (what tells ids apart)."""
    return refused.status_code == missing.status_code and refused.text.replace(given, "ID") == missing.text.replace(missing_given, "ID")


def alice_starts(s: Served, text: str, **headers: str) -> httpx.Response:
    first = chat(s, s.keys["alice"], [user(text)], headers)
    assert first.status_code == 200 and owner(s, session_of(first)) == "alice", first.text
    return first


def wait_for_status(s: Served, key: str | None, status: int, timeout_s: float) -> float | None:
    """Seconds until `GET /v1/models` with `key` answers `status`, or None if not within `timeout_s`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if httpx.get(f"{s.base}/models", headers=bearer(key), timeout=10).status_code == status:
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def raw_request(s: Served, header_lines: list[bytes], path: bytes = b"/v1/models") -> bytes:
    """A GET written byte by byte (what httpx would refuse to send), answered with its status line."""
    host, port = s.root.removeprefix("http://").split(":")
    request = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + b"".join(line + b"\r\n" for line in header_lines)
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(request + b"Connection: close\r\n\r\n")
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    return received.split(b"\r\n", 1)[0]


MESSAGES_BODY = {"model": MODEL, "max_tokens": 4, "messages": [user("hello")]}
ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/chat/completions", {"model": MODEL, "messages": [user("hello")], "max_tokens": 4}),
    ("POST", "/v1/responses", {"model": MODEL, "input": "hello", "max_output_tokens": 4}),
    ("POST", "/v1/messages", MESSAGES_BODY),
    ("POST", "/v1/messages/count_tokens", {"model": MODEL, "messages": MESSAGES_BODY["messages"]}),
    ("POST", "/v1/feedback", {"turn": "chatcmpl-x", "score": 1}),
    ("POST", "/v1/episodes", {"session_id": "e", "env": "toolcall", "task": "t", "seed": 0, "group_id": "g", "group_size": 1}),
    ("POST", "/v1/episodes/e/result", {"reward": 1.0}),
]


# --------------------------------------------------------------------------- keys


def test_no_key_and_every_broken_key_is_refused_on_every_route(served: Served) -> None:
    """Someone without a key (or with a key that is almost one) gets a 401 everywhere, and the 401
    says nothing of the key it was given."""
    alice, admin = served.keys["alice"], served.keys["admin"]
    basic = base64.b64encode(f"alice:{alice}".encode()).decode()
    attempts: list[dict[str, str]] = [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": alice},  # no scheme
        {"Authorization": f"Token {alice}"},
        {"Authorization": f"Basic {basic}"},  # the dashboard's form is not the API's
        {"Authorization": f"Bearer {alice.upper()}"},
        {"Authorization": f"Bearer {alice[:-1]}"},
        {"Authorization": f"Bearer {alice}x"},
        {"Authorization": f"Bearer {alice} {served.keys['bob']}"},
        {"Authorization": f"Bearer {alice[len('sk-clawrl-'):]}"},
        {"Authorization": f"Bearer {admin[:-1]}"},
        {"Authorization": f"Bearer {admin}{admin}"},
        {"x-api-key": f"Bearer {alice}"},
        {"x-api-key": "sk-clawrl-"},
        {"Authorization": "Bearer default"},
        {"x-api-key": "default"},
    ]
    for method, path, body in ROUTES:
        for headers in attempts:
            refused = httpx.request(method, served.root + path, headers=headers, timeout=30, **({"json": body} if body else {}))
            assert refused.status_code == 401, (path, headers, refused.text)
            assert alice not in refused.text and admin not in refused.text and alice[:20] not in refused.text


def test_odd_but_valid_forms_of_a_key_name_its_owner_and_nobody_else(served: Served) -> None:
    """A lowercase scheme, extra spaces and both headers at once still name one caller: the owner of
    a valid key among them, never the admin or another user."""
    alice, bob = served.keys["alice"], served.keys["bob"]
    for headers in ({"Authorization": f"bearer {alice}"}, {"Authorization": f"BEARER   {alice}"},
                    {"Authorization": "Bearer wrong", "x-api-key": alice}, {"Authorization": f"Bearer {alice}", "x-api-key": "wrong"}):  # fmt: skip
        answered = chat(served, None, [user("whose is this")], headers)
        assert answered.status_code == 200 and owner(served, session_of(answered)) == "alice", headers
    both = chat(served, None, [user("two keys")], {"Authorization": f"Bearer {alice}", "x-api-key": bob})
    assert owner(served, session_of(both)) in ("alice", "bob")


def test_no_body_field_or_other_header_changes_who_the_caller_is(served: Served) -> None:
    """Only the key says whose a request is: fields and headers that claim another user (or the
    session header a response carries, sent back as a request header) change nothing."""
    alice_sid = session_of(alice_starts(served, "alice's own"))
    claims = {"X-User-Id": "alice", "X-Clawrl-User": "alice", "X-Remote-User": "alice", "X-Forwarded-User": "alice",
              "X-Clawrl-Session": alice_sid, "X-Clawrl-Admin": "true", "X-Api-Key-Owner": "alice"}  # fmt: skip
    body = {"user_id": "alice", "owner": "alice", "caller": "alice", "admin": True}
    sent = chat(served, served.keys["bob"], [user("who am I")], claims, **body)
    assert owner(served, session_of(sent)) == "bob" and session_of(sent) != alice_sid  # unknown fields are ignored
    headers = {"x-api-key": served.keys["bob"]} | claims
    message = httpx.post(f"{served.base}/messages", json=MESSAGES_BODY | {"metadata": {"user_id": "alice", "owner": "alice"}},
                         headers=headers, timeout=60)  # fmt: skip
    assert owner(served, session_of(message)) == "bob"
    assert chat(served, None, [user("no key, only claims")], claims, **body).status_code == 401


def test_raw_header_tricks_never_let_a_request_in(served: Served) -> None:
    """A key with a newline, a NUL, a folded line or a tab in place of the space is refused (by the
    HTTP parser or the key check), and two Authorization headers are never merged into access."""
    alice = served.keys["alice"].encode()
    for control in ([b"Authorization: Bearer " + alice], [b"Authorization: Bearer  " + alice + b"  "], [b"x-api-key:   " + alice + b" "]):
        assert raw_request(served, control).endswith(b"200 OK"), control  # spaces around a key are HTTP's, trimmed
    for empty in ([b"Authorization: Bearer "], [b"Authorization: Bearer     "], [b"x-api-key: "], [b"x-api-key:  ", b"Authorization: "]):
        assert raw_request(served, empty).split(b" ")[1] == b"401", empty
    for lines in ([b"Authorization: Bearer " + alice + b"\n"], [b"Authorization: Bearer \n" + alice],
                  [b"Authorization: Bearer", b" " + alice], [b"Authorization: Bearer " + alice[:20], b"\t" + alice[20:]],
                  [b"Authorization: Bearer " + alice + b"\x00"], [b"x-api-key: " + alice[:20] + b"\r" + alice[20:]],
                  [b"Authorization: Bearer\t" + alice], [b"Authorization: Bearer " + alice[:20]] + [b"Authorization: " + alice[20:]],
                  [b"Authorization: Bearer " + alice, b"Authorization: Bearer junk"]):  # fmt: skip
        status = raw_request(served, lines)
        assert status.split(b" ")[1] in (b"400", b"401"), (lines, status)


def test_rotated_and_removed_keys_stop_working_within_a_second_and_stay_stopped(served: Served) -> None:
    store = served.store
    _carol, key = store.users.add("carol")
    served.every_key.append(key)
    assert wait_for_status(served, key, 200, 5) is not None
    first = chat(served, key, [user("carol's private note")])
    rotated = store.users.rotate_key("carol")
    served.every_key.append(rotated)
    took = wait_for_status(served, key, 401, 3)
    assert took is not None and took <= 1.5, took  # "within a second" (the server rereads keys once a second)
    assert wait_for_status(served, rotated, 200, 1.5) is not None
    time.sleep(1.1)  # and after that second, still refused, everywhere
    for method, path, body in ROUTES:
        old = httpx.request(method, served.root + path, headers=bearer(key), timeout=30, **({"json": body} if body else {}))
        assert old.status_code == 401, path
    assert feedback(served, rotated, turn=first.headers["x-clawrl-turn"]).status_code == 200  # her records, her new key
    store.users.remove("carol")
    took = wait_for_status(served, rotated, 401, 3)
    assert took is not None and took <= 1.5, took
    time.sleep(1.1)
    assert chat(served, rotated, [user("still here?")]).status_code == 401
    assert feedback(served, rotated, turn=first.headers["x-clawrl-turn"]).status_code == 401
    assert chat(served, served.keys["alice"], [user("others are unaffected")]).status_code == 200


def test_a_new_user_given_a_removed_users_name_gets_none_of_their_records(served: Served) -> None:
    store = served.store
    _dave, key = store.users.add("dave")
    served.every_key.append(key)
    assert wait_for_status(served, key, 200, 5) is not None
    old = httpx.post(f"{served.base}/responses", json={"model": MODEL, "input": "dave's medical history", "max_output_tokens": 4},
                     headers=bearer(key), timeout=60)  # fmt: skip
    assert old.status_code == 200
    store.users.remove("dave")
    # someone else, given the name later, would reach dave's records: the name is not given again
    with pytest.raises(UserError, match="records are still stored"):
        store.users.add("dave")
    _other, new_key = store.users.add("dave2")
    served.every_key.append(new_key)
    assert wait_for_status(served, key, 401, 5) is not None and wait_for_status(served, new_key, 200, 5) is not None
    assert feedback(served, new_key, turn=old.json()["id"]).status_code == 404
    continued = {"model": MODEL, "input": "repeat what I told you", "previous_response_id": old.json()["id"], "max_output_tokens": 4}
    assert httpx.post(f"{served.base}/responses", json=continued, headers=bearer(new_key), timeout=60).status_code == 404


# --------------------------------------------------------------------------- naming sessions


def test_no_spelling_of_another_users_session_name_reaches_it(served: Served) -> None:
    """bob names alice's sessions every way he can think of, on every wire API; each request lands
    in a session of his own and alice's sessions get no turn and no next state from him."""
    s, alice, bob = served, served.keys["alice"], served.keys["bob"]
    named = alice_starts(s, "alice's project plan", **{"X-Session-Id": "proj"})
    server_named = alice_starts(s, "alice's diary")
    named_id, server_id = session_of(named), session_of(server_named)
    assert named_id == "alice/proj" and server_id.startswith("s_")
    before = {sid: s.store.turns.session(sid).num_turns for sid in (named_id, server_id)}
    names = [
        named_id, server_id, "proj", " alice/proj ", "alice/proj\t", "ALICE/proj", "Alice/proj", "alice//proj", "alice/./proj",
        "alice/proj/", "/alice/proj", "../alice/proj", "bob/../alice/proj", "bob/../../alice/proj", "alice%2Fproj", "alice\\proj",
        "alice", "alice/", "default", "default/alice/proj", "user:alice", "x' OR '1'='1", "alice/proj' --", "%", "_", "*",
        "\u0430lice/proj",  # Cyrillic а
        "ａlice/proj",  # fullwidth
        "alice\u2215proj",  # division slash
        "alice\u200b/proj",  # zero-width space
        "alice/proj\u0000",
        server_id.upper(), server_id + " ", " " + server_id,
    ]
    for name in names:
        for how in ("header", "body", "user", "messages-metadata", "messages-body", "responses-user"):
            if how == "header" and (name != name.strip() or not name.isascii() or "\x00" in name):
                continue  # a header value is trimmed, ASCII (here) and has no NUL: sent below as bytes where it can be
            if how == "header":
                sent = chat(s, bob, [user("bob takes over")], {"X-Session-Id": name})
            elif how == "body":
                sent = chat(s, bob, [user("bob takes over")], session_id=name)
            elif how == "user":
                sent = chat(s, bob, [user("bob takes over")], user=name)
            elif how == "messages-metadata":
                sent = httpx.post(f"{s.base}/messages", json=MESSAGES_BODY | {"metadata": {"user_id": name}}, headers={"x-api-key": bob}, timeout=60)
            elif how == "messages-body":
                sent = httpx.post(f"{s.base}/messages", json=MESSAGES_BODY | {"session_id": name}, headers={"x-api-key": bob}, timeout=60)
            else:
                sent = httpx.post(f"{s.base}/responses", json={"model": MODEL, "input": "bob takes over", "user": name, "max_output_tokens": 4},
                                  headers=bearer(bob), timeout=60)  # fmt: skip
            assert sent.status_code == 200, (name, how, sent.text)
            landed = session_of(sent)
            assert landed.startswith("bob/") and owner(s, landed) == "bob", (name, how, landed)
    # the header as raw bytes: a UTF-8 look-alike (read as latin-1) and a streamed request
    for value in ("\u0430lice/proj".encode(), "alice/proj".encode()):
        sent = chat(s, bob, [user("bob again")], {"X-Session-Id": value}, stream=True)
        assert sent.status_code == 200 and owner(s, session_of(sent)) == "bob", value
    for sid, turns in before.items():
        assert s.store.turns.session(sid).num_turns == turns and owner(s, sid) == "alice", sid
    for first in (named, server_named):
        assert next_state_of(s, first.headers["x-clawrl-turn"]) is None
    # and alice still continues her own by the same names (the control: these names do work)
    assert session_of(chat(s, alice, [user("more")], {"X-Session-Id": "proj"})) == named_id
    assert session_of(chat(s, alice, [user("more")], {"X-Session-Id": server_id})) == server_id


def test_session_names_at_the_length_edge_are_the_callers_or_refused(served: Served) -> None:
    """256 characters is what the store keeps: a user's name is counted in it, so bob's 252 fit and 253
    are refused (a 400 that says nothing of other users), on every way of naming a session."""
    bob = served.keys["bob"]
    fits, too_long = "x" * (256 - len("bob/")), "x" * (256 - len("bob/") + 1)
    for how in ("X-Session-Id", "session_id", "user"):
        def sent(name: str) -> httpx.Response:
            if how == "X-Session-Id":
                return chat(served, bob, [user("edge")], {how: name})
            if how == "user":
                return chat(served, bob, [user("edge")], user=name[len("user:"):] if name.startswith("user:") else name)
            return chat(served, bob, [user("edge")], session_id=name)

        kept = sent(fits if how != "user" else "user:" + fits[len("user:"):])
        assert kept.status_code == 200 and len(session_of(kept)) == 256 and owner(served, session_of(kept)) == "bob", how
        refused = sent(too_long if how != "user" else "user:" + too_long[len("user:"):])
        assert refused.status_code == 400 and refused.json()["error"]["code"] in ("invalid_session_id", "invalid_value"), how
        for longer in ("x" * 257, "x" * 5000):
            assert sent(longer).status_code == 400, (how, len(longer))
    prefixed = chat(served, bob, [user("edge")], {"X-Session-Id": "bob/" + fits})
    assert prefixed.status_code == 200 and session_of(prefixed) == "bob/" + fits


def test_a_user_cannot_close_another_users_session(served: Served) -> None:
    first = alice_starts(served, "alice keeps this open")
    sid = session_of(first)
    for headers, body in (({"X-Session-Id": sid, "X-Session-Done": "true"}, {}), ({}, {"session_id": sid, "session_done": True}),
                          ({"X-Session-Done": "1"}, {})):  # fmt: skip
        chat(served, served.keys["bob"], [user("alice's question"), answer(first), user("bye")], headers, **body)
    assert not served.store.turns.session(sid).done
    follow = chat(served, served.keys["alice"], [user("alice keeps this open"), answer(first), user("and then?")])
    assert session_of(follow) == sid  # still open: her echo still finds it


def test_a_name_under_the_callers_prefix_never_lands_in_a_default_users_session(served: Served) -> None:
    admins = chat(served, served.keys["admin"], [user("the admin's note")], {"X-Session-Id": "alice/inbox"})
    assert owner(served, session_of(admins)) == "default"
    hers = chat(served, served.keys["alice"], [user("alice writes")], {"X-Session-Id": "inbox"})
    assert hers.status_code == 200
    assert owner(served, session_of(hers)) == "alice"
    assert next_state_of(served, admins.headers["x-clawrl-turn"]) is None
    assert feedback(served, served.keys["alice"], turn=hers.headers["x-clawrl-turn"]).status_code == 200


# --------------------------------------------------------------------------- session inference


def test_echoing_another_users_answer_on_any_wire_api_joins_nothing_of_theirs(served: Served) -> None:
    s, alice, bob = served, served.keys["alice"], served.keys["bob"]
    asked = user("alice's salary negotiation: what should I ask for?")
    first = alice_starts(s, asked["content"])
    sid, turn_id, echo = session_of(first), first.headers["x-clawrl-turn"], answer(first)
    follow_up = [asked, echo, user("and if they say no?")]
    attempts = [
        chat(s, bob, follow_up),
        chat(s, bob, follow_up, stream=True),
        chat(s, bob, [{"role": "system", "content": "You are helpful."}, *follow_up]),
        chat(s, bob, [echo, user("go on")]),
        chat(s, bob, follow_up, {"X-Turn-Type": "side"}),
        chat(s, bob, follow_up, stop=["\n"]),
        httpx.post(f"{s.base}/responses", headers=bearer(bob), timeout=60, json={"model": MODEL, "max_output_tokens": 4, "input": [
            {"type": "message", "role": "user", "content": asked["content"]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": echo["content"]}]},
            {"type": "message", "role": "user", "content": "and if they say no?"}]}),  # fmt: skip
        httpx.post(f"{s.base}/messages", headers={"x-api-key": bob}, timeout=60,
                   json={"model": MODEL, "max_tokens": 4, "messages": follow_up}),  # fmt: skip
    ]
    for attempt in attempts:
        landed = session_of(attempt)
        assert landed != sid and owner(s, landed) == "bob", landed
    assert next_state_of(s, turn_id) is None and s.store.turns.session(sid).num_turns == 1
    # the control: the same echo, sent by alice, continues her session
    own = chat(s, alice, follow_up)
    assert session_of(own) == sid and next_state_of(s, turn_id).source_turn_id == own.headers["x-clawrl-turn"]


def test_a_compaction_summary_of_another_users_conversation_joins_nothing_of_theirs(served: Served) -> None:
    """The summarizer's side request quotes the whole conversation and echoes nothing; the request
    after a compaction sends a summary in place of the older turns. Neither may find alice's session
    for bob, however closely he quotes it."""
    s, alice, bob = served, served.keys["alice"], served.keys["bob"]
    asked = user("alice's confidential question about the merger with Initech next quarter")
    first = alice_starts(s, asked["content"])
    sid, turn_id, echo = session_of(first), first.headers["x-clawrl-turn"], answer(first)
    quoted = user(f"[User]: {asked['content']}\n[Assistant]: {echo['content']}\n\nSummarize the conversation above.")
    summary = user(f"Summary of the conversation so far: the user asked: {asked['content']} The assistant answered: {echo['content']}")
    claude_code = user(f"{asked['content']}\n{echo['content']}\nCRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\nSummarize.")
    memory_flush = [{"role": "system", "content": "Pre-compaction memory flush turn. Store durable memories now."}, asked, echo,
                    user("Pre-compaction memory flush. Store durable memories.")]  # fmt: skip
    attacks = [
        ([{"role": "system", "content": SUMMARIZER}, quoted], {}),
        ([{"role": "system", "content": SUMMARIZER}, quoted], {"X-Turn-Type": "side"}),
        ([quoted], {"X-Turn-Type": "side"}),
        ([claude_code], {}),
        (memory_flush, {}),
        ([summary, echo, user("continue")], {}),
        ([summary, echo, user("continue")], {"X-Turn-Type": "side"}),
        ([{"role": "system", "content": SUMMARIZER}, summary, echo, user("continue")], {}),
    ]
    for messages, headers in attacks:
        landed = session_of(chat(s, bob, messages, headers))
        assert landed != sid and owner(s, landed) == "bob", (messages, headers)
    assert next_state_of(s, turn_id) is None and s.store.turns.session(sid).num_turns == 1
    # the controls: alice's own summarizer request and post-compaction request join her session
    summarized = chat(s, alice, [{"role": "system", "content": SUMMARIZER}, quoted])
    assert session_of(summarized) == sid and summarized.headers["x-clawrl-turn-kind"] == "side"
    assert session_of(chat(s, alice, [summary, echo, user("continue")])) == sid


def test_retrying_another_users_empty_answer_joins_nothing_of_theirs(served: Served) -> None:
    """An agent that got no visible answer asks again without echoing it; that retry must not find
    another user's empty turn."""
    s = served
    asked = user("alice asks something the model answers with nothing")
    first = chat(s, s.keys["alice"], [asked], temperature=0, stop=["\n"])
    assert answer(first)["content"] == ""  # the first token is a newline, the stop string: an empty answer
    sid, turn_id = session_of(first), first.headers["x-clawrl-turn"]
    retry = [asked, user("The previous attempt did not produce a user-visible answer. Please answer again.")]
    stolen = chat(s, s.keys["bob"], retry)
    assert session_of(stolen) != sid and owner(s, session_of(stolen)) == "bob"
    assert next_state_of(s, turn_id) is None
    own = chat(s, s.keys["alice"], retry)  # the control
    assert session_of(own) == sid and next_state_of(s, turn_id) is not None


# --------------------------------------------------------------------------- reaching records by id


def test_feedback_on_another_users_records_is_a_404_like_a_missing_one(served: Served) -> None:
    s, alice, bob = served, served.keys["alice"], served.keys["bob"]
    chat_turn = alice_starts(s, "alice rates her dentist", **{"X-Session-Id": "dentist"})
    side_turn = chat(s, alice, [user("a title for this")], {"X-Session-Id": "dentist", "X-Turn-Type": "side"})
    response = httpx.post(f"{s.base}/responses", json={"model": MODEL, "input": "alice's response", "max_output_tokens": 4},
                          headers=bearer(alice), timeout=60).json()["id"]  # fmt: skip
    message = httpx.post(f"{s.base}/messages", json=MESSAGES_BODY, headers={"x-api-key": alice}, timeout=60).json()["id"]
    admins = chat(s, s.keys["admin"], [user("the admin's own turn")], {"X-Session-Id": "admin-notes"})
    bobs = chat(s, bob, [user("bob's own turn")], {"X-Session-Id": "mine"})
    turns = [chat_turn.headers["x-clawrl-turn"], side_turn.headers["x-clawrl-turn"], response, message, admins.headers["x-clawrl-turn"]]
    sessions = ["alice/dentist", "dentist", session_of(alice_starts(s, "a server-named one")), "admin-notes", session_of(admins)]
    for turn_id in turns:
        missing_id = turn_id[:-4] + "beef" if not turn_id.endswith("beef") else turn_id[:-4] + "dead"
        refused, missing = feedback(s, bob, turn=turn_id), feedback(s, bob, turn=missing_id)
        assert refused.status_code == 404 and same_answer(refused, turn_id, missing, missing_id), (turn_id, refused.text)
        for session_id in ("mine", "bob/mine", "nobody-has-this"):  # with a session of his own beside it: still a 404
            assert feedback(s, bob, turn=turn_id, session_id=session_id).status_code == 404, (turn_id, session_id)
        for guessed in (turn_id.upper(), turn_id + "%", turn_id[:-1] + "_", "%", "chatcmpl-%", "' OR '1'='1"):
            assert feedback(s, bob, turn=guessed).status_code == 404, guessed
    for session_id in sessions:
        refused, missing = feedback(s, bob, session_id=session_id), feedback(s, bob, session_id=session_id + "-none")
        assert refused.status_code == 404 and same_answer(refused, session_id, missing, session_id + "-none"), (session_id, refused.text)
    # bob's own turn named with alice's session: the same 400 as with a session nobody has
    own_turn = bobs.headers["x-clawrl-turn"]
    mismatched, nowhere = feedback(s, bob, turn=own_turn, session_id="alice/dentist"), feedback(s, bob, turn=own_turn, session_id="nowhere")
    assert same_answer(mismatched, "alice/dentist", nowhere, "nowhere"), mismatched.text
    for turn_id in turns[:4]:
        assert s.store.judging.turn_context(turn_id).feedback == [], turn_id
    assert feedback(s, alice, turn=turns[0]).status_code == 200  # the control
    assert feedback(s, alice, session_id="dentist").json()["turn"] == turns[0]


def test_previous_response_id_of_another_users_turn_is_a_404_like_a_missing_one(served: Served) -> None:
    s, alice, bob = served, served.keys["alice"], served.keys["bob"]

    def respond(key: str, **body: Any) -> httpx.Response:
        headers = bearer(key) | body.pop("_headers", {})
        sent = {"model": MODEL, "input": "tell me again what I said", "max_output_tokens": 4} | body
        return httpx.post(f"{s.base}/responses", json=sent, headers=headers, timeout=60)

    hers = respond(alice, input="alice's password hint is 'first cat'").json()["id"]
    hers_stored_anyway = respond(alice, input="recorded though store is false", store=False, _headers={"X-Clawrl-Record": "true"}).json()["id"]
    chat_turn = alice_starts(s, "alice's chat turn").headers["x-clawrl-turn"]
    message = httpx.post(f"{s.base}/messages", json=MESSAGES_BODY, headers={"x-api-key": alice}, timeout=60).json()["id"]
    admins = respond(s.keys["admin"], input="the admin's response").json()["id"]
    for turn_id in (hers, hers_stored_anyway, chat_turn, message, admins):
        missing_id = turn_id[:-4] + ("dead" if turn_id.endswith("beef") else "beef")
        for extra in ({}, {"stream": True}, {"store": False, "_headers": {"X-Clawrl-Record": "true"}}, {"user": "alice"}):
            refused, missing = respond(bob, previous_response_id=turn_id, **extra), respond(bob, previous_response_id=missing_id, **dict(extra))
            assert refused.status_code == 404, (turn_id, extra, refused.text)
            assert refused.json()["error"]["code"] == "previous_response_not_found"
            assert same_answer(refused, turn_id, missing, missing_id), (refused.text, missing.text)
    assert respond(alice, previous_response_id=hers).status_code == 200  # the control
    assert respond(alice, previous_response_id=hers_stored_anyway).status_code == 200


def test_episodes_answer_a_user_the_same_whatever_the_id(served: Served) -> None:
    """Episodes are the admin's: a user's key gets one 403 whether or not the episode exists (no
    404 that would tell ids apart), and changes nothing."""
    s = served
    body = {"session_id": "ep-real", "env": "toolcall", "task": "t", "seed": 0, "group_id": "g", "group_size": 1}
    assert httpx.post(f"{s.base}/episodes", json=body, headers=bearer(s.keys["admin"]), timeout=30).status_code == 200
    answers = []
    for path, sent in (("/episodes", body), ("/episodes", body | {"session_id": "ep-new"}), ("/episodes/ep-real/result", {"reward": 1.0}),
                       ("/episodes/ep-none/result", {"reward": 1.0}), ("/episodes/ep-real/result", {"failed": True})):  # fmt: skip
        for headers in (bearer(s.keys["bob"]), {"x-api-key": s.keys["bob"]}):
            refused = httpx.post(s.base + path, json=sent, headers=headers, timeout=30)
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_only", (path, refused.text)
            answers.append(refused.text)
    assert len(set(answers)) == 1
    episode = s.store.episodes.episode("ep-real")
    assert episode is not None and episode.status == "running"
    assert s.store.episodes.episode("ep-new") is None
    assert httpx.post(f"{s.base}/episodes/ep-real/result", json={"reward": 1.0}, headers=bearer(s.keys["admin"]), timeout=30).status_code == 200


# --------------------------------------------------------------------------- the dashboard


def test_no_form_of_another_users_key_shows_alices_records_on_the_dashboard(served: Served) -> None:
    s, alice, bob = served, served.keys["alice"], served.keys["bob"]
    secret = "alice dashboard secret " + secrets.token_hex(4)
    sid = session_of(alice_starts(s, secret))
    pages = ["/dashboard", "/dashboard/api/overview", f"/dashboard/sessions/{urllib.parse.quote(sid, safe='')}",
             f"/dashboard/sessions/{sid}", "/dashboard/sessions/alice%2Fproj", "/dashboard/?refresh=0", "/"]  # fmt: skip
    refused = [{}, {"x-api-key": alice}, {"x-api-key": s.keys["admin"]},  # the dashboard reads Authorization only
               {"Authorization": "Basic " + base64.b64encode(f"{alice}:".encode()).decode()},  # the key as the name
               {"Authorization": "Basic " + base64.b64encode(f"{s.keys['admin']}:x".encode()).decode()},
               {"Authorization": "Basic " + base64.b64encode(b"admin:").decode()},
               {"Authorization": "Basic"}, {"Authorization": "Basic ==="}, {"Authorization": f"Bearer {alice} {bob}"}]  # fmt: skip
    bobs = [{"Authorization": f"Bearer {bob}"}, {"Authorization": f"bearer {bob}"},
            {"Authorization": "Basic " + base64.b64encode(f"alice:{bob}".encode()).decode()},  # alice's name, bob's key
            {"Authorization": f"Bearer {bob}", "x-api-key": alice}]  # fmt: skip
    for page in pages:
        for headers in refused + bobs:
            answered = httpx.get(s.root + page, headers=headers, timeout=30, follow_redirects=True)
            assert answered.status_code in ((401,) if headers in refused else (200, 404)), (page, headers, answered.status_code)
            assert secret not in answered.text, (page, headers)
            assert answered.status_code != 200 or sid not in answered.text, (page, headers)  # a 404 echoes the id asked
    for headers in ({"Authorization": f"Bearer {s.keys['admin']}"}, {"Authorization": f"Bearer {alice}"},
                    {"Authorization": "Basic " + base64.b64encode(f"anyone:{s.keys['admin']}".encode()).decode()},
                    {"Authorization": "Basic " + base64.b64encode(f"bob:{alice}".encode()).decode()}):  # the control
        shown = httpx.get(f"{s.root}/dashboard/sessions/{urllib.parse.quote(sid, safe='')}", headers=headers, timeout=30)
        assert shown.status_code == 200 and secret in shown.text


def test_a_malformed_basic_header_on_the_dashboard_is_a_401_not_a_500(served: Served) -> None:
    for value in (b"Basic \xff\xfe", b"Basic \xc3\xa9", "Basic " .encode() + base64.b64encode(b"x:") + b"\xe9"):
        refused = httpx.get(f"{served.root}/dashboard/api/overview", headers={"Authorization": value}, timeout=30)
        assert refused.status_code == 401, (value, refused.status_code, refused.text)


# --------------------------------------------------------------------------- what is open to everyone


def test_the_open_routes_carry_no_conversation_text_ids_or_keys(served: Served) -> None:
    """/healthz, /readyz, /metrics and /openapi.json answer without a key: after requests that put a
    marker in every place a client can (text, session names, user fields, paths), none shows it."""
    s, marker = served, "zq" + secrets.token_hex(6)
    first = chat(s, s.keys["alice"], [user(f"the secret is {marker}")], {"X-Session-Id": f"sess-{marker}"}, user=f"u-{marker}")
    chat(s, s.keys["bob"], [user(f"bob's {marker}"), answer(first), user(marker)], session_id=f"body-{marker}")
    httpx.post(f"{s.base}/messages", json=MESSAGES_BODY | {"metadata": {"user_id": marker}}, headers={"x-api-key": s.keys["alice"]}, timeout=60)
    httpx.post(f"{s.base}/responses", json={"model": MODEL, "input": marker, "user": marker, "max_output_tokens": 4}, headers=bearer(s.keys["bob"]), timeout=60)
    feedback(s, s.keys["alice"], turn=first.headers["x-clawrl-turn"], text=f"feedback {marker}")
    for path in (f"/v1/episodes/{marker}/result", f"/dashboard/sessions/{marker}", f"/{marker}", f"/v1/{marker}"):
        httpx.post(s.root + path, json={"reward": 1}, headers=bearer(s.keys["alice"]), timeout=30)
        httpx.get(s.root + path, timeout=30)
    chat(s, None, [user(marker)])  # refused, but seen by the server
    forbidden = [marker, first.headers["x-clawrl-turn"], session_of(first), *s.keys.values(), "alice/", "bob/"]
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/"):
        shown = httpx.get(s.root + path, timeout=30)  # no key, no redirect followed
        assert shown.status_code in (200, 307), (path, shown.status_code)
        for text in forbidden:
            assert text not in shown.text and text not in str(shown.headers), (path, text)


# --------------------------------------------------------------------------- names and keys at rest


def test_sql_looking_user_names_are_refused_and_change_nothing(served: Served) -> None:
    run = str(served.run_dir)
    for name in ("robert'); DROP TABLE users;--", "x' OR '1'='1", "alice' --", "alice;", "..", "../alice", "alice/bob", "a b",
                 "Alice", "alice\n", "\u0430lice", "", "-x", ".x", "a" * 33, "default", "alice", "%", "_"):  # fmt: skip
        refused = clawrl("users", "add", name, "--run-dir", run)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr and refused.stdout.strip() == "", (name, refused)
    for command in ("remove", "rotate-key"):
        for name in ("x' OR '1'='1", "%", "_", "alice' --", "' OR 1=1 --"):
            refused = clawrl("users", command, name, "--run-dir", run)
            assert refused.returncode == 1 and "no user called" in refused.stderr and refused.stdout.strip() == "", (command, name)
    listed = clawrl("sessions", "list", "--run-dir", run, "--user", "x' OR '1'='1", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    users = json.loads(clawrl("users", "list", "--run-dir", run, "--json").stdout)
    assert {"alice", "bob"} <= {item["user"] for item in users}
    assert all(key not in json.dumps(users) for key in served.every_key)
    time.sleep(1.1)  # the keys as the server rereads them: both still work, nothing else does
    for name in ("alice", "bob"):
        assert httpx.get(f"{served.base}/models", headers=bearer(served.keys[name]), timeout=30).status_code == 200
    assert httpx.get(f"{served.base}/models", headers=bearer("x' OR '1'='1"), timeout=30).status_code == 401


def test_no_key_is_stored_in_the_run_or_written_to_the_server_log(served: Served) -> None:
    """Last: after every request above (and these, which provoke refusals and errors with keys in
    them), no key, nor a large piece of one, is in any file of the run directory (the database, its
    WAL) or in what the server wrote."""
    s, alice = served, served.keys["alice"]
    for value in (f"Bearer {alice}x", f"Basic {alice}", f"Bearer {s.keys['admin']}!"):
        httpx.get(f"{s.root}/dashboard/api/overview", headers={"Authorization": value}, timeout=30)
        httpx.get(f"{s.base}/models", headers={"Authorization": value}, timeout=30)
    httpx.get(f"{s.root}/dashboard", headers={"Authorization": b"Basic \xff" + alice.encode()}, timeout=30)
    raw_request(s, [b"Authorization: Bearer " + alice.encode() + b"\n"])
    time.sleep(0.5)
    stored = b"".join(path.read_bytes() for path in s.run_dir.rglob("*") if path.is_file())
    log = s.log.read_bytes()
    for key in s.every_key:
        secret = key.removeprefix("sk-clawrl-").removeprefix("sk-admin-attacks-")
        assert key.encode() not in log and secret[-20:].encode() not in log, "a key is in the server log"
        assert key.encode() not in stored and secret[-20:].encode() not in stored, "a key is stored in plaintext"
