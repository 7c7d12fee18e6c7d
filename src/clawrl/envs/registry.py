"""The environments clawrl knows by name: `clawrl envs list`, `--env NAME`."""

from __future__ import annotations

from typing import Any

from clawrl.config import EnvConfig
from clawrl.envs.protocol import Environment
from clawrl.envs.swe.env import SWEEnv
from clawrl.envs.terminal.env import TerminalEnv
from clawrl.envs.toolcall.env import ToolCallEnv
from clawrl.envs.web.env import WebEnv

Family = type[ToolCallEnv] | type[TerminalEnv] | type[SWEEnv] | type[WebEnv]
ENVIRONMENTS: dict[str, Family] = {family.name: family for family in (ToolCallEnv, TerminalEnv, SWEEnv, WebEnv)}


def environment_class(name: str) -> Family:
    """The environment class `name` names; ValueError, listing the names, for an unknown one."""
    if name not in ENVIRONMENTS:
        raise ValueError(f"no environment {name!r}; the environments are {', '.join(ENVIRONMENTS)}")
    return ENVIRONMENTS[name]


def make_environment(config: EnvConfig) -> Environment:
    """A new environment of the kind `config.env` names; ValueError for an unknown name."""
    return environment_class(config.env)(config)


async def describe_environments(config: EnvConfig) -> list[dict[str, Any]]:
    """Each environment's name, description and split sizes, as `clawrl envs list --json` prints them."""
    described = []
    for name in ENVIRONMENTS:
        env = make_environment(config.model_copy(update={"env": name}))
        train, evaluation = await env.tasks("train"), await env.tasks("eval")
        described.append({"name": name, "description": ENVIRONMENTS[name].description, "train_tasks": len(train), "eval_tasks": len(evaluation)})
    return described
