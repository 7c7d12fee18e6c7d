"""The judge loop with the rule backend: inside the server, standalone, and under failure."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx

from clawrl.config import JudgeConfig
from clawrl.dashboard.views import session_page
from clawrl.engines import Engine
from clawrl.judge.types import BackendVerdict
from clawrl.judge.worker import JudgeWorker, RuleJudge
from clawrl.store import Store
from clawrl.store.inspect import session_detail
from clawrl.types import TurnContext
from tests.helpers import CORRECTION, converse, record, start_server, user, wait_for_judgment


def test_a_correction_through_the_server_gives_minus_one_and_a_hint(tool_model_dir: Path, run_dir: Path, serving_engine: Engine | None) -> None:
    """On the hf engine and on vLLM (`serving_engine`)."""
    with start_server(tool_model_dir, run_dir, judge=JudgeConfig(judge_poll_s=0.05), engine=serving_engine) as server:
        session_id, turn_ids = converse(server.base_url, ["Write a short note to my team about Friday.", CORRECTION, "thanks, perfect"])
        store = Store.for_run_dir(run_dir)
        first, second = wait_for_judgment(store, turn_ids[0]), wait_for_judgment(store, turn_ids[1])
    assert first.score == -1 and first.source == "rule"
    assert "without the bold and the numbered list" in first.hint
    assert second.score == 1 and second.hint is None
    assert store.judging.judgment(turn_ids[2]) is None  # the last turn has no next state
    shown = session_detail(store, session_id)["turns"][0]["judgment"]
    assert shown["score"] == -1 and shown["source"] == "rule" and shown["votes"] == [-1]


def openclaw_wrapped(text: str) -> str:
    """A user message as the OpenClaw agent sends it: a timestamp in front, its context block after."""
    return (f"[Mon 2026-11-23 15:45 UTC] {text}\n\n<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\n"
            "Active exec sessions: none\nWorkspace: /home/me/notes\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>")


def test_the_judge_reads_what_the_user_typed_through_an_agents_wrapping(tool_model_dir: Path, run_dir: Path) -> None:
    """The same conversation as above, sent as OpenClaw sends it: the same verdicts and hint."""
    lines = ["Write a short note to my team about Friday.", CORRECTION, "thanks, perfect"]
    with start_server(tool_model_dir, run_dir, judge=JudgeConfig(judge_poll_s=0.05)) as server:
        session_id, turn_ids = converse(server.base_url, [openclaw_wrapped(line) for line in lines])
        store = Store.for_run_dir(run_dir)
        first, second = wait_for_judgment(store, turn_ids[0]), wait_for_judgment(store, turn_ids[1])
    assert first.score == -1 and first.hint == "Rewrite it without the bold and the numbered list."
    assert second.score == 1 and second.hint is None  # thanks, not a restatement of the shared wrapping
    shown = session_page(store, session_id)["turns"][1]["input"]
    assert shown == [{"role": "user", "content": CORRECTION}]  # the dashboard shows the user's words


def test_explicit_feedback_outranks_the_judge_and_its_text_is_a_hint(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("write a poem")], "A poem.")
    record(store, "t2", "s1", [user("thanks, perfect")], "You're welcome.", continues_turn_id="t1", next_state=[user("thanks, perfect")])
    store.turns.add_feedback("t1", -1, "Use rhymes and keep it to four lines.")
    worker = JudgeWorker(store, RuleJudge(), JudgeConfig())
    assert asyncio.run(worker.judge_available()) == 1
    judgment = store.judging.judgment("t1")
    assert judgment.score == -1 and judgment.source == "feedback"
    assert judgment.hint == "Use rhymes and keep it to four lines."


class HangingJudge:
    name = "hanging"

    async def judge(self, case: TurnContext) -> BackendVerdict:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def test_a_hanging_judge_times_out_and_the_turn_is_judged_by_another_worker(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("q")], "A.")
    record(store, "t2", "s1", [user("no, wrong")], "B.", continues_turn_id="t1", next_state=[user("no, wrong")])
    stuck = JudgeWorker(store, HangingJudge(), JudgeConfig(judge_timeout_s=0.2))
    assert asyncio.run(stuck.judge_available()) == 0
    healthy = JudgeWorker(store, RuleJudge(), JudgeConfig())
    assert asyncio.run(healthy.judge_available()) == 1
    assert store.judging.judgment("t1").score == -1


def test_standalone_judge_command(tool_model_dir: Path, run_dir: Path) -> None:
    with start_server(tool_model_dir, run_dir) as server:  # judging off in the server
        _session, turn_ids = converse(server.base_url, ["hello", "no, I meant the other file", "ok", "thanks", "done"])
        backlog = httpx.get(server.base_url.removesuffix("/v1") + "/metrics").text
    assert "clawrl_judge_backlog_turns 4.0" in backlog  # the last answer has nothing after it yet
    command = [sys.executable, "-m", "clawrl.cli", "judge", "--run-dir", str(run_dir), "--once"]
    # the judge runs at nice 10 on one CPU: on a busy machine its classifier build waits
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "judged 4 turn(s)" in result.stdout
    store = Store.for_run_dir(run_dir)
    assert store.judging.judgment(turn_ids[0]).score == -1
    assert all(store.judging.judgment(turn_id) is not None for turn_id in turn_ids[:4])


def test_judge_figures_are_on_metrics(tool_model_dir: Path, run_dir: Path) -> None:
    with start_server(tool_model_dir, run_dir, judge=JudgeConfig(judge_poll_s=0.05)) as server:
        _session, turn_ids = converse(server.base_url, ["hi", CORRECTION, "thanks, perfect", "ok bye"])
        store = Store.for_run_dir(run_dir)
        for turn_id in turn_ids[:3]:
            wait_for_judgment(store, turn_id)
        text = httpx.get(server.base_url.removesuffix("/v1") + "/metrics").text
    assert 'clawrl_judged_turns_total{policy_version="0"} 3.0' in text
    assert 'clawrl_judge_mean_score{policy_version="0"} 0.333' in text  # -1, +1, +1
    assert 'clawrl_judge_vote_agreement{policy_version="0"} 1.0' in text
    assert 'clawrl_judge_invalid_votes_total{policy_version="0"} 0.0' in text
    assert "clawrl_judge_backlog_turns 0.0" in text and "clawrl_judge_backlog_age_seconds 0.0" in text
