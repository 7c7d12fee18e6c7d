"""The learning benchmark's comparisons: paired differences between arms, the judge against the
user's hidden ground truth, and what the trainer's steps say about the asynchronous path.

Pure functions over plain lists and dicts (the benchmark records them, `report.py` calls these),
tested on hand-computed inputs in tests/test_bench_stats.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clawrl.sim.metrics import bootstrap_ci, mean, t_interval, wider

Unit = int | str  # a seed, or a seed on a model build ("10@build1", `RunResult.unit`)

# The pairs the report gives a paired difference for (first minus second), when both arms ran.
PAIRS = (
    ("combine", "rl"),
    ("combine", "opd"),
    ("combine", "memory"),
    ("combine", "none"),
    ("memory_combine", "memory"),  # does training add to memory?
    ("memory_combine", "combine"),  # does memory add to training?
    # every other arm against the control, for what each does to the question (issue 28)
    ("rl", "none"),
    ("opd", "none"),
    ("memory", "none"),
    ("memory_combine", "none"),
    # memory trained into the weights (issue 35): with its notes, and with the weights alone (":weights",
    # the held-out prompts asked without the notes) against combined training alone
    ("memory_then_weights", "none"),
    ("memory_then_weights", "memory"),
    ("memory_then_weights", "memory_combine"),
    ("memory_then_weights:weights", "combine"),
    ("memory_then_weights:weights", "none"),
    ("memory_combine:weights", "combine"),
    ("memory:weights", "none"),
)


def paired_groups(first: Mapping[Unit, Sequence[bool | float]], second: Mapping[Unit, Sequence[bool | float]]
                  ) -> dict[Unit, list[float]]:
    """Per seed both arms ran, the per-prompt differences first − second of their held-out outcomes.

    The arms of one seed answer the same held-out prompts in the same order, so prompt i of one is
    paired with prompt i of the other.
    """
    groups = {}
    for seed in sorted(set(first) & set(second)):
        a, b = first[seed], second[seed]
        if len(a) != len(b):
            raise ValueError(f"seed {seed}: {len(a)} held-out outcomes against {len(b)}; not the same prompts")
        groups[seed] = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
    return groups


def paired_difference(first: Mapping[Unit, Sequence[bool | float]], second: Mapping[Unit, Sequence[bool | float]],
                      resamples: int = 2000, level: float = 0.95, seed: int = 0) -> dict[str, Any] | None:
    """Mean over seeds of the per-seed mean difference first − second, with an interval that holds.

    Two intervals, and `ci` is the wider: a paired bootstrap that resamples seeds, then, within
    each chosen seed, the shared held-out prompts, each drawn prompt carrying both arms' outcomes
    (`metrics.bootstrap_ci` over the per-prompt differences); and a Student-t interval over the
    per-seed mean differences (`metrics.t_interval`). With few seeds the bootstrap can only draw
    a handful of seed sets and is too narrow when the seeds disagree; the t-interval says so.
    Deterministic given `seed`. None when no seed has both arms.
    """
    groups = paired_groups(first, second)
    if not groups:
        return None
    per_seed = {s: mean(group) for s, group in groups.items()}
    bootstrap = bootstrap_ci(list(groups.values()), resamples, level, seed)
    over_seeds = t_interval(list(per_seed.values()))
    return {
        "mean": mean(list(per_seed.values())),
        "ci": list(wider(bootstrap, over_seeds)),
        "bootstrap_ci": list(bootstrap),
        "t_ci": list(over_seeds) if over_seeds else None,
        "per_seed": {str(s): value for s, value in per_seed.items()},
        "seeds": len(groups),
    }


def paired_differences(finals: Mapping[str, Mapping[Unit, Sequence[bool | float]]],
                       pairs: Sequence[tuple[str, str]] = PAIRS) -> dict[str, dict[str, Any]]:
    """`paired_difference` for every pair in `pairs` whose arms both ran, keyed "first-second".

    `finals` maps arm → seed → the final evaluation's per-prompt outcomes.
    """
    out = {}
    for first, second in pairs:
        if first in finals and second in finals:
            difference = paired_difference(finals[first], finals[second])
            if difference is not None:
                out[f"{first}-{second}"] = difference
    return out


def judge_agreement(judged: Sequence[tuple[int, bool]]) -> dict[str, Any]:
    """How often the judge's score says what the user really thought.

    `judged` holds (judge score, the user's hidden ground truth) per judged main turn. A score
    agrees when +1 meets a satisfied user or −1 an unsatisfied one; 0 (no verdict) never agrees
    and is counted separately as `abstained`. Shares are None when nothing was judged.
    """
    total = len(judged)
    agree = sum(1 for score, truth in judged if (score > 0 and truth) or (score < 0 and not truth))
    zeros = sum(1 for score, _ in judged if score == 0)
    counts = {"satisfied": {"+1": 0, "-1": 0, "0": 0}, "unsatisfied": {"+1": 0, "-1": 0, "0": 0}}
    for score, truth in judged:
        counts["satisfied" if truth else "unsatisfied"]["+1" if score > 0 else "-1" if score < 0 else "0"] += 1
    return {
        "agreement": agree / total if total else None,
        "abstained": zeros / total if total else None,
        "judged_turns": total,
        "counts": counts,
    }


def training_summary(version_metrics: Sequence[Mapping[str, Any]], sample_counts: Mapping[str, int],
                     drop_reasons: Mapping[str, int]) -> dict[str, Any]:
    """One run's asynchronous-path figures from its published versions and its sample table.

    `version_metrics` is each published version's `StepMetrics` (as a dict); step figures are
    weighted by the step's samples. `stale_share` is the share of samples that had a training
    signal (trained, still ready at the end, or dropped as stale) that were dropped as stale.
    Importance weights are the trainer's truncated min(pi_old / pi_behaviour, cap): the per-step
    means' sample-weighted mean, min and max.
    """
    steps = [m for m in version_metrics if m.get("num_samples")]
    stale = int(drop_reasons.get("stale", 0))
    trained = int(sample_counts.get("trained", 0))
    ready = int(sample_counts.get("ready", 0))
    signal = trained + ready + stale
    weights = [float(m["num_samples"]) for m in steps]

    def weighted(name: str) -> float | None:
        if not steps:
            return None
        return sum(float(m.get(name, 0.0)) * w for m, w in zip(steps, weights, strict=True)) / sum(weights)

    return {
        "steps": len(steps),
        "samples_trained": trained,
        "samples_dropped_stale": stale,
        "stale_share": stale / signal if signal else None,
        "mean_staleness": weighted("mean_staleness"),
        "max_step_staleness": max((float(m.get("mean_staleness", 0.0)) for m in steps), default=None),
        "mean_is_weight": weighted("mean_is_weight"),
        "min_step_is_weight": min((float(m.get("mean_is_weight", 0.0)) for m in steps), default=None),
        "max_step_is_weight": max((float(m.get("mean_is_weight", 0.0)) for m in steps), default=None),
        "logprob_drift": weighted("logprob_drift"),
        "clip_fraction": weighted("clip_fraction"),
    }


def mean_of(runs: Sequence[Mapping[str, Any]], name: str) -> float | None:
    """The mean of `name` over the runs that have a value for it; None when none has."""
    values = [float(run[name]) for run in runs if run.get(name) is not None]
    return mean(values) if values else None


def training_over_seeds(per_run: Sequence[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """An arm's asynchronous-path figures: each run's `training_summary`, averaged over seeds."""
    runs = [run for run in per_run if run]
    if not runs:
        return None
    summary: dict[str, Any] = {
        name: mean_of(runs, name)
        for name in ("stale_share", "mean_staleness", "mean_is_weight", "logprob_drift", "clip_fraction")
    }
    summary["min_step_is_weight"] = min((run["min_step_is_weight"] for run in runs
                                         if run.get("min_step_is_weight") is not None), default=None)
    summary["max_step_is_weight"] = max((run["max_step_is_weight"] for run in runs
                                         if run.get("max_step_is_weight") is not None), default=None)
    summary["max_step_staleness"] = max((run["max_step_staleness"] for run in runs
                                         if run.get("max_step_staleness") is not None), default=None)
    summary["samples_dropped_stale"] = sum(run["samples_dropped_stale"] for run in runs)
    summary["samples_trained"] = sum(run["samples_trained"] for run in runs)
    return summary
