"""Model runtimes behind one protocol (DESIGN §7); `build_engine` picks one from the config."""

from __future__ import annotations

from clawrl.config import EngineConfig
from clawrl.engines.base import Engine, GenerationStream, SamplingParams, ScoredResponse, TokenStep

__all__ = ["Engine", "GenerationStream", "SamplingParams", "ScoredResponse", "TokenStep", "build_engine", "model_source"]


def model_source(config: EngineConfig) -> str:
    """Where the weights of `config.model` live: locally built models are built (or reused) here.

    `tiny` is the locally built tiny model (random weights) and `tiny-pretrained` the same architecture
    pre-trained on the learning benchmark's conversations (minutes to build, once), both cached under
    `config.cache_dir`; anything else is a local
    directory or a hub id, passed through. Serving and the trainer both load from this, so they
    always start from the same weights.
    """
    if config.model == "tiny":
        from clawrl.sim.tiny import tiny_model_path

        return str(tiny_model_path(config.cache_dir, config.seed))
    if config.model == "tiny-pretrained":
        from clawrl.sim.pretrain import pretrained_model_path

        return str(pretrained_model_path(config.cache_dir, config.seed))
    return config.model


def build_engine(config: EngineConfig) -> Engine:
    """The engine `config` asks for, constructed but not started (call `await engine.start()`)."""
    if config.engine == "hf":
        # Imported here so that importing the protocol does not pull in PEFT and model code.
        from clawrl.engines.hf import HFEngine

        return HFEngine(config, model_path=model_source(config))
    raise ValueError(f"unknown engine {config.engine!r}")
