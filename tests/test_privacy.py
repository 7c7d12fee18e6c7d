"""Opting out and exporting (issue 33, items 1 and 4; DESIGN §12): `store: false` leaves nothing,
`train: false` (per request, per session, per user) is recorded and never judged nor made a sample,
`--no-store` and `--no-train` users, and a user's export by the CLI and by `GET /v1/me/data`. One
real server with a judge, on a real port, and the store's migration on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy
from transformers import AutoTokenizer

from clawrl.config import JudgeConfig
from clawrl.store import Store
from clawrl.train.samples import SampleBuilder
from tests.helpers import ServerSetup as Setup
from tests.helpers import record, start_server, user, wait_for_judgment, wait_until

ADMIN_KEY = "sk-admin-privacy"
MODEL = "tiny"


def clawrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawrl", *args], capture_output=True, text=True, timeout=120)


# --------------------------------------------------------------------------- the store's migration


def _as_version_8(url: str) -> None:
    """The store at `url` as clawrl wrote it before opt-outs (schema v8)."""
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as db:
        for table, column in (("turns", "opt_out"), ("sessions", "train"), ("users", "store"), ("users", "train")):
            db.execute(sqlalchemy.text(f"ALTER TABLE {table} DROP COLUMN {column}"))
        db.execute(sqlalchemy.text("UPDATE meta SET value='8' WHERE key='schema_version'"))
    engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_version_8_store_has_opted_out_of_nothing(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else f"sqlite:///{tmp_path / 'clawrl.db'}"
    store = Store(url)
    store.users.add("alice")
    record(store, "t1", "s1", [user("q")], "a", user_id="alice")
    store.close()
    _as_version_8(url)
    store = Store(url)
    turn, session, alice = store.turns.turn("t1"), store.turns.session("s1"), store.users.get("alice")
    assert turn is not None and turn.opt_out is None and turn.trainable
    assert session is not None and session.train and (alice.store, alice.train) == (True, True)
    record(store, "t2", "s2", [user("q")], "a", opt_out="request")  # the new columns take writes
    record(store, "t3", "s2", [user("q")], "b", continues_turn_id="t2", next_state=[user("more")])
    assert (store.turns.turn("t2").opt_out, store.turns.turn("t3").opt_out) == ("request", "session")
    assert store.users.set_opt_outs("alice", train=False).train is False
    assert store.judging.judge_backlog()[0] == 0  # t2's next state queued nothing: it opted out
    store.close()


# --------------------------------------------------------------------------- one server, four users


@pytest.fixture(scope="module")
def privacy_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    run_dir = tmp_path_factory.mktemp("privacy") / "run"
    store = Store.for_run_dir(run_dir)
    keys = {name: store.users.add(name)[1] for name in ("alice", "bob", "carol", "dave")} | {"admin": ADMIN_KEY}
    store.users.set_opt_outs("dave", store=False)
    with start_server(tiny_model_dir, run_dir, judge=JudgeConfig(judge="rule", judge_poll_s=0.05), api_key=ADMIN_KEY,
                      served_model_name=MODEL) as server:  # fmt: skip
        yield Setup(server, keys, store, run_dir)


def post(setup: Setup, name: str, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    sent = {"Authorization": f"Bearer {setup.keys[name]}"} | headers
    return httpx.post(f"{setup.server.base_url}{path}", json=body, headers=sent, timeout=60)


def chat(setup: Setup, name: str, messages: list[dict[str, Any]], headers: dict[str, str] | None = None,
         **body: Any) -> httpx.Response:  # fmt: skip
    answered = post(setup, name, "/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 8,
                                                       "temperature": 0, **body}, **(headers or {}))  # fmt: skip
    assert answered.status_code == 200, answered.text
    return answered


def converse(setup: Setup, name: str, session: str, asks: list[tuple[dict[str, str], dict[str, Any]]]) -> list[str]:
    """One session of `name`'s: a request per (headers, body fields), each after the last answer; the
    last turn gets a 👎 (so that it has something to be judged on). Returns the turn ids."""
    messages: list[dict[str, Any]] = []
    turn_ids = []
    for number, (headers, body) in enumerate(asks):
        messages.append(user(f"question {number} of {session}: no, that is wrong"))
        answered = chat(setup, name, messages, {"X-Session-Id": session, **headers}, **body)
        messages.append({"role": "assistant", "content": answered.json()["choices"][0]["message"]["content"] or ""})
        turn_ids.append(answered.headers["x-clawrl-turn"])
    assert post(setup, name, "/feedback", {"turn": turn_ids[-1], "score": -1}).status_code == 200
    return turn_ids


def settled(setup: Setup, judged: list[str]) -> None:
    """Once the judge has judged `judged` and has nothing left queued: what it would ever judge, it has."""
    for turn_id in judged:
        wait_for_judgment(setup.store, turn_id)
    wait_until(lambda: setup.store.judging.judge_backlog()[0] == 0, 30, "an empty judge queue")


def samples_made(setup: Setup, tokenizer_dir: Path) -> None:
    """The trainer's sample-making, run to the end of what it is given."""
    builder = SampleBuilder(setup.store.training, AutoTokenizer.from_pretrained(tokenizer_dir), "rl",
                            lambda *_args: None, lambda: "base")  # fmt: skip
    while builder.build():
        pass


