"""Load and soak (issue 16): a real `clawrl serve` with its trainer under a mixed workload for a long time.

`clawrl serve --method combine` is started as a subprocess (hf engine on the CPU, the tiny model
built locally unless `--model` names a directory, rule judge, trainer batch size `--batch-size`),
and `--clients` concurrent clients (asyncio tasks of this process, one `httpx.AsyncClient`) talk
to it for `--minutes`. Each client picks what to do next at random with fixed weights (`KINDS`):

* `chat`: a plain non-streaming chat (one user message);
* `stream`: a streaming chat, read to `data: [DONE]`;
* `tool`: a tool round trip: a request with `tools`, then, in the same session (`X-Session-Id`),
  the follow-up carrying the assistant's tool call and the tool's result (the tiny model rarely
  calls tools itself, so where it did not, the client sends the call as history, as agents do);
* `session`: a three-turn session (a question, a correction, thanks), then a 👍 or 👎 through
  `POST /v1/feedback`; half of them name the session (`X-Session-Id`, feedback by `session_id`),
  half are unmodified clients echoing the answers (session inferred, feedback by turn id). These
  make the training samples, so the trainer steps and publishes versions throughout;
* `side`: a title request marked `turn_type: "side"` (served and recorded, never trained on);
* `hangup`: a streaming chat whose client closes the connection after 1 to 3 events.

What counts as **acknowledged**: a 200 answer to a non-streaming chat, or a stream that delivered
its `finish_reason` chunk (the server commits the turn before sending it), and a 200 answer to
feedback. Every acknowledged turn must be in the store, with the kind (main/side) and policy
version its headers said and not marked cancelled; this is checked while the server still runs,
once the load has stopped. A hung-up stream is not acknowledged, but once the client has its
headers and first event the server has started generating, and DESIGN keeps what was generated
(finish reason `cancelled`, never trained on): every one must be recorded too, checked after the
server has stopped (the cancelled write runs in the background). Anything else is a failure: a
non-2xx status, an exception or timeout, a stream that ends without `[DONE]` or with an error
event, a missing or inconsistent turn header, a conversation answered in more than one session.

Each failure is given a cause. `keep-alive race`: a request sent on a reused keep-alive connection
that the server closed without answering it. uvicorn closes a connection idle for 5 s by default,
and httpx (so the openai SDK) reuses one idle for up to 5 s: a request written at that moment was
never read (found by this soak; `clawrl serve` now keeps idle connections `--keep-alive-s` 75 s,
and `benchmarks/keepalive_race.py` shows the race with `--server-keep-alive-s 5`).
`--keepalive-expiry-s` sets the clients' side (httpx's default, 5 s).

Sampled every `--sample-s` seconds: resident memory (VmRSS), open file descriptors and threads of
the server and of the trainer process (its child, found under /proc), the store's size on disk,
the policy versions' size on disk, the served policy version and the load average. Reported per tenth of the run: requests,
failures, p50/p99 latency of completed chat requests (a stream: to `[DONE]`), memory and fds;
growth from the first tenth to the last; row counts of the store; versions published and served;
and, from the store afterwards, how judging and training kept up: per tenth, the main turns that
became judgeable (a next state or feedback arrived), how long the judge took to get to them, and
whether their samples were trained or dropped as stale.

    python benchmarks/soak.py                          # 64 clients, 30 minutes
    python benchmarks/soak.py --clients 64 --minutes 1  # what tests/test_soak.py runs

Prints a markdown table (or the JSON with `--json`) and writes the JSON to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from clawrl.serve.runner import free_port
from clawrl.sim.tiny import build_tiny_model
from clawrl.store import Store
from clawrl.store.schema import FeedbackRow, TurnRow
from machine import machine  # benchmarks/machine.py, beside this script

SERVED_NAME = "soak"
# what each client does next, with these weights
KINDS = {"chat": 30, "stream": 20, "tool": 12, "session": 14, "side": 12, "hangup": 12}
CORRECTION = "this looks too AI-like, rewrite it without the bold and the numbered list"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CITIES = ("Lyon", "Oslo", "Quito", "Perth", "Accra", "Hanoi", "Lima", "Riga")
TITLE_SYSTEM = "Write a title of at most five words for the conversation below. Answer with the title only."
REQUEST_TIMEOUT_S = 300.0


# --------------------------------------------------------------------------- what the clients saw


@dataclass
class Observed:
    """Everything the clients saw, shared by all client tasks (one event loop: no locks needed)."""

    started: float  # time.monotonic() when the load began
    # one row per finished HTTP request: (seconds since start at completion, latency s, kind, ok)
    requests: list[tuple[float, float, str, bool]] = field(default_factory=list)
    actions: Counter[str] = field(default_factory=Counter)  # what the clients chose to do
    failures: list[dict[str, Any]] = field(default_factory=list)
    # acknowledged turns: id -> (expected kind main|side, policy version from the header)
    acknowledged: dict[str, tuple[str, int]] = field(default_factory=dict)
    hung_up: dict[str, int] = field(default_factory=dict)  # turn id -> events read before hanging up
    hung_up_after_finish: int = 0  # hang-ups whose stream had already delivered its finish chunk
    feedback: dict[int, str] = field(default_factory=dict)  # acknowledged feedback id -> turn id
    versions_seen: Counter[int] = field(default_factory=Counter)
    ttft_s: list[tuple[float, float]] = field(default_factory=list)  # (completion offset, first content event)
    inferred_sessions: int = 0
    tool_calls_by_model: int = 0

    def now(self) -> float:
        return time.monotonic() - self.started

    def fail(self, kind: str, what: str, cause: str = "contract") -> None:
        self.failures.append({"t_s": round(self.now(), 2), "kind": kind, "cause": cause, "what": what[:300]})


class Failure(Exception):
    """An answer that breaks the contract (the message says how)."""


def _headers_turn(response: httpx.Response, expected_kind: str) -> tuple[str, int, str]:
    """The turn id, policy version and session of an answer, checking the headers are there and consistent."""
    turn_id = response.headers.get("x-clawrl-turn")
    version = response.headers.get("x-clawrl-policy-version")
    session = response.headers.get("x-clawrl-session")
    kind = response.headers.get("x-clawrl-turn-kind")
    if not turn_id or version is None or not session:
        raise Failure(f"answer without the X-Clawrl-* headers: {dict(response.headers)}")
    if kind != expected_kind:
        raise Failure(f"turn {turn_id} is {kind}, expected {expected_kind}")
    return turn_id, int(version), session


async def sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """The lines of an event stream, split as SSE says: at CR, LF or CRLF only. (httpx's
    `aiter_lines` also splits at U+0085, U+2028 and U+2029, which JSON leaves unescaped and the
    untrained tiny model does write: a 30-minute run broke one event apart that way.)"""
    buffer = ""
    async for text in response.aiter_text():
        buffer += text
        *lines, buffer = buffer.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        for line in lines:
            yield line
    if buffer:
        yield buffer


class Client:
    """One of the concurrent clients: picks an action, runs it, records what it saw."""

    def __init__(self, index: int, http: httpx.AsyncClient, seen: Observed, max_tokens: int, seed: int) -> None:
        self.index, self.http, self.seen, self.max_tokens = index, http, seen, max_tokens
        self.random = random.Random(seed * 1_000_003 + index)
        self.count = 0
        self.events: list[str] = []  # httpcore's trace of the current request (was its connection new or reused?)
        self.extensions = {"trace": self._trace}

    async def _trace(self, event: str, _info: dict[str, Any]) -> None:
        if not event.endswith(".started"):
            self.events.append(event)

    def cause(self, error: Exception) -> str:
        """`keep-alive race` for a request sent on a reused connection that the server closed without
        answering (uvicorn closes a connection idle for 5 s, httpx reuses one idle for up to
        `keepalive_expiry`: a request sent at that moment is never read; see the module docstring),
        else `transport` or `other`."""
        if isinstance(error, (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError)):
            reused = not any(event.startswith("connection.connect_tcp") for event in self.events)
            answered = any(event.startswith("http11.receive_response_headers.complete") for event in self.events)
            return "keep-alive race" if reused and not answered else "transport"
        return "transport" if isinstance(error, httpx.HTTPError) else "other"

    def connection_note(self) -> str:
        """How the failed request's connection came about, from its trace."""
        reused = not any(event.startswith("connection.connect_tcp") for event in self.events)
        return f"{'reused keep-alive' if reused else 'new'} connection; last events {self.events[-3:]}"

    def tag(self) -> str:
        self.count += 1
        return f"client {self.index} request {self.count}"

    async def run(self, deadline: float) -> None:
        names, weights = list(KINDS), list(KINDS.values())
        while time.monotonic() < deadline:
            kind = self.random.choices(names, weights)[0]
            self.seen.actions[kind] += 1
            self.events = []
            try:
                await getattr(self, kind)()
            except Failure as failure:
                self.seen.fail(kind, str(failure))
            except Exception as error:  # noqa: BLE001 - a transport error, a timeout, a malformed answer: all failures
                self.seen.fail(kind, f"{type(error).__name__}: {error!r} ({self.connection_note()})", self.cause(error))

    # --- one request, timed ---------------------------------------------------------------------
    async def chat_request(self, kind: str, body: dict[str, Any], headers: dict[str, str] | None = None,
                           expected_kind: str = "main") -> tuple[dict[str, Any], str, str]:
        """A non-streaming chat; returns the assistant message, the turn id and the session id."""
        started = time.monotonic()
        self.events = []
        response = await self.http.post("/chat/completions", json={"model": SERVED_NAME, **body}, headers=headers,
                                        extensions=self.extensions)
        latency = time.monotonic() - started
        if response.status_code != 200:
            self.seen.requests.append((self.seen.now(), latency, kind, False))
            raise Failure(f"{response.status_code}: {response.text[:200]}")
        turn_id, version, session = _headers_turn(response, expected_kind)
        answer = response.json()
        if answer["id"] != turn_id:
            raise Failure(f"answer id {answer['id']} != X-Clawrl-Turn {turn_id}")
        if answer["choices"][0]["finish_reason"] not in ("stop", "length", "tool_calls"):
            raise Failure(f"finish_reason {answer['choices'][0]['finish_reason']}")
        self.seen.requests.append((self.seen.now(), latency, kind, True))
        self.seen.acknowledged[turn_id] = (expected_kind, version)
        self.seen.versions_seen[version] += 1
        return answer["choices"][0]["message"], turn_id, session

    # --- the actions ----------------------------------------------------------------------------
    async def chat(self) -> None:
        await self.chat_request("chat", {"messages": [{"role": "user", "content": f"{self.tag()}: how are you today?"}],
                                         "max_tokens": self.max_tokens})  # fmt: skip

    async def side(self) -> None:
        messages = [{"role": "system", "content": TITLE_SYSTEM},
                    {"role": "user", "content": f"{self.tag()}: we talked about moving the team meeting to Friday."}]  # fmt: skip
        await self.chat_request("side", {"messages": messages, "max_tokens": self.max_tokens, "turn_type": "side"},
                                expected_kind="side")  # fmt: skip

    async def tool(self) -> None:
        city = self.random.choice(CITIES)
        question = [{"role": "user", "content": f"{self.tag()}: what's the weather in {city}?"}]
        session = f"tool-{self.index}-{self.count}-{self.random.getrandbits(32):08x}"
        headers = {"X-Session-Id": session}
        message, _turn, _session = await self.chat_request(
            "tool", {"messages": question, "tools": [WEATHER_TOOL], "max_tokens": self.max_tokens}, headers
        )
        if message.get("tool_calls"):  # the model called a tool itself: echo its call
            self.seen.tool_calls_by_model += 1
            calls = message["tool_calls"]
            assistant = {"role": "assistant", "content": message.get("content") or "", "tool_calls": calls}
        else:  # it did not: send the call an agent's model would have made, as history
            calls = [{"id": f"call_{self.count}", "type": "function",
                      "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]  # fmt: skip
            assistant = {"role": "assistant", "content": "", "tool_calls": calls}
        result = {"role": "tool", "tool_call_id": calls[0]["id"], "content": json.dumps({"temp_c": 14, "sky": "cloudy"})}
        await self.chat_request(
            "tool", {"messages": [*question, assistant, result], "tools": [WEATHER_TOOL], "max_tokens": self.max_tokens}, headers
        )

    async def session(self) -> None:
        """A correction, thanks and a thumb: what makes training samples."""
        named = self.random.random() < 0.5
        session = f"soak-{self.index}-{self.count}-{self.random.getrandbits(32):08x}"
        headers = {"X-Session-Id": session} if named else None
        messages: list[dict[str, Any]] = []
        expected, last_turn = session if named else None, ""
        for line in [f"{self.tag()}: write a short note to my team about Friday.", CORRECTION, "thanks, perfect"]:
            messages.append({"role": "user", "content": line})
            message, last_turn, answered_in = await self.chat_request(
                "session", {"messages": messages, "max_tokens": self.max_tokens}, headers
            )
            if expected is not None and answered_in != expected:
                raise Failure(f"one conversation ({'named' if named else 'inferred'}) went from session {expected} "
                              f"to {answered_in} after {len(messages) // 2} answers")  # fmt: skip
            expected = answered_in
            messages.append({"role": "assistant", "content": message.get("content") or "", **(
                {"tool_calls": message["tool_calls"]} if message.get("tool_calls") else {})})  # fmt: skip
        if not named:
            self.seen.inferred_sessions += 1
        score = 1 if self.random.random() < 0.8 else -1
        body = {"session_id": session, "score": score} if named else {"turn": last_turn, "score": score}
        started = time.monotonic()
        self.events = []
        response = await self.http.post("/feedback", json=body, extensions=self.extensions)
        latency = time.monotonic() - started
        ok = response.status_code == 200
        self.seen.requests.append((self.seen.now(), latency, "feedback", ok))
        if not ok:
            raise Failure(f"feedback {response.status_code}: {response.text[:200]}")
        answer = response.json()
        if answer["turn"] != last_turn:
            raise Failure(f"feedback went to turn {answer['turn']}, not the session's last {last_turn}")
        self.seen.feedback[int(answer["id"])] = last_turn

    async def stream(self) -> None:
        body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": f"{self.tag()}: tell me a story"}],
                "max_tokens": self.max_tokens, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        started = time.monotonic()
        first_content: float | None = None
        async with self.http.stream("POST", "/chat/completions", json=body, extensions=self.extensions) as response:
            if response.status_code != 200:
                await response.aread()
                self.seen.requests.append((self.seen.now(), time.monotonic() - started, "stream", False))
                raise Failure(f"{response.status_code}: {response.text[:200]}")
            turn_id, version, _session = _headers_turn(response, "main")
            events, finish = [], None
            async for line in sse_lines(response):
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                events.append(data)
                if data == "[DONE]":
                    continue
                event = json.loads(data)
                if "error" in event:
                    raise Failure(f"error event in stream {turn_id}: {data[:200]}")
                if event["id"] != turn_id:
                    raise Failure(f"chunk id {event['id']} != X-Clawrl-Turn {turn_id}")
                for choice in event["choices"]:
                    if choice["delta"].get("content") and first_content is None:
                        first_content = time.monotonic() - started
                    finish = choice.get("finish_reason") or finish
        latency = time.monotonic() - started
        if not events or events[-1] != "[DONE]" or finish is None:
            self.seen.requests.append((self.seen.now(), latency, "stream", False))
            raise Failure(f"stream {turn_id} ended without a finish reason and [DONE] ({len(events)} events)")
        self.seen.requests.append((self.seen.now(), latency, "stream", True))
        self.seen.acknowledged[turn_id] = ("main", version)
        self.seen.versions_seen[version] += 1
        if first_content is not None:
            self.seen.ttft_s.append((self.seen.now(), first_content))

    async def hangup(self) -> None:
        """Read 1 to 3 events of a long stream, then close the connection."""
        body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": f"{self.tag()}: go on and on"}],
                "max_tokens": max(64, 4 * self.max_tokens), "stream": True}  # fmt: skip
        after = self.random.randint(1, 3)
        started = time.monotonic()
        async with self.http.stream("POST", "/chat/completions", json=body, extensions=self.extensions) as response:
            if response.status_code != 200:
                await response.aread()
                self.seen.requests.append((self.seen.now(), time.monotonic() - started, "hangup", False))
                raise Failure(f"{response.status_code}: {response.text[:200]}")
            turn_id, version, _session = _headers_turn(response, "main")
            read, finished = 0, False
            async for line in sse_lines(response):
                if line.startswith("data: "):
                    read += 1
                    data = line.removeprefix("data: ")
                    if data != "[DONE]" and any(c.get("finish_reason") for c in json.loads(data)["choices"]):
                        finished = True
                    if read >= after:
                        break
            # leaving the block unread closes the connection: the server sees the client go
        self.seen.requests.append((self.seen.now(), time.monotonic() - started, "hangup", True))
        if finished:  # the finish chunk came first: committed and acknowledged like any stream
            self.seen.hung_up_after_finish += 1
            self.seen.acknowledged[turn_id] = ("main", version)
        else:
            self.seen.hung_up[turn_id] = read
        self.seen.versions_seen[version] += 1


async def drive(base_url: str, clients: int, seconds: float, max_tokens: int, seed: int, keepalive_expiry_s: float,
                seen: Observed) -> float:
    """`clients` clients acting until `seconds` have passed (each finishes its current action); returns the wall time."""
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8, keepalive_expiry=keepalive_expiry_s)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=60.0)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits) as http:
        seen.started = time.monotonic()
        deadline = seen.started + seconds
        await asyncio.gather(*(Client(index, http, seen, max_tokens, seed).run(deadline) for index in range(clients)))
    return time.monotonic() - seen.started


