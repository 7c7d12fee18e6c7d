"""Model runtimes behind one protocol (DESIGN §7); `build_engine` picks one from the config."""

from __future__ import annotations

from clawrl.config import EngineConfig
from clawrl.engines.base import Engine, GenerationStream, SamplingParams, ScoredResponse, TokenStep

__all__ = ["Engine", "GenerationStream", "SamplingParams", "ScoredResponse", "TokenStep", "build_engine"]


def build_engine(config: EngineConfig) -> Engine:
    """The engine `config` asks for, constructed but not started (call `await engine.start()`).

    `config.model == "tiny"` resolves to the locally built tiny model, building it on first use.
    """
    if config.engine == "hf":
        # Imported here so that importing the protocol does not pull in PEFT and model code.
        from clawrl.engines.hf import HFEngine

        if config.model == "tiny":
            from clawrl.sim.tiny import tiny_model_path

            return HFEngine(config, model_path=tiny_model_path(config.cache_dir, config.seed))
        return HFEngine(config)
    raise ValueError(f"unknown engine {config.engine!r}")
