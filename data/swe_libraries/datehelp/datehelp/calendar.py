"""The Gregorian calendar's rules: leap years and month lengths."""

MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def is_leap_year(year):
    """Every fourth year, except centuries not divisible by 400."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year, month):
    if not 1 <= month <= 12:
        raise ValueError(f"no month {month}")
    if month == 2 and is_leap_year(year):
        return 29
    return MONTH_DAYS[month - 1]


def day_of_year(year, month, day):
    """1 for January 1st, 365 (or 366) for December 31st."""
    if not 1 <= day <= days_in_month(year, month):
        raise ValueError(f"no day {day} in {year}-{month:02d}")
    return sum(days_in_month(year, earlier) for earlier in range(1, month)) + day
