"""The `openai` judge backend against a scripted OpenAI-compatible judge server on localhost.

The server is a real HTTP server in a thread, so the backend's timeouts, retries and status
handling run over real sockets. Each test scripts what the server answers to PRM calls and to
hint calls (told apart by their system prompt): an output, an HTTP status, or a hang.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import json
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from clawrl.cli import build_parser, config_from_args
from clawrl.config import JudgeConfig
from clawrl.judge.openai_backend import OpenAIJudge
from clawrl.judge.prompts import PRM_SYSTEM
from clawrl.judge.types import BackendVerdict
from clawrl.judge.worker import JudgeWorker, build_backend
from clawrl.store import Store
from clawrl.store.inspect import session_detail
from clawrl.types import NextState, TurnContext
from tests.helpers import record, turn, user

MODEL = "scripted-judge"
PLAIN_PROSE = "Answer in plain prose, without headings or bullet points."
SHORTER = "Keep the note under one hundred words."


@dataclass(frozen=True)
class Hang:
    """Answer only after `seconds`: longer than the client's call timeout."""

    seconds: float


Action = str | int | Hang  # an output to return, an HTTP error status, or a hang


class ScriptedJudge:
    """What the judge server answers: scripted actions first, then a neutral default."""

    def __init__(self) -> None:
        self.prm: deque[Action] = deque()
        self.hint: deque[Action] = deque()
        self.requests: list[dict[str, Any]] = []  # each body, with the auth header under "_auth"
        self.delay_s = 0.0
        self.lock = threading.Lock()
        self.url = ""

    def script(self, prm: Iterable[Action] = (), hint: Iterable[Action] = ()) -> None:
        self.prm.extend(prm)
        self.hint.extend(hint)

    def prm_requests(self) -> list[dict[str, Any]]:
        return [body for body in self.requests if body["messages"][0]["content"] == PRM_SYSTEM]

    def next_action(self, body: dict[str, Any], auth: str | None) -> Action:
        with self.lock:
            self.requests.append({**body, "_auth": auth})
            is_prm = body["messages"][0]["content"] == PRM_SYSTEM
            queue = self.prm if is_prm else self.hint
            # defaults: a neutral PRM vote, and a hint judge with nothing to say
            return queue.popleft() if queue else ("Nothing either way. \\boxed{0}" if is_prm else "\\boxed{-1}")


def _handler(judge: ScriptedJudge) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            action = judge.next_action(body, self.headers.get("Authorization"))
            time.sleep(judge.delay_s)
            if isinstance(action, Hang):
                time.sleep(action.seconds)
                action = "too late \\boxed{1}"
            status, payload = (
                (action, {"error": {"message": "scripted"}})
                if isinstance(action, int)
                else (200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": action}}]})
            )
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up on a hang
                pass

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

    return Handler


@pytest.fixture
def judge_server() -> Iterator[ScriptedJudge]:
    judge = ScriptedJudge()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(judge))
    judge.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield judge
    server.shutdown()
    server.server_close()


def backend(server: ScriptedJudge, votes: int = 1, **options: Any) -> OpenAIJudge:
    """Short timeouts and back-off keep the retry tests fast."""
    return OpenAIJudge(server.url, MODEL, votes=votes, call_timeout_s=0.3, backoff_s=0.01, **options)


def case() -> TurnContext:
    answered = turn("t1", "s1", [user("Write a short note to my team about Friday.")], "**Friday**\n1. Meeting at 10")
    return TurnContext(answered, NextState("t1", [user("too AI-like, rewrite it without the bold")], "t2"), feedback=[])


def judge(judge_backend: OpenAIJudge) -> BackendVerdict:
    return asyncio.run(judge_backend.judge(case()))


def sorted_votes(votes: list[int | None]) -> list[int | None]:
    """Votes come back in the order the concurrent calls reached the server."""
    return sorted(votes, key=lambda vote: (vote is None, vote or 0))


def test_the_majority_of_three_votes_wins(judge_server: ScriptedJudge) -> None:
    judge_server.script(prm=["The user asks for a redo. \\boxed{-1}", "A correction. \\boxed{-1}", "\\boxed{1}"])
    verdict = judge(backend(judge_server, votes=3, api_key="secret", temperature=0.7, max_tokens=64))
    assert verdict.score == -1
    assert sorted_votes(verdict.votes) == [-1, -1, 1]
    assert verdict.rationale is not None and verdict.rationale.endswith("\\boxed{-1}")
    assert len(judge_server.prm_requests()) == 3 and len(judge_server.requests) == 6  # 3 PRM + 3 hint calls
    sent = judge_server.prm_requests()[0]
    assert (sent["model"], sent["temperature"], sent["max_tokens"], sent["_auth"]) == (MODEL, 0.7, 64, "Bearer secret")
    assert "rewrite it without the bold" in sent["messages"][1]["content"]


