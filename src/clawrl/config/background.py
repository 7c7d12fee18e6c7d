"""How the background processes (the trainer, the standalone judge) give way to serving."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PlainSerializer, field_validator
from pydantic_settings import NoDecode

from clawrl.config.base import ComponentSettings, RangeList, as_flag_list, flag_spelling, parse_ranges


def parse_cpu_list(cpus: str | Iterable[int]) -> set[int]:
    """The CPUs a list such as `0,2-3` names (ValueError for anything else); a list of CPUs as it is."""
    if not isinstance(cpus, str):
        return set(cpus)
    return set(parse_ranges(cpus, "CPU"))


def _cpus_or_a_name(value: Any) -> Any:
    if isinstance(value, str) and value.strip() not in ("auto", "all"):
        return sorted(parse_cpu_list(value))
    return value.strip() if isinstance(value, str) else value


# `auto`, `all`, or the CPUs (`0,2-3` in a flag or a variable, a list in Python; written as ranges)
CpuChoice = Annotated[Literal["auto", "all"] | list[int], NoDecode, BeforeValidator(_cpus_or_a_name),
                      as_flag_list(RangeList), PlainSerializer(flag_spelling)]


class BackgroundConfig(ComponentSettings):
    """How the trainer and the standalone judge give way to serving on a shared machine.

    Serving answers people; training and judging can wait a few milliseconds. So the background
    processes run at a lower CPU priority, on their own cores where the machine has them, with
    few enough threads that they and serving do not oversubscribe the cores.
    """

    background_nice: int = Field(
        10, ge=0, le=19, description="How much lower the trainer's and the standalone judge's CPU priority is than "
        "serving's (a nice increment: 0 = the same, 19 = only idle time when serving is busy)."
    )
    background_cpus: CpuChoice = Field(
        "auto", description="CPUs the trainer and the standalone judge may run on: a list such as `3`, `2-3` or "
        "`0,2`; `auto` = the upper half of the CPUs this process may use (all of them when it may use one); `all`."
    )
    background_threads: int | None = Field(
        None, ge=1, description="torch threads of the trainer and the standalone judge; unset: --cpu-threads when "
        "given, else one per CPU of --background-cpus when those are not all of the machine's, else half of them "
        "(at least 1): never more busy threads than the cores they may use."
    )

    @field_validator("background_cpus")
    @classmethod
    def _usable_cpus(cls, value: str | list[int]) -> str | list[int]:
        # checked where the setting is read, so `clawrl serve` refuses it before its trainer child would
        available = os.sched_getaffinity(0)
        if not isinstance(value, str) and not set(value) & available:
            usable = ",".join(map(str, sorted(available)))
            raise ValueError(f"names no CPU this process may use (it may use {usable})")
        return value
