import unittest

from stackcalc import CalcError, to_infix


class InfixTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(to_infix("3 4 +"), "(3 + 4)")

    def test_order(self):
        self.assertEqual(to_infix("10 4 -"), "(10 - 4)")

    def test_nested(self):
        self.assertEqual(to_infix("3 4 + 2 *"), "((3 + 4) * 2)")

    def test_unary(self):
        self.assertEqual(to_infix("5 neg"), "neg(5)")

    def test_underflow(self):
        with self.assertRaises(CalcError):
            to_infix("+")

    def test_leftover(self):
        with self.assertRaises(CalcError):
            to_infix("1 2")