# --------------------------------------------------------------------------- the processes, sampled


def proc_status(pid: int | None) -> dict[str, Any] | None:
    """VmRSS (MiB), open fds and threads of a live process; None when there is none."""
    if pid is None:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if fields.get("State", "").strip().startswith("Z"):
        return None
    return {"pid": pid, "rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1), "fds": fds,
            "threads": int(fields["Threads"])}  # fmt: skip


def children(pid: int) -> list[int]:
    """Child processes of `pid`, whichever of its threads started them."""
    found = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                found += [int(child) for child in (task / "children").read_text().split()]
            except FileNotFoundError:  # the thread ended while listing
                continue
    except FileNotFoundError:
        return []
    return found


def store_bytes(run_dir: Path) -> int:
    """The SQLite store on disk: the database and its write-ahead log."""
    return sum(path.stat().st_size for path in run_dir.glob("clawrl.db*") if path.is_file())


def version_dirs(root: Path) -> int:
    """How many version directories are under `root` (RUN_DIR/policy/LINEAGE/vN)."""
    return sum(1 for path in root.glob("*/v*") if path.is_dir()) if root.is_dir() else 0


def _kept(keep_versions: int | None) -> str:
    return f"--keep-versions {keep_versions}" if keep_versions is not None else "every one is kept"


