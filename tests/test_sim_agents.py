"""Tiny agents (sim/agents.py): the habits play real episodes with the outcomes they are meant to
have, demonstrations never come from the benchmark's tasks, and training imitates only the
assistant's tokens of a rendered episode."""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.config import RolloutConfig
from clawrl.envs.policies import Solvable
from clawrl.envs.protocol import Environment
from clawrl.envs.records import EpisodeRecord, PlannedEpisode
from clawrl.envs.registry import make_environment
from clawrl.envs.rollout import run_rollouts
from clawrl.envs.sandbox import sandbox_available
from clawrl.envs.terminal.env import SYSTEM_PROMPT, load_tasks
from clawrl.envs.terminal.tasks import WORDS, generated_tasks_dir
from clawrl.envs.toolcall.problems import problem
from clawrl.envs.web.env import SYSTEM_PROMPT as WEB_SYSTEM_PROMPT
from clawrl.envs.web.page import parse_listing
from clawrl.sim.agent_training import _VERBS, copy_drill, encode_episode, line_drill, lookup_drill, opening_drill, train_agent
from clawrl.sim.agents import (
    HABITS,
    SWE_DEMONSTRATION_LIBRARIES,
    SWE_FIND,
    WEB_MICRO,
    AgentConfig,
    Habit,
    agent_config,
    demonstration_tasks,
    demonstration_words,
    micro_env_config,
    play_demonstrations,
    renumbered,
    swe_fix_command,
)
from clawrl.sim.pretrain import pad_batch
from tests.helpers import require_chromium

needs_sandbox = pytest.mark.skipif(sandbox_available() is not None, reason=f"no sandbox: {sandbox_available()}")
EXPECTED = {"solve": 1.0, "guess": 0.0, "echo": 0.0, "typo": 0.0, "quit": 0.0, "look": 0.0, "off": 0.0, "test": 0.0}


def play_habit(family: str, habit: str, tasks: list[str], cache_dir: Path) -> list[EpisodeRecord]:
    micro = micro_env_config(family, cache_dir)

    async def policy_for(env: Environment, planned: PlannedEpisode) -> Habit:
        assert isinstance(env, Solvable)
        return Habit(family, habit, await env.reference_solution(planned.task))

    planned = [PlannedEpisode(task, index, index, 1) for index, task in enumerate(tasks)]
    config = RolloutConfig(policy="oracle", concurrency=2)
    return asyncio.run(run_rollouts(lambda: make_environment(micro), policy_for, planned, config))


@needs_sandbox
@pytest.mark.parametrize("family", ["toolcall", "terminal", "swe"])
def test_each_habit_plays_real_episodes_with_the_outcome_it_stands_for(family: str, tmp_path: Path) -> None:
    micro = micro_env_config(family, tmp_path)
    tasks = asyncio.run(make_environment(micro).tasks("eval"))[:4]
    for habit in HABITS[family]:
        records = play_habit(family, habit, tasks, tmp_path)
        assert not any(record.failed for record in records), [record.error for record in records]
        assert [record.reward for record in records] == [EXPECTED[habit]] * len(tasks), habit
        tool_messages = [message for record in records for message in record.messages if message["role"] == "tool"]
        if habit == "typo":  # the misspelt program or command fails visibly: what a step judge can see
            assert tool_messages and all("not" in message["content"] or "Error" in message["content"] for message in tool_messages
                                         if message["content"] != "finished; the task is being checked")  # fmt: skip


@needs_sandbox
def test_the_web_habits_solve_click_the_ends_of_the_page_or_press_enter(tmp_path: Path) -> None:
    require_chromium()
    tasks = asyncio.run(make_environment(micro_env_config("web", tmp_path)).tasks("eval"))
    rewards = {habit: [record.reward for record in play_habit("web", habit, tasks, tmp_path)] for habit in HABITS["web"]}
    assert rewards["solve"] == [1.0] * len(tasks) and rewards["enter"] == [0.0] * len(tasks)
    # the first or the last element is sometimes the one asked for, never both (a page lists several)
    assert all(first + last <= 1.0 for first, last in zip(rewards["first"], rewards["last"], strict=True))
    assert 0 < sum(rewards["first"]) + sum(rewards["last"]) < len(tasks)


