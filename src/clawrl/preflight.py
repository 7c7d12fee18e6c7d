"""Startup checks: what a `clawrl` command can find wrong before it loads a model or opens a port.

Each check returns quietly when all is well and raises `StartupError` otherwise: one line saying
what is wrong and what to do, which `clawrl.cli.main` prints without a traceback (`--debug` adds
it). The checks are cheap (a bind test, a temporary directory, a file listing, one short request
with no retries) and import nothing heavy, so that a mistake costs seconds, not a model load.

`describe_failure` turns the well-known errors that can still happen later (a path that
vanished, the hub or the database failing) into such a line too; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import sqlite3
import sys
import tempfile
import traceback
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clawrl.config import EngineConfig

HUB_TIMEOUT_S = 5.0  # one metadata request to the hub, no retries
SERVER_TIMEOUT_S = 5.0  # one request to an engine or clawrl server
DATABASE_TIMEOUT_S = 5  # connecting to a database server
DATABASE_URL_EXAMPLE = "sqlite:////abs/path/clawrl.db or postgresql+psycopg://USER:PASSWORD@HOST:5432/DB"
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# the models `clawrl.sim.models.resolve_model` builds by name (tiny-<family>: sim/agents.py FAMILIES)
LOCALLY_BUILT = ("tiny", "tiny-pretrained", "tiny-toolcall", "tiny-terminal", "tiny-swe", "tiny-web")


class StartupError(SystemExit):
    """A command cannot start: `error: <what is wrong>; <what to do>` (exit status 1).

    A SystemExit, so that code calling a command outside `main` still ends with the message and
    no traceback.
    """

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem, self.fix = problem, fix
        super().__init__(f"error: {problem}" + (f"; {fix}" if fix else ""))

    @property
    def message(self) -> str:
        return str(self.code)


# --- ports and directories ---------------------------------------------------------------------


def check_port(host: str, port: int, port_flag: str = "--port", host_flag: str = "--host") -> None:
    """That a server could listen on host:port now (port 0, any free port, always can)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn chooses it
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)[0]
    except socket.gaierror as error:
        raise StartupError(f"{host_flag} {host} is not an address of this machine ({error.strerror})",
                           f"listen on 127.0.0.1, 0.0.0.0 or one of its addresses with {host_flag}") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise StartupError(f"port {port} on {host} is already in use (another clawrl, or another server)",
                                   f"stop that process or pick a free port with {port_flag}") from None
            if error.errno == errno.EACCES:
                raise StartupError(f"port {port} needs privileges this user does not have",
                                   f"pick a port above 1023 with {port_flag}") from None
            if error.errno == errno.EADDRNOTAVAIL:
                raise StartupError(f"{host_flag} {host} is not an address of this machine",
                                   f"listen on 127.0.0.1, 0.0.0.0 or one of its addresses with {host_flag}") from None
            raise StartupError(f"cannot listen on {host}:{port} ({error.strerror})",
                               f"pick another {port_flag} or {host_flag}") from None