def tree_bytes(root: Path) -> int:
    """Bytes of the files under `root` (the policy versions: every one, unless `--keep-versions`)."""
    total, stack = 0, [root]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except FileNotFoundError:  # a temporary version directory renamed away while listing
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat().st_size
            except FileNotFoundError:
                continue
    return total


class Sampler(threading.Thread):
    """Every `every_s`: the server's and the trainer's memory, fds and threads, the store's size,
    the served policy version (from /healthz) and the load average."""

    def __init__(self, server_pid: int, root: str, run_dir: Path, every_s: float) -> None:
        super().__init__(daemon=True, name="soak-sampler")
        self.server_pid, self.root, self.run_dir, self.every_s = server_pid, root, run_dir, every_s
        self.stop, self.samples, self.started = threading.Event(), [], time.monotonic()
        self.healthz_failures: list[str] = []

    def sample(self) -> dict[str, Any]:
        try:
            health = httpx.get(self.root + "/healthz", timeout=30).json()
        except (httpx.HTTPError, ValueError) as error:
            self.healthz_failures.append(repr(error))
            health = {}
        trainer_pids = children(self.server_pid)
        trainer_pid = (health.get("trainer") or {}).get("pid") or (trainer_pids[0] if trainer_pids else None)
        return {
            "t_s": round(time.monotonic() - self.started, 2),
            "load_average": [round(value, 2) for value in os.getloadavg()],
            "server": proc_status(self.server_pid),
            "trainer": proc_status(trainer_pid),
            "children": len(trainer_pids),
            "store_bytes": store_bytes(self.run_dir),
            "policy_bytes": tree_bytes(self.run_dir / "policy"),
            "policy_version": health.get("policy_version"),
            "trainer_restarts": (health.get("trainer") or {}).get("restarts"),
        }

    def run(self) -> None:
        while True:
            self.samples.append(self.sample())
            if self.stop.wait(self.every_s):
                return


