"""Users with keys of their own (issue 32, item 1; DESIGN §12): the `clawrl users` commands, the
store's migration, and one real server where two users and the admin talk, each reaching only what
is theirs. Every attack here is one a user with a key could try."""

from __future__ import annotations

import base64
import json
import sqlite3
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from clawrl.store import Store
from clawrl.store.users import UserError
from tests.helpers import ServerThread, record, start_server, user, wait_until

ADMIN_KEY = "sk-admin-test"
MODEL = "tiny"


def clawrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawrl", *args], capture_output=True, text=True, timeout=120)


# --------------------------------------------------------------------------- the commands and the store


def test_users_add_prints_a_key_that_is_never_stored(tmp_path: Path) -> None:
    run = tmp_path / "run"
    added = clawrl("users", "add", "alice", "--run-dir", str(run))
    assert added.returncode == 0, added.stderr
    key = added.stdout.strip()
    assert key.startswith("sk-clawrl-") and len(key) > 40 and "not shown again" in added.stderr
    listed = clawrl("users", "list", "--run-dir", str(run))
    assert listed.returncode == 0 and "alice" in listed.stdout and key[:14] in listed.stdout and key not in listed.stdout
    assert key.encode() not in (run / "clawrl.db").read_bytes()  # only its hash
    rotated = clawrl("users", "rotate-key", "alice", "--run-dir", str(run))
    assert rotated.returncode == 0 and rotated.stdout.strip() not in ("", key)
    for args, message in ((("add", "alice"), "already a user called 'alice'"), (("add", "Alice!"), "is not a user name"),
                          (("add", "default"), "records made without a user's key"), (("remove", "carol"), "no user called 'carol'"),
                          (("rotate-key", "carol"), "no user called 'carol'")):  # fmt: skip
        refused = clawrl("users", *args, "--run-dir", str(run))
        assert refused.returncode == 1 and message in refused.stderr and "Traceback" not in refused.stderr, args
    store = Store.for_run_dir(run)
    record(store, "t1", "alice/work", [user("q")], "a", user_id="alice")
    record(store, "t2", "s2", [user("q")], "a")
    listed = clawrl("sessions", "list", "--run-dir", str(run), "--user", "alice", "--json")
    assert [(item["id"], item["user"]) for item in json.loads(listed.stdout)] == [("alice/work", "alice")]
    assert clawrl("users", "remove", "alice", "--run-dir", str(run)).returncode == 0
    assert "alice" not in clawrl("users", "list", "--run-dir", str(run)).stdout


def test_a_version_7_store_keeps_its_sessions_as_the_default_users(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("q")], "a")
    store.close()
    with sqlite3.connect(tmp_path / "clawrl.db") as db:  # what the store looked like before users
        db.execute("DROP INDEX ix_sessions_user_recent")
        db.execute("ALTER TABLE sessions DROP COLUMN user_id")
        db.execute("DROP TABLE users")
        db.execute("UPDATE meta SET value='7' WHERE key='schema_version'")
    store = Store.for_run_dir(tmp_path)
    assert [(session.id, session.user_id) for session in store.turns.list_sessions()] == [("s1", "default")]
    assert store.turns.list_sessions(user_id="alice") == []
    added, _key = store.users.add("alice")
    assert store.users.list() == [added]
    with pytest.raises(UserError):
        store.users.add("alice")


# --------------------------------------------------------------------------- one server, two users


@dataclass
class Setup:
    server: ServerThread
    keys: dict[str, str]  # alice's, bob's, erin's and the admin's
    store: Store  # the server's store, opened beside it (as `clawrl users` does)


@pytest.fixture(scope="module")
def users_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    run_dir = tmp_path_factory.mktemp("users") / "run"
    store = Store.for_run_dir(run_dir)
    # erin stands in for alice where a caller's own data is forgotten (the matrix's DELETE /v1/me/data)
    keys = {name: store.users.add(name)[1] for name in ("alice", "bob", "erin")} | {"admin": ADMIN_KEY}
    with start_server(tiny_model_dir, run_dir, api_key=ADMIN_KEY, served_model_name=MODEL) as server:
        yield Setup(server, keys, store)


