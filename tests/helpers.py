"""What several test modules share: plain functions, classes and constants (the fixtures that use
them are in conftest.py). Test modules import shared things from here or take conftest's fixtures,
never from one another.

* the weather tool round trip that `tool_model_dir` is fitted to, and `fit` that fits it;
* `start_server`: a real server on a free port (`BorrowedEngine`: one engine for several servers);
* recording turns, verdicts and samples straight into a store (`record`, `Conversation`,
  `store_with_samples`, `version`);
* talking to a running server as a client does (`converse`, `teach`, `healthz`, `LoadClients`) and waiting for
  what it does in the background (`wait_for_judgment`, `wait_until`), and the `clawrl` command
  (`run_cli`);
* `PostgresServer`: a real PostgreSQL server for the store's PostgreSQL tests;
* policy versions to load into an engine (`save_lora_adapter`, `save_perturbed_weights`);
* `require_vllm`, `require_chromium`: skip (or, under CI, fail) where vLLM or the browser is missing.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.config import EngineConfig, JudgeConfig, ServeConfig
from clawrl.engines import Engine, GenerationStream, SamplingParams, build_engine
from clawrl.engines.hf import HFEngine
from clawrl.engines.remote import RemoteEngineError
from clawrl.engines.vllm import find_vllm_python
from clawrl.envs.web.browser import browser_unavailable
from clawrl.judge.worker import build_worker
from clawrl.messages import conversation_hashes, recorded_fingerprint
from clawrl.model.chat import render_prompt
from clawrl.model.notes import with_notes
from clawrl.serve.runner import ServerThread, free_port
from clawrl.store import Store
from clawrl.store.encryption import KeyRing
from clawrl.store.training import TrainingStore
from clawrl.types import DEFAULT_USER, SHARED_LINEAGE, AdaptersMode, Judgment, MemoryNote, NextState, PolicyVersion, Sample, ScoredResponse, SessionIdSource, StepMetrics, Turn, TurnSampling
from clawrl.versions.files import Manifest, write_version

# --------------------------------------------------------------------------- the weather tool round trip

# The tool, the question, the model's call, the tool's result and the final answer that
# `tool_model_dir` (conftest.py) is fitted to produce under greedy decoding.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_QUESTION = "What's the weather in Lyon?"
WEATHER_CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>'
WEATHER_RESULT = '{"temp_c": 14, "sky": "cloudy"}'
WEATHER_ANSWER = "It is 14 degrees and cloudy in Lyon."

# A user's correction that the rule judge scores -1 with the hint "... without the bold and the
# numbered list".
CORRECTION = "this looks too AI-like, rewrite it without the bold and the numbered list"

# A hint as a judge would give it for an AI-like answer.
HINT = "Answer without bold text and without a numbered list."


def weather_conversations() -> list[tuple[list[dict[str, Any]], str]]:
    """The two steps of the weather round trip as (messages, the assistant's answer): the question
    answered with the tool call, then the tool's result answered with WEATHER_ANSWER."""
    question = [{"role": "user", "content": WEATHER_QUESTION}]
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}
    after_tool = question + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": WEATHER_RESULT},
    ]
    return [(question, WEATHER_CALL_TEXT), (after_tool, WEATHER_ANSWER)]


