"""Startup fails fast and in one line (issue 16): each mistake a user can make when starting a
`clawrl` command, made for real (a socket holding the port, a SQLite file written by a "newer"
clawrl, a hub that cannot be reached, ...) against the real command in a new process.

Each must end with a non-zero exit, at most two lines on stderr that name the problem and what to
do, no traceback, and before any model is loaded (the tiny model's cache stays empty).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from clawrl.preflight import StartupError, check_model, check_port, check_store, describe_failure
from clawrl.store import Store
from clawrl.store.migrations import SCHEMA_VERSION, SchemaTooNewError


def closed_port() -> int:
    """A loopback port nothing listens on (connections to it are refused at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def taken_port() -> Iterator[int]:
    """A port another server is listening on."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


@dataclass
class Mistake:
    args: list[str]
    expect: list[str]  # what the error line must say: the problem, and what to do
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Setup:
    tmp: Path
    port: int  # taken

    def store(self, schema_version: int | None = None) -> Path:
        """A run directory with a real store; `schema_version` rewrites the version it records."""
        run = self.tmp / "run-with-store"
        Store.for_run_dir(run).close()
        if schema_version is not None:
            with sqlite3.connect(run / "clawrl.db") as db:
                db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(schema_version),))
            db.close()
        return run

    def model_dir(self, *files: str) -> Path:
        """A directory holding `files` (empty, or `{}` for the JSON ones): part of a model."""
        directory = self.tmp / "model"
        directory.mkdir()
        for name in files:
            (directory / name).write_text("{}" if name.endswith(".json") else "")
        return directory

    def not_a_store(self) -> Path:
        """A run directory whose clawrl.db is some other file."""
        run = self.tmp / "run-with-garbage"
        run.mkdir()
        (run / "clawrl.db").write_text("these are notes, not a database\n" * 100)
        return run

    def unwritable_dir(self) -> Path:
        """A directory this user cannot write in: as root, permissions do not stop it, sysfs does."""
        if os.geteuid() == 0:
            return Path("/sys/clawrl-test-run")
        directory = self.tmp / "read-only"
        directory.mkdir()
        directory.chmod(0o500)
        return directory / "run"


SERVE = ["serve", "--model", "tiny", "--device", "cpu"]
HUB_ID = "clawrl-test/no-such-model"

MISTAKES: dict[str, Callable[[Setup], Mistake]] = {
    "serve on a taken port": lambda s: Mistake(
        [*SERVE, "--port", str(s.port), "--run-dir", str(s.tmp / "run")], [f"port {s.port}", "in use", "--port"]),
    "dashboard on a taken port": lambda s: Mistake(
        ["dashboard", "--dashboard-port", str(s.port), "--run-dir", str(s.store())], [f"port {s.port}", "--dashboard-port"]),
    "envs serve on a taken port": lambda s: Mistake(
        ["envs", "serve", "--env", "toolcall", "--port", str(s.port)], [f"port {s.port}", "--port"]),
    "envs serve with no room for an episode": lambda s: Mistake(
        ["envs", "serve", "--env", "toolcall", "--max-episodes", "0", "--port", str(closed_port())],
        ["--max-episodes (CLAWRL_ENV_MAX_EPISODES)", "greater than 0"]),
    "host that is not this machine's": lambda s: Mistake(
        [*SERVE, "--host", "203.0.113.7", "--port", str(closed_port()), "--run-dir", str(s.tmp / "run")],
        ["203.0.113.7 is not an address of this machine", "--host"]),
    "model directory that does not exist": lambda s: Mistake(
        [*SERVE, "--model", "./no-such-dir", "--port", "0", "--run-dir", str(s.tmp / "run")],
        ["./no-such-dir: no such directory", "hub id like Qwen/Qwen3-4B"]),
    "model directory without config.json": lambda s: Mistake(
        [*SERVE, "--model", str(s.model_dir("README.md")), "--port", "0", "--run-dir", str(s.tmp / "run")],
        ["has no config.json", "not a Hugging Face model directory", "save_pretrained"]),
    "model directory without weights": lambda s: Mistake(
        [*SERVE, "--model", str(s.model_dir("config.json", "tokenizer_config.json")), "--port", "0",
         "--run-dir", str(s.tmp / "run")], ["is missing weights", "*.safetensors", "give a directory with the model's weights"]),
    "train on a model directory that does not exist": lambda s: Mistake(
        ["train", "--model", "/no/such/model", "--run-dir", str(s.tmp / "run")], ["/no/such/model: no such directory", "hub id"]),
    "hub id not cached, HF_HUB_OFFLINE set": lambda s: Mistake(
        [*SERVE, "--model", HUB_ID, "--port", "0", "--run-dir", str(s.tmp / "run")],
        [HUB_ID, "not in the Hugging Face cache", "HF_HUB_OFFLINE is set", "give a local model directory"],
        {"HF_HUB_OFFLINE": "1"}),
    "hub id not cached, hub unreachable": lambda s: Mistake(
        [*SERVE, "--model", HUB_ID, "--port", "0", "--run-dir", str(s.tmp / "run")],
        [HUB_ID, "not in the Hugging Face cache", "is unreachable", "HF_HUB_OFFLINE=1", "give a local model directory"]),
    "unknown locally built model": lambda s: Mistake(
        [*SERVE, "--model", "tiny-nonsense", "--port", "0", "--run-dir", str(s.tmp / "run")],
        ["tiny-nonsense is not a locally built model", "tiny-pretrained"]),
    "run dir below a file": lambda s: Mistake(
        [*SERVE, "--port", "0", "--run-dir", str(s.model_dir("config.json") / "config.json" / "run")],
        ["is a file, not a directory", "give --run-dir a directory"]),
    "run dir not writable": lambda s: Mistake(
        [*SERVE, "--port", "0", "--run-dir", str(s.unwritable_dir())], ["--run-dir: cannot write to", "writable directory"]),
    "database URL of another database": lambda s: Mistake(
        [*SERVE, "--port", "0", "--run-dir", str(s.tmp / "run"), "--database-url", "mysql://me:secret@db/clawrl"],
        ["SQLite or PostgreSQL, not mysql", "postgresql+psycopg://"]),
    "database URL that is not one": lambda s: Mistake(
        ["sessions", "list", "--database-url", "my database"], ["is not a database URL", "sqlite:///"]),
    "postgres:// spelling": lambda s: Mistake(
        ["judge", "--database-url", "postgres://me@db/clawrl"], ["not postgres", "postgresql://"]),
    "PostgreSQL server that is not there": lambda s: Mistake(
        ["sessions", "list", "--database-url", f"postgresql+psycopg://clawrl@127.0.0.1:{closed_port()}/clawrl"],
        ["cannot open the database", "is PostgreSQL running there", "--database-url"]),
    "store written by a newer clawrl": lambda s: Mistake(
        ["sessions", "list", "--run-dir", str(s.store(schema_version=SCHEMA_VERSION + 95))],
        [f"schema v{SCHEMA_VERSION + 95}", f"newer than this clawrl's v{SCHEMA_VERSION}", "upgrade clawrl"]),
    "store file that is not a database": lambda s: Mistake(
        ["versions", "list", "--run-dir", str(s.not_a_store())],
        ["is not a clawrl store", "--run-dir"]),
    "run dir without a store": lambda s: Mistake(
        ["export", "--run-dir", str(s.tmp / "nowhere"), "--out", str(s.tmp / "out.jsonl")], ["no store at", "is --run-dir right"]),
    "export into a missing directory": lambda s: Mistake(
        ["export", "--run-dir", str(s.store()), "--out", str(s.tmp / "no" / "such" / "turns.jsonl")],
        ["--out", "no directory", "create it first"]),
    "engine server that is not there": lambda s: Mistake(
        [*SERVE, "--port", "0", "--run-dir", str(s.tmp / "run"), "--engine", "openai",
         "--engine-url", f"http://127.0.0.1:{closed_port()}/v1"], ["cannot reach the engine server", "--engine-url"]),
    "LoRA rank above the engine's limit": lambda s: Mistake(
        [*SERVE, "--port", "0", "--run-dir", str(s.tmp / "run"), "--engine", "vllm", "--method", "rl",
         "--lora-rank", "128", "--max-lora-rank", "64"], ["--lora-rank 128 is above --max-lora-rank 64", "lower --lora-rank"]),
    "device that does not exist": lambda s: Mistake(
        [*SERVE, "--port", "0", "--run-dir", str(s.tmp / "run"), "--device", "gpu"], ["--device gpu is not a device", "cpu"]),
    "a setting out of range": lambda s: Mistake(
        [*SERVE, "--port", "0", "--run-dir", str(s.tmp / "run"), "--max-batch-size", "0"],
        ["--max-batch-size (CLAWRL_MAX_BATCH_SIZE)", "greater than or equal to 1"]),
    "openai engine without its server's URL": lambda s: Mistake(
        [*SERVE, "--port", "0", "--run-dir", str(s.tmp / "run"), "--engine", "openai"],
        ["--engine openai needs --engine-url", "give the server's base URL"]),
    "a list setting with an item that is not one": lambda s: Mistake(
        ["rollout", "--env", "toolcall", "--policy", "oracle", "--toolcall-levels", "1,two"],
        ["--toolcall-levels (CLAWRL_ENV_TOOLCALL_LEVELS)", "valid integer", "'two'"]),
    "rollout of an unknown environment": lambda s: Mistake(
        ["rollout", "--env", "nope", "--policy", "oracle"], ["no environment 'nope'", "--env"]),
    "rollout against a server that is not there": lambda s: Mistake(
        ["rollout", "--env", "toolcall", "--server", f"http://127.0.0.1:{closed_port()}/v1"],
        ["cannot reach the clawrl server at", "start it, or correct --server"]),
    "terminal tasks directory that does not exist": lambda s: Mistake(
        ["rollout", "--env", "terminal", "--policy", "oracle", "--terminal-tasks-dir", str(s.tmp / "tasks")],
        ["--terminal-tasks-dir", "no such directory"]),
}


def clawrl(args: list[str], tmp: Path, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`clawrl args` in a new process, with nothing of this machine's clawrl or hub settings: an
    empty model cache and Hugging Face cache, and a hub endpoint that refuses connections."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith(("CLAWRL_", "HF_"))}
    clean |= {"CLAWRL_CACHE_DIR": str(tmp / "clawrl-cache"), "HF_HUB_CACHE": str(tmp / "hf-cache"),
              "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}", **(env or {})}
    return subprocess.run([sys.executable, "-m", "clawrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=clean, cwd=tmp)


@pytest.mark.parametrize("name", list(MISTAKES))
def test_a_mistake_ends_in_one_line_before_anything_loads(name: str, tmp_path: Path, taken_port: int) -> None:
    if name.startswith("PostgreSQL"):
        pytest.importorskip("psycopg")
    mistake = MISTAKES[name](Setup(tmp_path, taken_port))
    started = time.monotonic()
    done = clawrl(mistake.args, tmp_path, mistake.env)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert 1 <= len(lines) <= 2, done.stderr[-3000:]
    assert lines[-1].startswith("error: "), lines
    for words in mistake.expect:
        assert words in done.stderr, f"{words!r} not in {done.stderr!r}"
    # nothing was loaded or built: the locally built model's cache is still empty
    assert not any((tmp_path / "clawrl-cache").glob("tiny*")), name
    assert time.monotonic() - started < 60


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    args = [*SERVE, "--model", "./no-such-dir", "--port", "0", "--run-dir", str(tmp_path / "run")]
    for debug_args, env in (([*args, "--debug"], {}), (["--debug", *args], {}), (args, {"CLAWRL_DEBUG": "1"})):
        done = clawrl(debug_args, tmp_path, env)
        assert done.returncode != 0
        assert "Traceback" in done.stderr and "check_model" in done.stderr, done.stderr[-3000:]
        assert done.stderr.strip().splitlines()[-1].startswith("error: --model ./no-such-dir: no such directory")


def test_a_taken_port_is_refused_before_the_model_loads(tmp_path: Path, taken_port: int) -> None:
    """`--model tiny` would be built (seconds) and loaded before uvicorn found the port taken;
    the port is checked first."""
    done = clawrl([*SERVE, "--port", str(taken_port), "--run-dir", str(tmp_path / "run")], tmp_path)
    assert done.returncode == 1 and f"port {taken_port} on 127.0.0.1 is already in use" in done.stderr
    assert not (tmp_path / "clawrl-cache").exists()


# --- the checks themselves, in this process ----------------------------------------------------


def test_a_hub_id_complete_in_the_cache_loads_from_there_without_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants as hub

    snapshot = tmp_path / "hub" / "models--someone--model" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (tmp_path / "hub" / "models--someone--model" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--model" / "refs" / "main").write_text("0" * 40)
    for name in ("config.json", "tokenizer_config.json"):
        (snapshot / name).write_text("{}")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    with pytest.raises(StartupError, match="HF_HUB_OFFLINE is set"):  # no weights yet: not complete
        check_model("someone/model")
    assert check_model("someone/model", needs_weights=False) == str(snapshot)  # --engine openai reads the tokenizer only
    (snapshot / "model.safetensors").write_text("")
    assert check_model("someone/model") == str(snapshot)


def test_sharded_weights_must_all_be_there(tmp_path: Path) -> None:
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}')
    (tmp_path / "model-00001-of-00002.safetensors").write_text("")
    with pytest.raises(StartupError, match="1 of the 2 shards"):
        check_model(str(tmp_path))
    (tmp_path / "model-00002-of-00002.safetensors").write_text("")
    assert check_model(str(tmp_path)) == str(tmp_path)


def test_a_free_port_and_a_current_store_pass(tmp_path: Path) -> None:
    check_port("127.0.0.1", closed_port())
    check_port("127.0.0.1", 0)
    run = tmp_path / "run"
    Store.for_run_dir(run).close()
    check_store(f"sqlite:///{run / 'clawrl.db'}", must_exist=True)
    check_store(f"sqlite:///{tmp_path / 'new' / 'clawrl.db'}")  # created on first use


def test_a_newer_store_is_refused_untouched(tmp_path: Path) -> None:
    database = tmp_path / "clawrl.db"
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE meta (key VARCHAR(64) PRIMARY KEY, value TEXT)")
        db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION + 1),))
    db.close()
    with pytest.raises(SchemaTooNewError):
        Store(f"sqlite:///{database}")
    with sqlite3.connect(database) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    db.close()
    assert tables == {"meta"}  # the older clawrl created none of its tables in it


def test_the_locally_built_names_are_those_resolve_model_builds() -> None:
    from clawrl.preflight import LOCALLY_BUILT
    from clawrl.sim.agents import FAMILIES

    assert set(LOCALLY_BUILT) == {"tiny", "tiny-pretrained", *(f"tiny-{family}" for family in FAMILIES)}


def test_well_known_failures_are_one_line_and_bugs_keep_their_traceback() -> None:
    missing = FileNotFoundError(2, "No such file or directory", "/runs/me/policy/v3")
    assert describe_failure(missing) == "error: No such file or directory: /runs/me/policy/v3 (--debug shows the traceback)"
    assert describe_failure(StartupError("the problem", "the fix")) == "error: the problem; the fix"
    assert describe_failure(ValueError("a bug")) is None
    assert describe_failure(OSError("no filename, not from the hub")) is None
