"""What a rollout plans and what it records: one planned episode, and one played episode."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from clawrl.types import Message


@dataclass(frozen=True)
class PlannedEpisode:
    task: str
    seed: int
    group: int  # episodes of one group share the task (GRPO's group of rollouts)
    group_size: int  # episodes in its group (the last group of a plan may be short)


@dataclass
class EpisodeRecord:
    """One played episode, as the JSONL record holds it."""

    task: str
    seed: int
    group: int
    steps: int = 0
    reward: float = 0.0
    step_rewards: list[float] = field(default_factory=list)  # the environment's reward of each step
    failed: bool = False
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)
    elapsed_s: float = 0.0
    actor: int | None = None  # with --placement ray: the rollout actor that played it (a failed one: it was given to)

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        if record["actor"] is None:  # a local run's record is as it always was
            del record["actor"]
        return record

    def final_observation(self) -> list[Message]:
        """What the environment answered to the last action: the messages after the last assistant message."""
        last_action = max((i for i, message in enumerate(self.messages) if message["role"] == "assistant"), default=len(self.messages))
        return self.messages[last_action + 1 :]
