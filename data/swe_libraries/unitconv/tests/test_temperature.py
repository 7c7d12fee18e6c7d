import unittest

from unitconv import convert_temperature, to_kelvin


class ToKelvinTest(unittest.TestCase):
    def test_celsius(self):
        self.assertAlmostEqual(to_kelvin(25, "C"), 298.15)

    def test_fahrenheit(self):
        self.assertAlmostEqual(to_kelvin(212, "F"), 373.15)

    def test_absolute_zero_is_allowed(self):
        self.assertAlmostEqual(to_kelvin(0, "K"), 0.0)

    def test_below_absolute_zero(self):
        with self.assertRaises(ValueError):
            to_kelvin(-300, "C")

    def test_unknown_unit(self):
        with self.assertRaises(ValueError):
            to_kelvin(10, "X")


class ConvertTemperatureTest(unittest.TestCase):
    def test_boiling_point(self):
        self.assertAlmostEqual(convert_temperature(100, "C", "F"), 212.0)

    def test_body_temperature(self):
        self.assertAlmostEqual(convert_temperature(98.6, "F", "C"), 37.0)

    def test_freezing_in_kelvin(self):
        self.assertAlmostEqual(convert_temperature(32, "F", "K"), 273.15)

    def test_kelvin_to_celsius(self):
        self.assertAlmostEqual(convert_temperature(0, "K", "C"), -273.15)
