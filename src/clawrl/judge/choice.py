"""Which judge runs when the user names none (`--judge auto`, the default; issue 27).

A real model judges its own turns (`engine`: m = 3 PRM votes and hint samples, as upstream): it
understands replies no rule or small classifier can. clawrl's tiny models cannot judge anything,
so they, the tests and the demo get the offline judge (`rule`). Naming a judge endpoint or a judge
model chooses that judge. `clawrl serve` logs the choice and the reason at start.

A tiny model is one of the locally built ones by name (`tiny`, `tiny-pretrained`, `tiny-<family>`)
or a directory whose model has a vocabulary under `TINY_VOCABULARY` tokens: the tiny models'
tokenizer is trained on the synthetic corpus (a few thousand tokens), while every released chat
model has tens of thousands or more.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from clawrl.config import JudgeConfig
from clawrl.preflight import is_locally_built

TINY_VOCABULARY = 16_384


@dataclass(frozen=True)
class JudgeChoice:
    judge: str  # a concrete backend: rule, openai, engine, engine+rule or off
    reason: str  # for the start-up log


def choose_judge(config: JudgeConfig, served_model: str | None) -> JudgeChoice:
    """The judge `config` asks for; under `auto`, the one that suits `served_model` (None: nothing is served)."""
    if config.judge != "auto":
        return JudgeChoice(config.judge, f"--judge {config.judge}")
    if config.judge_url and config.judge_model:
        return JudgeChoice("openai", f"--judge-url names a judge endpoint (model {config.judge_model})")
    if config.judge_model:
        return JudgeChoice("engine", f"--judge-model names a model to judge with ({config.judge_model})")
    if served_model is None:
        return JudgeChoice("rule", "no model to judge with: the offline judge (rules, lexicon and classifier)")
    if is_tiny(served_model):
        return JudgeChoice("rule", f"{served_model} is a tiny model, too small to judge its own turns: the offline "
                           "judge (rules, lexicon and classifier) judges them; --judge engine to override")
    return JudgeChoice("engine", f"the served model {served_model} judges its own turns ({config.prm_m} votes, as "
                       "upstream); --judge rule for the offline judge, --judge engine+rule for both")


def is_tiny(model: str) -> bool:
    """One of clawrl's tiny models: built locally by name, or a directory whose vocabulary is that small."""
    if is_locally_built(model):
        return True
    vocabulary = _vocabulary_size(Path(model).expanduser())
    return vocabulary is not None and vocabulary < TINY_VOCABULARY


def _vocabulary_size(model_dir: Path) -> int | None:
    """`vocab_size` of a local model directory's config.json; None for a hub id or an unreadable config."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size", config.get("text_config", {}).get("vocab_size"))
    return size if isinstance(size, int) else None
