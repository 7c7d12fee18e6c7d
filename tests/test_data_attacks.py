"""Attacks on the user-data boundary of issue 33 (encryption at rest, rotation, forget, opt-out,
export), each written as the behaviour that defends against it: a canary a user said is found on
disk only where the docs say it may be, a tampered or malformed value or key is one clear error
(never a traceback, never garbage, never lost rows), and a rotation never reports success while
values stay in clear. Real SQLite files, a real PostgreSQL server, a real server on a real port and
the real CLI. What these tests do not cover on purpose (documented limits) is listed in
docs/store-and-dashboard.md ("What stays in clear", "What a key does not protect").
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy
from transformers import AutoTokenizer

from clawrl.cli.entry import main as clawrl_main
from clawrl.config import JudgeConfig
from clawrl.store import Store
from clawrl.store import rotation as rotation_module
from clawrl.store.encryption import ENCRYPTED, DataKeyError, KeyRing, new_key
from clawrl.store.rotation import rotate
from clawrl.model.chat import render_prompt
from tests.helpers import Conversation, PostgresServer, record, start_server, user

CANARY = "quince-canary-9031"
ADMIN_KEY = "sk-admin-attacks"


def clawrl(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real CLI in a new process."""
    return subprocess.run([sys.executable, "-m", "clawrl", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})  # fmt: skip


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The real CLI's entry point in this process (cheaper than a new one): its status, stdout, stderr."""
    status = clawrl_main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def found_in(root: Path, canary: str = CANARY) -> list[str]:
    """The files under `root` holding `canary`'s bytes, searched by another process (tests/test_forget.py says why)."""
    searched = subprocess.run(["grep", "-rl", "--binary-files=text", canary, str(root)], capture_output=True, text=True)
    assert searched.returncode in (0, 1), searched.stderr
    return sorted(Path(line).name for line in searched.stdout.splitlines())


def one_line_error(result: tuple[int, str, str] | subprocess.CompletedProcess[str], *needles: str) -> None:
    if isinstance(result, subprocess.CompletedProcess):
        result = (result.returncode, result.stdout, result.stderr)
    status, out, err = result
    assert status == 1, (status, out, err)
    assert "Traceback" not in err and err.startswith("error:"), err
    assert len(err.strip().splitlines()) <= 2, err  # the line, and at most one line of what to do
    for needle in needles:
        assert needle in err, (needle, err)


def write_key(path: Path, key: str | None = None) -> Path:
    path.write_text((key or new_key()) + "\n")
    path.chmod(0o600)
    return path


def talk(store: Store, tokenizer: Any, session: str = "s", user_id: str = "default", prefix: str = "t") -> None:
    said = Conversation(store, tokenizer)
    said.turn(f"{prefix}0", session, f"my code is {CANARY}", f"noted: {CANARY}", user_id=user_id)
    store.turns.add_feedback(f"{prefix}0", -1, f"wrong, {CANARY}")


# --------------------------------------------------------------------------- tampered ciphertext