def test_store_false_is_answered_and_leaves_nothing(privacy_server: Setup) -> None:
    setup, store = privacy_server, privacy_server.store
    before = store.turns.counts()
    asked = [user("a secret never to be kept: kumquat-4410")]
    plain = chat(setup, "alice", asked, store=False)
    streamed = chat(setup, "alice", asked, store=False, stream=True)
    message = post(setup, "alice", "/messages", {"model": MODEL, "max_tokens": 8, "store": False,
                                                 "messages": [{"role": "user", "content": "kumquat-4410"}]})  # fmt: skip
    assert message.status_code == 200, message.text
    for answered in (plain, streamed, message):
        assert store.turns.turn(answered.headers["x-clawrl-turn"]) is None
        assert store.turns.session(answered.headers["x-clawrl-session"]) is None
    assert store.turns.counts() == before
    # a byte search of the run directory (the database, its write-ahead log), in another process: a
    # file of the store opened and closed in this one would drop the server's SQLite locks on it
    searched = subprocess.run(["grep", "-rl", "kumquat", str(setup.run_dir)], capture_output=True, text=True)
    assert searched.returncode == 1, searched.stdout


def test_a_no_store_user_leaves_nothing_whatever_the_request_says(privacy_server: Setup) -> None:
    setup, store = privacy_server, privacy_server.store
    before = store.turns.counts()
    chat(setup, "dave", [user("hi")])
    chat(setup, "dave", [user("hi")], {"X-Clawrl-Record": "true"}, store=True)
    answered = post(setup, "dave", "/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 8})
    assert answered.status_code == 200 and store.turns.turn(answered.json()["id"]) is None
    assert store.turns.counts() == before and store.turns.list_sessions(user_id="dave") == []


def test_train_false_turns_are_recorded_and_never_judged_nor_sampled(privacy_server: Setup, tiny_model_dir: Path) -> None:
    setup, store = privacy_server, privacy_server.store
    # a session that trains, with two turns opted out by their requests (the header, the body's field)
    first, by_header, by_body, last = converse(setup, "alice", "mixed", [
        ({}, {}), ({"X-Clawrl-Train": "false"}, {}), ({}, {"train": False}), ({}, {})])  # fmt: skip
    # a session whose first request opts out: all of it is never trained on, the 👎 on its last turn too
    no_train = converse(setup, "alice", "not-this-one", [({"X-Clawrl-Train": "false"}, {}), ({}, {}), ({}, {"train": True})])
    assert post(setup, "alice", "/feedback", {"turn": by_header, "score": 1}).status_code == 200
    settled(setup, [last])
    samples_made(setup, tiny_model_dir)
    opted_out = [by_header, by_body, *no_train]
    assert [store.turns.turn(turn_id).opt_out for turn_id in opted_out] == ["request", "request", "request", "session", "session"]
    assert all(store.judging.judgment(turn_id) is None and store.training.sample(turn_id) is None for turn_id in opted_out)
    # `first` was followed by an opted-out request: its words are no next state, so nothing judges `first`
    assert store.turns.next_states([first]) == {} and store.judging.judgment(first) is None
    assert store.training.sample(last) is not None
    # what applied, as the owner reads it back
    page = httpx.get(f"{setup.server.base_url}/sessions/alice/mixed", headers={"Authorization": f"Bearer {setup.keys['alice']}"})
    assert page.status_code == 200 and page.json()["train"] is True
    assert [(turn["train"], turn["opt_out"]) for turn in page.json()["turns"]] == [
        (True, None), (False, "request"), (False, "request"), (True, None)]  # fmt: skip
    session = httpx.get(f"{setup.server.base_url}/sessions/not-this-one", headers={"Authorization": f"Bearer {setup.keys['alice']}"})
    assert session.json()["train"] is False and {turn["opt_out"] for turn in session.json()["turns"]} == {"request", "session"}
    dashboard = httpx.get(f"{setup.server.base_url.removesuffix('/v1')}/dashboard/sessions/alice/not-this-one",
                          headers={"Authorization": f"Bearer {setup.keys['alice']}"})
    assert dashboard.status_code == 200 and "opted out by the session" in dashboard.text and "opted out by the request" in dashboard.text
    shown = clawrl("sessions", "show", "alice/not-this-one", "--run-dir", str(setup.run_dir))
    assert shown.returncode == 0, shown.stderr
    assert "never trained on (its first request opted out)" in shown.stdout and "opted out by the session" in shown.stdout


def test_a_no_train_user_is_recorded_and_never_sampled_until_they_train_again(privacy_server: Setup, tiny_model_dir: Path) -> None:
    setup, store = privacy_server, privacy_server.store
    assert clawrl("users", "set", "carol", "--no-train", "--run-dir", str(setup.run_dir)).returncode == 0
    wait_until(lambda: store.turns.turn(chat(setup, "carol", [user("probe")]).headers["x-clawrl-turn"]).opt_out == "user",
               5, "the server to read carol's --no-train")  # fmt: skip
    hers = converse(setup, "carol", "week", [({}, {}), ({}, {"train": True}), ({"X-Clawrl-Train": "true"}, {})])
    listed = clawrl("users", "list", "--run-dir", str(setup.run_dir), "--json")
    assert {item["user"]: item["train"] for item in json.loads(listed.stdout)}["carol"] is False
    assert clawrl("users", "set", "carol", "--train", "--run-dir", str(setup.run_dir)).returncode == 0
    wait_until(lambda: store.turns.turn(chat(setup, "carol", [user("probe")]).headers["x-clawrl-turn"]).opt_out is None,
               5, "the server to read carol's --train")  # fmt: skip
    again = converse(setup, "carol", "month", [({}, {}), ({}, {})])
    settled(setup, again)
    samples_made(setup, tiny_model_dir)
    assert [store.turns.turn(turn_id).opt_out for turn_id in hers] == ["user"] * 3
    assert all(store.judging.judgment(turn_id) is None and store.training.sample(turn_id) is None for turn_id in hers)
    assert all(store.training.sample(turn_id) is not None for turn_id in again)


@pytest.mark.parametrize(("headers", "body", "param"), [
    ({"X-Clawrl-Train": "maybe"}, {}, "X-Clawrl-Train"), ({}, {"train": "maybe"}, "train"), ({}, {"store": [1]}, "store")])
def test_a_bad_opt_out_is_a_400(privacy_server: Setup, headers: dict[str, str], body: dict[str, Any], param: str) -> None:
    sent = {"model": MODEL, "messages": [user("hi")], "max_tokens": 8, **body}
    answered = post(privacy_server, "alice", "/chat/completions", sent, **headers)
    assert answered.status_code == 400 and answered.json()["error"]["param"] == param, answered.text
    assert answered.json()["error"]["type"] == "invalid_request_error"


def test_a_users_export_is_theirs_alone_and_the_same_by_the_cli_and_the_api(privacy_server: Setup, tmp_path: Path) -> None:
    setup, store = privacy_server, privacy_server.store
    secret = "papaya-0193"
    chat(setup, "alice", [user("what is in my export?")], {"X-Session-Id": "export"})
    chat(setup, "alice", [user(f"and {secret}?")], {"X-Session-Id": "export", "X-Clawrl-Train": "false"})
    chat(setup, "bob", [user("and in mine?")], {"X-Session-Id": "export"})

    def me(name: str) -> httpx.Response:
        return httpx.get(f"{setup.server.base_url}/me/data", headers={"Authorization": f"Bearer {setup.keys[name]}"}, timeout=60)

    by_api = me("alice")
    assert by_api.status_code == 200 and by_api.headers["content-type"].startswith("application/x-ndjson")
    out = tmp_path / "alice.jsonl"
    exported = clawrl("users", "export", "alice", "--out", str(out), "--run-dir", str(setup.run_dir))
    assert exported.returncode == 0, exported.stderr
    assert out.read_text(encoding="utf-8") == by_api.text
    lines = [json.loads(line) for line in by_api.text.splitlines()]
    assert {store.turns.session(line["session_id"]).user_id for line in lines} == {"alice"}
    assert secret in by_api.text and "request" in {line["opt_out"] for line in lines}
    everyone = tmp_path / "all.jsonl"
    assert clawrl("export", "--out", str(everyone), "--run-dir", str(setup.run_dir)).returncode == 0
    all_lines = [json.loads(line) for line in everyone.read_text(encoding="utf-8").splitlines()]
    assert [line for line in all_lines if line["turn_id"] in {mine["turn_id"] for mine in lines}] == lines  # the same format
    bobs = me("bob")
    assert bobs.status_code == 200 and secret not in bobs.text and bobs.text
    assert {store.turns.session(json.loads(line)["session_id"]).user_id for line in bobs.text.splitlines()} == {"bob"}
    admin = me("admin")
    assert admin.status_code == 400 and "clawrl export" in admin.json()["error"]["message"] and secret not in admin.text
    assert httpx.get(f"{setup.server.base_url}/me/data", timeout=30).status_code == 401
    missing = clawrl("users", "export", "nobody", "--out", str(tmp_path / "x.jsonl"), "--run-dir", str(setup.run_dir))
    assert missing.returncode == 1 and "no user called 'nobody'" in missing.stderr
