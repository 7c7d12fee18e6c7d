"""`--judge engine+rule`: the model's votes with the offline judge's score beside them (issue 27).

The engine judge samples m PRM verdicts and m hints from the served model; the offline judge
(`rule.py`) adds its score as vote m + 1 and its hint candidates after the model's. The majority
of the valid votes wins, as with the model alone; where the votes tie, the offline judge's vote
breaks the tie when it is one of the tied scores (with m = 3, a 2-2 split, or one valid model vote
against it), and the score is 0 otherwise. So the model decides wherever it agrees with itself,
and the offline judge where it does not, instead of the 0 a tie gives the model alone.
"""

from __future__ import annotations

from collections import Counter

from clawrl.judge.types import BackendVerdict, JudgeBackend
from clawrl.types import TurnContext


def combined_score(model_votes: list[int | None], offline_vote: int) -> int:
    """The majority of the model's valid votes and the offline vote; a tie goes to the offline vote if it tied."""
    counts = Counter(vote for vote in [*model_votes, offline_vote] if vote is not None)
    ranked = counts.most_common()
    tied = [score for score, count in ranked if count == ranked[0][1]]
    if len(tied) == 1:
        return tied[0]
    return offline_vote if offline_vote in tied else 0


class EngineAndRuleJudge:
    """Judges with a language-model backend and the offline judge, as one verdict."""

    def __init__(self, model_judge: JudgeBackend, offline_judge: JudgeBackend) -> None:
        self.model_judge, self.offline_judge = model_judge, offline_judge
        self.name = f"{model_judge.name}+{offline_judge.name}"  # stored as the judgment's judge model

    async def judge(self, case: TurnContext) -> BackendVerdict:
        model = await self.model_judge.judge(case)
        offline = await self.offline_judge.judge(case)
        return BackendVerdict(
            score=combined_score(model.votes, offline.score),
            votes=[*model.votes, offline.score],
            rationale=model.rationale,
            hint_candidates=list(dict.fromkeys([*model.hint_candidates, *offline.hint_candidates])),
            source="prm",
        )
