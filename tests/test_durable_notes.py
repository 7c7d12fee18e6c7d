"""Which replies become memory notes under `--memory-from directives` (issue 35), on replies written as
people write them (`benchmarks/durable_notes.py`, docs/benchmarks.md "Durable notes").

The rates are the ones reached on the tuning part when the rules were last changed, less a margin of
two cases each way: a change that loses more than that fails here. The held-out part is not read."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from clawrl.judge.hints import directive_clause, durable_directives

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark() -> Any:
    spec = importlib.util.spec_from_file_location("durable_notes", ROOT / "benchmarks" / "durable_notes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_tuning_replies_keep_the_rates_reached_on_them() -> None:
    benchmark = load_benchmark()
    backend = benchmark.build_backend(benchmark.JudgeConfig(judge="rule"))
    scored = asyncio.run(benchmark.evaluate(backend, "tuning"))
    assert (scored["cases"], scored["durable"]) == (63, 25)
    assert scored["recall"]["hits"] >= 22  # 24 / 25 since a wish said with thanks is noted (23 before)
    assert scored["useful"]["hits"] >= 22  # 24 / 25
    assert scored["false_notes"]["hits"] <= 5  # 3 / 38
    assert scored["leaks"]["hits"] <= 4  # 2 of 27 notes
    assert scored["missing"]["hits"] <= 2  # 0 of 24


@pytest.mark.parametrize(("sentence", "clause"), [
    ("no emojis please, i use this for work stuff", "No emojis please, i use this for work stuff."),  # "please" ends the request
    ("Always cite sources when you give me stats please", "Always cite sources when you give me stats."),
    ("fine, but next time don't suggest paid tools", "Next time don't suggest paid tools."),  # "next time" leads in
    ("going forward can you keep summaries short", "Going forward keep summaries short."),  # the standing words stay
    ("no need to be so stiff with me", "No need to be so stiff with me."),  # "no" denies, it is no lead-in
    ("no, make it shorter", "Make it shorter."),
])  # fmt: skip
def test_a_directive_keeps_the_words_that_carry_it(sentence: str, clause: str) -> None:
    assert directive_clause(sentence) == clause


@pytest.mark.parametrize(("hint", "note"), [
    ("Answer me in spanish from now on.", "Answer me in spanish from now on."),  # the hint's clause, parsed again, stands
    ("Please use 24-hour time from now on.", "Please use 24-hour time from now on."),  # a standing number is no task's
    ("I prefer British spelling (colour, organise).", "I prefer British spelling (colour, organise)."),
    ("Its always too long with you.", "Its always too long with you."),
    ("You always get this wrong.", None),  # a complaint about correctness: nothing to keep doing
    ("Mention the deadline for feedback is Friday.", None),  # more content for this answer
    ("Add a column for the joining fee.", None),
    ("Please fix the email.", None),
    ("Translate that to french.", None),
    ("Rewrite it kindly, it's for my pupils.", "Rewrite it kindly, it's for my pupils."),  # a purpose may stand
    ("What about cats.", None),
    ("Please use the numbers from my message, not made-up ones.", None),
])  # fmt: skip
def test_a_note_keeps_what_holds_later_and_drops_what_this_answer_alone_needs(hint: str, note: str | None) -> None:
    assert durable_directives(hint, ["Plan the design review.", "The review is on Thursday."]) == note