def fit(
    model_dir: Path,
    out_dir: Path,
    conversations: list[tuple[list[dict[str, Any]], str]],
    steps: int,
    tools: list[dict[str, Any]] | None = (WEATHER_TOOL,),  # type: ignore[assignment]
) -> Path:
    """Overfit the tiny model so that each conversation's prompt (rendered with `tools`) is followed by its answer."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    examples = []
    for messages, answer in conversations:
        prompt = tokenizer.apply_chat_template(messages, tools=list(tools) if tools else None, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        answer_ids = tokenizer.encode(answer + "<|im_end|>", add_special_tokens=False)
        ids = torch.tensor([prompt_ids + answer_ids])
        labels = ids.clone()
        labels[0, : len(prompt_ids)] = -100
        examples.append((ids, labels))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        for ids, labels in examples:
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


# --------------------------------------------------------------------------- a real server


@dataclasses.dataclass
class ServerSetup:
    """A module's real server, its users' keys (name -> key), its store and run directory."""

    server: ServerThread
    keys: dict[str, str]
    store: Store
    run_dir: Path


def start_server(
    model_dir: Path, run_dir: Path, judge: JudgeConfig | None = None, engine: Engine | None = None,
    adapters: AdaptersMode = "shared", keys: KeyRing | None = None, **serve_options: Any,
) -> ServerThread:
    """A real server on a free port; with `judge`, the judge loop runs inside it as in `clawrl serve`.
    The engine is a fresh hf engine on `model_dir`, or `engine` (a `BorrowedEngine` the server
    neither starts nor stops, e.g. a vLLM server shared by a module's tests); `adapters` as the
    trainer's `--adapters`; `keys` the store's data keys (`--encrypt-key-file`)."""
    engine_config = EngineConfig(model=str(model_dir), device="cpu", cpu_threads=1)
    engine = engine if engine is not None else build_engine(engine_config)
    store = Store.for_run_dir(run_dir, keys)
    config = ServeConfig(port=free_port(), **serve_options)
    worker = (build_worker(store, judge, engine, engine_config, memory_notes=config.memory_limit, memory_from=config.memory_from)
              if judge is not None else None)  # fmt: skip
    return ServerThread(engine, store, config, worker, adapters)


class BorrowedEngine(Engine):
    """A running engine lent to one server after another: the server's start and close leave it
    running (its owner, a fixture, starts and closes it). Everything else is the engine's own."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.model_name = engine.model_name
        self.tokenizer = engine.tokenizer
        self.max_context_tokens = engine.max_context_tokens
        self.constrained_decoding = engine.constrained_decoding

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    async def start(self) -> None:
        """Already running."""

    async def close(self) -> None:
        """Left running for the next server."""

    def lineage_version(self, lineage: str) -> int | None:
        return self.engine.lineage_version(lineage)

    def held_versions(self) -> list[int]:
        return self.engine.held_versions()

    def generate(self, prompt_token_ids: list[int], sampling: SamplingParams, lineage: str = SHARED_LINEAGE) -> GenerationStream:
        return self.engine.generate(prompt_token_ids, sampling, lineage)

    async def score(self, prompt_token_ids: list[int], response_token_ids: list[int], top_k: int = 0, version: int | None = None) -> ScoredResponse:
        return await self.engine.score(prompt_token_ids, response_token_ids, top_k, version)

    async def load_version(self, version: int, path: Path, lineage: str = SHARED_LINEAGE) -> None:
        await self.engine.load_version(version, path, lineage)


# --------------------------------------------------------------------------- records in a store


def user(text: str) -> dict[str, Any]:
    """A user message with plain text content."""
    return {"role": "user", "content": text}


def turn(turn_id: str, session_id: str, messages: list[dict[str, Any]], answer: str, **fields: Any) -> Turn:
    """A finished main turn answering `messages` with `answer`; `fields` sets or overrides any other field."""
    defaults: dict[str, Any] = {
        "id": turn_id,
        "session_id": session_id,
        "kind": "main",
        "model": "m",
        "policy_version": 0,
        "messages": messages,
        "tools": None,
        "sampling": TurnSampling(),
        "prompt_token_ids": [1, 2],
        "response_token_ids": [3],
        "response_logprobs": [-0.1],
        "response_text": answer,
        "tool_calls": None,
        "finish_reason": "stop",
        "answer_fingerprint": recorded_fingerprint(answer, None, conversation_hashes(messages)),
        "message_hashes": conversation_hashes(messages),
        "latency_s": 0.01,
    }
    return Turn(**(defaults | fields))


def record(
    store: Store,
    turn_id: str,
    session_id: str,
    messages: list[dict[str, Any]],
    answer: str,
    *,
    continues_turn_id: str | None = None,
    next_state: list[dict[str, Any]] | None = None,
    session_done: bool = False,
    id_source: SessionIdSource = "new",
    user_id: str = DEFAULT_USER,
    **fields: Any,
) -> None:
    """Record a main turn of `session_id` (a session of `user_id`'s) as serving would; with
    `continues_turn_id`, its request carries `next_state` for that earlier turn. `fields` sets or
    overrides any other `Turn` field."""
    continues = NextState(continues_turn_id, next_state or [], turn_id) if continues_turn_id is not None else None
    written = turn(turn_id, session_id, messages, answer, **fields)
    store.turns.record_turn(written, id_source, continues, session_done, user_id=user_id)


def judgment(turn_id: str, score: int = 1, hint: str | None = None) -> Judgment:
    """A rule verdict on `turn_id`."""
    return Judgment(turn_id, score, [score], 1.0, 0, None, hint, [], "rule", "rule", 0.0)


class Conversation:
    """Records real turns (token ids from the tiny model's tokenizer) and their verdicts."""

    def __init__(self, store: Store, tokenizer: Any) -> None:
        self.store, self.tokenizer = store, tokenizer

    def turn(self, turn_id: str, session: str, question: str, answer: str, *, after: str | None = None, done: bool = False,
             user_id: str = DEFAULT_USER, notes: list[MemoryNote] | None = None) -> None:  # fmt: skip
        """Record `answer` to `question` as a main turn (of a session of `user_id`'s); `after` names the
        turn it continues (whose next state `question` becomes), `done` ends the session with it;
        `notes`: served with these memory notes in its prompt, as `--memory on` serves it."""
        messages = [{"role": "user", "content": question}]
        response = self.tokenizer.encode(answer + "<|im_end|>", add_special_tokens=False)
        fed = render_prompt(self.tokenizer, with_notes(messages, notes or []), None)
        record(
            self.store, turn_id, session, messages, answer, continues_turn_id=after, next_state=messages,
            session_done=done, id_source="header", model="tiny", prompt_token_ids=fed, user_id=user_id,
            response_token_ids=response, response_logprobs=[-1.0] * len(response),
            memory_note_ids=[note.id for note in notes] if notes else None,
        )  # fmt: skip

    def judge(self, turn_id: str, score: int, hint: str | None = None) -> None:
        """Record a rule verdict on `turn_id`."""
        assert self.store.judging.record_judgment(judgment(turn_id, score, hint))


def ready_sample(turn_id: str, reward: float = 1.0) -> Sample:
    """A ready RL sample of the turn, produced by version 0."""
    return Sample(turn_id, "ready", "rl", reward, 0)


def store_with_samples(tmp_path: Path, count: int) -> tuple[Store, TrainingStore]:
    """A store under `tmp_path` holding `count` judged turns t0, t1, ... of session "s", each with a
    ready RL sample of reward 1."""
    store = Store.for_run_dir(tmp_path)
    for index in range(count):
        record(store, f"t{index}", "s", [user(f"q{index}")], f"a{index}")
        store.judging.record_judgment(judgment(f"t{index}"))
    training = store.training
    training.add_samples([ready_sample(f"t{index}") for index in range(count)])
    return store, training


def version(number: int, parent: int) -> PolicyVersion:
    """A LoRA version `number` trained from `parent`, as the trainer would register it."""
    return PolicyVersion(number, parent, "lora", f"/runs/policy/shared/v{number}", "0" * 64, number, StepMetrics(loss=0.5))


def publish_adapter(store: Store, run_dir: Path, adapter: Path) -> None:
    """Version 1 of the shared lineage, a LoRA adapter, published as the trainer publishes one."""
    record(store, "t1", "s1", [user("q")], "a")
    store.judging.record_judgment(judgment("t1"))
    store.training.add_samples([ready_sample("t1")])
    manifest = Manifest(1, 0, 1, "lora", ["t1"], {})
    path, sha256 = write_version(run_dir, manifest, lambda directory: copy_files(adapter, directory), lambda state: state.write_bytes(b"state"))
    store.training.register_version(dataclasses.replace(version(1, 0), path=str(path), sha256=sha256), ["t1"])


def publish_version(run_dir: Path, number: int, kind: str, weights: Path) -> Path:
    """Version `number` of the shared lineage from `weights`' files, published as the trainer does
    (with no samples behind it); its directory."""
    manifest = Manifest(number, number - 1, number, kind, [], {})
    path, sha256 = write_version(run_dir, manifest, lambda directory: copy_files(weights, directory),
                                 lambda state: state.write_bytes(b"state"))  # fmt: skip
    registered = dataclasses.replace(version(number, number - 1), kind=kind, path=str(path), sha256=sha256)
    Store.for_run_dir(run_dir).training.register_version(registered, [])
    return path


def ask(client: OpenAI, model: str, content: str, header: str = "x-clawrl-turn", max_tokens: int = 24) -> tuple[int, str | None]:
    """One request of a new conversation, sampled: (HTTP status, the answer's `header`: by default the
    turn id the server recorded it as); a failed request is a result, with None."""
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": content}], max_tokens=max_tokens, temperature=1.0
        )
    except Exception as error:  # noqa: BLE001 - a failed request is a result here
        return getattr(error, "status_code", 599), None
    return raw.http_response.status_code, raw.headers[header]


