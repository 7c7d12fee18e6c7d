"""Tiny agents: the pre-trained tiny model taught an environment family's format, with mixed habits.

RL can only reinforce what a policy already does sometimes. A model with random weights never
writes a well-formed tool call, and one imitating only perfect episodes has nothing left to learn.
So, as the chat model was pre-trained on answers in several styles (`pretrain.py`), a tiny agent
is pre-trained on episodes played by a mix of scripted *habits*, one good and three that fail:

    tool-call:  solve  python(the problem's program), then \\boxed{its output}
                guess  \\boxed{the first number of the question} at once, no tool
                echo   python(the program), then \\boxed{the first number of the question}
                typo   python(the program with `print` misspelt: a NameError), then echo
    terminal:   solve  shell(the reference solution), then finish
                quit   finish at once
                look   shell(ls), then finish
                typo   shell(the solution with its first command misspelt: not found), then finish
    swe:        solve  shell(git grep -n the negated test), shell(sed undoing it on the line grep showed), submit
                off    the same, with the line after the one grep showed (nothing changes), then submit
                test   shell(run the test suite), then submit
                quit   submit at once
    web:        solve  click (or type, select) what the task asks, as the oracle does
                first  click the page's first element
                last   click the page's last element
                enter  press Enter

The episodes are played in the real environments (real sandbox, real tool output), so what the
model imitates is exactly what it will see. Each habit is drawn per episode with its weight, so
the model starts by doing each about as often: its reward starts near the solve habit's share
times how reliably it copies the numbers and names, and training has to find out which habit pays.
The typo habit gives a step judge something to see (a tool error) that the outcome also punishes.

Micro splits (`micro_env_config`) keep episodes short and the skills few: tool-call arithmetic and
unit conversion at levels 1 and 2; six terminal templates, each solved by a command that repeats
names from the instruction. Demonstrations come from problems and tasks that the benchmark never
trains or evaluates on: tool-call train problems after the ones the micro train split uses, and
terminal tasks generated with other seeds and made-up names (`demonstration_words`), so no
demonstration shows a benchmark task or even one of its names.

The SWE micro split has one bug kind, a negated `if` test (`if not (x < 3):`), in four of the six
libraries; the demonstrations are played on the other two, so no demonstration shows a benchmark
bug. Finding the bug is not asked of the tiny model: the solving habit greps for the pattern the
bug kind leaves, and what the model must get right is to choose that habit and copy the line number
from grep's output into its `sed` command (demonstrations give that line a random number each time,
so it can only be copied, not recalled). The web micro split is three MiniWoB++ families where a
button, link or radio button must be found by its label (`click-button`, `click-link`, `click-option`);
demonstrations are played on problems of the same families that neither split asks.

Copying is the terminal agent's hard part: the chat model never had to repeat an arbitrary word
from its context, and imitating episodes alone did not teach it (it wrote well-formed commands
about the wrong names). So a terminal agent first trains on copy drills (`copy_drill`), then on the
episodes with a few drills in every batch. What this still makes easier than real use: the good behaviour is in
the model's repertoire from the start (training selects it rather than discovering it), the tasks
are templated, and the tool-call answer is always the program's output.

Built agents are cached like the pre-trained model, under a hash of what determines them.

This module holds what an agent is built from: its family's micro split and build settings, the
habits and the demonstrations they play. The drills and the fine-tuning are `agent_training.py`;
the cache (`agent_model_path`, `agent_key`) is `agent_cache.py`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import shutil
import string
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clawrl.config import EnvConfig, RolloutConfig
from clawrl.envs.policies import Policy, Solvable
from clawrl.envs.protocol import Environment
from clawrl.envs.records import EpisodeRecord, PlannedEpisode
from clawrl.envs.registry import make_environment
from clawrl.envs.rollout import run_rollouts
from clawrl.envs.swe.env import SWEEnv
from clawrl.envs.terminal.env import TerminalEnv, load_tasks
from clawrl.envs.terminal.tasks import WORDS, generate_tasks, generated_tasks_dir
from clawrl.envs.toolcall.problems import problem, problem_ids
from clawrl.envs.web.env import WebEnv
from clawrl.envs.web.oracle import oracle_reply
from clawrl.envs.web.page import parse_listing
from clawrl.types import Message, ToolSpec

log = logging.getLogger(__name__)

AGENTS_VERSION = "agents-v2"  # bump when habits or training change in a way the key does not show
FAMILIES = ("toolcall", "terminal", "swe", "web")
HABITS: dict[str, dict[str, float]] = {
    "toolcall": {"solve": 0.3, "guess": 0.3, "echo": 0.2, "typo": 0.2},
    "terminal": {"solve": 0.3, "quit": 0.25, "look": 0.25, "typo": 0.2},
    "swe": {"solve": 0.3, "off": 0.2, "test": 0.25, "quit": 0.25},
    "web": {"solve": 0.3, "first": 0.25, "last": 0.25, "enter": 0.2},
}
TERMINAL_MICRO = ("files-mkdir_write", "files-backup_copy", "permissions-make_executable", "permissions-private_file",
                  "archives-gzip_file", "text-replace")  # fmt: skip
# Demonstrations name their files with made-up words, never the benchmark's: a model that only saw the 22 benchmark
# words could lower its loss by recalling which of them is likely, without looking at the instruction. Half the names
# are consonant-vowel syllables, half any letters: trained on syllables alone, the agent copied a name's first letters
# and finished it as a syllable word (`fjord` became `feti`), since that too predicted its names well. There are
# enough of them that a name seldom comes back: 600 were few enough to learn by heart, which also stood in for copying.
_SYLLABLES = tuple(consonant + vowel for consonant in "bdfgklmnprstvz" for vowel in "aeiou")
DEMONSTRATION_WORDS = 5000
_FIRST_NUMBER = re.compile(r"\d+(?:\.\d+)?")
SWE_MICRO_KIND = "condition"
SWE_MICRO_LIBRARIES = ("stackcalc", "statkit", "textkit", "unitconv")
SWE_DEMONSTRATION_LIBRARIES = ("datehelp", "intervals")
SWE_FIND = "git grep -n 'if not ('"
SWE_DEMONSTRATION_LINES = (2, 199)  # where a demonstration's bug is shown, drawn anew each time it is trained on
_GREP_LINE = re.compile(r"^([^:\n]+:)(\d+)(?=:)", re.MULTILINE)  # path: then the line number
_SED_LINE = re.compile(r"^(sed -i ')(\d+)(?=s)")
WEB_MICRO = ("click-button", "click-link", "click-option")
WEB_DEMONSTRATION_INSTANCES = range(1000, 3000)  # problems neither split asks (they are instances 0-23)


def micro_env_config(family: str, cache_dir: Path | None = None) -> EnvConfig:
    """The micro split of `family` the tiny agents are built for and measured on."""
    fields: dict[str, Any] = {"env": family, "max_steps": 4, "command_timeout_s": 10.0}
    if cache_dir is not None:
        fields["cache_dir"] = cache_dir
    if family == "toolcall":
        return EnvConfig(**fields, toolcall_kinds="arithmetic,units", toolcall_levels="1,2",
                         toolcall_train_problems=200, toolcall_eval_problems=60)  # fmt: skip
    if family == "terminal":
        return EnvConfig(**fields, terminal_task_prefixes=",".join(TERMINAL_MICRO))
    if family == "swe":
        return EnvConfig(**fields, swe_kinds=SWE_MICRO_KIND, swe_libraries=",".join(SWE_MICRO_LIBRARIES))
    if family == "web":
        return EnvConfig(**fields, web_families=",".join(WEB_MICRO))
    raise ValueError(f"no tiny agent for {family!r}; families are {', '.join(FAMILIES)}")


@dataclass(frozen=True)
class AgentConfig:
    """Everything that determines a tiny agent's weights, besides the code and the seed."""

    demonstrations: int = 960
    steps: int = 400
    batch_size: int = 16
    lr: float = 1e-3
    warmup_steps: int = 20
    max_tokens: int = 640  # an episode's tokens trained on; longer ones are cut (SWE and web prompts: `agent_config`)
    threads: int = 2
    copy_steps: int = 2000  # terminal, SWE and web: steps on the family's drills alone before the episodes (`DRILLS`)
    copy_drills: int = 16  # terminal, SWE and web: drills per step, beside the episodes, so the skill is kept
    copy_batch_size: int = 32  # copy drills per step of the first phase
    copy_openings: int = 8  # terminal only: opening drills per step, beside the episodes (see `opening_drill`)