def test_a_tie_scores_zero(judge_server: ScriptedJudge) -> None:
    judge_server.script(prm=["\\boxed{1}", "\\boxed{-1}", "I would say it went fine overall."])
    verdict = judge(backend(judge_server, votes=3))
    assert verdict.score == 0
    assert sorted_votes(verdict.votes) == [-1, 1, None]


def test_garbage_outputs_are_invalid_votes_and_score_zero(judge_server: ScriptedJudge) -> None:
    judge_server.script(prm=["", "\\boxed{maybe}", "score: -1"])
    verdict = judge(backend(judge_server, votes=3))
    assert verdict.score == 0
    assert verdict.votes == [None, None, None]


def test_a_500_is_retried(judge_server: ScriptedJudge) -> None:
    judge_server.script(prm=[500, 503, "\\boxed{-1}"])
    verdict = judge(backend(judge_server))
    assert verdict.score == -1 and verdict.votes == [-1]
    assert len(judge_server.prm_requests()) == 3


def test_a_hanging_call_times_out_and_is_retried(judge_server: ScriptedJudge) -> None:
    judge_server.script(prm=[Hang(2.0), "\\boxed{-1}"])
    started = time.perf_counter()
    verdict = judge(backend(judge_server))
    assert verdict.score == -1  # not the hung call's late \boxed{1}
    assert time.perf_counter() - started < 1.5
    assert len(judge_server.prm_requests()) == 2


def test_giving_up_after_the_last_attempt(judge_server: ScriptedJudge) -> None:
    judge_server.script(prm=[502, 502, 502])
    with pytest.raises(httpx.HTTPStatusError):
        judge(backend(judge_server, attempts=3))
    assert len(judge_server.prm_requests()) == 3


def test_a_400_is_not_retried_and_the_turn_is_given_back(judge_server: ScriptedJudge, tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("q")], "A.")
    record(store, "t2", "s1", [user("no, wrong")], "B.", continues_turn_id="t1", next_state=[user("no, wrong")])
    judge_server.script(prm=[400])
    worker = JudgeWorker(store, backend(judge_server), JudgeConfig())
    assert asyncio.run(worker.judge_available()) == 0
    assert len(judge_server.prm_requests()) == 1
    assert store.judging.judgment("t1") is None
    # the lease was released, not left to expire (300 s): the next round judges the turn
    judge_server.script(prm=["\\boxed{-1}"])
    assert asyncio.run(worker.judge_available()) == 1
    assert store.judging.judgment("t1").score == -1


def test_valid_hints_are_candidates_and_a_short_one_is_dropped(judge_server: ScriptedJudge) -> None:
    judge_server.script(
        hint=[
            f"\\boxed{{1}}\n[HINT_START]{PLAIN_PROSE}[HINT_END]",
            f"\\boxed{{1}}\n[HINT_START] {SHORTER} [HINT_END]",
            "\\boxed{1}\n[HINT_START]fix it[HINT_END]",
        ]
    )
    verdict = judge(backend(judge_server, votes=3))
    assert sorted(verdict.hint_candidates) == sorted([PLAIN_PROSE, SHORTER])