def check_writable_dir(path: Path | str, flag: str) -> None:
    """That the directory `path` exists and is writable, or could be created (by a real write test:
    permission bits say nothing to root, nor about a read-only file system)."""
    path = Path(path).expanduser()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise StartupError(f"{flag} {path}: {existing} is a file, not a directory",
                           f"give {flag} a directory (or a path where one can be created)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".clawrl-write-test-", dir=existing))
    except OSError as error:
        where = f"{path}" if existing == path else f"{existing} (to create {path})"
        raise StartupError(f"{flag}: cannot write to {where}: {error.strerror}",
                           f"give {flag} a writable directory, or fix its permissions") from None


def check_writable_file(path: Path | str, flag: str) -> None:
    """That the file `path` could be written: its directory exists and is writable, and it is not a directory."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise StartupError(f"{flag} {path} is a directory", f"give {flag} a file path")
    if not path.parent.is_dir():
        raise StartupError(f"{flag} {path}: no directory {path.parent}", f"create it first, or give {flag} a path in an existing directory")
    check_writable_dir(path.parent, flag)


# --- models ------------------------------------------------------------------------------------


def is_locally_built(name: str) -> bool:
    """Whether `--model name` names one of the models clawrl builds itself rather than a directory or a hub id."""
    return name in LOCALLY_BUILT


def check_model(name: str, flag: str = "--model", needs_weights: bool = True) -> str:
    """Where the model `name` can be loaded from, or a StartupError saying why it cannot.

    A local directory must hold a Hugging Face model (config.json, a tokenizer and, when
    `needs_weights`, weights). A hub id already complete in the local Hugging Face cache resolves
    to its snapshot directory, so that loading it never waits on the network; one that is not is
    asked for once, with a short timeout and no retries (none at all with HF_HUB_OFFLINE set), and
    stays a hub id for transformers to download.
    """
    path = Path(name).expanduser()
    if path.exists():
        check_model_dir(path, flag, needs_weights)
        return str(path)
    if _looks_like_a_path(name):
        raise StartupError(f"{flag} {name}: no such directory",
                           "give a local model directory (one with config.json) or a hub id like Qwen/Qwen3-4B")
    try:
        return _hub_model(name, flag, needs_weights)
    except StartupError:
        if name.startswith("tiny") and "/" not in name:  # a misspelt locally built model, most likely
            raise StartupError(f"{flag} {name} is not a locally built model, a local directory or a hub model clawrl can get",
                               f"the locally built models are {', '.join(LOCALLY_BUILT)}") from None
        raise


def check_model_dir(path: Path, flag: str = "--model", needs_weights: bool = True) -> None:
    if not path.is_dir():
        raise StartupError(f"{flag} {path} is a file, not a model directory", "give the directory that holds its config.json")
    if not (path / "config.json").is_file() and (path / "adapter_config.json").is_file():
        raise StartupError(f"{flag} {path} is a LoRA adapter, not a model",
                           "give its base model (adapter_config.json's base_model_name_or_path); clawrl trains its own adapters")
    if not (path / "config.json").is_file():
        below = sorted(str(child.relative_to(path)) for child in path.glob("*/config.json"))
        hint = f" (its subdirectory {Path(below[0]).parent} has one)" if below else ""
        raise StartupError(f"{flag} {path} has no config.json, so it is not a Hugging Face model directory{hint}",
                           "give the directory a model was saved to (save_pretrained), or a hub id like Qwen/Qwen3-4B")
    try:
        json.loads((path / "config.json").read_text())
    except (ValueError, OSError) as error:
        raise StartupError(f"{path / 'config.json'} is not readable JSON ({error})", "restore the model's files") from None
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise StartupError(f"{flag} {path} has no tokenizer (tokenizer.json or tokenizer_config.json)",
                           "save the tokenizer beside the weights (tokenizer.save_pretrained), or give the base model's directory")
    if needs_weights:
        missing = _missing_weights(path)
        if missing:
            raise StartupError(f"{flag} {path} is missing weights ({missing})",
                               "give a directory with the model's weights, or a hub id like Qwen/Qwen3-4B")


def _missing_weights(path: Path) -> str:
    """'' when `path` holds a model's weights, else what is missing."""
    for index in path.glob("*.index.json"):
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (ValueError, OSError):
            continue
        absent = sorted(shard for shard in shards if not (path / shard).is_file())
        if absent:
            return f"{len(absent)} of the {len(shards)} shards {index.name} lists, e.g. {absent[0]}"
        if shards:
            return ""
    if any(next(path.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        return ""
    return "no *.safetensors or pytorch_model*.bin"


def _looks_like_a_path(name: str) -> bool:
    """A name no hub id could be: `./x`, `/x`, `~/x`, `a/b/c`, ... (hub ids are `name` or `owner/name`)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if name.startswith((".", "/", "~")) or os.sep != "/" and os.sep in name:
        return True
    try:
        validate_repo_id(name)
    except HFValidationError:
        return True
    return False


def _hub_model(repo_id: str, flag: str, needs_weights: bool) -> str:
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RemoteEntryNotFoundError, RepositoryNotFoundError

    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        snapshot = Path(cached).parent
        if any((snapshot / name).is_file() for name in TOKENIZER_FILES) and not (needs_weights and _missing_weights(snapshot)):
            return str(snapshot)
    not_local = f"{flag} {repo_id} is not a local directory and not in the Hugging Face cache ({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE:
        raise StartupError(f"{not_local}, and HF_HUB_OFFLINE is set",
                           f"download it where the hub is reachable (`hf download {repo_id}`), or give a local model directory")
    try:
        # one HEAD request, no retries (those are what made an offline start take minutes)
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise StartupError(f"{flag} {repo_id} is a gated model on the Hugging Face hub",
                           "accept its terms on huggingface.co and log in (`hf auth login` or HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise StartupError(f"{flag} {repo_id}: no such local directory, and no such model on the Hugging Face hub",
                           "check the spelling (hub ids look like Qwen/Qwen3-4B); a private model needs `hf auth login` or HF_TOKEN") from None
    except RemoteEntryNotFoundError:
        raise StartupError(f"{flag} {repo_id} on the Hugging Face hub has no config.json (not a transformers model)",
                           "give a transformers model's hub id or a local model directory") from None
    except HfHubHTTPError as error:
        raise StartupError(f"{not_local}, and the hub answered {_first_line(error)}",
                           "try again later, or give a local model directory") from None
    except Exception as error:  # httpx's transport errors: no DNS, no route, refused, timed out
        raise StartupError(f"{not_local}, and the hub ({constants.ENDPOINT}) is unreachable ({_first_line(error) or type(error).__name__})",
                           f"download it where the hub is reachable (`hf download {repo_id}`) and set HF_HUB_OFFLINE=1, "
                           "or give a local model directory") from None
    return repo_id


def check_device(device: str) -> None:
    """That `--device` names a device torch has here (imports torch only for a non-CPU device)."""
    if device in ("auto", "cpu"):
        return
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise StartupError(f"--device {device} is not a device", "use auto, cpu, cuda or cuda:N") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise StartupError(f"--device {device}, but torch sees no CUDA GPU here", "use --device cpu (or auto)")
        if parsed.index is not None and parsed.index >= count:
            raise StartupError(f"--device {device}, but torch sees {count} CUDA GPU(s) (cuda:0 to cuda:{count - 1})",
                               "pick one of those")


# --- engines and servers -----------------------------------------------------------------------


def check_engine(engine: EngineConfig) -> None:
    """Refuse an engine that cannot run here (no CUDA for --device, no vLLM, no server at
    --engine-url), before anything loads. What the settings alone say (`--engine openai` without
    `--engine-url`, a LoRA rank above the engine's) is refused when they are read: validators on
    `EngineConfig` and `ServeSettings`."""
    if engine.engine == "hf":
        check_device(engine.device)
    if engine.engine == "openai":
        assert engine.engine_urls, "EngineConfig refuses --engine openai without --engine-url"
        for url in engine.engine_urls:
            check_server(url, engine.engine_api_key, "--engine-url", "--engine-api-key", "the engine server")
    if engine.engine == "vllm":
        from clawrl.engines.remote import RemoteEngineError  # with torch and transformers: seconds
        from clawrl.engines.vllm import find_vllm_python

        try:
            find_vllm_python(engine.vllm_python)
        except RemoteEngineError as error:
            raise StartupError(str(error)) from None


def check_server(
    url: str, api_key: str | None, flag: str = "--server", key_flag: str = "--api-key", what: str = "the clawrl server"
) -> None:
    """That `url` is the base URL of an OpenAI-compatible API that lists a model (one GET /models)."""
    import httpx

    models = url.rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(models, headers=headers, timeout=SERVER_TIMEOUT_S)
    except httpx.HTTPError as error:
        raise StartupError(f"cannot reach {what} at {url} ({_first_line(error) or type(error).__name__})",
                           f"start it, or correct {flag}") from None
    if response.status_code == 401:
        raise StartupError(f"{what} at {url} refused {'the key' if api_key else 'a request without a key'} (401)",
                           f"pass its key with {key_flag}")
    if response.status_code == 404:
        raise StartupError(f"{models} does not exist (404)",
                           f"{flag} takes the API's base URL, ending in /v1 (e.g. http://127.0.0.1:8000/v1)")
    if response.status_code != 200:
        raise StartupError(f"{what} at {url} answered {response.status_code} to GET /models", f"check {flag}")
    try:
        listed = response.json().get("data")
    except (ValueError, AttributeError):
        listed = None
    if not listed:
        raise StartupError(f"{models} lists no model (is {url} an OpenAI-compatible API?)", f"check {flag}")


# --- the store ---------------------------------------------------------------------------------


def check_store(url: str, must_exist: bool = False, where_flag: str = "--run-dir") -> None:
    """That the store at `url` can be opened by this clawrl: a URL SQLAlchemy can use with a driver
    that is installed, a database that answers, and a schema version this clawrl knows.

    `must_exist`: commands that only read a store (sessions, export, ...) refuse a SQLite file that
    is not there instead of creating an empty one.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StartupError(f"--database-url {_hide_password(url)!r} is not a database URL", f"write {DATABASE_URL_EXAMPLE}") from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        hint = " (SQLAlchemy spells it postgresql://)" if backend == "postgres" else ""
        raise StartupError(f"--database-url {parsed.render_as_string(hide_password=True)}: clawrl stores in SQLite or "
                           f"PostgreSQL, not {backend}{hint}", f"write {DATABASE_URL_EXAMPLE}")
    try:
        parsed.get_dialect().import_dbapi()
    except (ImportError, NoSuchModuleError) as error:
        raise StartupError(f"--database-url {parsed.render_as_string(hide_password=True)} needs a database driver that "
                           f"is not installed ({_first_line(error)})",
                           "write postgresql+psycopg://... and `pip install 'clawrl[postgres]'` (psycopg 3)") from None
    if backend == "sqlite":
        _check_sqlite(parsed.database, must_exist, where_flag)
    else:
        _check_postgres(url, parsed)


def _check_sqlite(database: str | None, must_exist: bool, where_flag: str) -> None:
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    if not path.exists():
        if must_exist:
            raise StartupError(f"no store at {path}", f"is {where_flag} right? (a run directory `clawrl serve` has written)")
        check_writable_dir(path.parent, where_flag if where_flag == "--run-dir" else "--database-url")
        return
    if path.is_dir():
        raise StartupError(f"the store {path} is a directory, not a SQLite file", f"check {where_flag}")
    found = None
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=DATABASE_TIMEOUT_S)) as connection:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "meta" in tables:
                row = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                found = row[0] if row else None
    except sqlite3.OperationalError as error:  # locked, unreadable
        raise StartupError(f"cannot read the store {path} ({error})", f"check {where_flag} and the file's permissions") from None
    except sqlite3.DatabaseError as error:  # "file is not a database"
        raise StartupError(f"{path} is not a clawrl store ({error})",
                           f"give {where_flag} a run directory of clawrl's, or move that file away") from None
    _check_schema_version(found, str(path), where_flag)


def _check_postgres(url: str, parsed: Any) -> None:
    from sqlalchemy import create_engine, inspect, text
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.pool import NullPool

    shown = parsed.render_as_string(hide_password=True)
    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": DATABASE_TIMEOUT_S})
    try:
        with engine.connect() as connection:
            found = None
            if inspect(connection).has_table("meta"):
                found = connection.execute(text("SELECT value FROM meta WHERE key = 'schema_version'")).scalar()
    except DBAPIError as error:
        detail = _first_line(error.orig if error.orig is not None else error)
        raise StartupError(f"cannot open the database {shown} ({detail})",
                           "is PostgreSQL running there, and are the user, password and database right? "
                           "check --database-url (CLAWRL_DATABASE_URL)") from None
    finally:
        engine.dispose()
    _check_schema_version(found, shown, "--database-url")


def _check_schema_version(found: Any, where: str, flag: str) -> None:
    from clawrl.store.migrations import SCHEMA_VERSION

    if found is None:
        return
    try:
        version = int(found)
    except (TypeError, ValueError):
        raise StartupError(f"the store {where} records schema version {found!r}, which no clawrl writes",
                           f"give {flag} a store written by clawrl") from None
    if version > SCHEMA_VERSION:
        raise StartupError(f"the store {where} has schema v{version}, newer than this clawrl's v{SCHEMA_VERSION}",
                           f"upgrade clawrl to the version that wrote it, or give {flag} another store")


# --- errors after the checks -------------------------------------------------------------------


def describe_failure(error: BaseException) -> str | None:
    """One `error: ...` line for a well-known failure (a missing path, the hub, the database), or
    None for anything else: that is a bug, and its traceback is the useful report."""
    if isinstance(error, StartupError):
        return error.message
    debug_hint = " (--debug shows the traceback)"
    if isinstance(error, OSError) and _raised_in(error, ("huggingface_hub", "transformers")):
        return f"error: loading the model failed: {_first_line(error)}; check --model (a local model directory or a hub id){debug_hint}"
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"error: {error.strerror}: {error.filename}{debug_hint}"
    sqlalchemy_errors = sys.modules.get("sqlalchemy.exc")
    if sqlalchemy_errors is not None and isinstance(error, sqlalchemy_errors.OperationalError):
        detail = _first_line(error.orig if error.orig is not None else error)
        return f"error: the store's database failed ({detail}); check --database-url or --run-dir{debug_hint}"
    encryption = sys.modules.get("clawrl.store.encryption")
    if encryption is not None and isinstance(error, encryption.DataKeyError):
        return f"error: {error}"
    migrations = sys.modules.get("clawrl.store.migrations")
    if migrations is not None and isinstance(error, migrations.SchemaTooNewError):
        return f"error: {error}; upgrade clawrl, or use another store"
    return None


def _raised_in(error: BaseException, packages: tuple[str, ...]) -> bool:
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and any(f"{os.sep}{package}{os.sep}" in frames[-1].filename for package in packages)


def _first_line(error: BaseException | str) -> str:
    text = str(error).strip()
    return text.splitlines()[0].strip() if text else ""


def _hide_password(url: str) -> str:
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)
