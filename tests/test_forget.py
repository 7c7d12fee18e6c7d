"""Forgetting a user (issue 33, item 2, and the forget half of item 6; DESIGN §12): `clawrl users forget
NAME --yes` and `DELETE /v1/me/data` remove every record of the user and their lineage, and a byte
search of the run directory finds a canary they said nowhere afterwards.

The store's part with real trainer steps on the tiny model (a lineage per user, and the shared one),
on SQLite and PostgreSQL; then one real server on a real port (the rule judge inside it, a lineage
per user, a real trainer stepped here) where three users teach it a canary each, and two of them
are forgotten while it runs, one by the CLI and one by their own key. The byte searches are `grep -r`
in another process: a file of the store opened and closed in this one would drop the server's
SQLite locks on it (tests/test_privacy.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy
import torch
from transformers import AutoTokenizer

from clawrl.config import EngineConfig, JudgeConfig, TrainConfig
from clawrl.serve.runner import ServerThread
from clawrl.store import Store
from clawrl.store.forgetting import TrainedOn
from clawrl.store.users import UserError
from clawrl.train.trainer import Trainer
from clawrl.types import Episode
from clawrl.versions.files import MANIFEST
from clawrl.versions.forgetting import forget_user
from tests.helpers import (
    CORRECTION, Conversation, PostgresServer, judgment, ready_sample, record, start_server, user, version, wait_for_judgment,
    wait_until,
)

ADMIN_KEY = "sk-admin-forget"
MODEL = "m"
TABLES = ("sessions", "turns", "next_states", "feedback", "judgments", "judge_leases", "judge_queue", "sample_queue",
          "samples", "episodes", "policy_versions", "policy_pointers", "users")  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def clawrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawrl", *args], capture_output=True, text=True, timeout=120)


def found_in(run_dir: Path, canary: str) -> list[str]:
    """The files under `run_dir` that hold `canary`'s bytes, searched by another process."""
    searched = subprocess.run(["grep", "-rl", "--binary-files=text", canary, str(run_dir)], capture_output=True, text=True)
    assert searched.returncode in (0, 1), searched.stderr
    return sorted(Path(line).name for line in searched.stdout.splitlines())


# --------------------------------------------------------------------------- the store, with real steps


def _session(talk: Conversation, user_id: str, name: str, said: str) -> list[str]:
    """A session of three turns whose first two are judged (with a hint that quotes `said`): two samples."""
    ids = [f"{user_id}-{name}-{index}" for index in range(3)]
    session = f"{user_id}/{name}"
    talk.turn(ids[0], session, f"Write a short note to my team about Friday. {said}", "Team, Friday is off.", user_id=user_id)
    talk.turn(ids[1], session, f"make it warmer, {said}", "Dear team, enjoy Friday off!", after=ids[0], user_id=user_id)
    talk.turn(ids[2], session, "thanks", "You are welcome.", after=ids[1], done=True, user_id=user_id)
    talk.judge(ids[0], -1, f"be warmer ({said})")
    talk.judge(ids[1], 1)
    talk.store.turns.add_feedback(ids[1], 1, f"lovely {said}")
    return ids[:2]


def _trainer(model_dir: Path, store: Store, run_dir: Path, adapters: str) -> Trainer:
    engine = EngineConfig(model=str(model_dir), device="cpu", cpu_threads=1)
    trainer = Trainer(TrainConfig(method="combine", batch_size=2, lr=1e-2, adapters=adapters), engine, store, run_dir)
    trainer.start()
    return trainer


def _holdings(store: Store, user_id: str) -> dict[str, Any]:
    """Everything the store shows of `user_id`: what must be untouched by forgetting another."""
    sessions = store.turns.list_sessions(user_id=user_id)
    return {"sessions": sessions, "turns": [store.turns.session_turns(session.id) for session in sessions],
            "samples": store.training.sample_counts(user_id), "versions": store.training.versions(user_id),
            "serving": store.training.serving_version(user_id)}  # fmt: skip