def test_the_worker_stores_votes_score_hint_and_judge_model(judge_server: ScriptedJudge, tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    correction = "too AI-like, rewrite it without the bold and the numbered list"
    record(store, "t1", "s1", [user("Write a short note to my team about Friday.")], "**Friday**\n1. Meeting")
    record(store, "t2", "s1", [user(correction)], "Friday: meeting.", continues_turn_id="t1", next_state=[user(correction)])
    judge_server.script(
        prm=["The user asks for a rewrite. \\boxed{-1}", "A redo request. \\boxed{-1}", "Moving on. \\boxed{1}"],
        hint=[f"\\boxed{{1}} [HINT_START]{PLAIN_PROSE}[HINT_END]", "\\boxed{-1}", "\\boxed{-1}"],
    )
    config = JudgeConfig(judge="openai", judge_url=judge_server.url, judge_model=MODEL, prm_m=3)
    worker = JudgeWorker(store, build_backend(config), config)
    assert asyncio.run(worker.judge_available()) == 1
    judgment = store.judging.judgment("t1")
    assert judgment.score == -1 and sorted_votes(judgment.votes) == [-1, -1, 1]
    assert judgment.hint == PLAIN_PROSE
    assert judgment.source == "prm" and judgment.judge_model == MODEL
    assert judgment.rationale.endswith("\\boxed{-1}")
    shown = session_detail(store, "s1")["turns"][0]["judgment"]
    assert shown == {"score": -1, "votes": judgment.votes, "hint": PLAIN_PROSE, "source": "prm"}


def test_two_workers_on_one_store_judge_each_turn_once(judge_server: ScriptedJudge, tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    answers = [f"Answer number {index}." for index in range(9)]
    record(store, "t0", "s1", [user("q0")], answers[0])
    for index in range(1, len(answers)):
        reply = [user(f"q{index}")]
        record(store, f"t{index}", "s1", reply, answers[index], continues_turn_id=f"t{index - 1}", next_state=reply)
    judgeable = [f"t{index}" for index in range(len(answers) - 1)]  # the last turn has no next state
    judge_server.delay_s = 0.05  # calls overlap, so both workers are mid-judgment at once
    config = JudgeConfig(judge="openai", judge_url=judge_server.url, judge_model=MODEL, judge_concurrency=2)
    workers = [JudgeWorker(store, build_backend(config), config) for _ in range(2)]

    async def until_all_judged(worker: JudgeWorker) -> None:
        deadline = time.monotonic() + 10
        while not all(await asyncio.to_thread(lambda: [store.judging.judgment(turn_id) for turn_id in judgeable])):
            assert time.monotonic() < deadline, "turns left unjudged"
            if not await worker.judge_available():
                await asyncio.sleep(0.01)

    async def both() -> None:
        await asyncio.gather(*(until_all_judged(worker) for worker in workers))

    asyncio.run(both())
    assert sum(worker.judged for worker in workers) == len(judgeable)
    assert all(worker.judged > 0 for worker in workers)
    judged_answers = [body["messages"][1]["content"] for body in judge_server.prm_requests()]
    for answer in answers[:-1]:  # one worker judged it: its m votes, and no second set
        assert sum(answer in content for content in judged_answers) == config.prm_m == 3, answer


def test_openai_needs_a_url_and_a_model() -> None:
    with pytest.raises(ValueError, match="--judge-url and --judge-model"):
        build_backend(JudgeConfig(judge="openai", judge_model=MODEL))


def test_cli_flags_configure_the_openai_judge() -> None:
    args = build_parser().parse_args(
        ["judge", "--judge", "openai", "--judge-url", "http://judge:8000/v1/", "--judge-model", MODEL, "--prm-m", "3"]
    )
    judge_backend = build_backend(config_from_args(JudgeConfig, args))
    assert isinstance(judge_backend, OpenAIJudge)
    assert (judge_backend.name, judge_backend.url, judge_backend.votes) == (MODEL, "http://judge:8000/v1", 3)


def test_a_worker_killed_mid_judgment_leaves_the_turn_to_a_restarted_worker(judge_server: ScriptedJudge, tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("Write a short note to my team about Friday.")], "**Friday**")
    record(store, "t2", "s1", [user("no, rewrite it")], "Friday.", continues_turn_id="t1", next_state=[user("no, rewrite it")])
    judge_server.script(prm=[Hang(30)])  # the first worker's call hangs: it is mid-judgment when killed
    command = [sys.executable, "-m", "clawrl.cli", "judge", "--run-dir", str(tmp_path), "--judge", "openai",
               "--judge-url", judge_server.url, "--judge-model", MODEL, "--judge-lease-s", "4", "--judge-poll-s", "0.05"]
    worker_process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not judge_server.prm_requests():  # the judge call is in flight
            assert time.monotonic() < deadline and worker_process.poll() is None, "the worker never called the judge"
            time.sleep(0.05)
        worker_process.kill()  # SIGKILL: no chance to give the lease back
        worker_process.wait(timeout=10)
    finally:
        worker_process.kill()
    assert store.judging.judgment("t1") is None
    assert store.judging.claim_turns_to_judge("early", 1, 60.0) == []  # still leased to the dead worker
    config = JudgeConfig(judge="openai", judge_url=judge_server.url, judge_model=MODEL, judge_poll_s=0.05)
    restarted = JudgeWorker(store, build_backend(config), config)
    judge_server.script(prm=["The user asked for a rewrite. \\boxed{-1}"] * config.prm_m)

    async def until_judged() -> None:
        deadline = time.monotonic() + 15
        while await asyncio.to_thread(store.judging.judgment, "t1") is None:  # once the lease (4 s) expires
            assert time.monotonic() < deadline, "the turn was never judged"
            if not await restarted.judge_available():
                await asyncio.sleep(0.05)

    asyncio.run(until_judged())
    assert store.judging.judgment("t1").score == -1
