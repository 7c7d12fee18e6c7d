"""Overlap-guided hint selection (DESIGN §5).

When the judge offers several hints for one turn, the useful one is the hint that changes what the
teacher would have said *at the tokens the student actually produced*. For each candidate h, the
same recorded response is scored twice: by the student (the serving policy) under the exact
recorded prompt ids, and by the teacher the trainer will use under the teacher prompt (the
messages with h appended, `messages.py`). With `--teacher base` that teacher is the base weights
(version 0, always loaded in the engine), not whatever version serves now: a hint is chosen for
the distribution it will be distilled from. At every response position we take the top-k token
ids of both and count how many they share; the candidate with the largest total overlap wins.

Why overlap rather than divergence: a hint that makes the teacher's distribution unrelated to the
student's (off-topic, or one that asks for a different task) gives the distillation signal no
footing, because the teacher's preferred tokens are not ones the student considers; a hint that
keeps most of the student's candidates while re-ranking them is one the student can learn from.
Ties go to the longer hint (more direction), which is also the fallback without a scoring engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from clawrl.engines.base import Engine
from clawrl.model.chat import teacher_prompt_ids
from clawrl.types import TurnContext


def topk_overlap(student_top_ids: list[list[int]], teacher_top_ids: list[list[int]]) -> int:
    """Shared ids between the two top-k lists, summed over response positions."""
    return sum(len(set(student) & set(teacher)) for student, teacher in zip(student_top_ids, teacher_top_ids, strict=True))


def choose_hint(candidates: list[str], overlaps: list[int | None]) -> str | None:
    """The candidate with the largest overlap, ties (and unknown overlaps) broken by length."""
    if not candidates:
        return None
    ranked = zip(candidates, overlaps, strict=True)
    return max(ranked, key=lambda pair: (pair[1] if pair[1] is not None else -1, len(pair[0])))[0]


@dataclass
class OverlapSelector:
    """Scores hint candidates with an engine's teacher-forced top-k (`Engine.score`).

    `teacher_version` is the policy version the hinted prompt is scored under: 0 (the base
    weights) for `--teacher base`, None (the version serving now, the closest the engine has to
    the trainer's current weights) for `--teacher policy`.
    """

    engine: Engine
    top_k: int = 4
    teacher_version: int | None = 0

    async def overlaps(self, case: TurnContext, candidates: list[str]) -> list[int]:
        """Each candidate's total top-k overlap with the student, over the recorded response."""
        turn = case.turn
        if not turn.response_token_ids:
            return [0 for _ in candidates]
        student = await self.engine.score(turn.prompt_token_ids, turn.response_token_ids, top_k=self.top_k)
        overlaps = []
        for hint in candidates:
            hinted_prompt_ids = teacher_prompt_ids(self.engine.tokenizer, turn, hint)
            teacher = await self.engine.score(
                hinted_prompt_ids, turn.response_token_ids, top_k=self.top_k, version=self.teacher_version
            )
            overlaps.append(topk_overlap(student.top_token_ids, teacher.top_token_ids))
        return overlaps
