"""Which judge runs when the user names none, and `--judge engine+rule` (issue 27).

Decision under test: with a real model the served model judges its own turns (`engine`, 3 votes);
the tiny models (by name, or a directory whose vocabulary is a tiny model's) get the offline judge;
`clawrl serve` says which and why at start. `engine+rule` adds the offline judge's score as one
more vote, which breaks the model's ties.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clawrl.config import JudgeConfig
from clawrl.judge.choice import TINY_VOCABULARY, choose_judge, is_tiny
from clawrl.judge.combined import EngineAndRuleJudge, combined_score
from clawrl.judge.engine_backend import EngineJudge
from clawrl.judge.types import BackendVerdict
from clawrl.judge.worker import RuleJudge, build_backend
from clawrl.serve.runner import free_port
from clawrl.types import NextState, TurnContext
from tests.helpers import turn, user


def model_dir_with_vocabulary(tmp_path: Path, vocabulary: int) -> Path:
    model = tmp_path / f"model-{vocabulary}"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": vocabulary}))
    return model


@pytest.mark.parametrize("name", ["tiny", "tiny-pretrained", "tiny-toolcall"])
def test_the_tiny_models_get_the_offline_judge(name: str) -> None:
    choice = choose_judge(JudgeConfig(), name)
    assert choice.judge == "rule" and "tiny" in choice.reason


def test_a_model_directory_is_judged_by_what_it_holds(tmp_path: Path, tiny_model_dir: Path) -> None:
    assert is_tiny(str(tiny_model_dir))  # clawrl's tokenizer: a few thousand tokens, whatever the folder is called
    assert choose_judge(JudgeConfig(), str(model_dir_with_vocabulary(tmp_path, TINY_VOCABULARY - 1))).judge == "rule"
    real = choose_judge(JudgeConfig(), str(model_dir_with_vocabulary(tmp_path, 151_936)))
    assert real.judge == "engine" and "judges its own turns (3 votes" in real.reason


def test_a_hub_id_is_a_real_model() -> None:
    assert choose_judge(JudgeConfig(), "Qwen/Qwen3-4B-Instruct-2507").judge == "engine"


def test_a_named_judge_wins_and_a_judge_endpoint_or_model_chooses_itself() -> None:
    assert choose_judge(JudgeConfig(judge="rule"), "Qwen/Qwen3-4B").judge == "rule"
    assert choose_judge(JudgeConfig(judge="engine+rule"), "tiny").judge == "engine+rule"
    assert choose_judge(JudgeConfig(judge_url="http://judge/v1", judge_model="m"), "tiny").judge == "openai"
    assert choose_judge(JudgeConfig(judge_model="/models/judge"), "tiny").judge == "engine"
    assert choose_judge(JudgeConfig(), None).judge == "rule"  # `clawrl judge` alone has no model to ask


@pytest.fixture(scope="module")
def real_shaped_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Qwen3 with the real 151,936-token vocabulary (random weights): a real model to the judge choice."""
    out = tmp_path_factory.mktemp("qwen3") / "model"
    subprocess.run([sys.executable, "-m", "clawrl.cli", "model", "build-random", "--like", "qwen3-tiny", "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    return out


def started_serve_log(model: Path, run_dir: Path, *flags: str) -> str:
    """`clawrl serve --model model` until it serves, then stopped: what it logged."""
    environment = {**os.environ, "CLAWRL_LOG_FORMAT": "text"}
    command = [sys.executable, "-m", "clawrl.cli", "serve", "--model", str(model), "--port", str(free_port()),
               "--run-dir", str(run_dir), "--cpu-threads", "1", *flags]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=environment)
    lines = []
    try:
        deadline = time.monotonic() + 240
        assert server.stderr is not None
        while time.monotonic() < deadline and (line := server.stderr.readline()):
            lines.append(line)
            if "serving " in line:
                break
    finally:
        server.terminate()
        server.wait(timeout=60)
    return "".join(lines)


def test_serve_with_a_real_model_and_no_judge_says_the_model_judges(real_shaped_model: Path, tmp_path: Path) -> None:
    log = started_serve_log(real_shaped_model, tmp_path / "run")
    assert f"judge: engine (the served model {real_shaped_model} judges its own turns (3 votes" in log, log
    assert "serving " in log, log


def test_serve_with_a_tiny_model_and_no_judge_says_the_offline_judge_judges(tiny_model_dir: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(tiny_model_dir, tmp_path / "my-assistant")  # the name says nothing
    log = started_serve_log(copy, tmp_path / "run")
    assert f"judge: rule ({copy} is a tiny model, too small to judge its own turns" in log, log


# --------------------------------------------------------------------------- engine+rule


@pytest.mark.parametrize(
    ("model_votes", "offline", "expected"),
    [
        ([1, 1, -1], -1, -1),  # 2-2: the offline vote breaks the tie
        ([1, 1, -1], 1, 1),  # 3-1
        ([1, 1, 1], -1, 1),  # the model agrees with itself: it decides
        ([1, -1, 0], 0, 0),  # the offline vote joins one of three
        ([1, -1, 0], -1, -1),
        ([None, None, None], -1, -1),  # no valid model vote: the offline vote alone
        ([1, None, None], -1, -1),  # 1-1
        ([1, 1, None], -1, 1),
        ([1, -1, None], 0, 0),  # a three-way tie the offline vote is in
    ],
)
def test_the_offline_score_is_a_fourth_vote_that_breaks_ties(model_votes: list[int | None], offline: int, expected: int) -> None:
    assert combined_score(model_votes, offline) == expected


class Votes:
    """A language-model backend that answers with fixed votes and a hint."""

    name = "model"

    def __init__(self, votes: list[int | None], score: int) -> None:
        self.votes, self.score = votes, score

    async def judge(self, case: TurnContext) -> BackendVerdict:
        return BackendVerdict(score=self.score, votes=self.votes, rationale="because", source="prm",
                              hint_candidates=["Write it as plain prose."])


def correction_case() -> TurnContext:
    answered = turn("t1", "s1", [user("Write a short note to my team about Friday.")], "**Friday**\n1. Meeting")
    next_state = [user("would you mind making it a bit more polite?")]
    return TurnContext(answered, NextState("t1", next_state, "t2"), feedback=[])


def test_engine_and_rule_votes_together_and_offers_both_hints() -> None:
    judge = EngineAndRuleJudge(Votes([1, -1, None], score=0), RuleJudge())
    verdict = asyncio.run(judge.judge(correction_case()))
    assert verdict.votes == [1, -1, None, -1] and verdict.score == -1  # the model's tie, broken by the rules' -1
    assert verdict.hint_candidates == ["Write it as plain prose.", "Make it a bit more polite."]
    assert verdict.source == "prm" and verdict.rationale == "because" and judge.name == "model+rule"


def test_engine_plus_rule_is_built_on_the_serving_engine(tool_model_dir: Path) -> None:
    from clawrl.config import EngineConfig
    from clawrl.engines import build_engine

    serving = build_engine(EngineConfig(model=str(tool_model_dir), device="cpu", cpu_threads=1))
    backend = build_backend(JudgeConfig(judge="engine+rule"), serving)
    assert isinstance(backend, EngineAndRuleJudge)
    assert isinstance(backend.model_judge, EngineJudge) and backend.model_judge.engine is serving
    assert backend.model_judge.votes == 3 and isinstance(backend.offline_judge, RuleJudge)
