"""Pick each trained arm's settings from the learning benchmark's tuning sweep (issue 12).

Reads `TUNE/<arm>/<setting>/results.json` as `benchmarks/learn_sweep.sh tune TUNE` leaves them (the
same settings on the same tuning seeds for every arm), prints the sweep's table and writes, as JSON,
the `clawrl bench learn` trainer flags each arm is reported with. The rule (issue 28: style must not
cost the question): among the settings that keep the answers on the question (mean final on-topic
share at most `ON_TOPIC_SLACK` below the untrained model's, which is what the control keeps), the one
with the highest mean final held-out score; when none keeps them, the one that loses the fewest
on-topic answers. Ties keep the benchmark's default settings, then the first by name.
`memory_combine` trains as `combine` does, so it takes combine's pick rather than a sweep of its own.

    python benchmarks/learn_pick.py runs/learn/tune [runs/learn/tune101 ...] --out docs/results/learn-sweep.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from clawrl.sim.bench import BENCH_TRAIN_DEFAULTS
from clawrl.sim.report import flags_for

TUNED_ARMS = ("combine", "rl", "opd")
ON_TOPIC_SLACK = 0.05  # issue 28's goal: within 0.05 of the control's on-topic share


def arm_flags(results: dict[str, Any], arm: str) -> dict[str, Any]:
    """The trainer settings an arm ran with (older results.json files hold them once, at the top)."""
    return results["arms"][arm].get("train_flags") or results["train_flags"]


def sweep_table(tune_dirs: list[Path]) -> dict[str, list[dict[str, Any]]]:
    """Per arm, every setting of the sweep with its final scores: the default first, then by name.

    Several directories (the same settings run on other tuning seeds) join per setting: every figure
    is the mean over all their seeds (each directory's figures are means over its own seeds, weighted
    by how many it has)."""
    table: dict[str, list[dict[str, Any]]] = {}
    for arm in TUNED_ARMS:
        settings: dict[str, list[dict[str, Any]]] = {}
        for tune_dir in tune_dirs:
            for results_path in sorted((tune_dir / arm).glob("*/results.json")):
                settings.setdefault(results_path.parent.name, []).append(json.loads(results_path.read_text()))
        for name, runs in sorted(settings.items()):
            table.setdefault(arm, []).append(_joined(arm, name, runs))
        table.get(arm, []).sort(key=lambda row: not row["default"])  # stable: by name after the default
    return table


def _joined(arm: str, setting: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    flags = {json.dumps(arm_flags(results, arm), sort_keys=True) for results in runs}
    if len(flags) > 1:
        raise ValueError(f"{arm}/{setting} ran with different flags in different directories: {flags}")
    weights = [len(results["seed_list"]) for results in runs]

    def mean_of(name: str) -> float:
        return sum(results["arms"][arm][name] * weight for results, weight in zip(runs, weights)) / sum(weights)

    return {
        "setting": setting, "flags": " ".join(flags_for(arm_flags(runs[0], arm))),
        "final_per_seed": {seed["seed"]: seed["final"] for results in runs for seed in results["arms"][arm]["per_seed"]},
        "final": mean_of("final"), "baseline": mean_of("baseline"),
        "seeds": sorted(seed for results in runs for seed in results["seed_list"]),
        "on_topic_baseline": mean_of("on_topic_baseline"), "on_topic_final": mean_of("on_topic_final"),
        "correct_final": mean_of("correct_final"),
        "default": arm_flags(runs[0], arm) == BENCH_TRAIN_DEFAULTS,
    }


def keeps_the_question(row: dict[str, Any]) -> bool:
    return row["on_topic_final"] >= row["on_topic_baseline"] - ON_TOPIC_SLACK


def pick(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rule of the module's docstring; `max` keeps the first of equals (the default comes first)."""
    kept = [row for row in rows if keeps_the_question(row)]
    if kept:
        return max(kept, key=lambda row: row["final"])
    return max(rows, key=lambda row: (row["on_topic_final"], row["final"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tune_dirs", type=Path, nargs="+", help="`learn_sweep.sh tune` directories (other tuning seeds)")
    parser.add_argument("--out", type=Path, required=True, help="the chosen flags per arm (JSON)")
    args = parser.parse_args()
    table = sweep_table(args.tune_dirs)
    print("| arm | setting | final held-out score per tuning seed | mean | on topic before → after | right result after |")
    print("|---|---|---|---|---|---|")
    chosen: dict[str, str] = {}
    for arm, rows in table.items():
        best = pick(rows)
        chosen[arm] = best["flags"]
        for row in rows:
            per_seed = ", ".join(f"{seed}: {score:.2f}" for seed, score in row["final_per_seed"].items())
            mark = " **(picked)**" if row is best else ""
            print(f"| {arm} | `{row['setting']}`{mark} | {per_seed} | {row['final']:.2f} | "
                  f"{row['on_topic_baseline']:.2f} → {row['on_topic_final']:.2f} | {row['correct_final']:.2f} |")
    if "combine" in chosen:
        chosen["memory_combine"] = chosen["combine"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"chosen": chosen, "sweep": table}, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
