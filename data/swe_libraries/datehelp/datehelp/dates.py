"""Whole dates: weekdays, distances, ISO 8601 text."""

from datehelp.calendar import day_of_year

WEEKDAY_OFFSETS = (0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4)


def weekday(year, month, day):
    """0 for Monday up to 6 for Sunday."""
    day_of_year(year, month, day)  # checks that the date exists
    if month < 3:
        year -= 1
    sunday_based = (year + year // 4 - year // 100 + year // 400 + WEEKDAY_OFFSETS[month - 1] + day) % 7
    return (sunday_based + 6) % 7


def _ordinal(year, month, day):
    """Days since December 31st of year 0."""
    before = year - 1
    return before * 365 + before // 4 - before // 100 + before // 400 + day_of_year(year, month, day)


def days_between(start, end):
    """Days from the date `start` to the date `end` (negative when `end` comes first)."""
    return _ordinal(*end) - _ordinal(*start)


def parse_iso(text):
    """`(year, month, day)` of an ISO date such as `2024-02-29`."""
    parts = text.split("-")
    if len(parts) != 3 or len(parts[0]) != 4:
        raise ValueError(f"not an ISO date: {text!r}")
    year, month, day = (int(part) for part in parts)
    day_of_year(year, month, day)
    return year, month, day


def format_iso(year, month, day):
    return f"{year:04d}-{month:02d}-{day:02d}"