# --------------------------------------------------------------------------- the store, checked


def check_turns(run_dir: Path, expected: dict[str, tuple[str, int]], cancelled_ok: bool) -> dict[str, Any]:
    """Look up every turn id of `expected` (id -> (kind, version)) in the store: how many are there,
    missing, of another kind or version, or (unless `cancelled_ok`) marked cancelled."""
    store = Store.for_run_dir(run_dir)
    found: dict[str, tuple[str, int, str]] = {}
    ids = list(expected)
    try:
        with store.read() as db:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                query = db.query(TurnRow.id, TurnRow.kind, TurnRow.policy_version, TurnRow.finish_reason).filter(TurnRow.id.in_(chunk))
                found.update({row[0]: (row[1], row[2], row[3]) for row in query})
    finally:
        store.close()
    missing = [turn_id for turn_id in ids if turn_id not in found]
    wrong_kind = [turn_id for turn_id, (kind, _v) in expected.items() if turn_id in found and found[turn_id][0] != kind]
    wrong_version = [turn_id for turn_id, (_k, version) in expected.items() if version >= 0 and turn_id in found
                     and found[turn_id][1] != version]  # fmt: skip
    finish = Counter(found[turn_id][2] for turn_id in found)
    cancelled = [turn_id for turn_id in found if found[turn_id][2] == "cancelled"]
    return {
        "expected": len(ids), "found": len(found), "missing": len(missing), "missing_ids": missing[:20],
        "wrong_kind": len(wrong_kind), "wrong_version": len(wrong_version),
        "cancelled": len(cancelled), "unexpectedly_cancelled": 0 if cancelled_ok else len(cancelled),
        "finish_reasons": dict(finish),
    }  # fmt: skip


