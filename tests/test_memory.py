"""Memory notes (issue 35, items 1 and 2; DESIGN §13): the judge's chosen hints and feedback texts
become notes of the turn's user, which their later main prompts carry at the end of the system
prompt, recorded token for token; the user lists, adds and removes them (`clawrl memory`,
`/v1/me/memory`), and forget and export cover them. The store's facet and its migration on SQLite
and PostgreSQL; one real server with the rule judge and `--memory on`, and one with memory off."""

from __future__ import annotations

import asyncio
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
from clawrl.judge.worker import build_worker
from clawrl.model.chat import render_prompt, teacher_prompt_ids
from clawrl.model.notes import NOTES_HEADING
from clawrl.store import Store
from clawrl.store.encryption import KeyRing, new_key
from clawrl.store.memory import NoSuchNote, NoteError, SameNote
from clawrl.store.migrations import SCHEMA_VERSION
from clawrl.types import DEFAULT_USER, Sample
from tests.helpers import ServerSetup, judgment, record, start_server, user, wait_for_judgment, wait_until

ADMIN_KEY = "sk-admin-memory"
MODEL = "tiny"
CORRECTION = "No, that is wrong: use fewer words and no lists."
HINT = "Use fewer words and no lists."  # what the rule judge makes of CORRECTION


def clawrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawrl", *args], capture_output=True, text=True, timeout=120)