def agent_config(family: str) -> AgentConfig:
    """The family's default build: SWE and web prompts (tools, issue or page) are about 1,000 tokens."""
    if family == "web":  # a lookup drill is twice as long as a line drill: about as many tokens in half the steps
        return AgentConfig(max_tokens=1536, copy_steps=1000)
    return AgentConfig(max_tokens=1536) if family == "swe" else AgentConfig()


# --------------------------------------------------------------------------- habits


def _call(name: str, arguments: dict[str, Any]) -> Message:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    ]}  # fmt: skip


def _answer(text: str) -> Message:
    return {"role": "assistant", "content": f"\\boxed{{{text}}}"}


class Habit:
    """A scripted policy that plays one habit of one family on one task."""

    def __init__(self, family: str, habit: str, reference: str) -> None:
        self.family, self.habit, self.reference = family, habit, reference

    async def __call__(self, messages: list[Message], tools: list[ToolSpec]) -> Message:
        step = sum(message["role"] == "assistant" for message in messages)
        if self.family == "toolcall":
            return self._toolcall(step, messages)
        if self.family == "swe":
            return self._swe(step, messages)
        if self.family == "web":
            return self._web(messages)
        return self._terminal(step)

    def _toolcall(self, step: int, messages: list[Message]) -> Message:
        question = next(message["content"] for message in messages if message["role"] == "user")
        echo = _FIRST_NUMBER.search(question)
        echoed = echo.group(0) if echo else "0"
        if self.habit == "guess" or step > 0 and self.habit in ("echo", "typo"):
            return _answer(echoed)
        if step > 0:  # solve: the tool's output is the answer
            return _answer(messages[-1]["content"].strip())
        code = self.reference.replace("print(", "prnt(") if self.habit == "typo" else self.reference
        return _call("python", {"code": code})

    def _terminal(self, step: int) -> Message:
        if step > 0 or self.habit == "quit":
            return _call("finish", {})
        if self.habit == "look":
            return _call("shell", {"command": "ls"})
        command = solution_command(self.reference)
        return _call("shell", {"command": "x" + command if self.habit == "typo" else command})

    def _swe(self, step: int, messages: list[Message]) -> Message:
        if self.habit == "quit" or (self.habit == "test" and step > 0) or step > 1:
            return _call("submit", {})
        if self.habit == "test":
            return _call("shell", {"command": "python -m unittest 2>&1 | tail -n 3"})
        if step == 0:
            return _call("shell", {"command": SWE_FIND})
        found = _GREP_LINE.search(str(messages[-1]["content"]))
        line = int(found.group(2)) if found else 1
        return _call("shell", {"command": swe_fix_command(line + 1 if self.habit == "off" else line)})

    def _web(self, messages: list[Message]) -> Message:
        if self.habit == "solve":
            return oracle_reply(self.reference, messages)
        if self.habit == "enter":
            return _call("key", {"name": "Enter"})
        elements = parse_listing(str(messages[-1]["content"])).elements
        if not elements:
            return _call("key", {"name": "Enter"})
        return _call("click", {"element": elements[0 if self.habit == "first" else -1].id})


