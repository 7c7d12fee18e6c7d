"""The learning benchmark's outputs: results.json, a markdown report card and a plot.

`results.json` has one entry per arm: `baseline` and `final` (mean held-out preference score over
seeds, before the first session and after the last), `ci` (95% bootstrap interval of `final`),
`sessions_to_align` (median over seeds; null when most seeds never aligned), and the per-seed
figures and score curves behind them.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clawrl.config import BenchConfig
from clawrl.sim.metrics import ALIGN_WINDOW, bootstrap_ci, mean, sessions_to_align, step_curve
from clawrl.sim.results import RunResult

ARM_LABELS = {
    "none": "none (control)",
    "memory": "memory (hints in the prompt)",
    "rl": "rl (binary RL)",
    "opd": "opd (on-policy distillation)",
    "combine": "combine (RL + OPD)",
}


def median_sessions(values: Sequence[int | None]) -> float | None:
    """The median, counting a seed that never aligned as later than any that did; None if that is the median."""
    ordered = sorted(values, key=lambda value: float("inf") if value is None else value)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    low, high = ordered[middle - 1], ordered[middle]
    return None if low is None or high is None else (low + high) / 2


def summarize_arm(runs: Sequence[RunResult], sessions: int) -> dict[str, Any]:
    aligned = [sessions_to_align(run.session_satisfied, ALIGN_WINDOW) for run in runs]
    low, high = bootstrap_ci([[float(ok) for ok in run.final.outcomes] for run in runs])
    curves = [step_curve([(e.session, e.score) for e in run.evaluations], sessions) for run in runs]
    return {
        "baseline": mean([run.baseline.score for run in runs]),
        "final": mean([run.final.score for run in runs]),
        "ci": [low, high],
        "sessions_to_align": median_sessions(aligned),
        "per_seed": [
            {
                "seed": run.seed,
                "baseline": run.baseline.score,
                "final": run.final.score,
                "sessions_to_align": steps,
                "sessions_satisfied": sum(run.session_satisfied),
                "versions": run.versions,
                "seconds": round(run.seconds, 1),
            }
            for run, steps in zip(runs, aligned, strict=True)
        ],
        "curve": [mean(column) for column in zip(*curves, strict=True)],
        "curve_low": [min(column) for column in zip(*curves, strict=True)],
        "curve_high": [max(column) for column in zip(*curves, strict=True)],
        "example_before": runs[0].baseline.example,
        "example_after": runs[0].final.example,
    }


def write_report(config: BenchConfig, train_flags: dict[str, Any], runs: Sequence[RunResult], command: str) -> dict[str, Any]:
    """Write results.json, report.md and learning.png under `config.out`; return the results."""
    arms: dict[str, list[RunResult]] = {}
    for run in runs:
        arms.setdefault(run.arm, []).append(run)
    results = {
        "persona": config.persona,
        "sessions": config.sessions,
        "seeds": config.seeds,
        "first_seed": config.first_seed,
        "model": config.model,
        "heldout_prompts": config.heldout_prompts,
        "train_flags": train_flags,
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "arms": {arm: summarize_arm(arm_runs, config.sessions) for arm, arm_runs in arms.items()},
    }
    out = Path(config.out)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "learning.png")
    (out / "report.md").write_text(report_card(results, command))
    return results


def command_line(config: BenchConfig) -> str:
    first_seed = f" --first-seed {config.first_seed}" if config.first_seed else ""
    return f"clawrl bench learn --method {config.method} --sessions {config.sessions} --seeds {config.seeds}{first_seed}"


def _aligned_text(arm: dict[str, Any]) -> str:
    def one(value: float | None) -> str:
        return "never" if value is None else f"{value:g}"

    per_seed = ", ".join(one(seed["sessions_to_align"]) for seed in arm["per_seed"])
    return f"{one(arm['sessions_to_align'])} ({per_seed})"


def report_table(results: dict[str, Any]) -> str:
    lines = [
        "| arm | held-out score before | after | 95% CI after | sessions to align: median (per seed) | versions | minutes per run |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, arm in results["arms"].items():
        versions = "/".join(str(seed["versions"]) for seed in arm["per_seed"])
        minutes = mean([seed["seconds"] for seed in arm["per_seed"]]) / 60
        lines.append(
            f"| {ARM_LABELS.get(name, name)} | {arm['baseline']:.2f} | **{arm['final']:.2f}** | "
            f"[{arm['ci'][0]:.2f}, {arm['ci'][1]:.2f}] | {_aligned_text(arm)} | {versions} | {minutes:.1f} |"
        )
    return "\n".join(lines)


def flags_for(values: dict[str, Any]) -> list[str]:
    """`--name value` per setting (`--name` / `--no-name` for booleans)."""
    flags: list[str] = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        else:
            flags += [flag, str(value)]
    return flags


def report_card(results: dict[str, Any], command: str) -> str:
    flags = " ".join(flags_for(results["train_flags"]))
    return "\n".join([
        f"# Learning benchmark ({results['persona']})",
        "",
        f"`{command}`: model `{results['model']}`, {results['heldout_prompts']} held-out prompts per evaluation, "
        f"trained arms with `{flags}`; {results['machine']}.",
        "",
        "Held-out score: the share of answers to held-out prompts (never trained on) that satisfy the user's hidden "
        "preference, mean over seeds. Sessions to align: the sessions before "
        f"{ALIGN_WINDOW} consecutive sessions in which every first answer satisfied the preference.",
        "",
        report_table(results),
        "",
        "![held-out preference score against sessions](learning.png)",
        "",
    ])


def plot(results: dict[str, Any], path: Path) -> None:
    """Held-out score against sessions, one line per arm (mean over seeds, band from min to max)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
    for name, arm in results["arms"].items():
        sessions = range(len(arm["curve"]))
        (line,) = axes.step(sessions, arm["curve"], where="post", label=ARM_LABELS.get(name, name), linewidth=2)
        axes.fill_between(sessions, arm["curve_low"], arm["curve_high"], step="post", alpha=0.15, color=line.get_color())
    axes.set_xlabel("sessions with the simulated user")
    axes.set_ylabel("held-out preference score")
    axes.set_ylim(-0.02, 1.02)
    axes.set_title(f"Learning the {results['persona']}'s preference ({results['seeds']} seeds)")
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