def copy_files(source: Path, directory: Path) -> None:
    """Every file of `source` into `directory`."""
    for path in source.iterdir():
        shutil.copy(path, directory)


# --------------------------------------------------------------------------- a client of a running server


def converse(base_url: str, lines: list[str]) -> tuple[str, list[str]]:
    """An unmodified client's conversation; returns the session id and the turn ids."""
    messages: list[dict[str, Any]] = []
    turn_ids = []
    with httpx.Client(base_url=base_url, timeout=60) as http:
        model = http.get("/models").json()["data"][0]["id"]
        for line in lines:
            messages.append({"role": "user", "content": line})
            response = http.post("/chat/completions", json={"model": model, "messages": messages, "max_tokens": 8})
            messages.append(response.json()["choices"][0]["message"])
            turn_ids.append(response.headers["x-clawrl-turn"])
    return response.headers["x-clawrl-session"], turn_ids


def teach(base_url: str, sessions: int, api_key: str | None = None) -> list[str]:
    """Sessions of three turns: a correction (-1 and a hint), thanks (+1), and a 👍 by /v1/feedback
    on the last turn (with `api_key`: a user's sessions). Each gives three samples. Returns the turn ids."""
    turn_ids = []
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=base_url, timeout=60, headers=headers) as http:
        for index in range(sessions):
            messages: list[dict[str, Any]] = []
            session = f"teach-{index}-{time.monotonic_ns()}"
            for line in [f"Write a short note to my team about Friday ({index}).", CORRECTION, "thanks, perfect"]:
                messages.append({"role": "user", "content": line})
                response = http.post(
                    "/chat/completions",
                    json={"model": "m", "messages": messages, "max_tokens": 8},
                    headers={"X-Session-Id": session},
                )
                assert response.status_code == 200, response.text
                messages.append(response.json()["choices"][0]["message"])
                turn_ids.append(response.headers["x-clawrl-turn"])
            feedback = http.post("/feedback", json={"session_id": session, "score": 1})
            assert feedback.status_code == 200, feedback.text
    return turn_ids


