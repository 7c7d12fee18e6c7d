import unittest

from datehelp import day_of_year, days_in_month, is_leap_year


class LeapYearTest(unittest.TestCase):
    def test_ordinary_leap_year(self):
        self.assertTrue(is_leap_year(2024))

    def test_common_year(self):
        self.assertFalse(is_leap_year(2023))

    def test_century(self):
        self.assertFalse(is_leap_year(1900))

    def test_fourth_century(self):
        self.assertTrue(is_leap_year(2000))


class MonthTest(unittest.TestCase):
    def test_february_leap(self):
        self.assertEqual(days_in_month(2024, 2), 29)

    def test_february_common(self):
        self.assertEqual(days_in_month(2023, 2), 28)

    def test_april(self):
        self.assertEqual(days_in_month(2023, 4), 30)

    def test_december(self):
        self.assertEqual(days_in_month(2023, 12), 31)

    def test_no_month_13(self):
        with self.assertRaises(ValueError):
            days_in_month(2023, 13)


class DayOfYearTest(unittest.TestCase):
    def test_first(self):
        self.assertEqual(day_of_year(2023, 1, 1), 1)

    def test_march_first_leap(self):
        self.assertEqual(day_of_year(2024, 3, 1), 61)

    def test_last(self):
        self.assertEqual(day_of_year(2023, 12, 31), 365)

    def test_no_february_30(self):
        with self.assertRaises(ValueError):
            day_of_year(2024, 2, 30)