def check_feedback(run_dir: Path, feedback: dict[int, str]) -> dict[str, Any]:
    store = Store.for_run_dir(run_dir)
    try:
        with store.read() as db:
            rows = dict(db.query(FeedbackRow.id, FeedbackRow.turn_id).all())
    finally:
        store.close()
    missing = [fid for fid, turn_id in feedback.items() if rows.get(fid) != turn_id]
    return {"expected": len(feedback), "found": len(feedback) - len(missing), "missing": len(missing)}


def table_counts(run_dir: Path) -> dict[str, int]:
    """Rows of every table of the store (read-only)."""
    with sqlite3.connect(f"file:{run_dir / 'clawrl.db'}?mode=ro", uri=True, timeout=30) as db:
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        counts = {table: db.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0] for table in tables}
        counts["turns_cancelled"] = db.execute("SELECT COUNT(*) FROM turns WHERE finish_reason = 'cancelled'").fetchone()[0]
        counts["samples_by_status"] = dict(db.execute("SELECT status, COUNT(*) FROM samples GROUP BY status").fetchall())
    return counts


def pipeline(run_dir: Path, load_started_wall: float, seconds: float, count: int) -> dict[str, Any]:
    """How judging and training kept up, per `count`-th of the run, from the store (read-only): the
    main turns that became judgeable in the window (a next state or feedback arrived), how many
    were judged by the end and how long after they became judgeable (the judge's lag), what their
    samples became, and the versions published in the window."""
    with sqlite3.connect(f"file:{run_dir / 'clawrl.db'}?mode=ro", uri=True, timeout=30) as db:
        rows = db.execute(
            "SELECT n.created_at, f.created_at, j.created_at, s.status, s.drop_reason FROM turns t "
            "LEFT JOIN next_states n ON n.turn_id = t.id "
            "LEFT JOIN (SELECT turn_id, MIN(created_at) AS created_at FROM feedback GROUP BY turn_id) f ON f.turn_id = t.id "
            "LEFT JOIN judgments j ON j.turn_id = t.id LEFT JOIN samples s ON s.turn_id = t.id "
            "WHERE t.kind = 'main' AND (n.turn_id IS NOT NULL OR f.turn_id IS NOT NULL)"
        ).fetchall()
        published = [row[0] for row in db.execute("SELECT created_at FROM policy_versions")]
        outcomes = {f"{status}{'/' + reason if reason else ''}": number for status, reason, number in
                    db.execute("SELECT status, drop_reason, COUNT(*) FROM samples GROUP BY status, drop_reason")}  # fmt: skip
    width = seconds / count
    table = []
    for index in range(count):
        low, high = index * width, (index + 1) * width if index < count - 1 else math.inf

        def in_window(at: float) -> bool:
            return low <= at - load_started_wall < high  # noqa: B023 - used at once

        mine = [row for row in rows if in_window(min(at for at in row[:2] if at is not None))]
        lags = sorted(row[2] - min(at for at in row[:2] if at is not None) for row in mine if row[2] is not None)
        table.append({
            "window": index + 1, "judgeable": len(mine), "judged": len(lags),
            "judge_lag_p50_s": round(statistics.median(lags), 1) if lags else None,
            "judge_lag_max_s": round(lags[-1], 1) if lags else None,
            "trained": sum(1 for row in mine if row[3] == "trained"),
            "dropped_stale": sum(1 for row in mine if row[4] == "stale"),
            "versions_published": sum(1 for at in published if in_window(at)),
        })  # fmt: skip
    unjudged = sum(1 for row in rows if row[2] is None)
    return {"windows": table, "unjudged_at_end": unjudged, "judgeable": len(rows), "sample_outcomes": outcomes}


