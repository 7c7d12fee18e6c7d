"""How often a judge reads a reply as a careful person does: the labelled corpus of replies (issue 27).

For every item of a part of the corpus (`src/clawrl/judge/data/<part>.jsonl`) the judge sees the
request, the assistant's answer and the reply (a user's message or a tool's output) as a recorded
turn and its next state, exactly as the judge worker hands them over, and its verdict is compared
with the label:

* agreement: the judge's score (+1, 0, -1) equals the label's;
* hint recall: among items labelled with a directive, the share whose chosen hint carries it (every
  keyword group matched); the hint is chosen as the worker chooses without a scoring engine (the
  longest candidate); `hint_recall_any` counts a match among any candidate;
* false hints: among items labelled without a directive, the share given a hint anyway.

Overall, per style and per language. The held-out part is for reporting only: nothing is tuned on
it. `--record-as before` keeps the figures as the judge before issue 27's work, which later runs
leave in place; `--cv K` adds K-fold cross-validation within the tuning part (the offline judge's
classifier retrained without each fold and scored on it; replies to one request share a fold).

    .venv/bin/python benchmarks/judge_replies.py                 # the offline judge, both parts
    .venv/bin/python benchmarks/judge_replies.py --cv 5          # plus cross-validation on tuning
    .venv/bin/python benchmarks/judge_replies.py --judge openai --judge-url URL --judge-model M --out x.json
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from clawrl.config import JudgeConfig
from clawrl.judge.corpus import LabelledReply, hint_recalled, load_part
from clawrl.judge.types import JudgeBackend
from clawrl.judge.classifier import train_model
from clawrl.judge.worker import RuleJudge, build_backend, final_judgment, hint_candidates
from clawrl.types import Judgment, Turn, TurnContext, TurnSampling

PARTS = ("tuning", "held_out")
DEFAULT_OUT = Path("docs/results/judge-replies.json")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--judge", default="rule", help="the judge backend (`rule`: the offline judge)")
    parser.add_argument("--judge-url", help="with --judge openai")
    parser.add_argument("--judge-model", help="with --judge openai or engine")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--cv", type=int, default=0, help="K-fold cross-validation within the tuning part (0: none)")
    parser.add_argument("--record-as", choices=("current", "before"), default="current",
                        help="`before`: store the figures as the judge before issue 27's work")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    config = JudgeConfig(judge=args.judge, judge_url=args.judge_url, judge_model=args.judge_model)
    backend = build_backend(config)
    figures: dict[str, Any] = {"judge": args.judge, "commit": _commit()}
    for part in args.parts:
        figures[part] = asyncio.run(evaluate(backend, load_part(part)))
    if args.cv:
        figures["tuning_cv"] = cross_validated(load_part("tuning"), args.cv)
    for part in (*args.parts, *(["tuning_cv"] if args.cv else [])):
        print(table(part, figures[part]))
    _write(args.out, figures, args.record_as)
    print(f"wrote {args.out}")
    return 0


async def evaluate(backend: JudgeBackend, items: list[LabelledReply]) -> dict[str, Any]:
    judged = [(item, await judged_item(backend, item)) for item in items]
    return summary(judged)


async def judged_item(backend: JudgeBackend, item: LabelledReply) -> tuple[Judgment, list[str]]:
    """The judgment the worker would write for the item (no scoring engine), and every hint candidate."""
    case = corpus_case(item)
    verdict = await backend.judge(case)
    return final_judgment(case, verdict, backend.name, 0.0), hint_candidates(case, verdict)


def corpus_case(item: LabelledReply) -> TurnContext:
    """The item as the judge worker reads a recorded turn: request, answer, next state."""
    from clawrl.types import NextState

    turn = Turn(
        id=item.id, session_id=item.id, kind="main", model="corpus", policy_version=0,
        messages=item.request_messages(), tools=None, sampling=TurnSampling(), prompt_token_ids=[], response_token_ids=[],
        response_logprobs=[], response_text=item.answer, tool_calls=None, finish_reason="stop",
    )
    return TurnContext(turn, NextState(item.id, item.next_messages(), item.id), feedback=[])


def summary(judged: list[tuple[LabelledReply, tuple[Judgment, list[str]]]]) -> dict[str, Any]:
    """The figures overall, per style and per language."""
    return {
        **_figures(judged),
        "confusion": _confusion(judged),
        "by_style": _grouped(judged, lambda item: item.style),
        "by_language": _grouped(judged, lambda item: item.language),
    }


def _figures(judged: Iterable[tuple[LabelledReply, tuple[Judgment, list[str]]]]) -> dict[str, Any]:
    judged = list(judged)
    hinted = [(item, verdict) for item, verdict in judged if item.hint_keywords]
    unhinted = [verdict for item, verdict in judged if not item.hint_keywords]
    return {
        "items": len(judged),
        "agreement": _share(judgment.score == item.score for item, (judgment, _) in judged),
        "hinted_items": len(hinted),
        "hint_recall": _share(hint_recalled(judgment.hint, item.hint_keywords) for item, (judgment, _) in hinted),
        "hint_recall_any": _share(
            any(hint_recalled(hint, item.hint_keywords) for hint in candidates) for item, (_, candidates) in hinted
        ),
        "false_hints": _share(judgment.hint is not None for judgment, _ in unhinted),
    }


def _grouped(judged: list, key: Callable[[LabelledReply], str]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list] = defaultdict(list)
    for pair in judged:
        groups[key(pair[0])].append(pair)
    return {name: _figures(pairs) for name, pairs in sorted(groups.items())}


def _confusion(judged: list) -> dict[str, dict[str, int]]:
    """Label -> judge's score -> count."""
    matrix = {str(label): {str(score): 0 for score in (-1, 0, 1)} for label in (-1, 0, 1)}
    for item, (judgment, _) in judged:
        matrix[str(item.score)][str(judgment.score)] += 1
    return matrix


