"""Scripted policies: baselines and test drivers that play episodes without a model.

A policy maps the conversation so far (OpenAI messages) and the tools offered to the next
assistant message, as a model behind a chat API does; the rollout checks that message like any
other. Two are built in:

- `oracle` knows the task's reference solution (an environment's `reference_solution`): with a
  `python` tool it runs the solution program, then answers `\\boxed{<its output>}`; with a `shell`
  tool it runs the reference script through the shell (terminal: solve.sh; SWE: applying the gold
  patch), then calls the tool that ends the episode (`finish`, or `submit` where that is offered);
  with a browser's `click` tool it plays the web task family's scripted solver (`web/oracle.py`).
  It should score 1 everywhere; when it does not, the task or the environment is broken.
- `random` makes well-formed but aimless moves: each step it calls one offered tool with random
  arguments of the right types, or answers a random number without a tool call.

The model behind a clawrl server is a policy of the same shape (`server.py`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from clawrl.envs.protocol import Environment
from clawrl.envs.records import EpisodeRecord
from clawrl.envs.web.oracle import oracle_reply
from clawrl.types import Message, ToolSpec

Policy = Callable[[list[Message], list[ToolSpec]], Awaitable[Message]]
POLICIES = ("oracle", "random")
_RANDOM_STRINGS = {
    "code": ["print(1)", "print(2 + 2)", "import math\nprint(math.pi)", "print('hello')"],
    "command": ["ls", "pwd", "ls -la", "echo hello", "cat /etc/hostname", "true"],
}


@runtime_checkable
class Finishing(Protocol):
    """A policy told how its episode ended (the server-backed one reports it to the store)."""

    async def finish(self, record: EpisodeRecord) -> None: ...


@runtime_checkable
class Solvable(Protocol):
    """An environment that can show its reference solution (the local families can)."""

    async def reference_solution(self, task: str) -> str: ...


async def make_policy(name: str, env: Environment, task: str, seed: int) -> Policy:
    """The policy `name` for one episode of `task`."""
    if name == "random":
        return RandomPolicy(random.Random(seed))
    if name == "oracle":
        if not isinstance(env, Solvable):
            raise ValueError(f"the oracle needs the task's reference solution, which {type(env).__name__} does not give")
        return OraclePolicy(await env.reference_solution(task))
    raise ValueError(f"no policy {name!r}; policies are {', '.join(POLICIES)}")


def _tool_call(name: str, arguments: dict[str, Any], call_id: str) -> Message:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    ]}  # fmt: skip


def _tool_names(tools: list[ToolSpec]) -> set[str]:
    return {tool["function"]["name"] for tool in tools}


class OraclePolicy:
    """Runs the reference solution with the family's tool, then ends the episode."""

    def __init__(self, reference: str) -> None:
        self.reference = reference

    async def __call__(self, messages: list[Message], tools: list[ToolSpec]) -> Message:
        names = _tool_names(tools)
        started = any(message["role"] == "assistant" for message in messages)
        if "python" in names:
            if not started:
                return _tool_call("python", {"code": self.reference}, "call_oracle")
            return {"role": "assistant", "content": f"\\boxed{{{messages[-1]['content'].strip()}}}"}
        if "shell" in names:
            if not started:
                # a quoted heredoc: the script reaches bash unexpanded, whatever it contains
                command = f"bash <<'CLAWRL_SOLUTION'\n{self.reference.rstrip()}\nCLAWRL_SOLUTION"
                return _tool_call("shell", {"command": command}, "call_oracle")
            return _tool_call("submit" if "submit" in names else "finish", {}, "call_finish")
        if "click" in names:  # a browser: the reference is the task's family, whose solver reads the page
            return oracle_reply(self.reference, messages)
        raise ValueError(f"the oracle knows no way to use the tools {sorted(names)}")


class RandomPolicy:
    """Uniformly: one of the offered tools with random arguments, or a random final answer."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    async def __call__(self, messages: list[Message], tools: list[ToolSpec]) -> Message:
        choice = self.rng.randrange(len(tools) + 1)
        if choice == len(tools):
            return {"role": "assistant", "content": f"\\boxed{{{self.rng.randint(0, 100)}}}"}
        function = tools[choice]["function"]
        arguments = {name: self._value(name, schema) for name, schema in function["parameters"].get("properties", {}).items()}
        return _tool_call(function["name"], arguments, f"call_{self.rng.getrandbits(48):012x}")

    def _value(self, name: str, schema: dict[str, Any]) -> Any:
        kind = schema.get("type")
        if kind == "integer":
            return self.rng.randint(0, 100)
        if kind == "number":
            return round(self.rng.uniform(0, 100), 2)
        if kind == "boolean":
            return self.rng.random() < 0.5
        return self.rng.choice(_RANDOM_STRINGS.get(name, ["x", "hello", "42"]))