def swe_fix_command(line: int) -> str:
    """Undo a negated test on `line` of the file `SWE_FIND` finds: `if not (x):` becomes `if (x):`.

    As short as it can be: a tiny model sampling a long command gets one of its tokens wrong too often.
    """
    return f"sed -i '{line}s/not //' $(git grep -l 'if not (')"


def solution_command(solve_sh: str) -> str:
    """The commands of a generated solve.sh, without its shebang, `set -e` and `cd /workspace`."""
    lines = [line for line in solve_sh.splitlines() if line and not line.startswith("#!")]
    return "\n".join(line for line in lines if line not in ("set -e", "cd /workspace"))


def _draw_habit(family: str, rng: random.Random) -> str:
    habits = HABITS[family]
    return rng.choices(list(habits), weights=list(habits.values()))[0]


# --------------------------------------------------------------------------- demonstrations


@dataclass
class Demonstrations:
    """Played episodes to imitate, and the tools their prompts offer."""

    family: str
    episodes: list[EpisodeRecord]
    tools: list[ToolSpec]
    habits: dict[str, int]


def demonstration_words(count: int = DEMONSTRATION_WORDS, seed: int = 0) -> list[str]:
    """`count` made-up names, none of them a benchmark word: half of two or three syllables, half of 3-8 letters."""
    rng = random.Random(f"agents:words:{seed}")
    names: set[str] = set()
    while len(names) < count:
        if (name := made_up_name(rng, letters=len(names) % 2 == 1)) not in WORDS:
            names.add(name)
    return sorted(names)


