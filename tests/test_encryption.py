"""Encryption at rest (issue 33, item 5 and the encryption canary of item 6; DESIGN §12): with a data
key, a canary a user said is found nowhere in the run directory (database, write-ahead log,
policy files, TensorBoard, logs) nor in a `pg_dump`, while their records still read back in clear
through the store, the CLI and their own key; `clawrl data rotate-key` moves every row to a new
key, after which the old key is refused; no key or a wrong one is a one-line error.

The byte searches are `grep -r` in another process (see tests/test_forget.py).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import sqlalchemy
import torch
from transformers import AutoTokenizer

from clawrl.config import EngineConfig, JudgeConfig, TrainConfig
from clawrl.store import Store
from clawrl.store.encryption import DataKeyError, KeyRing, new_key
from clawrl.store.rotation import rotate
from clawrl.train.trainer import Trainer
from clawrl.types import Sample
from tests.helpers import CORRECTION, Conversation, PostgresServer, start_server, user, wait_for_judgment

CANARY = "tamarillo-canary-4471"


def clawrl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawrl", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})  # fmt: skip


def found_in(root: Path, canary: str = CANARY) -> list[str]:
    """The files under `root` that hold `canary`'s bytes, searched by another process."""
    searched = subprocess.run(["grep", "-rl", "--binary-files=text", canary, str(root)], capture_output=True, text=True)
    assert searched.returncode in (0, 1), searched.stderr
    return sorted(Path(line).name for line in searched.stdout.splitlines())


def dump(postgres_server: PostgresServer, url: str) -> str:
    plain = sqlalchemy.engine.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    dumped = subprocess.run([str(postgres_server.binaries / "pg_dump"), "--data-only", plain], capture_output=True, text=True)
    assert dumped.returncode == 0, dumped.stderr
    return dumped.stdout


def key_file(path: Path) -> Path:
    made = clawrl("data", "new-key", "--out", str(path))
    assert made.returncode == 0, made.stderr
    assert path.stat().st_mode & 0o777 == 0o600
    return path


def ring(path: Path) -> KeyRing:
    return KeyRing.from_text(path.read_text(), str(path))


def say_canary(store: Store, tokenizer: object) -> None:
    """Every kind of record that holds what someone said: turns, next states, a verdict with a hint,
    feedback text, a sample with a hint and teacher ids, an episode's error."""
    talk = Conversation(store, tokenizer)
    talk.turn("t0", "s", f"Write a note about Friday, code {CANARY}.", f"Friday: {CANARY}.")
    talk.turn("t1", "s", f"shorter please ({CANARY})", "Friday.", after="t0", done=True)
    talk.judge("t0", -1, f"say the code {CANARY} once")
    store.turns.add_feedback("t0", -1, f"too long, {CANARY}")
    store.training.add_samples([Sample("t0", "ready", "combined", -1.0, 0, hint=f"hint {CANARY}",
                                       teacher_logprobs=[-0.5], teacher_topk_ids=[[1, 2]], teacher_topk_logprobs=[[-1.0, -2.0]])])


