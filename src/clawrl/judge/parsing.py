"""Reading judge outputs: boxed PRM scores, delimited hints, and the majority over votes.

Judges are sampled language models, so their outputs are parsed defensively: anything that is not
exactly one of the expected values is an invalid vote (None), never a guess. Invalid votes are
kept, not dropped, so that parse failures stay visible in the stored votes and the metrics.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

HINT_START = "[HINT_START]"
HINT_END = "[HINT_END]"
MIN_HINT_CHARS = 11  # more than 10, as upstream: shorter "hints" ("ok", "fix it") carry no direction

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_HINT = re.compile(re.escape(HINT_START) + r"(.*?)" + re.escape(HINT_END), re.DOTALL)
_SCORES = {"1": 1, "+1": 1, "-1": -1, "0": 0}


def parse_prm_score(text: str) -> int | None:
    """The value of the last `\\boxed{...}`: 1, -1 or 0; None when it is missing or anything else.

    The last box wins because the judge reasons first and may quote or weigh other scores on
    the way; its final answer is the one it ends on.
    """
    boxes = _BOXED.findall(text)
    if not boxes:
        return None
    return _SCORES.get(re.sub(r"\s+", "", boxes[-1]))


def parse_hint(text: str) -> str | None:
    """The last hint between the delimiters, stripped; None when there is no usable hint.

    A hint counts only with a positive verdict (a last box of 1) and more than 10 characters, as
    upstream decides. A delimited hint without the box is dropped: the judge never said the
    next state carries direction, and a hint the judge itself did not stand behind would be
    distilled into the policy as if it did.
    """
    if parse_prm_score(text) != 1:
        return None
    hints = _HINT.findall(text)
    if not hints:
        return None
    hint = hints[-1].strip()
    return hint if len(hint) >= MIN_HINT_CHARS else None


def majority(votes: list[int | None]) -> int:
    """The most common valid vote; 0 on a tie or when no vote is valid (no evidence either way)."""
    counts = Counter(vote for vote in votes if vote is not None).most_common()
    if not counts or (len(counts) > 1 and counts[0][1] == counts[1][1]):
        return 0
    return counts[0][0]


@dataclass(frozen=True)
class Verdict:
    """The PRM's judgment of one turn: every vote (None = unparseable), the score, one rationale."""

    score: int
    votes: list[int | None]
    rationale: str | None

    @property
    def invalid_votes(self) -> int:
        """How many outputs could not be parsed, for the parse-failure metric."""
        return sum(vote is None for vote in self.votes)

    @property
    def agreement(self) -> float:
        """The share of votes equal to the score, for the vote-agreement metric."""
        return sum(vote == self.score for vote in self.votes) / len(self.votes) if self.votes else 0.0


def prm_verdict(outputs: list[str]) -> Verdict:
    """Parse m judge outputs into one verdict.

    The rationale is the first output that voted for the winning score, so what is stored
    explains the score; on a tie (score 0 that nobody voted for) it is the first output.
    """
    votes = [parse_prm_score(output) for output in outputs]
    score = majority(votes)
    agreeing = [output for output, vote in zip(outputs, votes, strict=True) if vote == score]
    rationale = agreeing[0] if agreeing else (outputs[0] if outputs else None)
    return Verdict(score=score, votes=votes, rationale=rationale)
