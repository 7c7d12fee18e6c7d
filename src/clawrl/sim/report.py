"""The learning benchmark's outputs: results.json, a markdown report card and a plot.

`results.json` has one entry per arm under `arms`: `baseline` and `final` (mean held-out
preference score over seeds, before the first session and after the last), `ci` (95% bootstrap
interval of `final`), `on_topic_baseline`/`on_topic_final` and `correct_baseline`/`correct_final`
(the shares of held-out answers that use the problem's numbers, and whose last number is the
reference result: correctness beside the style the score measures; with `on_topic_ci`,
`correct_ci`), `sessions_to_align` (median over seeds; null when most seeds never aligned),
`upstream_sessions_to_align` (the figure upstream reported for the matching method, if any),
`judge` (the judge against the user's hidden ground truth), `training` (trained arms: staleness,
samples dropped as stale, importance weights), and the per-seed figures and score curves behind
them. Beside them: `report_seeds` (this run's seeds outside the tuning seeds), `tuning_seeds`,
`catch_up`, `user_noise`, `hint_strings_shared_with_pretraining`, `judge_agreement` (pooled over
every run) and `paired["<a>-<b>"]` = `{mean, ci, per_seed, seeds}`, the paired difference a − b
of the final held-out scores (``clawrl.sim.stats``), with `on_topic_mean`/`on_topic_ci` and
`correct_mean`/`correct_ci`: the same difference of the correctness shares.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from clawrl.config import BenchConfig, parse_seeds
from clawrl.sim.chats import hint_strings_shared_with_pretraining
from clawrl.sim.metrics import ALIGN_WINDOW, bootstrap_ci, mean, sessions_to_align, step_curve
from clawrl.sim.results import RunResult
from clawrl.sim.stats import judge_agreement, paired_differences, training_over_seeds

ARM_LABELS = {
    "none": "none (control)",
    "memory": "memory (hints in the prompt)",
    "rl": "rl (binary RL)",
    "opd": "opd (on-policy distillation)",
    "combine": "combine (RL + OPD)",
    "memory_combine": "memory + combine",
    "memory_then_weights": "memory, then weights (notes trained in, retired)",
}

# Sessions to align that upstream (OpenClaw-RL) reported for the matching methods: another model and
# another (real or simulated) user, so a figure to place ours next to, not to compare against.
UPSTREAM_SESSIONS_TO_ALIGN = {"combine": 10.3, "rl": 14.1, "opd": 29.7, "memory": 14.5}
UPSTREAM_LABELS = {"combine": "Hybrid", "rl": "GRPO", "opd": "OPD", "memory": "Mem0"}


def median_sessions(values: Sequence[int | None]) -> float | None:
    """The median, counting a seed that never aligned as later than any that did; None if that is the median."""
    ordered = sorted(values, key=lambda value: float("inf") if value is None else value)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    low, high = ordered[middle - 1], ordered[middle]
    return None if low is None or high is None else (low + high) / 2


def _share_over_seeds(runs: Sequence[RunResult], which: str, when: str) -> float | None:
    """Mean over seeds of an evaluation's share (`on_topic_share`, `correct_share`); None if not measured."""
    shares = [getattr(getattr(run, when), which) for run in runs]
    return None if any(share is None for share in shares) else mean(shares)


def _share_ci(runs: Sequence[RunResult], which: str) -> list[float] | None:
    """The bootstrap interval of the final evaluation's per-prompt `which` (on_topic, correct)."""
    groups = [[float(ok) for ok in getattr(run.final, which)] for run in runs]
    return list(bootstrap_ci(groups)) if all(groups) else None


def correctness(runs: Sequence[RunResult]) -> dict[str, Any]:
    """The shares of held-out answers about the problem asked and with the right result, before and after."""
    return {
        "on_topic_baseline": _share_over_seeds(runs, "on_topic_share", "baseline"),
        "on_topic_final": _share_over_seeds(runs, "on_topic_share", "final"),
        "on_topic_ci": _share_ci(runs, "on_topic"),
        "correct_baseline": _share_over_seeds(runs, "correct_share", "baseline"),
        "correct_final": _share_over_seeds(runs, "correct_share", "final"),
        "correct_ci": _share_ci(runs, "correct"),
    }


