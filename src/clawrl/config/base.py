"""What every settings class shares: its environment variables, its list fields, the way a refused
setting is described, and the composed settings of a command.

Two kinds of settings classes build on this:

* a component's settings (`ComponentSettings`: `EngineConfig`, `StoreConfig`, ...), each field a
  `--flag` and a `CLAWRL_<FIELD>` variable, with the checks that concern that component alone;
* a command's settings (`CommandSettings`: `ServeSettings`, `TrainSettings`, ...), one field per
  component the command reads, with the checks across components (`--lora-rank` against the
  engine's `--max-lora-rank`, say). A command reads its settings once, as this one object.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Self, TypeVar

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    ValidationError,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

T = TypeVar("T")


def with_upstream(name: str, *upstream: str) -> AliasChoices:
    """`CLAWRL_<NAME>` first, then upstream's names for the same setting.

    pydantic-settings does not put `env_prefix` in front of an alias, so a field with upstream
    names has to list its own `CLAWRL_` name too; keyword construction still uses the field name
    (`populate_by_name`).
    """
    return AliasChoices(f"CLAWRL_{name.upper()}", *upstream)


class ComponentSettings(BaseSettings):
    """One component's settings: every field is a `--flag` and a `CLAWRL_<FIELD>` variable."""

    # `env_prefix` gives every field its `CLAWRL_<FIELD>` variable (case-insensitive).
    model_config = SettingsConfigDict(env_prefix="CLAWRL_", populate_by_name=True, extra="ignore")

    @classmethod
    def from_flags(cls, given: Mapping[str, Any]) -> Self:
        """These settings from the flags in `given` (field name -> value) that are its fields; the
        others come from the environment, then the defaults."""
        return cls(**{name: given[name] for name in cls.model_fields if name in given})


class CommandSettings(BaseModel):
    """The settings of one `clawrl` command: one field per component it reads (each a
    `ComponentSettings`), and validators for the rules that span components.

    `SomeSettings()` reads every component from the environment; `from_flags` lets flags win.
    """

    model_config = ConfigDict(extra="forbid")  # `ServeSettings(engin=...)` is a mistake, not a default

    @classmethod
    def components(cls) -> dict[str, type[ComponentSettings]]:
        """Field name -> the settings class of that component, in the order of its flags in `--help`."""
        return {name: info.annotation for name, info in cls.model_fields.items()}  # type: ignore[misc]

    @classmethod
    def from_flags(cls, given: Mapping[str, Any]) -> Self:
        """Each component from the flags in `given` (the rest from the environment), then the checks
        across them. A component that refuses its settings raises its own ValidationError (titled
        with its class name), a rule across components one of this class."""
        return cls(**{name: component.from_flags(given) for name, component in cls.components().items()})


# --- list settings ----------------------------------------------------------------------------


class FlagList(list[T]):
    """The value of a list setting. `str()` writes it as its flag and variable take it (`a,b,c`),
    so that a command line, a dump or a `CLAWRL_*` variable made from it reads back the same."""

    def __str__(self) -> str:
        return ",".join(map(str, self))


class RangeList(FlagList[int]):
    """Numbers where the flag takes ranges too (`0,2-3`): `str()` writes a run as a range."""

    def __str__(self) -> str:
        parts: list[str] = []
        start = 0
        for end in range(1, len(self) + 1):
            if end == len(self) or self[end] != self[end - 1] + 1:
                low, high = self[start], self[end - 1]
                parts.append(str(low) if low == high else f"{low}-{high}")
                start = end
        return ",".join(parts)


def split_commas(value: Any) -> Any:
    """`"a, b,c"` -> `["a", "b", "c"]` (`""` -> `[]`); a value that is not text (a list given in
    Python) is left to the field's type."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


def flag_spelling(value: Any) -> Any:
    """How a list setting is written out: as its flag takes it (None stays None)."""
    if value is None or isinstance(value, str):
        return value
    return str(value if isinstance(value, FlagList) else FlagList(value))


def _a_name(item: str) -> str:
    if not re.fullmatch(r"[\w.-]+", item):
        raise ValueError("not a name (expected comma-separated names, e.g. a,b)")
    return item


def parse_ranges(text: str, what: str = "number", example: str = "1 or 2-3 or 0,2") -> list[int]:
    """`"0,2-3"` -> `[0, 2, 3]`: comma-separated non-negative numbers and inclusive ranges, in order."""
    numbers: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\s*-\s*(\d+))?\s*", part)
        if match is None or int(match[2] or match[1]) < int(match[1]):
            raise ValueError(f"not a {what} or a range of {what}s: {part!r} (expected e.g. {example})")
        numbers += range(int(match[1]), int(match[2] or match[1]) + 1)
    return numbers


def as_flag_list(kind: type[FlagList[Any]]) -> AfterValidator:
    """The validator that makes a list setting's value a `kind` (text or None as it is: a value that
    `model_copy(update=...)` set without validation)."""
    return AfterValidator(lambda value: value if value is None or isinstance(value, str) else kind(value))


# Names (`arithmetic,units`): `--flag a,b` and `CLAWRL_X=a,b` give ["a", "b"], "" gives [].
# `NoDecode`: pydantic-settings would read a list's variable as JSON; it is read as the flag is.
Names = Annotated[list[Annotated[str, AfterValidator(_a_name)]], NoDecode, BeforeValidator(split_commas),
                  as_flag_list(FlagList), PlainSerializer(flag_spelling)]
# Whole numbers (`1,2`).
Numbers = Annotated[list[int], NoDecode, BeforeValidator(split_commas), as_flag_list(FlagList),
                    PlainSerializer(flag_spelling)]


def describe_settings_error(config: type[BaseModel], error: ValidationError) -> str:
    """One line for the `clawrl` user: each problem with the flag and the variables that set it.

    `config` is the class that was read: a component's settings, or a command's, whose components
    are searched for the field the error names.
    """
    problems = []
    for item in error.errors(include_url=False):
        if not item["loc"]:  # a cross-field validator: its message already names the flags
            problems.append(str(item["ctx"]["error"]) if "ctx" in item else item["msg"])
            continue
        names = _setting_names(_classes(config, error), str(item["loc"][0]))
        problems.append(f"{names}: {item['msg']} (got {item['input']!r})")
    return "; ".join(problems)


def _classes(config: type[BaseModel], error: ValidationError) -> list[type[BaseModel]]:
    """The settings classes an error's field may belong to: the one that raised it first."""
    if not issubclass(config, CommandSettings):
        return [config]
    components: list[type[BaseModel]] = list(config.components().values())
    return sorted(components, key=lambda component: component.__name__ != error.title)


def _setting_names(configs: Iterable[type[BaseModel]], where: str) -> str:
    """`--flag (VARIABLE)` of the field that an error's location names.

    pydantic reports a value read through an alias under the first alias, whichever one the user
    set (`CLAWRL_PORT` for `PORT=abc`), so an aliased field lists all of its variables.
    """
    for config in configs:
        for name, info in config.model_fields.items():
            aliases = info.validation_alias.choices if isinstance(info.validation_alias, AliasChoices) else []
            if where == name or where in aliases:
                variables = aliases or [f"{config.model_config.get('env_prefix', '')}{name.upper()}"]
                return f"--{name.replace('_', '-')} ({' or '.join(map(str, variables))})"
    return where
