"""One closed interval [lo, hi] and interval arithmetic on it."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    lo: float
    hi: float

    def __post_init__(self):
        if self.lo > self.hi:
            raise ValueError(f"empty interval: lo {self.lo} is above hi {self.hi}")

    def width(self):
        return self.hi - self.lo

    def midpoint(self):
        return (self.lo + self.hi) / 2

    def contains(self, x):
        return self.lo <= x <= self.hi

    def overlaps(self, other):
        """Whether the two share at least one point (touching ends count)."""
        return self.lo <= other.hi and other.lo <= self.hi

    def intersection(self, other):
        """The common part, or None when they do not overlap."""
        if not self.overlaps(other):
            return None
        return Interval(max(self.lo, other.lo), min(self.hi, other.hi))

    def hull(self, other):
        """The smallest interval holding both."""
        return Interval(min(self.lo, other.lo), max(self.hi, other.hi))

    def __add__(self, other):
        return Interval(self.lo + other.lo, self.hi + other.hi)

    def __sub__(self, other):
        return Interval(self.lo - other.hi, self.hi - other.lo)

    def __mul__(self, other):
        products = [self.lo * other.lo, self.lo * other.hi, self.hi * other.lo, self.hi * other.hi]
        return Interval(min(products), max(products))

    def scale(self, factor):
        """Every point multiplied by `factor` (a negative factor flips the ends)."""
        if factor < 0:
            return Interval(self.hi * factor, self.lo * factor)
        return Interval(self.lo * factor, self.hi * factor)
