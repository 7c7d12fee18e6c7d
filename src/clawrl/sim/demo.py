"""`clawrl demo` (`make demo`): watch the agent learn a user's preference on the CPU, in minutes.

It builds (or reuses) the pre-trained tiny model, then runs two arms of the learning benchmark
(``clawrl.sim.bench``) for one seed: the control (served and judged, never trained) and the
combined method (binary RL + on-policy distillation, trained in the background and swapped into
the server). A simulated student asks word problems and complains when an answer looks AI-made;
between sessions the served policy answers held-out prompts it is never trained on. At the end
it shows one held-out answer before and after, the score table, and where the plot is.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from clawrl.config import BenchConfig
from clawrl.sim.bench import TRAINED_ARMS, SessionDone, bench_train_flags, prepared_model, run_arm, voice_for, workload
from clawrl.sim.personas import PERSONAS
from clawrl.sim.report import report_table, write_report

DEMO_ARMS = ("none", "combine")


def _indented(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.strip().splitlines()) or "    (empty)"


def run_demo(out: Path, sessions: int = 36, model: str = "tiny-pretrained") -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    started = time.perf_counter()
    config = BenchConfig(method="combine", sessions=sessions, seeds=1, out=out, model=model)
    persona = PERSONAS[config.persona]
    print(f"[1/3] model: {config.model} (pre-trained locally on first use, a few minutes; then cached)")
    print(f"      {prepared_model(config)}")
    print(f"[2/3] a simulated {persona.name} who wants {persona.preference};")
    print(f"      {sessions} sessions per arm, held-out prompts scored as the policy changes")
    train_flags = bench_train_flags({})
    runs = [run_arm(arm, 0, config, train_flags, voice_for(config), progress=_show_progress) for arm in DEMO_ARMS]
    results = write_report(config, {arm: train_flags for arm in DEMO_ARMS if arm in TRAINED_ARMS}, runs, "clawrl demo")
    trained = runs[-1]
    print("[3/3] one held-out prompt, answered by the served policy (a 1M-parameter model: watch the style,"
          " not the arithmetic)")
    print(f"  the {persona.name} asks: {workload(config, persona, 0).heldout[0][0]}")
    print(f"  before (v{trained.baseline.version}):\n{_indented(trained.baseline.example)}")
    print(f"  after {sessions} sessions (v{trained.final.version}):\n{_indented(trained.final.example)}\n")
    print(report_table(results))
    print(f"\nplot: {out / 'learning.png'}   report: {out / 'report.md'}   "
          f"runs: {out / 'runs'}   ({(time.perf_counter() - started) / 60:.1f} min)")
    print(f"inspect a run: clawrl sessions list --run-dir {out / 'runs' / 'combine-seed0'}")
    return 0


def _show_progress(done: SessionDone) -> None:
    """One line per arm, redrawn after each session: a bar, the latest held-out score and its version."""
    bar = "#" * round(24 * done.session / done.sessions)
    end = "\n" if done.session == done.sessions else ""
    print(f"\r  {done.arm:<8} [{bar:<24}] {done.session:>2}/{done.sessions} sessions, "
          f"held-out score {done.heldout:.2f} (policy v{done.version})   ", end=end, flush=True)