class LoadClients:
    """16 threads sending chats in a loop to a server's /v1 `base_url`; every failure (exception or
    non-200) is kept, and the policy version of every answer."""

    def __init__(self, base_url: str, clients: int = 16, timeout_s: float = 60) -> None:
        self.base_url, self.timeout_s, self.stop = base_url, timeout_s, threading.Event()
        self.failures: list[str] = []
        self.versions: list[int] = []
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(clients)]

    def _loop(self, index: int) -> None:
        with httpx.Client(base_url=self.base_url, timeout=self.timeout_s) as http:
            while not self.stop.is_set():
                body = {"model": "m", "messages": [{"role": "user", "content": f"client {index} says hello"}], "max_tokens": 4}
                try:
                    response = http.post("/chat/completions", json=body)
                except httpx.HTTPError as error:
                    self.failures.append(repr(error))
                    continue
                if response.status_code != 200:
                    self.failures.append(f"{response.status_code} {response.text[:200]}")
                else:
                    self.versions.append(int(response.headers["x-clawrl-policy-version"]))

    def __enter__(self) -> LoadClients:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=self.timeout_s)


def healthz(base: str) -> dict[str, Any] | None:
    """The server's /healthz body at `base` (no /v1), or None while it does not answer."""
    try:
        return httpx.get(base + "/healthz", timeout=5).json()
    except httpx.HTTPError:
        return None


def wait_for_judgment(store: Store, turn_id: str, timeout: float = 60) -> Any:
    """The judgment of `turn_id` once the judge has recorded it; fails after `timeout` seconds (the first
    judgment of a process also waits for the offline judge's classifier to be built: seconds on a loaded CI)."""
    deadline = time.monotonic() + timeout
    while (judgment := store.judging.judgment(turn_id)) is None:
        if time.monotonic() >= deadline:
            case = store.judging.turn_context(turn_id)
            raise AssertionError(
                f"turn {turn_id} was never judged ({case.turn.kind}, finish {case.turn.finish_reason}, "
                f"next state {case.next_messages!r:.500}, answer {case.turn.response_text!r:.200})"
            )
        time.sleep(0.05)
    return judgment


