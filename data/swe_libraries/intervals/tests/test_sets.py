import unittest

from intervals import Interval, covered_length, gaps, merge


class MergeTest(unittest.TestCase):
    def test_merge_overlapping(self):
        self.assertEqual(merge([Interval(5, 8), Interval(1, 3), Interval(2, 4)]), [Interval(1, 4), Interval(5, 8)])

    def test_merge_touching(self):
        self.assertEqual(merge([Interval(1, 2), Interval(2, 3)]), [Interval(1, 3)])

    def test_merge_nested(self):
        self.assertEqual(merge([Interval(1, 10), Interval(2, 3)]), [Interval(1, 10)])

    def test_merge_nothing(self):
        self.assertEqual(merge([]), [])


class CoverageTest(unittest.TestCase):
    def test_covered_length(self):
        self.assertEqual(covered_length([Interval(0, 4), Interval(2, 6), Interval(10, 11)]), 7)

    def test_gaps(self):
        self.assertEqual(gaps([Interval(0, 1), Interval(3, 4), Interval(6, 9)]), [Interval(1, 3), Interval(4, 6)])

    def test_no_gaps(self):
        self.assertEqual(gaps([Interval(0, 5), Interval(5, 6)]), [])
