"""Collections of intervals: merging overlaps, measuring what they cover, the gaps between them."""

from intervals.interval import Interval


def merge(intervals):
    """The intervals with overlapping ones joined, sorted by their lower end."""
    merged = []
    for interval in sorted(intervals, key=lambda item: item.lo):
        if merged and merged[-1].overlaps(interval):
            merged[-1] = merged[-1].hull(interval)
        else:
            merged.append(interval)
    return merged


def covered_length(intervals):
    """The total length covered by the intervals, counting overlaps once."""
    return sum(interval.width() for interval in merge(intervals))


def gaps(intervals):
    """The open stretches between the merged intervals, as intervals."""
    merged = merge(intervals)
    return [Interval(left.hi, right.lo) for left, right in zip(merged, merged[1:])]