def wait_until(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """Poll `condition` every `every` seconds until it is truthy and return its value; fail after
    `timeout` seconds, naming `what` was awaited."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)
    return value


def run_cli(*args: str, parse: bool = True) -> Any:
    """Run `clawrl *args` in a new process; it must succeed. Returns its stdout parsed as JSON, or
    as text with `parse=False`."""
    result = subprocess.run([sys.executable, "-m", "clawrl.cli", *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout) if parse else result.stdout


# --------------------------------------------------------------------------- PostgreSQL


def server_binaries() -> Path | None:
    """The directory holding initdb and pg_ctl: on PATH, else Debian's /usr/lib/postgresql/<major>/bin."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda path: int(Path(path).parts[-3]))
    return Path(found[-1]).parent if found else None


def _as_server_user(command: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root; as root, run them as the package's `postgres` user."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


class PostgresServer:
    """A real PostgreSQL server from Debian's `postgresql` package: initdb in `root`, started on a
    free loopback port. Skips the test where the server binaries are not installed (`.ci/run`
    installs them)."""

    def __init__(self, root: Path) -> None:
        binaries = server_binaries()
        if binaries is None:
            pytest.skip("PostgreSQL server binaries not installed (Debian package `postgresql`)")
        self.binaries, self.root, self.data, self.port = binaries, root, root / "data", free_port()
        if os.geteuid() == 0:
            shutil.chown(root, "postgres")
            root.chmod(0o755)
        subprocess.run(_as_server_user([str(binaries / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "clawrl",
                                        "--no-sync"]), check=True, capture_output=True, cwd=root)  # fmt: skip
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        subprocess.run(_as_server_user([str(binaries / "pg_ctl"), "-D", str(self.data), "-l", str(self.data / "server.log"),
                                        "-o", options, "-w", "start"]), check=True, capture_output=True, cwd=root)  # fmt: skip

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy URL of `database` on this server."""
        return f"postgresql+psycopg://clawrl@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=clawrl dbname=postgres", autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        """Stop the server at once (`pg_ctl -m immediate`)."""
        subprocess.run(_as_server_user([str(self.binaries / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]),
                       capture_output=True, cwd=self.root)  # fmt: skip


# --------------------------------------------------------------------------- policy versions to load


def save_lora_adapter(model_dir: Path, out: Path, seed: int) -> Path:
    """A LoRA adapter for the tiny model whose B matrices are non-zero, so it changes outputs."""
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]),
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    model.save_pretrained(out)
    return out


def save_perturbed_weights(model_dir: Path, out: Path) -> Path:
    """A full-weight version: the tiny model with noise added to every weight."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    model.save_pretrained(out)
    return out


# --------------------------------------------------------------------------- vLLM


def require_vllm() -> None:
    """Skip the calling test where vLLM is not installed (`make test` installs it into .venv-vllm);
    under CI (`CLAWRL_REQUIRE_VLLM=1`) fail instead."""
    try:
        find_vllm_python()
    except RemoteEngineError as error:
        marker = Path(".venv-vllm/unavailable")
        reason = marker.read_text().strip() if marker.is_file() else str(error)
        if os.environ.get("CLAWRL_REQUIRE_VLLM") == "1":
            pytest.fail(f"vLLM is not installed ({reason}); CLAWRL_REQUIRE_VLLM=1 says it must run here")
        pytest.skip(f"vLLM is not installed: {reason}")


def require_chromium() -> None:
    """Skip the calling test where Chromium, chromedriver or the sandbox are missing (`make test`
    installs Chromium); under CI (`CLAWRL_REQUIRE_CHROMIUM=1`) fail instead."""
    reason = browser_unavailable()
    if reason is not None:
        if os.environ.get("CLAWRL_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"no browser ({reason}); CLAWRL_REQUIRE_CHROMIUM=1 says it must run here")
        pytest.skip(f"no browser: {reason}")


@asynccontextmanager
async def running_hf_engine(model_dir: Path, **config: Any) -> AsyncIterator[HFEngine]:
    """An hf engine on the CPU over `model_dir`, started and closed around the block."""
    engine = HFEngine(EngineConfig(device="cpu", **config), model_path=model_dir)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


# --- token ids for the scoring and update tests -----------------------------------------------


def random_ids(count: int, seed: int, vocab: int = 2048) -> list[int]:
    return torch.randint(0, vocab, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def random_tree_prompts(seed: int, rows: int = 7) -> list[list[int]]:
    """Prompts that share prefixes as an agent's traffic does, at random: each new prompt copies a
    random earlier one up to a random point (or starts afresh), then goes on with tokens of its own.
    Copied stretches are 16-40 tokens, so they are long enough to be nodes of the tree."""
    generator = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high, (), generator=generator))

    prompts = [random_ids(draw(16, 40), seed * 100)]
    for row in range(1, rows):
        source = prompts[draw(0, len(prompts))]
        kept = source[: draw(1, len(source) + 1)] if draw(0, 5) else []  # one in five starts afresh
        prompts.append(kept + random_ids(draw(1, 30), seed * 100 + row) if draw(0, 4) else list(source))
    return prompts


def host_pids_with(token: str) -> list[int]:
    """Host processes whose command line (arguments joined by NUL) contains token."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass  # it exited while we looked
    return pids
