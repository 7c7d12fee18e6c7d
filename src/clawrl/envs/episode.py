"""What the tool-using families share: step counting, tool dispatch and the end of an episode.

A family says which tools it offers (`Tool`: an OpenAI schema, a coroutine that runs it, and
whether calling it ends the episode), how an episode opens, and how its outcome is scored; the
base class does the rest the same way for all of them: each call of an action is answered in
order by a `tool` message; a call it cannot run (unknown tool, arguments that are not a JSON
object, a missing or mistyped argument) gets an error message in-band and costs the step; an
answer without tool calls, an ending tool, a task that ended by itself (`_task_over`), or the step
limit ends the episode and asks the family for the outcome reward.
"""

from __future__ import annotations

import abc
import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from clawrl.envs.protocol import (
    Action,
    ChatMessage,
    Environment,
    EpisodeOverError,
    EpisodeState,
    Observation,
    StepResult,
    ToolCall,
)
from clawrl.types import ToolSpec

# JSON-schema types the argument check understands; anything else is passed through unchecked
_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,)}


@dataclass(frozen=True)
class Tool:
    """A tool a family offers: `run(arguments)` returns the text of its tool message."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    run: Callable[[dict[str, Any]], Awaitable[str]]
    ends_episode: bool = False

    def spec(self) -> ToolSpec:
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True)
class Outcome:
    """How an episode ended: its reward and what records should say about it."""

    reward: float
    info: dict[str, Any]


def truncate(text: str, limit: int) -> str:
    """Keep the head and the tail of a long output: errors tend to be at the end."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def command_output(stdout: str, stderr: str, exit_code: int, timed_out: bool, limit: int) -> str:
    """A command's result as the model reads it: stdout, then stderr and the exit status when notable."""
    parts = [stdout]
    if stderr:
        parts.append(f"[stderr]\n{stderr}")
    if timed_out:
        parts.append("[timed out: the command was killed]")
    elif exit_code != 0:
        parts.append(f"[exit code {exit_code}]")
    text = "\n".join(part.rstrip("\n") for part in parts if part)
    return truncate(text, limit) or "[no output]"


class ToolEnvironment(Environment):
    """Base of the families: one episode at a time, at most `max_steps` actions."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps
        self._state = EpisodeState()
        self._tools: dict[str, Tool] = {}

    # --- what a family provides ---

    @abc.abstractmethod
    async def _open(self, task: str, seed: int) -> tuple[list[ChatMessage], list[Tool]]:
        """Prepare `task` and return its opening messages and tools."""

    @abc.abstractmethod
    async def _outcome(self, final: Action) -> Outcome:
        """Score the finished episode; `final` is its last action."""

    async def _task_over(self) -> bool:
        """Whether the task has ended by itself during the step (a web page that ends its own
        task); the step then ends the episode. The families whose tasks end only through the
        model's moves keep this answer."""
        return False

    # --- the protocol ---

    async def reset(self, seed: int, task: str | None = None) -> Observation:
        task = task or await self._task_for_seed(seed)
        messages, tools = await self._open(task, seed)
        self._tools = {tool.name: tool for tool in tools}
        self._state = EpisodeState(episode_id=uuid.uuid4().hex, task=task)
        return Observation(messages=messages, tools=[tool.spec() for tool in tools])

    async def step(self, action: Action) -> StepResult:
        if self._state.episode_id is None or self._state.done:
            raise EpisodeOverError("no episode in progress: reset first")
        self._state.step_count += 1
        replies = [await self._answer(call) for call in action.tool_calls]
        ending = not action.tool_calls or any(self._ends(call) for call in action.tool_calls)
        ending = ending or await self._task_over()
        truncated = not ending and self._state.step_count >= self.max_steps
        if not (ending or truncated):
            return StepResult(observation=Observation(messages=replies))
        outcome = await self._outcome(action)
        self._state.done, self._state.reward = True, outcome.reward
        info = {**outcome.info, "truncated": truncated}
        return StepResult(observation=Observation(messages=replies), reward=outcome.reward, done=True, info=info)

    async def state(self) -> EpisodeState:
        return self._state.model_copy()

    async def _task_for_seed(self, seed: int) -> str:
        train = await self.tasks("train")
        return train[seed % len(train)]

    def _ends(self, call: ToolCall) -> bool:
        tool = self._tools.get(call.function.name)
        return tool is not None and tool.ends_episode

    async def _answer(self, call: ToolCall) -> ChatMessage:
        tool = self._tools.get(call.function.name)
        if tool is None:
            text = f"error: there is no tool {call.function.name!r}; the tools are {', '.join(sorted(self._tools))}"
        else:
            arguments, problem = parse_arguments(call.function.arguments, tool.parameters)
            text = f"error: {problem}" if problem else await tool.run(arguments)
        return ChatMessage(role="tool", tool_call_id=call.id, content=text)


def parse_arguments(text: str, schema: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The call's arguments, or what is wrong with them (for the in-band error message)."""
    try:
        arguments = json.loads(text or "{}")
    except json.JSONDecodeError as error:
        return {}, f"the arguments are not valid JSON ({error.msg} at character {error.pos})"
    except ValueError:  # not a decode error: an integer over Python's 4,300-digit conversion limit
        # Like the nesting below, raised here it crashed the step (a 500 from `clawrl envs serve`, a
        # failed episode in a rollout): the model's arguments are the model's mistake, told in band.
        return {}, f"the arguments are not valid JSON (an integer has more than {sys.get_int_max_str_digits()} digits)"
    except RecursionError:  # nested deeper than the parser's stack
        return {}, "the arguments are not valid JSON (nested too deep)"
    if not isinstance(arguments, dict):
        return {}, "the arguments must be a JSON object"
    properties = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in arguments:
            return {}, f"missing argument {name!r}"
    for name, value in arguments.items():
        expected = _JSON_TYPES.get(properties.get(name, {}).get("type", ""))
        # bool is an int in Python, never a JSON integer
        if expected and (not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected)):
            return {}, f"argument {name!r} must be a {properties[name]['type']}"
    return arguments, None