def made_up_name(rng: random.Random, letters: bool) -> str:
    """3-8 random letters, or two or three consonant-vowel syllables."""
    if letters:
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 8)))
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))


def demonstration_tasks(family: str, count: int, work_dir: Path, cache_dir: Path) -> list[tuple[Path | None, str]]:
    """`count` (task directory or None for the family's own, task id) pairs that the benchmark never uses.

    Tasks repeat when the family has fewer than `count` (the SWE demonstration libraries' bugs).
    """
    micro = micro_env_config(family, cache_dir)
    if family == "toolcall":
        kinds, levels = micro.toolcall_kind_list(), micro.toolcall_level_list()
        # small problems repeat under other ids: leave out every question the micro train split asks too
        used = {problem(task).question for task in problem_ids("train", micro.toolcall_train_problems, kinds, levels)}
        ids = problem_ids("train", 3 * count, kinds, levels, skip=micro.toolcall_train_problems)
        fresh = [task for task in ids if problem(task).question not in used]
        if len(fresh) < count:
            raise ValueError(f"only {len(fresh)} tool-call problems outside the micro split for {count} demonstrations")
        return [(None, task) for task in fresh[:count]]
    if family in ("swe", "web"):
        env = demonstration_env(micro, None)
        tasks = asyncio.run(env.tasks("train")) + asyncio.run(env.tasks("eval"))
        if family == "web":  # every family of the split, not only the first one's tasks
            random.Random("agents:web:tasks").shuffle(tasks)
        return [(None, tasks[index % len(tasks)]) for index in range(count)]
    used = generated_tasks_dir(micro.cache_dir, micro.terminal_seed)
    benchmark_instructions = {task.instruction for task in load_tasks(used).values()}
    tasks: list[tuple[Path | None, str]] = []
    seed = 1
    while len(tasks) < count:
        directory = work_dir / f"terminal-seed{seed}"
        generate_tasks(directory, 1000 + seed, shutil.which("git") is not None, TERMINAL_MICRO, demonstration_words())
        for task_dir in sorted(directory.iterdir()):
            if (task_dir / "instruction.md").read_text() not in benchmark_instructions:
                tasks.append((directory, task_dir.name))
        seed += 1
    return tasks[:count]


