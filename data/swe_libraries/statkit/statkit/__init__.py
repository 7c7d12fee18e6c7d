"""Descriptive statistics for lists of numbers."""

from statkit.averages import mean, median, mode, moving_average
from statkit.spread import clamp, normalize, percentile, variance

__all__ = ["clamp", "mean", "median", "mode", "moving_average", "normalize", "percentile", "variance"]
