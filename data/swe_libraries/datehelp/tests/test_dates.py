import unittest

from datehelp import days_between, format_iso, parse_iso, weekday


class WeekdayTest(unittest.TestCase):
    def test_monday(self):
        self.assertEqual(weekday(2024, 1, 1), 0)

    def test_sunday(self):
        self.assertEqual(weekday(2023, 12, 31), 6)

    def test_leap_day(self):
        self.assertEqual(weekday(2024, 2, 29), 3)

    def test_autumn(self):
        self.assertEqual(weekday(1999, 10, 15), 4)


class BetweenTest(unittest.TestCase):
    def test_same_month(self):
        self.assertEqual(days_between((2023, 5, 1), (2023, 5, 20)), 19)

    def test_over_a_leap_day(self):
        self.assertEqual(days_between((2024, 2, 28), (2024, 3, 1)), 2)

    def test_a_whole_year(self):
        self.assertEqual(days_between((2023, 1, 1), (2024, 1, 1)), 365)

    def test_backwards(self):
        self.assertEqual(days_between((2000, 1, 10), (2000, 1, 1)), -9)


class IsoTest(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(parse_iso("2024-02-29"), (2024, 2, 29))

    def test_parse_invalid_day(self):
        with self.assertRaises(ValueError):
            parse_iso("2023-02-29")

    def test_parse_not_a_date(self):
        with self.assertRaises(ValueError):
            parse_iso("29/02/2024")

    def test_format(self):
        self.assertEqual(format_iso(987, 3, 7), "0987-03-07")
