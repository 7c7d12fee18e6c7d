"""The labelled corpus of replies (`judge/data/*.jsonl`): what a careful person makes of a reply.

Each item is a request, the assistant's answer, and what came next (a user's reply or a tool's
output), labelled with the score a person would give the answer and, when the reply says how the
answer should have been, the directive a hint must carry (`hint_keywords`: groups of
alternatives; a hint carries the directive when every group has one alternative in it).

The corpus was written apart from the code and split once into two parts: `tuning`, which the
offline judge's lexicon and classifier are built from, and a held-out part, which only the
evaluation (`benchmarks/judge_replies.py`) and the simulated users (`clawrl.sim.users`) read. The
callers name the part; this module names only the tuning part, so a search of `src/` for the
held-out file's name finds every reader (`tests/test_judge_corpus.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from clawrl.types import Message

CORPUS_DIR = Path(__file__).parent / "data"
TUNING = "tuning"


@dataclass(frozen=True)
class LabelledReply:
    id: str
    language: str  # ISO 639-1: en, es, fr, de, pt, it, nl, zh, ja, ru
    style: str  # how the reply is written: praise, sarcasm, correction_question, tool_output, ...
    request: str  # the user's request the answer answered
    answer: str
    role: str  # who wrote the reply: "user" or "tool"
    reply: str
    score: int  # -1, 0 or +1
    hint: str | None  # a directive a person would take from the reply
    hint_keywords: tuple[tuple[str, ...], ...] | None

    def request_messages(self) -> list[Message]:
        return [{"role": "user", "content": self.request}]

    def next_messages(self) -> list[Message]:
        if self.role == "tool":
            return [{"role": "tool", "tool_call_id": "call_1", "content": self.reply}]
        return [{"role": "user", "content": self.reply}]


def corpus_path(part: str) -> Path:
    return CORPUS_DIR / f"{part}.jsonl"


def load_part(part: str) -> list[LabelledReply]:
    """The items of one part of the corpus, in file order."""
    return parse_part(corpus_path(part).read_text(encoding="utf-8"))


def parse_part(text: str) -> list[LabelledReply]:
    """The items of a part's JSONL text, in order."""
    return [_item(json.loads(line)) for line in text.splitlines() if line.strip()]


def hint_recalled(hint: str | None, keywords: tuple[tuple[str, ...], ...]) -> bool:
    """Whether `hint` carries the labelled directive: each group has an alternative in it (any case)."""
    if not hint:
        return False
    text = hint.lower()
    return all(any(alternative.lower() in text for alternative in group) for group in keywords)


def _item(row: dict) -> LabelledReply:
    keywords = row.get("hint_keywords")
    return LabelledReply(
        id=row["id"], language=row["language"], style=row["style"], request=row["request"], answer=row["answer"],
        role=row["role"], reply=row["reply"], score=int(row["score"]), hint=row.get("hint"),
        hint_keywords=tuple(tuple(group) for group in keywords) if keywords else None,
    )