def test_an_swe_demonstration_renumbered_shows_and_fixes_another_line() -> None:
    grep = {"role": "tool", "content": "pkg/mod.py:17:    if not (x < 3):", "tool_call_id": "call_shell"}
    fix = Habit("swe", "solve", "")._swe(1, [grep])
    record = EpisodeRecord("clawrl-swe__datehelp-1", 0, 0, messages=[{"role": "user", "content": "Bug in `f`"},
                                                                      Habit("swe", "solve", "")._swe(0, []), grep, fix])  # fmt: skip
    moved = renumbered(record, 230)
    assert moved.messages[2]["content"] == "pkg/mod.py:230:    if not (x < 3):"
    assert json.loads(moved.messages[3]["tool_calls"][0]["function"]["arguments"])["command"] == swe_fix_command(230)
    assert json.loads(fix["tool_calls"][0]["function"]["arguments"])["command"] == swe_fix_command(17)  # the original stays
    assert moved.messages[:2] == record.messages[:2]


def test_demonstrations_never_use_the_benchmarks_problems_or_tasks(tmp_path: Path) -> None:
    micro = micro_env_config("toolcall")
    used = {problem(task).question for split in ("train", "eval") for task in asyncio.run(make_environment(micro).tasks(split))}
    demos = [task for _, task in demonstration_tasks("toolcall", 300, tmp_path, tmp_path)]
    assert len(demos) == 300 and not {problem(task).question for task in demos} & used
    assert {task.rsplit("-", 2)[0] for task in demos} == {"arithmetic", "units"}

    terminal = demonstration_tasks("terminal", 60, tmp_path / "work", tmp_path)
    benchmark = {task.instruction for task in load_tasks(generated_tasks_dir(tmp_path, 0)).values()}
    instructions = [(directory / task / "instruction.md").read_text() for directory, task in terminal if directory]
    assert len(instructions) == 60 and not set(instructions) & benchmark
    assert len(set(instructions)) > 40  # new names and contents, not the same few tasks
    # made-up names only: the agent must copy names from the instruction, it cannot recall the benchmark's
    assert not any(re.search(rf"\b{word}\b", text, re.IGNORECASE) for word in WORDS for text in instructions)

    # SWE: the micro split's bug kind in libraries the micro split does not use; web: problems neither split asks
    swe_micro = make_environment(micro_env_config("swe", tmp_path))
    swe_benchmark = set(asyncio.run(swe_micro.tasks("train")) + asyncio.run(swe_micro.tasks("eval")))
    swe_demos = {task for _, task in demonstration_tasks("swe", 40, tmp_path, tmp_path)}
    assert swe_demos and not swe_demos & swe_benchmark
    assert {task.split("__")[1].split("-")[0] for task in swe_demos} == set(SWE_DEMONSTRATION_LIBRARIES)
    web_demos = [task for _, task in demonstration_tasks("web", 60, tmp_path, tmp_path)]
    assert len(set(web_demos)) == 60 and all(int(task.rsplit("-", 1)[1]) >= 1000 for task in web_demos)
    assert {task.rsplit("-", 1)[0] for task in web_demos} == set(WEB_MICRO)


