import unittest

from unitconv import convert, format_quantity, parse_quantity


class ConvertTest(unittest.TestCase):
    def test_km_to_m(self):
        self.assertAlmostEqual(convert(2.5, "km", "m"), 2500.0)

    def test_miles_to_km(self):
        self.assertAlmostEqual(convert(1, "mi", "km"), 1.609344)

    def test_feet_to_inches(self):
        self.assertAlmostEqual(convert(3, "ft", "in"), 36.0)

    def test_pounds_to_kilograms(self):
        self.assertAlmostEqual(convert(10, "lb", "kg"), 4.5359237)

    def test_same_unit(self):
        self.assertAlmostEqual(convert(7, "g", "g"), 7.0)

    def test_different_quantities(self):
        with self.assertRaises(ValueError):
            convert(1, "kg", "m")

    def test_unknown_unit(self):
        with self.assertRaises(ValueError):
            convert(1, "parsec", "m")


class FormatTest(unittest.TestCase):
    def test_drops_trailing_zeros(self):
        self.assertEqual(format_quantity(1.50, "km"), "1.5 km")

    def test_rounds(self):
        self.assertEqual(format_quantity(2.3456, "kg", digits=3), "2.346 kg")

    def test_whole_number(self):
        self.assertEqual(format_quantity(3.0, "m"), "3 m")

    def test_no_decimals(self):
        self.assertEqual(format_quantity(120.0, "g", digits=0), "120 g")


class ParseTest(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(parse_quantity("12.5 km"), (12.5, "km"))

    def test_parse_unknown_unit(self):
        with self.assertRaises(ValueError):
            parse_quantity("3 furlongs")

    def test_parse_missing_unit(self):
        with self.assertRaises(ValueError):
            parse_quantity("42")
