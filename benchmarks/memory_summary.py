"""Memory now, weights later (issue 35): the memory arms of a merged learning report, as a table and JSON.

`clawrl bench merge` writes one report (`results.json`) of every arm and unit. This script picks
what the issue asks of each memory arm (the held-out score at the end with its notes and with the
weights alone, sessions to align, notes active at the end, prompt tokens the notes added per main
turn), puts the control and combined training alone beside them, with the paired differences that
answer the goal, prints a table and writes the JSON:

    .venv/bin/python benchmarks/memory_summary.py runs/memory/merged/results.json --out docs/results/memory.json

The whole merged report is kept under `report`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

MEMORY_ARMS = ("memory", "memory_combine", "memory_then_weights")
CONTROLS = ("none", "combine")
# the differences the goal is read from: with notes against memory alone and the control, the weights
# alone against combined training alone
GOAL_PAIRS = ("memory_then_weights-memory", "memory_then_weights-none", "memory_then_weights-memory_combine",
              "memory_then_weights:weights-combine", "memory_then_weights:weights-none", "memory_combine:weights-combine",
              "memory:weights-none", "memory-none", "memory_combine-none", "combine-none")  # fmt: skip


def arm_row(name: str, arm: dict[str, Any]) -> dict[str, Any]:
    """One arm's figures; an arm without memory has its final score as both "with notes" and "weights only"."""
    memory = arm.get("memory") or {}
    return {
        "final_with_notes": memory.get("final_with_notes", arm["final"]),
        "final_with_notes_ci": arm["ci"],
        "final_weights_only": memory.get("final_weights_only", arm["final"]),
        "final_weights_only_ci": memory.get("final_weights_only_ci", arm["ci"]),
        "on_topic_with_notes": arm.get("on_topic_final"),
        "on_topic_weights_only": memory.get("on_topic_weights_only", arm.get("on_topic_final")),
        "sessions_to_align": arm["sessions_to_align"],
        "sessions_to_align_per_unit": [seed["sessions_to_align"] for seed in arm["per_seed"]],
        "notes_active_final": memory.get("notes_active_final", 0.0 if name in CONTROLS else None),
        "notes_active_curve": memory.get("notes_active_curve", []),
        "prompt_tokens_added_per_turn": memory.get("prompt_tokens_added_per_turn", 0.0),
        "baseline": arm["baseline"],
        "units": len(arm["per_seed"]),
        "versions": [seed["versions"] for seed in arm["per_seed"]],
    }


def summary(report: dict[str, Any]) -> dict[str, Any]:
    arms = {name: arm_row(name, report["arms"][name]) for name in (*CONTROLS, *MEMORY_ARMS) if name in report["arms"]}
    return {
        "persona": report["persona"],
        "sessions": report["sessions"],
        "report_seeds": report["report_seeds"],
        "pretrain_seeds": report["pretrain_seeds"],
        "arms": arms,
        "paired": {name: report["paired"][name] for name in GOAL_PAIRS if name in report["paired"]},
        "report": report,
    }


def _interval(bounds: list[float] | None) -> str:
    return f"[{bounds[0]:.2f}, {bounds[1]:.2f}]" if bounds else "n/a"


def _number(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def table(result: dict[str, Any]) -> str:
    lines = ["| arm | units | with notes [95% CI] | weights only [95% CI] | on topic (notes / weights) | "
             "sessions to align | notes active at the end | prompt tokens added per turn |",
             "|---|---:|---|---|---|---|---:|---:|"]  # fmt: skip
    for name, row in result["arms"].items():
        lines.append(
            f"| {name} | {row['units']} | {row['final_with_notes']:.2f} {_interval(row['final_with_notes_ci'])} | "
            f"{row['final_weights_only']:.2f} {_interval(row['final_weights_only_ci'])} | "
            f"{_number(row['on_topic_with_notes'])} / {_number(row['on_topic_weights_only'])} | "
            f"{_number(row['sessions_to_align'], 1)} | {_number(row['notes_active_final'], 1)} | "
            f"{_number(row['prompt_tokens_added_per_turn'], 1)} |"
        )
    lines += ["", "| paired difference (final) | style mean [95% CI] | on topic mean [95% CI] |", "|---|---|---|"]
    for name, difference in result["paired"].items():
        lines.append(f"| {name} | {difference['mean']:+.2f} {_interval(difference['ci'])} | "
                     f"{_number(difference.get('on_topic_mean'))} {_interval(difference.get('on_topic_ci'))} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("merged", type=Path, help="the merged report's results.json (`clawrl bench merge`)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = summary(json.loads(args.merged.read_text()))
    print(table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