def _share(hits: Iterable[bool]) -> float | None:
    hits = list(hits)
    return round(sum(hits) / len(hits), 4) if hits else None


def cross_validated(items: list[LabelledReply], folds: int) -> dict[str, Any]:
    """K-fold figures within the tuning part: the offline judge rebuilt without each fold, scored on it."""
    judged = []
    for fold in range(folds):
        held = [item for item in items if _fold(item, folds) == fold]
        kept = [item for item in items if _fold(item, folds) != fold]
        backend = RuleJudge(train_model(kept))
        judged += [(item, asyncio.run(judged_item(backend, item))) for item in held]
    return {"folds": folds, **summary(judged)}


def _fold(item: LabelledReply, folds: int) -> int:
    """Items that answer the same request share a fold, so no fold is judged by a model that saw its context."""
    return int(hashlib.sha256(item.request.encode()).hexdigest(), 16) % folds


def table(part: str, figures: dict[str, Any]) -> str:
    """The overall figures and the per-style ones as a markdown table."""
    rows = [f"\n{part}: agreement {_shown(figures['agreement'])}, hint recall {_shown(figures['hint_recall'])} "
            f"(any candidate {_shown(figures['hint_recall_any'])}), false hints {_shown(figures['false_hints'])}, "
            f"{figures['items']} items",
            "| style | items | agreement | hinted | hint recall |", "|---|---:|---:|---:|---:|"]
    for name, group in {**figures["by_style"], **figures["by_language"]}.items():
        rows.append(f"| {name} | {group['items']} | {_shown(group['agreement'])} | {group['hinted_items']} | "
                    f"{_shown(group['hint_recall'])} |")
    return "\n".join(rows)


def _shown(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _commit() -> str | None:
    try:
        described = ["git", "describe", "--always", "--dirty"]  # "-dirty": uncommitted changes on top
        return subprocess.run(described, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _write(out: Path, figures: dict[str, Any], record_as: str) -> None:
    """Merge into `out`: `before` and the earlier editions' figures (`*_edition`) stay unless this run is recorded as `before`."""
    stored = json.loads(out.read_text()) if out.exists() else {}
    if record_as == "before":
        stored["before"] = figures
    else:
        kept = {key: value for key, value in stored.items() if key == "before" or key.endswith("_edition")}
        stored = {**figures, **kept}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stored, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    sys.exit(main())