def summarize_arm(runs: Sequence[RunResult], sessions: int) -> dict[str, Any]:
    aligned = [sessions_to_align(run.session_satisfied, ALIGN_WINDOW) for run in runs]
    low, high = bootstrap_ci([[float(ok) for ok in run.final.outcomes] for run in runs])
    curves = [step_curve([(e.session, e.score) for e in run.evaluations], sessions) for run in runs]
    return {
        "baseline": mean([run.baseline.score for run in runs]),
        "final": mean([run.final.score for run in runs]),
        "ci": [low, high],
        **correctness(runs),
        "sessions_to_align": median_sessions(aligned),
        "upstream_sessions_to_align": UPSTREAM_SESSIONS_TO_ALIGN.get(runs[0].arm),
        "judge": judge_agreement([pair for run in runs for pair in run.judged]),
        "training": training_over_seeds([run.training for run in runs]),
        "per_seed": [
            {
                "seed": run.seed,
                "model_seed": run.model_seed,
                "baseline": run.baseline.score,
                "final": run.final.score,
                "sessions_to_align": steps,
                "sessions_satisfied": sum(run.session_satisfied),
                "versions": run.versions,
                "seconds": round(run.seconds, 1),
                "judge_agreement": judge_agreement(run.judged)["agreement"],
                "training": run.training,
            }
            for run, steps in zip(runs, aligned, strict=True)
        ],
        "curve": [mean(column) for column in zip(*curves, strict=True)],
        "curve_low": [min(column) for column in zip(*curves, strict=True)],
        "curve_high": [max(column) for column in zip(*curves, strict=True)],
        "example_before": runs[0].baseline.example,
        "example_after": runs[0].final.example,
        **memory_summary(runs),
    }


def memory_summary(runs: Sequence[RunResult]) -> dict[str, Any]:
    """A memory arm's figures (issue 35): the final held-out score with its notes and with the weights
    alone, the notes active at the end and over the sessions, the prompt tokens added per main turn;
    nothing for an arm without memory."""
    if not runs or any(run.final_weights_only is None for run in runs):
        return {}
    weights_only = [run.final_weights_only for run in runs if run.final_weights_only is not None]
    low, high = bootstrap_ci([[float(ok) for ok in evaluation.outcomes] for evaluation in weights_only])
    active = [run.notes_active for run in runs if run.notes_active]
    return {"memory": {
        "final_with_notes": mean([run.final.score for run in runs]),
        "final_weights_only": mean([evaluation.score for evaluation in weights_only]),
        "final_weights_only_ci": [low, high],
        "on_topic_weights_only": mean([evaluation.on_topic_share or 0.0 for evaluation in weights_only]),
        "notes_active_final": mean([float(counts[-1]) for counts in active]) if active else None,
        "notes_active_curve": [mean([float(value) for value in column]) for column in zip(*active, strict=True)] if active else [],
        "prompt_tokens_added_per_turn": mean([run.prompt_tokens_added_per_turn or 0.0 for run in runs]),
    }}


def paired_with_correctness(arms: Mapping[str, Sequence[RunResult]]) -> dict[str, dict[str, Any]]:
    """The paired differences of the final held-out scores, each with the same difference of the
    on-topic and the correct shares beside it (`on_topic_mean`, `on_topic_ci`, `correct_mean`, `correct_ci`)."""
    final = {arm: {run.unit: run.final for run in arm_runs} for arm, arm_runs in arms.items()}
    final |= {f"{arm}:weights": {run.unit: run.final_weights_only for run in arm_runs if run.final_weights_only}
              for arm, arm_runs in arms.items() if all(run.final_weights_only for run in arm_runs)}  # fmt: skip
    finals = {which: {arm: {unit: getattr(evaluation, which) for unit, evaluation in by_unit.items()}
                      for arm, by_unit in final.items() if all(getattr(e, which) for e in by_unit.values())}
              for which in ("outcomes", "on_topic", "correct")}  # fmt: skip
    paired = paired_differences(finals["outcomes"])
    for which in ("on_topic", "correct"):
        for name, difference in paired_differences(finals[which]).items():
            if name in paired:
                paired[name].update({f"{which}_mean": difference["mean"], f"{which}_ci": difference["ci"]})
    return paired


