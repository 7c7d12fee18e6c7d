"""The inspection commands and configuration, run as a user runs them."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import datasets
import httpx
import pytest
from pydantic import SecretStr
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.cli import build_parser, config_from_args
from clawrl.config import EngineConfig, ServeConfig, ServeSettings, StoreConfig
from clawrl.serve.runner import ServerThread


def clawrl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawrl.cli", *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture
def recorded_run(server: ServerThread, run_dir: Path) -> tuple[Path, str]:
    """A run dir holding one two-turn session (the second turn gives the first its next state)."""
    model = httpx.get(server.base_url + "/models").json()["data"][0]["id"]
    messages = [{"role": "user", "content": "hello"}]
    first = httpx.post(server.base_url + "/chat/completions", json={"model": model, "messages": messages, "max_tokens": 6}, timeout=60)
    messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "go on"}]
    httpx.post(server.base_url + "/chat/completions", json={"model": model, "messages": messages, "max_tokens": 6}, timeout=60)
    return run_dir, first.headers["x-clawrl-session"]


def test_sessions_list_show_and_export(recorded_run: tuple[Path, str], tmp_path: Path) -> None:
    run_dir, session_id = recorded_run
    listing = clawrl("sessions", "list", "--run-dir", str(run_dir), "--json")
    assert listing.returncode == 0, listing.stderr
    assert [s["id"] for s in json.loads(listing.stdout)] == [session_id]

    shown = clawrl("sessions", "show", session_id, "--run-dir", str(run_dir), "--json")
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert detail["id"] == session_id
    first, second = detail["turns"]
    for turn in detail["turns"]:
        assert {"index", "kind", "response_text", "prompt_token_ids", "response_token_ids", "response_logprobs", "policy_version", "next_state"} <= set(turn)
        assert len(turn["response_token_ids"]) == len(turn["response_logprobs"]) > 0
    assert first["next_state"]["role"] == "user" and first["next_state"]["content"] == "go on"
    assert second["next_state"] is None

    human = clawrl("sessions", "show", session_id, "--run-dir", str(run_dir))
    assert human.returncode == 0 and "next state (user): 'go on'" in human.stdout

    out = tmp_path / "turns.jsonl"
    exported = clawrl("export", "--run-dir", str(run_dir), "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    rows = datasets.load_dataset("json", data_files=str(out), split="train")
    assert rows.num_rows == 2
    assert rows[0]["response_token_ids"] == first["response_token_ids"]
    assert rows[0]["next_state"][0]["content"] == "go on"


def test_missing_run_dir_is_a_clear_error(tmp_path: Path) -> None:
    result = clawrl("sessions", "list", "--run-dir", str(tmp_path / "nowhere"))
    assert result.returncode != 0 and "no store at" in result.stderr


def test_unknown_session_is_a_clear_error(recorded_run: tuple[Path, str]) -> None:
    result = clawrl("sessions", "show", "no-such-session", "--run-dir", str(recorded_run[0]))
    assert result.returncode == 1 and "no session" in result.stderr


def test_flags_override_environment_which_overrides_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAWRL_MAX_BATCH_SIZE", "5")
    monkeypatch.setenv("PORT", "31000")  # upstream's name for the port
    monkeypatch.setenv("SERVED_MODEL_NAME", "from-env")
    monkeypatch.setenv("SGLANG_API_KEY", "upstream-key")
    args = build_parser().parse_args(["serve", "--served-model-name", "from-flag", "--run-dir", "somewhere"])
    engine, serve, store = (config_from_args(c, args) for c in (EngineConfig, ServeConfig, StoreConfig))
    assert engine.max_batch_size == 5
    assert serve.port == 31000 and serve.api_key == "upstream-key"
    assert serve.served_model_name == "from-flag"
    assert store.run_dir == Path("somewhere")
    assert ServeConfig().host == "127.0.0.1"


def test_every_config_field_has_a_flag_and_a_description(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--help"])
    assert exited.value.code == 0
    serve_help = capsys.readouterr().out
    for config in ServeSettings.components().values():
        for name, field in config.model_fields.items():
            assert field.description, f"{config.__name__}.{name} has no description"
            secret = SecretStr in (field.annotation, *typing.get_args(field.annotation))
            # a secret (CLAWRL_DATA_KEY) is a variable only: a flag would show it in `ps`
            assert ("--" + name.replace("_", "-") in serve_help) is not secret, name


def test_every_command_prints_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    """`clawrl <command> --help` works for every command and subcommand (a literal % in a description once
    made `bench learn --help` a traceback)."""

    def commands(parser: argparse.ArgumentParser, path: list[str]) -> Iterator[list[str]]:
        yield path
        for action in parser._actions:  # noqa: SLF001 - argparse keeps its subcommands here only
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                for name, subparser in action.choices.items():
                    yield from commands(subparser, [*path, name])

    paths = list(commands(build_parser(), []))
    assert ["bench", "learn"] in paths and ["serve"] in paths
    for path in paths:
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args([*path, "--help"])
        assert exited.value.code == 0, path
        assert "usage:" in capsys.readouterr().out, path


def test_build_tiny_command(tmp_path: Path) -> None:
    result = clawrl("model", "build-tiny", "--out", str(tmp_path / "tiny"), "--seed", "1", env=os.environ.copy())
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "tiny" / "config.json").exists()
    assert AutoTokenizer.from_pretrained(tmp_path / "tiny").chat_template
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "tiny").config.max_position_embeddings >= 16384


def test_feedback_command_records_for_a_turn_or_a_session(recorded_run: tuple[Path, str]) -> None:
    run_dir, session_id = recorded_run
    by_session = clawrl("feedback", "--run-dir", str(run_dir), "--session", session_id, "--score", "-1", "--text", "use fewer words")
    assert by_session.returncode == 0, by_session.stderr
    listing = json.loads(clawrl("sessions", "show", session_id, "--run-dir", str(run_dir), "--json").stdout)
    first, last = listing["turns"]
    assert [(f["score"], f["text"]) for f in last["feedback"]] == [(-1, "use fewer words")]
    by_turn = clawrl("feedback", "--run-dir", str(run_dir), "--turn", first["id"], "--score", "1")
    assert by_turn.returncode == 0, by_turn.stderr
    assert clawrl("feedback", "--run-dir", str(run_dir), "--turn", "chatcmpl-nope", "--score", "1").returncode == 1
    assert clawrl("feedback", "--run-dir", str(run_dir), "--turn", first["id"], "--score", "3").returncode == 2
