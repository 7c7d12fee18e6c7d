"""Which replies become memory notes (`--memory on --memory-from directives`, issue 35): the durable-directive
rules measured on replies written as people write them, not as the simulator does.

Each case of `benchmarks/data/durable_replies_<part>.jsonl` is a request, the assistant's answer and
the user's next message, labelled by whether that message states a standing preference that
should hold for the user's later, different requests (`durable`). The tuning and held-out parts were
written before the rules were read; the held-out parts are scored for reporting only, nothing is tuned
on them. `held_out_2` is a second writer's (benchmarks/data/README_held_out_2.md), who never read the
rules.

Every case goes through what `clawrl serve --memory on` does with a recorded turn: the offline judge
(`--judge rule`) reads the reply as the next state of a turn (the request as its user message, the
answer as its response), its hint is chosen as a judge with no scoring engine chooses it (the
longest candidate, as `clawrl judge` alone does), and `hints.memory_note(turn, hint, "directives")`
makes the note, or none. Per part:

* recall: durable cases that got a note; `useful`: those whose note also carries one of the case's
  `must_keep` phrases and none of its `must_not_keep` words;
* false notes: non-durable cases that got a note; precision: notes that came from durable cases;
* leaks: notes carrying a `must_not_keep` word of their case (a number, a name of this task);
* missing: notes of durable cases with none of the `must_keep` phrases (a note that keeps the
  wrong part of the reply).

`must_keep` phrases match as substrings (so stems like "apolog" work), `must_not_keep` words as
whole words, both ignoring case. Rates come with Wilson 95 % intervals: 60 cases a part leave them
wide, and a change of two or three cases is inside them.

    .venv/bin/python benchmarks/durable_notes.py                          # tuning only
    .venv/bin/python benchmarks/durable_notes.py --parts tuning held_out  # report both
    .venv/bin/python benchmarks/durable_notes.py --record-as before       # keep as the rules before a change
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawrl.config import JudgeConfig
from clawrl.judge.types import JudgeBackend
from clawrl.judge.worker import build_backend, final_judgment, judgment_note
from clawrl.types import NextState, Turn, TurnContext, TurnSampling

DATA_DIR = Path(__file__).resolve().parent / "data"
PARTS = ("tuning", "held_out", "held_out_2")  # held_out_2: a second writer, who had not read the rules
DEFAULT_OUT = Path("docs/results/durable-notes.json")
Z95 = 1.959964  # the normal quantile of a two-sided 95 % interval


@dataclass(frozen=True)
class Case:
    """One labelled reply: what was asked and answered, what the user said next, and what a note should be."""

    id: str
    request: str
    answer: str
    reply: str
    durable: bool
    must_keep: tuple[str, ...]
    must_not_keep: tuple[str, ...]


@dataclass(frozen=True)
class Noted:
    """What the pipeline made of one case: the judge's chosen hint and the note made from it."""

    case: Case
    hint: str | None
    note: str | None

    @property
    def leaked(self) -> list[str]:
        """The case's task words the note carries."""
        text = (self.note or "").lower()
        return [word for word in self.case.must_not_keep if re.search(rf"(?<!\w){re.escape(word.lower())}(?!\w)", text)]

    @property
    def kept(self) -> bool:
        """Whether the note carries one of the phrases a good note of this case would."""
        text = (self.note or "").lower()
        return any(phrase.lower() in text for phrase in self.case.must_keep)


def load(part: str) -> list[Case]:
    lines = (DATA_DIR / f"durable_replies_{part}.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return [Case(row["id"], row["request"], row["answer"], row["reply"], row["durable"], tuple(row["must_keep"]),
                 tuple(row["must_not_keep"])) for row in rows]  # fmt: skip


def case_context(case: Case) -> TurnContext:
    """The case as the judge worker reads a recorded turn: the request, the answer, the reply as the next state."""
    turn = Turn(
        id=case.id, session_id=case.id, kind="main", model="durable-notes", policy_version=0,
        messages=[{"role": "user", "content": case.request}], tools=None, sampling=TurnSampling(), prompt_token_ids=[],
        response_token_ids=[], response_logprobs=[], response_text=case.answer, tool_calls=None, finish_reason="stop",
    )  # fmt: skip
    return TurnContext(turn, NextState(case.id, [{"role": "user", "content": case.reply}], case.id), feedback=[])


