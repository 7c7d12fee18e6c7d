"""Calendar helpers on (year, month, day) tuples."""

from datehelp.calendar import day_of_year, days_in_month, is_leap_year
from datehelp.dates import days_between, format_iso, parse_iso, weekday

__all__ = ["day_of_year", "days_between", "days_in_month", "format_iso", "is_leap_year", "parse_iso", "weekday"]
