"""The web family (issue 15 item 2): a real headless Chromium in the sandbox on MiniWoB++ pages and
our forms; the page as text, tool calls that act on it, the scripted policies' scores, the
command line's contract, and nothing left behind after close or a SIGKILL of the runner.

One browser serves the module's in-process tests (an environment keeps its browser across
resets), on one event loop that outlives the tests."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from clawrl.config import EnvConfig, RolloutConfig
from clawrl.envs.policies import make_policy
from clawrl.envs.protocol import Action, StepResult
from clawrl.envs.rollout import plan_episodes, run_rollouts, summarize
from clawrl.envs.web.env import WebEnv
from clawrl.envs.web.page import parse_listing
from clawrl.envs.web.tasks import FAMILIES, pages_dir
from tests.helpers import require_chromium

T = TypeVar("T")


@pytest.fixture(scope="module", autouse=True)
def chromium() -> None:
    require_chromium()


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("cache")
    pages_dir(cache)  # written once here, so that no test (nor the runner it kills) writes it
    return cache


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture(scope="module")
def env(loop: asyncio.Runner, cache_dir: Path) -> Iterator[WebEnv]:
    web = WebEnv(EnvConfig(cache_dir=cache_dir, max_steps=10, web_screenshots=True))
    yield web
    loop.run(web.close())


def call(name: str, arguments: dict[str, Any] | str, call_id: str = "c1") -> Action:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return Action.model_validate({"tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}]})


def answer(result: StepResult) -> str:
    return str(result.observation.messages[0].content)


def run(loop: asyncio.Runner, coro: Awaitable[T]) -> T:
    return loop.run(coro)  # type: ignore[arg-type]


def test_the_page_is_a_listing_of_its_elements_and_the_tools_act_on_it(loop: asyncio.Runner, env: WebEnv) -> None:
    opening = run(loop, env.reset(seed=0, task="login-user-0"))
    assert [tool["function"]["name"] for tool in opening.tools] == ["click", "type", "select", "key", "screenshot"]
    task = str(opening.messages[1].content)
    user, password = re.findall(r'"([^"]*)"', task)[:2]
    assert task.startswith(f'Enter the username "{user}" and the password "{password}"')
    listing = task.split("\n\n", 1)[1].splitlines()
    assert listing == ['Page "Login User Task":', '[1] textbox "Username" value=""', '[2] password "Password" value=""',
                       '[3] button "Login"']  # fmt: skip
    typed = run(loop, env.step(call("type", {"element": 1, "text": "someone"})))
    assert not typed.done
    assert answer(typed).startswith("typed 7 characters into [1]\n\n")
    assert '[1] textbox "Username" value="someone" focused' in answer(typed)  # the same ids, the new state
    shot = run(loop, env.step(call("screenshot", {})))
    assert base64.b64decode(answer(shot).removeprefix("data:image/png;base64,"))[:8] == b"\x89PNG\r\n\x1a\n"
    # a wrong password submitted: the page ends its task, with MiniWoB's reward -1 counted as 0
    run(loop, env.step(call("type", {"element": 2, "text": password + "x"})))
    done = run(loop, env.step(call("click", {"element": 3})))
    assert done.done and done.reward == 0.0
    assert done.info["task_over"] and done.info["miniwob_reward"] == -1.0


def test_wrong_moves_are_answered_with_errors_and_the_episode_goes_on(loop: asyncio.Runner, env: WebEnv) -> None:
    opening = run(loop, env.reset(seed=0, task="choose-list-0"))
    page = parse_listing(str(opening.messages[1].content))
    assert [element.role for element in page.elements] == ["combobox", "button"]
    options = page.elements[0].options
    assert options and len(options) >= 3
    answers = [
        answer(run(loop, env.step(action)))
        for action in (
            call("click", {"element": 99}),
            call("select", {"element": 2, "option": options[0]}),
            call("select", {"element": 1, "option": "Atlantis"}),
            call("key", {"name": "F13"}),
            call("type", {"element": 2, "text": "hello"}),  # a button takes no text: WebDriver refuses
            call("click", "{not json"),
        )
    ]  # fmt: skip
    assert answers[0].startswith("error: there is no element [99] on the page\n\nPage ")
    assert answers[1].startswith("error: cannot select in [2]: it is not a list")
    assert answers[2].startswith('error: cannot select in [1]: it has no option "Atlantis"')
    assert answers[3].startswith("error: no key 'F13'; the keys are Enter, Tab")
    assert answers[4].startswith("error: invalid element state") or answers[4].startswith("error: element not interactable")
    assert answers[5].startswith("error: the arguments are not valid JSON")
    # the page is unharmed: the last option chosen and submitted solves the task
    run(loop, env.step(call("select", {"element": 1, "option": options[-1]})))
    state = parse_listing(answer(run(loop, env.step(call("key", {"name": "Tab"})))))
    assert state.elements[0].value == options[-1]


def test_a_form_is_checked_field_by_field(loop: asyncio.Runner, env: WebEnv) -> None:
    opening = run(loop, env.reset(seed=0, task="library-1"))
    word, title = re.findall(r'"([^"]*)"', str(opening.messages[1].content))[:2]
    run(loop, env.step(call("type", {"element": 2, "text": word})))
    results = parse_listing(answer(run(loop, env.step(call("key", {"name": "Enter"})))))  # the search has no button
    assert results.title == "Search results"
    links = [element for element in results.elements if element.role == "link" and " by " in element.label]
    assert len(links) >= 2 and any(link.label.startswith(f"{title} by ") for link in links)
    wrong = next(link for link in links if not link.label.startswith(f"{title} by "))
    book = parse_listing(answer(run(loop, env.step(call("click", {"element": wrong.id})))))
    borrow = next(element for element in book.elements if element.label == "Borrow")
    done = run(loop, env.step(call("click", {"element": borrow.id})))
    assert done.done and done.reward == 0.0 and list(done.info["wrong_fields"]) == ["id"]
    late = run(loop, env.reset(seed=0, task="library-1"))  # the same task again: a fresh page, ids from 1
    assert str(late.messages[1].content).endswith('[2] textbox "Search titles" value=""')


def play(cache_dir: Path, policy: str, tasks: list[str]) -> dict[str, Any]:
    config = RolloutConfig(policy=policy, episodes=len(tasks), group_size=1, concurrency=1)
    planned = plan_episodes(tasks, config)

    async def go() -> dict[str, Any]:
        records = await run_rollouts(lambda: WebEnv(EnvConfig(cache_dir=cache_dir, max_steps=5)),
                                     lambda e, p: make_policy(policy, e, p.task, p.seed), planned, config)  # fmt: skip
        assert [(record.task, record.error) for record in records if record.failed] == []
        return {"summary": summarize(records), "rewards": {record.task: record.reward for record in records}}

    return asyncio.run(go())


def test_the_oracle_solves_every_family_and_random_does_not(cache_dir: Path) -> None:
    tasks = [f"{family}-{instance}" for family in FAMILIES for instance in (0, 3)]  # two eval instances each
    # click-test-2-13 draws button TWO over the centre of button ONE: the click goes to the part in sight
    oracle = play(cache_dir, "oracle", [*tasks, "click-test-2-13"])
    assert {task: reward for task, reward in oracle["rewards"].items() if reward != 1.0} == {}
    assert play(cache_dir, "random", tasks[::2])["summary"]["mean_reward"] <= 0.1


def clawrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawrl.cli", *args], capture_output=True, text=True, timeout=180)


def test_the_command_line_contract(cache_dir: Path) -> None:
    listed = clawrl("envs", "list", "--json", "--cache-dir", str(cache_dir))
    assert listed.returncode == 0, listed.stderr
    web = next(item for item in json.loads(listed.stdout) if item["name"] == "web")
    assert (web["train_tasks"], web["eval_tasks"]) == (20 * len(FAMILIES), 4 * len(FAMILIES))
    summaries = {}
    for policy in ("oracle", "random"):
        result = clawrl("rollout", "--env", "web", "--policy", policy, "--episodes", "4", "--json", "--cache-dir", str(cache_dir))
        assert result.returncode == 0, result.stderr
        summaries[policy] = json.loads(result.stdout)
    assert summaries["oracle"]["episodes"] == 4 and summaries["oracle"]["failed"] == 0
    assert summaries["oracle"]["mean_reward"] == 1.0
    assert summaries["random"]["failed"] == 0 and summaries["random"]["mean_reward"] < 1.0


def descendants(root: int) -> set[int]:
    """The host pids of every process below `root`."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass  # it exited while we looked
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def command_names(pids: set[int]) -> set[str]:
    names = set()
    for pid in pids:
        try:
            names.add(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            pass
    return names


RUNNER = """
import asyncio, sys, time
from clawrl.config import EnvConfig
from clawrl.envs.web.env import WebEnv

async def main():
    env = WebEnv(EnvConfig(cache_dir=sys.argv[1]))
    await env.reset(seed=0, task="shipping-0")
    if sys.argv[2] == "close":
        await env.close()
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def start_runner(cache_dir: Path, temp: Path, mode: str) -> subprocess.Popen[str]:
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(cache_dir), mode], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TMPDIR": str(temp)})  # fmt: skip
    assert runner.stdout and runner.stdout.readline() == "ready\n"
    return runner


def wait_gone(pids: set[int], seconds: float) -> set[int]:
    """The pids still alive after up to `seconds`."""
    deadline = time.monotonic() + seconds
    alive = {pid for pid in pids if Path(f"/proc/{pid}").exists()}
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = {pid for pid in alive if Path(f"/proc/{pid}").exists()}
    return alive


@pytest.mark.parametrize("ending", ["close", "sigkill"])
def test_nothing_is_left_after_close_or_a_sigkill_of_the_runner(ending: str, cache_dir: Path, tmp_path: Path) -> None:
    temp = tmp_path / "runner-tmp"  # the runner's TMPDIR: any temporary directory would land here
    temp.mkdir()
    runner = start_runner(cache_dir, temp, "close" if ending == "close" else "open")
    below = descendants(runner.pid)
    if ending == "close":
        assert below == set()  # the runner lives on; the browser, its sandbox and their processes are gone
        runner.kill()
    else:
        assert {"chromium", "chromedriver", "python3"} <= command_names(below)
        runner.send_signal(signal.SIGKILL)
    runner.wait()
    assert wait_gone(below, 15) == set()
    assert "clawrl" not in Path("/proc/self/mountinfo").read_text()
    assert not list(temp.iterdir())
