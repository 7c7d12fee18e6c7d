"""Settings as flags: one `--flag` per field of a command's settings (`add_config_flags`), the
settings read back from the flags given (`config_from_args`: flags, then `CLAWRL_*` variables, then
defaults), and the flags every command takes wherever they are written (`--debug`, `--log-format`).
"""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import SecretStr, ValidationError

from clawrl.config import CommandSettings, ComponentSettings, describe_settings_error
from clawrl.logs import LOG_FORMATS
from clawrl.preflight import StartupError

# A settings class a command reads: one component's, or a whole command's.
Settings = TypeVar("Settings", bound=ComponentSettings | CommandSettings)


def add_config_flags(parser: argparse.ArgumentParser, *configs: type[ComponentSettings | CommandSettings]) -> None:
    """One `--flag` per field of each config class (of each component of a command's settings);
    unset flags leave the field to env/defaults."""
    seen: set[str] = set()
    components = [part for config in configs
                  for part in (config.components().values() if issubclass(config, CommandSettings) else [config])]
    for config in components:
        group = parser.add_argument_group(config.__name__, config.__doc__)
        for name, info in config.model_fields.items():
            if name in seen or _strip_optional(info.annotation) is SecretStr:  # a secret: its variable only, never `ps`
                continue
            seen.add(name)
            flag = "--" + name.replace("_", "-")
            kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": _help_text(info.description)}
            annotation = _strip_optional(info.annotation)
            if annotation is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif typing.get_origin(annotation) is typing.Literal:
                kwargs["choices"] = typing.get_args(annotation)
            elif annotation in (int, float, Path):
                kwargs["type"] = annotation
            group.add_argument(flag, **kwargs)


def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return options[0] if len(options) == 1 else str
    return annotation


def config_from_args(config: type[Settings], args: argparse.Namespace) -> Settings:
    """The settings `config` from the flags that were given (the rest come from the environment):
    a command's (`ServeSettings`: each component, then the rules across them) or one component's.

    A setting the config refuses (a bad value, or flags that do not go together) ends the command
    with a one-line error: this is where every command reads its settings.
    """
    try:
        return config.from_flags(vars(args))
    except ValidationError as error:
        raise StartupError(describe_settings_error(config, error)) from None


DEBUG_HELP = "on an error, show the traceback instead of one line (also CLAWRL_DEBUG=1)"


LOG_FORMAT_HELP = "log lines as text or as JSON objects, one per line (also CLAWRL_LOG_FORMAT)"


def _add_global_flags(parser: argparse.ArgumentParser, top: bool = True) -> None:
    """`--debug` and `--log-format` on `clawrl` and on every subcommand, so that they work wherever they are written."""
    parser.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS, help=DEBUG_HELP)
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=None if top else argparse.SUPPRESS, help=LOG_FORMAT_HELP)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _add_global_flags(sub, top=False)


def _help_text(description: str | None) -> str | None:
    """A field's description as argparse help: argparse formats help with %, so a literal one is doubled."""
    return description.replace("%", "%%") if description else description
