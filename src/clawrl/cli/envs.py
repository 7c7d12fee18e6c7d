"""The general-agent environments' commands (DESIGN §9): `clawrl envs list`, `clawrl envs serve`
and `clawrl rollout`."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from clawrl.cli.common import _print_json
from clawrl.cli.flags import config_from_args
from clawrl.config import EnvConfig, EnvsServeSettings, RolloutConfig, RolloutSettings
from clawrl.logs import uvicorn_logging
from clawrl.preflight import StartupError, check_port, check_server, check_writable_file


def cmd_envs_list(args: argparse.Namespace) -> int:
    import asyncio

    from clawrl.envs.registry import describe_environments

    described = asyncio.run(describe_environments(config_from_args(EnvConfig, args)))
    if args.json:
        _print_json(described)
        return 0
    for item in described:
        print(f"{item['name']:<10} {item['train_tasks']:>5} train {item['eval_tasks']:>5} eval  {item['description']}")
    return 0


def _environment_or_exit(config: EnvConfig) -> Any:
    """The environment class `--env` names, once one was made with the settings given (its tasks
    directory or instances file, its micro split), or exit with the error that says what is wrong."""
    from clawrl.envs.registry import environment_class

    if config.terminal_tasks_dir is not None and not config.terminal_tasks_dir.is_dir():
        raise StartupError(f"--terminal-tasks-dir {config.terminal_tasks_dir}: no such directory",
                           "give a directory of terminal task folders, or leave it unset for the built-in tasks")
    if config.swe_instances is not None and not config.swe_instances.is_file():
        raise StartupError(f"--swe-instances {config.swe_instances}: no such file",
                           "give a JSON Lines file of SWE instances, or leave it unset for the built-in instances")
    try:
        kind = environment_class(config.env)
    except ValueError as error:
        raise StartupError(str(error), "pick one with --env (`clawrl envs list`)") from None
    try:
        kind(config)  # its micro-split flags (--web-families, --swe-kinds, ...) are checked when it is made
    except ValueError as error:
        raise StartupError(str(error)) from None
    return kind


def cmd_envs_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from clawrl.envs.http import create_env_app
    from clawrl.envs.registry import make_environment

    settings = config_from_args(EnvsServeSettings, args)
    config, server = settings.env, settings.server
    description = _environment_or_exit(config).description
    check_port(server.host, server.port)
    app = create_env_app(lambda: make_environment(config), description, server.max_episodes, server.idle_timeout_s,
                         server.step_timeout_s)  # fmt: skip
    logging.getLogger("clawrl").info("serving the %s environment on http://%s:%d", config.env, server.host, server.port)
    uvicorn.run(app, host=server.host, port=server.port, **uvicorn_logging())
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    import asyncio

    settings = config_from_args(RolloutSettings, args)
    env_config, config = settings.env, settings.rollout
    _environment_or_exit(env_config)
    if config.record is not None:
        check_writable_file(config.record, "--record")
    if config.server is not None:
        check_server(config.server, config.api_key)
    if config.placement == "ray":
        summary = _rollout_on_ray(env_config, config)
    else:
        from clawrl.envs.rollout import rollout

        summary = asyncio.run(rollout(env_config, config))
    if args.json:
        _print_json(summary)
    else:
        print(f"{summary['episodes']} episodes, {summary['failed']} failed, mean reward {summary['mean_reward']}")
    return 0


def _rollout_on_ray(env_config: EnvConfig, config: RolloutConfig) -> dict[str, Any]:
    """`clawrl rollout --placement ray`; Ray is imported here only, and its absence is a startup error."""
    import asyncio

    try:
        from clawrl.envs.ray_rollout import RolloutActorError, rollout_on_ray
    except ModuleNotFoundError as error:
        if error.name != "ray":
            raise
        raise StartupError("--placement ray needs Ray, which is not installed", "pip install 'clawrl[ray]'") from None
    try:
        return asyncio.run(rollout_on_ray(env_config, config))
    except RolloutActorError as error:
        raise StartupError(str(error), "check that every node reaches --server and can make the environment") from None
