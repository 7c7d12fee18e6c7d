"""How the values spread: variance, percentiles, clamping and rescaling."""

from statkit.averages import mean


def variance(values, sample=False):
    """The population variance, or with `sample` the sample variance (divided by n - 1)."""
    count = len(values)
    if count < (2 if sample else 1):
        raise ValueError("too few values for a variance")
    centre = mean(values)
    squares = sum((value - centre) ** 2 for value in values)
    return squares / (count - 1 if sample else count)


def percentile(values, percent):
    """The `percent`-th percentile, interpolating linearly between the closest ranks."""
    if not 0 <= percent <= 100:
        raise ValueError("percent must be between 0 and 100")
    ordered = sorted(values)
    rank = percent / 100 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def clamp(value, lowest, highest):
    if lowest > highest:
        raise ValueError("the lower bound is above the upper bound")
    return max(lowest, min(value, highest))


def normalize(values):
    """The values rescaled to [0, 1]; all zeros when they are all equal."""
    lowest, highest = min(values), max(values)
    if highest == lowest:
        return [0.0] * len(values)
    return [(value - lowest) / (highest - lowest) for value in values]