# --------------------------------------------------------------------------- figures


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of sorted values: one that was really observed."""
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def latency_stats(values: list[float]) -> dict[str, Any]:
    ms = sorted(value * 1000 for value in values)
    if not ms:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 1), "p99_ms": round(percentile(ms, 0.99), 1),
            "max_ms": round(ms[-1], 1)}  # fmt: skip


def process_figure(samples: list[dict[str, Any]], which: str, key: str) -> list[float]:
    return [sample[which][key] for sample in samples if sample[which] is not None]


def windows(seen: Observed, samples: list[dict[str, Any]], seconds: float, count: int, load_offset_s: float) -> list[dict[str, Any]]:
    """Per `count`-th of the run: requests, failures, latency and the processes' figures. A request
    belongs to the window it completed in (those finishing after the deadline to the last)."""
    width = seconds / count
    rows = []
    for index in range(count):
        low, high = index * width, (index + 1) * width if index < count - 1 else math.inf
        done = [row for row in seen.requests if low <= row[0] < high]
        completed = [row[1] for row in done if row[3] and row[2] not in ("hangup", "feedback")]
        failed = sum(1 for failure in seen.failures if low <= failure["t_s"] < high)
        in_window = [s for s in samples if low <= s["t_s"] - load_offset_s < high]
        row: dict[str, Any] = {
            "window": index + 1, "from_s": round(low), "requests": len(done), "failures": failed,
            **latency_stats(completed),
            "ttft_p50_ms": latency_stats([t for at, t in seen.ttft_s if low <= at < high])["p50_ms"],
        }  # fmt: skip
        for which in ("server", "trainer"):
            for key in ("rss_mib", "fds", "threads"):
                values = process_figure(in_window, which, key)
                row[f"{which}_{key}"] = max(values) if values else None
        versions = [s["policy_version"] for s in in_window if s["policy_version"] is not None]
        row["served_version"] = versions[-1] if versions else None
        row["store_mib"] = round(in_window[-1]["store_bytes"] / 2**20, 2) if in_window else None
        row["policy_mib"] = round(in_window[-1]["policy_bytes"] / 2**20, 1) if in_window else None
        row["load_average_1m"] = in_window[-1]["load_average"][0] if in_window else None
        rows.append(row)
    return rows


def growth(samples: list[dict[str, Any]], which: str, key: str, load_offset_s: float, seconds: float) -> dict[str, Any]:
    """A process figure at its first and last tenth of the load (the median of the samples in each), and its maximum."""
    tenth = seconds / 10
    during = [s for s in samples if s[which] is not None and 0 <= s["t_s"] - load_offset_s]
    first = [s[which][key] for s in during if s["t_s"] - load_offset_s < tenth]
    last = [s[which][key] for s in during if s["t_s"] - load_offset_s >= seconds - tenth]
    if not first or not last:
        return {"first": None, "last": None, "growth": None, "max": None}
    start, end = statistics.median(first), statistics.median(last)
    return {"first": start, "last": end, "growth": round(end - start, 1), "max": max(s[which][key] for s in during)}


# --------------------------------------------------------------------------- the run


def start_server(args: argparse.Namespace, model_dir: Path, run_dir: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "clawrl.cli", "serve", "--model", str(model_dir), "--device", "cpu", "--cpu-threads", "1",
        "--run-dir", str(run_dir), "--port", str(port), "--served-model-name", SERVED_NAME,
        "--method", "combine", "--batch-size", str(args.batch_size), "--judge-poll-s", "0.1", "--policy-poll-s", "0.25",
        "--train-poll-s", "0.5", "--session-idle-timeout-s", str(args.session_idle_timeout_s),
    ]  # fmt: skip
    if args.keep_versions is not None:
        command += ["--keep-versions", str(args.keep_versions), "--keep-versions-grace-s", str(args.keep_versions_grace_s)]
    with log_path.open("wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(root: str, server: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"clawrl serve exited with code {server.returncode} before answering")
        try:
            health = httpx.get(root + "/healthz", timeout=5).json()
            if (health.get("trainer") or {}).get("running"):
                return health
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"clawrl serve did not answer /healthz with a running trainer within {timeout_s:.0f} s")


def stop_server(server: subprocess.Popen[bytes], timeout_s: float = 90.0) -> dict[str, Any]:
    """SIGTERM, as an operator stops it; the time it took and its exit code."""
    started = time.monotonic()
    server.send_signal(signal.SIGTERM)
    try:
        code = server.wait(timeout_s)
    except subprocess.TimeoutExpired:
        server.kill()
        code = server.wait()
        return {"exit_code": code, "stop_s": round(time.monotonic() - started, 2), "killed": True}
    return {"exit_code": code, "stop_s": round(time.monotonic() - started, 2), "killed": False}


def log_problems(log_path: Path) -> dict[str, Any]:
    """Errors and tracebacks in the server's log (warnings are counted, not listed)."""
    lines = log_path.read_text(errors="replace").splitlines()

    def level(line: str) -> str:
        if line.startswith("{"):  # --log-format json
            try:
                return str(json.loads(line).get("level", "")).upper()
            except ValueError:
                return ""
        return next((name for name in ("CRITICAL", "ERROR", "WARNING") if f" {name} " in line), "")

    errors = [line for line in lines if level(line) in ("ERROR", "CRITICAL") or line.startswith("Traceback")]
    warnings = [line for line in lines if level(line) == "WARNING"]
    return {"lines": len(lines), "errors": len(errors), "error_lines": errors[:20], "warnings": len(warnings),
            "warning_lines": warnings[:10]}  # fmt: skip