def _dump(postgres_server: PostgresServer, url: str) -> str:
    """`pg_dump` of the database at `url` (its data as a restore would bring it back)."""
    plain = sqlalchemy.engine.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    dumped = subprocess.run([str(postgres_server.binaries / "pg_dump"), "--data-only", plain], capture_output=True, text=True)
    assert dumped.returncode == 0, dumped.stderr
    return dumped.stdout


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_forget_removes_every_row_and_version_of_the_user_and_nothing_of_anyone_elses(
    backend: str, tiny_model_dir: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    run_dir, canary = tmp_path / "run", "quince-canary-5521"
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else f"sqlite:///{run_dir / 'clawrl.db'}"
    store = Store(url)
    for name in ("alice", "bob"):
        store.users.add(name)
    talk = Conversation(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    alices = _session(talk, "alice", "s1", canary) + _session(talk, "alice", "s2", canary)
    _session(talk, "bob", "s1", "bob's own words")
    talk.turn("alice-ep-0", "alice/ep", f"an episode step: {canary}", "done", user_id="alice")
    store.episodes.start(Episode("alice/ep", "toolcall", "t", "g", 1, 0))
    store.memory.remember("alice", f"remember {canary}", "user", limit=4)  # a memory note (issue 35) is hers too
    store.memory.remember("bob", "bob's own note", "user", limit=4)
    trainer = _trainer(tiny_model_dir, Store(url), run_dir, "per-user")
    assert trainer.run(max_steps=3) == 3  # alice, bob, alice: alice's second version is the newest number
    first, bobs, second = store.training.versions()
    assert (first.lineage, bobs.lineage, second.lineage) == ("alice", "bob", "alice")
    bob_before = _holdings(store, "bob")
    if backend == "sqlite":
        assert found_in(run_dir, canary) and not found_in(run_dir / "policy", canary)  # manifests hold turn ids
    else:
        assert canary in _dump(request.getfixturevalue("postgres_server"), url)
    assert set(json.loads((Path(first.path) / MANIFEST).read_text())["sample_ids"]) <= set(alices)

    made = store.training.sample(alices[0])
    report = forget_user(store, "alice", remove_account=True, run_dir=run_dir)
    assert report.rows == {"next_states": 4, "feedback": 2, "judgments": 4, "judge_leases": 0, "judge_queue": 0,
                           "sample_queue": 0, "samples": 4, "episodes": 1, "turns": 7, "sessions": 3,
                           "memory_notes": 1, "policy_versions": 2, "policy_pointers": 1, "users": 1}  # fmt: skip
    assert report.lineage_versions == [first.version, second.version] and report.trained_shared == []
    assert report.directories_removed == [str(run_dir / "policy" / "alice")] and report.log_emptied
    assert not (run_dir / "policy" / "alice").exists() and Path(bobs.path).is_dir()
    assert _holdings(store, "alice") == {"sessions": [], "turns": [], "samples": {}, "versions": [], "serving": 0}
    assert [user.id for user in store.users.list()] == ["bob"] and store.episodes.episode("alice/ep") is None
    assert all(store.turns.turn(turn_id) is None for turn_id in alices)
    assert _holdings(store, "bob") == bob_before and [note.text for note in store.memory.notes("bob")] == ["bob's own note"]
    if backend == "sqlite":
        assert found_in(run_dir, canary) == []
    else:
        assert canary not in _dump(request.getfixturevalue("postgres_server"), url)
    # a forgotten version's number is never given out again (an engine may still hold it under that number)
    assert store.training.next_version_number() == second.version + 1
    assert trainer.run(max_steps=1, idle_exit_s=0.1) == 0  # the trainer, holding alice's weights, lets go of them
    # a sample the trainer made of her turn before the forget, written after it: none, and no error
    store.training.add_samples([dataclasses.replace(made, status="ready", trained_version=None)])
    assert store.training.sample(alices[0]) is None
    with pytest.raises(UserError, match="no user called 'alice' and nothing of theirs"):
        store.users.forget("alice", remove_account=True)
    store.users.add("alice")  # the name is free: nothing of the old alice's would reach the new one
    assert store.training.serving_version("alice") == 0
    trainer.close()


def test_forgetting_a_user_of_the_shared_lineage_lists_the_versions_that_trained_on_them(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir, canary = tmp_path / "run", "medlar-canary-3307"
    store = Store.for_run_dir(run_dir)
    for name in ("alice", "bob"):
        store.users.add(name)
    talk = Conversation(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    alices = _session(talk, "alice", "s1", canary)
    _session(talk, "bob", "s1", "bob's words")
    trainer = _trainer(tiny_model_dir, Store.for_run_dir(run_dir), run_dir, "shared")
    assert trainer.run(max_steps=2) == 2
    trainer.close()
    hers, his = store.training.versions()
    assert json.loads((Path(hers.path) / MANIFEST).read_text())["sample_ids"] == alices
    for args, message in ((("alice",), "say --yes"), (("nobody", "--yes"), "no user called 'nobody'"),
                          (("default", "--yes"), "no user's name"), (("shared", "--yes"), "no user's name"),
                          (("../bob", "--yes"), "no user's name")):  # fmt: skip
        refused = clawrl("users", "forget", *args, "--run-dir", str(run_dir))
        assert refused.returncode in (1, 2) and message in refused.stderr and "Traceback" not in refused.stderr, args
    assert store.turns.list_sessions(user_id="alice") != []  # refused: nothing was removed
    forgot = clawrl("users", "forget", "alice", "--yes", "--run-dir", str(run_dir), "--json")
    assert forgot.returncode == 0, forgot.stderr
    report = json.loads(forgot.stdout)
    assert report["shared_versions_trained_on_user"] == [vars(TrainedOn(hers.version, "shared", 2))]
    assert report["lineage_versions"] == [] and report["directories_removed"] == [] and report["rows"]["samples"] == 2
    # the shared versions stay, weights and all: their manifests name her sample ids (no text of hers)
    assert [version.version for version in store.training.versions()] == [hers.version, his.version]
    assert found_in(run_dir, canary) == []


def test_forget_with_retrain_rebuilds_the_shared_lineage_without_the_user(tiny_model_dir: Path, tmp_path: Path) -> None:
    """v1 trained on bob, v2 on alice, v3 on bob again. `--retrain` serves v1 again and makes v3's
    samples (bob's) ready, so the trainer's next step is v4 = v1 + bob's, with nothing of alice's."""
    run_dir = tmp_path / "run"
    store = Store.for_run_dir(run_dir)
    for name in ("alice", "bob"):
        store.users.add(name)
    talk = Conversation(store, AutoTokenizer.from_pretrained(tiny_model_dir))

    def step() -> None:
        trainer = _trainer(tiny_model_dir, Store.for_run_dir(run_dir), run_dir, "shared")
        assert trainer.run(max_steps=1) == 1
        trainer.close()

    for user_id, name in (("bob", "s0"), ("alice", "s1"), ("bob", "s2")):
        _session(talk, user_id, name, f"{user_id}'s words")
        step()
    v1, v2, v3 = (version.version for version in store.training.versions())
    bobs_later = [sample for sample in store.training.samples_for([f"bob-s2-{index}" for index in range(2)]).values()]
    assert {sample.trained_version for sample in bobs_later} == {v3}
    forgot = clawrl("users", "forget", "alice", "--yes", "--retrain", "--run-dir", str(run_dir), "--json")
    assert forgot.returncode == 0, forgot.stderr
    assert json.loads(forgot.stdout)["retrained"] == {"lineage": "shared", "rolled_back_to": v1, "undone_versions": [v3, v2],
                                                      "samples_ready_again": 2}  # fmt: skip
    assert store.training.serving_version() == v1  # served at once: the follower swaps it in as after a rollback
    step()
    rebuilt = store.training.versions()[-1]
    assert (rebuilt.parent, rebuilt.num_samples) == (v1, 2)
    assert json.loads((Path(rebuilt.path) / MANIFEST).read_text())["sample_ids"] == [f"bob-s2-{index}" for index in range(2)]
    assert store.training.serving_version() == rebuilt.version and store.training.sample_counts().get("ready", 0) == 0
    again = clawrl("users", "forget", "bob", "--yes", "--retrain", "--run-dir", str(run_dir))
    assert again.returncode == 0 and "retrain: the shared lineage serves v0 again" in again.stdout, again.stdout + again.stderr


def test_retrain_cannot_go_back_to_a_pruned_version_and_the_forget_stands(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    for name in ("alice", "bob"):
        store.users.add(name)
    for number, user_id in enumerate(("bob", "alice"), start=1):
        turn_id = f"{user_id}-t"
        record(store, turn_id, f"{user_id}/s", [user("q")], "a", user_id=user_id)
        store.judging.record_judgment(judgment(turn_id))
        store.training.add_samples([ready_sample(turn_id)])
        store.training.register_version(version(number, number - 1), [turn_id])
    with store.write() as db:  # as --keep-versions leaves v1: the record, no weights
        db.execute(sqlalchemy.text("UPDATE policy_versions SET pruned = TRUE WHERE version = 1"))
    report = forget_user(store, "alice", remove_account=True, retrain=True)
    assert report.retrained is None and "v1 was pruned" in (report.retrain_refused or "")
    assert store.turns.list_sessions(user_id="alice") == [] and store.training.serving_version() == 2


# --------------------------------------------------------------------------- one server, three users


@dataclass
class World:
    server: ServerThread
    store: Store
    run_dir: Path
    keys: dict[str, str]
    trainer: Trainer
    logged: list[str]  # every record the processes here logged at INFO and above, formatted
    taught: dict[str, list[str]] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return self.server.base_url


CANARIES = {"alice": "loquat-canary-8812", "bob": "sapote-canary-2290", "carol": "feijoa-canary-6604"}


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def chat(w: World, name: str, messages: list[dict[str, Any]], headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
    sent = {"model": MODEL, "messages": messages, "max_tokens": 6} | body
    return httpx.post(f"{w.base}/chat/completions", json=sent, headers=bearer(w.keys[name]) | (headers or {}), timeout=60)


def teach(w: World, name: str) -> list[str]:
    """A session of three main turns saying the user's canary (a correction, thanks, a 👍 with a note
    quoting it): three samples of theirs. Returns the turn ids."""
    canary, messages, turn_ids = CANARIES[name], [], []
    for line in [f"Write a short note to my team about Friday, code {canary}.", f"{CORRECTION} ({canary})", "thanks, perfect"]:
        messages.append(user(line))
        answered = chat(w, name, messages, {"X-Session-Id": "notes"})
        assert answered.status_code == 200, answered.text
        messages.append({"role": "assistant", "content": answered.json()["choices"][0]["message"].get("content") or ""})
        turn_ids.append(answered.headers["x-clawrl-turn"])
    rated = httpx.post(f"{w.base}/feedback", json={"turn": turn_ids[-1], "score": 1, "text": f"great, {canary}"},
                       headers=bearer(w.keys[name]), timeout=30)  # fmt: skip
    assert rated.status_code == 200, rated.text
    return turn_ids


def answered_by(w: World, name: str) -> tuple[str, int]:
    response = chat(w, name, [user("hello")], turn_type="side")
    assert response.status_code == 200, response.text
    return response.headers["x-clawrl-policy-lineage"], int(response.headers["x-clawrl-policy-version"])


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.INFO)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(self.format(record) + (logging.Formatter().formatException(record.exc_info) if record.exc_info else ""))


@pytest.fixture(scope="module")
def world(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    torch.set_num_threads(1)
    run_dir = tmp_path_factory.mktemp("forget") / "run"
    store = Store.for_run_dir(run_dir)
    keys = {name: store.users.add(name)[1] for name in CANARIES}
    logged: list[str] = []
    handler, root = _Collect(logged), logging.getLogger()
    level, root.level = root.level, logging.INFO
    root.addHandler(handler)
    engine = EngineConfig(model=str(tiny_model_dir), device="cpu", cpu_threads=1)
    train = TrainConfig(method="combine", batch_size=3, lr=5e-2, adapters="per-user", train_poll_s=0.05)
    try:
        with start_server(tiny_model_dir, run_dir, judge=JudgeConfig(judge="rule", judge_poll_s=0.05), adapters="per-user",
                          policy_poll_s=0.1, served_model_name=MODEL, api_key=ADMIN_KEY) as server:  # fmt: skip
            trainer = Trainer(train, engine, Store.for_run_dir(run_dir), run_dir)
            trainer.start()
            w = World(server, store, run_dir, keys | {"admin": ADMIN_KEY}, trainer, logged)
            w.taught = {name: teach(w, name) for name in CANARIES}
            for turn_id in (turn for turns in w.taught.values() for turn in turns):
                wait_for_judgment(store, turn_id)
            trainer.run(idle_exit_s=0.3)
            for name in CANARIES:
                (version,) = store.training.versions(name)
                wait_until(lambda name=name, version=version: answered_by(w, name) == (name, version.version), 30,
                           f"{name} answered by their own v{version.version}")  # fmt: skip
            yield w
            trainer.close()
    finally:
        root.removeHandler(handler)
        root.level = level


def _before(w: World, name: str) -> None:
    """What a byte search finds of `name` while they exist: the canary in the store's files (the
    database, its write-ahead log), never in their lineage's manifests, which list their turn ids."""
    assert {"clawrl.db", "clawrl.db-wal"} & set(found_in(w.run_dir, CANARIES[name]))
    assert found_in(w.run_dir / "policy", CANARIES[name]) == []
    (version,) = w.store.training.versions(name)
    assert set(json.loads((Path(version.path) / MANIFEST).read_text())["sample_ids"]) == set(w.taught[name])


def _after(w: World, name: str, bob_before: dict[str, Any]) -> None:
    """Nothing of `name` anywhere on disk or in the logs; bob's records and lineage as they were, and served."""
    assert found_in(w.run_dir, CANARIES[name]) == []
    assert not (w.run_dir / "policy" / name).exists()
    listed = clawrl("sessions", "list", "--json", "--run-dir", str(w.run_dir))
    assert listed.returncode == 0, listed.stderr
    assert {session["user"] for session in json.loads(listed.stdout)} >= {"bob"}
    assert name not in {session["user"] for session in json.loads(listed.stdout)}
    assert _holdings(w.store, "bob") == bob_before
    (bobs,) = bob_before["versions"]
    assert answered_by(w, "bob") == ("bob", bobs.version) and Path(bobs.path).is_dir()
    assert not [line for line in w.logged if any(canary in line for canary in CANARIES.values())]


def test_users_forget_on_a_running_server_leaves_nothing_of_her(world: World) -> None:
    w = world
    _before(w, "alice")
    bob_before = _holdings(w.store, "bob")
    forgot = clawrl("users", "forget", "alice", "--yes", "--run-dir", str(w.run_dir))
    assert forgot.returncode == 0, forgot.stderr
    assert "forgot alice: removed" in forgot.stdout and f"removed {w.run_dir / 'policy' / 'alice'}" in forgot.stdout
    _after(w, "alice", bob_before)
    # the server, which did not forget her itself, lets go of her adapter at its next poll of the pointers
    wait_until(lambda: any("serving the base model to alice" in line for line in w.logged), 5, "alice's lineage dropped")
    # her key went with her account: refused within the server's second of key freshness
    wait_until(lambda: chat(w, "alice", [user("hello")]).status_code == 401, 5, "alice's key refused")
    assert "alice" not in {user.id for user in w.store.users.list()}


def test_delete_me_data_forgets_the_caller_and_keeps_their_account(world: World) -> None:
    w = world
    _before(w, "carol")
    bob_before = _holdings(w.store, "bob")
    (version,) = w.store.training.versions("carol")
    gone = httpx.delete(f"{w.base}/me/data", headers=bearer(w.keys["carol"]), timeout=60)
    assert gone.status_code == 200, gone.text
    report = gone.json()
    assert report["deleted"] and report["user"] == "carol" and not report["account_removed"] and report["log_emptied"]
    # her three turns and the side turns that asked which version answers her; three samples
    assert report["rows"]["turns"] >= 3 and report["rows"]["samples"] == 3 and report["rows"]["users"] == 0
    assert report["lineage_versions"] == [version.version]
    assert report["directories_removed"] == [str(Path(version.path).parent)]
    assert CANARIES["carol"] not in gone.text
    _after(w, "carol", bob_before)
    # her key still works, at once answered by the base model (the server dropped her adapter), with nothing stored
    assert answered_by(w, "carol") == ("carol", 0)
    mine = httpx.get(f"{w.base}/me/data", headers=bearer(w.keys["carol"]), timeout=30)
    assert mine.status_code == 200 and mine.text == ""
    again = httpx.delete(f"{w.base}/me/data", headers=bearer(w.keys["carol"]), timeout=60)
    # again: only what she said since (the side turn that asked who answers her), no lineage
    assert again.status_code == 200 and again.json()["lineage_versions"] == [] and again.json()["rows"]["samples"] == 0


def test_delete_me_data_is_the_callers_own_only(world: World) -> None:
    w = world
    admin = httpx.delete(f"{w.base}/me/data", headers=bearer(ADMIN_KEY), timeout=30)
    assert admin.status_code == 400 and "clawrl users forget" in admin.json()["error"]["message"], admin.text
    assert admin.json()["error"]["type"] == "invalid_request_error"
    for key in (None, "sk-clawrl-not-a-key"):
        refused = httpx.delete(f"{w.base}/me/data", headers=bearer(key), timeout=30)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert w.store.turns.list_sessions(user_id="bob") != []