async def noted(backend: JudgeBackend, case: Case) -> Noted:
    """The hint the worker would choose for the case (no scoring engine) and the note `--memory-from directives`
    makes of its verdict (`judgment_note`: of the hint, or of a reply read as praise)."""
    context = case_context(case)
    verdict = await backend.judge(context)
    judgment = final_judgment(context, verdict, backend.name, 0.0)
    made = judgment_note(context, judgment, "directives")
    return Noted(case, judgment.hint, made[0] if made is not None else None)


def wilson(hits: int, total: int) -> list[float] | None:
    """The Wilson score 95 % interval of hits/total: unlike the normal one it stays in [0, 1] at 0 or all."""
    if total == 0:
        return None
    share = hits / total
    spread = Z95 * math.sqrt(share * (1 - share) / total + Z95**2 / (4 * total**2))
    centre = share + Z95**2 / (2 * total)
    scale = 1 + Z95**2 / total
    return [round((centre - spread) / scale, 3), round((centre + spread) / scale, 3)]


def rate(hits: int, total: int) -> dict[str, Any]:
    return {"hits": hits, "of": total, "rate": round(hits / total, 3) if total else None, "ci95": wilson(hits, total)}


def figures(results: list[Noted]) -> dict[str, Any]:
    """The part's rates, and each case's hint and note, to read what went wrong."""
    durable = [result for result in results if result.case.durable]
    other = [result for result in results if not result.case.durable]
    notes = [result for result in results if result.note is not None]
    durable_notes = [result for result in durable if result.note is not None]
    return {
        "cases": len(results),
        "durable": len(durable),
        "recall": rate(len(durable_notes), len(durable)),
        "useful": rate(sum(result.kept and not result.leaked for result in durable_notes), len(durable)),
        "false_notes": rate(sum(result.note is not None for result in other), len(other)),
        "precision": rate(len(durable_notes), len(notes)),
        "leaks": rate(sum(bool(result.leaked) for result in notes), len(notes)),
        "missing": rate(sum(not result.kept for result in durable_notes), len(durable_notes)),
        "items": [{"id": result.case.id, "durable": result.case.durable, "reply": result.case.reply, "hint": result.hint,
                   "note": result.note, "leaked": result.leaked, "kept": result.kept} for result in results],  # fmt: skip
    }


ROWS = [("recall", "durable cases given a note"), ("useful", "durable cases given a good note (kept, no leak)"),
        ("false_notes", "non-durable cases given a note"), ("precision", "notes from durable cases"),
        ("leaks", "notes carrying a task word"), ("missing", "durable notes missing every must_keep phrase")]  # fmt: skip


def table(part: str, figures_of_part: dict[str, Any]) -> str:
    lines = [f"{part}: {figures_of_part['cases']} cases, {figures_of_part['durable']} durable", "",
             "| rate | what | k / n | rate | 95 % CI |", "|---|---|---|---|---|"]  # fmt: skip
    for key, what in ROWS:
        value = figures_of_part[key]
        shown = "–" if value["rate"] is None else f"{value['rate']:.2f}"
        interval = "–" if value["ci95"] is None else f"{value['ci95'][0]:.2f}–{value['ci95'][1]:.2f}"
        lines.append(f"| {key} | {what} | {value['hits']} / {value['of']} | {shown} | {interval} |")
    return "\n".join(lines)


async def evaluate(backend: JudgeBackend, part: str) -> dict[str, Any]:
    return figures([await noted(backend, case) for case in load(part)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", default=["tuning"], choices=PARTS,
                        help="which parts to score (the held-out one only to report, once)")
    parser.add_argument("--record-as", choices=("after", "before"), default="after",
                        help="`before`: keep the figures as the rules before a change, which later runs leave in place")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    backend = build_backend(JudgeConfig(judge="rule"))
    scored = {part: asyncio.run(evaluate(backend, part)) for part in args.parts}
    for part, figures_of_part in scored.items():
        print(table(part, figures_of_part), end="\n\n")
    _write(args.out, scored, args.record_as)
    print(f"wrote {args.out}")
    return 0


def _commit() -> str | None:
    try:
        described = ["git", "describe", "--always", "--dirty"]
        return subprocess.run(described, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _write(out: Path, scored: dict[str, dict[str, Any]], record_as: str) -> None:
    """Merge into `out` under `record_as`: a part scored now replaces that part's earlier figures, others stay."""
    stored = json.loads(out.read_text()) if out.exists() else {}
    edition = stored.get(record_as, {})
    edition.update({part: {"commit": _commit(), **figures_of_part} for part, figures_of_part in scored.items()})
    stored[record_as] = edition
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stored, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    sys.exit(main())
