"""Model names to weights: the locally built models by name, anything else passed through.

`tiny` is the tiny model with random weights (`tiny.py`, seconds to build), `tiny-pretrained`
the same architecture pre-trained on the learning benchmark's conversations (`pretrain.py`,
minutes, once per machine), and `tiny-toolcall`, `tiny-terminal`, `tiny-swe` and `tiny-web` that
model taught an environment family's format (`agents.py`, minutes more); all are cached under
`EngineConfig.cache_dir`. Anything else is a
local directory or a hub id and is returned as it is. The commands that load the served model
(`clawrl serve`, `clawrl train`, the benchmark) resolve it here and hand the engine and the
trainer a path, so serving and training always start from the same weights and the engines never
depend on how the tiny models are made.
"""

from __future__ import annotations

from clawrl.config import EngineConfig
from clawrl.sim.agent_cache import agent_model_path
from clawrl.sim.agents import FAMILIES
from clawrl.sim.pretrain import pretrained_model_path
from clawrl.sim.tiny import tiny_model_path


def resolve_model(config: EngineConfig) -> str:
    """Where the weights of `config.model` live, building a locally built model first if needed."""
    if config.model == "tiny":
        return str(tiny_model_path(config.cache_dir, config.seed))
    if config.model == "tiny-pretrained":
        return str(pretrained_model_path(config.cache_dir, config.seed))
    family = config.model.removeprefix("tiny-")
    if config.model.startswith("tiny-") and family in FAMILIES:
        return str(agent_model_path(config.cache_dir, family, config.seed))
    return config.model