def test_a_copy_drill_trains_only_on_a_command_repeating_the_new_names_the_user_quoted(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rng, words = random.Random(0), demonstration_words()
    assert len(words) == len(set(words)) >= 300 and not set(words) & set(WORDS)
    command_words = {word for verb in _VERBS for word in verb.split()}
    seen_names = []
    for _ in range(40):
        ids, labels = copy_drill(tokenizer, rng)
        shown = tokenizer.decode([token for token, label in zip(ids, labels, strict=True) if label == -100])
        trained = tokenizer.decode([label for label in labels if label != -100])
        assert '"name": "shell"' in trained and "`" not in trained
        command = json.loads(trained.split("<tool_call>")[1].split("</tool_call>")[0])["arguments"]["command"]
        names = [word for word in command.split() if word not in command_words]
        assert 1 <= len(names) <= 3 and command.split()[-1] == names[-1]
        # each name is in the user's message, in the command's order
        user_text = shown.split("<|im_start|>user")[1]
        places = [re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", user_text) for name in names]
        assert all(places) and [place.start() for place in places] == sorted(place.start() for place in places)
        assert "`" not in user_text  # bare, as the tasks write names
        seen_names += names
    stems = [name.split(".")[0].lower() for name in seen_names]
    assert not set(stems) & set(WORDS) and len(set(stems)) > 0.9 * len(stems)  # new every time, not a list to learn


def test_a_line_drill_trains_on_a_fix_of_the_line_grep_printed(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rng = random.Random(0)
    lines = []
    for _ in range(40):
        ids, labels = line_drill(tokenizer, rng)
        shown = tokenizer.decode([token for token, label in zip(ids, labels, strict=True) if label == -100])
        trained = tokenizer.decode([label for label in labels if label != -100])
        calls = [json.loads(part.split("</tool_call>")[0]) for part in trained.split("<tool_call>")[1:]]
        assert [call["arguments"]["command"] for call in calls][0] == SWE_FIND and len(calls) == 2
        printed = re.search(r"^[^:\n]+\.py:(\d+):\s+if not \(", shown.split("<|im_start|>tool")[1].strip())
        assert printed and calls[1]["arguments"]["command"] == swe_fix_command(int(printed.group(1)))
        assert str(printed.group(1)) not in trained.replace(calls[1]["arguments"]["command"], "")  # only the fix holds it
        lines.append(int(printed.group(1)))
    assert len(set(lines)) > 30 and all(2 <= line <= 499 for line in lines)  # new numbers, not a few to learn


def test_a_lookup_drill_is_a_made_up_web_page_answered_by_a_habit(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rng = random.Random(0)
    replies: list[str] = []
    for _ in range(200):
        ids, labels = lookup_drill(tokenizer, rng)
        shown = tokenizer.decode([token for token, label in zip(ids, labels, strict=True) if label == -100])
        trained = tokenizer.decode([label for label in labels if label != -100])
        assert WEB_SYSTEM_PROMPT in shown and "<tools>" not in shown
        user = shown.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
        instruction, page = user.split("\n\n", 1)
        listing = parse_listing(page)
        quoted = re.search(r'"(.+)"|^Select (.+) and click Submit\.$', instruction)
        wanted = [element.id for element in listing.elements if element.label in (quoted.group(1), quoted.group(2))]
        assert len(wanted) == 1  # the quoted label names one element
        assert not {element.label.lower().strip(".") for element in listing.elements} & {"next", "ok", "cancel"}
        calls = [json.loads(part.split("</tool_call>")[0]) for part in trained.split("<tool_call>")[1:]]
        clicked = [call["arguments"]["element"] for call in calls if call["name"] == "click"]
        submit = [element.id for element in listing.elements if element.label == "Submit"]  # click-option's second click
        if calls[0]["name"] == "key":
            replies.append("enter")
        elif clicked == wanted + submit:
            replies.append("solve")
        else:
            assert len(clicked) == 1 and clicked[0] in (listing.elements[0].id, listing.elements[-1].id)
            replies.append("first" if clicked[0] == listing.elements[0].id else "last")
    shares = {habit: replies.count(habit) / len(replies) for habit in HABITS["web"]}
    # the first or last element is sometimes the quoted one: "solve" takes a little from them
    assert all(abs(shares[habit] - weight) < 0.12 for habit, weight in HABITS["web"].items()), shares


def test_an_opening_drill_is_a_real_task_prompt_on_new_names_answered_by_a_habits_first_step(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rng = random.Random(0)
    tools = [{"type": "function", "function": {"name": name, "description": name, "parameters": {"type": "object", "properties": {}}}}
             for name in ("shell", "finish")]  # fmt: skip
    first_steps: list[str] = []
    for _ in range(60):
        ids, labels = opening_drill(tokenizer, rng, tools, 640)
        shown = tokenizer.decode([token for token, label in zip(ids, labels, strict=True) if label == -100])
        trained = tokenizer.decode([label for label in labels if label != -100])
        assert SYSTEM_PROMPT in shown and "<tools>" in shown and trained.count("<|im_end|>") == 1
        instruction = shown.split("<|im_start|>user")[1]
        assert "`" not in instruction and not set(re.findall(r"[a-z]+", instruction.lower())) & set(WORDS)
        call = json.loads(trained.split("<tool_call>")[1].split("</tool_call>")[0])
        if call["name"] == "finish":
            first_steps.append("quit")
        elif call["arguments"]["command"] == "ls":
            first_steps.append("look")
        else:
            command = call["arguments"]["command"]
            first_steps.append("typo" if command.startswith("x") else "solve")
            names = [word for word in re.findall(r"[\w.]+", command) if "." in word]
            assert all(name in instruction for name in names)  # the command repeats the instruction's names
    shares = {habit: first_steps.count(habit) / len(first_steps) for habit in HABITS["terminal"]}
    assert all(abs(shares[habit] - weight) < 0.2 for habit, weight in HABITS["terminal"].items()), shares


@needs_sandbox
def test_training_imitates_only_the_assistant_tokens_of_played_episodes(tiny_model_dir: Path, tmp_path: Path) -> None:
    demonstrations = play_demonstrations("toolcall", 8, seed=0, work_dir=tmp_path, cache_dir=tmp_path)
    assert len(demonstrations.episodes) == 8 and sum(demonstrations.habits.values()) == 8
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    record = demonstrations.episodes[0]
    ids, labels = encode_episode(tokenizer, record.messages, demonstrations.tools, max_tokens=4096)
    trained = tokenizer.decode([token for token, label in zip(ids, labels, strict=True) if label != -100])
    replies = [message for message in record.messages if message["role"] == "assistant"]
    assert trained.count("<|im_end|>") == len(replies)  # every reply, each to its end, and nothing else
    assert "You solve math problems" not in trained and "<tools>" not in trained
    if replies[0].get("tool_calls"):
        assert '"name": "python"' in trained

    losses = train_agent(tiny_model_dir, demonstrations, tmp_path / "agent", seed=0, config=AgentConfig(steps=3, batch_size=4))
    assert len(losses) == 3 and all(loss > 0 for loss in losses)
    AutoModelForCausalLM.from_pretrained(tmp_path / "agent")  # a model directory like any other
    # episodes cut before their first reply would teach nothing (a loss of 0/0): the build says so instead
    with pytest.raises(ValueError, match="no assistant token within max_tokens=64"):
        train_agent(tiny_model_dir, demonstrations, tmp_path / "cut", seed=0, config=AgentConfig(steps=1, max_tokens=64))


@needs_sandbox
@pytest.mark.parametrize(("family", "drill"), [("terminal", copy_drill), ("swe", line_drill), ("web", lookup_drill)])
def test_an_agent_learns_to_copy_before_it_imitates_episodes(family: str, drill: Callable, tiny_model_dir: Path,
                                                             tmp_path: Path) -> None:  # fmt: skip
    if family == "web":
        require_chromium()
    demonstrations = play_demonstrations(family, 4, seed=0, work_dir=tmp_path / "work", cache_dir=tmp_path)
    config = AgentConfig(steps=2, batch_size=2, copy_steps=30, copy_batch_size=16, copy_drills=4, lr=3e-3,
                         max_tokens=agent_config(family).max_tokens)  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    probe_rng = random.Random(99)
    probe = [drill(tokenizer, probe_rng) for _ in range(16)]

    def copy_loss(model_dir: Path) -> float:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        with torch.no_grad():
            return model(**pad_batch(probe, tokenizer.pad_token_id)).loss.item()

    losses = train_agent(tiny_model_dir, demonstrations, tmp_path / "agent", seed=0, config=config)
    assert len(losses) == 2  # the episode steps; the drills came first
    assert copy_loss(tmp_path / "agent") < copy_loss(tiny_model_dir) - 1.0


@needs_sandbox
def test_the_first_command_benchmark_sorts_every_sampled_answer(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "first.json"
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "agent_first_commands.py"
    result = subprocess.run([sys.executable, str(script), "--model", str(tiny_model_dir), "--samples", "2", "--out", str(out)],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    written = json.loads(out.read_text())
    assert len(written["tasks"]) == 36 and sum(written["totals"].values()) == 72  # 6 templates x 6 variants, 2 each
    assert written["totals"]["exact"] == 0 and written["exact_share"] == 0.0  # an untrained model writes no command