def write_report(config: BenchConfig, train_flags: Mapping[str, dict[str, Any]], runs: Sequence[RunResult],
                 command: str) -> dict[str, Any]:
    """Write results.json, report.md and learning.png under `config.out`; return the results.

    `train_flags` holds each trained arm's trainer settings (arms tuned apart have their own).
    """
    arms: dict[str, list[RunResult]] = {}
    for run in runs:
        arms.setdefault(run.arm, []).append(run)
    seeds = sorted({run.seed for run in runs})
    pretrain_seeds = sorted({run.model_seed for run in runs})
    tuning = parse_seeds(config.tuning_seeds)
    judged = judge_agreement([pair for run in runs for pair in run.judged])
    results = {
        "persona": config.persona,
        "sessions": config.sessions,
        "seeds": len(seeds),
        "first_seed": config.first_seed,
        "seed_list": seeds,
        "report_seeds": [seed for seed in seeds if seed not in tuning],
        "tuning_seeds": tuning,
        "catch_up": config.catch_up,
        "user_noise": config.user_noise(),
        "hint_strings_shared_with_pretraining": hint_strings_shared_with_pretraining(),
        "judge_agreement": judged["agreement"],
        "judge_abstained": judged["abstained"],
        "judged_turns": judged["judged_turns"],
        "model": config.model,
        "pretrain_seeds": pretrain_seeds,
        "pretrain_builds": {str(run.model_seed): run.model_build for run in runs if run.model_build},
        "eval_every": config.eval_every,
        "heldout_prompts": config.heldout_prompts,
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "arms": {arm: {**summarize_arm(arm_runs, config.sessions), "train_flags": train_flags.get(arm)}
                 for arm, arm_runs in arms.items()},
        "paired": paired_with_correctness(arms),
    }
    out = Path(config.out)
    text = json.dumps(results, indent=1) + "\n"
    (out / "results.json").write_text(text)
    if config.summary is not None:
        Path(config.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(config.summary).write_text(text)
    plot(results, out / "learning.png")
    (out / "report.md").write_text(report_card(results, command))
    return results


# What every merged invocation must share: the runs are compared as if one invocation had made them.
MERGE_MUST_AGREE = ("persona", "sessions", "catch_up", "user_noise", "model", "heldout_prompts", "tuning_seeds")


def merge_reports(run_dirs: Sequence[Path], out: Path, summary: Path | None = None) -> dict[str, Any]:
    """One report from several `clawrl bench learn` output directories (arms run apart, e.g. each with its
    own tuned settings): their runs.json together, each arm with the trainer settings it ran with."""
    loaded = [(json.loads((Path(d) / "results.json").read_text()), json.loads((Path(d) / "runs.json").read_text()))
              for d in run_dirs]
    first = loaded[0][0]
    for results, _ in loaded[1:]:
        differing = [key for key in MERGE_MUST_AGREE if results[key] != first[key]]
        if differing:
            raise ValueError(f"cannot merge runs that differ in {', '.join(differing)}")
    runs = [RunResult.from_json(item) for _, items in loaded for item in items]
    seen: set[tuple[str, str]] = set()
    for run in runs:
        if (run.arm, run.unit) in seen:
            raise ValueError(f"arm {run.arm} seed {run.unit} is in more than one of the merged directories")
        seen.add((run.arm, run.unit))
    train_flags = {name: arm["train_flags"] for results, _ in loaded for name, arm in results["arms"].items()
                   if arm.get("train_flags") is not None}
    noise = {f"user_{name}": rate for name, rate in first["user_noise"].items()}
    config = BenchConfig(persona=first["persona"], sessions=first["sessions"], catch_up=first["catch_up"],
                         model=first["model"], heldout_prompts=first["heldout_prompts"],
                         eval_every=first.get("eval_every", 1),
                         tuning_seeds=",".join(map(str, first["tuning_seeds"])), out=out, summary=summary, **noise)
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.json").write_text(json.dumps([run.to_json() for run in runs], indent=1))
    return write_report(config, train_flags, runs, "clawrl bench merge " + " ".join(map(str, run_dirs)))


def command_line(config: BenchConfig) -> str:
    if config.seed_list is not None:
        seeds = f" --seed-list {config.seed_list}"
    else:
        seeds = f" --seeds {config.seeds}" + (f" --first-seed {config.first_seed}" if config.first_seed else "")
    catch_up = "" if config.catch_up else " --no-catch-up"
    noise = "".join(f" --user-{name.replace('_', '-')} {rate:g}" for name, rate in config.user_noise().items() if rate)
    styles = "" if config.pretrain_styles.strip() == "default" else f" --pretrain-styles {config.pretrain_styles}"
    return f"clawrl bench learn --method {config.method} --sessions {config.sessions}{seeds}{catch_up}{noise}{styles}"


def _aligned_text(arm: dict[str, Any]) -> str:
    def one(value: float | None) -> str:
        return "never" if value is None else f"{value:g}"

    per_seed = ", ".join(one(seed["sessions_to_align"]) for seed in arm["per_seed"])
    return f"{one(arm['sessions_to_align'])} ({per_seed})"


def report_table(results: dict[str, Any]) -> str:
    lines = [
        "| arm | held-out score before | after | 95% CI after | sessions to align: median (per seed) | upstream's | "
        "versions | minutes per run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, arm in results["arms"].items():
        versions = "/".join(str(seed["versions"]) for seed in arm["per_seed"])
        minutes = mean([seed["seconds"] for seed in arm["per_seed"]]) / 60
        lines.append(
            f"| {ARM_LABELS.get(name, name)} | {arm['baseline']:.2f} | **{arm['final']:.2f}** | "
            f"[{arm['ci'][0]:.2f}, {arm['ci'][1]:.2f}] | {_aligned_text(arm)} | {_upstream_text(name)} | {versions} | "
            f"{minutes:.1f} |"
        )
    return "\n".join(lines)


def correctness_table(results: dict[str, Any]) -> str:
    """Beside the style score: the shares of held-out answers on the problem asked and with the right result."""
    lines = ["| arm | on topic before | after | 95% CI after | right result before | after | 95% CI after |",
             "|---|---|---|---|---|---|---|"]
    for name, arm in results["arms"].items():
        if arm.get("on_topic_final") is None:
            continue
        lines.append(
            f"| {ARM_LABELS.get(name, name)} | {arm['on_topic_baseline']:.2f} | **{arm['on_topic_final']:.2f}** | "
            f"{_interval(arm['on_topic_ci'])} | {arm['correct_baseline']:.2f} | **{arm['correct_final']:.2f}** | "
            f"{_interval(arm['correct_ci'])} |"
        )
    return "\n".join(lines) if len(lines) > 2 else ""


def _interval(bounds: Sequence[float] | None) -> str:
    return f"[{bounds[0]:.2f}, {bounds[1]:.2f}]" if bounds else "n/a"


def _upstream_text(arm: str) -> str:
    figure = UPSTREAM_SESSIONS_TO_ALIGN.get(arm)
    return "" if figure is None else f"{figure:g} ({UPSTREAM_LABELS[arm]})"


def _figure(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def paired_table(results: dict[str, Any]) -> str:
    """The paired differences of the final held-out scores; "beats" only where the interval excludes 0."""
    lines = ["| difference (final held-out score) | mean | 95% paired CI | per seed | reading |", "|---|---|---|---|---|"]
    for name, pair in results.get("paired", {}).items():
        low, high = pair["ci"]
        first, second = name.split("-", 1)
        reading = (f"{first} beats {second}" if low > 0 else f"{second} beats {first}" if high < 0
                   else "no difference shown")
        per_seed = ", ".join(f"{value:+.2f}" for value in pair["per_seed"].values())
        lines.append(f"| {name} | {pair['mean']:+.2f} | [{low:+.2f}, {high:+.2f}] | {per_seed} | {reading} |")
    return "\n".join(lines)


def training_table(results: dict[str, Any]) -> str:
    """The trained arms' asynchronous-path figures, mean over seeds."""
    lines = ["| arm | mean staleness (versions) | samples dropped as stale | mean IS weight [min, max step mean] | "
             "mean \\|log pi_old - log pi_behaviour\\| | clip fraction |", "|---|---|---|---|---|---|"]
    for name, arm in results["arms"].items():
        training = arm.get("training")
        if not training:
            continue
        weight = "n/a" if training["mean_is_weight"] is None else (
            f"{training['mean_is_weight']:.3f} [{training['min_step_is_weight']:.3f}, "
            f"{training['max_step_is_weight']:.3f}]")
        drift, clip = _figure(training["logprob_drift"], 4), _figure(training["clip_fraction"], 3)
        staleness = _figure(training["mean_staleness"])
        lines.append(f"| {ARM_LABELS.get(name, name)} | {staleness} | {_figure(training['stale_share'])} "
                     f"({training['samples_dropped_stale']} of {training['samples_dropped_stale'] + training['samples_trained']} "
                     f"trained or dropped) | {weight} | {drift} | {clip} |")
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


def trained_with(results: dict[str, Any]) -> str:
    """Which trainer settings the trained arms ran with: one phrase if they share them, else per arm."""
    by_flags: dict[str, list[str]] = {}
    for name, arm in results["arms"].items():
        if arm.get("train_flags") is not None:
            by_flags.setdefault(" ".join(flags_for(arm["train_flags"])), []).append(name)
    if len(by_flags) <= 1:
        return "".join(f"trained arms with `{flags}`" for flags in by_flags) or "no trained arm"
    return "; ".join(f"{', '.join(names)} with `{flags}`" for flags, names in by_flags.items())


def report_card(results: dict[str, Any], command: str) -> str:
    correctness = correctness_table(results)
    return "\n".join([
        f"# Learning benchmark ({results['persona']})",
        "",
        f"`{command}`: model `{results['model']}`, {results['heldout_prompts']} held-out prompts per evaluation, "
        f"{trained_with(results)}; {results['machine']}.",
        "",
        "Held-out score: the share of answers to held-out prompts (never trained on) that satisfy the user's hidden "
        "preference, mean over seeds. Sessions to align: the sessions before "
        f"{ALIGN_WINDOW} consecutive sessions in which every first answer satisfied the preference.",
        "",
        report_table(results),
        "",
        *(["Correctness beside the style: the share of held-out answers about the problem asked (they use at least two "
           "of its numbers) and the share whose last number is the reference result. The score above measures style "
           "only (the strict student's excepted).", "", correctness, ""] if correctness else []),
        "Upstream's sessions to align (OpenClaw-RL: Hybrid, GRPO, OPD, Mem0) were measured with another model and "
        "another user; they place these figures, they are not a like-for-like comparison.",
        "",
        f"Seeds: {', '.join(map(str, results['seed_list']))} (report seeds: "
        f"{', '.join(map(str, results['report_seeds'])) or 'none'}; tuning seeds: "
        f"{', '.join(map(str, results['tuning_seeds']))}). Model builds (pre-training seeds): "
        f"{', '.join(map(str, results.get('pretrain_seeds', [0])))}; a seed on another build is a unit of its own "
        "(\"10@build1\"). Catch-up between sessions: "
        f"{'on' if results['catch_up'] else 'off (--no-catch-up)'}. User noise: "
        f"{', '.join(f'{name} {value:g}' for name, value in results['user_noise'].items()) or 'none'}. "
        f"Hint strings shared with pre-training: {results['hint_strings_shared_with_pretraining']}.",
        "",
        f"Judge against the user's hidden ground truth: {_figure(results['judge_agreement'])} of "
        f"{results['judged_turns']} judged turns agree (+1 on a satisfied user, -1 on an unsatisfied one); "
        f"{_figure(results['judge_abstained'])} scored 0.",
        "",
        *(["Paired differences (per seed, the same held-out prompts; the interval is the wider of a bootstrap over "
           "seeds and prompts and a t-interval over the seeds):",
           "", paired_table(results), ""] if results.get("paired") else []),
        *(["Trained arms, the asynchronous path (from the published versions' step metrics and the sample table):",
           "", training_table(results), ""] if any(arm.get("training") for arm in results["arms"].values()) else []),
        "![held-out preference score against sessions](learning.png)",
        "",
    ])


def plot(results: dict[str, Any], path: Path) -> None:
    """Held-out score against sessions, one line per arm (mean over seeds, band from min to max)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (axes, correct_axes) = plt.subplots(1, 2, figsize=(12, 4.2), dpi=120, gridspec_kw={"width_ratios": [3, 2]})
    colors = {}
    for name, arm in results["arms"].items():
        sessions = range(len(arm["curve"]))
        (line,) = axes.step(sessions, arm["curve"], where="post", label=ARM_LABELS.get(name, name), linewidth=2)
        axes.fill_between(sessions, arm["curve_low"], arm["curve_high"], step="post", alpha=0.15, color=line.get_color())
        colors[name] = line.get_color()
    axes.set_xlabel("sessions with the simulated user")
    axes.set_ylabel("held-out preference score")
    axes.set_ylim(-0.02, 1.02)
    axes.set_title(f"Learning the {results['persona']}'s preference ({results['seeds']} seeds)")
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize=8)
    # Second panel: correctness beside the style, before and after (a line per arm and measure)
    for name, arm in results["arms"].items():
        for which, style in (("on_topic", "-"), ("correct", ":")):
            if arm.get(f"{which}_final") is not None:
                correct_axes.plot([0, 1], [arm[f"{which}_baseline"], arm[f"{which}_final"]], style, marker="o",
                                  color=colors[name], label=f"{name}: {which.replace('_', ' ')}")
    correct_axes.set_xticks([0, 1], ["before", "after"])
    correct_axes.set_ylim(-0.02, 1.02)
    correct_axes.set_ylabel("share of held-out answers")
    correct_axes.set_title("On the problem asked (solid), right result (dotted)")
    correct_axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