def chat(server: ServerThread, key: str | None, messages: list[dict[str, Any]], **headers: str) -> httpx.Response:
    sent = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
    return httpx.post(f"{server.base_url}/chat/completions", json=body, headers=sent | headers, timeout=60)


def feedback(server: ServerThread, key: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.base_url}/feedback", json={"score": -1, **body}, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def answer_of(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    return {"role": "assistant", "content": message.get("content") or ""}


def test_a_request_needs_a_key_once_the_server_has_users(users_server: Setup) -> None:
    server, keys, store = users_server.server, users_server.keys, users_server.store
    asked = [user("hello")]
    for key in (None, "sk-clawrl-not-a-key", keys["alice"] + "x", keys["alice"][:-1]):
        refused = chat(server, key, asked)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", key
    for name in ("alice", "bob", "admin"):
        assert chat(server, keys[name], asked).status_code == 200, name
    # Anthropic's header works on the chat path too
    assert httpx.get(f"{server.base_url}/models", headers={"x-api-key": keys["bob"]}).status_code == 200


def test_two_users_who_name_the_same_session_hold_two(users_server: Setup) -> None:
    server, keys, store = users_server.server, users_server.keys, users_server.store
    sessions = {name: chat(server, keys[name], [user("plan my week")], **{"X-Session-Id": "week"}).headers["x-clawrl-session"]
                for name in ("alice", "bob", "admin")}  # fmt: skip
    assert sessions == {"alice": "alice/week", "bob": "bob/week", "admin": "week"}
    owners = {session.id: session.user_id for session in store.turns.list_sessions()}
    assert (owners["alice/week"], owners["bob/week"], owners["week"]) == ("alice", "bob", "default")
    # the id a response sent back names the same session again, not a third one
    again = chat(server, keys["alice"], [user("plan my week")], **{"X-Session-Id": "alice/week"})
    assert again.headers["x-clawrl-session"] == "alice/week"
    # a name that claims another user's session stays the caller's own
    assert chat(server, keys["bob"], [user("hi")], **{"X-Session-Id": "alice/week"}).headers["x-clawrl-session"] == "bob/alice/week"


def test_echoing_another_users_answer_joins_nothing_of_theirs(users_server: Setup) -> None:
    server, keys, store = users_server.server, users_server.keys, users_server.store
    asked = [user("write a haiku about rain")]
    first = chat(server, keys["alice"], asked)
    alice_session = first.headers["x-clawrl-session"]
    follow_up = [*asked, answer_of(first), user("shorter please")]
    stolen = chat(server, keys["bob"], follow_up)
    assert stolen.headers["x-clawrl-session"] != alice_session
    assert chat(server, keys["admin"], follow_up).headers["x-clawrl-session"] != alice_session  # nor the admin's
    own = chat(server, keys["alice"], follow_up)
    assert own.headers["x-clawrl-session"] == alice_session
    # the id the server gave her session, named back, is hers; named by bob, it is a session of his
    assert chat(server, keys["alice"], [user("more")], **{"X-Session-Id": alice_session}).headers["x-clawrl-session"] == alice_session
    assert chat(server, keys["bob"], [user("more")], **{"X-Session-Id": alice_session}).headers["x-clawrl-session"] == f"bob/{alice_session}"
    entry = store.judging.turn_context(first.headers["x-clawrl-turn"])
    assert entry.next_state is not None and entry.next_state.source_turn_id == own.headers["x-clawrl-turn"]


