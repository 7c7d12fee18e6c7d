import unittest

from intervals import Interval


class BasicsTest(unittest.TestCase):
    def test_width(self):
        self.assertEqual(Interval(2, 7).width(), 5)

    def test_midpoint(self):
        self.assertEqual(Interval(2, 7).midpoint(), 4.5)

    def test_contains_end(self):
        self.assertTrue(Interval(2, 7).contains(7))

    def test_does_not_contain(self):
        self.assertFalse(Interval(2, 7).contains(8))

    def test_empty_is_an_error(self):
        with self.assertRaises(ValueError):
            Interval(3, 1)

    def test_single_point(self):
        self.assertEqual(Interval(4, 4).width(), 0)


class RelationsTest(unittest.TestCase):
    def test_overlap(self):
        self.assertTrue(Interval(1, 5).overlaps(Interval(4, 9)))

    def test_touching_ends_overlap(self):
        self.assertTrue(Interval(1, 3).overlaps(Interval(3, 5)))

    def test_apart(self):
        self.assertFalse(Interval(1, 2).overlaps(Interval(3, 4)))

    def test_intersection(self):
        self.assertEqual(Interval(1, 5).intersection(Interval(3, 8)), Interval(3, 5))

    def test_no_intersection(self):
        self.assertEqual(Interval(1, 2).intersection(Interval(5, 8)), None)

    def test_hull(self):
        self.assertEqual(Interval(1, 2).hull(Interval(5, 8)), Interval(1, 8))


class ArithmeticTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(Interval(1, 2) + Interval(10, 20), Interval(11, 22))

    def test_subtract(self):
        self.assertEqual(Interval(5, 6) - Interval(1, 2), Interval(3, 5))

    def test_multiply_signs(self):
        self.assertEqual(Interval(-2, 3) * Interval(4, 5), Interval(-10, 15))

    def test_scale(self):
        self.assertEqual(Interval(1, 3).scale(2), Interval(2, 6))

    def test_scale_negative(self):
        self.assertEqual(Interval(1, 3).scale(-1), Interval(-3, -1))
