import unittest

from statkit import clamp, normalize, percentile, variance


class VarianceTest(unittest.TestCase):
    def test_population(self):
        self.assertEqual(variance([2, 4, 4, 4, 5, 5, 7, 9]), 4)

    def test_sample(self):
        self.assertAlmostEqual(variance([1, 2, 3, 4], sample=True), 1.6666666667)

    def test_sample_needs_two(self):
        with self.assertRaises(ValueError):
            variance([3], sample=True)

    def test_single_value_population(self):
        self.assertEqual(variance([3]), 0)


class PercentileTest(unittest.TestCase):
    def test_median(self):
        self.assertEqual(percentile([1, 2, 3, 4, 5], 50), 3)

    def test_interpolated(self):
        self.assertAlmostEqual(percentile([10, 20, 30, 40], 25), 17.5)

    def test_maximum(self):
        self.assertEqual(percentile([3, 1, 2], 100), 3)

    def test_out_of_range(self):
        with self.assertRaises(ValueError):
            percentile([1, 2], 101)


class ClampTest(unittest.TestCase):
    def test_inside(self):
        self.assertEqual(clamp(5, 0, 10), 5)

    def test_below(self):
        self.assertEqual(clamp(-3, 0, 10), 0)

    def test_above(self):
        self.assertEqual(clamp(12, 0, 10), 10)

    def test_bad_bounds(self):
        with self.assertRaises(ValueError):
            clamp(1, 5, 2)


class NormalizeTest(unittest.TestCase):
    def test_normalize(self):
        self.assertEqual(normalize([2, 4, 6]), [0.0, 0.5, 1.0])

    def test_all_equal(self):
        self.assertEqual(normalize([3, 3]), [0.0, 0.0])