@pytest.mark.parametrize("body", ["!!!not base64!!!", "AAAA", "", "QUJD"], ids=["not-base64", "too-short", "empty", "3-bytes"])
def test_a_malformed_ciphertext_is_a_data_key_error_not_a_traceback(body: str, tiny_model_dir: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Someone with write access to the database replaces a value with a broken token: reading it must
    say so (DataKeyError, one line in the CLI), as an altered value that fails authentication does."""
    key = write_key(tmp_path / "k.key")
    store = Store.for_run_dir(tmp_path / "run", KeyRing.from_text(key.read_text(), "k"))
    talk(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    current = KeyRing.from_text(key.read_text(), "k").current_id
    with store.write() as db:
        db.execute(sqlalchemy.text("UPDATE feedback SET text = :token"), {"token": f"{ENCRYPTED}{current}:{body}"})
    with pytest.raises(DataKeyError, match="feedback.text"):
        store.turns.session_turns("s")
    store.close()
    shown = in_process(capsys, "sessions", "show", "s", "--run-dir", str(tmp_path / "run"), "--encrypt-key-file", str(key))
    one_line_error(shown, "feedback.text")


# --------------------------------------------------------------------------- rotation


def test_rotation_does_not_report_success_while_a_keyless_loop_writes_in_clear(tiny_model_dir: Path, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A store kept in clear is encrypted by `rotate-key` while a loop started without a key still
    writes (it opened the store before the rotation, so it was never refused). What it wrote in
    clear after the pass must be counted and warned about, as rows under an old key are, and a
    second rotation (the loop stopped) encrypts it."""
    run_dir, tokenizer = tmp_path / "run", AutoTokenizer.from_pretrained(tiny_model_dir)
    keyless = Store.for_run_dir(run_dir)
    talk(keyless, tokenizer)
    new = KeyRing.from_text(new_key(), "new")
    rotate_table = rotation_module._rotate_table

    def meanwhile(database: Any, ring: KeyRing, table: Any, *args: Any) -> None:
        rotate_table(database, ring, table, *args)
        if table.name == "turns":  # the pass over turns is done: the keyless loop answers once more
            Conversation(keyless, tokenizer).turn("t1", "s", f"again {CANARY}", f"still {CANARY}", after="t0")

    monkeypatch.setattr(rotation_module, "_rotate_table", meanwhile)
    report = rotate(Store.for_run_dir(run_dir, new))
    assert report.left_in_clear >= 3, report  # t1's messages and answer, t0's next state at least
    monkeypatch.undo()
    assert set(found_in(run_dir)) & {"clawrl.db", "clawrl.db-wal"}
    keyless.close()
    again = rotate(Store.for_run_dir(run_dir, new))
    assert again.left_in_clear == 0 and again.left == {} and sum(again.rewritten.values()) >= 3
    assert found_in(run_dir) == []
    assert CANARY in Store.for_run_dir(run_dir, new).turns.turn("t1").response_text


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_the_cli_rotation_warns_and_fails_on_values_left_in_clear(as_json: bool, tiny_model_dir: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`--json` too: it exited 0 whatever was left, so a script took a half rotation for done."""
    run_dir, key = tmp_path / "run", write_key(tmp_path / "new.key")
    keyless = Store.for_run_dir(run_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    talk(keyless, tokenizer)
    rotate_table = rotation_module._rotate_table

    def meanwhile(database: Any, ring: KeyRing, table: Any, *args: Any) -> None:
        rotate_table(database, ring, table, *args)
        if table.name == "turns":
            Conversation(keyless, tokenizer).turn("t1", "s2", f"again {CANARY}", "ok")

    monkeypatch.setattr(rotation_module, "_rotate_table", meanwhile)
    json_flag = ("--json",) if as_json else ()
    status, out, err = in_process(capsys, "data", "rotate-key", "--new-key-file", str(key), "--run-dir", str(run_dir), *json_flag)
    assert status == 1 and "still in clear" in err, (out, err)
    if as_json:
        assert json.loads(out)["left_in_clear"] >= 2


def test_rotate_key_says_when_the_old_ciphertexts_stay_in_the_log(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader in another process holding the write-ahead log keeps the values under the old key in
    it (what a leaked old key opens): the rotation says so, as a forget does."""
    run_dir, key = tmp_path / "run", write_key(tmp_path / "new.key")
    Store.for_run_dir(run_dir).close()
    monkeypatch.setattr("clawrl.store.database.Database.scrub", lambda self: False)
    status, _, err = in_process(capsys, "data", "rotate-key", "--new-key-file", str(key), "--run-dir", str(run_dir))
    assert status == 0 and "write-ahead log" in err, err


def test_a_row_forgotten_during_a_rotation_is_skipped(tiny_model_dir: Path, postgres_url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """On PostgreSQL a forget commits while a rotation's batch is between its read and its rewrite:
    the rotation goes on (no NoResultFound traceback, no half-rotated store left behind)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    old, new = KeyRing.from_text(new_key(), "old"), KeyRing.from_text(new_key(), "new")
    store = Store(postgres_url, old)
    talk(store, tokenizer, session="alice/s", user_id="alice", prefix="a")
    talk(store, tokenizer, session="bob/s", user_id="bob", prefix="b")
    rewrite = rotation_module._rewrite

    def forget_first(db: Any, table: Any, key: Any, row: Any, *args: Any) -> None:
        if row[0] == "a0":
            store.users.forget("alice", remove_account=False)
        rewrite(db, table, key, row, *args)

    monkeypatch.setattr(rotation_module, "_rewrite", forget_first)
    report = rotate(Store(postgres_url, new.then(old)))
    assert report.left == {} and report.left_in_clear == 0
    assert Store(postgres_url, new).turns.turn("b0").response_text == f"noted: {CANARY}"
    assert Store(postgres_url, new).turns.turn("a0") is None


@pytest.mark.parametrize("batch", ["0", "-1"])
def test_rotate_key_refuses_a_batch_that_is_not_positive(batch: str, tiny_model_dir: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`--batch 0` selected no row and reported success with every value left as it was (and -1 is
    no limit at all on SQLite): refused before the store is touched."""
    run_dir, key = tmp_path / "run", write_key(tmp_path / "new.key")
    talk(Store.for_run_dir(run_dir), AutoTokenizer.from_pretrained(tiny_model_dir))
    refused = in_process(capsys, "data", "rotate-key", "--new-key-file", str(key), "--run-dir", str(run_dir), "--batch", batch)
    one_line_error(refused, "--batch")
    assert "clawrl.db" in found_in(run_dir) or "clawrl.db-wal" in found_in(run_dir)
    assert Store.for_run_dir(run_dir).turns.turn("t0") is not None  # still readable without a key: untouched


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_rotating_with_the_wrong_old_key_changes_nothing(backend: str, tiny_model_dir: Path, tmp_path: Path,
                                                         request: pytest.FixtureRequest,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else f"sqlite:///{run_dir / 'clawrl.db'}"
    old, wrong, new = write_key(tmp_path / "old.key"), write_key(tmp_path / "wrong.key"), write_key(tmp_path / "new.key")
    store = Store(url, KeyRing.from_text(old.read_text(), "old"))
    talk(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    store.close()
    where = ("--database-url", url) if backend == "postgresql" else ("--run-dir", str(run_dir))
    for given in (("--encrypt-key-file", str(wrong)), ()):
        one_line_error(in_process(capsys, "data", "rotate-key", "--new-key-file", str(new), *where, *given), "key id")
    assert CANARY in Store(url, KeyRing.from_text(old.read_text(), "old")).turns.turn("t0").response_text
    with pytest.raises(DataKeyError):  # nothing was rotated, and the new key was not recorded as the store's
        Store(url, KeyRing.from_text(new.read_text(), "new"))
    if backend == "postgresql":
        dumped = dump(request.getfixturevalue("postgres_server"), url)
        assert CANARY not in dumped


def dump(postgres_server: PostgresServer, url: str) -> str:
    plain = sqlalchemy.engine.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    dumped = subprocess.run([str(postgres_server.binaries / "pg_dump"), "--data-only", plain], capture_output=True, text=True)
    assert dumped.returncode == 0, dumped.stderr
    return dumped.stdout


# --------------------------------------------------------------------------- key files


def test_key_files_that_hold_no_key_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty file, a directory, binary junk, a key of the wrong length, a huge file and an endless
    one (/dev/zero, or a link to it): each is one `error:` line, at once, and the store is untouched."""
    run_dir = tmp_path / "run"
    Store.for_run_dir(run_dir).close()
    (tmp_path / "empty.key").write_text("")
    (tmp_path / "comments.key").write_text("# only a comment\n\n")
    (tmp_path / "dir.key").mkdir()
    (tmp_path / "binary.key").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "short.key").write_text("abcd\n")
    (tmp_path / "huge.key").write_text(("A" * 1023 + "\n") * 4096)  # 4 MiB
    (tmp_path / "zero.key").symlink_to("/dev/zero")
    cases = {"empty.key": "holds no key", "comments.key": "holds no key", "dir.key": "cannot read it",
             "binary.key": "cannot read it", "short.key": "does not hold a data key", "huge.key": "too large",
             "zero.key": "too large", "missing.key": "cannot read it"}  # fmt: skip
    for name, message in cases.items():
        for flag in ("--encrypt-key-file", "--new-key-file"):
            command = ["sessions", "list"] if flag == "--encrypt-key-file" else ["data", "rotate-key"]
            started = time.monotonic()
            one_line_error(in_process(capsys, *command, flag, str(tmp_path / name), "--run-dir", str(run_dir)), message)
            assert time.monotonic() - started < 5, name
    assert clawrl("sessions", "list", "--run-dir", str(run_dir), "--json").returncode == 0  # never encrypted


def test_an_empty_key_variable_is_refused_not_taken_for_no_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment whose secret did not arrive sets CLAWRL_DATA_KEY to nothing: that must fail
    closed (an error), never open the store keyless and write in clear."""
    run_dir = tmp_path / "run"
    Store.for_run_dir(run_dir).close()
    monkeypatch.setenv("CLAWRL_DATA_KEY", "")
    one_line_error(in_process(capsys, "sessions", "list", "--run-dir", str(run_dir)), "CLAWRL_DATA_KEY holds no key")


def test_a_key_file_others_can_read_is_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, key = tmp_path / "run", write_key(tmp_path / "k.key")
    Store.for_run_dir(run_dir).close()
    status, _, err = in_process(capsys, "sessions", "list", "--run-dir", str(run_dir), "--encrypt-key-file", str(key))
    assert status == 0 and "warning" not in err, err
    key.chmod(0o644)
    status, _, err = in_process(capsys, "sessions", "list", "--run-dir", str(run_dir), "--encrypt-key-file", str(key))
    assert status == 0 and "by others" in err and "0644" in err and "chmod 600" in err, err
    assert key.read_text().strip() not in err


def test_the_key_is_never_on_a_command_line_nor_in_a_message(tmp_path: Path) -> None:
    """The variable's key is refused as a flag (so `ps` never shows it), and neither a wrong key's
    refusal nor a malformed one's quotes it."""
    run_dir, secret = tmp_path / "run", new_key()
    Store.for_run_dir(run_dir, KeyRing.from_text(new_key(), "other")).close()
    refused = clawrl("sessions", "list", "--run-dir", str(run_dir), env={"CLAWRL_DATA_KEY": secret})
    one_line_error(refused, "which the key given")
    assert secret not in refused.stderr + refused.stdout
    malformed = secret[:-4] + "!!!!"
    refused = clawrl("sessions", "list", "--run-dir", str(run_dir), env={"CLAWRL_DATA_KEY": malformed})
    one_line_error(refused, "does not hold a data key")
    assert malformed not in refused.stderr
    assert "--data-key" not in clawrl("sessions", "list", "--help").stdout


# --------------------------------------------------------------------------- a real server, encrypted


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record) + (record.exc_text or ""))


def test_an_encrypted_server_keeps_the_canary_off_disk_out_of_logs_and_endpoints(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A user's schema (a JSON output's `response_format`, a forced tool's parameters) is what they
    said too: the grammar compiled from it must not sit in clear in `turns.sampling`. Requests that
    fail (a bad schema, an unknown tool, a bad opt-out) carry the canary and are logged at INFO and
    above without it. A `store: false` request on the Responses API leaves nothing. The key is in
    no endpoint's answer. `DELETE /v1/me/data` with bob's key leaves alice's records whole."""
    run_dir, key_text = tmp_path / "run", new_key()
    keys = KeyRing.from_text(key_text, "k")
    store = Store.for_run_dir(run_dir, keys)
    _, alice = store.users.add("alice")
    _, bob = store.users.add("bob")
    collect, root = _Collect(), logging.getLogger()
    level, root.level = root.level, logging.INFO
    root.addHandler(collect)
    try:
        with start_server(tiny_model_dir, run_dir, judge=JudgeConfig(judge="rule", judge_poll_s=0.05), keys=keys,
                          served_model_name="m", api_key=ADMIN_KEY) as server:  # fmt: skip
            def post(who: str, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
                return httpx.post(f"{server.base_url}{path}", json=body, timeout=60,
                                  headers={"Authorization": f"Bearer {who}", **headers})  # fmt: skip

            schema = {"type": "object", "properties": {"code": {"type": "string", "enum": [CANARY]}}, "required": ["code"]}
            structured = post(alice, "/chat/completions", {
                "model": "m", "max_tokens": 12, "messages": [user("the code?")],
                "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}})  # fmt: skip
            assert structured.status_code == 200, structured.text
            tool = {"type": "function", "function": {"name": "lookup", "parameters": {
                "type": "object", "properties": {"q": {"type": "string", "enum": [CANARY]}}, "required": ["q"]}}}  # fmt: skip
            forced = post(alice, "/chat/completions", {"model": "m", "max_tokens": 16, "messages": [user("look it up")],
                                                       "tools": [tool], "tool_choice": "required"})  # fmt: skip
            assert forced.status_code == 200, forced.text
            turn = store.turns.turn(structured.headers["x-clawrl-turn"])
            assert turn is not None and turn.sampling.grammar and CANARY in turn.sampling.grammar  # read back in clear
            failing = [
                post(alice, "/chat/completions", {"model": "m", "messages": [user("x")], "tools": [tool],
                                                  "tool_choice": {"type": "function", "function": {"name": CANARY}}}),
                post(alice, "/chat/completions", {"model": "m", "messages": [user(CANARY)], "train": CANARY}),
                post(alice, "/chat/completions", {"model": "m", "messages": [{"role": CANARY, "content": CANARY}]}),
                post(alice, "/chat/completions", {"model": "m", "messages": [user(CANARY)]}, **{"X-Clawrl-Train": CANARY}),
            ]  # fmt: skip
            assert all(400 <= answered.status_code < 500 for answered in failing), [a.text for a in failing]
            hidden = post(alice, "/responses", {"model": "m", "input": f"forget this {CANARY}-responses",
                                                "max_output_tokens": 8, "store": False})  # fmt: skip
            assert hidden.status_code == 200 and store.turns.turn(hidden.json()["id"]) is None
            assert found_in(run_dir, f"{CANARY}-responses") == []
            for path in ("/healthz", "/readyz", "/metrics", "/dashboard/api/overview"):
                shown = httpx.get(f"{server.base_url.removesuffix('/v1')}{path}", timeout=30,
                                  headers={"Authorization": f"Bearer {ADMIN_KEY}"})  # fmt: skip
                assert key_text not in shown.text and CANARY not in shown.text, path
            removed = httpx.delete(f"{server.base_url}/me/data", headers={"Authorization": f"Bearer {bob}"}, timeout=60)
            assert removed.status_code in (200, 404), removed.text
            assert store.turns.turn(structured.headers["x-clawrl-turn"]) is not None  # alice's, untouched by bob's forget
            assert found_in(run_dir) == [], "the canary is on disk in clear with a data key"
        assert not [line for line in collect.lines if CANARY in line or key_text in line]
    finally:
        root.removeHandler(collect)
        root.level = level


# --------------------------------------------------------------------------- opt-out


def test_a_train_false_request_never_judges_the_turn_before_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The words of a request that opted out of training must not become the next state that scores
    (and, through the judge's hint, teaches) the session's turn before it."""
    store = Store.for_run_dir(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    Conversation(store, tokenizer).turn("t0", "s", "write a note", "Note.")
    messages = [user(f"no, that is wrong: {CANARY}")]
    record(store, "t1", "s", messages, "Sorry.", continues_turn_id="t0", next_state=messages, id_source="header",
           opt_out="request", prompt_token_ids=render_prompt(tokenizer, messages, None))  # fmt: skip
    assert store.turns.turn("t1").opt_out == "request"
    assert store.judging.judge_backlog()[0] == 0
    assert "t0" not in store.turns.next_states(["t0"])


# --------------------------------------------------------------------------- old ciphertexts on disk


def raw_values(url: str, where: str) -> list[str]:
    """The encrypted values of the turns, next states and feedback `where` selects, as the database
    holds them (a 48-character stretch of each ciphertext's base64: enough to be unique)."""
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(sqlalchemy.text(
            f"SELECT CAST(messages AS TEXT) FROM turns WHERE {where} UNION ALL "
            f"SELECT CAST(response_text AS TEXT) FROM turns WHERE {where} UNION ALL "
            f"SELECT text FROM feedback WHERE turn_id IN (SELECT id FROM turns WHERE {where})")).scalars().all()  # fmt: skip
    engine.dispose()
    tokens = [value.strip('"') for value in rows if value and ENCRYPTED in value]
    assert tokens, where
    return [token.rsplit(":", 1)[1][20:68] for token in tokens]


def test_a_forget_on_an_encrypted_store_leaves_none_of_her_ciphertexts(tiny_model_dir: Path, tmp_path: Path) -> None:
    """With a key the canary is never on disk in clear, so a byte search for it proves nothing: what
    a forget must remove is her ciphertexts (a key that leaks later opens them), from the database,
    its free pages and its write-ahead log. Bob's stay, and read."""
    run_dir, key = tmp_path / "run", write_key(tmp_path / "k.key")
    ring = KeyRing.from_text(key.read_text(), "k")
    store = Store.for_run_dir(run_dir, ring)
    store.users.add("alice")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    talk(store, tokenizer, session="alice/s", user_id="alice", prefix="a")
    talk(store, tokenizer, session="bob/s", user_id="bob", prefix="b")
    store.close()
    url = f"sqlite:///{run_dir / 'clawrl.db'}"
    hers, his = raw_values(url, "id LIKE 'a%'"), raw_values(url, "id LIKE 'b%'")
    assert all(found_in(run_dir, token) for token in hers)
    forgot = clawrl("users", "forget", "alice", "--yes", "--run-dir", str(run_dir), "--encrypt-key-file", str(key))
    assert forgot.returncode == 0, forgot.stderr
    assert [token for token in hers if found_in(run_dir, token)] == []
    assert all(found_in(run_dir, token) for token in his)
    assert CANARY in Store.for_run_dir(run_dir, ring).turns.turn("b0").response_text


def test_a_rotation_leaves_no_ciphertext_of_the_old_key_on_disk(tiny_model_dir: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """After `rotate-key` only the new key's values are in the files: the old ones (what a leaked old
    key opens) are gone from the database's pages and its write-ahead log."""
    run_dir, old, new = tmp_path / "run", write_key(tmp_path / "old.key"), write_key(tmp_path / "new.key")
    store = Store.for_run_dir(run_dir, KeyRing.from_text(old.read_text(), "old"))
    talk(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    store.close()
    before = raw_values(f"sqlite:///{run_dir / 'clawrl.db'}", "1 = 1")
    assert all(found_in(run_dir, token) for token in before)
    status, _, err = in_process(capsys, "data", "rotate-key", "--new-key-file", str(new), "--encrypt-key-file", str(old),
                                "--run-dir", str(run_dir))  # fmt: skip
    assert status == 0, err
    assert [token for token in before if found_in(run_dir, token)] == []
    assert CANARY in Store.for_run_dir(run_dir, KeyRing.from_text(new.read_text(), "new")).turns.turn("t0").response_text


# --------------------------------------------------------------------------- export


def test_an_export_is_its_owners_alone(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An export holds the conversations in clear, encrypted store or not: the file it creates is
    0600 like the store's (whatever the umask lets others read), and a user's holds only theirs."""
    run_dir, key = tmp_path / "run", write_key(tmp_path / "k.key")
    store = Store.for_run_dir(run_dir, KeyRing.from_text(key.read_text(), "k"))
    store.users.add("alice")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    talk(store, tokenizer, session="alice/s", user_id="alice", prefix="a")
    Conversation(store, tokenizer).turn("b0", "bob/s", "bob-only-words", "ok", user_id="bob")
    store.close()
    previous = os.umask(0o022)
    try:
        exports = ((["users", "export", "alice"], tmp_path / "alice.jsonl"), (["export"], tmp_path / "all.jsonl"))
        for command, out in exports:
            status, _, err = in_process(capsys, *command, "--out", str(out), "--run-dir", str(run_dir),
                                        "--encrypt-key-file", str(key))  # fmt: skip
            assert status == 0, err
            assert out.stat().st_mode & 0o777 == 0o600, command
    finally:
        os.umask(previous)
    mine = (tmp_path / "alice.jsonl").read_text()
    assert CANARY in mine and "bob-only-words" not in mine


# --------------------------------------------------------------------------- sessions and forget


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_turn_never_joins_a_session_another_user_took_while_it_was_answered(
    backend: str, tiny_model_dir: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Alice's first request names its session "inbox": resolved to "alice/inbox" (free then), and
    while it is answered the admin (the default user, who may name any session) starts "alice/inbox".
    Her turn must not be counted into the admin's session: there her words would be out of her
    export's and her forget's reach. It goes to "alice/~inbox", the name her next "inbox" finds."""
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else f"sqlite:///{tmp_path / 'clawrl.db'}"
    store = Store(url)
    store.users.add("alice")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    Conversation(store, tokenizer).turn("admin0", "alice/inbox", "the admin's own note", "ok")
    Conversation(store, tokenizer).turn("a0", "alice/inbox", f"alice says {CANARY}", "ok", user_id="alice")
    admins = store.turns.session("alice/inbox")
    assert admins.user_id == "default" and admins.num_turns == 1
    hers = store.turns.turn("a0")
    assert hers.session_id == "alice/~inbox" and store.turns.session(hers.session_id).user_id == "alice"
    store.users.forget("alice", remove_account=False)
    assert store.turns.turn("a0") is None and store.turns.turn("admin0") is not None
