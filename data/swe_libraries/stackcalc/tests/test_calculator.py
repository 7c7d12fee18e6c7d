import unittest

from stackcalc import CalcError, evaluate


class ArithmeticTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(evaluate("3 4 +"), 7)

    def test_subtract_order(self):
        self.assertEqual(evaluate("10 4 -"), 6)

    def test_nested(self):
        self.assertEqual(evaluate("3 4 + 2 *"), 14)

    def test_divide(self):
        self.assertEqual(evaluate("7 2 /"), 3.5)

    def test_modulo(self):
        self.assertEqual(evaluate("17 5 %"), 2)

    def test_power(self):
        self.assertEqual(evaluate("2 10 ^"), 1024)

    def test_floats(self):
        self.assertEqual(evaluate("1.5 2 *"), 3.0)


class StackOperationsTest(unittest.TestCase):
    def test_negate(self):
        self.assertEqual(evaluate("5 neg 2 +"), -3)

    def test_abs(self):
        self.assertEqual(evaluate("3 8 - abs"), 5)

    def test_dup(self):
        self.assertEqual(evaluate("4 dup *"), 16)

    def test_swap(self):
        self.assertEqual(evaluate("2 10 swap -"), 8)

    def test_single_number(self):
        self.assertEqual(evaluate("42"), 42)


class ErrorTest(unittest.TestCase):
    def test_division_by_zero(self):
        with self.assertRaises(CalcError):
            evaluate("1 0 /")

    def test_underflow(self):
        with self.assertRaises(CalcError):
            evaluate("1 +")

    def test_leftover_values(self):
        with self.assertRaises(CalcError):
            evaluate("1 2 3 +")

    def test_unknown_token(self):
        with self.assertRaises(CalcError):
            evaluate("1 two +")
