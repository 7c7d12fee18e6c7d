"""One settings object per `clawrl` command: the components it reads, and the rules across them.

A command reads its settings once, as one of these (`clawrl.cli.config_from_args`); its flags are
the fields of its components (`add_config_flags`). A rule that needs two components (the engine
and the trainer, say) is a validator here, so that a combination that cannot work is refused when
the settings are read, before anything loads, with one line that names the flags. What needs the
machine or the network to tell (a port, a directory, a server, a device) is checked later, by
`clawrl.preflight`.
"""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from clawrl.config.background import BackgroundConfig
from clawrl.config.base import CommandSettings
from clawrl.config.engine import EngineConfig
from clawrl.config.envs import EnvConfig, EnvServeConfig, RolloutConfig
from clawrl.config.judge import JudgeConfig
from clawrl.config.serve import DashboardConfig, ServeConfig
from clawrl.config.store import StoreConfig
from clawrl.config.train import TrainConfig


class ServeSettings(CommandSettings):
    """`clawrl serve`: the engine, the store, the HTTP server, the judge, and the trainer it starts."""

    engine: EngineConfig = Field(default_factory=EngineConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    background: BackgroundConfig = Field(default_factory=BackgroundConfig)

    @model_validator(mode="after")
    def _judge_actors_are_placed_by_ray(self) -> Self:
        if self.judge.judge_actors and self.engine.placement != "ray":
            raise ValueError(f"--judge-actors {self.judge.judge_actors} places judges on a Ray cluster: "
                             "add --placement ray, or drop --judge-actors (the judge then runs in the server)")
        if self.judge.judge_actors and self.judge.judge == "off":
            raise ValueError("--judge off leaves nothing for --judge-actors to run: drop one of them")
        return self

    @model_validator(mode="after")
    def _the_engine_can_serve_what_the_trainer_publishes(self) -> Self:
        engine, train = self.engine, self.train
        if train.method is None:  # no trainer: any engine serves the base model
            return self
        if engine.engine == "openai" and train.full:
            raise ValueError("--engine openai cannot swap in full-weight versions (a remote server has no call for it); "
                             "train LoRA adapters (drop --full) or use --engine vllm")
        if engine.engine == "vllm" and not train.full and train.lora_rank > engine.max_lora_rank:
            raise ValueError(f"--lora-rank {train.lora_rank} is above --max-lora-rank {engine.max_lora_rank}; "
                             "raise --max-lora-rank or lower --lora-rank")
        _check_quantized_base_is_frozen(engine, train)
        _check_per_user_lineages(train)
        return self


class TrainSettings(CommandSettings):
    """`clawrl train`: the trainer alone (also as the child `clawrl serve --method` starts)."""

    engine: EngineConfig = Field(default_factory=EngineConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    background: BackgroundConfig = Field(default_factory=BackgroundConfig)

    @model_validator(mode="after")
    def _a_quantized_base_cannot_train(self) -> Self:
        _check_quantized_base_is_frozen(self.engine, self.train)
        _check_per_user_lineages(self.train)
        return self


def _check_quantized_base_is_frozen(engine: EngineConfig, train: TrainConfig) -> None:
    # 4-bit weights have no gradient: only an adapter beside them can train
    if engine.quantize != "none" and train.full:
        raise ValueError(f"--quantize {engine.quantize} keeps the base frozen in 4 bits; "
                         "--full would train every weight: drop one of them")


def _check_per_user_lineages(train: TrainConfig) -> None:
    if train.adapters != "per-user":
        return
    # a full model per user is a copy of the base per user: only adapters beside one base scale to many users
    if train.full:
        raise ValueError("--adapters per-user trains a LoRA adapter per user; --full would need a model copy per "
                         "user: drop one of them")
    # the teacher is scored when a sample is built, over every user's turns at once, before any lineage is chosen
    if train.teacher == "policy":
        raise ValueError("--adapters per-user takes the OPD teacher from the base (--teacher base); --teacher policy "
                         "would need each user's own weights loaded to build each sample")


class JudgeSettings(CommandSettings):
    """`clawrl judge`: the standalone judge worker over a run's store."""

    store: StoreConfig = Field(default_factory=StoreConfig)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    background: BackgroundConfig = Field(default_factory=BackgroundConfig)


class DashboardSettings(CommandSettings):
    """`clawrl dashboard`: the dashboard alone, over a run's store."""

    store: StoreConfig = Field(default_factory=StoreConfig)
    dashboard: DashboardConfig = Field(default_factory=DashboardConfig)


class RolloutSettings(CommandSettings):
    """`clawrl rollout`: an environment and the episodes played in it."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)


class EnvsServeSettings(CommandSettings):
    """`clawrl envs serve`: an environment, and the HTTP server that serves it."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    server: EnvServeConfig = Field(default_factory=EnvServeConfig)
