"""Where the values lie: mean, median, mode, moving averages."""


def mean(values):
    if not values:
        raise ValueError("the mean of no values")
    return sum(values) / len(values)


def median(values):
    """The middle value; with an even count, the mean of the two middle ones."""
    ordered = sorted(values)
    count = len(ordered)
    if count == 0:
        raise ValueError("the median of no values")
    middle = count // 2
    if count % 2 == 1:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def mode(values):
    """The most frequent value; the smallest of them on a tie."""
    if not values:
        raise ValueError("the mode of no values")
    counts = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    highest = max(counts.values())
    return min(value for value, count in counts.items() if count == highest)


def moving_average(values, window):
    """The mean of each run of `window` consecutive values."""
    if window < 1:
        raise ValueError("the window must hold at least one value")
    return [mean(values[start : start + window]) for start in range(len(values) - window + 1)]
