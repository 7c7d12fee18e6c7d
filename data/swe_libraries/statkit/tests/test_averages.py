import unittest

from statkit import mean, median, mode, moving_average


class MeanTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 4]), 2.5)

    def test_single(self):
        self.assertEqual(mean([7]), 7)

    def test_empty(self):
        with self.assertRaises(ValueError):
            mean([])


class MedianTest(unittest.TestCase):
    def test_odd(self):
        self.assertEqual(median([5, 1, 3]), 3)

    def test_even(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)

    def test_empty(self):
        with self.assertRaises(ValueError):
            median([])


class ModeTest(unittest.TestCase):
    def test_mode(self):
        self.assertEqual(mode([1, 2, 2, 3]), 2)

    def test_tie_takes_smallest(self):
        self.assertEqual(mode([3, 3, 1, 1, 2]), 1)


class MovingAverageTest(unittest.TestCase):
    def test_window_two(self):
        self.assertEqual(moving_average([1, 3, 5, 7], 2), [2, 4, 6])

    def test_window_equals_length(self):
        self.assertEqual(moving_average([2, 4, 6], 3), [4])

    def test_window_too_small(self):
        with self.assertRaises(ValueError):
            moving_average([1, 2], 0)