def store_at(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue("postgres_url") if backend == "postgresql" else f"sqlite:///{tmp_path / 'clawrl.db'}"


# --------------------------------------------------------------------------- the store's facet


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_notes_are_kept_once_newest_first_and_per_user(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    store = Store(store_at(backend, tmp_path, request))
    memory = store.memory
    first = memory.remember("alice", "Use fewer words.", "hint", limit=3)
    memory.remember("alice", "Warm tone, please", "feedback", limit=3)
    again = memory.remember("alice", "  use FEWER   words ", "user", limit=3)  # the same note, taught again
    assert again.id == first.id and again.updated_at >= first.updated_at
    assert [note.text for note in memory.notes("alice")] == ["Use fewer words.", "Warm tone, please"]
    memory.remember("alice", "No bold.", "hint", limit=3)
    memory.remember("alice", "End with the answer line.", "hint", limit=3)  # past the limit: the oldest taught goes
    assert [note.text for note in memory.notes("alice")] == ["Use fewer words.", "No bold.", "End with the answer line."]
    assert [note.text for note in memory.injected("alice", 2)] == ["No bold.", "End with the answer line."]
    memory.remember("bob", "Use fewer words.", "hint", limit=3)  # bob's own, not a duplicate of alice's
    with pytest.raises(NoteError):
        memory.remove("bob", first.id)  # alice's note: not bob's to remove
    with pytest.raises(NoteError):
        memory.remember("alice", "   ", "user", limit=3)
    with pytest.raises(NoSuchNote):
        memory.edit("bob", first.id, "Be terse.")
    with pytest.raises(SameNote):
        memory.edit("alice", first.id, "no bold")  # what another of her notes says
    edited = memory.edit("alice", first.id, "Be terse.")
    assert (edited.id, edited.text, edited.source) == (first.id, "Be terse.", "user")
    assert [note.text for note in memory.injected("alice", 3)] == ["Be terse.", "No bold.", "End with the answer line."]
    memory.remove("alice", first.id)
    assert [note.text for note in memory.notes("alice")] == ["No bold.", "End with the answer line."]
    assert [note.user_id for note in memory.notes("bob")] == ["bob"]
    store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_forgetting_a_user_removes_their_notes(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    store = Store(store_at(backend, tmp_path, request))
    store.users.add("alice")
    store.memory.remember("alice", "Answer in French.", "user", limit=4)
    store.memory.remember("default", "Answer in German.", "user", limit=4)
    report = store.users.forget("alice", remove_account=True)
    assert report.rows["memory_notes"] == 1
    assert store.memory.notes("alice") == [] and [note.text for note in store.memory.notes("default")] == ["Answer in German."]
    store.users.add("carol")
    store.memory.remember("carol", "Keep it short.", "user", limit=4)
    store.users.remove("carol")  # a removed user whose only record is a note: still forgettable, name not reused
    with pytest.raises(ValueError, match="still stored"):
        store.users.add("carol")
    assert store.users.forget("carol", remove_account=True).rows["memory_notes"] == 1
    store.close()


def test_a_note_is_encrypted_at_rest(tmp_path: Path) -> None:
    secret = "call me Zebulon-4417"
    store = Store.for_run_dir(tmp_path, KeyRing.from_text(new_key(), "k"))
    store.memory.remember("default", secret, "user", limit=4)
    store.scrub()
    assert [note.text for note in store.memory.notes("default")] == [secret]
    store.close()
    assert not any(secret.encode() in path.read_bytes() for path in tmp_path.iterdir() if path.is_file())


def _as_version(url: str, version: int, statements: list[str]) -> None:
    """The store at `url` as clawrl wrote it at schema `version`: `statements` undo what came after."""
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as db:
        for statement in [*statements, f"UPDATE meta SET value='{version}' WHERE key='schema_version'"]:
            db.execute(sqlalchemy.text(statement))
    engine.dispose()


UNDO_V13 = ["DROP INDEX ix_episodes_waiting", "ALTER TABLE episodes DROP COLUMN sampled"]  # episodes marked sampled


def _as_version_10(url: str) -> None:
    """The store at `url` as clawrl wrote it before memory notes (schema v10)."""
    _as_version(url, 10, [*UNDO_V13, "ALTER TABLE samples DROP COLUMN student_prompt_token_ids",
                          "ALTER TABLE turns DROP COLUMN memory_note_ids", "DROP TABLE memory_notes"])  # fmt: skip


def _as_version_11(url: str) -> None:
    """The store at `url` as clawrl wrote it before notes were trained in and retired (schema v11)."""
    _as_version(url, 11, [*UNDO_V13, "ALTER TABLE samples DROP COLUMN student_prompt_token_ids",
                          "ALTER TABLE memory_notes DROP COLUMN retired_at"])  # fmt: skip


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_version_11_store_gains_trained_in_and_retired_notes(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = store_at(backend, tmp_path, request)
    store = Store(url)
    record(store, "t1", "s1", [user("q")], "a")
    store.judging.record_judgment(judgment("t1"))
    store.training.add_samples([Sample("t1", "ready", "rl", 1.0, 0)])
    kept = store.memory.remember("default", "Be brief.", "user", limit=4)
    store.close()
    _as_version_11(url)
    store = Store(url)
    assert store.training.sample("t1").student_prompt_token_ids is None  # trained as fed, as before
    assert [(note.id, note.retired_at) for note in store.memory.notes("default")] == [(kept.id, None)]  # active
    record(store, "t2", "s2", [user("q")], "a")
    store.judging.record_judgment(judgment("t2"))
    store.training.add_samples([Sample("t2", "ready", "opd", 0.0, 0, student_prompt_token_ids=[1, 2, 3])])
    assert store.training.sample("t2").student_prompt_token_ids == [1, 2, 3]
    store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_version_10_store_gains_memory_notes(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    assert SCHEMA_VERSION == 15
    url = store_at(backend, tmp_path, request)
    store = Store(url)
    record(store, "t1", "s1", [user("q")], "a")
    store.close()
    _as_version_10(url)
    store = Store(url)
    turn = store.turns.turn("t1")
    assert turn is not None and turn.memory_note_ids is None  # no turn stored before held notes
    note = store.memory.remember("default", "Be brief.", "user", limit=4)
    record(store, "t2", "s2", [user("q")], "a", memory_note_ids=[note.id])
    assert store.turns.turn("t2").memory_note_ids == [note.id]
    store.close()


# --------------------------------------------------------------------------- which hints become notes

TOPIC_CORRECTION = "Those aren't my numbers. Please answer this one: Jia travels by boat at 33 km per hour for 3 hours."
STYLE_CORRECTION = "Nope, too formatted. Please just use ordinary sentences and keep all the working."


@pytest.mark.parametrize("memory_from", ["directives", "hints"])
def test_only_directives_that_hold_for_later_requests_become_notes(memory_from: str, tmp_path: Path) -> None:
    """A correction that asks for another problem's answer is a hint for its turn, and as a note would
    ask every later prompt for that answer: under `directives` it makes none."""
    store = Store.for_run_dir(tmp_path)
    question, answer = user("Tom has 5 apples and buys 3 more. How many?"), "**Answer:** 1. Tom has 5. 2. He buys 3. **8.**"
    for index, correction in enumerate([TOPIC_CORRECTION, STYLE_CORRECTION]):
        record(store, f"t{index}", f"s{index}", [question], answer)
        conversation = [question, {"role": "assistant", "content": answer}, user(correction)]
        record(store, f"next{index}", f"s{index}", conversation, "ok", continues_turn_id=f"t{index}", next_state=[user(correction)])
    worker = build_worker(store, JudgeConfig(judge="rule"), memory_notes=4, memory_from=memory_from)
    assert worker is not None and asyncio.run(worker.judge_available()) == 2
    hints = {turn_id: judgment.hint for turn_id, judgment in store.judging.judgments_for(["t0", "t1"]).items()}
    assert hints["t0"] is not None and "Jia travels" in hints["t0"]  # the turn's hint keeps what the user asked
    noted = [(note.text, note.turn_id) for note in store.memory.notes(DEFAULT_USER)]
    if memory_from == "directives":
        assert noted == [("Please just use ordinary sentences and keep all the working.", "t1")]
    else:
        assert sorted(turn_id for _, turn_id in noted) == ["t0", "t1"]  # judged side by side: in either order
        assert "Jia travels" in dict((turn_id, text) for text, turn_id in noted)["t0"]
    store.close()


COLORBLIND = "Thanks! Also, I'm colorblind, so please don't rely on red/green when you describe charts for me."


@pytest.mark.parametrize("memory_from", ["directives", "hints"])
def test_a_standing_wish_said_with_thanks_becomes_a_note_and_thanks_alone_none(memory_from: str, tmp_path: Path) -> None:
    """A reply read as praise has no hint (nothing in its answer should change), but a wish beside the
    thanks holds for later answers: under `directives` it is the user's note, from the reply."""
    store = Store.for_run_dir(tmp_path)
    question, answer = user("Describe this sales chart for my slides."), "Sales rose in red regions and fell in green ones."
    for index, reply in enumerate([COLORBLIND, "thanks!!"]):
        record(store, f"t{index}", f"s{index}", [question], answer)
        conversation = [question, {"role": "assistant", "content": answer}, user(reply)]
        record(store, f"next{index}", f"s{index}", conversation, "ok", continues_turn_id=f"t{index}", next_state=[user(reply)])
    worker = build_worker(store, JudgeConfig(judge="rule"), memory_notes=4, memory_from=memory_from)
    assert worker is not None and asyncio.run(worker.judge_available()) == 2
    judged = store.judging.judgments_for(["t0", "t1"])
    assert [(judged[turn_id].score, judged[turn_id].hint) for turn_id in ("t0", "t1")] == [(1, None), (1, None)]
    noted = [(note.text, note.source, note.turn_id) for note in store.memory.notes(DEFAULT_USER)]
    if memory_from == "directives":
        assert noted == [("Please don't rely on red/green when you describe charts for me.", "reply", "t0")]
    else:
        assert noted == []  # no hint to keep
    store.close()


# --------------------------------------------------------------------------- one server, memory on


class Setup(ServerSetup):
    """The memory server, with the calls its tests make as one of its users."""

    def call(self, method: str, name: str, path: str, body: Any = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.keys[name]}"} if name else {}
        return httpx.request(method, f"{self.server.base_url}{path}", json=body, headers=headers, timeout=60)

    def chat(self, name: str, messages: list[dict[str, Any]], **headers: str) -> httpx.Response:
        sent = {"Authorization": f"Bearer {self.keys[name]}"} | headers
        body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0}
        answered = httpx.post(f"{self.server.base_url}/chat/completions", json=body, headers=sent, timeout=60)
        assert answered.status_code == 200, answered.text
        return answered


@pytest.fixture(scope="module")
def memory_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    run_dir = tmp_path_factory.mktemp("memory") / "run"
    store = Store.for_run_dir(run_dir)
    keys = {name: store.users.add(name)[1] for name in ("alice", "bob", "carol")} | {"admin": ADMIN_KEY}
    with start_server(tiny_model_dir, run_dir, judge=JudgeConfig(judge="rule", judge_poll_s=0.05), api_key=ADMIN_KEY,
                      served_model_name=MODEL, memory="on", memory_notes=4) as server:  # fmt: skip
        yield Setup(server, keys, store, run_dir)


def answer_of(response: httpx.Response) -> dict[str, Any]:
    return {"role": "assistant", "content": response.json()["choices"][0]["message"]["content"] or ""}


def fed_text(setup: Setup, tokenizer_dir: Path, response: httpx.Response) -> tuple[Any, str]:
    """The recorded turn of `response` and the text of the token ids its prompt was fed."""
    turn = setup.store.turns.turn(response.headers["x-clawrl-turn"])
    assert turn is not None
    return turn, AutoTokenizer.from_pretrained(tokenizer_dir).decode(turn.prompt_token_ids)


def test_a_corrections_hint_is_in_the_users_next_prompt_until_removed(memory_server: Setup, tiny_model_dir: Path) -> None:
    setup = memory_server
    system = {"role": "system", "content": "You are a helpful assistant."}
    messages: list[dict[str, Any]] = [system, user("Name three green teas.")]
    first = setup.chat("alice", messages)  # no session id: every turn below is found by its echo
    messages += [answer_of(first), user(CORRECTION)]
    second = setup.chat("alice", messages)
    assert wait_for_judgment(setup.store, first.headers["x-clawrl-turn"]).hint == HINT
    wait_until(lambda: [note.text for note in setup.store.memory.notes("alice")] == [HINT], 30, "the hint as alice's note")
    messages += [answer_of(second), user("And three black teas?")]
    third = setup.chat("alice", messages)
    turn, fed = fed_text(setup, tiny_model_dir, third)
    note = setup.store.memory.notes("alice")[0]
    assert NOTES_HEADING in fed and HINT in fed and turn.memory_note_ids == [note.id]
    assert turn.prompt_token_ids == render_prompt(AutoTokenizer.from_pretrained(tiny_model_dir), [
        {**system, "content": f"{system['content']}\n\n{NOTES_HEADING}\n- {HINT}"}, *messages[1:]], None)
    assert turn.messages == messages  # what the client sent: the notes are in the ids only
    assert {third.headers["x-clawrl-session"], second.headers["x-clawrl-session"]} == {first.headers["x-clawrl-session"]}
    teacher = AutoTokenizer.from_pretrained(tiny_model_dir).decode(teacher_prompt_ids(
        AutoTokenizer.from_pretrained(tiny_model_dir), turn, "Say it warmly."))  # fmt: skip
    assert NOTES_HEADING not in teacher and "Say it warmly." in teacher  # the teacher's prompt: no second copy
    side = setup.chat("alice", [user("Write a title for this chat.")], **{"X-Turn-Type": "side"})
    assert NOTES_HEADING not in fed_text(setup, tiny_model_dir, side)[1]  # side turns are answered as asked
    bobs = setup.chat("bob", [user("Name three green teas.")])
    bob_turn, bob_fed = fed_text(setup, tiny_model_dir, bobs)
    assert HINT not in bob_fed and bob_turn.memory_note_ids is None  # alice's notes never reach bob
    listed = clawrl("memory", "list", "--user", "alice", "--json", "--run-dir", str(setup.run_dir))
    assert listed.returncode == 0, listed.stderr
    assert [(item["id"], item["text"], item["source"]) for item in json.loads(listed.stdout)] == [(note.id, HINT, "hint")]
    assert setup.call("DELETE", "bob", f"/me/memory/{note.id}").status_code == 404  # not bob's
    assert setup.call("PATCH", "bob", f"/me/memory/{note.id}", {"text": "Be rude."}).status_code == 404
    edited = clawrl("memory", "edit", str(note.id), "Use fewer words, and no lists.", "--user", "alice", "--run-dir",
                    str(setup.run_dir))  # fmt: skip
    assert edited.returncode == 0, edited.stderr
    patched = setup.call("PATCH", "alice", f"/me/memory/{note.id}", {"text": HINT})
    assert (patched.status_code, patched.json()["text"], patched.json()["id"]) == (200, HINT, note.id)
    removed = clawrl("memory", "remove", str(note.id), "--user", "alice", "--run-dir", str(setup.run_dir))
    assert removed.returncode == 0, removed.stderr
    messages += [answer_of(third), user("Thanks. And oolong?")]
    fourth = setup.chat("alice", messages)
    fourth_turn, fourth_fed = fed_text(setup, tiny_model_dir, fourth)
    assert HINT not in fourth_fed and fourth_turn.memory_note_ids is None
    assert fourth.headers["x-clawrl-session"] == first.headers["x-clawrl-session"]


def test_a_request_says_whether_its_prompt_carries_the_notes(memory_server: Setup, tiny_model_dir: Path) -> None:
    """`X-Clawrl-Memory` (or the body's `memory`) over the default: an evaluation's side turn can ask for the
    notes, a main turn can go without them; another word is a 400 error object."""
    setup = memory_server
    note = setup.call("POST", "bob", "/me/memory", {"text": "Sign off with a haiku."}).json()
    asked = setup.chat("bob", [user("Write a title for this chat.")], **{"X-Turn-Type": "side", "X-Clawrl-Memory": "on"})
    side_turn, side_fed = fed_text(setup, tiny_model_dir, asked)
    assert side_turn.kind == "side" and "Sign off with a haiku." in side_fed and side_turn.memory_note_ids == [note["id"]]
    without = setup.chat("bob", [user("Name a tea.")], **{"X-Clawrl-Memory": "off"})
    main_turn, main_fed = fed_text(setup, tiny_model_dir, without)
    assert main_turn.kind == "main" and NOTES_HEADING not in main_fed and main_turn.memory_note_ids is None
    body = {"model": MODEL, "messages": [user("Name a tea.")], "max_tokens": 2, "turn_type": "side", "memory": True}
    in_body = httpx.post(f"{setup.server.base_url}/chat/completions", json=body,
                         headers={"Authorization": f"Bearer {setup.keys['bob']}"}, timeout=60)  # fmt: skip
    assert "Sign off with a haiku." in fed_text(setup, tiny_model_dir, in_body)[1]
    wrong = httpx.post(f"{setup.server.base_url}/chat/completions", json=body | {"memory": None},
                       headers={"Authorization": f"Bearer {setup.keys['bob']}", "X-Clawrl-Memory": "maybe"}, timeout=60)  # fmt: skip
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "X-Clawrl-Memory"
    assert setup.call("DELETE", "bob", f"/me/memory/{note['id']}").status_code == 200


def test_feedback_text_becomes_a_note_listed_exported_and_forgotten(memory_server: Setup, tiny_model_dir: Path) -> None:
    setup = memory_server
    answered = setup.chat("carol", [user("What is a haiku?")])
    text = "Give one example, not a definition."
    feedback = setup.call("POST", "carol", "/feedback", {"turn": answered.headers["x-clawrl-turn"], "score": -1, "text": text})
    assert feedback.status_code == 200, feedback.text
    added = setup.call("POST", "carol", "/me/memory", {"text": "Call me Cee."})
    assert added.status_code == 200 and added.json()["source"] == "user"
    listed = setup.call("GET", "carol", "/me/memory").json()
    assert [(item["text"], item["source"]) for item in listed["data"]] == [(text, "feedback"), ("Call me Cee.", "user")]
    assert (listed["memory"], listed["limit"]) == ("on", 4)
    clash = setup.call("PATCH", "carol", f"/me/memory/{added.json()['id']}", {"text": text.upper()})
    assert clash.status_code == 409 and clash.json()["error"]["code"] == "note_exists"  # two notes would say one thing
    _, fed = fed_text(setup, tiny_model_dir, setup.chat("carol", [user("And a limerick?")]))
    assert fed.index(text) < fed.index("Call me Cee.") < fed.index("And a limerick?")  # a system message of their own
    exported = [json.loads(line) for line in setup.call("GET", "carol", "/me/data").text.splitlines()]
    assert [line["memory_note"]["text"] for line in exported if "memory_note" in line] == [text, "Call me Cee."]
    assert text not in setup.call("GET", "bob", "/me/data").text
    out = setup.run_dir.parent / "carol.jsonl"
    assert clawrl("users", "export", "carol", "--out", str(out), "--run-dir", str(setup.run_dir)).returncode == 0
    assert text in out.read_text(encoding="utf-8")
    assert setup.call("DELETE", "carol", "/me/data").json()["rows"]["memory_notes"] == 2
    assert setup.call("GET", "carol", "/me/memory").json()["data"] == [] and setup.store.memory.notes("carol") == []
    _, after = fed_text(setup, tiny_model_dir, setup.chat("carol", [user("And a sonnet?")]))
    assert text not in after and NOTES_HEADING not in after


@pytest.mark.parametrize(("method", "path", "body", "status", "param"), [
    ("POST", "/me/memory", {}, 400, "text"),
    ("POST", "/me/memory", {"text": "  \n "}, 400, "text"),
    ("POST", "/me/memory", {"text": "x" * 1001}, 400, "text"),
    ("POST", "/me/memory", {"text": 7}, 400, "text"),
    ("DELETE", "/me/memory/seven", None, 400, "note_id"),
    ("DELETE", "/me/memory/99999999999999999999999", None, 400, "note_id"),
    ("DELETE", "/me/memory/999999", None, 404, "note_id"),
    ("PATCH", "/me/memory/999999", {"text": "Be terse."}, 404, "note_id"),
    ("PATCH", "/me/memory/seven", {"text": "Be terse."}, 400, "note_id"),
    ("PATCH", "/me/memory/1", {"text": ""}, 400, "text"),
])  # fmt: skip
def test_bad_memory_requests_are_4xx_error_objects(memory_server: Setup, method: str, path: str, body: Any, status: int,
                                                   param: str) -> None:  # fmt: skip
    answered = memory_server.call(method, "bob", path, body)
    assert answered.status_code == status, answered.text
    error = answered.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


def test_memory_needs_a_key_and_the_admins_notes_are_the_runs(memory_server: Setup) -> None:
    assert memory_server.call("GET", "", "/me/memory").status_code == 401
    added = memory_server.call("POST", "admin", "/me/memory", {"text": "The run's own note."})
    assert added.status_code == 200
    note = memory_server.store.memory.notes("default")[0]
    assert note.text == "The run's own note." and note.id == added.json()["id"]
    assert memory_server.call("DELETE", "admin", f"/me/memory/{note.id}").json()["deleted"] is True
    run = ("--run-dir", str(memory_server.run_dir))
    listed = clawrl("memory", "list", *run)
    assert listed.returncode == 0 and "default has no memory notes" in listed.stderr
    typed = clawrl("memory", "add", "Typed in by the admin.", *run)
    assert typed.returncode == 0, typed.stderr
    shown = memory_server.call("GET", "admin", "/me/memory").json()["data"]
    assert [(item["id"], item["text"], item["source"]) for item in shown] == [(int(typed.stdout), "Typed in by the admin.", "user")]
    assert clawrl("memory", "remove", typed.stdout.strip(), *run).returncode == 0
    assert memory_server.store.memory.notes("default") == []
    for refused in (("list", "--user", "nobody"), ("add", "hello", "--user", "nobody"), ("add", "   "), ("remove", "424242"),
                    ("edit", "424242", "hello")):  # fmt: skip
        answered = clawrl("memory", *refused, *run)
        assert answered.returncode == 1 and "error:" in answered.stderr and "Traceback" not in answered.stderr, refused


# --------------------------------------------------------------------------- memory off (the default)


def test_memory_off_notes_nothing_and_feeds_the_prompt_as_sent(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    store = Store.for_run_dir(run_dir)
    store.memory.remember("default", "A note kept from a run with memory on.", "user", limit=4)
    with start_server(tiny_model_dir, run_dir, judge=JudgeConfig(judge="rule", judge_poll_s=0.05),
                      served_model_name=MODEL) as server:  # fmt: skip
        messages: list[dict[str, Any]] = [user("Name three green teas.")]

        def chat() -> httpx.Response:
            body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0}
            return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=60)

        first = chat()
        messages += [answer_of(first), user(CORRECTION)]
        second = chat()
        httpx.post(f"{server.base_url}/feedback", json={"turn": second.headers["x-clawrl-turn"], "score": -1,
                                                        "text": "Shorter, please."}, timeout=30)  # fmt: skip
        assert wait_for_judgment(store, first.headers["x-clawrl-turn"]).hint == HINT
        messages += [answer_of(second), user("And black teas?")]
        third = chat()
        turn = store.turns.turn(third.headers["x-clawrl-turn"])
        assert turn.prompt_token_ids == render_prompt(AutoTokenizer.from_pretrained(tiny_model_dir), messages, None)
        assert turn.memory_note_ids is None
        assert [note.text for note in store.memory.notes("default")] == ["A note kept from a run with memory on."]
