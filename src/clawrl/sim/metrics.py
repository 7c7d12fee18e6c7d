"""The learning benchmark's statistics: sessions to align, score curves, bootstrap and t intervals.

Pure functions over plain lists, so they are tested on fixed inputs and reused by the report.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

ALIGN_WINDOW = 3  # consecutive satisfied sessions that count as "aligned"
# Student's t, two-sided 95 %, by degrees of freedom (1..30); past 30 the normal's 1.96 is close enough
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def sessions_to_align(satisfied: Sequence[bool], window: int = ALIGN_WINDOW) -> int | None:
    """The number of sessions after which `window` consecutive sessions satisfied the preference.

    0 means the first `window` sessions already did; None means it never happened. For
    `[False, True, False, True, True, True]` and a window of 3 it is 3: sessions 4 to 6 satisfied.
    """
    run = 0
    for index, ok in enumerate(satisfied):
        run = run + 1 if ok else 0
        if run == window:
            return index + 1 - window
    return None


def step_curve(points: Sequence[tuple[int, float]], sessions: int) -> list[float]:
    """The score in force after each of 0..`sessions` sessions, from (session, score) evaluations.

    A score holds until the next evaluation; evaluations are sorted by session, and the latest one
    at a session wins. Before the first evaluation the first score is used.
    """
    ordered = sorted(points, key=lambda point: point[0])
    if not ordered:
        raise ValueError("no evaluations")
    curve, current, position = [], ordered[0][1], 0
    for session in range(sessions + 1):
        while position < len(ordered) and ordered[position][0] <= session:
            current = ordered[position][1]
            position += 1
        curve.append(current)
    return curve


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def bootstrap_ci(groups: Sequence[Sequence[float]], resamples: int = 2000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval for the mean over groups of the mean within each group.

    Two levels, because both vary: the groups (seeds) are resampled with replacement, then the
    items (held-out prompts' 0/1 outcomes) within each chosen group. With three seeds, resampling
    seeds alone could only ever produce ten distinct means; the inner level adds the sampling
    noise of a finite held-out set.
    """
    if not groups or any(not group for group in groups):
        raise ValueError("every group needs at least one value")
    rng = random.Random(seed)
    estimates = []
    for _ in range(resamples):
        chosen = [groups[rng.randrange(len(groups))] for _ in groups]
        estimates.append(mean([mean([group[rng.randrange(len(group))] for _ in group]) for group in chosen]))
    estimates.sort()
    tail = (1 - level) / 2
    low = estimates[int(tail * (resamples - 1))]
    high = estimates[int(round((1 - tail) * (resamples - 1)))]
    return low, high


def t_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The 95 % Student-t interval for the mean of `values` (one per seed); None with fewer than two.

    Over three seeds it has two degrees of freedom (t = 4.30): wide, as it should be when three
    runs are all there is to say how much a result moves between runs.
    """
    if len(values) < 2:
        return None
    centre = mean(values)
    spread = (sum((value - centre) ** 2 for value in values) / (len(values) - 1)) ** 0.5
    half = _T95[min(len(values) - 1, len(_T95)) - 1] * spread / len(values) ** 0.5
    return centre - half, centre + half


def wider(first: tuple[float, float], second: tuple[float, float] | None) -> tuple[float, float]:
    """The wider of two intervals (the first when the second is None or they are as wide)."""
    if second is None or second[1] - second[0] <= first[1] - first[0]:
        return first
    return second
