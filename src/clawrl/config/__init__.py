"""Configuration: one pydantic-settings object per component, composed into one per command.

Every field is documented, has a default that works, and can be overridden by an environment
variable `CLAWRL_<FIELD>` or a `clawrl` flag `--<field-with-dashes>` (flags win over the
environment). A few upstream (OpenClaw-RL) variable names are accepted as aliases so its users can
switch without renaming their deployment's environment. A list setting (`--toolcall-kinds a,b`,
`--background-cpus 0,2-3`, `--seed-list 10-14`) is a list in Python and is written, in a flag, a
variable or a dump, as the flag takes it.

The package, by subsystem:

* `base`: what the settings classes share: `ComponentSettings`, `CommandSettings`, list types,
  `describe_settings_error`;
* `engine`, `store`, `serve` (and the dashboard), `judge`, `train`, `background`, `envs`, `bench`:
  one component's settings each, with the checks that concern that component alone;
* `commands`: the settings of each command (`ServeSettings`, `TrainSettings`, ...), one field per
  component, with the checks across components.

Settings that only make sense together are checked by validators on these classes, so that a bad
combination is refused when the settings are read, whichever command reads them. This module's
names are the package's API: import them from `clawrl.config`.
"""

from __future__ import annotations

from clawrl.config.background import BackgroundConfig, parse_cpu_list
from clawrl.config.base import CommandSettings, ComponentSettings, FlagList, RangeList, describe_settings_error
from clawrl.config.bench import REPORT_SEEDS, SEED_SETS, TUNING_SEEDS, BenchConfig, parse_seeds
from clawrl.config.commands import (
    DashboardSettings,
    EnvsServeSettings,
    JudgeSettings,
    RolloutSettings,
    ServeSettings,
    TrainSettings,
)
from clawrl.config.engine import EngineConfig
from clawrl.config.envs import EnvConfig, EnvServeConfig, RolloutConfig
from clawrl.config.judge import JudgeConfig
from clawrl.config.serve import DashboardConfig, ServeConfig
from clawrl.config.store import StoreConfig
from clawrl.config.train import LossAggregation, LossConfig, TrainConfig

__all__ = [
    "REPORT_SEEDS",
    "SEED_SETS",
    "TUNING_SEEDS",
    "BackgroundConfig",
    "BenchConfig",
    "CommandSettings",
    "ComponentSettings",
    "DashboardConfig",
    "DashboardSettings",
    "EngineConfig",
    "EnvConfig",
    "EnvServeConfig",
    "EnvsServeSettings",
    "FlagList",
    "JudgeConfig",
    "JudgeSettings",
    "LossAggregation",
    "LossConfig",
    "RangeList",
    "RolloutConfig",
    "RolloutSettings",
    "ServeConfig",
    "ServeSettings",
    "StoreConfig",
    "TrainConfig",
    "TrainSettings",
    "describe_settings_error",
    "parse_cpu_list",
    "parse_seeds",
]