def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    model_dir = build_tiny_model(scratch / "model", seed=0) if args.model == "tiny" else Path(args.model)
    run_dir = Path(args.run_dir) if args.run_dir else scratch / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    root = f"http://127.0.0.1:{port}"
    log_path = run_dir / "serve.log"
    seconds = args.minutes * 60
    every_s = args.sample_s or min(30.0, max(2.0, seconds / 100))
    launched = time.monotonic()
    server = start_server(args, model_dir, run_dir, port, log_path)
    sampler = Sampler(server.pid, root, run_dir, every_s)
    seen = Observed(started=time.monotonic())
    try:
        health = wait_ready(root, server, args.start_timeout_s)
        ready_s = time.monotonic() - launched
        sampler.start()
        load_offset_s = time.monotonic() - sampler.started
        load_started_wall = time.time()
        wall_s = asyncio.run(drive(root + "/v1", args.clients, seconds, args.max_tokens, args.seed, args.keepalive_expiry_s, seen))
        drained_at_s = time.monotonic() - sampler.started
        # the load has stopped; the server still runs: every acknowledged answer must be in the store now
        acknowledged = check_turns(run_dir, seen.acknowledged, cancelled_ok=False)
        feedback = check_feedback(run_dir, seen.feedback)
        hung_up_running = check_turns(run_dir, {turn_id: ("main", -1) for turn_id in seen.hung_up}, cancelled_ok=True)
        # let the trainer and serving catch up with what is queued, briefly, for the version figures
        time.sleep(args.settle_s)
        metrics_text = httpx.get(root + "/metrics", timeout=60).text
        final_health = httpx.get(root + "/healthz", timeout=60).json()
    finally:
        sampler.stop.set()
        sampler.join(timeout=60)
        stopped = stop_server(server) if server.poll() is None else {"exit_code": server.returncode, "stop_s": 0, "killed": False}
    hung_up = check_turns(run_dir, {turn_id: ("main", -1) for turn_id in seen.hung_up}, cancelled_ok=True)
    store = Store.for_run_dir(run_dir)
    try:
        versions = store.training.versions()
    finally:
        store.close()
    samples = sampler.samples
    counts = table_counts(run_dir)
    judging_and_training = pipeline(run_dir, load_started_wall, seconds, args.windows)
    by_kind: dict[str, list[float]] = defaultdict(list)
    for _at, latency, kind, ok in seen.requests:
        if ok:
            by_kind[kind].append(latency)
    served_by_healthz = sorted({s["policy_version"] for s in samples if s["policy_version"] is not None})
    return {
        "ready_s": round(ready_s, 1),
        "load_s": round(wall_s, 1),
        "drained_at_s": round(drained_at_s, 1),
        "actions": dict(seen.actions),
        "requests": {
            "total": len(seen.requests),
            "by_kind": dict(Counter(row[2] for row in seen.requests)),
            "per_s": round(len(seen.requests) / wall_s, 2),
            "latency_by_kind": {kind: latency_stats(values) for kind, values in sorted(by_kind.items())},
            "stream_ttft": latency_stats([t for _at, t in seen.ttft_s]),
        },
        "failures": len(seen.failures) + len(sampler.healthz_failures),
        "failures_by_cause": dict(Counter(failure["cause"] for failure in seen.failures)),
        "failure_list": seen.failures[:50],
        "healthz_failures": sampler.healthz_failures[:10],
        "acknowledged_turns": acknowledged,
        "acknowledged_feedback": feedback,
        "hung_up": {
            "streams": len(seen.hung_up) + seen.hung_up_after_finish,
            "after_finish_chunk": seen.hung_up_after_finish,
            "recorded_while_running": hung_up_running["found"],
            "recorded_after_stop": hung_up["found"],
            "missing_after_stop": hung_up["missing"],
            "missing_ids": hung_up["missing_ids"],
            "finish_reasons": hung_up["finish_reasons"],
        },
        "inferred_sessions": seen.inferred_sessions,
        "tool_calls_by_model": seen.tool_calls_by_model,
        "windows": windows(seen, samples, seconds, args.windows, load_offset_s),
        "growth": {
            f"{which}_{key}": growth(samples, which, key, load_offset_s, seconds)
            for which in ("server", "trainer") for key in ("rss_mib", "fds", "threads")
        },
        "store": {
            "bytes": store_bytes(run_dir),
            "bytes_per_turn": round(store_bytes(run_dir) / max(1, counts.get("turns", 0))),
            "rows": counts,
        },
        "pipeline": judging_and_training,
        "policy_dir": {
            "bytes": tree_bytes(run_dir / "policy"),
            "bytes_per_version": round(tree_bytes(run_dir / "policy") / max(1, len(versions))),
            "keep_versions": args.keep_versions,
            "versions_on_disk": version_dirs(run_dir / "policy"),
            # [seconds since the sampler started, bytes under policy/]: bounded with --keep-versions
            "policy_dir_bytes": [[sample["t_s"], sample["policy_bytes"]] for sample in samples],
        },
        "versions": {
            "published": len(versions),
            "served_by_healthz": served_by_healthz,
            "seen_in_answers": dict(sorted(seen.versions_seen.items())),
            "final_policy_version": final_health.get("policy_version"),
            "trainer": final_health.get("trainer"),
            "publish_to_served_mean_s": publish_to_served_mean(metrics_text),
        },
        "server_stop": stopped,
        "server_log": log_problems(log_path),
        "samples": samples,
    }


def publish_to_served_mean(metrics_text: str) -> float | None:
    figures = {}
    for line in metrics_text.splitlines():
        for suffix in ("sum", "count"):
            if line.startswith(f"clawrl_policy_publish_to_served_seconds_{suffix} "):
                figures[suffix] = float(line.split()[1])
    if not figures.get("count"):
        return None
    return round(figures["sum"] / figures["count"], 3)


