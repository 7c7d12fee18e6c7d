"""Closed intervals and their arithmetic."""

from intervals.interval import Interval
from intervals.sets import covered_length, gaps, merge

__all__ = ["Interval", "covered_length", "gaps", "merge"]
