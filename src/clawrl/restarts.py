"""A part that dies is started again: one back-off and one rule for giving up, for every part.

The trainer (a process or a Ray actor), the judge actors and the replica actors of `--placement
ray` are all supervised the same way (`trainer_process.TrainerProcess`, `engines/replica_restarts.py`),
so an operator learns one behaviour: the pause before a new start doubles with every quick failure
(1 s, 2 s, 4 s, ... at most a minute), and a part that keeps dying soon after its start (a bad
setting, a node that cannot hold it) is given up on, while the rest goes on. Imports nothing of
clawrl: the engines and the loops use it without depending on each other.
"""

from __future__ import annotations

LONGEST_PAUSE_S = 60.0


class RestartBackoff:
    """The quick failures of one part in a row, and what to do after the next failure.

    A failure within `healthy_after_s` of the part's start is quick; one after a longer run starts
    the count again at one. After more than `max_quick_failures` quick ones in a row, give up.
    """

    def __init__(self, max_quick_failures: int = 5, healthy_after_s: float = 60.0) -> None:
        self.max_quick_failures = max_quick_failures
        self.healthy_after_s = healthy_after_s
        self.quick_failures = 0

    def pause_after_failure(self, ran_s: float) -> float | None:
        """Seconds to wait before starting the part again, after it failed `ran_s` seconds after
        its start; None: give up on it."""
        self.quick_failures = self.quick_failures + 1 if ran_s < self.healthy_after_s else 1
        if self.quick_failures > self.max_quick_failures:
            return None
        return min(2.0 ** (self.quick_failures - 1), LONGEST_PAUSE_S)