def markdown(results: dict[str, Any]) -> str:
    args, machine_info = results["args"], results["machine"]
    requests = results["requests"]
    lines = [
        f"{args['clients']} clients, {args['minutes']:g} min, max_tokens={args['max_tokens']}, trainer batch size "
        f"{args['batch_size']}; load average at start {machine_info['load_average_start']}, at end "
        f"{machine_info['load_average_end']}; server ready in {results['ready_s']} s.",
        "",
        f"**Requests** {requests['total']} ({requests['per_s']}/s): "
        + ", ".join(f"{kind} {count}" for kind, count in sorted(requests["by_kind"].items()))
        + f". **Failures: {results['failures']}** {results['failures_by_cause'] or ''}.",
        "",
        "| window | from (s) | requests | failures | p50 (ms) | p99 (ms) | stream TTFT p50 (ms) | server RSS (MiB) | server fds | "
        "trainer RSS (MiB) | trainer fds | served version | store (MiB) | policy/ (MiB) | load 1m |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results["windows"]:
        cells = [row["window"], row["from_s"], row["requests"], row["failures"], row["p50_ms"], row["p99_ms"], row["ttft_p50_ms"],
                 row["server_rss_mib"], row["server_fds"], row["trainer_rss_mib"], row["trainer_fds"], row["served_version"],
                 row["store_mib"], row["policy_mib"], row["load_average_1m"]]  # fmt: skip
        formats = ["{}", "{}", "{}", "{}", "{:.0f}", "{:.0f}", "{:.0f}", "{:.0f}", "{}", "{:.0f}", "{}", "{}", "{:.1f}", "{:.0f}", "{:.2f}"]
        lines.append("| " + " | ".join("–" if cell is None else form.format(cell) for form, cell in zip(formats, cells)) + " |")
    flow = results["pipeline"]
    lines += ["", "| window | judgeable turns | judged | judge lag p50 (s) | judge lag max (s) | samples trained | dropped stale | "
              "versions published |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in flow["windows"]:
        lines.append("| " + " | ".join("–" if row[key] is None else str(row[key]) for key in (
            "window", "judgeable", "judged", "judge_lag_p50_s", "judge_lag_max_s", "trained", "dropped_stale",
            "versions_published")) + " |")  # fmt: skip
    lines += ["", f"Unjudged at the end: {flow['unjudged_at_end']} of {flow['judgeable']} judgeable turns; samples: "
              f"{flow['sample_outcomes']}."]
    lines += ["", "| process figure | first tenth | last tenth | growth | max |", "|---|---:|---:|---:|---:|"]
    for name, figure in results["growth"].items():
        lines.append(f"| {name} | {figure['first']} | {figure['last']} | {figure['growth']} | {figure['max']} |".replace("None", "–"))
    ack, hung, store, versions = results["acknowledged_turns"], results["hung_up"], results["store"], results["versions"]
    rows = store["rows"]
    lines += [
        "",
        "| latency by kind | n | p50 (ms) | p99 (ms) | max (ms) |",
        "|---|---:|---:|---:|---:|",
        *(f"| {kind} | {s['n']} | {s['p50_ms']} | {s['p99_ms']} | {s['max_ms']} |" for kind, s in requests["latency_by_kind"].items()),
        "",
        f"- Acknowledged turns in the store: **{ack['found']} of {ack['expected']}** (missing {ack['missing']}, other kind "
        f"{ack['wrong_kind']}, other version {ack['wrong_version']}, marked cancelled {ack['unexpectedly_cancelled']}); "
        f"acknowledged feedback: {results['acknowledged_feedback']['found']} of {results['acknowledged_feedback']['expected']}.",
        f"- Hung-up streams: {hung['streams']} ({hung['after_finish_chunk']} after the finish chunk, counted as acknowledged); "
        f"of the other {hung['streams'] - hung['after_finish_chunk']}, recorded {hung['recorded_after_stop']} "
        f"({hung['recorded_while_running']} already when the load stopped), missing {hung['missing_after_stop']}; "
        f"finish reasons {hung['finish_reasons']}.",
        f"- Store: {store['bytes'] / 2**20:.1f} MiB ({store['bytes_per_turn']} bytes per turn); turns {rows.get('turns')} "
        f"(cancelled {rows.get('turns_cancelled')}), sessions {rows.get('sessions')}, next states {rows.get('next_states')}, "
        f"judgments {rows.get('judgments')}, feedback {rows.get('feedback')}, samples {rows.get('samples_by_status')}.",
        f"- Policy versions on disk ({_kept(results['policy_dir']['keep_versions'])}): "
        f"{results['policy_dir']['versions_on_disk']} directories, {results['policy_dir']['bytes'] / 2**20:.1f} MiB at the "
        f"end, at most {max((b for _, b in results['policy_dir']['policy_dir_bytes']), default=0) / 2**20:.1f} MiB "
        f"sampled; {results['policy_dir']['bytes_per_version'] / 1024:.0f} KiB per version published.",
        f"- Versions: {versions['published']} published; served (by /healthz) {versions['served_by_healthz'][:3]}…"
        f"{versions['served_by_healthz'][-3:]} ({len(versions['served_by_healthz'])} seen); answers by version "
        f"{len(versions['seen_in_answers'])} distinct; publish to served mean {versions['publish_to_served_mean_s']} s; "
        f"trainer {versions['trainer']}.",
        f"- Sessions of unmodified clients (inferred): {results['inferred_sessions']}. Tool calls the model made itself: "
        f"{results['tool_calls_by_model']}.",
        f"- Server: stopped by SIGTERM in {results['server_stop']['stop_s']} s, exit code {results['server_stop']['exit_code']}; "
        f"log: {results['server_log']['errors']} errors, {results['server_log']['warnings']} warnings.",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients")
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the clients keep going")
    parser.add_argument("--max-tokens", type=int, default=16, help="max_tokens of each request (hang-ups ask for 4x, at least 64)")
    parser.add_argument("--model", default="tiny", help="'tiny' (built locally into a temp dir) or a Hugging Face model directory")
    parser.add_argument("--batch-size", type=int, default=4, help="trainer batch size (a version every this many samples)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the clients' choices")
    parser.add_argument("--windows", type=int, default=10, help="report the run in this many equal windows")
    parser.add_argument("--sample-s", type=float, default=None, help="sampling period of the processes (default: 1%% of the run, 2-30 s)")
    parser.add_argument("--session-idle-timeout-s", type=float, default=120.0, help="serve's idle timeout (short, so idle sessions are closed during the run)")
    parser.add_argument("--keepalive-expiry-s", type=float, default=5.0,
                        help="the clients' keep-alive expiry (httpx's and the openai SDK's default is 5 s, the same as the server's "
                             "keep-alive timeout: see `keep-alive race`)")
    parser.add_argument("--settle-s", type=float, default=5.0, help="pause after the load before reading the final versions")
    parser.add_argument("--start-timeout-s", type=float, default=300.0, help="how long clawrl serve may take to answer with its trainer running")
    parser.add_argument("--keep-versions", type=int, default=None,
                        help="serve's --keep-versions K (default: keep every version, as clawrl does by default)")
    parser.add_argument("--keep-versions-grace-s", type=float, default=60.0, help="serve's --keep-versions-grace-s")
    parser.add_argument("--run-dir", default=None, help="keep the run here (default: a temp dir, removed)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/soak.json"), help="JSON results")
    parser.add_argument("--json", action="store_true", help="print the JSON results instead of the markdown tables")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    load_start = [round(value, 2) for value in os.getloadavg()]  # the machine may be shared
    with tempfile.TemporaryDirectory(prefix="clawrl-soak-") as scratch:
        results = run(args, Path(scratch))
    results = {
        "benchmark": "soak",
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "args": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "machine": machine(load_average_start=load_start, load_average_end=[round(value, 2) for value in os.getloadavg()]),
        "elapsed_s": round(time.perf_counter() - started, 1),
        **results,
    }
    print(json.dumps(results, indent=2) if args.json else markdown(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    if not args.json:
        print(f"\nwrote {args.out}")
    ok = results["failures"] == 0 and results["acknowledged_turns"]["missing"] == 0 and results["hung_up"]["missing_after_stop"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