def test_feedback_reaches_only_the_callers_own_turns(users_server: Setup) -> None:
    server, keys, store = users_server.server, users_server.keys, users_server.store
    first = chat(server, keys["alice"], [user("name a color")])
    turn, session = first.headers["x-clawrl-turn"], first.headers["x-clawrl-session"]
    for attempt in ({"turn": turn}, {"session_id": session}, {"turn": turn, "session_id": session}):
        refused = feedback(server, keys["bob"], **attempt)
        assert refused.status_code == 404, (attempt, refused.text)
        missing = feedback(server, keys["bob"], **{key: value + "-none" for key, value in attempt.items()})
        assert missing.json()["error"]["code"] == refused.json()["error"]["code"]  # another's is as absent as none
    assert feedback(server, keys["alice"], turn=turn).json()["turn"] == turn
    assert feedback(server, keys["alice"], session_id=session).json()["turn"] == turn
    assert feedback(server, keys["admin"], turn=turn).status_code == 200
    assert feedback(server, keys["bob"], turn=turn, score=1).status_code == 404
    assert [item.score for item in store.judging.turn_context(turn).feedback] == [-1, -1, -1]


def test_episodes_are_the_admins(users_server: Setup) -> None:
    server, keys, store = users_server.server, users_server.keys, users_server.store
    body = {"env": "toolcall", "task": "t", "seed": 0, "group": "g", "group_size": 1}
    refused = httpx.post(f"{server.base_url}/episodes", json=body, headers={"Authorization": f"Bearer {keys['alice']}"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_only"


def test_a_key_added_rotated_or_removed_takes_effect_within_a_second(users_server: Setup) -> None:
    server, keys, store = users_server.server, users_server.keys, users_server.store
    _carol, key = store.users.add("carol")
    assert wait_for_status(server, key, 200)
    new_key = store.users.rotate_key("carol")
    assert wait_for_status(server, key, 401) and chat(server, new_key, [user("hi")]).status_code == 200
    store.users.remove("carol")
    assert wait_for_status(server, new_key, 401)
    assert chat(server, keys["alice"], [user("hi")]).status_code == 200


def wait_for_status(server: ServerThread, key: str | None, status: int, timeout_s: float = 5.0) -> bool:
    """That `GET /v1/models` with `key` answers `status` within `timeout_s` (the keys are read once a second)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return wait_until(lambda: httpx.get(f"{server.base_url}/models", headers=headers).status_code == status,
                      timeout_s, f"GET /v1/models to answer {status}", every=0.1)  # fmt: skip


def test_an_open_server_closes_once_it_has_a_user(tiny_model_dir: Path, tmp_path: Path) -> None:
    """No --api-key and no users: one person, no keys. Add a user and a request without a key is refused."""
    run_dir = tmp_path / "run"
    with start_server(tiny_model_dir, run_dir, served_model_name=MODEL) as server:
        assert chat(server, None, [user("hi")]).status_code == 200
        _dora, key = Store.for_run_dir(run_dir).users.add("dora")
        assert wait_for_status(server, None, 401)
        assert chat(server, None, [user("hi")]).status_code == 401 and chat(server, key, [user("hi")]).status_code == 200


def test_a_users_dashboard_shows_their_own_records_and_the_admins_shows_everyones(
        users_server: Setup, tiny_model_dir: Path, tmp_path: Path) -> None:  # fmt: skip
    server, keys = users_server.server, users_server.keys
    root = server.base_url.removesuffix("/v1")
    sessions = {name: chat(server, keys[name], [user(f"{name}'s dashboard question")]).headers["x-clawrl-session"]
                for name in ("alice", "bob")}

    def overview(key: str) -> dict[str, Any]:
        answered = httpx.get(f"{root}/dashboard/api/overview", headers={"Authorization": f"Bearer {key}"})
        assert answered.status_code == 200, answered.text
        return answered.json()

    alices, admins = overview(keys["alice"]), overview(ADMIN_KEY)
    listed = {session["id"] for session in alices["sessions"]}
    assert sessions["alice"] in listed and sessions["bob"] not in listed and alices["user"] == "alice"
    assert {users_server.store.turns.session(sid).user_id for sid in listed} == {"alice"}
    assert alices["counts"]["sessions"] == len(users_server.store.turns.list_sessions(user_id="alice"))
    assert alices["versions"] == []  # the shared lineage answers her: its versions trained on others too
    assert {sessions["alice"], sessions["bob"]} <= {session["id"] for session in admins["sessions"]}
    assert admins["user"] is None and admins["counts"]["sessions"] > alices["counts"]["sessions"]
    page = f"{root}/dashboard/sessions/{urllib.parse.quote(sessions['alice'], safe='')}"
    as_alice = httpx.get(page, headers={"Authorization": "Basic " + base64.b64encode(f"me:{keys['alice']}".encode()).decode()})
    as_bob = httpx.get(page, headers={"Authorization": f"Bearer {keys['bob']}"})
    assert as_alice.status_code == 200 and "alice&#39;s dashboard question" in as_alice.text
    missing = httpx.get(f"{root}/dashboard/sessions/nobody-has-this", headers={"Authorization": f"Bearer {keys['bob']}"})
    assert as_bob.status_code == 404 and "dashboard question" not in as_bob.text
    assert as_bob.text.replace(sessions["alice"], "ID") == missing.text.replace("nobody-has-this", "ID")  # ids tell nothing
    run_dir = tmp_path / "run"  # a server without --api-key: with its first user, no key sees everyone's
    with start_server(tiny_model_dir, run_dir, served_model_name=MODEL) as open_server:
        open_overview = f"{open_server.base_url.removesuffix('/v1')}/dashboard/api/overview"
        assert httpx.get(open_overview).status_code == 200
        _erin, erin_key = Store.for_run_dir(run_dir).users.add("erin")
        assert wait_for_status(open_server, None, 401)  # the keys are read once a second
        assert httpx.get(open_overview).status_code == 401
        assert httpx.get(open_overview, headers={"Authorization": f"Bearer {erin_key}"}).json()["user"] == "erin"


# --------------------------------------------------------------------------- every wire API, every caller

MESSAGES_BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}
ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/models", {}),
    ("POST", "/chat/completions", {"model": MODEL, "messages": [user("hello")], "max_tokens": 8}),
    ("POST", "/responses", {"model": MODEL, "input": "hello", "max_output_tokens": 8}),
    ("POST", "/messages", MESSAGES_BODY),
    ("POST", "/messages/count_tokens", {"model": MODEL, "messages": MESSAGES_BODY["messages"]}),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[path for _method, path, _body in ROUTES])
@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
def test_every_route_takes_a_users_key_in_either_header_and_refuses_none(users_server: Setup, method: str, path: str,
                                                                          body: dict[str, Any], header: str) -> None:  # fmt: skip
    server, keys = users_server.server, users_server.keys
    sent = {"json": body} if method == "POST" else {}
    for name in ("alice", "admin"):
        value = f"Bearer {keys[name]}" if header == "authorization" else keys[name]
        answered = httpx.request(method, server.base_url + path, headers={header: value}, timeout=60, **sent)
        assert answered.status_code == 200, (name, answered.text)
    for headers in ({}, {header: "Bearer sk-clawrl-forged" if header == "authorization" else "sk-clawrl-forged"}):
        refused = httpx.request(method, server.base_url + path, headers=headers, timeout=60, **sent)
        assert refused.status_code == 401, (headers, refused.text)
    # a wrong bearer token beside a right x-api-key (Anthropic's SDK may send both): the valid one counts
    both = {"authorization": "Bearer wrong", "x-api-key": keys["bob"]}
    assert httpx.request(method, server.base_url + path, headers=both, timeout=60, **sent).status_code == 200


def test_responses_and_messages_are_recorded_as_the_callers_and_reach_only_theirs(users_server: Setup) -> None:
    server, keys, store = users_server.server, users_server.keys, users_server.store
    mine = httpx.post(f"{server.base_url}/responses", json={"model": MODEL, "input": "a tea, please", "max_output_tokens": 8},
                      headers={"Authorization": f"Bearer {keys['alice']}"}, timeout=60)  # fmt: skip
    assert mine.status_code == 200
    session = store.turns.session(store.turns.turn(mine.json()["id"]).session_id)
    assert session is not None and session.user_id == "alice"
    # bob cannot continue alice's response by its id: not found, as a response that does not exist
    continued = {"model": MODEL, "input": "another", "previous_response_id": mine.json()["id"], "max_output_tokens": 8}
    stolen = httpx.post(f"{server.base_url}/responses", json=continued, headers={"Authorization": f"Bearer {keys['bob']}"}, timeout=60)
    assert stolen.status_code == 404 and stolen.json()["error"]["code"] == "previous_response_not_found"
    assert httpx.post(f"{server.base_url}/responses", json=continued, headers={"Authorization": f"Bearer {keys['alice']}"},
                      timeout=60).status_code == 200  # fmt: skip
    message = httpx.post(f"{server.base_url}/messages", json=MESSAGES_BODY, headers={"x-api-key": keys["bob"]}, timeout=60)
    owner = store.turns.session(store.turns.turn(message.json()["id"]).session_id)
    assert owner is not None and owner.user_id == "bob"


# --------------------------------------------------------------------------- every endpoint x every caller

CALLERS = ("own", "other", "admin", "none")  # alice (the owner), bob, the admin, no key


@dataclass
class AliceRecords:
    """What alice holds on the module's server: a named session, its turn, a response."""

    session: str  # as stored and as `X-Clawrl-Session` names it
    turn: str
    response: str
    secret: str  # a word of her conversation that nobody else may read back


@pytest.fixture(scope="module")
def alice_records(users_server: Setup) -> AliceRecords:
    server, keys = users_server.server, users_server.keys
    secret = "pineapple-7781"
    first = chat(server, keys["alice"], [user(f"my locker code is {secret}")], **{"X-Session-Id": "diary"})
    assert first.status_code == 200, first.text
    response = httpx.post(f"{server.base_url}/responses", json={"model": MODEL, "input": f"{secret} again", "max_output_tokens": 8},
                          headers={"Authorization": f"Bearer {keys['alice']}"}, timeout=60)  # fmt: skip
    assert response.status_code == 200, response.text
    return AliceRecords(first.headers["x-clawrl-session"], first.headers["x-clawrl-turn"], response.json()["id"], secret)


def _as(setup: Setup, caller: str, own: str = "alice") -> dict[str, str]:
    name = {"own": own, "other": "bob", "admin": "admin"}.get(caller)
    return {"Authorization": f"Bearer {setup.keys[name]}"} if name else {}


# (what is asked, how, the status for each of CALLERS); a user's key never reaches another's record,
# and is told so with the answer for a record that does not exist (404), not with a 403
MATRIX: list[tuple[str, str, str, Any, tuple[int, int, int, int]]] = [
    ("read the session", "GET", "/v1/sessions/{session}", None, (200, 404, 200, 401)),
    ("read the session by its name", "GET", "/v1/sessions/diary", None, (200, 404, 404, 401)),
    ("feedback on the turn", "POST", "/v1/feedback", {"turn": "{turn}", "score": 1}, (200, 404, 200, 401)),
    ("feedback on the session", "POST", "/v1/feedback", {"session_id": "{session}", "score": 1}, (200, 404, 200, 401)),
    ("continue the response", "POST", "/v1/responses",
     {"model": MODEL, "input": "and?", "previous_response_id": "{response}", "max_output_tokens": 4}, (200, 404, 200, 401)),
    ("export my data (each gets their own)", "GET", "/v1/me/data", None, (200, 200, 400, 401)),
    ("forget my data (each forgets their own)", "DELETE", "/v1/me/data", None, (200, 200, 400, 401)),
    ("register an episode", "POST", "/v1/episodes",
     {"session_id": "ep", "env": "toolcall", "task": "t", "seed": 0, "group_id": "g", "group_size": 1}, (403, 403, 200, 401)),
    ("the session's dashboard page", "GET", "/dashboard/sessions/{session}", None, (200, 404, 200, 401)),
    ("the dashboard's overview (each sees their own)", "GET", "/dashboard/api/overview", None, (200, 200, 200, 401)),
]


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize(("what", "method", "path", "body", "statuses"), MATRIX, ids=[row[0] for row in MATRIX])
def test_every_endpoint_answers_each_caller_only_what_is_theirs(users_server: Setup, alice_records: AliceRecords, what: str,
                                                                 method: str, path: str, body: Any, statuses: tuple[int, ...],
                                                                 caller: str) -> None:  # fmt: skip
    fill = {"session": alice_records.session, "turn": alice_records.turn, "response": alice_records.response}
    root = users_server.server.base_url.removesuffix("/v1")
    sent = json.loads(json.dumps(body).replace("{session}", fill["session"]).replace("{turn}", fill["turn"])
                      .replace("{response}", fill["response"])) if body is not None else None  # fmt: skip
    if sent is not None and "group_id" in sent:
        sent["session_id"] = f"ep-{caller}"  # each caller's try is a new episode
    # forgetting takes all of the caller's records: there "own" is erin, so that alice's stay for the rows after
    own = "erin" if method == "DELETE" else "alice"
    answered = httpx.request(method, root + path.format(**fill), json=sent, headers=_as(users_server, caller, own), timeout=60)
    assert answered.status_code == statuses[CALLERS.index(caller)], answered.text
    if answered.status_code != 200:  # an error object, or the dashboard's page for a session not recorded
        assert alice_records.secret not in answered.text and ("error" in answered.text or "Not found" in answered.text)
    if caller == "other":
        assert alice_records.secret not in answered.text
    elif caller == "own" and method == "GET" and "overview" not in path:  # the overview lists sessions, not text
        assert alice_records.secret in answered.text  # her own record, whole
    if method == "DELETE":  # whoever forgot their own, alice's records are whole
        assert len(users_server.store.turns.session_turns(alice_records.session)) > 0


def test_listing_sessions_shows_a_user_only_theirs_and_the_admin_all(users_server: Setup, alice_records: AliceRecords) -> None:
    listed = {}
    for caller in CALLERS:
        answered = httpx.get(f"{users_server.server.base_url}/sessions", headers=_as(users_server, caller), timeout=30)
        listed[caller] = answered.json() if answered.status_code == 200 else answered.status_code
    assert listed["none"] == 401
    owners = {caller: {item["user"] for item in listed[caller]["data"]} for caller in ("own", "other", "admin")}
    assert owners["own"] == {"alice"} and owners["other"] <= {"bob"} and "alice" in owners["admin"]
    assert alice_records.session in {item["id"] for item in listed["own"]["data"]}
    assert alice_records.session not in {item["id"] for item in listed["other"]["data"]}


def test_metrics_and_health_carry_no_conversation_text(users_server: Setup, alice_records: AliceRecords) -> None:
    root = users_server.server.base_url.removesuffix("/v1")
    for path in ("/metrics", "/healthz", "/readyz"):
        answered = httpx.get(root + path, headers=_as(users_server, "admin"), timeout=30)
        assert answered.status_code == 200 and alice_records.secret not in answered.text, path


def test_bob_naming_alices_session_holds_a_session_of_his_own(users_server: Setup, alice_records: AliceRecords) -> None:
    store = users_server.store
    before = len(store.turns.session_turns(alice_records.session))
    for name in (alice_records.session, "diary"):
        answered = chat(users_server.server, users_server.keys["bob"], [user("what is the locker code?")], **{"X-Session-Id": name})
        session = store.turns.session(answered.headers["x-clawrl-session"])
        assert session is not None and session.user_id == "bob" and alice_records.secret not in answered.text
    assert len(store.turns.session_turns(alice_records.session)) == before