def demonstration_env(micro: EnvConfig, directory: Path | None) -> Environment:
    """The environment demonstrations are played in: the micro split's family on tasks it never uses."""
    if micro.env == "terminal" and directory is not None:
        return TerminalEnv(micro, tasks_dir=directory)
    if micro.env == "swe":  # the same bug kind in the other libraries
        return SWEEnv(micro.model_copy(update={"swe_libraries": ",".join(SWE_DEMONSTRATION_LIBRARIES)}))
    if micro.env == "web":
        return WebEnv(micro, instances=WEB_DEMONSTRATION_INSTANCES)
    return make_environment(micro)


def play_demonstrations(family: str, count: int, seed: int, work_dir: Path, cache_dir: Path) -> Demonstrations:
    """`count` episodes of the family's habits, played in the real environment."""
    rng = random.Random(f"agents:{family}:{seed}")
    tasks = demonstration_tasks(family, count, work_dir, cache_dir)
    habits = [_draw_habit(family, rng) for _ in tasks]
    return asyncio.run(_play(micro_env_config(family, cache_dir), tasks, habits))


async def _play(micro: EnvConfig, tasks: list[tuple[Path | None, str]], habits: list[str]) -> Demonstrations:
    family = micro.env
    records: list[EpisodeRecord] = []
    tools: list[ToolSpec] = []
    by_directory: dict[Path | None, list[int]] = {}
    for index, (directory, _task) in enumerate(tasks):
        by_directory.setdefault(directory, []).append(index)
    for directory, indices in by_directory.items():
        def make_env(directory: Path | None = directory) -> Environment:
            return demonstration_env(micro, directory)

        async def policy_for(env: Environment, planned: PlannedEpisode) -> Policy:
            assert isinstance(env, Solvable)
            reference = await env.reference_solution(planned.task)
            return Habit(family, habits[planned.seed], reference)

        planned = [PlannedEpisode(tasks[index][1], index, index, 1) for index in indices]
        config = RolloutConfig(policy="oracle", concurrency=4, episode_timeout_s=180.0)
        records += await run_rollouts(make_env, policy_for, planned, config)
        if not tools:
            env = make_env()
            tools = (await env.reset(0, planned[0].task)).tools
            await env.close()
    # a busy machine can time an episode out; a few lost demonstrations change nothing, many mean a broken family
    failed = [record for record in records if record.failed]
    if len(failed) > len(records) // 20:
        raise RuntimeError(f"{len(failed)} of {len(records)} demonstration episodes failed, e.g. {failed[0].error}")
    if failed:
        log.warning("%d demonstration episodes failed and are left out, e.g. %s", len(failed), failed[0].error)
    played = [record for record in records if not record.failed]
    counts = {habit: sum(habits[record.seed] == habit for record in played) for habit in HABITS[family]}
    return Demonstrations(family, played, tools, counts)


def renumbered(record: EpisodeRecord, line: int) -> EpisodeRecord:
    """An SWE episode with the line grep found shown as `line`, and every `sed` on a line moved by as much.

    The demonstration libraries have six bugs, so their line numbers could be learnt by heart;
    renumbered anew every time it is trained on, the solving habit's number can only come from
    grep's output. The episode then no longer matches its repository, which imitation does not
    need: only its tokens are trained on.
    """
    shown = [found for m in record.messages if m["role"] == "tool" and (found := _GREP_LINE.search(str(m["content"])))]
    if not shown:
        return record
    shift = line - int(shown[0].group(2))

    def moved(found: re.Match[str]) -> str:  # a match of _GREP_LINE or _SED_LINE, its number moved by `shift`
        return f"{found.group(1)}{int(found.group(2)) + shift}"

    messages = []
    for message in record.messages:
        message = dict(message)
        if message["role"] == "tool":
            message["content"] = _GREP_LINE.sub(moved, str(message["content"]))
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                arguments = json.loads(call["function"]["arguments"])
                if isinstance(arguments.get("command"), str):
                    arguments["command"] = _SED_LINE.sub(moved, arguments["command"])
                calls.append({**call, "function": {**call["function"], "arguments": json.dumps(arguments)}})
            message["tool_calls"] = calls
        messages.append(message)
    return replace(record, messages=messages)
