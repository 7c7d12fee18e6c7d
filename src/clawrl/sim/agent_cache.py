"""The cache of tiny agents: each is built once (demonstrations played, then the model trained)
under a hash of what determines it, and found there afterwards.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from clawrl.envs.swe.generate import GENERATOR_VERSION as SWE_GENERATOR_VERSION
from clawrl.envs.terminal.tasks import GENERATOR_VERSION
from clawrl.envs.toolcall.problems import problem, problem_ids
from clawrl.envs.web.tasks import PAGES_VERSION as WEB_PAGES_VERSION
from clawrl.sim.agent_training import COPY_DRILLS_VERSION, DRILLS, LINE_DRILLS_VERSION, LOOKUP_DRILLS_VERSION, train_agent
from clawrl.sim.agents import (
    AGENTS_VERSION,
    FAMILIES,
    HABITS,
    SWE_DEMONSTRATION_LIBRARIES,
    SWE_DEMONSTRATION_LINES,
    WEB_DEMONSTRATION_INSTANCES,
    AgentConfig,
    agent_config,
    demonstration_words,
    micro_env_config,
    play_demonstrations,
    swe_fix_command,
)
from clawrl.sim.pretrain import pretrained_model_path

log = logging.getLogger(__name__)


def agent_key(family: str, base_dir: Path, seed: int, config: AgentConfig) -> str:
    """A hash of what determines the agent: versions, base model, family, habits, micro split, config, seed."""
    micro = micro_env_config(family).model_dump(mode="json", exclude={"cache_dir"})
    settings = asdict(config)
    if family not in DRILLS:  # the tool-call agent has no drills: its key stays as it was
        settings = {name: value for name, value in settings.items() if not name.startswith("copy_")}
    identity = {"version": AGENTS_VERSION, "base": base_dir.name, "family": family, "habits": HABITS[family],
                "micro": micro, "seed": seed, "config": settings}  # fmt: skip
    if family == "toolcall":  # the problems themselves: a change to a generator is a new key
        identity["problems"] = [problem(task).question for task in problem_ids("train", 8, ["arithmetic", "units"], [1, 2])]
    elif family == "swe":
        identity["generator"], identity["libraries"] = SWE_GENERATOR_VERSION, SWE_DEMONSTRATION_LIBRARIES
        identity["fix"], identity["lines"], identity["renumbered"] = swe_fix_command(1), SWE_DEMONSTRATION_LINES, "every use"
        identity["drills"] = LINE_DRILLS_VERSION
    elif family == "web":
        identity["pages"], identity["instances"] = WEB_PAGES_VERSION, [WEB_DEMONSTRATION_INSTANCES.start, WEB_DEMONSTRATION_INSTANCES.stop]
        identity["drills"] = LOOKUP_DRILLS_VERSION
    else:  # the names the demonstrations and drills use, and the drills' shape
        identity["words"], identity["drills"], identity["tasks"] = demonstration_words()[:8], COPY_DRILLS_VERSION, GENERATOR_VERSION
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def agent_model_path(cache_dir: Path, family: str, seed: int = 0, config: AgentConfig | None = None) -> Path:
    """The cached tiny agent of `family`, built first when missing (minutes: the base model, then the agent)."""
    if family not in FAMILIES:
        raise ValueError(f"no tiny agent for {family!r}; families are {', '.join(FAMILIES)}")
    config = config or agent_config(family)
    base_dir = pretrained_model_path(cache_dir, seed)
    target = Path(cache_dir) / f"tiny-{family}-seed{seed}-{agent_key(family, base_dir, seed, config)}"
    if target.is_dir():
        return target
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits and reuses the first one's result
        if target.is_dir():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            _build(family, base_dir, staging, seed, config, cache_dir)
            staging.chmod(0o755)
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _build(family: str, base_dir: Path, out_dir: Path, seed: int, config: AgentConfig, cache_dir: Path) -> None:
    started = time.perf_counter()
    log.info("building the tiny %s agent: %d demonstration episodes, %d steps (minutes, once)", family,
             config.demonstrations, config.steps)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="clawrl-demos-") as work:
        demonstrations = play_demonstrations(family, config.demonstrations, seed, Path(work), cache_dir)
    losses = train_agent(base_dir, demonstrations, out_dir, seed, config)
    (out_dir / "agent.json").write_text(json.dumps({
        "family": family, "seed": seed, "base": base_dir.name, "config": asdict(config), "habits": demonstrations.habits,
        "demonstration_reward": sum(record.reward for record in demonstrations.episodes) / len(demonstrations.episodes),
        "final_loss": sum(losses[-20:]) / len(losses[-20:]), "seconds": round(time.perf_counter() - started, 1),
    }, indent=2))  # fmt: skip
