"""What the learning benchmark measured: held-out evaluations and one arm's run under one seed.

Plain records, written by the benchmark (`bench.py`) and read by the report (`report.py`) and the
statistics (`metrics.py` works on the lists they hold).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Evaluation:
    """The held-out score of the policy served after `session` sessions."""

    session: int
    version: int
    outcomes: list[bool]  # one per held-out prompt: did the answer satisfy the preference?
    example: str  # the answer to the first held-out prompt
    # Correctness beside the style, per held-out prompt (`users.on_topic`, `users.result_correct`);
    # empty in runs recorded before they were measured
    on_topic: list[bool] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)

    @property
    def score(self) -> float:
        return sum(self.outcomes) / len(self.outcomes)

    @property
    def on_topic_share(self) -> float | None:
        return sum(self.on_topic) / len(self.on_topic) if self.on_topic else None

    @property
    def correct_share(self) -> float | None:
        return sum(self.correct) / len(self.correct) if self.correct else None


@dataclass
class RunResult:
    """One arm under one seed."""

    arm: str
    seed: int
    evaluations: list[Evaluation] = field(default_factory=list)
    session_satisfied: list[bool] = field(default_factory=list)
    versions: int = 0
    seconds: float = 0.0
    # (judge score, the user's hidden ground truth) of every judged main turn of the sessions
    judged: list[tuple[int, bool]] = field(default_factory=list)
    training: dict[str, Any] | None = None  # trained arms: `stats.training_summary` of the run
    model_seed: int = 0  # the pre-training seed of the tiny model served (`--model-seed`): the model build
    model_build: dict[str, Any] | None = None  # its pretrain.json's digest and build (`bench.model_build`)
    # memory arms (`clawrl serve --memory on`): the held-out score at the end without the notes (the
    # weights alone), the notes active after each session, and the prompt tokens they added per main turn
    final_weights_only: Evaluation | None = None
    notes_active: list[int] = field(default_factory=list)
    prompt_tokens_added_per_turn: float | None = None

    @property
    def unit(self) -> str:
        """What the intervals resample and pair by: the seed, and the model build when it is not the
        first ("10", "10@build1"): runs of one seed on two builds are two units, since a build moves
        results as much as a seed does."""
        return str(self.seed) if self.model_seed == 0 else f"{self.seed}@build{self.model_seed}"

    @property
    def baseline(self) -> Evaluation:
        return self.evaluations[0]

    @property
    def final(self) -> Evaluation:
        return self.evaluations[-1]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for evaluation, item in zip(self.evaluations, data["evaluations"], strict=True):
            item["score"] = evaluation.score
        if self.final_weights_only is not None:
            data["final_weights_only"]["score"] = self.final_weights_only.score
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        """A run back from `to_json` (runs.json), e.g. to report runs made by several invocations together."""
        evaluations = [_evaluation(e) for e in data["evaluations"]]
        weights_only = data.get("final_weights_only")
        return cls(data["arm"], data["seed"], evaluations, list(data["session_satisfied"]), data.get("versions", 0),
                   data.get("seconds", 0.0), [(int(score), bool(truth)) for score, truth in data.get("judged", [])],
                   data.get("training"), data.get("model_seed", 0), data.get("model_build"),
                   _evaluation(weights_only) if weights_only else None, list(data.get("notes_active", [])),
                   data.get("prompt_tokens_added_per_turn"))


def _evaluation(data: dict[str, Any]) -> Evaluation:
    return Evaluation(data["session"], data["version"], list(data["outcomes"]), data["example"],
                      list(data.get("on_topic", [])), list(data.get("correct", [])))