def assert_reads_back(store: Store) -> None:
    (first, second) = store.turns.session_turns("s")
    assert CANARY in first.turn.messages[0]["content"] and CANARY in first.turn.response_text
    assert CANARY in second.turn.messages[0]["content"] and CANARY in first.next_state.messages[0]["content"]
    assert first.feedback[0].text == f"too long, {CANARY}"
    assert store.judging.judgment("t0").hint == f"say the code {CANARY} once"
    sample = store.training.sample("t0")
    assert sample.hint == f"hint {CANARY}" and sample.teacher_topk_ids == [[1, 2]]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_the_canary_is_on_disk_in_clear_only_without_a_key(
    backend: str, encrypted: bool, tiny_model_dir: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    run_dir = tmp_path / "run"
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else f"sqlite:///{run_dir / 'clawrl.db'}"
    keys = ring(key_file(tmp_path / "data.key")) if encrypted else None
    store = Store(url, keys)
    say_canary(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    assert_reads_back(store)
    if backend == "sqlite":
        assert bool(found_in(run_dir)) is not encrypted
    else:  # the turn's token ids too: the dump holds their JSON array only in clear
        dumped = dump(request.getfixturevalue("postgres_server"), url)
        ids = json.dumps(store.turns.turn("t0").response_token_ids)
        assert (CANARY in dumped) is not encrypted and (ids in dumped) is not encrypted
    store.close()
    if encrypted:
        assert CANARY in Store(url, keys).turns.turn("t0").response_text
        with pytest.raises(DataKeyError, match="no key was given"):
            Store(url)
        with pytest.raises(DataKeyError, match="which the key given .* is not"):
            Store(url, KeyRing.from_text(new_key(), "another key"))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_rotation_moves_every_row_to_the_new_key(backend: str, tiny_model_dir: Path, tmp_path: Path,
                                                 request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else f"sqlite:///{tmp_path / 'clawrl.db'}"
    old, new = KeyRing.from_text(new_key(), "old"), KeyRing.from_text(new_key(), "new")
    store = Store(url, old)
    say_canary(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    store.close()
    rotating = Store(url, new.then(old))
    report = rotate(rotating, batch=1)  # one row a transaction: the batches' cursor is tested too
    assert sum(report.rewritten.values()) == 20 and report.left == {} and report.changed_meanwhile == 0
    rotating.close()
    with pytest.raises(DataKeyError, match=f"encrypted with key id {new.current_id}, which the key given"):
        Store(url, old)
    assert_reads_back(Store(url, new))
    if backend == "postgresql":
        assert CANARY not in dump(request.getfixturevalue("postgres_server"), url)


def test_a_loop_that_reads_the_new_key_keeps_working_through_a_rotation(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The order docs/store-and-dashboard.md gives for rotating while serving: the loops first hold new +
    old. A loop still holding the old key alone cannot read a rotated row, and says so."""
    url, tokenizer = f"sqlite:///{tmp_path / 'clawrl.db'}", AutoTokenizer.from_pretrained(tiny_model_dir)
    old, new = KeyRing.from_text(new_key(), "old"), KeyRing.from_text(new_key(), "new")
    say_canary(Store(url, old), tokenizer)
    stale = Store(url, old)  # opened first: once a store is written under the new key, the old one alone is refused
    serving = Store(url, new.then(old))
    with pytest.raises(DataKeyError, match="which the key given"):
        Store(url, old)
    assert rotate(Store(url, new.then(old))).left == {}
    Conversation(serving, tokenizer).turn("t2", "s2", f"after the rotation, {CANARY}", "ok")
    assert_reads_back(serving)
    assert CANARY in serving.turns.turn("t2").messages[0]["content"]
    with pytest.raises(DataKeyError, match=f"encrypted with key id {new.current_id}, which the key given"):
        stale.turns.session_turns("s")


def test_an_empty_answer_is_still_found_for_a_retry_with_a_key(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Blank text stays as it is: the index of empty answers (what a retry that does not echo one is
    matched by) reads it in SQL."""
    store = Store.for_run_dir(tmp_path, KeyRing.from_text(new_key(), "k"))
    Conversation(store, AutoTokenizer.from_pretrained(tiny_model_dir)).turn("t0", "s", f"hi {CANARY}", "")
    assert [turn.id for turn in store.turns.recent_empty_answers(since=0.0)] == ["t0"]


def test_a_ciphertext_moved_to_another_column_is_an_error_not_garbage(tiny_model_dir: Path, tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path, KeyRing.from_text(new_key(), "k"))
    say_canary(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    with store.write() as db:
        db.execute(sqlalchemy.text("UPDATE judgments SET hint = (SELECT text FROM feedback LIMIT 1)"))
    with pytest.raises(DataKeyError, match="judgments.hint .* failed authentication"):
        store.judging.judgment("t0")


def test_a_plain_store_keeps_working_and_reads_text_that_looks_like_ciphertext(tmp_path: Path, tiny_model_dir: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    Conversation(store, AutoTokenizer.from_pretrained(tiny_model_dir)).turn("t0", "s", "hi", "clawrl:enc:abc:AAAA")
    store.turns.add_feedback("t0", 1, "clawrl:txt:mine")
    store.close()
    keyed = Store.for_run_dir(tmp_path, KeyRing.from_text(new_key(), "k"))  # a key on a plain store: its old rows still read
    assert keyed.turns.turn("t0").response_text == "clawrl:enc:abc:AAAA"
    assert keyed.turns.session_turns("s")[0].feedback[0].text == "clawrl:txt:mine"


def test_cli_reads_with_the_key_refuses_without_it_and_rotates(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir, old, new = tmp_path / "run", key_file(tmp_path / "old.key"), key_file(tmp_path / "new.key")
    store = Store.for_run_dir(run_dir, ring(old))
    say_canary(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    store.close()
    where = ("--run-dir", str(run_dir))

    shown = clawrl("sessions", "show", "s", *where, "--json", "--encrypt-key-file", str(old))
    assert shown.returncode == 0 and CANARY in shown.stdout, shown.stderr
    by_variable = clawrl("sessions", "show", "s", *where, "--json", env={"CLAWRL_DATA_KEY": old.read_text().strip()})
    assert by_variable.returncode == 0 and CANARY in by_variable.stdout, by_variable.stderr
    (tmp_path / "bad.key").write_text("not a key\n")
    for extra, env, message in (
        ((), {}, "no key was given: give it with --encrypt-key-file or CLAWRL_DATA_KEY"),
        (("--encrypt-key-file", str(new)), {}, "which the key given"),
        (("--encrypt-key-file", str(tmp_path / "bad.key")), {}, "does not hold a data key"),
        (("--encrypt-key-file", str(tmp_path / "nothing.key")), {}, "cannot read it"),
        (("--encrypt-key-file", str(old)), {"CLAWRL_DATA_KEY": new_key()}, "not both"),
    ):
        refused = clawrl("sessions", "show", "s", *where, *extra, env=env)
        assert refused.returncode == 1 and message in refused.stderr, (extra, refused.stderr)
        assert "Traceback" not in refused.stderr and CANARY not in refused.stdout + refused.stderr
    exists = clawrl("data", "new-key", "--out", str(old))
    assert exists.returncode == 1 and "never overwritten" in exists.stderr

    rotated = clawrl("data", "rotate-key", "--new-key-file", str(new), "--encrypt-key-file", str(old), *where, "--json")
    assert rotated.returncode == 0, rotated.stderr
    report = json.loads(rotated.stdout)
    # 2 turns x 6 encrypted values (tools and tool calls are null), 1 next state, 1 feedback, a hint and its
    # candidates, a sample's hint and three teacher arrays
    assert report["rewritten"] == {"turns": 12, "next_states": 1, "feedback": 1, "judgments": 2, "samples": 4}
    assert report["left"] == {} and report["changed_meanwhile"] == 0 and report["log_emptied"]
    assert found_in(run_dir) == []
    refused = clawrl("sessions", "show", "s", *where, "--encrypt-key-file", str(old))
    assert refused.returncode == 1 and "which the key given" in refused.stderr and "Traceback" not in refused.stderr
    assert_reads_back(Store.for_run_dir(run_dir, ring(new)))
    again = clawrl("data", "rotate-key", "--new-key-file", str(new), "--encrypt-key-file", str(new), *where, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["rewritten"] == {}, again.stderr


def test_rotate_key_encrypts_a_store_kept_in_clear(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir, key = tmp_path / "run", key_file(tmp_path / "data.key")
    store = Store.for_run_dir(run_dir)
    say_canary(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    store.close()
    assert found_in(run_dir)
    rotated = clawrl("data", "rotate-key", "--new-key-file", str(key), "--run-dir", str(run_dir))
    assert rotated.returncode == 0 and "re-encrypted 20 value(s)" in rotated.stdout, rotated.stdout + rotated.stderr
    assert found_in(run_dir) == []
    assert_reads_back(Store.for_run_dir(run_dir, ring(key)))
    refused = clawrl("sessions", "list", "--run-dir", str(run_dir))
    assert refused.returncode == 1 and "no key was given" in refused.stderr


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_a_canary_said_through_a_real_server_is_on_disk_only_without_a_key(encrypted: bool, tiny_model_dir: Path,
                                                                            tmp_path: Path) -> None:
    """A user talks to a real server (rule judge inside) and a real trainer steps on her turns with
    TensorBoard on. Without a key her canary is in the store's files; with one, nothing under the
    run directory holds it; never the logs, the policy files nor TensorBoard's. Her own key and
    `clawrl sessions show` read it back in clear."""
    torch.set_num_threads(1)
    run_dir, key = tmp_path / "run", key_file(tmp_path / "data.key")
    keys = (lambda: ring(key)) if encrypted else (lambda: None)
    store = Store.for_run_dir(run_dir, keys())
    _, alice = store.users.add("alice")
    collect, root = _Collect(), logging.getLogger()
    level, root.level = root.level, logging.INFO
    root.addHandler(collect)
    engine = EngineConfig(model=str(tiny_model_dir), device="cpu", cpu_threads=1)
    train = TrainConfig(method="combine", batch_size=2, lr=1e-2, report_to=["tensorboard"], train_poll_s=0.05)
    headers = {"Authorization": f"Bearer {alice}", "X-Session-Id": "notes"}
    try:
        with start_server(tiny_model_dir, run_dir, judge=JudgeConfig(judge="rule", judge_poll_s=0.05), keys=keys(),
                          served_model_name="m", api_key="sk-admin-enc") as server:  # fmt: skip
            messages, turn_ids = [], []
            for line in [f"Write a note about Friday, code {CANARY}.", f"{CORRECTION} ({CANARY})", "thanks, perfect"]:
                messages.append(user(line))
                answered = httpx.post(f"{server.base_url}/chat/completions", headers=headers, timeout=60,
                                      json={"model": "m", "messages": messages, "max_tokens": 6})  # fmt: skip
                assert answered.status_code == 200, answered.text
                messages.append({"role": "assistant", "content": answered.json()["choices"][0]["message"].get("content") or ""})
                turn_ids.append(answered.headers["x-clawrl-turn"])
            rated = httpx.post(f"{server.base_url}/feedback", headers=headers, timeout=30,
                               json={"turn": turn_ids[-1], "score": 1, "text": f"great, {CANARY}"})  # fmt: skip
            assert rated.status_code == 200, rated.text
            for turn_id in turn_ids:
                wait_for_judgment(store, turn_id)
            trainer = Trainer(train, engine, Store.for_run_dir(run_dir, keys()), run_dir)
            trainer.start()
            assert trainer.run(max_steps=1) == 1
            trainer.close()
            assert (run_dir / "policy").is_dir() and list(run_dir.rglob("events.out.tfevents*"))
            assert found_in(run_dir / "policy") == [] and found_in(run_dir / "tensorboard") == []
            if encrypted:
                assert found_in(run_dir) == []
            else:
                assert {"clawrl.db", "clawrl.db-wal"} & set(found_in(run_dir))
            mine = httpx.get(f"{server.base_url}/me/data", headers=headers, timeout=30)
            assert mine.status_code == 200 and CANARY in mine.text
        (session,) = store.turns.list_sessions(user_id="alice")
        keyed = ("--encrypt-key-file", str(key)) if encrypted else ()
        shown = clawrl("sessions", "show", session.id, "--run-dir", str(run_dir), *keyed)
        assert shown.returncode == 0 and CANARY in shown.stdout, shown.stderr
        assert bool(found_in(run_dir)) is not encrypted
        assert not [line for line in collect.lines if CANARY in line]
    finally:
        root.removeHandler(collect)
        root.level = level
